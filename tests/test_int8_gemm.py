"""int8 GEMMs with exact int32 sums (W8A8): the split-K GEMM family on int8 mma.sync (CPU: the
family takes what TE and TOPI write, the generated CUDA and its accumulators, the limits; GPU:
exact sums and the dequantizing epilogue against numpy)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import te, topi

import tvm_dsm
from conftest import TARGET, cuda_source
from tvm_dsm import driver
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.rules.split_k_gemm import SplitKGemmConfig, schedule_split_k_gemm

MMA_S8 = "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"
SMALL = SplitKGemmConfig(cluster_size=2, block_m=64, block_n=64, block_k=64, warps_m=2, warps_n=2, stages=3)


def topi_dense(m: int, n: int, k: int):
    """``topi.nn.dense`` of int8 X and W ``[N, K]`` into int32, as a SmoothQuant user writes it."""
    x = te.placeholder((m, k), "int8", name="x")
    w = te.placeholder((n, k), "int8", name="w")
    return te.create_prim_func([x, w, topi.nn.dense(x, w, out_dtype="int32")])


def dequantized_dense(m: int, n: int, k: int, x_dtype: str = "int8", weight_layout: str = "nk"):
    """int32 sums of int8 products, scaled per token and per channel into fp16 (W8A8)."""
    x = te.placeholder((m, k), x_dtype, name="x")
    w = te.placeholder((n, k) if weight_layout == "nk" else (k, n), "int8", name="w")
    sx, sw = te.placeholder((m,), "float32", name="sx"), te.placeholder((n,), "float32", name="sw")
    r = te.reduce_axis((0, k), name="r")
    weight = (lambda j, r: w[j, r]) if weight_layout == "nk" else (lambda j, r: w[r, j])
    acc = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("int32") * weight(j, r).astype("int32"), axis=r),
                     name="acc")
    out = te.compute((m, n), lambda i, j: (acc[i, j].astype("float32") * sx[i] * sw[j]).astype("float16"), name="out")
    return te.create_prim_func([x, w, sx, sw, out])


def test_an_int8_gemm_multiplies_on_int8_mma_and_sums_its_int32_partials_through_dsm(assemble):
    source = cuda_source(schedule_split_k_gemm(topi_dense(128, 256, 512), SMALL, load_hardware()).mod)
    for needle in (MMA_S8, "ldmatrix", "cp.async.cg.shared.global", "ld.shared::cluster.v4.s32"):
        assert needle in source, needle
    assert "f32" not in re.findall(r"mma\.sync[^\"]*", source)[0]
    # the accumulators are the thread's registers (a warp's 32 x 32 outputs: 32 ints a thread), not
    # 32 lanes' worth of memory each thread indexes by its lane, which the fill would not zero
    accumulators = [int(size) for size in re.findall(r"\bint \w*_warp_ptr\[(\d+)\]", source)]
    assert accumulators and max(accumulators) <= 32, accumulators
    assemble(source, "int8_gemm")


@pytest.mark.parametrize(("m", "n", "k"), [(37, 96, 160), (2, 8, 64), (1000, 1024, 4096)])
def test_int8_tiles_past_the_edges_copy_by_predicated_cp_async_and_assemble(m, n, k, assemble):
    """Tiles past M, N or K are zero-filled copies; TVM 0.27 injects cp.async only for a float
    zero, and prints the plain copy's 16 int8 zeros as a make_int4 nvcc rejects
    (tvm_dsm.transform.zero_filled_copies)."""
    source = tvm_dsm.build(topi_dense(m, n, k), TARGET).mod.imports[0].inspect_source()
    assert "cp_async" in source and "make_int4((signed char)" not in source
    assemble(source, f"int8_gemm_{m}x{n}x{k}")


def test_the_planner_takes_int8_products_written_in_te_and_topi():
    for func in (topi_dense(1000, 14336, 4096), dequantized_dense(128, 4096, 4096), dequantized_dense(37, 96, 160)):
        ranking = driver.plan(func)
        assert ranking.family.name == "split_k_gemm"
        assert not ranking.plans[0].config.tma and not ranking.plans[0].config.wgmma


@pytest.mark.parametrize(("func", "message"), [
    (dequantized_dense(128, 256, 512, weight_layout="kn"), "weight stored \\[n, k\\]"),
    (dequantized_dense(128, 256, 512, x_dtype="uint8"), "operands of one type"),
])
def test_int8_products_the_family_cannot_multiply_are_refused_by_name(func, message):
    with pytest.raises(ClusterError, match=message):
        schedule_split_k_gemm(func, SMALL, load_hardware())


def test_int8_tiles_by_tma_are_refused():
    with pytest.raises(ClusterError, match="cp.async"):
        schedule_split_k_gemm(topi_dense(128, 256, 512),
                              SplitKGemmConfig(2, 64, 64, 128, 2, 2, 3, tma=True), load_hardware())


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(128, 256, 512), (1000, 1024, 4096), (37, 96, 160), (256, 4096, 1024)])
def test_int8_sums_are_exact_on_the_gpu(m, n, k):
    lib = tvm_dsm.build(topi_dense(m, n, k), TARGET)
    rng = np.random.default_rng()
    x = rng.integers(-128, 128, (m, k)).astype(np.int8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((m, n), np.iinfo(np.int32).min, np.int32), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    np.testing.assert_array_equal(out.numpy(), x.astype(np.int64) @ w.astype(np.int64).T)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(128, 4096, 4096), (33, 48, 64)])
def test_dequantized_int8_gemm_matches_float64_on_the_gpu(m, n, k):
    lib = tvm_dsm.build(dequantized_dense(m, n, k), TARGET)
    rng = np.random.default_rng()
    x = rng.integers(-128, 128, (m, k)).astype(np.int8)
    w = rng.integers(-128, 128, (n, k)).astype(np.int8)
    sx = rng.uniform(0.001, 0.01, m).astype(np.float32)
    sw = (rng.uniform(0.001, 0.01, n) / np.sqrt(k)).astype(np.float32)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((m, n), np.nan, np.float16), dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in (x, w, sx, sw)), out)
    ref = (x.astype(np.int64) @ w.astype(np.int64).T) * sx[:, None].astype(np.float64) * sw[None, :]
    got = out.numpy().astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
