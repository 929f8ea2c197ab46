"""The plan of a generated kernel predicted by its roofline: the bytes of each memory level at
that level's rate and the operations of each compute unit at its rate, the slowest of them plus
a launch. The families whose kernels are templates (attention, softmax·V, top-k rows, the fused
rows of a cascade) predict so: their kernels overlap loads and arithmetic, and were tuned on the
GPU rather than fitted to a pipeline model like the GEMMs'."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..hardware import Hardware
from ..planners.report import Plan

#: CUDA-core operations of one term of a cascade's reduction, an estimate: a subtract, an
#: exponential (a multiply and an ex2) and an accumulate; a max or a plain sum takes fewer.
ELEMENT_OPS = 4


@dataclass(frozen=True)
class KernelPlan(Plan):
    """A kernel configuration (anything with ``explain()``) and its roofline prediction."""

    config: Any

    def summary(self) -> str:
        return self.config.explain()


def hardware_rates(hw: Hardware) -> dict[str, float]:
    """The rates of ``hw`` a roofline divides by, per memory level or compute unit (bytes or
    operations a second): HBM; L2 as operand tiles copied into shared memory read it (the GEMM
    sweeps' ``gemm.tile_l2_speedup`` over the plain re-read rate); the warpgroup MMAs' dense
    fp16 peak; the CUDA cores' fp32 rate (an FMA counting 2)."""
    return {"hbm": hw.hbm_bw, "l2": hw.l2_bw * hw.fitted("gemm.tile_l2_speedup"),
            "mma": hw.fitted("gemm.wgmma_flops"), "fp32": hw.fitted("cuda_cores.fp32_flops")}


def roofline(config: Any, traffic: dict[str, int], work: dict[str, float], hw: Hardware,
             busy: float = 1.0, plan: type[KernelPlan] = KernelPlan,
             rates: dict[str, float] | None = None) -> KernelPlan:
    """``config``'s plan: ``traffic`` bytes per memory level and ``work`` operations per compute
    unit, each at its rate on ``hw`` (:func:`hardware_rates`, or ``rates`` where it names the
    level) scaled by ``busy`` (the share of SMs the grid occupies), the slowest plus a launch
    (the GEMM model's fitted ``gemm.launch_s``)."""
    share = min(busy, 1.0)
    rate = {**hardware_rates(hw), **(rates or {})}
    seconds = {name: amount / (rate[name] * share) for name, amount in {**traffic, **work}.items()}
    launch = hw.fitted("gemm.launch_s")
    total = max(seconds.values(), default=0.0) + launch
    seconds["launch"] = launch
    return plan(bytes=dict(traffic), seconds=seconds, predicted_us=total * 1e6, config=config)


def default_first(plans: list[KernelPlan], default: Any) -> list[KernelPlan]:
    """``plans`` with the plan of ``default`` first, the rest by prediction: a family's default
    configuration was measured fastest on the GPU, which the roofline cannot resolve."""
    return sorted(plans, key=lambda p: (p.config != default, p.predicted_us))
