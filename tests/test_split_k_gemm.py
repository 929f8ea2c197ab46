"""Cluster split-K GEMM on tensor cores: schedule structure, generated CUDA, planner, errors."""

from __future__ import annotations

import dataclasses
import time

import pytest

from conftest import cuda_source, dense_relu_error_on_gpu
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware, refitted
from tvm_dsm.planners.split_k_gemm import candidate_configs, plan_split_k_gemm, predict, schedule_dense
from tvm_dsm.rules.split_k_gemm import GemmShape, SplitKGemmConfig, check_config, schedule_split_k_gemm, tiled_shape
from tvm_dsm.workloads.dense import dense, gated_dense

SMALL = SplitKGemmConfig(cluster_size=2, block_m=64, block_n=64, block_k=32, warps_m=2, warps_n=2, stages=3)


@pytest.mark.parametrize(("layout", "dtype", "ptx_type"),
                         [("nk", "float16", "f16"), ("kn", "float16", "f16"), ("nk", "bfloat16", "bf16"),
                          ("kn", "bfloat16", "bf16")])
def test_generated_cuda_uses_tensor_cores_async_copies_and_dsm(layout, dtype, ptx_type, assemble):
    func = dense(128, 256, 512, dtype=dtype, weight_layout=layout)
    source = cuda_source(schedule_split_k_gemm(func, SMALL, load_hardware()).mod)
    for needle in ("ldmatrix", f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}.{ptx_type}.f32",
                   "cp.async.cg.shared.global", "cp.async.wait_group", "mapa.shared::cluster",
                   "ld.shared::cluster.v4.f32", "barrier.cluster.arrive"):
        assert needle in source, needle
    assert source.count("__global__") == 2  # declaration + definition of one fused kernel
    assemble(source, f"gemm_{layout}_{dtype}")


def _main_loop_body(source: str) -> str:
    """The body of the innermost ``for`` loop issuing both copies and mma (the K loop)."""
    bodies = []
    for start in (i for i in range(len(source)) if source.startswith("for (", i)):
        depth, open_at = 0, source.index("{", start)
        for end in range(open_at, len(source)):
            depth += {"{": 1, "}": -1}.get(source[end], 0)
            if depth == 0:
                break
        body = source[open_at:end]
        if "commit_group()" in body and "mma.sync" in body:
            bodies.append(body)
    return min(bodies, key=len)


def test_main_loop_waits_for_its_tile_then_runs_one_barrier_per_k_step():
    """The K loop waits for the tile it reads, then one barrier guards both that tile (RAW) and
    the slot the next copy overwrites (WAR); s_tir's pipeline alone emits two barriers."""
    four_stages = SplitKGemmConfig(2, 64, 64, 32, 2, 2, stages=4)
    body = _main_loop_body(cuda_source(schedule_split_k_gemm(dense(128, 256, 1024), four_stages, load_hardware()).mod))
    assert body.count("__syncthreads()") == 1
    # The step reads tile t and prefetches fragments of t+1: both landed, t+2 still in flight.
    assert body.index("wait_group_1()") < body.index("__syncthreads()") < body.index("commit_group()")
    # With 3 stages the early wait would leave no copy in flight: both barriers stay.
    body = _main_loop_body(cuda_source(schedule_split_k_gemm(dense(128, 256, 1024), SMALL, load_hardware()).mod))
    assert body.count("__syncthreads()") == 2


def test_epilogue_is_fused_into_the_reduce_scatter(assemble):
    func = dense(128, 256, 512, bias=True, activation="silu")
    source = cuda_source(schedule_split_k_gemm(func, SMALL, load_hardware()).mod)
    assert source.count("__global__") == 2  # no second kernel for bias, activation or cast
    assert "exp" in source  # silu's sigmoid
    assemble(source, "gemm_silu")


