"""The analytical models as MetaSchedule cost models: nothing to learn, candidates scored by
1 / predicted time (higher is better). Subclasses say how a candidate's prediction is found."""

from __future__ import annotations

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms


class AnalyticalScores(ms.cost_model.PyCostModel):
    """Base of the tvm-dsm cost models (decorate subclasses with ``derived_object``)."""

    def load(self, path: str) -> None:
        pass

    def save(self, path: str) -> None:
        pass

    def update(self, context, candidates, results) -> None:
        pass  # analytical: nothing to learn

    def predicted_us(self, mod: tvm.IRModule) -> float:
        raise NotImplementedError

    def predict(self, context, candidates) -> np.ndarray:
        return np.array([1.0 / self.predicted_us(c.sch.mod) for c in candidates], dtype="float64")
