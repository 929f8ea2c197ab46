"""Choose a cluster split-K GEMM configuration without measuring.

Per configuration the model counts the bytes each level moves -- HBM (each operand once, W again
per row of tiles when the rows run one after another and W outgrows L2, the output once), L2 (X
re-read by every column of tiles, W by every row of tiles), DSM (the fp32 partials of the
reduce-scatter) -- and the tensor-core work, and divides by the level's measured bandwidth
(:mod:`tvm_dsm.hardware`) or the mma.sync throughput. Terms the roofline lacks decide most
choices: how many SMs the grid keeps streaming (a CTA alone cannot pull its share of HBM
bandwidth: its pipeline holds ``stages - 2`` tiles in flight), the latency of each K step over
that lookahead, the waves (clusters of 3 or more CTAs strand SMs: measured residency), the
wave tail, and the SMs a grid slightly larger than one CTA per SM doubles up. Each CTA also
pays its pipeline fill and the two cluster barriers. It ranks configurations; it does not
promise absolute times.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware, load_hardware
from ..rules.quantized_gemm import check_quantized_config
from ..rules.quantized_gemm import shared_bytes as quantized_shared_bytes
from ..intrin.mma import TILE, element_bytes
from ..rules.split_k_gemm import (
    GemmShape,
    SplitKGemmConfig,
    apply_split_k_gemm,
    check_config,
    raster_group,
    find_gemm,
    shared_k_loop,
)
from ..intrin.wgmma import TILE_WIDTHS
from .report import Plan

#: Dense fp16 mma.sync throughput of an H100 SXM (FLOP/s). fp8 m16n8k32 doubles it on paper,
#: but ldmatrix cannot transpose 8-bit tiles and fp8 4096^3 ran at 324 TFLOP/s (424 us,
#: bench/results/fp8.json before session 12), so fp8 mma.sync is counted at this rate too.
MMA_SYNC_PEAK = 660e12
#: Dense fp16 warpgroup-MMA throughput (the H100 SXM's tensor-core peak). The same 4096^3
#: tiles ran 1.49x faster with wgmma than with mma.sync (bench/results/gemm_wgmma.json), the
#: ratio of the two peaks.
WGMMA_PEAK = 989e12
#: Bytes in flight one SM needs to sustain its share of HBM bandwidth (Little's law with the
#: measured ~700-cycle HBM latency at 2.8 TB/s over 132 SMs is ~15 KB; pipelines overlap less
#: than ideally, so twice that).
_BYTES_IN_FLIGHT_PER_SM = 32 * 1024
_REGISTERS_PER_THREAD = 128  # what the mma main loop compiles to, roughly (fragments + addresses)
#: A kernel launch and a CTA's per-K-step overhead (barrier, instruction issue); the chain
#: planner uses the same terms.
LAUNCH_S = 2.0e-6
STEP_S = 0.05e-6  # per K step of a CTA: the barrier and instruction issue around it
#: A cp.async tile's latency under full load (fitted on the H100 GEMM suite: 1.1-1.7 us). The
#: fragment prefetch of the next tile makes its copy land one step early, so a K step waits
#: this long over ``stages - 2`` steps of lookahead: 3 stages measured 1.3x slower than 4 on
#: 4096^3 with everything else equal.
LOADED_LATENCY_S = 1.5e-6
#: The same for a TMA tile (tvm_dsm.transform.tma_pipeline), which is awaited in the step that
#: uses it, so ``stages - 1`` steps of lookahead; fitted on the H100 cp.async-vs-TMA sweep
#: (bench/results/gemm_tma.json).
TMA_LATENCY_S = 1.75e-6
#: At most this many times its share of HBM bandwidth does one SM pull, given the bytes in
#: flight: 64 CTAs of 128x256 wgmma tiles streamed S3b's 90 MB (128 x 4096 x 11008) at
#: 1.9 TB/s, 1.4x the share of 64 of 132 SMs (bench/results/gemm_wgmma.json).
SM_PULL_CAP = 2.0
#: Share of mma.sync's tensor-core time the memory stream does not hide: the warps that wait
#: for tiles also issue every ldmatrix and mma.sync. Fitted on the H100 (gemm_wgmma.json):
#: the same tiles ran 1.1-1.3x faster with wgmma where memory bounds both; with the term the
#: planner's picks over 11 shapes x 16 configurations reach 0.98x of the best measured
#: (0.81x without), and its picks among the mma.sync-only runs do not get worse.
MMA_SYNC_EXPOSED = 0.3
#: How much more than its fair share of bandwidth an SM pulls while others idle. A grid a little
#: larger than one CTA per SM, where CTAs may share an SM, doubles up some SMs, and those finish
#: last, sped up by this much (fitted on the H100 sweeps: 128 CTAs in clusters of 4 or 8, whose
#: GPCs hold 120 at one per SM, ran 1.37-1.43x over the model without this term). The same
#: cap bounds what a busy SM pulls from L2 when others idle.
SM_HEADROOM = 1.31
#: Share of the measured DSM read bandwidth (tvm_dsm.hardware) the reduce-scatter reaches.
#: Fitted on the H100 GEMM runs (gemm*.json, 45 groups of configurations), while each thread
#: loaded one vector's partials after its store of the previous vector: at 0.5 the planner's
#: pick is 2.7% from the measured best on average (3.4% at 1.0; 8 picks more than 10% off at
#: 1.0, 6 at 0.5), Spearman 0.88 (0.83). Threads now load a batch of rows at once
#: (rules.split_k_gemm.sum_partials); that left the common picks (128x128 tiles, 256 threads,
#: clusters of 2-4) within 1% and sped up 128-thread tiles in clusters of 2 by 1.06-1.11x
#: (bench/results/dsm_reduce_batch_ab.json), which the model does not yet credit.
DSM_REDUCE_EFFICIENCY = 0.5
#: How much faster than the hardware file's L2 read rate (a plain re-read microbenchmark,
#: 6.0 TB/s) the operand tiles of a GEMM come from L2: S1b at M = 1024 on 128x192 tiles re-read
#: 671 MB in 78 us (8.6 TB/s, bench/results/gemm_n192.json). Fitted on the H100 sweeps (122
#: groups of configurations of one shape in gemm*, gated* and fp8* results): the planner's pick
#: came 1.020x from the measured best at 1.0, 1.011x at 1.6 and above.
TILE_L2_SPEEDUP = 1.6
#: Share of TMA's streaming rate that per-thread cp.async copies reach: the same GEMM operand
#: tiles streamed alone took 66.5 us by cp.async and 53.1 us by TMA on the H100
#: (src/hwbench/operand_stream.cu, bench/results/operand_stream.json).
CP_ASYNC_STREAM_EFFICIENCY = 53.1 / 66.5


def stream_share(tma: bool) -> float:
    """Share of the streaming bandwidth a main loop's operand copies reach (TMA: all of it)."""
    return 1.0 if tma else CP_ASYNC_STREAM_EFFICIENCY


