"""Plan a GEMM chain as split-K GEMM kernels (:mod:`tvm_dsm.rules.unfused_chain`).

The kernels run one after the other and share nothing but ``H``, so the chain's prediction is
the sum of the GEMMs' (:func:`tvm_dsm.planners.split_k_gemm.predict`: ``H``'s write is GEMM0's
output bytes, its read GEMM1's input bytes), and the best combination is the combination of
bests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..hardware import Hardware
from ..rules.fused_chain import ChainShape
from ..rules.unfused_chain import UnfusedChainConfig, gemm_shapes
from .report import Plan
from .split_k_gemm import GemmPlan, plan_split_k_gemm

#: Configurations of each GEMM combined into the ranking (TOP x TOP pairs).
TOP = 4
#: Launched programmatically, a kernel's CTAs are placed while the previous kernel runs: on
#: the SMs it leaves idle, and beside its CTAs where shared memory allows. Where those places
#: take at least ``chains.crowded_share`` of the grid but not all of it (the grid is then
#: crowded there), the chain runs slower than launched after the previous kernel, by
#: ``chains.crowding`` of its kernel's predicted time; where not crowded the programmatic launch
#: saves ``chains.late_launch_s``, what a chain launched kernel after kernel loses (each GEMM's
#: prediction holds the launch of a kernel run alone, so that comes off the sum of the two, less
#: the crowding, once per chain). Constants fitted on the GPU (``hw.fitted``; on the H100 from
#: bench/results/archive/chains_programmatic_ab.json, docs/chains.md).


@dataclass(frozen=True)
class UnfusedChainPlan(Plan):
    """Two split-K GEMM plans, bytes and time added level by level."""

    config: UnfusedChainConfig
    shape: ChainShape
    gemms: tuple[GemmPlan, ...]

    def summary(self) -> str:
        s = self.shape
        kind = "SwiGLU" if s.gated else "GEMM chain"
        kernels = "".join(f"\n  {name}: {p.summary()}" for name, p in zip(("GEMM0", "GEMM1"), self.gemms))
        launch = ("each launched while the previous one runs" if self.config.programmatic_launch
                  else "each launched after the previous one (GEMM1's CTAs would crowd GEMM0's idle SMs)")
        return (f"unfused {kind} {s.m}x{s.k} -> {s.n} -> {s.l}: {len(self.gemms)} kernels, {launch}, "
                f"H ({s.m}x{s.n} fp16) through global memory{kernels}")


def combine(shape: ChainShape, first: GemmPlan, second: GemmPlan, hw: Hardware) -> UnfusedChainPlan:
    """The chain's plan from its two kernels' plans."""
    plans = (first, second)
    levels = dict.fromkeys(lv for p in plans for lv in p.seconds)
    nbytes = {lv: sum(p.bytes.get(lv, 0) for p in plans)
              for lv in levels if any(lv in p.bytes for p in plans)}
    seconds = {lv: sum(p.seconds.get(lv, 0.0) for p in plans) for lv in levels}
    # Launched programmatically (GEMM1's launch hidden behind GEMM0) unless GEMM1's grid would
    # be crowded for longer than a launch
    crowding = hw.fitted("chains.crowding") * second.predicted_us * 1e-6 if crowded(first, second, hw) else 0.0
    late_launch = hw.fitted("chains.late_launch_s")
    programmatic = crowding < late_launch
    launch = min(crowding, late_launch) - late_launch  # the cheaper launch vs two kernels alone
    seconds["latency"] = seconds.get("latency", 0.0) + launch
    return UnfusedChainPlan(
        bytes=nbytes, seconds=seconds,
        predicted_us=first.predicted_us + second.predicted_us + launch * 1e6,
        config=UnfusedChainConfig(first.config, second.config, programmatic),
        shape=shape, gemms=plans,
    )


def crowded(first: GemmPlan, second: GemmPlan, hw: Hardware) -> bool:
    """Whether a programmatic launch of ``second`` behind ``first`` would place at least
    ``chains.crowded_share`` of its CTAs, but not all, while ``first`` runs."""
    busy = min(hw.sm_count, math.ceil(first.ctas / first.resident))
    beside = max(0, hw.smem_per_sm - first.resident * first.smem) // second.smem
    places = (hw.sm_count - busy) * second.resident + busy * beside
    return hw.fitted("chains.crowded_share") * second.ctas <= places < second.ctas


def plan_unfused_chain(shape: ChainShape, hw: Hardware) -> list[UnfusedChainPlan]:
    """The combinations of each kernel's ``TOP`` configurations, best predicted first
    (ClusterError, from the GEMM planner, if a GEMM has no valid configuration)."""
    first, second = (plan_split_k_gemm(s, hw)[:TOP] for s in gemm_shapes(shape))
    return sorted((combine(shape, a, b, hw) for a in first for b in second),
                  key=lambda p: p.predicted_us)
