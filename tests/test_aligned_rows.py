"""16-bit GEMMs over [N, K] weights whose rows are off 16 bytes (an odd K): zero-filled copies
padded to whole rows, then the tensor-core GEMM (tvm_dsm.rules.aligned_rows), where that is
predicted faster than the CUDA-core GEMM; same values as written (llvm), and (GPU) against
float64."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_dsm
from conftest import TARGET
from conftest import kernels as cuda_kernels
from tvm_dsm.errors import ClusterError
from tvm_dsm.families.simt_gemm import SimtGemm
from tvm_dsm.rules.aligned_rows import pad_rows_to_vectors
from tvm_dsm.workloads.dense import dense, gated_dense


def _shapes(func) -> dict:
    return {str(b.name): [int(d) for d in b.ty.shape] for b in func.body.block.alloc_buffers}


def test_both_operands_are_padded_to_whole_16_byte_rows():
    padded = pad_rows_to_vectors(dense(257, 1024, 1021, "bfloat16"))
    shapes = _shapes(padded)
    assert (shapes["X_pad"], shapes["W_pad"]) == ([257, 1024], [1024, 1024])


@pytest.mark.parametrize("func", [dense(257, 1024, 1024), dense(64, 4096, 1021, weight_layout="kn"),
                                  dense(64, 1024, 1021, "float32")])
def test_rows_on_16_bytes_weights_k_by_n_and_fp32_are_left_as_written(func):
    assert pad_rows_to_vectors(func) is None


def test_the_padded_function_computes_the_same_values():
    func = gated_dense(5, 24, 13, "float32")  # fp32: llvm runs it; padded as a 16-bit one would be
    from tvm import s_tir

    from tvm_dsm.rules.split_k_gemm import find_gemm
    sch = s_tir.Schedule(func)
    for product in find_gemm(sch, operand_types=("float32",))[0]:
        sch.pad_einsum(product, [1, 1, 8])
    rng = np.random.default_rng(0)
    x, wg, wu = (rng.standard_normal(s).astype("float32") for s in ((5, 13), (24, 13), (24, 13)))
    outputs = []
    for f in (func, sch.mod["main"]):
        out = tvm.runtime.tensor(np.full((5, 24), np.nan, "float32"))
        tvm.compile(tvm.IRModule({"main": f}), target="llvm")["main"](*(tvm.runtime.tensor(a) for a in (x, wg, wu)), out)
        outputs.append(out.numpy())
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)


def test_a_large_product_takes_the_tensor_cores_and_a_small_one_the_cuda_cores():
    with pytest.raises(ClusterError, match="copies padded to whole 16-byte rows, then the tensor cores"):
        SimtGemm().recognize(dense(257, 1024, 1021, "bfloat16"))
    found = cuda_kernels(tvm_dsm.build(dense(257, 1024, 1021, "bfloat16"), TARGET).mod.imports[0].inspect_source())
    assert len(found) == 3 and sum("CUtensorMap" in k for k in found.values()) == 1  # two copies, the GEMM
    assert SimtGemm().recognize(dense(7, 1000, 127)).k == 127


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(257, 1024, 1021), (100, 3000, 1023)])
@pytest.mark.parametrize("gated", [False, True])
def test_gpu_padded_rows_match_float64(m, n, k, gated):
    from tvm_dsm.workloads.generated import _silu

    rng = np.random.default_rng()
    x = rng.standard_normal((m, k)).astype(np.float16)
    weights = [(rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16) for _ in range(2 if gated else 1)]
    func = gated_dense(m, n, k) if gated else dense(m, n, k)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((m, n), np.nan, np.float16), dev)
    tvm_dsm.build(func, TARGET)(*(tvm.runtime.tensor(a, dev) for a in (x, *weights)), out)
    products = [x.astype(np.float64) @ w.astype(np.float64).T for w in weights]
    ref = _silu(products[0]) * products[1] if gated else products[0]
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3