@dataclass(frozen=True)
class GemmPlan(Plan):
    """A split-K GEMM configuration with its prediction."""

    config: SplitKGemmConfig
    ctas: int
    resident: int  # CTAs per SM
    smem: int  # bytes of dynamic shared memory per CTA
    products: int = 1  # a gated layer's two products (GemmShape.products)

    def summary(self) -> str:
        c = self.config
        order = "in one K loop" if shared_k_loop(c, self.products) else "one main loop after the other"
        gated = f" of {self.products} gated products, {order}" if self.products > 1 else ""
        split = (f"K split over clusters of {c.cluster_size} CTAs, partials reduce-scattered "
                 "through DSM" if c.cluster_size > 1 else "K whole in each CTA (no cluster)")
        return (
            f"cluster split-K GEMM{gated}: {c.block_m}x{c.block_n}x{c.block_k} tiles, {c.stages}-stage "
            f"{'TMA' if c.tma else 'cp.async'} pipeline, {c.warps_m}x{c.warps_n} warps; {split}; {self.ctas} CTAs, "
            f"{self.resident} per SM, {self.smem} B SMEM each"
        )


def predict(shape: GemmShape, config: SplitKGemmConfig, hw: Hardware,
            quantized: bool = False) -> GemmPlan:
    """Bytes per level and predicted time of one (valid) configuration. ``quantized``: X
    arrives in fp16 and is read twice per column of tiles (row max, then the main loop), see
    :mod:`tvm_dsm.rules.quantized_gemm`. Gated products (``shape.products``) stream their W
    tiles beside one X tile per step where they share a K loop (TMA tiles, see
    :func:`shared_k_loop`); otherwise they run their main loops one after the other, each
    streaming X again."""
    c, s, g = config, config.cluster_size, shape.products
    # Main loops per CTA, and W tiles per step of each.
    loops, w_tiles = (1, g) if shared_k_loop(c, g) else (g, 1)
    elem = element_bytes(shape.dtype)
    # Bytes per element of X from HBM, and through L2 per column of tiles.
    x_hbm, x_l2 = (2, 4) if quantized else (elem, elem)
    tiles_m, tiles_n = shape.m // c.block_m, shape.n // c.block_n
    ctas = tiles_m * tiles_n * s
    smem = quantized_shared_bytes(c) if quantized else c.shared_bytes(shape.dtype, g)
    resident = max(1, min(
        hw.smem_per_sm // smem,
        hw.regs_per_sm // (c.threads * _REGISTERS_PER_THREAD),
        32 // c.warps,
    ))
    slots = hw.concurrent_ctas(s, resident)
    waves = math.ceil(ctas / slots)
    # The block scheduler spreads a wave's CTAs one per SM before it doubles up.
    busy_sms = min(hw.sm_count, math.ceil(ctas / waves))
    per_sm = math.ceil(ctas / waves / hw.sm_count)
    # Bandwidth the busy SMs can pull: bytes in flight per SM over the HBM latency.
    tile_bytes = (c.block_m + w_tiles * c.block_n) * c.block_k * elem
    # A TMA tile is awaited in the step that reads it, refilled stages - 1 steps ahead. (Behind
    # warpgroup MMAs, stages - 2: their group stays in flight into the next step, which the
    # wait for the next tile overlaps as much as the lost step of lookahead costs; measured
    # picks matched best counting stages - 1. Not so for gated products in one K loop, two
    # groups per step: counting stages - 2 there, the picks among 208 measured configurations
    # of S1g-S8g came within 1% of the best, 3.2% with stages - 1,
    # bench/results/gated_one_loop_sweep.json.)
    lookahead, latency = (c.stages - 1, TMA_LATENCY_S) if c.tma else (max(1, c.stages - 2), LOADED_LATENCY_S)
    if c.wgmma and w_tiles > 1:
        lookahead = c.stages - 2
    stream = stream_share(c.tma)
    in_flight = min(per_sm * lookahead * tile_bytes, SM_PULL_CAP * _BYTES_IN_FLIGHT_PER_SM)
    pull = busy_sms / hw.sm_count * in_flight / _BYTES_IN_FLIGHT_PER_SM
    tail = waves / (ctas / slots) if ctas > slots else _doubled_up(ctas, hw.concurrent_ctas(s, 1))
    # Groups of rows of tiles run one after another (the grid walks raster_group rows of tiles
    # per column): W comes from HBM again for each group unless they all run at once or W
    # stays in L2.
    groups = tiles_m // raster_group(tiles_m)
    w_reads = groups if ctas > slots and g * shape.n * shape.k * elem > hw.l2_bytes else 1
    traffic = {
        "hbm": shape.m * shape.k * x_hbm + w_reads * g * shape.n * shape.k * elem + shape.m * shape.n * 2,
        "l2": loops * tiles_n * shape.m * shape.k * x_l2 + g * tiles_m * shape.n * shape.k * elem,
        "dsm": g * ctas * c.block_m * c.block_n * 4 * (s - 1) // s if s > 1 else 0,
    }
    flops = 2 * shape.m * shape.n * shape.k * g
    k_steps = loops * shape.k // s // c.block_k
    seconds = {
        "hbm": traffic["hbm"] / (hw.hbm_bw * stream * min(1.0, pull)) * tail,
        # L2 feeds each busy SM at most SM_HEADROOM times its share of the aggregate rate: idle
        # SMs leave the rest unused (gated layers of few, large tiles ran up to 1.9x over the
        # model without the cap; with the share alone, 1.3x under it on S3-S7's gated layers).
        "l2": traffic["l2"] / (hw.l2_bw * TILE_L2_SPEEDUP * stream
                               * min(1.0, SM_HEADROOM * busy_sms / hw.sm_count)) * tail,
        "dsm": traffic["dsm"] / (hw.dsm_bw(s) * DSM_REDUCE_EFFICIENCY) if s > 1 else 0.0,
        "mma": flops / ((WGMMA_PEAK * 2 / elem if c.wgmma else MMA_SYNC_PEAK)
                        * min(1.0, busy_sms / hw.sm_count)) * tail,
        "pipeline": k_steps * waves * latency / lookahead,
    }
    fill = (c.stages - 1) * hw.latency_ns["hbm"] * 1e-9 * waves * loops  # pipeline fill per wave
    barriers = 2 * hw.latency_ns["dsm"] * 1e-9 if s > 1 else 0.0
    steps = k_steps * waves * STEP_S
    seconds["latency"] = LAUNCH_S + fill + barriers + steps
    total = (max(seconds["hbm"], seconds["l2"], seconds["mma"], seconds["pipeline"])
             + (0.0 if c.wgmma else MMA_SYNC_EXPOSED * seconds["mma"])
             + seconds["dsm"] + seconds["latency"])
    # A grid of one wave launches programmatically: measured 0.3-1.4 us faster on the H100,
    # grids of several waves slower (tvm_dsm.transform.programmatic_launch).
    config = dataclasses.replace(config, programmatic_launch=waves == 1)
    return GemmPlan(bytes=traffic, seconds=seconds, predicted_us=total * 1e6, config=config,
                    ctas=ctas, resident=resident, smem=smem, products=g)


