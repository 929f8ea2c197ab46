"""GEMM chains (FFN, SwiGLU) fused and unfused, and convolution chains."""

from __future__ import annotations

import itertools
import random
import tvm
from tvm import s_tir
from ...driver import H100, plan as plan_function
from ...hardware import load_hardware
from ...errors import ClusterError
from ...planners.fused_chain import plan_chain, schedule_chain
from ...rules.unfused_chain import UnfusedChainConfig, schedule_unfused_chain
from ...rules.fused_chain import find_chain
from ...workloads.chains import CONV_CHAINS, conv_chain, gemm_chain, swiglu_ffn
from .base import CHAINS, SWIGLUS, Variant, args_of, nbytes_of
from .gemm import gemm_tag




#: Workloads whose model check measures a random sample of the pruned space.
_MODEL_CHECK = {"G4": 30, "G7": 30, "G9": 30, "S8": 30}


def chains(m: int = 128) -> list[Variant]:
    """Fused GEMM chains and SwiGLU FFNs: the planner's top 3 per workload, and a random sample
    of valid configurations on four workloads (predicted vs measured rank)."""
    hw = load_hardware()
    return [v for label in {**CHAINS, **SWIGLUS} for v in chain_variants(label, m, _MODEL_CHECK.get(label, 0), hw)]


#: The M sweep of the chain issue: other batch sizes on one FFN of each size class.
_M_SWEEP = {"labels": ("G4", "G8", "S3"), "m": (16, 64, 256, 1024)}


def chains_m() -> list[Variant]:
    """The planner's top 3 for G4, G8 and S3 at M = 16, 64, 256, 1024."""
    hw = load_hardware()
    return [v for m in _M_SWEEP["m"] for label in _M_SWEEP["labels"] for v in chain_variants(label, m, 0, hw)]


def chain_workload(label: str, m: int):
    """(the chain's PrimFunc, its shape, its argument specs) for a CHAINS/SWIGLUS label."""
    n, k, l = {**CHAINS, **SWIGLUS}[label]
    func = swiglu_ffn(m, n, k, l) if label.startswith("S") else gemm_chain(m, n, k, l, "relu")
    args = args_of(func)
    for a in args[1:-1]:  # weights, initialized like torch.nn.Linear
        a["scale"] = a["shape"][1] ** -0.5
    return func, find_chain(s_tir.Schedule(func))[1], args


def chain_variant(label: str, shape, func, args, plan, rank, hw, pick: bool = False) -> Variant:
    """One fused-chain kernel of ``shape``; ``rank``: the plan's place in the planner's order
    of fused plans, or "smem"; ``pick``: the chain family's choice (tvm_dsm.plan's best)."""
    c, m, n, k, l = plan.config, shape.m, shape.n, shape.k, shape.l
    smem = rank == "smem"
    return Variant(
        name=f"{label}_m{m}_{'smem' if smem else 'c'}{c.cluster_size}_{c.block_m}x{c.block_n}x{c.block_k}"
        f"_n{c.n_steps}_w{c.warps_m}x{c.warps_n}_s{c.stages}{'_tma' if c.tma else ''}"
        f"{'' if c.reduce == 'kernel' else '_' + c.reduce}",
        workload="swiglu" if shape.gated else "gemm_chain_relu",
        mod=schedule_chain(func, hw, c)[0].mod,
        args=args,
        bytes=nbytes_of(args),
        flops=2 * m * n * (k * len(shape.gemm0) + l),
        plan={**vars(c), "plan_rank": None if smem else rank, "smem_only": smem,
              "predicted_us": plan.predicted_us, "pick": pick},
        extra={"shape": label, "m": m, "n": n, "k": k, "l": l},
    )


def _unfused_chain_variant(label: str, shape, func, args, plan, rank: int, pick: bool) -> Variant:
    """The chain as two split-K GEMM kernels (``_unfused_`` in the name); ``rank``: the plan's
    place among the unfused plans."""
    first, second = plan.config.gemm0, plan.config.gemm1
    m, n, k, l = shape.m, shape.n, shape.k, shape.l
    return Variant(
        name=f"{label}_m{m}_unfused_{gemm_tag(first)}_then_{gemm_tag(second)}",
        workload="swiglu" if shape.gated else "gemm_chain_relu",
        mod=schedule_unfused_chain(func, plan.config, load_hardware()).mod,
        args=args,
        bytes=nbytes_of(args),
        flops=2 * m * n * (k * len(shape.gemm0) + l),
        plan={"gemm0": vars(first), "gemm1": vars(second), "unfused": True, "unfused_rank": rank,
              "plan_rank": None, "smem_only": False, "predicted_us": plan.predicted_us,
              "pick": pick},
        extra={"shape": label, "m": m, "n": n, "k": k, "l": l},
    )


