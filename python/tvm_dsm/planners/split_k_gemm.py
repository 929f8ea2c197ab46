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

from ..errors import ClusterError, passes
from ..hardware import Hardware, load_hardware
from ..rules.quantized_gemm import check_quantized_config
from ..rules.quantized_gemm import shared_bytes as quantized_shared_bytes
from ..intrin.mma import TILE, element_bytes
from ..rules.split_k_gemm import (
    SPLIT_K_TYPES,
    GemmShape,
    SplitKGemmConfig,
    schedule_split_k_gemm,
    check_config,
    check_edges,
    check_padded_config,
    raster_group,
    find_gemm,
    shared_k_loop,
    tiled_shape,
)
from ..intrin.wgmma import TILE_WIDTHS
from .report import Plan

_REGISTERS_PER_THREAD = 128  # what the mma main loop compiles to, roughly (fragments + addresses)
#: The constants fitted on the GPU's measured GEMMs (``hw.fitted``, data/<gpu>_calibration.json,
#: each with what it is and what it was fitted on):
#:
#: - ``gemm.mma_sync_flops``, ``gemm.wgmma_flops``: tensor-core throughput of mma.sync (fp8
#:   m16n8k32 counted at its rate: ldmatrix cannot transpose 8-bit tiles) and warpgroup MMAs;
#: - ``gemm.launch_s``, ``gemm.step_s``: a kernel launch, a CTA's per-K-step overhead (the chain
#:   planner uses the same terms);
#: - ``gemm.cp_async_loaded_latency_s``: a cp.async tile's latency under load, over ``stages - 2``
#:   steps of lookahead (the fragment prefetch lands a copy one step early);
#:   ``gemm.tma_loaded_latency_s``: a TMA tile's, awaited in the step that uses it, over
#:   ``stages - 1``;
#: - ``gemm.bytes_in_flight_per_sm``: what one SM keeps in flight to pull its share of HBM
#:   bandwidth (Little's law over the loaded latency);
#:   ``gemm.sm_pull_cap``: most multiples of its HBM share one SM pulls given the bytes in flight;
#:   ``gemm.sm_headroom``: how much more than its fair share a busy SM pulls while others idle
#:   (a grid a little over one CTA per SM finishes on its doubled-up SMs that much sooner; the
#:   same cap bounds L2);
#: - ``gemm.mma_sync_exposed``: share of mma.sync time the memory stream does not hide;
#:   ``gemm.dsm_reduce_efficiency``: share of the DSM read rate the reduce-scatter reaches;
#:   ``gemm.tile_l2_speedup``: operand tiles from L2 over the plain re-read rate;
#:   ``gemm.cp_async_stream_efficiency``: share of TMA's streaming rate cp.async copies reach.


def stream_share(tma: bool, hw: Hardware) -> float:
    """Share of the streaming bandwidth a main loop's operand copies reach on ``hw`` (TMA: all
    of it)."""
    return 1.0 if tma else hw.fitted("gemm.cp_async_stream_efficiency")


