"""Cascaded reductions (each reducing over one axis and reading earlier ones: softmax statistics,
norms, decode attention) fused into one incremental loop (RedFuser), the rows split over lanes,
threads and a cluster (:mod:`tvm_dsm.planners.cascade_split`). Cascades with a kernel of their
own (attention, softmax·V, top-k rows) are taken by their families first, where it fits."""

from __future__ import annotations

import dataclasses
import math

from tvm import s_tir, tirx
from tvm.tirx.buffer import BufferType

from ..errors import ClusterError
from ..fusion.cascade import analyze, element_producers, find_cascades, inline_elementwise, refuse_approximate
from ..fusion.fused_block import producer_slices, read_another_way
from ..hardware import Hardware
from ..ir import find_all, loads, uses
from ..planners.cascade_split import CascadeSplit, plan_cascade_split, schedule_cascade, stock_reduction_takes
from ..transform.buffers import buffer_bytes
from .base import ScheduleFamily
from .kernel_plan import ELEMENT_OPS, KernelPlan, roofline


class CascadePlan(KernelPlan):
    """The fused rows' split with a bound, not a prediction: the HBM floor of the function's
    operands (read once, the point of the fusion) or the CUDA cores' time for the cascade's
    element work (:func:`element_ops`), whichever is longer, plus a launch. The cascade planner
    sizes the loads in flight to reach that floor, not a time."""

    def summary(self) -> str:
        return f"fused cascade: {self.config.explain()} (time below: a bound)"


def _elements(level) -> int:
    """Elements of a level's result (its rows, times its own output axis where it has one)."""
    return math.prod(int(level.output.ty.shape[a]) for a in range(len(level.spatial)))


def element_ops(func: tirx.PrimFunc) -> int:
    """CUDA-core operations of ``func``'s cascades, an estimate: ELEMENT_OPS per term of each
    level (a top-k level: a compare-exchange pair per kept element, 2k), and an FMA (2) per term
    of each element producer (decode attention's scores, q . k over the head dim)."""
    inlined = inline_elementwise(func)
    ops = 0
    for group in find_cascades(inlined):
        for level in group:
            per_term = 2 * level.top_k.k if level.top_k else ELEMENT_OPS
            ops += per_term * _elements(level) * level.extent
        ops += sum(2 * _elements(p) * p.extent for p in element_producers(inlined, group).values())
    return ops


def _read_across_rows(level, rows: list) -> str | None:
    """The first tensor ``level`` reads along its reduced index whose innermost index is one of
    its ``rows`` (``W[k, j]`` for rows ``j``), if any: a thread walking a row reads elements a
    row apart. (``V[b, t, h, e]``, rows ``b, h`` and the level's own axis ``e`` innermost, reads
    contiguous rows of ``e``.)"""
    for load in loads(level.value):
        if not load.indices:  # a scalar (a fill of 0-d buffer)
            continue
        *_, innermost = load.indices
        if (any(uses(i, level.reduce_var) for i in load.indices) and not uses(innermost, level.reduce_var)
                and any(uses(innermost, v) for v in rows)):
            return load.source.name
    return None


def _reduces_results_across_rows(block, results: list) -> str | None:
    """The first of the cascade's ``results`` that ``block`` reduces over (its reduced axis in
    the result's index: a mean over rows of each row's loss), if any."""
    reduced = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    for load in loads(block.body):
        if any(load.source.same_as(b) for b in results) and any(uses(i, v) for i in load.indices for v in reduced):
            return load.source.name
    return None


