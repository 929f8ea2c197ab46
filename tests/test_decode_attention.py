"""Decode attention through FuseCascadedReductions: scores computed per key inside the fused
loop (an element producer), lanes sharing each key through warp shuffles, a row's parts spread
over a cluster whose last partials meet through DSM, and the planner's split."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import LLVM, TARGET, cuda_source

from tvm_dsm.errors import ClusterError
from tvm_dsm.planners.cascade_split import plan_cascade_split, schedule_cascade
from tvm_dsm.transform.cascaded_reductions import fuse_cascaded_reductions
from tvm_dsm.workloads.cascades import decode_attention, moe_routing


def _inputs(rows, keys, dim, rng):
    return [rng.standard_normal(s).astype(np.float16) for s in ((rows, dim), (rows, keys, dim), (rows, keys, dim))]


def _reference(q, k, v):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    s = np.einsum("rd,rtd->rt", q, k) / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(1, keepdims=True))
    return np.einsum("rt,rtd->rd", p, v) / p.sum(1)[:, None]


def _run(func, inputs, target=LLVM, dev=None):
    dev = dev or tvm.cpu()
    lib = tvm.compile(tvm.IRModule({"main": func}) if isinstance(func, tvm.tirx.PrimFunc) else func, target=target)
    rows, dim = inputs[0].shape
    out = tvm.runtime.tensor(np.full((rows, dim), np.nan, np.float32), dev)
    lib["main"](*[tvm.runtime.tensor(a, dev) for a in inputs], out)
    return out.numpy()


@pytest.mark.parametrize("keys, dim, parts, vector", [(64, 16, 1, 1), (64, 16, 4, 2), (16, 16, 4, 1)])
def test_scores_are_computed_inside_the_loop(keys, dim, parts, vector):
    """Fused equals the unfused function and float64; the score buffer is gone. keys == dim
    checks that the max over keys is not mistaken for a level over the scores' own axis."""
    func = decode_attention(3, keys, dim)
    fused, reports = fuse_cascaded_reductions(func, parts=parts, vector=vector)
    assert reports[0].fusible, reports[0]
    assert "s: computed per element inside the loop (sum over %d)" % dim in str(reports[0])
    assert " s = T.sblock_alloc_buffer" not in fused.script()  # the scores are never stored
    inputs = _inputs(3, keys, dim, np.random.default_rng(7))
    ref = _reference(*inputs)
    for f in (func, fused):
        out = _run(f, inputs)
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("kwargs, reason", [
    ({"parts": 4, "lanes": 3}, "lanes=3"),
    ({"parts": 4, "lanes": 32}, "do not divide"),
    ({"parts": 4, "lanes": 4, "ranks": 3}, "ranks=3"),
    ({"parts": 2, "lanes": 1, "ranks": 4}, "ranks=4"),
    ({"parts": 4, "lanes": 1, "copy_stages": 3}, "copy_stages=3"),
    ({"parts": 4, "lanes": 4, "copy_stages": 1}, "copy_stages=1"),
])
def test_unsupported_splits_are_refused_with_a_reason(kwargs, reason):
    func = decode_attention(2, 64, 16)
    fused, reports = fuse_cascaded_reductions(func, **kwargs)
    assert fused.same_as(func) and not reports[0].fusible and reason in reports[0].reason


def test_top_k_refuses_lanes():
    _, reports = fuse_cascaded_reductions(moe_routing(4, 64, 2), parts=4, lanes=4)
    assert not reports[0].fusible and "top-k" in reports[0].reason


def test_planner_spreads_few_long_rows_over_a_cluster():
    few = plan_cascade_split(decode_attention(32, 16384, 128))
    many = plan_cascade_split(decode_attention(1024, 1024, 128))
    assert few.ranks > 1 and many.ranks == 1 and few.lanes == many.lanes == 16
    assert few.bytes_in_flight >= few.bytes_needed
    assert "through DSM" in few.explain() and "one CTA per row" in many.explain()


