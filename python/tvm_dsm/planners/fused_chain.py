"""Plan a fused GEMM chain without measuring: FlashFuser's dataflow analysis and cost model.

For each configuration of :mod:`tvm_dsm.rules.fused_chain` the analyzer counts the bytes every
level moves:

* HBM: each weight once, ``A`` once, the output once, and the clusters' fp32 partials of the
  output (written by the fused kernel, read by the inter-cluster reduce) when they outgrow L2;
* L2: ``A``'s slab re-read at every tile step of every cluster (``M*K*N/block_n``), each weight
  re-read by every row of clusters, the partials;
* DSM: the all-exchange, in which every CTA reads the fp32 partial tile of every peer
  (``M * N * 4 * S^2`` per GEMM0 projection: the cost that grows fastest with the cluster);

and divides by the level's measured bandwidth (:mod:`tvm_dsm.hardware`), next to the
tensor-core roof. Terms the paper's model lacks decide small chains: the SMs the grid keeps
busy, two launches, and the per-step latency chain of a CTA (pipeline fill, three cluster
barriers, the W2 tile load), which no amount of bandwidth hides.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware, load_hardware
from ..rules.fused_chain import (
    RULES,
    ChainShape,
    FusedChainConfig,
    apply_fused_chain,
    check_chain_config,
    find_chain,
)
from .report import Plan
from .split_k_gemm import stream_share

_BARRIERS_PER_STEP = 3
#: The fused model misses part of its kernel's cost: ``chains.fused_pick_bias`` (``hw.fitted``)
#: is the measured over predicted time of the fused planner's pick over that of the best
#: unfused plan, by which a fused plan counts where the two kinds are ranked together; the
#: time launching the inter-cluster reduce programmatically behind a one-wave fused kernel
#: saves is ``chains.programmatic_reduce_saving_s``. On the H100: 30 chain workloads
#: (bench/results/archive/chains.json, docs/chains.md), bench/results/chains_pdl/latest.json.


@dataclass(frozen=True)
class ChainPlan(Plan):
    """A fused chain configuration with its prediction."""

    config: FusedChainConfig
    shape: ChainShape
    ctas: int

    def summary(self) -> str:
        c, s = self.config, self.shape
        kind = "SwiGLU" if s.gated else "GEMM chain"
        return (
            f"fused {kind} {s.m}x{s.k} -> {s.n} -> {s.l}: clusters of {c.cluster_size} CTAs "
            f"({self.ctas} CTAs, {c.warps_m}x{c.warps_n} warps), {c.block_m}x{c.block_n} tiles of H, "
            f"{c.n_steps} step(s) per "
            f"cluster, GEMM0 K split over the cluster in {c.block_k}-wide {c.stages}-stage "
            f"{'TMA' if c.tma else 'cp.async'} steps, "
            f"all-exchange of fp32 partials through DSM, {s.l // c.cluster_size} output columns "
            f"per CTA, {self.groups} cluster column group(s) reduced "
            + {"last_cta": "by the last CTA to finish each output tile (one launch)",
               "gathered": "by the CTAs of each output tile, each its share (one launch)"}.get(
                   c.reduce, "by a second kernel" + (" (launched programmatically)" if c.programmatic_launch else ""))
            + f"; {c.shared_bytes(s)} B SMEM per CTA"
        )

    @property
    def groups(self) -> int:
        return self.config.column_groups(self.shape)


def in_kernel_reduce_s(shape: ChainShape, c: FusedChainConfig, hw: Hardware) -> float:
    """What the inter-cluster reduce adds at the end of the fused kernel when it runs there per
    output tile: the arrival (a fence, an atomic and two CTA barriers, about two L2 round
    trips), then per round of 4 outputs a thread one L2 round trip for its column groups'
    partials, and the bytes it reads at one SM's share of L2 bandwidth: the whole tile's
    partials for the last CTA to finish the tile, a share of them for each CTA of a gathered
    tile. Measured on the H200 (G1 / G10 plans): last CTA 9.3 / 17.5 us, predicted 11.4 /
    20.4; gathered 6.2 / 11.5, predicted 6.3 / 10.4; the second kernel 4.4 / 9.2, predicted
    6.0 / 10.0."""
    groups = c.column_groups(shape)
    outputs = c.tile_outputs(shape)
    if c.reduce == "gathered":
        outputs = math.ceil(outputs / groups)
    rounds = math.ceil(outputs / (4 * c.threads))
    partial_bytes = groups * outputs * 4
    return (2 + rounds) * hw.latency_ns["l2"] * 1e-9 + partial_bytes / (hw.l2_bw / hw.sm_count)


def predict(shape: ChainShape, config: FusedChainConfig, hw: Hardware) -> ChainPlan:
    """Bytes per level and predicted time of one (valid) configuration."""
    c, s, g = config, config.cluster_size, len(shape.gemm0)
    groups = c.column_groups(shape)
    ctas = c.ctas(shape)
    waves = math.ceil(ctas / hw.sm_count)  # one CTA per SM: the output slice fills the registers
    busy = min(1.0, ctas / hw.sm_count)
    partials = groups * shape.m * shape.l * 4
    weights = (g * shape.n * shape.k + shape.l * shape.n) * 2
    rows_of_clusters = shape.m // c.block_m
    spill = partials if partials > hw.l2_bytes // 2 else 0
    traffic = {
        "hbm": weights + (shape.m * shape.k + shape.m * shape.l) * 2 + 2 * spill,
        "l2": g * shape.m * shape.k * 2 * (shape.n // c.block_n) + weights * rows_of_clusters
        + 2 * partials,
        "dsm": g * shape.m * shape.n * 4 * s * s,
    }
    flops = 2 * shape.m * shape.n * (g * shape.k + shape.l)
    stream = stream_share(c.tma, hw)  # GEMM0's operands: most of the bytes
    seconds = {
        "hbm": traffic["hbm"] / (hw.hbm_bw * stream * busy),
        "l2": traffic["l2"] / (hw.l2_bw * stream * busy),
        "dsm": traffic["dsm"] / (hw.dsm_bw(s) * busy),
        "mma": flops / (hw.fitted("gemm.mma_sync_flops") * busy),
    }
    k_steps = g * shape.k // (s * c.block_k)
    per_step = ((c.stages - 1) * hw.latency_ns["hbm"] + hw.latency_ns["hbm"]
                + _BARRIERS_PER_STEP * hw.latency_ns["dsm"]) * 1e-9 + k_steps * hw.fitted("gemm.step_s")
    programmatic = waves == 1
    if c.reduce != "kernel":
        launches = hw.fitted("gemm.launch_s") + in_kernel_reduce_s(shape, c, hw)
    else:
        launches = 2 * hw.fitted("gemm.launch_s") - (
            hw.fitted("chains.programmatic_reduce_saving_s") if programmatic else 0.0)
    seconds["latency"] = launches + waves * c.n_steps * per_step
    total = max(seconds["hbm"], seconds["l2"], seconds["mma"]) + seconds["dsm"] + seconds["latency"]
    return ChainPlan(bytes=traffic, seconds=seconds, predicted_us=total * 1e6,
                     config=dataclasses.replace(config, programmatic_launch=programmatic),
                     shape=shape, ctas=ctas)


#: The design space before pruning: cluster sizes, CTA tile (M, N), steps per cluster, GEMM0's
#: K step, warp layout, pipeline depth. (Cluster size 1, SMEM-only fusion, is planned apart:
#: plan_chain(..., smem_only=True).)
SPACE = {
    "cluster_size": tuple(range(2, 17)),
    "block_m": (16, 32, 64, 128),
    "block_n": (32, 64, 128),
    "n_steps": (1, 2, 4, 8, 16),
    "block_k": (16, 32, 64),
    "warps": ((1, 2), (1, 4), (2, 2), (2, 4), (4, 2)),
    "stages": (3, 4),
    "tma": (False, True),
}


def candidate_configs(shape: ChainShape, smem_only: bool = False,
                      hw: Hardware | None = None) -> tuple[list[FusedChainConfig], dict[str, int]]:
    """The valid configurations for ``shape`` on ``hw`` (by default the committed H100
    description) and how many candidates remain after each pruning rule (``space``: before
    any); ``smem_only``: clusters of one CTA instead of the DSM space. They reduce across
    clusters in a second kernel: measured faster than either in-kernel reduce
    (``FusedChainConfig.reduce``).
    Where no pipelined configuration fits (a K of one step per CTA, G1's 32), the space of
    unpipelined ones (``stages=1``); only there, as the model was not fitted on them."""
    hw = hw or load_hardware()
    space = {**SPACE, "cluster_size": (1,)} if smem_only else SPACE
    survivors, counts = _pruned(shape, space, hw)
    if not survivors:
        survivors, counts = _pruned(shape, {**space, "stages": (1,)}, hw)
    return survivors, counts


#: The pruned spaces computed last, by (shape, space, GPU description): a chain is planned
#: again wherever its function is (family matching, ``plan``, ``build``, MetaSchedule's space),
#: and pruning the 54,000-point space is most of a plan's time.
_PRUNED: OrderedDict = OrderedDict()
_PRUNED_KEPT = 256
_PRUNED_LOCK = threading.Lock()


def _pruned(shape: ChainShape, space: dict, hw: Hardware) -> tuple[list[FusedChainConfig], dict[str, int]]:
    """:func:`_prune`'s survivors and counts, computed once per (shape, space, ``hw``) (a fresh
    list and dict each call; the configurations are frozen)."""
    key = (shape, tuple(space.items()), repr(hw))
    with _PRUNED_LOCK:
        found = _PRUNED.get(key)
        if found is not None:
            _PRUNED.move_to_end(key)
    if found is None:
        found = _prune(shape, space, hw)
        with _PRUNED_LOCK:
            _PRUNED[key] = found
            while len(_PRUNED) > _PRUNED_KEPT:
                _PRUNED.popitem(last=False)
    survivors, counts = found
    return list(survivors), dict(counts)


def _prune(shape: ChainShape, space: dict, hw: Hardware) -> tuple[list[FusedChainConfig], dict[str, int]]:
    survivors = [FusedChainConfig(s, bm, bn, steps, bk, wm, wn, stages, tma)
                 for s, bm, bn, steps, bk, (wm, wn), stages, tma in itertools.product(*space.values())]
    counts = {"space": len(survivors)}
    for name, rule in RULES:
        kept = []
        for config in survivors:
            try:
                rule(shape, config, hw)
            except ClusterError:
                continue
            kept.append(config)
        survivors = kept
        counts[name] = len(survivors)
    return survivors, counts


def plan_chain(shape: ChainShape, hw: Hardware, smem_only: bool = False) -> list[ChainPlan]:
    """All valid configurations, best predicted first (``smem_only``: of one-CTA clusters)."""
    configs, counts = candidate_configs(shape, smem_only, hw)
    if not configs:
        raise ClusterError(
            f"no {'SMEM-only ' if smem_only else ''}fused chain configuration fits M={shape.m} "
            f"K={shape.k} N={shape.n} L={shape.l} (candidates left after each rule: {counts}): "
            "K must give each CTA of a cluster one or at least 3 steps of 16, L must split into "
            "16-column fragments per warp, M must be a multiple of 16, and a CTA's tiles and "
            "output accumulators must fit its SM"
        )
    plans = [predict(shape, c, hw) for c in configs]
    return sorted(plans, key=lambda p: (p.predicted_us, p.config.cluster_size))


def planned(shape: ChainShape, config: FusedChainConfig, hw: Hardware) -> ChainPlan:
    """``config``'s plan for ``shape``: its prediction, after :class:`ClusterError` for the
    first rule it breaks."""
    check_chain_config(shape, config, hw)
    return predict(shape, config, hw)


def schedule_chain(func: tirx.PrimFunc, hw: Hardware | None = None,
                   config: FusedChainConfig | None = None) -> tuple[s_tir.Schedule, ChainPlan]:
    """Schedule a user's GEMM chain (FFN or SwiGLU PrimFunc) as one fused cluster kernel: the
    planner's best configuration unless ``config`` is given. ``plan.explain()`` says why."""
    hw = hw or load_hardware()
    sch = s_tir.Schedule(func)
    blocks, shape = find_chain(sch)
    plan = plan_chain(shape, hw)[0] if config is None else planned(shape, config, hw)
    apply_fused_chain(sch, blocks, shape, plan.config)
    return sch, plan
