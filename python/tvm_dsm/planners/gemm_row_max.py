"""Choose the tiles of a GEMM row max (tvm_dsm.rules.gemm_row_max) without measuring: the split-K
GEMM family's configurations that keep K whole, hold whole row groups per tile and fit the
activation tile, ranked by the GEMM cost model (its traffic counts the ``M x N`` output that the
row max never writes, the same for every candidate, so the ranking is unchanged)."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx

from ..errors import ClusterError, passes
from ..hardware import Hardware, load_hardware
from ..rules.gemm_row_max import check_row_max_config, find_gemm_row_max, schedule_gemm_row_max
from ..rules.split_k_gemm import GemmShape, SplitKGemmConfig
from .split_k_gemm import GemmPlan, candidate_configs, predict


@dataclass(frozen=True)
class RowMaxShape:
    """The product's shape and the rows each max reduces (a sequence)."""

    gemm: GemmShape
    group: int


def row_max_shape(func: tirx.PrimFunc) -> RowMaxShape:
    _, _, _, shape, group = find_gemm_row_max(s_tir.Schedule(func))
    return RowMaxShape(shape, group)


def plan_gemm_row_max(shape: RowMaxShape, hw: Hardware | None = None) -> list[GemmPlan]:
    """Every valid configuration, best predicted first."""
    hw = hw or load_hardware()
    plans = [predict(shape.gemm, config, hw) for config in candidate_configs(shape.gemm, hw=hw)
             if passes(check_row_max_config, shape.gemm, shape.group, config, hw)]
    if not plans:
        g = shape.gemm
        raise ClusterError(f"no GEMM row max configuration fits {g.m}x{g.n}x{g.k} with groups of "
                           f"{shape.group} rows (N must be a multiple of 64, a group at most 128 "
                           "rows dividing the tile)")
    return sorted(plans, key=lambda p: (p.predicted_us, -p.config.stages))


def schedule_row_max(func: tirx.PrimFunc, hw: Hardware | None = None,
                     config: SplitKGemmConfig | None = None) -> tuple[s_tir.Schedule, GemmPlan]:
    """The schedule of ``func`` with the planner's best configuration (or ``config``) and the
    plan (``plan.explain()``)."""
    hw = hw or load_hardware()
    shape = row_max_shape(func)
    plan = plan_gemm_row_max(shape, hw)[0] if config is None else predict(shape.gemm, config, hw)
    return schedule_gemm_row_max(func, plan.config, hw), plan
