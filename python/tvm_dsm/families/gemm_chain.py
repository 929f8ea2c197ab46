"""A chain of two GEMMs with an elementwise stage between them (an FFN, or SwiGLU's gated form):
fused into one cluster kernel with the intermediate in DSM (FlashFuser), fused in one CTA's
shared memory, or run as two split-K GEMMs, whichever the model predicts faster."""

from __future__ import annotations

import functools

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware
from ..planners.fused_chain import ChainPlan, plan_chain
from ..planners.report import Plan
from ..planners.split_k_gemm import plan_split_k_gemm
from ..planners.split_k_gemm import predict as predict_gemm
from ..planners.unfused_chain import combine, plan_unfused_chain
from ..rules.fused_chain import ChainShape, FusedChainConfig, find_chain, schedule_fused_chain
from ..rules.unfused_chain import UnfusedChainConfig, check_unfused_config, gemm_shapes, schedule_unfused_chain
from .base import ScheduleFamily


def chain_rank_key(plan: Plan, hw: Hardware) -> float:
    """What a chain plan is ranked by among fused and unfused plans on ``hw``: its prediction, a
    fused one's weighted by ``chains.fused_pick_bias`` (the fused model's measured optimism)."""
    return plan.predicted_us * (hw.fitted("chains.fused_pick_bias") if isinstance(plan, ChainPlan) else 1.0)


#: How much faster than the chain's best plan its GEMMs apart must be predicted before the family
#: declines the chain. On the H200 (bench/results/archive/chain_apart_s89.json,
#: chain_apart_sweep_s89.json), chain against apart: the 9 chains predicted 1.10-1.31x faster
#: apart ran 1.02-1.44x faster (Qwen2-7B's MLP at 128 rows 149.8 -> 127.0 us, torch 131.0), the
#: 12 predicted 0.89-0.99x ran 0.87-1.00x.
APART_GAIN = 1.1


def apart_us(shape: ChainShape, hw: Hardware) -> float:
    """The predicted time of the chain's GEMMs scheduled apart, each by the split-K GEMM
    family, whose tiles may run past N where those pay
    (:data:`~tvm_dsm.planners.split_k_gemm.PAST_N_GAIN`), as the chain's cannot: Falcon-7B's
    MLP (18176 / 4544 columns, 4544 = 71 x 64) takes 64-wide tiles in the chain, and its second
    GEMM alone ran 757 us on them against 537 past N (H200,
    bench/results/archive/padded_picks_s89.json)."""
    return sum(plan_split_k_gemm(s, hw, padded=True)[0].predicted_us for s in gemm_shapes(shape))


class GemmChain(ScheduleFamily):
    name = "gemm_chain"

    def recognize(self, func: tirx.PrimFunc) -> ChainShape:
        return find_chain(s_tir.Schedule(func))[1]

    def rank(self, shape: ChainShape, hw: Hardware) -> list[Plan]:
        """Fused plans (DSM clusters, and one-CTA SMEM-only ones where they fit) and unfused ones
        (two split-K GEMMs), ranked together: fusion is chosen where the model predicts it
        faster, not because it applies."""
        plans, reasons = [], []
        kinds = (("fused", plan_chain), ("SMEM-only fused", functools.partial(plan_chain, smem_only=True)),
                 ("unfused", plan_unfused_chain))
        for kind, planner in kinds:
            try:
                plans += planner(shape, hw)
            except ClusterError as err:
                reasons.append(f"{kind}: {err}")
        if not plans:
            raise ClusterError("no GEMM chain schedule fits: " + "; ".join(reasons))
        return sorted(plans, key=functools.partial(chain_rank_key, hw=hw))

    def declines(self, shape: ChainShape, plans: list[Plan], hw: Hardware) -> str | None:
        """A chain whose GEMMs apart are predicted :data:`APART_GAIN` faster than its best plan."""
        apart = apart_us(shape, hw)
        if apart * APART_GAIN > plans[0].predicted_us:
            return None
        return (f"its GEMMs apart, where tiles may run past N, are predicted {apart:.1f} us against the chain's"
                f" {plans[0].predicted_us:.1f} (whose kernels take whole tiles only): a kernel per "
                "operator is faster")

    def predict(self, shape: ChainShape, config: FusedChainConfig | UnfusedChainConfig, hw: Hardware) -> Plan:
        """An unfused configuration's plan from its two kernels' (valid on ``hw``, whether or
        not among the kernels' first plans the ranking pairs); a fused one's from the space."""
        if isinstance(config, UnfusedChainConfig):
            check_unfused_config(shape, config, hw)
            first, second = (predict_gemm(s, c, hw) for s, c in zip(gemm_shapes(shape), (config.gemm0, config.gemm1)))
            return combine(shape, first, second, hw)
        return super().predict(shape, config, hw)

    def apply(self, func: tirx.PrimFunc, config: FusedChainConfig | UnfusedChainConfig,
              hw: Hardware) -> s_tir.Schedule:
        if isinstance(config, UnfusedChainConfig):
            return schedule_unfused_chain(func, config, hw)
        return schedule_fused_chain(func, config, hw)