def test_planner_keeps_many_short_rows_in_one_warp_each():
    """4096 rows fill the SMs with one 32-thread CTA each (32 CTAs per SM): more threads per
    row add merge work, not loads in flight (measured: MoE 4096x4096 39 us at 32 parts, 45 at
    64)."""
    split = plan_cascade_split(moe_routing(4096, 4096, 8))
    assert (split.parts, split.ranks, split.lanes, split.vector) == (32, 1, 1, 8)


@pytest.mark.parametrize(("tokens", "share"), [(2048, 4), (7, 1), (6, 2)])
def test_rows_share_ctas_only_in_whole_ctas(tokens, share):
    """60 experts in 8 parts of 4-element chunks fill a quarter of a warp: rows share CTAs,
    as many as divide the rows (7 rows are not 2 CTAs of 4, which the schedule refuses)."""
    split = plan_cascade_split(moe_routing(tokens, 60, 1, "bfloat16"))
    assert (split.parts, split.vector, split.rows_per_cta) == (8, 4, share)
    schedule_cascade(moe_routing(tokens, 60, 1, "bfloat16"), split=split)


@pytest.mark.parametrize("width", [1000, 3000])
def test_rows_the_parts_do_not_divide_split_with_a_predicated_last_step(width):
    """A 1000- or 3000-wide fp16 row is 125 or 375 chunks of 8: no power-of-two parts divide
    them, the planner splits anyway (the last step predicated) and the schedule builds."""
    split = plan_cascade_split(moe_routing(64, width, 2))
    assert split.vector == 8 and (width // 8) % split.parts
    schedule_cascade(moe_routing(64, width, 2), split=split)


def test_rows_of_an_odd_width_are_left_to_stock_reduction_rules_where_those_take_them():
    """Single-element loads lose to dlight's reduction rules (a logsumexp) and beat its fallback,
    a thread walking each row alone (MoE routing's top-k, which no reduction rule takes)."""
    from tvm_dsm.workloads.cascades import logsumexp

    with pytest.raises(ClusterError, match="rows of an odd width \\(1021\\)"):
        plan_cascade_split(logsumexp(64, 1021))
    assert plan_cascade_split(moe_routing(64, 1021, 2)).vector == 1


def test_cluster_rows_written_by_the_final_merge_run_on_every_rank():
    """A cascade whose outputs the ``*_final`` block writes directly (softmax statistics): the
    row block binds the ranks inside, so it is not a once-per-cluster stage guarded to rank 0
    (that guard once wrapped the whole kernel and its DSM accesses, which LowerCluster refused)."""
    from tvm_dsm.rules.fused_rows import schedule_fused_rows
    from tvm_dsm.transform.check_cluster import check_function
    from tvm_dsm.workloads.cascades import softmax_stats

    fused, reports = fuse_cascaded_reductions(softmax_stats(64, 1024), parts=64, ranks=2, shuffle=True)
    mod = schedule_fused_rows(fused).mod
    assert reports[0].fusible and check_function(mod["main"]) == []
    source = cuda_source(mod)
    assert "blockIdx.x) % 2) == 0" not in source.replace("(int)", "") and "mapa" in source


def test_cluster_merge_over_the_static_budget_is_refused():
    """64 parts per CTA of 130 fp32 states each: ~66 KB of partial states, over the static
    shared memory a cluster merge keeps them in."""
    from tvm_dsm.rules.fused_rows import schedule_fused_rows

    fused, reports = fuse_cascaded_reductions(decode_attention(4, 4096, 128), parts=128, lanes=16,
                                              ranks=2, vector=2)
    assert reports[0].fusible
    with pytest.raises(ClusterError, match="partial states take .* use fewer parts per CTA"):
        schedule_fused_rows(fused)


def test_copy_ring_over_the_static_budget_is_refused():
    """A cluster merge's partial states and the copy ring share static shared memory."""
    with pytest.raises(ClusterError, match="and the copy ring .* or copy stages"):
        _staged((64, 8192, 64), ranks=2, groups=32, vector=4, stages=3)


def test_cluster_decode_cuda(assemble):
    """Lanes combine the scores by shuffles, the parts of a warp their states; the last partials are read from peers (mapa) between
    cluster barriers; the intra-CTA partials are static shared memory (TVM's ThreadSync would
    otherwise need barriers inside the predicated merge rounds)."""
    sch, split = schedule_cascade(decode_attention(32, 4096, 128))
    assert split.ranks > 1
    source = cuda_source(sch.mod)
    scores = [line for line in source.splitlines() if "__shfl_xor_sync" in line and line.endswith(", 16));")]
    assert len(scores) == 4 * split.vector  # log2(16 lanes) per key
    # the two parts of each warp merge m, l and o's slice through shuffles (lane offset 16)
    assert source.count(", 16, 32);") == 3
    assert "mapa" in source and "barrier.cluster" in source
    assert "extern __shared__" not in source
    assert "*(uint4*)(_ptr" in source  # 16-byte loads of each lane's key/value slices
    assemble(source, "decode_cluster")


def _staged(shape, ranks=2, groups=8, vector=2, stages=3):
    from tvm_dsm.rules.fused_rows import schedule_fused_rows

    fused, reports = fuse_cascaded_reductions(decode_attention(*shape), parts=ranks * groups, vector=vector,
                                              lanes=shape[2] // 8, ranks=ranks, shuffle=True, copy_stages=stages)
    assert reports[0].fusible, reports[0]
    return schedule_fused_rows(fused).mod


def test_copy_stages_ring_cuda(assemble):
    """With copy stages each lane's K/V slices arrive by cp.async in a ring of shared memory: the
    prologue commits one group per stage, each step waits for its chunk (stages - 1 still in
    flight), and past the last chunk the copies read nothing; no CTA barrier inside the scan
    (each thread reads only its own copies); no register double buffering of the slices."""
    stages = 3
    source = cuda_source(_staged((64, 2048, 64), stages=stages))
    kernel = source[source.rindex('extern "C" __global__'):]
    scan = kernel[kernel.index("for (int v_1 = 0;"):kernel.index("wait_all")]
    assert scan.count("cp_async_cg_ignore_src") == 2 * 2  # K and V, 2 keys of one 16-byte slice
    assert "wait_group_2()" in scan and "commit_group();" in scan
    assert "__syncthreads" not in scan
    assert "min((v_1 + 1)" not in scan  # the register prefetch of the next chunk is gone
    prologue = kernel[:kernel.index("for (int v_1 = 0;")]
    assert prologue.count("commit_group();") == stages
    assemble(source, "decode_copy_stages")


def _rows_per_cta(shape):
    """Decode with 4 parts of 8 lanes (one warp) per row and 2 rows per CTA."""
    from tvm_dsm.rules.fused_rows import schedule_fused_rows

    fused, (report,) = fuse_cascaded_reductions(decode_attention(*shape), parts=4, lanes=8, vector=2,
                                                shuffle=True, rows_per_cta=2)
    assert report.fusible, str(report)
    return schedule_fused_rows(fused).mod


def test_rows_share_a_cta_with_lanes(assemble):
    source = cuda_source(_rows_per_cta((8, 256, 64)))
    assert "__launch_bounds__(64)" in source and "threadIdx.z" in source
    shuffles = [line for line in source.splitlines() if "__shfl_xor_sync(" in line and "#define" not in line]
    assert shuffles and all("__shfl_xor_sync((uint)4294967295," in line for line in shuffles)
    assemble(source, "decode_rows_per_cta")


@pytest.mark.gpu
def test_gpu_rows_per_cta_match_float64():
    shape = (64, 1024, 64)
    inputs = _inputs(*shape, np.random.default_rng())
    out = _run(_rows_per_cta(shape), inputs, target=TARGET, dev=tvm.cuda(0))
    ref = _reference(*inputs)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


def test_copy_stages_need_16_byte_slices():
    """A lane's slice of 4 fp16 (8 bytes) cannot be one 16-byte cp.async."""
    with pytest.raises(ValueError, match="16-byte slices"):
        fuse_cascaded_reductions(decode_attention(2, 256, 32), parts=8, vector=2, lanes=8, copy_stages=3)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, stages", [((64, 2048, 64), 3), ((8, 4096, 128), 4), ((3, 1024, 64), 2),
                                           ((3, 64, 64), 3)])
