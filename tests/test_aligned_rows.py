"""16-bit GEMMs whose operand rows are off 16 bytes (an odd K; with [K, N] weights also an odd
N): zero-filled copies padded to whole rows, then the tensor-core GEMM (tvm_dsm.rules.aligned_rows), where that is
predicted faster than the CUDA-core GEMM; same values as written (llvm), and (GPU) against
float64."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_dsm
from conftest import LLVM, TARGET
from conftest import kernels as cuda_kernels
from tvm_dsm.errors import ClusterError
from tvm_dsm.rules.aligned_rows import pad_rows_to_vectors
from tvm_dsm.workloads.dense import dense, gated_dense


def _shapes(func) -> dict:
    return {str(b.name): [int(d) for d in b.ty.shape] for b in func.body.block.alloc_buffers}


def test_both_operands_are_padded_to_whole_16_byte_rows():
    padded = pad_rows_to_vectors(dense(257, 1024, 1021, "bfloat16"))
    shapes = _shapes(padded)
    assert (shapes["X_pad"], shapes["W_pad"]) == ([257, 1024], [1024, 1024])


def test_weights_k_by_n_are_padded_along_each_misaligned_row():
    """W [K, N]: an odd N pads W's rows and the product's columns (its real ones copied out), an
    odd K pads X's rows and W's row count."""
    assert _shapes(pad_rows_to_vectors(dense(64, 1021, 4096, weight_layout="kn")))["W_pad"] == [4096, 1024]
    shapes = _shapes(pad_rows_to_vectors(dense(64, 4096, 1021, weight_layout="kn")))
    assert (shapes["X_pad"], shapes["W_pad"]) == ([64, 1024], [1024, 4096])


@pytest.mark.parametrize("func", [dense(257, 1024, 1024), dense(64, 4096, 1024, weight_layout="kn"),
                                  dense(64, 1024, 1021, "float32")])
def test_rows_on_16_bytes_and_fp32_are_left_as_written(func):
    assert pad_rows_to_vectors(func) is None


@pytest.mark.parametrize("func", [gated_dense(5, 24, 13), dense(5, 24, 13, bias=True),
                                  dense(5, 24, 13, weight_layout="kn"), dense(5, 13, 24, weight_layout="kn")],
                         ids=["gated", "bias", "kn_odd_k", "kn_odd_n"])
def test_the_padded_function_computes_the_same_values(func):
    """fp16 on llvm: X and W zero-filled past K (one copy of X for both gated products), or W
    past N, the epilogue reading the products as before."""
    padded = pad_rows_to_vectors(func)
    assert sum(name.startswith("X_pad") for name in _shapes(padded)) <= 1
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal([int(d) for d in p.ty.shape]).astype("float16") for p in func.params[:-1]]
    outputs = []
    shape = [int(d) for d in func.params[-1].ty.shape]
    for f in (func, padded):
        out = tvm.runtime.tensor(np.full(shape, np.nan, "float16"))
        tvm.compile(tvm.IRModule({"main": f}), target=LLVM)["main"](*(tvm.runtime.tensor(a) for a in inputs), out)
        outputs.append(out.numpy())
    np.testing.assert_array_equal(outputs[1], outputs[0])


@pytest.mark.parametrize("func", [
    dense(1, 4096, 1021),  # one row: the GEMV reads W once, a copy would read and write it again
    gated_dense(te.var("m"), 1024, 1021),  # a symbolic row count: the CUDA cores' per range
    gated_dense(te.var("m", "int64"), 1024, 1021),  # as Relax legalizes it (operators narrowed to int32)
    gated_dense(4, 256, 1021),  # small: predicted faster on the CUDA cores
], ids=["one_row", "symbolic", "symbolic_int64", "small"])
def test_products_the_copies_do_not_pay_for_build_without_them(func, caplog):
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        tvm_dsm.build(func, TARGET)
    assert "copied to whole rows" not in caplog.text


def test_a_symbolic_row_count_keeps_the_cuda_cores_in_every_range():
    """Each range is planned at a constant specialization, where copies might be predicted
    faster: the padded path needs constant rows, so the ranges keep the CUDA-core GEMM."""
    func = dense(te.var("m", "int64"), 1024, 1021)
    kernels, _ = tvm_dsm.driver.schedule_row_ranges(func)
    assert {k.family.name for k in kernels} == {"simt_gemm"}


def test_a_fused_weight_is_padded_product_by_product():
    """s_tir pads no product reading a fused weight from a row on (W[n + j, k]); operator by
    operator, each product is padded on its own."""
    func = gated_dense(257, 1024, 1021, fused_weight=True)
    assert pad_rows_to_vectors(func) is None
    tvm_dsm.build(func, TARGET)


def test_a_large_gated_layer_is_copied_to_whole_rows(caplog):
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        tvm_dsm.build(gated_dense(257, 1024, 1021), TARGET)
    assert "copied to whole rows" in caplog.text


def test_a_large_product_takes_the_tensor_cores_and_a_small_one_the_cuda_cores():
    with pytest.raises(ClusterError, match="copies padded to whole 16-byte rows, then the tensor cores"):
        tvm_dsm.plan(dense(257, 1024, 1021, "bfloat16"))
    found = cuda_kernels(tvm_dsm.build(dense(257, 1024, 1021, "bfloat16"), TARGET).mod.imports[0].inspect_source())
    assert len(found) == 3 and sum("CUtensorMap" in k for k in found.values()) == 1  # two copies, the GEMM
    assert tvm_dsm.plan(dense(7, 1000, 127)).family.name == "simt_gemm"


def test_a_copied_k_by_n_weight_is_read_by_tma_where_cp_async_would_not_lower(caplog):
    """At 64 rows a [K, N] product ranks mma.sync tiles first, whose cp.async copies TVM cannot
    inject reading a copy made in the function: the padded product takes TMA tiles instead, and
    the module lowers without falling back."""
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        source = tvm_dsm.build(dense(64, 4096, 1021, weight_layout="kn"), TARGET).mod.imports[0].inspect_source()
    assert "copied to whole rows" in caplog.text and "does not lower" not in caplog.text
    found = cuda_kernels(source)
    assert len(found) == 3 and sum("CUtensorMap" in k for k in found.values()) == 1


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(257, 1024, 1021), (100, 3000, 1023), (64, 1021, 4096)])
@pytest.mark.parametrize("form", ["dense", "dense_kn", "gated", "fused_weight"])
def test_gpu_padded_rows_match_float64(m, n, k, form):
    from tvm_dsm.workloads.generated import _silu

    rng = np.random.default_rng()
    x = rng.standard_normal((m, k)).astype(np.float16)
    weights = [(rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16)
               for _ in range(1 if form.startswith("dense") else 2)]
    func = (dense(m, n, k, weight_layout=form[6:] or "nk") if form.startswith("dense")
            else gated_dense(m, n, k, fused_weight=form == "fused_weight"))
    args = ([x, np.concatenate(weights)] if form == "fused_weight" else [x, weights[0].T.copy()] if form == "dense_kn"
            else [x, *weights])
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((m, n), np.nan, np.float16), dev)
    tvm_dsm.build(func, TARGET)(*(tvm.runtime.tensor(a, dev) for a in args), out)
    products = [x.astype(np.float64) @ w.astype(np.float64).T for w in weights]
    ref = products[0] if form.startswith("dense") else _silu(products[0]) * products[1]
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
def test_gpu_a_gated_layer_of_an_int64_row_count_matches_float64():
    """Operator by operator (no family takes the gated layer whole at K = 1021), one module
    called at 1, 17 and 100 rows."""
    from tvm_dsm.workloads.generated import _silu

    n, k = 1024, 1021
    module = tvm_dsm.build(gated_dense(te.var("m", "int64"), n, k), TARGET)
    rng, dev = np.random.default_rng(), tvm.cuda(0)
    for m in (1, 17, 100):
        x = rng.standard_normal((m, k)).astype(np.float16)
        wg, wu = ((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16) for _ in range(2))
        out = tvm.runtime.tensor(np.full((m, n), np.nan, np.float16), dev)
        module(*(tvm.runtime.tensor(a, dev) for a in (x, wg, wu)), out)
        g, u = (x.astype(np.float64) @ w.astype(np.float64).T for w in (wg, wu))
        ref = _silu(g) * u
        assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3, m
