"""Choose the tiles of a GEMM row max (tvm_dsm.rules.gemm_row_max) without measuring: the split-K
GEMM family's configurations that keep K whole, hold whole row groups per tile and fit the
activation tile, ranked by the GEMM cost model (its traffic counts the ``M x N`` output that the
row max never writes, the same for every candidate, so the ranking is unchanged)."""

from __future__ import annotations

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware, load_hardware
from ..rules.gemm_row_max import check_row_max_config, find_gemm_row_max, schedule_gemm_row_max
from ..rules.split_k_gemm import SplitKGemmConfig
from .split_k_gemm import GemmPlan, candidate_configs, predict


def plan_gemm_row_max(func: tirx.PrimFunc, hw: Hardware | None = None) -> list[GemmPlan]:
    """Every valid configuration for ``func``, best predicted first."""
    hw = hw or load_hardware()
    _, _, _, shape, group = find_gemm_row_max(s_tir.Schedule(func))
    plans = []
    for config in candidate_configs(shape):
        try:
            check_row_max_config(shape, group, config)
        except ClusterError:
            continue
        plans.append(predict(shape, config, hw))
    if not plans:
        raise ClusterError(f"no GEMM row max configuration fits {shape.m}x{shape.n}x{shape.k} with "
                           f"groups of {group} rows (N must be a multiple of 64, a group at most "
                           "128 rows dividing the tile)")
    return sorted(plans, key=lambda p: (p.predicted_us, -p.config.stages))


def schedule_row_max(func: tirx.PrimFunc, hw: Hardware | None = None,
                     config: SplitKGemmConfig | None = None) -> tuple[s_tir.Schedule, GemmPlan]:
    """The schedule of ``func`` with the planner's best configuration (or ``config``) and the
    plan (``plan.explain()``)."""
    hw = hw or load_hardware()
    plan = plan_gemm_row_max(func, hw)[0] if config is None else None
    if plan is None:
        _, _, _, shape, _ = find_gemm_row_max(s_tir.Schedule(func))
        plan = predict(shape, config, hw)
    return schedule_gemm_row_max(func, plan.config), plan