def test_gpu_copy_stages_match_float64(shape, stages):
    """(3, 64, 64): two chunks per part, fewer than the ring's stages (the third copy reads
    nothing)."""
    inputs = _inputs(*shape, np.random.default_rng())
    out = _run(_staged(shape, stages=stages), inputs, target=TARGET, dev=tvm.cuda(0))
    ref = _reference(*inputs)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(32, 4096, 128), (64, 2048, 64), (1, 4096, 128), (8, 2048, 64)])
def test_gpu_matches_float64(shape):
    sch, _ = schedule_cascade(decode_attention(*shape))
    inputs = _inputs(*shape, np.random.default_rng())
    out = _run(sch.mod, inputs, target=TARGET, dev=tvm.cuda(0))
    ref = _reference(*inputs)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.parametrize("name, shape", [("decode_attention", (1, 4096, 128)), ("decode_attention", (8, 2048, 64)),
                                         ("layernorm_stats", (2, 16384)), ("rmsnorm_gemv", (1, 8192)),
                                         ("moe_routing", (7, 2048, 2)), ("softmax_stats", (3, 8192))])
def test_planned_split_of_few_rows_builds(name, shape):
    """Few rows want clusters; the planner keeps only cluster splits that build (partial states
    within the static budget of a cluster merge, no split level across CTAs)."""
    from tvm_dsm.workloads import cascades

    sch, split = schedule_cascade(getattr(cascades, name)(*shape))
    assert "__global__" in cuda_source(sch.mod)
    if name in ("layernorm_stats", "rmsnorm_gemv"):
        assert split.ranks == 1


