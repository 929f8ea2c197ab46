"""A gated layer (SwiGLU's gate and up products, two weights or one fused weight) whose rows
overrun its tiles (a symbolic row count or one off the tiles), or whose N or K do: rewritten to
whole tiles (tvm_dsm.rules.padded_gated_tiles), scheduled by the split-K GEMM, one kernel per
range of rows; a SwiGLU chain of any row count on those kernels operator by operator; (GPU)
against float64 at row counts and widths on and off the tiles."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te

import tvm_dsm
from conftest import TARGET
from conftest import kernels as cuda_kernels
from tvm_dsm.families.row_ranges import range_kernels
from tvm_dsm.hardware import load_hardware
from tvm_dsm.ir import is_reduction, loads
from tvm_dsm.rules.padded_gated_tiles import pad_gated_to_tiles
from tvm_dsm.workloads.chains import swiglu_ffn
from tvm_dsm.workloads.dense import gated_dense


def test_the_rewrite_reads_x_once_zero_filled_and_copies_the_real_rows_last():
    func = pad_gated_to_tiles(gated_dense(te.var("m"), 256, 512, fused_weight=True), [16, 64, 128])
    sch = s_tir.Schedule(func)
    fill, gate, up, output, copy = (sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root")))
    assert not is_reduction(fill) and "if_then_else" in str(fill.body)
    x_pad = fill.writes[0].source
    for product in (gate, up):
        assert is_reduction(product) and any(ld.source.same_as(x_pad) for ld in loads(product.body.value))
    assert "W[v_j + 256, v_k]" in str(up.body)  # the fused weight's up rows
    padded_rows = str(x_pad.ty.shape[0])
    assert str(output.writes[0].source.ty.shape[0]) == padded_rows
    assert copy.writes[0].source.same_as(func.params[-1])  # the real rows of H, last


@pytest.mark.parametrize("fused_weight", [True, False])
def test_a_gated_layer_of_any_row_count_builds_a_kernel_per_range(fused_weight):
    """Each range's kernel computes whole tiles of rows and stores those below the row count;
    one and two rows are gated row GEMVs (no rows to clip)."""
    func = gated_dense(te.var("m"), 1024, 2048, fused_weight=fused_weight)
    one, two, *kernels = range_kernels(func, TARGET, load_hardware())
    assert [(k.bound, k.family.name) for k in (one, two)] == [(1, "row_gemv"), (2, "row_gemv")]
    assert {k.family.name for k in kernels} == {"split_k_gemm"} and len(kernels) > 1
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    found = cuda_kernels(source)
    assert len(found) == 2 + len(kernels)
    assert sum(") < m)" in kernel for kernel in found.values()) == len(kernels)


@pytest.mark.parametrize("fused_weight", [True, False])
def test_columns_and_k_off_the_tiles_read_each_weight_through_a_zero_filled_copy(fused_weight):
    """N = 3000 and K = 1000 off 64-wide tiles: X is filled once for both products, each
    product's weight (a fused weight's gate and up rows) once, and the build is one kernel."""
    func = gated_dense(13, 3000, 1000, fused_weight=fused_weight)
    sch = s_tir.Schedule(pad_gated_to_tiles(func, [16, 64, 128]))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    fills = [b for b in blocks if not is_reduction(b) and "if_then_else" in str(b.body)]
    assert len(fills) == 3 and sum(is_reduction(b) for b in blocks) == 2
    assert tvm_dsm.plan(func).family.name == "split_k_gemm"
    assert len(cuda_kernels(tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source())) == 1


def test_rows_off_the_tiles_take_the_gated_kernel():
    func = gated_dense(100, 1024, 2048, fused_weight=True)
    assert tvm_dsm.plan(func).family.name == "split_k_gemm"
    assert len(cuda_kernels(tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source())) == 1


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(1024, 2048), (3000, 1000)])
@pytest.mark.parametrize("fused_weight", [True, False])
def test_gpu_a_gated_layer_matches_float64_at_every_row_count(fused_weight, n, k):
    """One module of a symbolic row count at 1, 7, 16, 17, 100 and 300 rows, and a build at 100
    rows, with N and K on the tiles and off them; fresh inputs, NaN-poisoned outputs."""
    symbolic = tvm_dsm.build(gated_dense(te.var("m"), n, k, fused_weight=fused_weight), TARGET)
    static = tvm_dsm.build(gated_dense(100, n, k, fused_weight=fused_weight), TARGET)
    dev, rng = tvm.cuda(0), np.random.default_rng()
    for m, module in [*((m, symbolic) for m in (1, 7, 16, 17, 100, 300)), (100, static)]:
        x = rng.standard_normal((m, k)).astype(np.float16)
        w = (rng.standard_normal((2 * n, k)) / np.sqrt(k)).astype(np.float16)
        weights = [w] if fused_weight else [w[:n], w[n:]]
        out = tvm.runtime.tensor(np.full((m, n), np.nan, np.float16), dev)
        module(*(tvm.runtime.tensor(np.ascontiguousarray(a), dev) for a in (x, *weights)), out)
        g, u = (x.astype(np.float64) @ half.astype(np.float64).T for half in (w[:n], w[n:]))
        ref = g / (1 + np.exp(-g)) * u
        error = np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref)
        assert error < 2e-3, (m, error)


def test_a_swiglu_chain_of_any_row_count_runs_its_operators_on_the_gemm_kernels():
    """The chain family plans constant rows, so a SwiGLU FFN of a symbolic row count is built
    operator by operator: the gated layer (both products one operator) and the down projection
    each a kernel per range of rows, the intermediate read by TMA (its extent compacted to
    ``min(m, padded rows)``), none of them dlight's; at one and two rows each is a row GEMV (no TMA)."""
    source = tvm_dsm.build(swiglu_ffn(te.var("m"), 1024, 512, 512), TARGET).mod.imports[0].inspect_source()
    found = cuda_kernels(source)
    without_tma = [name for name, kernel in found.items() if "CUtensorMap" not in kernel]
    assert len(found) > 4 and len(without_tma) == 4, without_tma


@pytest.mark.gpu
def test_gpu_a_swiglu_chain_of_any_row_count_matches_float64():
    """One module at 1, 17, 100 and 300 rows; fresh inputs, NaN-poisoned outputs."""
    n, k = 1024, 512
    module = tvm_dsm.build(swiglu_ffn(te.var("m"), n, k, k), TARGET)
    dev, rng = tvm.cuda(0), np.random.default_rng()
    for m in (1, 17, 100, 300):
        x = rng.standard_normal((m, k)).astype(np.float16)
        wg, wu = ((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16) for _ in range(2))
        w2 = (rng.standard_normal((k, n)) / np.sqrt(n)).astype(np.float16)
        out = tvm.runtime.tensor(np.full((m, k), np.nan, np.float16), dev)
        module(*(tvm.runtime.tensor(a, dev) for a in (x, wg, wu, w2)), out)
        g, u = (x.astype(np.float64) @ w.astype(np.float64).T for w in (wg, wu))
        ref = (g / (1 + np.exp(-g)) * u) @ w2.astype(np.float64).T
        error = np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref)
        assert error < 2e-3, (m, error)