def _doubled_up(ctas: int, one_per_sm: int) -> float:
    """Slowdown of a wave that puts ``ceil(x)`` CTAs on some SMs where ``x`` is the average
    (``one_per_sm``: the CTAs that fit at one per SM): the busiest SMs set the time."""
    x = ctas / one_per_sm
    return max(1.0, math.ceil(x) / x / SM_HEADROOM) if x > 1 else 1.0


#: Pipeline depths of the space. Deeper than 4 measured faster where the main loop waits on
#: its loads: G3a (K = 416, cp.async) 4.8 -> 3.0 us at 8 stages, S6b 18.7 -> 16.6, G6a 8.4 ->
#: 7.9, S2b 17.1 -> 16.3; no slower on G8a and S8a (bench/results/gemm_stages.json, H100).
PIPELINE_DEPTHS = (3, 4, 5, 6, 8)
#: The fused quantization keeps these: deeper ones were measured on plain layers (fp8 128 x
#: 4096 x 4096: 13.7 -> 12.5 us at best, fp8_depths.json) and gated ones (5-6 stages of
#: 128x64 tiles fastest on S1g and S2g, gated_one_loop_sweep.json) only.
SHALLOW_PIPELINES = (3, 4)


def candidate_configs(shape: GemmShape, quantized: bool = False,
                      pipelines: tuple[int, ...] | None = None) -> list[SplitKGemmConfig]:
    """Every configuration of the family that is valid for ``shape`` (the pruned design space);
    ``quantized``: valid for the fused per-token quantization too; ``pipelines``: the pipeline
    depths (stages) to consider (default: SHALLOW_PIPELINES for the fused quantization, else
    PIPELINE_DEPTHS). Where no pipelined configuration fits (K = 32), the unpipelined ones
    (``stages=1``); only there, as the model was not fitted on them."""
    if pipelines is None:
        pipelines = SHALLOW_PIPELINES if quantized else PIPELINE_DEPTHS
    return _candidates(shape, quantized, pipelines) or _candidates(shape, quantized, (1,))