@pytest.mark.parametrize(("config", "loads_per_store_run"), [
    # 32 KB of partials in flight per CTA: 2048 16-byte loads over its threads
    (SplitKGemmConfig(2, 64, 128, 64, 4, 1, 4, tma=True, wgmma=True), 16),  # 8 rows x 2 peers
    (SplitKGemmConfig(2, 128, 256, 64, 8, 1, 4, tma=True, wgmma=True), 8),  # 4 rows x 2 peers
    (SplitKGemmConfig(4, 128, 128, 64, 8, 1, 4, tma=True, wgmma=True), 8),  # 2 rows x 4 peers
    (SplitKGemmConfig(16, 128, 128, 64, 8, 1, 4, tma=True, wgmma=True), 16),  # 1 row x 16 peers
])
def test_each_thread_loads_a_batch_of_partials_before_it_stores_a_sum(config, loads_per_store_run):
    """The peer loads are asm volatile with a memory clobber, so none moves above a store of Y:
    a thread loads every partial of its batch of rows before the batch's first store, and
    waits one DSM latency per batch, not per row."""
    source = cuda_source(schedule_split_k_gemm(dense(128, 2048, 8192), config, load_hardware()).mod)
    epilogue = source[source.index("__syncthreads();", source.rindex("mma")):]
    runs = [run.count("ld_vec_shared__cluster_v4_f32(") for run in epilogue.split("Y_ptr")[:-1]]
    assert runs[0] == loads_per_store_run and not any(runs[1:loads_per_store_run // config.cluster_size])
    # one batch per iteration of the thread's loop: no lane loop unrolled into the thread
    assert sum(runs) == loads_per_store_run and "threadIdx.x" in epilogue.split("Y_ptr")[0]


@pytest.mark.parametrize(
    ("func", "config", "message"),
    [
        (dense(8, 256, 500), SMALL, "K=500: operand rows .* K a multiple of 8"),
        (dense(128, 256, 512, dtype="float32"), SMALL, "two operands of one type among"),
        (dense(128, 256, 512), SplitKGemmConfig(2, 64, 64, 32, 2, 2, stages=2), "at least 3"),
        (dense(128, 256, 512), SplitKGemmConfig(2, 64, 64, 32, 2, 2, stages=1),
         "stages=1 .no pipeline. is for a single cp.async K step per CTA; got 8"),
        (dense(128, 256, 64), SplitKGemmConfig(1, 64, 64, 64, 2, 2, stages=1, tma=True),
         "got 1 step.s. by TMA"),
        (dense(128, 256, 512), SplitKGemmConfig(32, 64, 64, 32, 2, 2), "cluster size 32"),
        (dense(128, 256, 256), SplitKGemmConfig(4, 64, 64, 32, 2, 2, stages=3), "cannot fill"),
        (dense(256, 512, 4096), SplitKGemmConfig(2, 256, 256, 64, 2, 4, 4), "shared memory"),
    ],
)
def test_unsupported_inputs_get_clear_errors(func, config, message):
    with pytest.raises(ClusterError, match=message):
        schedule_split_k_gemm(func, config, load_hardware())


def test_planner_ranks_the_pruned_space_fast_and_explains():
    hw = load_hardware()
    shape = GemmShape(128, 4096, 16384, True)
    start = time.perf_counter()
    plans = plan_split_k_gemm(shape, hw)
    assert time.perf_counter() - start < 1.0
    assert len(plans) == len(candidate_configs(shape)) > 50
    assert [p.predicted_us for p in plans] == sorted(p.predicted_us for p in plans)
    # 32 output tiles for 132 SMs: the model must split K (measured: cluster 1 is 2.6x slower).
    assert plans[0].config.cluster_size > 1
    text = plans[0].explain()
    assert "predicted" in text and "hbm" in text and "dsm" in text


def test_planner_charges_grids_that_double_up_sms(monkeypatch):
    """G5b's 128 CTAs of 128x128 tiles in clusters of 4 (GPCs hold 120 at one per SM) measured
    1.4x over the model without this charge, 94.9 us, and the planner picked them; 128x64 tiles
    (256 CTAs, every SM doubled up evenly) measured 78.6 us (bench/results/gemm.json). With
    wgmma the same tiles took 88.0 us, 128x256 ones 63.4 (bench/results/gemm_wgmma.json)."""
    import tvm_dsm.planners.split_k_gemm as planner

    hw = load_hardware()
    shape = GemmShape(128, 4096, 16384, True)
    doubled = SplitKGemmConfig(4, 128, 128, 64, 2, 4, 3, True)
    even = SplitKGemmConfig(4, 128, 64, 64, 2, 2, 3, True)  # 256 CTAs: every SM doubled up
    charged = predict(shape, doubled, hw)
    assert charged.ctas == 128 > hw.concurrent_ctas(4, 1)
    assert plan_split_k_gemm(shape, hw)[0].config != doubled
    assert charged.predicted_us > predict(shape, even, hw).predicted_us
    monkeypatch.setattr(planner, "_doubled_up", lambda ctas, one_per_sm, headroom: 1.0)  # no charge
    assert charged.predicted_us > 1.2 * predict(shape, doubled, hw).predicted_us


def test_operand_tiles_come_from_l2_faster_than_a_plain_re_read():
    """At the microbenchmark's L2 rate, 128 x 4096 x 16384 (G5b) planned 64 CTAs of 128x256
    tiles in clusters of 4 (66.7 us on the H100); at the rate GEMM tiles reach, 128x64 tiles in
    clusters of 2 (54.5 us, bench/results/gemm_tile_l2_ab.json)."""
    hw = load_hardware("h100_sxm")
    shape = GemmShape(128, 4096, 16384, True)
    fitted = plan_split_k_gemm(shape, hw)[0].config
    plain = plan_split_k_gemm(shape, refitted(hw, **{"gemm.tile_l2_speedup": 1.0}))[0].config
    assert (plain.cluster_size, plain.block_n) == (4, 256)
    assert (fitted.cluster_size, fitted.block_m, fitted.block_n) == (2, 128, 64)


def test_192_column_tiles_fill_the_sms_where_128_and_256_do_not():
    """1024 x 6144 x 1024 (S8a at M = 1024): 48 columns of 128-wide tiles make 384 CTAs (three
    waves), 24 of 256-wide ones 192 (1.5); 32 of 192-wide ones 256, two full waves. On the H100
    128x192 tiles ran 28.5 us against 35.1 for the previous pick, 128x256
    (bench/results/gemm_tile_l2_ab.json). Only warpgroup MMAs take them."""
    hw = load_hardware()
    best = plan_split_k_gemm(GemmShape(1024, 6144, 1024, True), hw)[0].config
    assert (best.block_m, best.block_n, best.wgmma) == (128, 192, True)
    widths = {(c.block_n, c.wgmma) for c in candidate_configs(GemmShape(256, 6144, 1024, True))}
    assert (192, True) in widths and (192, False) not in widths
    assert all(c.block_n != 192 for c in candidate_configs(GemmShape(256, 4096, 1024, True)))


def test_80_column_tiles_fill_the_sms_for_n_8960():
    """S6's gated layer (128 x 8960 x 1536, gate and up): 128-wide tiles make 70 CTAs, 64-wide
    ones 140 (past one wave); 112 CTAs of 128x80 fill 85 % of the SMs. On the H100 the S6 chain
    ran 45.4 -> 39.9-40.4 us with them (bench/results/tile_80_ab.json). A TMA copy moves a tile
    whole, so an 80x64 tile needs no whole number of 16-byte copies per thread; a cp.async
    copy of it does."""
    hw = load_hardware()
    shape = GemmShape(128, 8960, 1536, True, products=2)
    best = plan_split_k_gemm(shape, hw)[0].config
    assert (best.cluster_size, best.block_m, best.block_n, best.tma, best.wgmma) == (1, 128, 80, True, True)
    widths = {(c.block_n, c.tma, c.wgmma) for c in candidate_configs(shape)}
    assert (80, True, True) in widths and not any(n == 80 and not (tma and wgmma) for n, tma, wgmma in widths)
    with pytest.raises(ClusterError, match="16-byte copies"):
        check_config(shape, SplitKGemmConfig(1, 128, 80, 64, 8, 1, 4, tma=False, wgmma=False), load_hardware())


def test_planner_charges_the_reduce_scatter_at_half_the_dsm_bandwidth():
    """S2b (128 x 2048 x 5632): clusters of 8 with 128x256 tiles measured 20.2 us, clusters of 4
    with 128x128 tiles 16.8 (bench/results/gemm_dsm_reduce_ab.json, H100); with the DSM term at
    the microbenchmark's bandwidth the planner picked the former (where L2 was counted at the
    microbenchmark's rate too, as then; at the tiles' rate, 128x256 tiles lose on L2 alone)."""
    hw = refitted(load_hardware("h100_sxm"), **{"gemm.tile_l2_speedup": 1.0})
    shape = GemmShape(128, 2048, 5632, True)
    pick = plan_split_k_gemm(shape, hw)[0].config
    assert (pick.cluster_size, pick.block_m, pick.block_n) == (4, 128, 128)
    pick = plan_split_k_gemm(shape, refitted(hw, **{"gemm.dsm_reduce_efficiency": 1.0}))[0].config
    assert (pick.cluster_size, pick.block_m, pick.block_n) == (8, 128, 256)


def test_one_fragment_of_rows_is_a_gemm_too(assemble):
    """M = 16: one 16-row fragment per tile (decode batches), planned and assembled."""
    sch, plan = schedule_dense(dense(16, 4096, 4096))
    assert plan.config.block_m == 16 and plan.config.warps_m == 1
    assemble(cuda_source(sch.mod), "gemm_m16")


@pytest.mark.parametrize("m, height", [(17, 32), (24, 32), (32, 32), (33, 64), (48, 64), (64, 64)])
def test_a_short_row_of_tiles_is_as_tall_as_its_rows_need(m, height):
    """M up to 64: tiles of the least height that holds M are ranked first. 48 rows run on one
    padded 64-row tile, not three whole 16-row ones (the 1B Llama's LM head: 36.8 against
    84.6 us), and 17 on 32-row tiles, not 128- or 64-row ones whose zero-filled rows made the
    gate/up GEMM 2x slower (bench/results/archive/tile_heights_s59.json)."""
    hw = load_hardware("h200_sxm")
    for n, k in ((16384, 2048), (32000, 2048), (2048, 8192), (3072, 2048)):
        plans = plan_split_k_gemm(GemmShape(m, n, k, True), hw, padded=True)
        heights = [p.config.block_m for p in plans]
        assert heights == sorted(heights, key=lambda h: h != height) and heights[0] == height, (m, n, k)


@pytest.mark.parametrize("m", [1, 13, 32])
def test_a_short_row_over_k_by_n_weights_takes_64_row_mma_sync_tiles(m):
    """Weights [K, N] reach mma.sync through ldmatrix.trans; there 64-row tiles ran fastest at
    1-32 rows, 16-row ones up to 1.5x and warpgroup tiles (W by TMA) up to 3x slower
    (bench/results/archive/kn_tile_heights_s68.json)."""
    hw = load_hardware("h200_sxm")
    for n, k in ((14336, 2048), (4096, 14336), (16384, 2048)):
        best = plan_split_k_gemm(GemmShape(m, n, k, False), hw, padded=True)[0].config
        assert (best.block_m, best.wgmma) == (64, False), (m, n, k)


def test_k_by_n_weights_beyond_what_was_measured_keep_the_short_tile_rule():
    """Past 32 rows, or under 2^24 weight elements, those tiles lost in the generality run
    (bench/results/archive/generality_kn_rule_s68.json): the rule for [N, K] weights holds."""
    hw = load_hardware("h200_sxm")
    assert plan_split_k_gemm(GemmShape(64, 4096, 14336, False), hw, padded=True)[0].config.wgmma
    assert plan_split_k_gemm(GemmShape(1, 5120, 1000, False), hw, padded=True)[0].config.block_m == 16


def test_where_whole_tiles_fit_k_stays_whole():
    """Where whole tiles fit, padded tiles run past M or N, never past K (steps past K in a
    cluster were not measured against whole ones, and some do not lower: below)."""
    shape = GemmShape(16, 896, 896, True)
    configs = candidate_configs(shape, padded=True, hw=load_hardware("h200_sxm"))
    assert any(c.block_m > 16 for c in configs) and any(896 % c.block_n for c in configs)
    assert all(tiled_shape(shape, c).k == 896 for c in configs)


@pytest.mark.parametrize("m, n, k, products", [(512, 4544, 4544, 1), (2048, 4544, 18176, 1), (2048, 4672, 4544, 1),
                                               (256, 4544, 4544, 2)])
def test_tiles_run_past_n_where_only_narrow_ones_divide_it(m, n, k, products):
    """Falcon-7B's 4544 columns (71 x 64) divide into 64-wide tiles only: tiles past N are
    predicted at least PAST_N_GAIN faster and ranked first (measured 1.3-2.1x faster on the H200,
    bench/results/archive/padded_picks_s89.json)."""
    from tvm_dsm.planners.split_k_gemm import PAST_N_GAIN

    plans = plan_split_k_gemm(GemmShape(m, n, k, True, products=products), load_hardware("h200_sxm"), padded=True)
    whole = [p.predicted_us for p in plans if not n % p.config.block_n]
    assert n % plans[0].config.block_n and plans[0].predicted_us * PAST_N_GAIN <= min(whole)


@pytest.mark.parametrize("m, n, k, products", [(512, 2048, 2048, 1), (512, 2560, 2560, 1), (8192, 3072, 768, 2),
                                               (1024, 8960, 1536, 1)])
def test_tiles_past_n_need_the_gain(m, n, k, products):
    """Tiles past N predicted a little faster than whole ones ran slower (0.86-0.97x, the same
    archive): whole columns of tiles are kept there."""
    plans = plan_split_k_gemm(GemmShape(m, n, k, True, products=products), load_hardware("h200_sxm"), padded=True)
    assert all(not n % p.config.block_n for p in plans)


def test_tma_tiles_take_no_whole_step_past_k():
    """A K whole in 64-deep steps but not in a cluster's (896 over 4 CTAs) would leave whole
    steps past K: TVM simplifies their zero fill to a condition on the step, which the TMA pass
    cannot prove says "inside the tensor", so every such plan of 37 x 896 x 4864 (clusters of 8)
    failed to lower and the function fell back to TVM's stock schedule. They are refused; the
    planner's first plan lowers (a K that straddles its last step keeps its copies' element
    predicates, and lowers)."""
    from tvm_dsm.rules.split_k_gemm import check_padded_config

    hw = load_hardware("h200_sxm")
    c4 = SplitKGemmConfig(4, 64, 64, 64, 4, 1, 4, True, True)
    with pytest.raises(ClusterError, match="whole in 64-deep steps but not in a cluster of 4"):
        check_padded_config(GemmShape(37, 896, 896, True), c4, hw)
    check_padded_config(GemmShape(37, 896, 4512, True), c4, hw)
    func = dense(37, 896, 4864)
    best = plan_split_k_gemm(GemmShape(37, 896, 4864, True), hw, padded=True)[0].config
    cuda_source(schedule_split_k_gemm(func, best, hw).mod)


@pytest.mark.parametrize("products", [1, 2])
def test_tiles_past_m_keep_enough_bytes_in_flight(products):
    """At 4 rows, 16 x 64 tiles 3 stages deep (one product's tiles 20 KiB ahead) ran up to 1.4x
    slower than 4 deep (bench/results/archive/short_tile_depths_s64.json): refused where the
    tile runs past M, kept at 16 rows."""
    hw = load_hardware("h200_sxm")
    shallow = SplitKGemmConfig(1, 16, 64, 64, 1, 2, 3, True)
    for m, n, k in ((4, 28672, 8192), (8, 14336, 4096), (16, 14336, 4096)):
        shape = GemmShape(m, n, k, True, products=products)
        configs = candidate_configs(shape, padded=True, hw=hw)
        assert (shallow in configs) == (m == 16), (m, n, k)
        assert dataclasses.replace(shallow, stages=4) in configs


@pytest.mark.gpu
@pytest.mark.parametrize("m", [17, 48])
def test_gpu_short_rows_on_padded_tiles_match_float64(m):
    """The tile heights above, on the GPU: rows past M zero-filled by TMA, never stored."""
    config = plan_split_k_gemm(GemmShape(m, 2048, 2048, True), load_hardware(), padded=True)[0].config
    assert dense_relu_error_on_gpu(m, 2048, 2048, config) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("m, fused", [(512, False), (256, True)])
def test_gpu_tiles_past_n_match_float64(m, fused):
    """The tiles past N above on the GPU, a dense layer and a gated one over one fused gate/up
    weight (the gate's columns past N read the up rows; those columns are not stored)."""
    import numpy as np

    from conftest import relative_error_on_gpu

    n, k = 4544, 4544
    if not fused:
        config = plan_split_k_gemm(GemmShape(m, n, k, True), load_hardware(), padded=True)[0].config
        assert n % config.block_n
        assert dense_relu_error_on_gpu(m, n, k, config) < 2e-3
        return
    rng = np.random.default_rng()
    x, w = rng.standard_normal((m, k)), rng.standard_normal((2 * n, k)) / np.sqrt(k)

    def swiglu(x, w):
        g, u = x @ w[:n].T, x @ w[n:].T
        return g / (1 + np.exp(-g)) * u

    assert relative_error_on_gpu(gated_dense(m, n, k, fused_weight=True), [x, w], swiglu, (m, n), "float16") < 2e-3


def test_a_matmul_that_writes_the_output_itself_gets_a_copy_stage(assemble):
    """No epilogue (an fp32 product, e.g. Relax's matmul before a softmax): the sums reach the
    output through a copy stage the rule adds."""
    from tvm import te

    from tvm_dsm.workloads.dense import matmul

    x, w = te.placeholder((128, 512), "float16", name="X"), te.placeholder((256, 512), "float16", name="W")
    func = te.create_prim_func([x, w, matmul(x, w)])
    source = cuda_source(schedule_split_k_gemm(func, SMALL, load_hardware()).mod)
    assert source.count("__global__") == 2 and "float4" in source  # one kernel, fp32 stores
    assemble(source, "gemm_no_epilogue")


def test_schedule_dense_uses_the_plan():
    sch, plan = schedule_dense(dense(128, 1024, 4096))
    assert f"tvm_dsm.cluster_size\": {plan.config.cluster_size}" in sch.mod.script()


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(128, 1024, 4096), (64, 768, 3072), (256, 512, 2048),
                                          (16, 1024, 4096)])