def chain_variants(label: str, m: int, sample: int, hw) -> list[Variant]:
    """The planner's top 3 fused plans for one chain at batch ``m`` plus ``sample`` random valid
    fused configs, the best planned SMEM-only fusion (one-CTA clusters: ``_smem`` in the name)
    where one fits, and the top 2 unfused plans (split-K GEMMs). ``plan["pick"]`` marks the
    chain family's choice among all of them (:func:`tvm_dsm.plan`)."""
    func, shape, args = chain_workload(label, m)
    try:
        ranking = plan_function(func, hw).plans  # fused and unfused, the family's order
    except ClusterError as err:
        print(f"{label}: {err}")
        return []
    pick = ranking[0].config
    # Within each kind the family's order is the kind's own planner's order (DSM fused plans
    # apart from the SMEM-only ones, which the family ranks too).
    plans = [p for p in ranking if not isinstance(p.config, UnfusedChainConfig) and p.config.cluster_size > 1]
    ranked = [p for p in ranking if isinstance(p.config, UnfusedChainConfig)]
    unfused = ranked[:2]
    picked = {rank: plans[rank] for rank in range(min(3, len(plans)))}
    rng = random.Random(label)
    for rank in rng.sample(range(len(plans)), min(sample, len(plans))):
        picked.setdefault(rank, plans[rank])
    try:
        picked["smem"] = plan_chain(shape, hw, smem_only=True)[0]
    except ClusterError:
        pass  # the intermediate does not fit one CTA: the case DSM fusion exists for
    return ([chain_variant(label, shape, func, args, plan, rank, hw, plan.config == pick)
             for rank, plan in picked.items()]
            + [_unfused_chain_variant(label, shape, func, args, plan, rank, plan.config == pick)
               for rank, plan in enumerate(unfused)])


def conv_chains() -> list[Variant]:
    """FlashFuser's conv chains C1-C8 (tvm_dsm.rules.conv_chain) at batch 1 and 8: the top 3
    plans and the best of the other kind (fused or unfused) than the pick, each that lowers (a
    refused chain or plan is logged and left out)."""
    hw = load_hardware()
    variants = []
    for (label, (ic, size, oc1, oc2, k1, k2)), batch in itertools.product(CONV_CHAINS.items(), (1, 8)):
        func = conv_chain(ic, size, oc1, oc2, k1, k2, batch)
        args = args_of(func)
        for a in args[1:-1]:  # weights, initialized like torch.nn.Conv2d
            a["scale"] = (a["shape"][1] * a["shape"][2] * a["shape"][3]) ** -0.5
        try:
            ranking = plan_function(func, hw)
        except ClusterError as err:
            print(f"{label} batch {batch}: refused: {err}")
            continue
        kind = type(ranking.best.config.chain)
        other = next((r for r, p in enumerate(ranking.plans) if type(p.config.chain) is not kind), None)
        for rank in sorted({r for r in (0, 1, 2, other) if r is not None and r < len(ranking.plans)}):
            plan = ranking.plans[rank]
            try:
                mod = ranking.schedule(rank).mod
                tvm.compile(mod, target=tvm.target.Target(H100))  # what does not lower is logged
            except Exception as err:  # noqa: BLE001 - recorded: what did not lower
                print(f"{label} batch {batch} plan {rank}: does not lower: {str(err).splitlines()[0][:200]}")
                continue
            pixels = batch * size * size
            variants.append(Variant(
                name=f"{label}_b{batch}_r{rank}", workload="conv_chain_relu", mod=mod, args=args,
                bytes=nbytes_of(args), flops=2 * pixels * oc1 * (k1 * k1 * ic + oc2),
                plan={"plan_rank": rank, "predicted_us": plan.predicted_us, "summary": plan.summary(),
                      "fused": not isinstance(plan.config.chain, UnfusedChainConfig)},
                reference_kwargs={"k1": k1}))
    return variants