#: Output tile widths of the space. 80 and 192 are for warpgroup MMAs only (any multiple of 8
#: columns up to 256; the mma.sync paths were built and checked on powers of two): where N is
#: a multiple of them but the powers of two make more than a wave or strand SMs, they fill the
#: machine. At M = 1024 on the H100, 128 CTAs of 128x192 tiles against 96 of 128x256: G4a
#: 14.8 -> 12.0 us, S8a 33.2 -> 27.4, S1b 89.1 -> 77.9 (cuBLAS 79.2), S6b 51.0 -> 45.1
#: (bench/results/gemm_n192.json). At M = 128, S6's gated layer (N = 8960) in 112 CTAs of
#: 128x80 against 70 of 128x128: the S6 chain 45.4 -> 39.9-40.4 us over two rounds; S7's
#: second GEMM on 64x80 tiles 1.01-1.03x (bench/results/tile_80_ab.json). The wgmma
#: intrinsics of every width are registered at import (database replay), so the widths are
#: defined there.
BLOCK_N = TILE_WIDTHS
WGMMA_ONLY_BLOCK_N = (80, 192)


def _candidates(shape: GemmShape, quantized: bool, pipelines: tuple[int, ...]) -> list[SplitKGemmConfig]:
    check = check_quantized_config if quantized else check_config
    configs = []
    # K steps: TMA's 128-byte rows (fp8: 128 deep, 16-bit: 64); 16-bit also 32 by cp.async, for
    # K that 64 does not divide (G3's 416)
    depths = (64, 128) if element_bytes(shape.dtype) == 1 else (32, 64)
    for s, bm, bn, bk, stages, tma, wgmma in itertools.product(
        (1, 2, 4, 8, 16), (16, 32, 64, 128, 256), BLOCK_N, depths, pipelines,
        (True, False), (False, True),
    ):
        if bn in WGMMA_ONLY_BLOCK_N and not wgmma:
            continue
        if wgmma:  # each warp: 16 rows, every column (tvm_dsm.intrin.wgmma)
            warps_m, warps_n = bm // TILE, 1
        elif bm > 128:  # two warpgroups of rows: wgmma only
            continue
        else:
            warps_m = 2 if bm >= 64 else 1
            warps_n = 4 if bn >= 128 else 2
        config = SplitKGemmConfig(s, bm, bn, bk, warps_m, warps_n, stages, tma, wgmma)
        try:
            check(shape, config)
        except ClusterError:
            continue
        configs.append(config)
    return configs


