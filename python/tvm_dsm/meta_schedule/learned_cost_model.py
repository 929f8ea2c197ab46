"""A learned MetaSchedule cost model that understands clusters: XGBoost on
:mod:`~tvm_dsm.meta_schedule.plan_features` (the configuration's knobs and the analytical
model's plan) fitted to the analytical model's error, ``log2(measured / predicted time)``,
rather than to the time itself.

Its estimate is the analytical prediction times the learned correction, so it needs no warm-up:
untrained it ranks by the analytical model, and measurements move that ranking only where they
disagree with the model consistently. The boosting is small and strongly regularized (shallow
trees, leaves that need several measurements and shrink toward no correction) since MetaSchedule
trains it on tens to hundreds of measurements, where a model of the time alone ranks worse than
the analytical one. Tasks no family takes are tuned in TVM's own design space
(:mod:`~tvm_dsm.meta_schedule.relax_tuning`); their candidates go to TVM's ``XGBModel`` with its
default features, since one booster cannot mix the two feature kinds.
"""

from __future__ import annotations

import numpy as np
import xgboost as xgb
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..hardware import Hardware
from .candidate_config import recorded_fields
from .plan_features import FEATURE_NAMES, PlanFeatureExtractor

#: The feature holding the analytical prediction, the base the correction multiplies.
ANALYTICAL = FEATURE_NAMES.index("log2_predicted_us")
#: Boosting for a few hundred measurements at most: depth-3 trees, leaves of at least 4
#: measurements and an L2 penalty that pulls a leaf with few of them toward no correction.
XGB_PARAMS = {"objective": "reg:squarederror", "base_score": 0.0, "eta": 0.1, "max_depth": 3,
              "min_child_weight": 4.0, "lambda": 8.0, "nthread": 2, "seed": 0}
ROUNDS = 60


@derived_object
class PlanResidualModel(ms.cost_model.PyCostModel):
    """Scores planned candidates by ``1 / (predicted_us * 2**correction)``, the correction an
    XGBoost regression of ``log2(measured_us / predicted_us)`` on the plan features of every
    measurement so far (none before the first: the analytical ranking). It fits when next asked
    to predict, once for any number of updates before."""

    def __init__(self, hw: Hardware | None = None, rounds: int = ROUNDS, **params):
        super().__init__()
        self.extractor = PlanFeatureExtractor(hw)
        self.rounds = rounds
        self.params = {**XGB_PARAMS, **params}
        self.features = np.zeros((0, len(FEATURE_NAMES)), dtype="float32")
        self.errors = np.zeros(0, dtype="float32")
        self._booster: xgb.Booster | None = None
        self._fitted = 0  # measurements the booster was fitted on

    def _features(self, context, candidates) -> np.ndarray:
        return np.stack([self.extractor.features(context.mod, c.sch.mod) for c in candidates])

    def load(self, path: str) -> None:
        with np.load(path) as data:
            self.features, self.errors = data["features"], data["errors"]
        self._booster, self._fitted = None, 0

    def save(self, path: str) -> None:
        with open(path, "wb") as f:
            np.savez(f, features=self.features, errors=self.errors)

    @property
    def booster(self) -> xgb.Booster | None:
        """The correction fitted on every measurement so far; None before the first."""
        if self._fitted != len(self.errors):
            self._booster = xgb.train(self.params, xgb.DMatrix(self.features, self.errors), self.rounds)
            self._fitted = len(self.errors)
        return self._booster

    def update(self, context, candidates, results) -> None:
        ran = [(c, np.mean([float(s) for s in r.run_secs])) for c, r in zip(candidates, results)
               if r.error_msg is None and r.run_secs]
        if ran:
            self.add(self._features(context, [c for c, _ in ran]), np.array([secs * 1e6 for _, secs in ran]))

    def add(self, features: np.ndarray, measured_us: np.ndarray) -> None:
        """Measurements (``FEATURE_NAMES`` rows and their times) to fit on."""
        errors = np.log2(measured_us) - features[:, ANALYTICAL]
        self.features = np.concatenate([self.features, features.astype("float32")])
        self.errors = np.concatenate([self.errors, errors.astype("float32")])

    def predict_us(self, features: np.ndarray) -> np.ndarray:
        """The corrected time of candidates given as ``FEATURE_NAMES`` rows."""
        log2_us = features[:, ANALYTICAL].astype("float64")
        booster = self.booster
        if booster is not None:
            log2_us += booster.predict(xgb.DMatrix(features))
        return np.exp2(log2_us)

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
