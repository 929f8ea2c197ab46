"""Matmuls written to accumulate in fp16/bf16 (TOPI's dense without out_dtype, a plain TE sum)
are planned as accumulating in fp32 and rounded once, so the GEMM family takes them."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from conftest import LLVM, TARGET
from tvm import te, tirx, topi

import tvm_dsm
from tvm_dsm.transform.widen_accumulation import widen_accumulation


def topi_dense(m: int, n: int, k: int, dtype: str = "float16") -> tvm.tirx.PrimFunc:
    x = te.placeholder((m, k), dtype, name="x")
    w = te.placeholder((n, k), dtype, name="w")
    return te.create_prim_func([x, w, topi.nn.dense(x, w)])


def te_matmul_kn(m: int, n: int, k: int, dtype: str = "float16") -> tvm.tirx.PrimFunc:
    x = te.placeholder((m, k), dtype, name="x")
    w = te.placeholder((k, n), dtype, name="w")
    r = te.reduce_axis((0, k), "r")
    y = te.compute((m, n), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="y")
    return te.create_prim_func([x, w, y])


def _error_on_llvm(func, x, w, ref) -> float:
    out = tvm.runtime.tensor(np.full(ref.shape, np.nan, x.dtype))
    tvm.compile(tvm.IRModule({"main": func}), target=LLVM)(tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
    got = out.numpy().astype(np.float64)
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def test_widened_accumulation_is_closer_to_the_exact_product():
    func = topi_dense(8, 64, 4096)
    rng = np.random.default_rng()
    x = rng.standard_normal((8, 4096)).astype("float16")
    w = rng.standard_normal((64, 4096)).astype("float16")
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    widened = _error_on_llvm(widen_accumulation(func), x, w, ref)
    assert widened < 2e-3 and widened < _error_on_llvm(func, x, w, ref)


@pytest.mark.parametrize("make", [topi_dense, te_matmul_kn])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_16_bit_accumulated_matmul_takes_the_gemm_family(make, dtype):
    func = make(128, 1024, 512, dtype)
    assert tvm_dsm.plan(func).family.name == "split_k_gemm"
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert "mma" in source


def test_the_fallback_schedule_accumulates_in_fp32_too():
    """One row over [K, N] weights 250 wide and 8192 deep (too few CTAs for the column GEMV over
    so long a K): no family takes the function; TVM's schedule gets the widened form, from build
    and schedule alike."""
    from tvm_dsm.driver import schedule, stock_schedule

    func = te_matmul_kn(1, 250, 8192)
    with pytest.raises(tvm_dsm.errors.ClusterError):
        tvm_dsm.plan(func)
    widened = stock_schedule(widen_accumulation(func), tvm.target.Target(TARGET)).mod
    as_written = stock_schedule(func, tvm.target.Target(TARGET)).mod
    tvm.ir.assert_structural_equal(schedule(func).mod, widened)
    assert not tvm_ffi.structural_equal(as_written, widened)


def test_a_gemv_written_to_accumulate_in_16_bits_is_planned_widened():
    """The GEMVs take fp32 sums only: a decode row accumulated in fp16 as written reaches the
    column GEMV in its widened form."""
    from tvm_dsm.rules.column_gemv import find_column_gemv

    func = te_matmul_kn(1, 256, 512)
    with pytest.raises(tvm_dsm.errors.ClusterError, match="accumulates in fp32"):
        find_column_gemv(func)
    ranking = tvm_dsm.plan(func)
    assert ranking.family.name == "column_gemv"
    find_column_gemv(ranking.func)  # the form planned sums in fp32


def test_functions_without_a_16_bit_product_are_left_alone():
    assert widen_accumulation(topi_dense(16, 64, 64, "float32")) is None
    x = te.placeholder((16, 64), "float16", name="x")
    assert widen_accumulation(te.create_prim_func([x, topi.sum(x, axis=1)])) is None  # no product


@pytest.mark.gpu
@pytest.mark.parametrize("make", [topi_dense, te_matmul_kn])
def test_a_16_bit_accumulated_matmul_is_correct_on_the_gpu(make):
    m, n, k = 100, 1024, 4096
    func = make(m, n, k)
    lib = tvm_dsm.build(func)
    rng = np.random.default_rng()
    x = rng.standard_normal((m, k)).astype("float16")
    w = rng.standard_normal((n, k) if make is topi_dense else (k, n)).astype("float16")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((m, n), np.nan, "float16"), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    wt = w.astype(np.float64) if make is te_matmul_kn else w.astype(np.float64).T
    ref = x.astype(np.float64) @ wt
    assert np.linalg.norm(out.numpy().astype(np.float64) - ref) / np.linalg.norm(ref) < 2e-3


def test_a_symbolic_batch_16_bit_dense_takes_the_gemm_family_per_row_range():
    kernels, _ = tvm_dsm.driver.schedule_row_ranges(topi_dense(te.var("m"), 1024, 512))
    assert [k.family.name for k in kernels] == ["row_gemv"] * 2 + ["split_k_gemm"] * (len(kernels) - 2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_one_row_product_over_int64_extents_keeps_its_gemv_family(dtype):
    """The rounding block reads its element with extents of the index's type: a GEMV family
    compares that region with the product's (Relax-legalized int64)."""
    i64 = lambda v: tirx.IntImm("int64", v)  # noqa: E731
    a, w = te.placeholder((i64(1), i64(4096)), dtype, name="a"), te.placeholder((i64(4096), i64(4096)), dtype, name="w")
    assert tvm_dsm.driver.plan(te.create_prim_func([a, w, topi.nn.dense(a, w)])).family.name == "row_gemv"