@dataclass(frozen=True)
class GemmPlan(Plan):
    """A split-K GEMM configuration with its prediction."""

    config: SplitKGemmConfig
    ctas: int
    resident: int  # CTAs per SM
    smem: int  # bytes of dynamic shared memory per CTA
    products: int = 1  # products of one input computed side by side (GemmShape.products)
    outputs: int = 1  # 1: the epilogue combines them (a gated layer); else one output each
    busy_sms: int = 0  # SMs a wave of the grid occupies
    batch: int = 1  # independent products of the shape, one grid over all (GemmShape.batch)

    def summary(self) -> str:
        c = self.config
        order = "in one K loop" if shared_k_loop(c, self.products) else "one main loop after the other"
        kind = "gated products" if self.outputs == 1 else "sibling products (an output each)"
        gated = f" of {self.products} {kind}, {order}" if self.products > 1 else ""
        gated += f" over a batch of {self.batch} products" if self.batch > 1 else ""
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
    # The kernel computes whole tiles (rows and columns past M and N, zeros past K); HBM
    # moves the operands and the output as they are.
    tiles = tiled_shape(shape, c)
    # Main loops per CTA, and W tiles per step of each.
    loops, w_tiles = (1, g) if shared_k_loop(c, g) else (g, 1)
    elem = element_bytes(shape.dtype)
    # Bytes per element of X from HBM, and through L2 per column of tiles.
    x_hbm, x_l2 = (2, 4) if quantized else (elem, elem)
    tiles_m, tiles_n = tiles.m // c.block_m, tiles.n // c.block_n
    ctas = shape.batch * tiles_m * tiles_n * s
    smem = quantized_shared_bytes(c) if quantized else c.shared_bytes(shape.dtype, g, shape.weight_nk)
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
    lookahead = steps_ahead(c, g)
    tile_bytes = (c.block_m + w_tiles * c.block_n) * c.block_k * elem
    latency = hw.fitted("gemm.tma_loaded_latency_s" if c.tma else "gemm.cp_async_loaded_latency_s")
    stream = stream_share(c.tma, hw)
    headroom = hw.fitted("gemm.sm_headroom")
    needed = hw.fitted("gemm.bytes_in_flight_per_sm")
    in_flight = min(per_sm * lookahead * tile_bytes, hw.fitted("gemm.sm_pull_cap") * needed)
    pull = busy_sms / hw.sm_count * in_flight / needed
    tail = waves / (ctas / slots) if ctas > slots else _doubled_up(ctas, hw.concurrent_ctas(s, 1), headroom)
    # Groups of rows of tiles run one after another (the grid walks raster_group rows of tiles
    # per column): W comes from HBM again for each group unless they all run at once or W
    # stays in L2.
    groups = tiles_m // raster_group(tiles_m)
    w_reads = groups if ctas > slots and g * shape.n * shape.k * elem > hw.l2_bytes else 1
    # A batch's products each read their own X and W, except an X they share.
    x_copies, w_copies = 1 if shape.shared_operand == "x" else shape.batch, shape.batch
    traffic = {
        "hbm": (x_copies * shape.m * shape.k * x_hbm + w_copies * w_reads * g * shape.n * shape.k * elem
                + shape.batch * shape.m * shape.n * 2),
        "l2": shape.batch * (loops * tiles_n * shape.m * shape.k * x_l2 + g * tiles_m * shape.n * shape.k * elem),
        "dsm": g * ctas * c.block_m * c.block_n * 4 * (s - 1) // s if s > 1 else 0,
    }
    flops = 2 * shape.batch * tiles.m * tiles.n * tiles.k * g
    k_steps = loops * tiles.k // s // c.block_k
    seconds = {
        "hbm": traffic["hbm"] / (hw.hbm_bw * stream * min(1.0, pull)) * tail,
        # L2 feeds each busy SM at most ``headroom`` times its share of the aggregate rate: idle
        # SMs leave the rest unused.
        "l2": traffic["l2"] / (hw.l2_bw * hw.fitted("gemm.tile_l2_speedup") * stream
                               * min(1.0, headroom * busy_sms / hw.sm_count)) * tail,
        "dsm": traffic["dsm"] / (hw.dsm_bw(s) * hw.fitted("gemm.dsm_reduce_efficiency")) if s > 1 else 0.0,
        "mma": flops / ((hw.fitted("gemm.wgmma_flops") * 2 / elem if c.wgmma else hw.fitted("gemm.mma_sync_flops"))
                        * min(1.0, busy_sms / hw.sm_count)) * tail,
        "pipeline": k_steps * waves * latency / lookahead,
    }
    fill = (c.stages - 1) * hw.latency_ns["hbm"] * 1e-9 * waves * loops  # pipeline fill per wave
    barriers = 2 * hw.latency_ns["dsm"] * 1e-9 if s > 1 else 0.0
    steps = k_steps * waves * hw.fitted("gemm.step_s")
    seconds["latency"] = hw.fitted("gemm.launch_s") + fill + barriers + steps
    total = (max(seconds["hbm"], seconds["l2"], seconds["mma"], seconds["pipeline"])
             + (0.0 if c.wgmma else hw.fitted("gemm.mma_sync_exposed") * seconds["mma"])
             + seconds["dsm"] + seconds["latency"])
    # A grid of one wave launches programmatically; grids of several waves run slower that way
    # (tvm_dsm.transform.programmatic_launch).
    config = dataclasses.replace(config, programmatic_launch=waves == 1)
    return GemmPlan(bytes=traffic, seconds=seconds, predicted_us=total * 1e6, config=config,
                    ctas=ctas, resident=resident, smem=smem, products=g, outputs=shape.outputs, busy_sms=busy_sms,
                    batch=shape.batch)