def test_split_level_over_a_cluster_is_refused_with_a_reason():
    from tvm_dsm.workloads.cascades import layernorm_stats

    func = layernorm_stats(2, 1024)
    fused, reports = fuse_cascaded_reductions(func, parts=8, ranks=2)
    assert fused.same_as(func) and "split level" in reports[0].reason


def test_shuffles_of_a_cta_smaller_than_a_warp_name_only_its_lanes():
    """2 parts x 2 lanes are 4 threads: every shuffle (scores, parts' merge) uses mask 0xF."""
    from tvm_dsm.rules.fused_rows import schedule_fused_rows

    fused, reports = fuse_cascaded_reductions(decode_attention(2, 64, 16), parts=2, lanes=2, shuffle=True)
    assert reports[0].fusible
    source = cuda_source(schedule_fused_rows(fused).mod)
    shuffles = [line for line in source.splitlines() if "__shfl_xor_sync(" in line and "#define" not in line]
    assert shuffles and all("__shfl_xor_sync((uint)15," in line for line in shuffles)


def test_a_cluster_split_of_a_relax_legalized_cascade_plans_over_int64_indices():
    """Relax's int64 indices beside the cluster split's int32 rank arithmetic (the partial
    states' layout) raised TypeError out of ``plan``; the split is planned on the function
    indexed in int32."""
    from tvm_dsm.workloads.attention_forms import relax_attention

    func = relax_attention(1, 32, 1, 1024, 64, dtype="bfloat16", bias_shape=(1, 1, 1, 1024))
    split = plan_cascade_split(func)
    assert split.ranks > 1 and schedule_cascade(func, split=split)[0] is not None


def test_a_cascade_that_keeps_int64_indices_plans_without_a_cluster_split_it_cannot_index():
    """An int64 parameter (a position a mask reads) keeps the function's int64 indices
    (tvm_dsm.ir.narrow_indices): the cluster splits fail to index their partial states, and
    the split of one CTA a row is planned instead of raising TypeError."""
    from tvm import te, tirx, topi

    rows, width = tirx.IntImm("int64", 2), tirx.IntImm("int64", 65536)
    x = te.placeholder((rows, width), "float32", name="x")
    position = te.placeholder((tirx.IntImm("int64", 1),), "int64", name="position")
    masked = te.compute((rows, width), lambda i, j: tirx.Select(j <= position[0], x[i, j], tirx.const(-1e30, "float32")),
                        name="masked")
    assert plan_cascade_split(te.create_prim_func([x, position, topi.nn.softmax(masked)])).ranks == 1
