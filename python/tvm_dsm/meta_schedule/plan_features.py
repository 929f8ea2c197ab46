"""Planned MetaSchedule candidates as feature vectors (:data:`~tvm_dsm.learned_ranking.FEATURE_NAMES`)
for the learned cost models.

TVM's ``PerStoreFeature`` cannot read cluster schedules (it rejects the ``clusterCtaIdx.x``
thread tag), and a schedule family's kernel is better described by what the planner knows of it
than by its loops (:func:`~tvm_dsm.learned_ranking.plan_features`). :class:`PlanFeatureExtractor`
computes it for MetaSchedule candidates: the family and shape from the task's function, the
configuration from the candidate's annotation (:mod:`~tvm_dsm.meta_schedule.candidate_config`),
the plan from the family's ``predict``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.utils import shash2hex

from ..errors import ClusterError
from ..driver import plan
from ..families.base import ScheduleFamily
from ..hardware import Hardware, load_hardware
from ..learned_ranking import FEATURE_NAMES, plan_features
from ..families.configs import config_from, examples
from .candidate_config import recorded_fields

__all__ = ["FEATURE_NAMES", "PlanFeatureExtractor", "plan_features"]


@derived_object
class PlanFeatureExtractor(ms.feature_extractor.PyFeatureExtractor):
    """Features of :class:`PlannedSpace` candidates (one row of ``FEATURE_NAMES`` each). A
    candidate without a recorded configuration, or of a task no family takes, is a ClusterError
    (such tasks are tuned in TVM's own space with its own features)."""

    def __init__(self, hw: Hardware | None = None):
        super().__init__()
        self.hw = hw or load_hardware()
        self._tasks: dict[str, tuple[ScheduleFamily, Any, dict, list]] = {}

    def task(self, mod: tvm.IRModule) -> tuple[ScheduleFamily, Any, dict, list]:
        """(family, shape, the plan of each configuration of its space, one configuration of
        each type) of a task's function, found once per function (module attributes aside): a
        search scores hundreds of candidates a round, and a chain's ranking takes about half a
        second."""
        key = shash2hex(tvm.IRModule({"main": mod["main"]}))
        if key not in self._tasks:
            ranking = plan(mod["main"], self.hw)  # the family plan() takes, as PlannedSpace's
            plans = {p.config: p for p in ranking.plans}
            self._tasks[key] = (ranking.family, ranking.shape, plans, examples(list(plans)))
        return self._tasks[key]

    def features(self, mod: tvm.IRModule, candidate: tvm.IRModule) -> np.ndarray:
        """The feature vector of ``candidate``, a schedule of the task ``mod``."""
        family, _, plans, typed = self.task(mod)
        fields = recorded_fields(candidate)
        if fields is None:
            raise ClusterError("the candidate records no tvm-dsm configuration (not from PlannedSpace)")
        config = config_from(fields, typed)
        if config not in plans:
            raise ClusterError(f"{config} is not a valid {family.name} configuration here")
        return plan_features(family.name, config, plans[config], self.hw)

    def extract_from(self, context, candidates) -> list:
        return [tvm.runtime.tensor(self.features(context.mod, c.sch.mod)[None, :]) for c in candidates]
