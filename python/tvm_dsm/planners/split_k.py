"""Choose a cluster split-K configuration for a row reduction without measuring.

The model counts the bytes each memory level moves for a configuration and divides by the level's
measured bandwidth (:mod:`tvm_dsm.hardware`); HBM bandwidth is scaled by how well the grid fills
the GPU, and every cluster pays one DSM round trip per barrier. It ranks configurations; it does
not promise absolute times.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ClusterError, passes
from ..hardware import Hardware
from ..rules.split_k_reduction import SplitKReductionConfig, check_config
from .report import Plan

#: CTAs per SM needed to keep enough loads in flight to saturate HBM (a row-reduction CTA of 128
#: threads has little memory-level parallelism on its own).
_CTAS_PER_SM_FOR_FULL_BW = 4


@dataclass(frozen=True)
class SplitKPlan(Plan):
    """A split-K reduction configuration with its prediction."""

    config: SplitKReductionConfig
    ctas: int

    def summary(self) -> str:
        c = self.config
        return (
            f"cluster split-K: {c.cluster_size} CTA(s) per cluster split K; each cluster owns "
            f"{c.rows_per_cluster} rows; {self.ctas} CTAs of {c.threads} threads"
        )


def predict(rows: int, depth: int, elem_bytes: int, extra_input_bytes: int,
            config: SplitKReductionConfig, hw: Hardware) -> SplitKPlan:
    """Bytes per level and predicted time of one configuration (which must be valid)."""
    s = config.cluster_size
    ctas = rows // config.rows_per_cluster * s
    partials = rows * s * 4  # one fp32 partial per row per CTA of the cluster
    traffic = {
        "hbm": rows * depth * elem_bytes + extra_input_bytes * ctas // s + rows * 4,
        "smem": partials,
        "dsm": partials - rows * 4 if s > 1 else 0,
    }
    fill = min(1.0, ctas / (hw.sm_count * _CTAS_PER_SM_FOR_FULL_BW))
    seconds = {
        "hbm": traffic["hbm"] / (hw.hbm_bw * fill),
        "smem": traffic["smem"] / hw.smem_bw,
        "dsm": traffic["dsm"] / hw.dsm_bw(s) if s > 1 else 0.0,
    }
    barrier = 2 * hw.latency_ns["dsm"] * 1e-9 if s > 1 else 0.0
    total = max(seconds.values()) + barrier
    return SplitKPlan(bytes=traffic, seconds=seconds, predicted_us=total * 1e6, config=config,
                      ctas=ctas)


def plan_split_k_reduction(rows: int, depth: int, hw: Hardware, *, elem_bytes: int = 4,
                           extra_input_bytes: int = 0, warps: int = 4) -> list[SplitKPlan]:
    """All valid configurations, best predicted first. ``extra_input_bytes``: a vector every
    cluster reads whole (GEMV's x)."""
    plans = []
    for s in (1, 2, 4, 8, 16):
        for mt in (16, 32, 64):
            config = SplitKReductionConfig(s, mt, warps)
            if not passes(check_config, rows, depth, config):
                continue
            plans.append(predict(rows, depth, elem_bytes, extra_input_bytes, config, hw))
    if not plans:
        raise ClusterError(f"no cluster split-K configuration fits M={rows}, K={depth}")
    return sorted(plans, key=lambda p: (p.predicted_us, p.config.cluster_size))
