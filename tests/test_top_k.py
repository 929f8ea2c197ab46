"""Top-k as a cascade level (MoE routing: max, exp-sum and top-k of the same logits in one pass):
recognized only when it is exactly tvm-dsm's top-k reduction, fused with the softmax statistics
beside it, equal to the unfused function and to a stable-sort reference (ties included)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx

from tvm_dsm.fusion.top_k import parse_top_k, top_k
from tvm_dsm.annotations import TOP_K_KEY
from tvm_dsm.planners.cascade_split import plan_cascade_split
from tvm_dsm.transform import fuse_cascaded_reductions
from tvm_dsm.workloads.cascades import moe_routing
from conftest import LLVM

T, E, K = 24, 96, 8
K_UNFUSED = 3  # compiling the unfused top-k takes minutes at k = 8 (see tvm_dsm.fusion.top_k)


def _logits(seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((T, E)).astype("float16")
    x[1, [7, 40, 41]] = 4.0  # ties inside the top-k: the lower index ranks first
    x[2, :] = 0.5  # a row that is all ties
    return x


def _build(func):
    return tvm.compile(tvm.IRModule({"main": func}), target=LLVM)


def _route(ex, x: np.ndarray, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """The routing weights and indices that ``ex``, a build of a routing function, gives ``x``."""
    weights = tvm.runtime.tensor(np.full((T, k), np.nan, "float32"))
    indices = tvm.runtime.tensor(np.full((T, k), np.iinfo("int32").min, "int32"))
    ex["main"](tvm.runtime.tensor(x), weights, indices)
    return weights.numpy(), indices.numpy()


def _passes_over_x(func) -> int:
    """Top-level blocks reading the logits."""
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    return sum(any(str(r.source.name) == "x" for r in b.reads) for b in blocks)


def _reference(x: np.ndarray, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    x64 = x.astype("float64")
    p = np.exp(x64 - x64.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    order = np.argsort(-x64, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(p, order, 1), order


@pytest.mark.parametrize("parts, vector", [(1, 1), (4, 1), (32, 1), (4, 8)])
def test_moe_routing_fuses_into_one_pass_and_matches(parts, vector):
    func = moe_routing(T, E, K)
    fused, reports = fuse_cascaded_reductions(func, parts=parts, vector=vector)
    (report,) = reports
    assert report.fusible and sorted(report.levels) == ["l", "m", "topk"], str(report)
    assert "topk (top-8): plain" in report.details
    assert _passes_over_x(fused) == 1 and _passes_over_x(func) == 3
    built = _build(fused)
    for seed in (0, 1):
        x = _logits(seed)
        want_w, want_i = _reference(x)
        got_w, got_i = _route(built, x)
        np.testing.assert_array_equal(got_i, want_i)
        assert np.abs(got_w - want_w).max() / np.abs(want_w).max() < 1e-6


@pytest.fixture(scope="module")
def unfused_and_fused():
    """Builds of the routing function with top-3 unfused and fused in 4 parts."""
    func = moe_routing(T, E, K_UNFUSED)
    fused, _ = fuse_cascaded_reductions(func, parts=4)
    return _build(func), _build(fused)


def test_fused_equals_unfused(unfused_and_fused):
    """The unfused function (TVM lowers the top-k's own combine) agrees with the fused one."""
    x = _logits(2)
    (unfused_w, unfused_i), (fused_w, fused_i) = (_route(ex, x, K_UNFUSED) for ex in unfused_and_fused)
    np.testing.assert_array_equal(fused_i, unfused_i)
    np.testing.assert_array_equal(fused_i, _reference(x, K_UNFUSED)[1])
    np.testing.assert_allclose(fused_w, unfused_w, rtol=1e-6)


def test_packed_keys_rank_signed_zeros_infinities_and_nans_like_comparisons(unfused_and_fused):
    """fp16 values scan as packed integer keys (tvm_dsm.fusion.top_k_keys): -0 ties with +0
    (lower index first), -inf and NaN never enter (as with the comparisons: they do not beat the
    initial value), a row with fewer finite values than k keeps empty slots, and fp16 extremes
    keep their order. The unfused function, whose combine compares values, is the reference."""
    x = _logits(3)
    x[0, :] = np.where(np.arange(E) % 7 == 0, x[0, :], -np.inf)
    x[0, [5, 9, 60]] = [np.float16(-0.0), np.float16(0.0), np.float16(-0.0)]
    x[3, :] = -np.inf
    x[3, [10, 70]] = [1.0, -65504.0]  # two finite values for k = 3
    x[4, 11] = np.nan
    x[4, 12] = 65504.0
    x[5, :] = np.float16(-0.0)
    x[5, ::2] = np.float16(0.0)
    x[6, :] = -(np.arange(E) % 13 + 1) / 4  # negatives only: -0.25 at 0, 13, 26 ranks first
    (unfused_w, unfused_i), (fused_w, fused_i) = (_route(ex, x, K_UNFUSED) for ex in unfused_and_fused)
    np.testing.assert_array_equal(fused_i, unfused_i)
    np.testing.assert_array_equal(np.isnan(fused_w), np.isnan(unfused_w))
    np.testing.assert_allclose(fused_w, unfused_w, rtol=1e-6)
    assert list(fused_i[5]) == [0, 1, 2]  # all ties: +0 and -0 alike, by index
    assert list(fused_i[3][:2]) == [10, 70]
    assert list(fused_i[6]) == [0, 13, 26]


def test_top_k_of_a_dependent_value_is_not_fused():
    """top-k of exp(x - max x) would need its pairs corrected as the max moves: refused."""
    x = te.placeholder((T, E), name="x")
    r = te.reduce_axis((0, E), "r")
    m = te.compute((T,), lambda i: te.max(x[i, r], axis=r), name="m")
    best = top_k(lambda i, k: te.exp(x[i, k] - m[i]), (T,), E, K)
    func = te.create_prim_func([x, *best])
    out, reports = fuse_cascaded_reductions(func)
    assert out.same_as(func)
    assert "only a top-k of the data itself" in reports[0].reason


def test_an_annotated_block_that_is_not_a_top_k_is_not_recognized():
    """The annotation alone does not make a top-k: a max reduction carrying it is rejected."""
    x = te.placeholder((T, E), name="x")
    r = te.reduce_axis((0, E), "r")
    m = te.compute((T,), lambda i: te.max(x[i, r], axis=r), name="m", attrs={TOP_K_KEY: 1})
    sch = s_tir.Schedule(te.create_prim_func([x, m]))
    assert parse_top_k(sch.get(sch.get_sblock("m"))) is None


def test_recognized_top_k_names_its_outputs_and_value():
    x = te.placeholder((T, E), "float16", name="x")
    best = top_k(lambda i, k: x[i, k].astype("float32"), (T,), E, 4)
    sch = s_tir.Schedule(te.create_prim_func([x, *best]))
    found = parse_top_k(sch.get(sch.get_sblock("topk")))
    assert found.k == 4 and len(found.values) == len(found.indices) == 4
    assert isinstance(found.value, tirx.Cast) and str(found.value.ty.dtype) == "float32"


def test_moe_routing_kernel_assembles_for_sm90a(assemble):
    from conftest import cuda_source

    from tvm_dsm.rules.fused_rows import schedule_fused_rows

    fused, _ = fuse_cascaded_reductions(moe_routing(64, 1024, 8), parts=32, vector=8, shuffle=True)
    source = cuda_source(schedule_fused_rows(fused).mod)
    assert "__launch_bounds__(32)" in source
    # one 16-byte load before the loop, and in it the next chunk's (clamped to the last one)
    assert source.count("*(uint4*)(x_ptr") == 2 and "min((" in source
    # the 32 parts of a row are one warp: 5 shuffle rounds of the 8 packed keys, m and l, and
    # no shared-memory merge round
    assert source.count("__shfl_xor_sync") == 5 * (8 + 2)
    assert "_merge" not in str(fused)
    assemble(source, "moe_routing")


def test_rows_share_a_cta_where_a_rows_parts_fill_less_than_a_warp(assemble):
    """8 parts per row, 4 rows per CTA: one full warp, the rows' shuffles inside their 8 lanes,
    each part's partial state in registers (shared memory holds only the 4 rows' outputs)."""
    from conftest import cuda_source

    from tvm_dsm.rules.fused_rows import schedule_fused_rows

    fused, (report,) = fuse_cascaded_reductions(moe_routing(256, 128, 8), parts=8, vector=8, shuffle=True,
                                                rows_per_cta=4)
    assert report.fusible, str(report)
    source = cuda_source(schedule_fused_rows(fused).mod)
    assert "__launch_bounds__(32)" in source and "threadIdx.z" in source
    assert "__shfl_xor_sync((uint)4294967295," in source and ", 8);" in source  # full mask, width 8
    shared = [line for line in source.splitlines() if "__shared__" in line]
    assert shared and all(line.rstrip().endswith("[4];") for line in shared)  # the rows' outputs
    assemble(source, "moe_routing_rows4")


@pytest.mark.parametrize("kwargs", [{"parts": 64}, {"parts": 8, "ranks": 2}, {"parts": 8, "shuffle": False}])
def test_rows_per_cta_needs_a_rows_merge_inside_one_warp(kwargs):
    split = {"vector": 1, "shuffle": True, "rows_per_cta": 2, **kwargs}
    fused, (report,) = fuse_cascaded_reductions(moe_routing(64, 128, 8), **split)
    assert not report.fusible and "must merge inside one warp" in report.reason


def test_planner_fills_a_warp_with_short_top_k_rows():
    """16384 rows of 128 experts: 8 parts per row and 4 rows per CTA (measured 9.1 us against
    18.5 at 16 parts and one row per CTA, cascades_rows.json)."""
    split = plan_cascade_split(moe_routing(16384, 128, 8))
    assert (split.parts, split.rows_per_cta, split.ranks) == (8, 4, 1)
    assert "4 rows per CTA" in split.explain()


def test_packed_keys_of_a_16_bit_level_keep_its_own_initial_value():
    """A top-k of fp16 values starts from the fp16 lowest (-65504): with comparisons that value
    never enters, so it must not enter as a key either (the fp32 lowest is not the bound)."""
    rows, extent, k = 4, 32, 3
    x = te.placeholder((rows, extent), "float16", name="x")
    r = te.reduce_axis((0, extent), "mk")
    peak = te.compute((rows,), lambda i: te.max(x[i, r], axis=r), name="m")
    best = top_k(lambda i, q: x[i, q] + tirx.const(0, "float16"), (rows,), extent, k)
    order = te.compute((rows, k), lambda i, c: tirx.Select(
        c == 0, best[k][i], tirx.Select(c == 1, best[k + 1][i], best[k + 2][i])), name="order")
    func = te.create_prim_func([x, peak, order])
    fused, (report,) = fuse_cascaded_reductions(func, parts=2)
    assert report.fusible, str(report)
    values = np.full((rows, extent), -65504.0, "float16")
    values[0, 5] = 1.0
    values[1, 7] = -65000.0

    def run(f):
        ex = tvm.compile(tvm.IRModule({"main": f}), target=LLVM)
        out = tvm.runtime.tensor(np.full((rows,), np.nan, "float16"))
        got = tvm.runtime.tensor(np.full((rows, k), np.iinfo("int32").min, "int32"))
        ex["main"](tvm.runtime.tensor(values), out, got)
        return got.numpy()

    unfused, got = run(func), run(fused)
    np.testing.assert_array_equal(got, unfused)
    assert list(got[0]) == [5, -1, -1] and list(got[1]) == [7, -1, -1]


@pytest.mark.gpu
@pytest.mark.parametrize("rows, experts", [(256, 1024), (4096, 256), (16384, 128)])
def test_gpu_planned_routing_matches_stable_sort(rows, experts):
    """The user path on the GPU: planned split, warp-shuffle merges of packed keys, ties (and
    at 16384 x 128, four rows per CTA)."""
    from conftest import TARGET

    from tvm_dsm.planners.cascade_split import schedule_cascade

    sch, _ = schedule_cascade(moe_routing(rows, experts, K))
    ex = tvm.compile(sch.mod, target=TARGET)
    x = np.random.default_rng().standard_normal((rows, experts)).astype("float16")
    x[1, [7, 40, 41]] = 4.0
    x[2, :] = 0.5
    dev = tvm.cuda(0)
    weights = tvm.runtime.tensor(np.full((rows, K), np.nan, "float32"), dev)
    indices = tvm.runtime.tensor(np.full((rows, K), np.iinfo("int32").min, "int32"), dev)
    ex["main"](tvm.runtime.tensor(x, dev), weights, indices)
    want_w, want_i = _reference(x)
    np.testing.assert_array_equal(indices.numpy(), want_i)
    assert np.abs(weights.numpy() - want_w).max() / np.abs(want_w).max() < 1e-6


def test_moe_routing_tutorial_shows_fusion_plan_and_assembled_cuda(capsys):
    from conftest import run_tutorial

    out = run_tutorial("moe_routing", capsys)
    assert "cascade topk -> m -> l: fusible" in out and "top-k rows: 32 lanes a row, 4 rows" in out
    assert "fused_kernel(" in out and "cp_async" in out and "warp shuffles (row max and sum" in out
    assert "nvcc sm_90a: assembles" in out or "skipped (no nvcc)" in out
