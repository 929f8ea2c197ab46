"""A learned MetaSchedule cost model that understands clusters:
:class:`~tvm_dsm.learned_ranking.PlanResidual` (XGBoost on the plan's features, fitted to the
analytical model's error) refitted on the measurements of the tuning session. Tasks no family
takes are tuned in TVM's own design space (:mod:`~tvm_dsm.meta_schedule.relax_tuning`); their
candidates go to TVM's ``XGBModel`` with its default features, since one booster cannot mix the
two feature kinds.
"""

from __future__ import annotations

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..hardware import Hardware
from ..learned_ranking import ANALYTICAL, ROUNDS, PlanResidual
from .candidate_config import recorded_fields
from .plan_features import PlanFeatureExtractor

__all__ = ["ANALYTICAL", "LearnedPlanModel", "PlanResidualModel", "plan_xgb_model"]


@derived_object
class PlanResidualModel(ms.cost_model.PyCostModel):
    """Scores planned candidates by ``1 / (predicted_us * 2**correction)``
    (:class:`~tvm_dsm.learned_ranking.PlanResidual` over every measurement so far)."""

    def __init__(self, hw: Hardware | None = None, rounds: int = ROUNDS, **params):
        super().__init__()
        self.extractor = PlanFeatureExtractor(hw)
        self.residual = PlanResidual(rounds, **params)

    def _features(self, context, candidates) -> np.ndarray:
        return np.stack([self.extractor.features(context.mod, c.sch.mod) for c in candidates])

    def load(self, path: str) -> None:
        self.residual = PlanResidual(self.residual.rounds, **self.residual.params)
        with np.load(path) as data:  # errors are log2(measured / predicted)
            self.residual.add(data["features"], np.exp2(data["errors"] + data["features"][:, ANALYTICAL]))

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            np.savez(f, features=self.residual.features, errors=self.residual.errors)

    def update(self, context, candidates, results) -> None:
        ran = [(c, np.mean([float(s) for s in r.run_secs])) for c, r in zip(candidates, results)
               if r.error_msg is None and r.run_secs]
        if ran:
            self.add(self._features(context, [c for c, _ in ran]), np.array([secs * 1e6 for _, secs in ran]))

    def add(self, features: np.ndarray, measured_us: np.ndarray) -> None:
        """Measurements (``FEATURE_NAMES`` rows and their times) to fit on."""
        self.residual.add(features, measured_us)

    def predict_us(self, features: np.ndarray) -> np.ndarray:
        """The corrected time of candidates given as ``FEATURE_NAMES`` rows."""
        return self.residual.predict_us(features)

    def predict(self, context, candidates) -> np.ndarray:
        return 1.0 / self.predict_us(self._features(context, candidates))


def plan_xgb_model(hw: Hardware | None = None, **options) -> PlanResidualModel:
    """The learned model for planned candidates (``options`` go to :class:`PlanResidualModel`:
    ``rounds`` and XGBoost parameters)."""
    return PlanResidualModel(hw, **options)


def _planned(candidates) -> bool:
    return bool(candidates) and recorded_fields(candidates[0].sch.mod) is not None


@derived_object
class LearnedPlanModel(ms.cost_model.PyCostModel):
    """:class:`PlanResidualModel` for planned candidates, TVM's default ``XGBModel`` for
    candidates of TVM's own space."""

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

    def _model(self, candidates) -> ms.cost_model.PyCostModel:
        return self.planned if _planned(candidates) else self.default

    def update(self, context, candidates, results) -> None:
        self._model(candidates).update(context, candidates, results)

    def predict(self, context, candidates) -> np.ndarray:
        return self._model(candidates).predict(context, candidates)
