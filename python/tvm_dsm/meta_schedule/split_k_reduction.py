"""The cluster split-K row-reduction family as a MetaSchedule design space and cost model.

``SplitKReductionRule`` turns a (rows, k) reduction block into the split-K schedule with the
cluster size and the rows per CTA as two recorded ``sample_categorical`` decisions, used directly
as split factors and cluster annotation, so MetaSchedule's search strategies and mutators explore
them and replays of other decisions reschedule. The candidate lists are pruned up front so that
every combination is valid (K divisible by the cluster, rows by cluster x rows per CTA, at most
16 CTAs per cluster): nothing invalid is ever built. ``AnalyticalCostModel`` scores candidates with the planner
(:mod:`tvm_dsm.planners.split_k`) instead of XGBoost, whose feature extractor rejects cluster
bindings.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import s_tir, tirx
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..errors import ClusterError
from ..hardware import Hardware, load_hardware
from ..ir import find_all
from ..planners.split_k import predict
from ..rules.split_k_reduction import (
    SplitKReductionConfig,
    apply_split_k_reduction,
    decision_candidates,
    reduction_extents,
)
from ..annotations import CLUSTER_SIZE_KEY
from ..intrin import import_tvm_intrinsics
from .cost_model import AnalyticalScores

@derived_object
class SplitKReductionRule(ms.schedule_rule.PyScheduleRule):
    """Schedule rule: one design-space point per sampled split-K configuration."""

    def __init__(self):
        super().__init__()
        import_tvm_intrinsics()  # before the TuneContext this rule is made for imports them slowly

    def _initialize_with_tune_context(self, context) -> None:  # noqa: D401 - MetaSchedule hook
        pass

    def apply(self, sch: s_tir.Schedule, block) -> list[s_tir.Schedule]:
        try:
            rows, depth = reduction_extents(sch, block)
        except ClusterError:
            return [sch]  # not a row reduction: leave it to other rules
        sizes, per_cta = decision_candidates(rows, depth)
        if not sizes or not per_cta:
            return [sch]
        size = sch.sample_categorical(candidates=sizes, probs=[1.0 / len(sizes)] * len(sizes))
        rows_per_cta = sch.sample_categorical(
            candidates=per_cta, probs=[1.0 / len(per_cta)] * len(per_cta)
        )
        apply_split_k_reduction(sch, block, size, rows_per_cta)
        return [sch]

    def clone(self) -> "SplitKReductionRule":
        return SplitKReductionRule()


def config_of(mod: tvm.IRModule) -> tuple[SplitKReductionConfig, int, int, int, int]:
    """(config, rows, depth, element bytes, other input bytes) of a scheduled split-K kernel."""
    func = mod["main"]
    loop = find_all(func.body, tirx.For, lambda f: CLUSTER_SIZE_KEY in f.annotations)[0]
    size = int(loop.annotations[CLUSTER_SIZE_KEY])
    matrix = func.params[0]
    rows, depth = (int(d) for d in matrix.ty.shape)
    elem = tvm.DataType(str(matrix.ty.dtype)).bits // 8
    other = sum(
        int(np.prod([int(d) for d in p.ty.shape])) * tvm.DataType(str(p.ty.dtype)).bits // 8
        for p in func.params[1:-1]
    )
    clusters = int(loop.extent)
    return SplitKReductionConfig(size, rows // clusters), rows, depth, elem, other


@derived_object
class AnalyticalCostModel(AnalyticalScores):
    """Scores split-K candidates by the planner's model of their configuration."""

    def __init__(self, hw: Hardware | None = None):
        super().__init__()
        self.hw = hw or load_hardware()

    def predicted_us(self, mod: tvm.IRModule) -> float:
        config, rows, depth, elem, other = config_of(mod)
        return predict(rows, depth, elem, other, config, self.hw).predicted_us