@pytest.mark.parametrize("cluster", [1, 2, 4])
def test_gpu_matches_float64(m, n, k, cluster):
    config = SplitKGemmConfig(cluster, min(m, 128), 64, 64, 2 if m >= 32 else 1, 2, 3)
    assert dense_relu_error_on_gpu(m, n, k, config) < 2e-3


def test_a_single_k_step_is_planned_without_a_pipeline(assemble):
    """K = 32 (G1's first layer) is one K step: the planner loads it unpipelined (stages=1)
    with plain 16-byte copies, not cp.async."""
    sch, plan = schedule_dense(dense(128, 512, 32))
    assert plan.config.stages == 1 and not plan.config.tma
    source = cuda_source(sch.mod)
    assert "cp.async" not in source and "mma.sync" in source
    assemble(source, "gemm_one_k_step")


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [1, 2])
def test_gpu_single_k_step_matches_float64(cluster):
    config = SplitKGemmConfig(cluster, 64, 64, 32 // cluster, 2, 2, stages=1)
    assert dense_relu_error_on_gpu(128, 512, 32, config) < 2e-3


def test_deep_pipelines_are_offered_to_all_but_the_fused_quantization(assemble):
    """Deeper than 4 stages measured 1.14x faster over the 37 picks it changed
    (gemm_depths.json), and 5-6 stages fastest on gated layers of 128x64 tiles
    (gated_one_loop_sweep.json); the fused quantization keeps 3-4 stages, never measured deeper."""
    from tvm_dsm.planners.split_k_gemm import PIPELINE_DEPTHS, SHALLOW_PIPELINES

    def depths(shape, quantized=False):
        return {c.stages for c in candidate_configs(shape, quantized)}

    assert depths(GemmShape(128, 512, 416, True)) == set(PIPELINE_DEPTHS)
    assert depths(GemmShape(128, 512, 4096, True, products=2)) == set(PIPELINE_DEPTHS)
    assert depths(GemmShape(128, 512, 4096, True, dtype="float8_e4m3fn")) == set(PIPELINE_DEPTHS)
    assert depths(GemmShape(128, 512, 4096, True, dtype="float8_e4m3fn"), quantized=True) == set(SHALLOW_PIPELINES)
    sch, plan = schedule_dense(dense(128, 512, 416))  # G3a: K = 13 steps of 32 by cp.async
    assert plan.config.stages == 8 and not plan.config.tma
    assemble(cuda_source(sch.mod), "gemm_eight_stages")


@pytest.mark.gpu
@pytest.mark.parametrize("config", [SplitKGemmConfig(1, 16, 64, 32, 1, 2, 8),
                                    SplitKGemmConfig(2, 64, 128, 64, 4, 1, 6, tma=True, wgmma=True)])
def test_gpu_deep_pipelines_match_float64(config):
    assert dense_relu_error_on_gpu(128, 512, 1024, config) < 2e-3


def _ranked(shape: GemmShape) -> tuple[list, dict]:
    """The planner's plans for ``shape``, best first, and each configuration's rank."""
    from tvm_dsm.hardware import load_hardware, refitted
    from tvm_dsm.planners.split_k_gemm import plan_split_k_gemm

    plans = plan_split_k_gemm(shape, load_hardware())
    return plans, {p.config: i for i, p in enumerate(plans)}

def test_equal_predictions_go_to_the_taller_tile():
    """At M = 128 a 128x64 tile and a 64x128 one move the same bytes in the model; with wgmma
    the taller one (8 warps, not 4) measured faster in 128 of 137 pairs, and the planner's
    picks that the tie-break changed ran 1.005-1.042x faster (tall_tiles_ab.json)."""
    plans, index = _ranked(GemmShape(128, 3072, 768, True))
    tall, wide = (SplitKGemmConfig(2, m, n, 64, m // 16, 1, 5, tma=True, wgmma=True) for m, n in ((128, 64), (64, 128)))
    assert plans[index[tall]].predicted_us == plans[index[wide]].predicted_us
    assert index[tall] < index[wide]


def test_equal_predictions_go_to_the_plan_furthest_from_its_bandwidth_limits():
    """G1's second GEMM (128 x 256 x 512) waits on its pipeline whatever the tile: the 64x64
    tiles (16 CTAs) and the 128x64 ones (8 CTAs) are predicted alike, and the many small CTAs,
    less of their bandwidth share used, ran the chain 1.095x as fast (chains_tie_break_ab.json)."""
    plans, index = _ranked(GemmShape(128, 256, 512, True))
    small, large = (SplitKGemmConfig(2, m, 64, 64, m // 16, 1, 4, tma=True, wgmma=True) for m in (64, 128))
    assert plans[index[small]].predicted_us == plans[index[large]].predicted_us
    assert plans[index[small]].seconds["l2"] < plans[index[large]].seconds["l2"]
    assert index[small] < index[large] and plans[0].config == small


def test_the_enumeration_skips_only_configurations_no_shape_takes():
    """The planner checks a shape only against the configurations check_config passes for the
    most permissive shape of its type and products: the same candidates as checking every
    configuration of the space, over shapes on and off the tiles, symbolic rows, both weight
    layouts, fp8, several products and every check and pipeline depth the planner uses."""
    import random

    from tvm import tirx

    from tvm_dsm.errors import passes
    from tvm_dsm.planners import split_k_gemm as planner
    from tvm_dsm.rules.quantized_gemm import check_quantized_config
    from tvm_dsm.rules.split_k_gemm import check_padded_config

    hw, rng = load_hardware(), random.Random(0)
    for _ in range(40):
        dtype = rng.choice(["float16", "bfloat16", "float8_e4m3fn"])
        shape = GemmShape(rng.choice([1, 37, 100, 128, 1024, tirx.Var("m", "int64")]), rng.choice([264, 1000, 3000, 4096]),
                          rng.choice([32, 416, 1000, 2048, 4104]), dtype == "float8_e4m3fn" or rng.random() < 0.6, dtype,
                          rng.choice([1, 2, 3]), rng.random() < 0.1)
        checks = [check_config, check_padded_config, planner._check_tiles_past_m_or_n]
        check = rng.choice(checks + ([check_quantized_config] if dtype != "float8_e4m3fn" else []))
        depths = rng.choice([planner.PIPELINE_DEPTHS, planner.SHALLOW_PIPELINES, (1,)])
        every = [c for c in planner._space(dtype, depths) if passes(check, shape, c, hw)]
        assert planner._enumerated(shape, check, depths, hw) == every, (shape, check.__name__, depths)


def test_a_product_written_to_two_outputs_is_refused_naming_them():
    """One product cast to an output and, through an activation, to another: the rule's epilogue
    ends in one output, so planning it would promise a schedule that cannot be applied."""
    from tvm import te, topi

    import tvm_dsm

    x, w = te.placeholder((100, 1536), "float16", name="x"), te.placeholder((1536, 1536), "float16", name="w")
    y = topi.nn.dense(x, w, out_dtype="float32")
    act = te.compute(y.shape, lambda i, j: te.max(y[i, j], 0.0), name="act")
    func = te.create_prim_func([x, w, topi.cast(y, "float16"), topi.cast(act, "float16")])
    with pytest.raises(ClusterError, match=r"split_k_gemm: .*this product reaches 2"):
        tvm_dsm.plan(func)
