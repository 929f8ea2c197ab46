"""Any tvm-dsm schedule family inside MetaSchedule: its pruned space as design spaces, its
analytical model as the cost model.

``PlannedSpace`` gives a tuning task the planner's ``top`` configurations of the family the
function belongs to (:mod:`tvm_dsm.families`), each a complete schedule whose trace records its
tiles and cluster as concrete instructions, its predicted time and its configuration
(:mod:`~tvm_dsm.meta_schedule.candidate_config`) as annotations of the root block. ``PlanCostModel`` scores candidates by that prediction, so MetaSchedule's search measures
the best-predicted first. (The chain and GEMM spaces are not per-parameter ``sample_*``
decisions: their validity couples the parameters, e.g. shared memory, so a free product of
decisions would build invalid kernels; the split-K reduction's, whose parameters are independent,
is: :class:`~tvm_dsm.meta_schedule.SplitKReductionRule`.)

A GEMM chain's unfused plans (two split-K GEMM kernels, :mod:`tvm_dsm.rules.unfused_chain`) are
left out: MetaSchedule's search strategies replay every design space's trace with s_tir's checks
on, which that trace cannot pass (its second kernel is scheduled in a scope s_tir no longer counts
as a stage pipeline), so they would be dropped with a "trace replay failed" warning.
:func:`tvm_dsm.tune` measures them with MetaSchedule's builder and runner and records them in its
database, and :func:`tvm_dsm.build` replays them.
"""

from __future__ import annotations

import tvm
from tvm import s_tir
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..driver import plan
from ..hardware import Hardware, load_hardware
from ..rules.unfused_chain import UnfusedChainConfig
from .candidate_config import annotate_config
from .cost_model import AnalyticalScores
from ..annotations import PREDICTED_US_KEY



@derived_object
class PlannedSpace(ms.space_generator.PySpaceGenerator):
    """Design spaces: the planner's ``top`` schedules MetaSchedule can replay (ClusterError if no
    family applies)."""

    def __init__(self, top: int = 8, hw: Hardware | None = None):
        super().__init__()
        self.sch_rules, self.postprocs, self.mutator_probs = [], [], {}
        self.top, self.hw = top, hw or load_hardware()

    def _initialize_with_tune_context(self, context) -> None:  # noqa: D401 - MetaSchedule hook
        pass

    def generate_design_space(self, mod: tvm.IRModule) -> list[s_tir.Schedule]:
        ranking = plan(mod["main"], self.hw)
        replayable = [(rank, p) for rank, p in enumerate(ranking.plans)
                      if not isinstance(p.config, UnfusedChainConfig)]
        spaces = []
        for rank, candidate in replayable[: self.top]:
            sch = ranking.schedule(rank)
            sch.annotate(sch.get_sblock("root"), PREDICTED_US_KEY, float(candidate.predicted_us))
            annotate_config(sch, candidate.config)
            spaces.append(sch)
        return spaces

    def clone(self) -> "PlannedSpace":
        return PlannedSpace(self.top, self.hw)


def predicted_us(mod: tvm.IRModule) -> float:
    """The prediction a :class:`PlannedSpace` schedule carries."""
    root = mod["main"].body.block
    return float(root.annotations[PREDICTED_US_KEY])


@derived_object
class PlanCostModel(AnalyticalScores):
    """Scores a :class:`PlannedSpace` candidate by the prediction it carries."""

    def predicted_us(self, mod: tvm.IRModule) -> float:
        return predicted_us(mod)