def steps_ahead(config: SplitKGemmConfig, products: int) -> int:
    """The K steps a CTA's main loop loads its tiles ahead of the step that reads them."""
    c = config
    # A TMA tile is awaited in the step that reads it, refilled stages - 1 steps ahead (behind
    # warpgroup MMAs too: the picks match the measured best so). Gated products in one K loop
    # keep two warpgroup-MMA groups in flight into the next step, which costs a step of
    # lookahead (docs/gemm.md).
    if c.wgmma and shared_k_loop(c, products):
        return c.stages - 2
    return c.stages - 1 if c.tma else max(1, c.stages - 2)


def _doubled_up(ctas: int, one_per_sm: int, headroom: float) -> float:
    """Slowdown of a wave that puts ``ceil(x)`` CTAs on some SMs where ``x`` is the average
    (``one_per_sm``: the CTAs that fit at one per SM): the busiest SMs set the time, sped up
    by ``headroom`` (``gemm.sm_headroom``)."""
    x = ctas / one_per_sm
    return max(1.0, math.ceil(x) / x / headroom) if x > 1 else 1.0


#: Pipeline depths of the space. Deeper than 4 pays where the main loop waits on its loads
#: (bench/results/gemm_stages/latest.json).
PIPELINE_DEPTHS = (3, 4, 5, 6, 8)
#: The fused quantization keeps these: the deeper ones were measured on plain and gated layers
#: only.
SHALLOW_PIPELINES = (3, 4)


#: Tile heights of the space up to one 128-row warpgroup pair.
TILE_HEIGHTS = (16, 32, 64, 128)
#: The most rows :func:`short_tile_height` runs on one row of tiles: as far as it was measured.
SHORT_ROWS = 64


def candidate_configs(shape: GemmShape, quantized: bool = False,
                      pipelines: tuple[int, ...] | None = None,
                      padded: bool = False, hw: Hardware | None = None) -> list[SplitKGemmConfig]:
    """Every configuration of the family that is valid for ``shape`` on ``hw`` (by default the
    committed H100 description) (the pruned design space);
    ``quantized``: valid for the fused per-token quantization too; ``pipelines``: the pipeline
    depths (stages) to consider (default: SHALLOW_PIPELINES for the fused quantization, else
    PIPELINE_DEPTHS). Where no pipelined configuration fits (K = 32), the unpipelined ones
    (``stages=1``); only there, as the model was not fitted on them. ``padded``: tiles may also
    run past M, N or K, as :func:`~tvm_dsm.rules.split_k_gemm.apply_padded_split_k_gemm`
    schedules them (TMA fills what lies past the edges with zeros, the model counts their
    work). Where whole tiles fit, taller ones may run past M, and wider ones past N, K staying
    whole where it can: 6304 rows (ViT-B/16 at batch 32, a multiple of 32 only) run on 128-row
    warpgroup tiles, not on the 32-row mma.sync ones that divide them (2.4x slower predicted,
    2x measured); :func:`plan_split_k_gemm` ranks the tiles past N only where they pay
    (:data:`PAST_N_GAIN`). Where M fits one short row of tiles, tiles of the height that holds
    it come first (:func:`short_tile_height`: 48 rows run on one padded 64-row tile, not three
    16-row ones)."""
    hw = hw or load_hardware()
    if pipelines is None:
        pipelines = SHALLOW_PIPELINES if quantized else PIPELINE_DEPTHS
    if quantized:
        checks = [check_quantized_config]
    elif not padded:
        checks = [check_config]
    elif _whole_tiles_fit(shape, pipelines, hw):
        checks = [_check_tiles_past_m_or_n, check_padded_config]
    else:  # no whole tile fits: any tiles past M, N or K
        checks = [check_padded_config]
    for check in checks:
        configs = _fitting(shape, check, pipelines, hw)
        if configs:
            return configs
    return []


