"""The schedule families tvm-dsm can apply to a PrimFunc, behind one interface.

A family recognizes its pattern in a function (``match`` returns the shape the planner needs, or
raises :class:`~tvm_dsm.errors.ClusterError` saying what is missing), ranks its pruned design
space with the analytical model (``rank``), and schedules one point (``schedule``). The driver
(:mod:`tvm_dsm.driver`) tries them most specific first, so a GEMM chain is fused rather than
scheduled as its first GEMM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import tvm
from tvm import s_tir, tirx

from .errors import ClusterError
from .hardware import Hardware
from .fusion.cascade import analyze, inline_elementwise
from .ir import loads
from .planners.cascade_split import cascade_config, schedule_with
from .planners.fused_chain import FUSED_PICK_BIAS, ChainPlan, plan_chain
from .planners.unfused_chain import plan_unfused_chain
from .planners.gemm_row_max import plan_gemm_row_max, row_max_shape
from .planners.report import Plan
from .planners.split_k import plan_split_k_reduction
from .planners.split_k_gemm import plan_split_k_gemm
from .rules.conv_chain import (CONV_FUSED_PICK_BIAS, ConvChainConfig, ConvChainPlan, ConvChainShape,
                               conv_kernels, copies, find_conv_chain, gemm_view)
from .rules.fused_chain import find_chain, schedule_fused_chain
from .rules.gemm_row_max import schedule_gemm_row_max
from .rules.split_k_gemm import find_gemm, schedule_split_k_gemm
from .rules.split_k_reduction import reduction_extents, schedule_split_k_reduction
from .rules.unfused_chain import UnfusedChainConfig, schedule_unfused_chain
from .transform.lower_cluster import buffer_bytes


@dataclass(frozen=True)
class Family:
    """One schedule family: pattern, planner and schedule. ``traced``: its schedules are traces
    of the function (MetaSchedule can record and replay them); the others generate their kernels
    (a rewrite or a template), which a tuning record cannot hold."""

    name: str
    match: Callable[[tirx.PrimFunc], Any]
    rank: Callable[[Any, Hardware], list[Plan]]
    schedule: Callable[[tirx.PrimFunc, Any], s_tir.Schedule]
    traced: bool = True


@dataclass(frozen=True)
class CascadePlan(Plan):
    """A fused cascade's kernel as :func:`~tvm_dsm.planners.cascade_split.schedule_cascade`
    chooses it. Its time is the HBM floor of the function's operands (read once, the point of
    the fusion), a bound rather than a prediction: the cascade planner sizes loads in flight,
    not time."""

    config: Any = None

    def summary(self) -> str:
        return f"fused cascade: {self.config.explain()} (time below: the HBM floor, a bound)"


@dataclass(frozen=True)
class ReductionShape:
    """A row reduction as its planner sees it: extents and the bytes besides the matrix."""

    rows: int
    depth: int
    elem_bytes: int
    extra_input_bytes: int


def _chain_shape(func: tirx.PrimFunc):
    return find_chain(s_tir.Schedule(func))[1]


def _rank_chains(shape, hw: Hardware) -> list[Plan]:
    """A chain's fused plans (DSM clusters, and one-CTA SMEM-only ones where they fit) and its
    unfused ones (two split-K GEMMs), ranked together: fusion is chosen where the model predicts
    it faster, not because it applies (fused predictions weighted by FUSED_PICK_BIAS, the fused
    model's measured optimism)."""
    plans, reasons = [], []
    kinds = (("fused", plan_chain), ("SMEM-only fused", functools.partial(plan_chain, smem_only=True)),
             ("unfused", plan_unfused_chain))
    for kind, planner in kinds:
        try:
            plans += planner(shape, hw)
        except ClusterError as err:
            reasons.append(f"{kind}: {err}")
    if not plans:
        raise ClusterError("no GEMM chain schedule fits: " + "; ".join(reasons))
    return sorted(plans, key=chain_rank_key)


def chain_rank_key(plan: Plan) -> float:
    """What a chain plan is ranked by among fused and unfused plans (a convolution chain's:
    its GEMM chain's with the convolution chains' own bias, plus the gather kernels' time)."""
    if isinstance(plan, ConvChainPlan):
        fused = isinstance(plan.chain, ChainPlan)
        gather_us = plan.predicted_us - plan.chain.predicted_us
        return plan.chain.predicted_us * (CONV_FUSED_PICK_BIAS if fused else 1.0) + gather_us
    return plan.predicted_us * (FUSED_PICK_BIAS if isinstance(plan, ChainPlan) else 1.0)


def _schedule_chain(func: tirx.PrimFunc, config) -> s_tir.Schedule:
    if isinstance(config, UnfusedChainConfig):
        return schedule_unfused_chain(func, config)
    return schedule_fused_chain(func, config)


def _conv_sizes(shape: ConvChainShape) -> list[tuple[int, int]]:
    """The GEMM input sizes (rows, depth) tried, in order: the pixels and window rounded up to
    the 16-row and 32-column granules of the GEMM tiles, then a depth of at least 3 pipeline
    steps of 32 (a 1x1 chain over 64 channels has 2)."""
    rows, depth = -(-shape.pixels // 16) * 16, -(-shape.depth // 32) * 32
    return list(dict.fromkeys([(rows, depth), (rows, max(depth, 96))]))


def _rank_conv_chains(shape: ConvChainShape, hw: Hardware) -> list[Plan]:
    """The chain family's plans for the pixel matrix (:mod:`tvm_dsm.rules.conv_chain`) at the
    first input size any configuration fits, each with its gather kernels' HBM time added."""
    reasons = []
    for rows, depth in _conv_sizes(shape):
        gathered = sum(copies(shape, rows, depth).values())
        try:
            plans = _rank_chains(_chain_shape(gemm_view(shape, rows, depth)), hw)
        except ClusterError as err:
            reasons.append(f"{rows}x{depth}: {err}")
            continue
        level = {"gather": gathered} if gathered else {}
        return sorted((ConvChainPlan(bytes={**level, **p.bytes},
                                     seconds={**{k: v / hw.hbm_bw for k, v in level.items()}, **p.seconds},
                                     predicted_us=p.predicted_us + gathered / hw.hbm_bw * 1e6,
                                     config=ConvChainConfig(p.config, rows, depth), chain=p) for p in plans),
                      key=chain_rank_key)
    raise ClusterError("no GEMM chain schedule fits the convolution chain's pixel matrix: " + "; ".join(reasons))


def _schedule_conv_chain(func: tirx.PrimFunc, config: ConvChainConfig) -> s_tir.Schedule:
    shape = find_conv_chain(func)
    chain = _schedule_chain(gemm_view(shape, config.rows, config.depth), config.chain).mod["main"]
    return s_tir.Schedule(conv_kernels(func, shape, chain, config.rows, config.depth), enable_check=False)


def _gemm_shape(func: tirx.PrimFunc):
    return find_gemm(s_tir.Schedule(func))[2]


def _reduction_shape(func: tirx.PrimFunc) -> ReductionShape:
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1:
        raise ClusterError(f"a split-K row reduction is one block, got {len(blocks)}")
    rows, depth = reduction_extents(sch, blocks[0])
    reads = [r.source for r in sch.get(blocks[0]).reads]
    matrix = next((b for b in reads if len(b.ty.shape) == 2), None)
    if matrix is None:
        raise ClusterError("a split-K row reduction reads a [rows, K] matrix")

    return ReductionShape(rows, depth, tvm.DataType(str(matrix.ty.dtype)).bits // 8,
                          sum(buffer_bytes(b) for b in reads if not b.same_as(matrix)))


def _rank_reductions(shape: ReductionShape, hw: Hardware) -> list[Plan]:
    return plan_split_k_reduction(shape.rows, shape.depth, hw, elem_bytes=shape.elem_bytes,
                                  extra_input_bytes=shape.extra_input_bytes)


def _cascade_function(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` itself if it holds cascaded reductions that all fuse and whose element-wise
    stages read only their results (ClusterError with the reason otherwise). A stage that reads
    the data again (softmax's normalize, one output per element) is refused: the fused rows ran
    TOPI's softmax 1.4-25x slower than dlight's schedule (``bench/results/softmax.json``)."""
    groups = analyze(func)
    if not groups:
        raise ClusterError("no cascaded reductions (reductions over one axis reading earlier ones)")
    refused = [str(report) for _, report in groups if not report.fusible]
    if refused:
        raise ClusterError("; ".join(refused))
    levels = [lvl for group, _ in groups for lvl in group]
    results = [buf for lvl in levels for buf in lvl.results]
    sch = s_tir.Schedule(inline_elementwise(func))
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        if block.name_hint in {lvl.block for lvl in levels} or block.init is not None:
            continue  # a level, or a reduction producing its data (attention's scores)
        again = [ld.source.name for ld in loads(block.body) if not any(ld.source.same_as(b) for b in results)]
        if again:
            raise ClusterError(f"{block.name_hint} reads {sorted(set(again))} besides the cascade's results: "
                               "a second pass over the data, which the fused kernels do not make fast")
    return func


def _rank_cascade(func: tirx.PrimFunc, hw: Hardware) -> list[Plan]:
    nbytes = sum(buffer_bytes(p) for p in func.params)
    seconds = nbytes / hw.hbm_bw
    return [CascadePlan({"HBM": nbytes}, {"HBM": seconds}, seconds * 1e6, cascade_config(func, hw))]


#: Most specific first.
FAMILIES = (
    Family("conv_chain", find_conv_chain, _rank_conv_chains, _schedule_conv_chain, traced=False),
    Family("gemm_chain", _chain_shape, _rank_chains, _schedule_chain),
    Family("gemm_row_max", row_max_shape, plan_gemm_row_max, schedule_gemm_row_max),
    Family("split_k_gemm", _gemm_shape, plan_split_k_gemm, schedule_split_k_gemm),
    Family("fused_cascade", _cascade_function, _rank_cascade, schedule_with, traced=False),
    Family("split_k_reduction", _reduction_shape, _rank_reductions, schedule_split_k_reduction),
)


def match_family(func: tirx.PrimFunc) -> tuple[Family, Any]:
    """The first family whose pattern ``func`` holds, with its shape; ClusterError listing why
    each family does not apply otherwise."""
    reasons = []
    for family in FAMILIES:
        try:
            return family, family.match(func)
        except ClusterError as err:
            reasons.append(f"{family.name}: {err}")
    raise ClusterError("no tvm-dsm schedule family applies:\n  " + "\n  ".join(reasons))
