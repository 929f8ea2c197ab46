"""Plans ranked with what was measured: a plan as a feature vector, a learned correction of the
analytical model's time, and the planner's first candidates re-ranked by corrections learned
from committed measurements.

A plan's features (``FEATURE_NAMES``) are what the planner knows of it: the configuration's
knobs (cluster size, tiles, warps, pipeline stages, TMA and warpgroup-MMA flags, ...) and the
analytical model's plan (bytes and time per memory level, the predicted total, CTAs, CTAs per SM
and waves). Every family gives a vector of the same length: knobs a family lacks and levels its
plan does not name are 0, levels no slot names are summed into ``other``. The predicted total is
kept exactly (its log2), the base the correction multiplies.

:class:`PlanResidual` is XGBoost on those features fitted to the analytical model's error,
``log2(measured / predicted time)``, rather than to the time: untrained it ranks by the
analytical model, and measurements move that ranking only where they disagree with the model
consistently. The boosting is small and strongly regularized (shallow trees, leaves that need
several measurements and shrink toward no correction), for tens to hundreds of measurements.
MetaSchedule's learned cost model (:mod:`tvm_dsm.meta_schedule.learned_cost_model`) fits one as
tuning measures; :func:`rerank` uses one fitted on the measurements committed with tvm-dsm
(``data/measured_plans.json``, written by ``python -m tvm_dsm.bench.search_quality prior``) to
order the analytical model's first :data:`RERANKED` plans of the shapes those measurements
cover, so that an untuned build takes what measured fastest on similar shapes.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .families import FAMILIES
from .families.column_gemv import ColumnGemvFamily
from .families.elementwise import Elementwise
from .families.packed_gemv import PackedGemvFamily
from .families.per_thread_math import PerThreadMath
from .families.row_gemv import RowGemvFamily
from .families.simt_gemm import SimtGemm
from .families.strided_rows import StridedRows
from .hardware import DATA, Hardware
from .planners.report import Plan

#: The families a plan's features tell apart, a column each: not the elementwise families and
#: the GEMVs, whose rooflines cannot tell their configurations apart (their measured default
#: comes first), nor the fp32 GEMM (its model fitted on its own sweep): no measured pools of
#: theirs are committed (a column for them would shift the others' positions, and with them the
#: model fitted on the committed measurements).
FAMILY_NAMES = tuple(f.name for f in FAMILIES if f.name not in (
    Elementwise.name, PerThreadMath.name, RowGemvFamily.name, PackedGemvFamily.name, ColumnGemvFamily.name,
    SimtGemm.name, StridedRows.name))
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


#: The feature holding the analytical prediction, the base the correction multiplies.
ANALYTICAL = FEATURE_NAMES.index("log2_predicted_us")
#: Boosting for a few hundred measurements at most: depth-3 trees, leaves of at least 4
#: measurements and an L2 penalty that pulls a leaf with few of them toward no correction.
XGB_PARAMS = {"objective": "reg:squarederror", "base_score": 0.0, "eta": 0.1, "max_depth": 3,
              "min_child_weight": 4.0, "lambda": 8.0, "nthread": 2, "seed": 0}
ROUNDS = 60


class PlanResidual:
    """``predicted_us * 2**correction``, the correction an XGBoost regression of
    ``log2(measured_us / predicted_us)`` on the features of every measurement added (none
    before the first: the analytical time). It fits when next asked to predict, once for any
    number of additions before."""

    def __init__(self, rounds: int = ROUNDS, **params):
        self.rounds = rounds
        self.params = {**XGB_PARAMS, **params}
        self.features = np.zeros((0, len(FEATURE_NAMES)), dtype="float32")
        self.errors = np.zeros(0, dtype="float32")
        self._booster = None
        self._fitted = 0  # measurements the booster was fitted on

    def add(self, features: np.ndarray, measured_us: np.ndarray) -> None:
        """Measurements (``FEATURE_NAMES`` rows and their times) to fit on."""
        errors = np.log2(measured_us) - features[:, ANALYTICAL]
        self.features = np.concatenate([self.features, features.astype("float32")])
        self.errors = np.concatenate([self.errors, errors.astype("float32")])

    @property
    def booster(self):
        """The correction fitted on every measurement so far; None before the first."""
        import xgboost as xgb

        if len(self.errors) and self._fitted != len(self.errors):
            self._booster = xgb.train(self.params, xgb.DMatrix(self.features, self.errors), self.rounds)
            self._fitted = len(self.errors)
        return self._booster

    def predict_us(self, features: np.ndarray) -> np.ndarray:
        """The corrected time of candidates given as ``FEATURE_NAMES`` rows."""
        import xgboost as xgb

        log2_us = features[:, ANALYTICAL].astype("float64")
        booster = self.booster
        if booster is not None:
            log2_us += booster.predict(xgb.DMatrix(features))
        return np.exp2(log2_us)


#: The H200's committed measurements (``python -m tvm_dsm.bench.search_quality prior``); another
#: GPU's are ``measured_plans_<gpu>.json`` (:func:`measured_plans_files`), each naming its device.
MEASURED_PLANS = DATA / "measured_plans.json"
#: Plans :func:`rerank` re-orders: the analytical model's first ones, where the fastest measured
#: were found (bench/results/search_quality).
RERANKED = 16
#: Workloads of a family the committed measurements must hold before they re-rank its plans: a
#: correction learned from one or two shapes carries their quirks (held out on the H200 pools,
#: one attention workload re-ranked by the other measured 0.68x of the analytical pick).
MIN_WORKLOADS = 3
#: Families whose measurements on a GPU are fitted into its constants instead
#: (:mod:`tvm_dsm.bench.calibrate`): their analytical order is kept there. Over the 60 H200 pools
#: read from HBM (bench/results/calibration/h200_sxm.json) the refit split-K GEMM model's pick
#: came 1.028x the fastest measured, re-ranked by the committed measurements 1.033x (in sample,
#: both). On the H100 the constants fitted to its 28 pools of trailing dense layers moved to
#: the ends of their search range and changed the picks of large GEMMs the pools do not hold;
#: re-ranked instead, each pool's pick held out came 1.045x its fastest against the analytical
#: 1.095x (bench/results/calibration/trailing_dense_configs_h100.json).
CALIBRATED_FAMILIES = {"NVIDIA H200": ("split_k_gemm",)}


def measured_plans_files() -> list[Path]:
    """The committed measurements, a file a GPU (``data/measured_plans*.json``)."""
    return sorted(DATA.glob("measured_plans*.json"))


@dataclass(frozen=True)
class Measured:
    """What the committed measurements of a family's plans on a GPU say: the learned correction,
    the largest row count they cover, and the mean measured time of each plan they name by shape
    and configuration (:func:`config_key`; rows written with their shape)."""

    residual: PlanResidual
    most_rows: int
    times_us: dict


def config_key(config: dict) -> str:
    """A configuration's fields but the launch kind, as a measured plan's identity names them
    (with its shape's repr: the features leave knobs out, and round)."""
    return json.dumps({k: v for k, v in config.items() if k != "programmatic_launch"}, sort_keys=True)


@functools.cache
def _measured(family: str, device: str) -> Measured | None:
    """The committed measurements of ``family``'s plans on ``device``; None where none were taken
    on that GPU (another's plans have other features, its kernels other times) or they hold
    fewer than :data:`MIN_WORKLOADS` workloads."""
    found = [data for path in measured_plans_files() if (data := json.loads(path.read_text())).get("device") == device]
    if not found or tuple(found[0].get("feature_names", ())) != FEATURE_NAMES:
        return None  # none, or written by other code: its columns mean other things (regenerate it)
    rows = [r for r in found[0]["rows"] if r["family"] == family]
    if len({r["workload"] for r in rows}) < MIN_WORKLOADS:
        return None
    residual = PlanResidual()
    residual.add(np.array([r["features"] for r in rows], dtype="float32"), np.array([r["measured_us"] for r in rows]))
    times: dict[tuple, list] = {}
    for r in rows:
        if "shape" in r:
            times.setdefault((r["shape"], config_key(r["config"])), []).append(r["measured_us"])
    return Measured(residual, max(r["m"] for r in rows), {k: sum(v) / len(v) for k, v in times.items()})


def row_count(shape: Any) -> int | None:
    """The row count of a family's shape (a GEMM's M, a row-wise operator's rows), None where it
    is symbolic or the shape has none."""
    m = getattr(shape, "m", None)
    if m is None and getattr(shape, "rows_shape", None) is not None:
        m = math.prod(shape.rows_shape) if all(isinstance(r, int) for r in shape.rows_shape) else None
    return m if isinstance(m, int) else None


def rerank(family: str, shape: Any, plans: list[Plan], hw: Hardware) -> list[Plan]:
    """``plans`` (the analytical ranking of ``shape`` on ``hw``) with its first :data:`RERANKED`
    re-ordered by the committed measurements of ``family`` on ``hw``'s GPU, where those cover
    ``shape``'s row count (``shape.m`` up to the largest measured) and hold enough workloads:
    a plan measured there by its measured time, the others by the correction learned from them
    (a correction fitted over many shapes can misplace one it measured: on the H100 it ranked
    2048 x 2048 at 128 rows onto 0.79x of cuBLAS where its analytical pick had run 0.88x);
    unchanged elsewhere."""
    measured = None if family in CALIBRATED_FAMILIES.get(hw.device, ()) else _measured(family, hw.device)
    m = row_count(shape)
    if measured is None or m is None or m > measured.most_rows or len(plans) < 2:
        return plans
    head = plans[:RERANKED]
    features = np.stack([plan_features(family, p.config, p, hw) for p in head])
    times = measured.residual.predict_us(features)
    if measured.times_us:
        times = [measured.times_us.get((repr(shape), config_key(dataclasses.asdict(p.config))), t)
                 for p, t in zip(head, times)]
    order = np.argsort(times, kind="stable")
    return [head[i] for i in order] + plans[RERANKED:]