def _fitting(shape: GemmShape, check, pipelines: tuple[int, ...], hw: Hardware) -> list[SplitKGemmConfig]:
    """The configurations ``check`` passes at the ``pipelines`` depths, else the unpipelined
    ones (see :func:`candidate_configs`)."""
    for depths in (pipelines, (1,)):
        configs = _candidates(shape, check, depths, hw)
        if configs:
            return configs
    return []


#: Bytes of one product's tiles a CTA keeps in flight at least where M fits in one tile of rows
#: and the tile runs past it (TMA fills the rows past M with zeros). Below it the main loop waits
#: on its loads, which the model's HBM and pipeline terms do not see: at 4 rows, 16 x 64 tiles 3
#: stages deep (20 KiB ahead) took 1.06-1.41x the time of the same tiles 4 deep on each of three
#: GEMMs and three gated GEMMs of 8192-28672 x 2048-8192
#: (bench/results/archive/short_tile_depths_s64.json, H200). At 16 rows (no rows past M) they were
#: not slower: 3-deep picks kept.
MIN_SHORT_TILE_BYTES_AHEAD = 24 * 1024


def _whole_tiles_fit(shape: GemmShape, pipelines: tuple[int, ...], hw: Hardware) -> bool:
    """Whether some configuration's tiles divide ``shape``, or M fits one short row of tiles."""
    return bool(_fitting(shape, check_config, pipelines, hw)) or short_tile_height(shape.m) is not None


def _check_tiles_past_m_or_n(shape: GemmShape, config: SplitKGemmConfig, hw: Hardware) -> None:
    """:func:`check_padded_config` for tiles that run past M or N only (whole tiles included),
    each CTA of a tile past M at least :data:`MIN_SHORT_TILE_BYTES_AHEAD` ahead."""
    if shape.k % (config.cluster_size * config.block_k):
        raise ClusterError(f"K={shape.k} is not a multiple of the cluster's {config.cluster_size * config.block_k}-deep K steps")
    c = config
    ahead = steps_ahead(c, shape.products) * (c.block_m + c.block_n) * c.block_k * element_bytes(shape.dtype)
    if c.stages > 1 and not shape.symbolic_rows and shape.m < c.block_m and ahead < MIN_SHORT_TILE_BYTES_AHEAD:
        raise ClusterError(f"{c.block_m}x{c.block_n} tiles {c.stages} stages deep keep {ahead} B of each "
                           f"product's tiles in flight per CTA, fewer than {MIN_SHORT_TILE_BYTES_AHEAD}")
    check_padded_config(shape, config, hw)


#: How much faster than the best plan over whole columns of tiles a plan whose tiles run past N
#: must be predicted before it is ranked, where whole tiles fit. On the H200
#: (bench/results/archive/padded_picks_s89.json), of 40 shapes whose pick changed when tiles
#: could run past N or K: the 14 predicted at least 1.25x faster ran 0.98-2.09x faster
#: (Falcon-7B's 4544-wide layers at 512-4096 rows 1.25-2.09x, whose only whole tiles are 64
#: columns wide; 18944 x 3584 at 256 rows 1.13x), the 21 predicted 1.04-1.22x faster
#: 0.86-1.35x (0.98x geomean), and 5 did not lower. The 28 other picks this rule changes ran
#: 1.05-2.11x faster (padded_picks_gain_s89.json).
PAST_N_GAIN = 1.25