def plan_split_k_gemm(shape: GemmShape, hw: Hardware, quantized: bool = False,
                      pipelines: tuple[int, ...] | None = None) -> list[GemmPlan]:
    """All valid configurations, best predicted first (``quantized``: see :func:`predict`).
    Equal predictions go to fewer CTAs per cluster, deeper pipelines, the plan furthest from its
    HBM and L2 limits (where the pipeline term binds, a few large CTAs pull their tiles slower
    than many small ones: the second GEMM of G1, G3 and G9 on 64x64 tiles instead of 128x64 ran
    the chains 1.095x, 1.074x and 1.00x as fast, bench/results/chains_tie_break_ab.json), then
    tiles of up to 128 rows before shorter ones: a 128x64 tile and a 64x128 one move the same
    bytes at M = 128 in the model, and with wgmma the taller one (8 warps) measured faster in
    128 of 137 pairs (median 1.085x; mma.sync 169 of 282, 1.018x), where 256x128 against
    128x256 is a coin toss (28 of 53; every bench/results file on the H100, 2026-11-27)."""
    plans = [predict(shape, c, hw, quantized) for c in candidate_configs(shape, quantized, pipelines)]
    if not plans:
        raise ClusterError(
            f"no cluster split-K GEMM configuration fits {shape.m}x{shape.n}x{shape.k} "
            "(M must be a multiple of 16, N a multiple of 64, K a multiple of 32 "
            "giving each CTA one or at least 3 pipeline steps)"
        )
    return sorted(plans, key=lambda p: (p.predicted_us, p.config.cluster_size, -p.config.stages,
                                        max(p.seconds["hbm"], p.seconds["l2"]),
                                        -min(p.config.block_m, 128)))


def schedule_dense(func: tirx.PrimFunc, hw: Hardware | None = None,
                   config: SplitKGemmConfig | None = None) -> tuple[s_tir.Schedule, GemmPlan]:
    """Schedule a user's dense layer (a matmul PrimFunc with elementwise epilogue) as a cluster
    split-K GEMM: the planner's best configuration unless ``config`` is given. Returns the
    schedule and the plan; ``plan.explain()`` says why (tiles, cluster, bytes and time per
    level). ClusterError names what the function or the configuration does not support."""
    hw = hw or load_hardware()
    sch = s_tir.Schedule(func)
    blocks, epilogue, shape = find_gemm(sch)
    if config is None:
        plan = plan_split_k_gemm(shape, hw)[0]
    else:
        check_config(shape, config)
        plan = predict(shape, config, hw)
    apply_split_k_gemm(sch, blocks, epilogue, shape, plan.config)
    return sch, plan