class FusedCascade(ScheduleFamily):
    name = "fused_cascade"
    generic = True
    traced = False  # FuseCascadedReductions writes a new function
    symbolic_rows = True  # the fused rows' nest runs over the row count, known when called

    def for_symbolic_rows(self, config: CascadeSplit) -> CascadeSplit:
        """One row a CTA: a symbolic row count need not divide into CTAs of several rows."""
        return dataclasses.replace(config, rows_per_cta=1)

    def leaves_symbolic_rows(self, func: tirx.PrimFunc) -> str | None:
        """dlight's reduction rules keep the cascades they take over a symbolic row count: its
        logsumexp ran 1.2-1.8x faster than the fused rows' ranges (1024 x 3000 fp16 4.4 against
        7.9 us, H200, bench/results/archive/generality_all_s68.json); a cross-entropy's three
        sums, which only its fallback takes (a thread a row: 3060 us at 1024 x 3000), are ours."""
        if stock_reduction_takes(func):
            return "dlight's reduction rules take it, faster than the fused rows' ranges"
        return None

    def recognize(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """``func`` itself if it holds cascaded reductions that all fuse exactly (no rounding cast
        inside a level, which :meth:`apply`'s rewrite refuses) and whose elementwise stages read
        only their results. A stage that reads the data again (softmax's normalize,
        one output per element) is refused: the fused rows ran TOPI's softmax 1.4-25x slower
        than dlight's schedule."""
        groups = analyze(func)
        if not groups:
            raise ClusterError("no cascaded reductions (reductions over one axis reading earlier ones)")
        refused = [str(report) for report in (refuse_approximate(r) for _, r in groups) if not report.fusible]
        if refused:
            raise ClusterError("; ".join(refused))
        levels = [lvl for group, _ in groups for lvl in group]
        inlined = inline_elementwise(func)
        for group, _ in groups:
            producers = element_producers(inlined, group)
            problem = read_another_way(producer_slices(producers), group, producers)
            if problem:
                raise ClusterError(f"the fused rows do not take it: {problem}")
            rows = len(group[0].spatial)  # a level's axes past the rows are its own output's
            strided = next((found for lvl in group if (found := _read_across_rows(lvl, lvl.spatial[:rows]))), None)
            if strided:
                raise ClusterError(f"{strided} is read with a row index innermost, after the reduced one: a row's "
                                   "elements lie a row apart (a GEMV over W [K, N]), which the fused rows read "
                                   "a sector per element")
        results = [buf for lvl in levels for buf in lvl.results]
        sch = s_tir.Schedule(inlined)
        for rv in sch.get_child_blocks(sch.get_sblock("root")):
            block = sch.get(rv)
            if block.name_hint in {lvl.block for lvl in levels}:
                continue
            across = _reduces_results_across_rows(block, results)
            if across:
                raise ClusterError(f"{block.name_hint} reduces {across} over the rows: the fused rows run in CTAs "
                                   "of their own, which do not meet")
            if block.init is not None:
                continue  # a reduction producing the cascade's data (attention's scores)
            again = [ld.source.name for ld in loads(block.body) if not any(ld.source.same_as(b) for b in results)]
            if again and not _once_a_row(block, levels):
                raise ClusterError(f"{block.name_hint} reads {sorted(set(again))} besides the cascade's results: "
                                   "a second pass over the data, which the fused kernels do not make fast")
        return func

    def rank(self, func: tirx.PrimFunc, hw: Hardware) -> list[CascadePlan]:
        return [roofline(plan_cascade_split(func, hw), {"hbm": sum(buffer_bytes(p) for p in func.params)},
                         {"fp32": element_ops(func)}, hw, plan=CascadePlan)]

    def apply(self, func: tirx.PrimFunc, config: CascadeSplit, hw: Hardware) -> s_tir.Schedule:
        return schedule_cascade(func, split=config)[0]


def _once_a_row(block, levels: list) -> bool:
    """Whether ``block`` computes one value a row of the cascade (its iterators span no more
    than the rows) from loads indexed by its row alone: a cross-entropy's ``logits[i, labels[i]]``
    reads one element a row, not the data again."""
    extents = [*levels[0].rows, *(iv.dom.extent for iv in block.iter_vars)]
    if not all(isinstance(e, (int, tirx.IntImm)) for e in extents):
        return False
    rows = math.prod(int(e) for e in levels[0].rows)
    if math.prod(int(iv.dom.extent) for iv in block.iter_vars) > rows:
        return False
    own = [iv.var for iv in block.iter_vars]
    return all(any(v.same_as(o) for o in own) for ld in loads(block.body) for i in ld.indices
               for v in find_all(i, tirx.Var) if not isinstance(v.ty, BufferType))
