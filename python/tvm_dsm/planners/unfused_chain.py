"""Plan a GEMM chain as two split-K GEMM kernels (:mod:`tvm_dsm.rules.unfused_chain`).

The kernels run one after the other and share nothing but ``H``, so the chain's prediction is
the sum of the two GEMMs' (:func:`tvm_dsm.planners.split_k_gemm.predict`: ``H``'s write is
GEMM0's output bytes, its read GEMM1's input bytes), and the best pair is the pair of bests.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware import Hardware
from ..rules.fused_chain import ChainShape
from ..rules.unfused_chain import UnfusedChainConfig, gemm_shapes
from .report import Plan
from .split_k_gemm import GemmPlan, plan_split_k_gemm

#: Configurations of each GEMM combined into the ranking (their pairs: TOP x TOP plans).
TOP = 4


@dataclass(frozen=True)
class UnfusedChainPlan(Plan):
    """Two split-K GEMM plans, bytes and time added level by level."""

    config: UnfusedChainConfig
    shape: ChainShape
    gemms: tuple[GemmPlan, GemmPlan]

    def summary(self) -> str:
        s = self.shape
        kind = "SwiGLU" if s.gated else "GEMM chain"
        first, second = (p.summary() for p in self.gemms)
        return (f"unfused {kind} {s.m}x{s.k} -> {s.n} -> {s.l}: two kernels, H ({s.m}x{s.n} "
                f"fp16) through global memory\n  GEMM0: {first}\n  GEMM1: {second}")


def combine(shape: ChainShape, first: GemmPlan, second: GemmPlan) -> UnfusedChainPlan:
    """The chain's plan from its two GEMMs' plans."""
    levels = dict.fromkeys([*first.seconds, *second.seconds])
    return UnfusedChainPlan(
        bytes={lv: first.bytes.get(lv, 0) + second.bytes.get(lv, 0)
               for lv in levels if lv in first.bytes or lv in second.bytes},
        seconds={lv: first.seconds.get(lv, 0.0) + second.seconds.get(lv, 0.0) for lv in levels},
        predicted_us=first.predicted_us + second.predicted_us,
        config=UnfusedChainConfig(first.config, second.config),
        shape=shape,
        gemms=(first, second),
    )


def plan_unfused_chain(shape: ChainShape, hw: Hardware) -> list[UnfusedChainPlan]:
    """The pairs of each GEMM's ``TOP`` configurations, best predicted first (ClusterError,
    from the GEMM planner, if either GEMM has no valid configuration)."""
    first, second = (plan_split_k_gemm(s, hw)[:TOP] for s in gemm_shapes(shape))
    plans = [combine(shape, a, b) for a in first for b in second]
    return sorted(plans, key=lambda p: p.predicted_us)
