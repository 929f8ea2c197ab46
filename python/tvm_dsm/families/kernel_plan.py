"""The plan of a generated kernel predicted by its roofline: the bytes of each memory level at
that level's rate and the operations of each compute unit at its rate, the slowest of them plus
a launch. The families whose kernels are templates (attention, softmax·V, top-k rows, the fused
rows of a cascade) predict so: their kernels overlap loads and arithmetic, and were tuned on the
GPU rather than fitted to a pipeline model like the GEMMs'."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..calibration import fitted
from ..planners.report import Plan

#: One kernel launch (the GEMM model's fitted value).
LAUNCH_S = fitted("gemm.launch_s")
#: Dense fp16 warpgroup-MMA throughput (FLOP/s), the tensor-core peak.
WGMMA_FLOPS = fitted("gemm.wgmma_flops")
#: fp32 throughput of the CUDA cores (FLOP/s, an FMA counting 2).
CUDA_CORE_FLOPS = fitted("cuda_cores.fp32_flops")
#: How much faster than the hardware file's plain L2 re-read rate operand tiles copied into
#: shared memory come from L2 (fitted on the GEMM sweeps, whose tiles move the same way).
TILE_L2_SPEEDUP = fitted("gemm.tile_l2_speedup")
#: CUDA-core operations of one term of a cascade's reduction, an estimate: a subtract, an
#: exponential (a multiply and an ex2) and an accumulate; a max or a plain sum takes fewer.
ELEMENT_OPS = 4


@dataclass(frozen=True)
class KernelPlan(Plan):
    """A kernel configuration (anything with ``explain()``) and its roofline prediction."""

    config: Any

    def summary(self) -> str:
        return self.config.explain()


def roofline(config: Any, traffic: dict[str, int], work: dict[str, float], rates: dict[str, float],
             busy: float = 1.0, plan: type[KernelPlan] = KernelPlan) -> KernelPlan:
    """``config``'s plan: ``traffic`` bytes per memory level and ``work`` operations per compute
    unit, each at its rate in ``rates`` scaled by ``busy`` (the share of SMs the grid occupies),
    the slowest plus a launch."""
    share = min(busy, 1.0)
    seconds = {name: amount / (rates[name] * share) for name, amount in {**traffic, **work}.items()}
    total = max(seconds.values(), default=0.0) + LAUNCH_S
    seconds["launch"] = LAUNCH_S
    return plan(bytes=dict(traffic), seconds=seconds, predicted_us=total * 1e6, config=config)


def default_first(plans: list[KernelPlan], default: Any) -> list[KernelPlan]:
    """``plans`` with the plan of ``default`` first, the rest by prediction: a family's default
    configuration was measured fastest on the GPU, which the roofline cannot resolve."""
    return sorted(plans, key=lambda p: (p.config != default, p.predicted_us))
