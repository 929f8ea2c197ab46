"""A learned MetaSchedule cost model that understands clusters: TVM's ``XGBModel`` trained on
:mod:`~tvm_dsm.meta_schedule.plan_features` (the configuration's knobs and the analytical
model's plan), so measurements correct the analytical ranking.

Until it has trained on a task's measurements it scores planned candidates by the analytical
prediction alone (``1 / predicted_us``), not at random as ``XGBModel``'s warm-up does. Tasks no
family takes are tuned in TVM's own design space (:mod:`~tvm_dsm.meta_schedule.relax_tuning`);
their candidates go to a second ``XGBModel`` with TVM's default features, since one booster
cannot mix the two feature kinds.
"""

from __future__ import annotations

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..hardware import Hardware
from .candidate_config import recorded_fields
from .plan_features import PlanFeatureExtractor
from .planned_space import predicted_us


def plan_xgb_model(hw: Hardware | None = None, **options) -> ms.cost_model.XGBModel:
    """TVM's ``XGBModel`` on :class:`PlanFeatureExtractor` features, trained from the first
    measurement on (``options`` go to ``XGBModel``)."""
    options = {"num_warmup_samples": 0, "verbose_eval": 0, **options}
    return ms.cost_model.XGBModel(extractor=PlanFeatureExtractor(hw), **options)


def _planned(candidates) -> bool:
    return bool(candidates) and recorded_fields(candidates[0].sch.mod) is not None


@derived_object
class LearnedPlanModel(ms.cost_model.PyCostModel):
    """XGBoost on plan features for planned candidates (the analytical prediction until it has
    trained), TVM's default ``XGBModel`` for candidates of TVM's own space."""

    def __init__(self, hw: Hardware | None = None):
        super().__init__()
        self.planned = plan_xgb_model(hw)
        self.default = ms.cost_model.XGBModel()

    def load(self, path: str) -> None:
        self.planned.load(path)
        self.default.load(path + ".default")

    def save(self, path: str) -> None:
        self.planned.save(path)
        self.default.save(path + ".default")

    def update(self, context, candidates, results) -> None:
        (self.planned if _planned(candidates) else self.default).update(context, candidates, results)

    def predict(self, context, candidates) -> np.ndarray:
        if not _planned(candidates):
            return self.default.predict(context, candidates)
        if self.planned.booster is None:
            return np.array([1.0 / predicted_us(c.sch.mod) for c in candidates], dtype="float64")
        return self.planned.predict(context, candidates)
