"""Cascaded reductions (each reducing over one axis and reading earlier ones: softmax statistics,
decode attention, attention, MoE routing) fused into one incremental loop (RedFuser), then a
kernel of the cascade's own kind where one takes it (attention, softmax·V, top-k rows), else
the fused rows split over lanes, threads and a cluster (:mod:`tvm_dsm.planners.cascade_split`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..fusion.cascade import analyze, inline_elementwise
from ..hardware import Hardware
from ..ir import loads
from ..planners.cascade_split import cascade_config, schedule_with
from ..planners.report import Plan
from ..transform.lower_cluster import buffer_bytes
from .base import ScheduleFamily


@dataclass(frozen=True)
class CascadePlan(Plan):
    """A fused cascade's kernel as :func:`~tvm_dsm.planners.cascade_split.schedule_cascade`
    chooses it. Its time is the HBM floor of the function's operands (read once, the point of
    the fusion), a bound rather than a prediction: the cascade planner sizes loads in flight,
    not time."""

    config: Any = None

    def summary(self) -> str:
        return f"fused cascade: {self.config.explain()} (time below: the HBM floor, a bound)"


class FusedCascade(ScheduleFamily):
    name = "fused_cascade"
    traced = False  # FuseCascadedReductions and the kernel templates write a new function

    def recognize(self, func: tirx.PrimFunc) -> tirx.PrimFunc:
        """``func`` itself if it holds cascaded reductions that all fuse and whose elementwise
        stages read only their results. A stage that reads the data again (softmax's normalize,
        one output per element) is refused: the fused rows ran TOPI's softmax 1.4-25x slower
        than dlight's schedule."""
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

    def rank(self, func: tirx.PrimFunc, hw: Hardware) -> list[CascadePlan]:
        nbytes = sum(buffer_bytes(p) for p in func.params)
        seconds = nbytes / hw.hbm_bw
        return [CascadePlan({"HBM": nbytes}, {"HBM": seconds}, seconds * 1e6, cascade_config(func, hw))]

    def apply(self, func: tirx.PrimFunc, config: Any) -> s_tir.Schedule:
        return schedule_with(func, config)