def _past_n_where_it_pays(shape: GemmShape, plans: list[GemmPlan]) -> list[GemmPlan]:
    """``plans`` without those whose tiles run past N unless the fastest of them is predicted
    :data:`PAST_N_GAIN` times faster than the fastest over whole columns of tiles."""
    whole = [p for p in plans if not shape.n % p.config.block_n]
    past = [p for p in plans if shape.n % p.config.block_n]
    if not whole or not past:
        return plans
    if min(p.predicted_us for p in past) * PAST_N_GAIN <= min(p.predicted_us for p in whole):
        return plans
    return whole


#: Output tile widths of the space. All but the powers of two are for warpgroup MMAs only (any
#: multiple of 8 columns up to 256; the mma.sync paths are built and checked on powers of two):
#: where the powers of two make more than a wave or strand SMs, a width between them fills the
#: machine (docs/gemm.md). The wgmma intrinsics of every width are registered at import
#: (database replay), so the widths are defined there.
BLOCK_N = TILE_WIDTHS
MMA_SYNC_BLOCK_N = (64, 128, 256)
WGMMA_ONLY_BLOCK_N = tuple(n for n in BLOCK_N if n not in MMA_SYNC_BLOCK_N)


#: ``_candidates``' results by (shape of constant rows, check, depths): a model plans the same
#: shape for many functions and row ranges, each enumeration thousands of configurations.
_KNOWN_CANDIDATES: dict = {}
#: Entries kept before the table is cleared.
KNOWN_CANDIDATES_KEPT = 4096


def _per_gpu(table: dict, key, hw: Hardware, compute):
    """``compute()`` kept in ``table`` under ``key`` for ``hw`` (descriptions compared by value:
    a refitted one is another GPU)."""
    for known_hw, value in table.get(key, ()):
        if known_hw == hw:
            return value
    value = compute()
    table.setdefault(key, []).append((hw, value))
    return value


def _candidates(shape: GemmShape, check, pipelines: tuple[int, ...], hw: Hardware) -> list[SplitKGemmConfig]:
    if not isinstance(shape.m, int):
        return _enumerated(shape, check, pipelines, hw)
    if len(_KNOWN_CANDIDATES) >= KNOWN_CANDIDATES_KEPT:
        _KNOWN_CANDIDATES.clear()
    return list(_per_gpu(_KNOWN_CANDIDATES, (shape, check, pipelines), hw,
                         lambda: tuple(_enumerated(shape, check, pipelines, hw))))


def _enumerated(shape: GemmShape, check, pipelines: tuple[int, ...], hw: Hardware) -> list[SplitKGemmConfig]:
    return [config for config in _shape_free(shape.dtype, shape.products, shape.weight_nk, pipelines, hw)
            if passes(check, shape, config, hw)]


def _space(dtype: str, pipelines: tuple[int, ...]):
    """Every configuration of the family's space at the ``pipelines`` depths, in the order the
    planner ranks ties."""
    # K steps: TMA's 128-byte rows (fp8: 128 deep, 16-bit: 64); 16-bit also 32 by cp.async, for
    # K that 64 does not divide (G3's 416)
    depths = (64, 128) if element_bytes(dtype) == 1 else (32, 64)
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
        yield SplitKGemmConfig(s, bm, bn, bk, warps_m, warps_n, stages, tma, wgmma)


#: :func:`_shape_free`'s results by (dtype, products, weight layout, depths), each a list of (hw,
#: configurations).
_SHAPE_FREE: dict = {}


def _shape_free(dtype: str, products: int, weight_nk: bool, pipelines: tuple[int, ...], hw: Hardware) -> tuple:
    """The configurations of :func:`_space` that :func:`check_config` passes for the most
    permissive shape of ``dtype``, ``products`` and W's layout: M, N and K multiples of the
    configuration's tiles and K steps (one K step a rank where it is unpipelined), operands not
    copied. Every check the planner applies runs ``check_config`` with the configuration (on the
    shape or its tiled extents), and each of its limits that depends on the shape only narrows
    with it, so a configuration refused here is refused for every shape: enumerations skip
    those checks."""
    return _per_gpu(_SHAPE_FREE, (dtype, products, weight_nk, pipelines), hw, lambda: tuple(
        c for c in _space(dtype, pipelines)
        if passes(check_config, _most_permissive(c, dtype, products, weight_nk), c, hw)))


