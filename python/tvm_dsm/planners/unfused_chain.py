"""Plan a GEMM chain as split-K GEMM kernels (:mod:`tvm_dsm.rules.unfused_chain`).

The kernels run one after the other and share nothing but ``H`` (and a separate gate's sums),
so the chain's prediction is the sum of the GEMMs' (:func:`tvm_dsm.planners.split_k_gemm.predict`:
``H``'s write is GEMM0's output bytes, its read GEMM1's input bytes), and the best combination is
the combination of bests.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ClusterError
from ..hardware import Hardware
from ..rules.fused_chain import ChainShape
from ..rules.unfused_chain import UnfusedChainConfig, check_unfused_config, gemm_shapes
from .report import Plan
from .split_k_gemm import GemmPlan, plan_split_k_gemm

#: Configurations of each GEMM combined into the ranking (TOP x TOP pairs; a separate gate takes
#: the up kernel's best configuration: the two products have one shape).
TOP = 4


@dataclass(frozen=True)
class UnfusedChainPlan(Plan):
    """Two or three split-K GEMM plans (a gated chain's gate apart: gate, up, GEMM1), bytes and
    time added level by level."""

    config: UnfusedChainConfig
    shape: ChainShape
    gemms: tuple[GemmPlan, ...]

    def summary(self) -> str:
        s = self.shape
        kind = "SwiGLU" if s.gated else "GEMM chain"
        names = (["gate (fp32 sums to global memory)", "up, silu(gate) * up"]
                 if self.config.gate is not None else ["GEMM0"]) + ["GEMM1"]
        kernels = "".join(f"\n  {name}: {p.summary()}" for name, p in zip(names, self.gemms))
        return (f"unfused {kind} {s.m}x{s.k} -> {s.n} -> {s.l}: {len(self.gemms)} kernels, H "
                f"({s.m}x{s.n} fp16) through global memory{kernels}")


def combine(shape: ChainShape, plans: list[GemmPlan], hw: Hardware) -> UnfusedChainPlan:
    """The chain's plan from its kernels' plans (``[gate, up, GEMM1]`` or ``[GEMM0, GEMM1]``):
    a separate gate also moves its fp32 sums through HBM (written, then read by the up kernel;
    the GEMM plans count an fp16 output)."""
    round_trip = shape.m * shape.n * (4 - 2 + 4) if len(plans) == 3 else 0
    levels = dict.fromkeys(lv for p in plans for lv in p.seconds)
    nbytes = {lv: sum(p.bytes.get(lv, 0) for p in plans)
              for lv in levels if any(lv in p.bytes for p in plans)}
    seconds = {lv: sum(p.seconds.get(lv, 0.0) for p in plans) for lv in levels}
    nbytes["hbm"] += round_trip
    seconds["hbm"] += round_trip / hw.hbm_bw
    *gate, first, second = (p.config for p in plans)
    return UnfusedChainPlan(
        bytes=nbytes, seconds=seconds,
        predicted_us=sum(p.predicted_us for p in plans) + round_trip / hw.hbm_bw * 1e6,
        config=UnfusedChainConfig(first, second, gate[0] if gate else None),
        shape=shape, gemms=tuple(plans),
    )


def plan_unfused_chain(shape: ChainShape, hw: Hardware) -> list[UnfusedChainPlan]:
    """The combinations of each kernel's ``TOP`` configurations (a gated chain: both products
    in one kernel, and apart), best predicted first (ClusterError, from the GEMM planner, if a
    GEMM has no valid configuration)."""
    first, second = (plan_split_k_gemm(s, hw)[:TOP] for s in gemm_shapes(shape))
    plans = [combine(shape, [a, b], hw) for a in first for b in second]
    if shape.gated:
        single = plan_split_k_gemm(gemm_shapes(shape, gate_apart=True)[0], hw)
        gate = single[0]
        ups = [u for u in single
               if _fits(shape, UnfusedChainConfig(u.config, second[0].config, gate.config))]
        plans += [combine(shape, [gate, up, b], hw) for up in ups[:TOP] for b in second]
    return sorted(plans, key=lambda p: p.predicted_us)


def _fits(shape: ChainShape, config: UnfusedChainConfig) -> bool:
    try:
        check_unfused_config(shape, config)
    except ClusterError:
        return False
    return True
