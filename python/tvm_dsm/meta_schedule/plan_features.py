"""A cluster/DSM candidate as a feature vector, for MetaSchedule's learned cost models.

TVM's ``PerStoreFeature`` cannot read cluster schedules (it rejects the ``clusterCtaIdx.x``
thread tag), and a schedule family's kernel is better described by what the planner knows of it
than by its loops: the configuration's knobs (cluster size, tiles, warps, pipeline stages, TMA
and warpgroup-MMA flags, ...) and the analytical model's plan (bytes and time per memory level,
the predicted total, CTAs, CTAs per SM and waves). Every family gives a vector of the same
length (``FEATURE_NAMES``): knobs a family lacks and levels its plan does not name are 0, levels
no slot names are summed into ``other``. The predicted total is kept exactly (its log2), the
base the learned model corrects.

:class:`PlanFeatureExtractor` computes it for MetaSchedule candidates: the family and shape from
the task's function, the configuration from the candidate's annotation
(:mod:`~tvm_dsm.meta_schedule.candidate_config`), the plan from the family's ``predict``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.utils import shash2hex

from ..errors import ClusterError
from ..families import FAMILIES, match_family
from ..families.base import ScheduleFamily
from ..hardware import Hardware, load_hardware
from ..planners.report import Plan
from .candidate_config import rebuild, recorded_fields

FAMILY_NAMES = tuple(f.name for f in FAMILIES)
#: Configuration knobs, by the names the families' configurations use (attributes or properties).
KNOBS = ("cluster_size", "ranks", "block_m", "block_n", "block_k", "block_j", "warps", "warps_m", "warps_n",
         "warpgroups", "row_blocks", "rows_per_cluster", "rows_per_cta", "rows_per_thread",
         "columns_per_thread", "stages", "copy_stages", "parts", "lanes", "vector", "tma", "wgmma")
#: Memory levels and compute terms of the planners' plans; any other level goes to "other".
LEVELS = ("hbm", "l2", "dsm", "smem", "mma", "fp32", "pipeline", "latency", "launch", "other")
FEATURE_NAMES = (
    *(f"family={name}" for name in FAMILY_NAMES),
    *(f"knob.{k}" for k in KNOBS),
    *(f"{kind}.{level}" for level in LEVELS for kind in ("log2_bytes", "log2_us", "share")),
    "log2_predicted_us", "log2_ctas", "ctas_per_sm", "waves", "log2_smem_bytes",
)


def _log2(value: float) -> float:
    return math.log2(1.0 + max(0.0, float(value)))


def _knob(config: Any, name: str) -> float:
    value = getattr(config, name, 0)
    if isinstance(value, bool):
        return float(value)
    return _log2(value) if isinstance(value, (int, float)) else 0.0


def plan_features(family: str, config: Any, plan: Plan, hw: Hardware) -> np.ndarray:
    """The feature vector (``FEATURE_NAMES``) of ``config`` of ``family`` planned as ``plan``."""
    total_s = max(plan.predicted_us * 1e-6, 1e-12)
    bytes_, seconds = dict.fromkeys(LEVELS, 0.0), dict.fromkeys(LEVELS, 0.0)
    for level, amount in plan.bytes.items():
        bytes_[level if level in bytes_ else "other"] += amount
    for level, t in plan.seconds.items():
        seconds[level if level in seconds else "other"] += t
    per_level = [v for level in LEVELS for v in (_log2(bytes_[level]), _log2(seconds[level] * 1e6),
                                                 seconds[level] / total_s)]
    ctas, resident = getattr(plan, "ctas", 0), getattr(plan, "resident", 0)
    cluster = getattr(config, "cluster_size", getattr(config, "ranks", 1)) or 1
    waves = math.ceil(ctas / hw.concurrent_ctas(cluster, resident)) if ctas and resident else 0
    vector = [
        *(float(family == name) for name in FAMILY_NAMES),
        *(_knob(config, k) for k in KNOBS),
        *per_level,
        math.log2(plan.predicted_us), _log2(ctas), float(resident), float(waves), _log2(getattr(plan, "smem", 0)),
    ]
    return np.asarray(vector, dtype="float32")


@derived_object
class PlanFeatureExtractor(ms.feature_extractor.PyFeatureExtractor):
    """Features of :class:`PlannedSpace` candidates (one row of ``FEATURE_NAMES`` each). A
    candidate without a recorded configuration, or of a task no family takes, is a ClusterError
    (such tasks are tuned in TVM's own space with its own features)."""

    def __init__(self, hw: Hardware | None = None):
        super().__init__()
        self.hw = hw or load_hardware()
        self._tasks: dict[str, tuple[ScheduleFamily, Any, Any]] = {}

    def task(self, mod: tvm.IRModule) -> tuple[ScheduleFamily, Any, Any]:
        """(family, shape, an example configuration) of a task's function, found once per
        function (module attributes aside)."""
        key = shash2hex(tvm.IRModule({"main": mod["main"]}))
        if key not in self._tasks:
            family, shape = match_family(mod["main"])
            self._tasks[key] = (family, shape, family.space(shape, self.hw)[0])
        return self._tasks[key]

    def features(self, mod: tvm.IRModule, candidate: tvm.IRModule) -> np.ndarray:
        """The feature vector of ``candidate``, a schedule of the task ``mod``."""
        family, shape, example = self.task(mod)
        fields = recorded_fields(candidate)
        if fields is None:
            raise ClusterError("the candidate records no tvm-dsm configuration (not from PlannedSpace)")
        config = rebuild(fields, example)
        return plan_features(family.name, config, family.predict(shape, config, self.hw), self.hw)

    def extract_from(self, context, candidates) -> list:
        return [tvm.runtime.tensor(self.features(context.mod, c.sch.mod)[None, :]) for c in candidates]