def _most_permissive(config: SplitKGemmConfig, dtype: str, products: int, weight_nk: bool) -> GemmShape:
    """:func:`_shape_free`'s shape for ``config``: 64 of its tiles each way, 64 K steps a rank
    (one where it is unpipelined)."""
    steps = 1 if config.stages == 1 else 64
    return GemmShape(config.block_m * 64, config.block_n * 64, config.cluster_size * config.block_k * steps,
                     weight_nk, dtype, products)


def plan_split_k_gemm(shape: GemmShape, hw: Hardware, quantized: bool = False,
                      pipelines: tuple[int, ...] | None = None,
                      padded: bool = False) -> list[GemmPlan]:
    """All valid configurations, best predicted first (``quantized``: see :func:`predict`;
    ``padded``: see :func:`candidate_configs`).
    Equal predictions go to fewer CTAs per cluster, deeper pipelines, grids that occupy more
    SMs, the plan furthest from its HBM and L2 limits (where the pipeline term binds, a few
    large CTAs pull their tiles slower than many small ones), then tiles of up to 128 rows
    before shorter ones (a 128x64 and a 64x128 tile move the same bytes in the model; the
    taller one runs faster with wgmma). The measurements behind them: docs/gemm.md. Where M
    fits one short row of tiles, tiles of the height that holds it are ranked first
    (:func:`short_tile_height`; see :func:`ranked`)."""
    if padded:
        check_edges(shape)  # refused whatever the configuration: say which limit
    plans = [predict(shape, c, hw, quantized)
             for c in candidate_configs(shape, quantized, pipelines, padded, hw)]
    if padded and not quantized and _whole_tiles_fit(shape, pipelines or PIPELINE_DEPTHS, hw):
        plans = _past_n_where_it_pays(shape, plans)
    if padded and not plans:
        raise ClusterError(f"no cluster split-K GEMM configuration fits {shape.m}x{shape.n}x"
                           f"{shape.k}" + (" (products of one input run over whole tiles of N and K: "
                                           "N a multiple of 64, K of 32)" if shape.products > 1 else ""))
    if not plans:
        raise ClusterError(
            f"no cluster split-K GEMM configuration fits {shape.m}x{shape.n}x{shape.k} "
            "(M must be a multiple of 16, N a multiple of 64, K a multiple of 32 "
            "giving each CTA one or at least 3 pipeline steps)"
        )
    return ranked(shape, plans)


def short_tile_height(m, weight_kn: bool = False) -> int | None:
    """The tile height a GEMM of ``m`` rows runs on where ``m`` fits one short row of tiles
    (up to :data:`SHORT_ROWS`): the least of :data:`TILE_HEIGHTS` that holds them; for one
    product over weights ``[K, N]`` (``weight_kn``), :data:`KN_SHORT_TILE_HEIGHT` (see
    :func:`ranked`); None past that, or for a symbolic ``m``."""
    if not isinstance(m, int) or m > SHORT_ROWS:
        return None
    return KN_SHORT_TILE_HEIGHT if weight_kn else min(h for h in TILE_HEIGHTS if h >= m)


def _one_kn_product(shape: GemmShape) -> bool:
    """Whether ``shape`` is what :data:`KN_SHORT_TILE_HEIGHT` was measured on: one product over
    weights ``[K, N]`` of at least :data:`KN_SHORT_TILE_WEIGHTS` elements at up to
    :data:`KN_SHORT_TILE_ROWS` rows. Elsewhere its tiles lost: 64 x 4096 x 14336 39.2 -> 48.0 us,
    37 rows over 5120 x 640 25.5 -> 36.5, 1 x 5120 x 1000 6.1 -> 7.1 (H200,
    bench/results/archive/generality_kn_rule_s68.json); gated layers keep the tiles measured
    over ``[N, K]`` weights."""
    return (not shape.weight_nk and shape.products == 1 and isinstance(shape.m, int)
            and shape.m <= KN_SHORT_TILE_ROWS and shape.n * shape.k >= KN_SHORT_TILE_WEIGHTS)


#: The tile height of a GEMM over ``[K, N]`` weights whose rows fit one short row of tiles, on
#: mma.sync (W's tiles through ``ldmatrix.trans``): over three such GEMMs of 14336 x 2048,
#: 4096 x 14336 and 16384 x 2048 at 1, 4, 13 and 32 rows it was the fastest measured, or within
#: 5% of it, where 16-row tiles took up to 1.5x its time and warpgroup tiles (W by TMA,
#: MN-major) up to 3x (bench/results/archive/kn_tile_heights_s68.json, H200).
KN_SHORT_TILE_HEIGHT = 64
#: The most rows and the fewest weight elements :data:`KN_SHORT_TILE_HEIGHT` was measured over.
KN_SHORT_TILE_ROWS, KN_SHORT_TILE_WEIGHTS = 32, 1 << 24


def ranked(shape: GemmShape, plans: list[GemmPlan]) -> list[GemmPlan]:
    """``plans`` of ``shape`` in the planner's order (:func:`plan_split_k_gemm`)."""
    kn = _one_kn_product(shape)
    height = short_tile_height(shape.m, kn)

    def short(c: SplitKGemmConfig) -> bool:
        return c.block_m == height and not (kn and c.wgmma)

    # Where M fits one short row of tiles, tiles of the height that holds it come first: the
    # model sees neither cost of the others. Taller tiles compute padding rows, and their TMA
    # copies fill them with zeros, which is slow: the 1B Llama's gate/up GEMM (N = 16384) at
    # M = 17 took 34.1 us on 64-row warpgroup tiles against 24.2 at M = 64 on the same kernel,
    # and its LM head 50.9 against 36.0; 128-row tiles measured twice the HBM floor at M = 2-8
    # (bench/results/real_shapes). Shorter tiles stream W once per row of tiles: 16-row tiles
    # at M = 17 took 28.7 us, 32-row ones 19.2. Over the 1B Llama's five GEMMs at M = 17, 24,
    # 33, 48 and 64 this height was the fastest measured, or within 2% of it
    # (bench/results/archive/tile_heights_s59.json, H200).
    # Where no plan has that height (a batch of one-row products over a K of two steps), equal
    # predictions go to the shorter tiles, not the taller: 64-row warpgroup tiles ran a batch of
    # 32 one-row products over 1000 x 128 in 4.96 us against 5.92 on 128-row ones, over 4096 x
    # 128 in 16.6 against 18.7 (bench/results/archive/batched_gemv_s91.json, H200).
    return sorted(plans, key=lambda p: (height is not None and not short(p.config),
                                        p.predicted_us, p.config.cluster_size, -p.config.stages,
                                        -p.busy_sms, max(p.seconds["hbm"], p.seconds["l2"]),
                                        p.config.block_m if height is not None else -min(p.config.block_m, 128)))


def schedule_dense(func: tirx.PrimFunc, hw: Hardware | None = None,
                   config: SplitKGemmConfig | None = None) -> tuple[s_tir.Schedule, GemmPlan]:
    """Schedule a user's dense layer (a matmul PrimFunc with elementwise epilogue) as a cluster
    split-K GEMM: the planner's best configuration unless ``config`` is given. Returns the
    schedule and the plan; ``plan.explain()`` says why (tiles, cluster, bytes and time per
    level). ClusterError names what the function or the configuration does not support."""
    hw = hw or load_hardware()
    _, _, shape = find_gemm(s_tir.Schedule(func), SPLIT_K_TYPES, batched=True)
    plan = plan_split_k_gemm(shape, hw, padded=True)[0] if config is None else predict(shape, config, hw)
    return schedule_split_k_gemm(func, plan.config, hw), plan
