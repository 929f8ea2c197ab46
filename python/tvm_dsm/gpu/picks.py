"""One pick per kernel family, built without building whole suites.

``timing_picks()``: the planner's picks (the names of bench/results/*.json) that the
compile-path comparison (:mod:`tvm_dsm.gpu.compile_paths`) times. ``sanitizer_picks()``: the same
kernels on smaller shapes where the shape is free (compute-sanitizer's racecheck is slow), and
the collectives at cluster sizes 2, 4, 8 and 16 (:mod:`tvm_dsm.gpu.sanitize`).
``python -m tvm_dsm.gpu.picks {timing,sanitizer,tutorials} [--out .gpu/kernels]`` exports them like
:mod:`tvm_dsm.gpu.export` (one library, its CUDA source and a manifest row per kernel).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..hardware import load_hardware
from ..planners.cascade_split import plan_cascade_split
from ..planners.gemm_row_max import plan_gemm_row_max, row_max_shape
from ..planners.split_k_gemm import plan_split_k_gemm
from ..kernels.attention import default_config, find_attention, fuse_attention
from ..rules.gemm_row_max import schedule_gemm_row_max
from ..rules.split_k_gemm import GemmShape
from ..workloads import cascades as cascade_workloads
from ..workloads.lm_head import lm_head_max
from .suites.base import Variant, args_of, nbytes_of
from .suites.cascades import cascade_variants
from .suites.chains import chain_variants
from .suites.decode import decode_variant, dim_lanes
from .suites.gemm import gemm_variant
from .suites.reductions import TILE as COLLECTIVE_TILE
from .suites.reductions import collective_variant


def _family(variant: Variant, family: str) -> Variant:
    variant.extra = {**variant.extra, "family": family}
    return variant


def gemm_pick(label: str, m: int, n: int, k: int) -> Variant:
    plan = plan_split_k_gemm(GemmShape(m, n, k, True), load_hardware())[0]
    return _family(gemm_variant(label, m, n, k, plan.config, 0, plan.predicted_us), "split_k_gemm")


def chain_pick(label: str, m: int = 128, unfused: bool | None = None) -> Variant:
    """The chain family's pick for ``label`` (fused or unfused, whichever the planner ranks
    first); with ``unfused`` set, the best of that kind."""
    variants = chain_variants(label, m, 0, load_hardware())
    if unfused is None:
        chosen = next(v for v in variants if v.plan["pick"])
    else:
        chosen = next(v for v in variants if bool(v.plan.get("unfused")) == unfused
                      and not v.plan.get("smem_only"))
    family = "unfused_chain" if chosen.plan.get("unfused") else "fused_chain"
    return _family(chosen, family)


def attention_pick(heads: int, q_len: int, kv_len: int, dim: int, causal: bool) -> Variant:
    func = cascade_workloads.attention(heads, q_len, kv_len, dim, causal)
    config = default_config(find_attention(func))
    args = args_of(func)
    return Variant(
        name=f"attention_{heads}x{q_len}x{kv_len}x{dim}{'_causal' if causal else ''}"
        f"_m{config.block_m}n{config.block_n}" + (f"_w{config.warpgroups}" if config.warpgroups > 1 else ""),
        workload="attention", mod=fuse_attention(func, config), args=args, bytes=nbytes_of(args),
        flops=4 * heads * q_len * kv_len * dim // (2 if causal else 1),
        plan={**vars(config), "planner": True}, peers=("torch_eager",),
        reference_kwargs={"causal": True} if causal else {},
        extra={"causal": causal, "family": "attention"})


def decode_pick(shape: tuple, split: tuple | None = None) -> Variant:
    """The planner's decode split for ``shape`` (rows, keys, dim), or ``split`` = (ranks,
    groups, vector)."""
    plans = {shape: plan_cascade_split(cascade_workloads.decode_attention(*shape))}
    plan = plans[shape]
    ranks, groups, vector = split or (plan.ranks, plan.parts // plan.ranks, plan.vector)
    (variant,) = decode_variant(shape, ranks, groups, vector, dim_lanes(shape), 0, plans)
    return _family(variant, "decode")


def cascade_pick(name: str, size: tuple) -> Variant:
    """The cascade's own pick: its planned split (``_plan``) or its own kernel."""
    variants = cascade_variants(name, size, (32,), (1,))
    chosen = next(v for v in variants if v.name.endswith("_plan") and v.plan.get("planner", True))
    return _family(chosen, "fused_cascade")


def lm_head_pick(batch: int, seq: int, hidden: int, vocab: int) -> Variant:
    func = lm_head_max(batch, seq, hidden, vocab)
    args = args_of(func)
    args[1]["scale"] = hidden ** -0.5
    plan = plan_gemm_row_max(row_max_shape(func))[0]
    c = plan.config
    return Variant(
        name=f"lm_head_{batch}x{seq}x{hidden}x{vocab}_{c.block_m}x{c.block_n}x{c.block_k}_s{c.stages}"
        f"{'_tma' if c.tma else ''}{'_wgmma' if c.wgmma else ''}",
        workload="lm_head_max", mod=schedule_gemm_row_max(func, c, load_hardware()).mod, args=args,
        bytes=nbytes_of(args), flops=2 * batch * seq * hidden * vocab,
        plan={**vars(c), "planner": True, "predicted_us": plan.predicted_us},
        reference_kwargs={"seq": seq}, extra={"family": "lm_head_row_max"})


def collective_pick(kind: str, size: int, bulk: bool = False, dtype: str = "float32",
                    clusters: int | None = None) -> Variant:
    clusters = clusters or 2 * load_hardware().sm_count // size
    elem = {"float32": 4, "float16": 2}[dtype]
    return _family(collective_variant(kind, bulk, False, clusters, size, COLLECTIVE_TILE, dtype, elem), "collective")


def timing_picks() -> list[Variant]:
    return [
        gemm_pick("G8a", 128, 8192, 2048),  # c2, TMA + wgmma
        gemm_pick("G4b", 128, 768, 3072),  # c8
        chain_pick("G2"),  # fused (DSM) pick (the family pick)
        chain_pick("G3", unfused=False),  # the best fused (DSM) plan
        chain_pick("G8"),  # unfused pick
        chain_pick("G4"),  # unfused pick
        attention_pick(2048, 512, 512, 64, False),
        attention_pick(2048, 512, 512, 64, True),
        attention_pick(256, 1024, 1024, 128, False),
        attention_pick(256, 1024, 1024, 128, True),
        decode_pick((32, 16384, 128)),
        decode_pick((256, 4096, 128)),
        cascade_pick("softmax_stats", (4096, 4096)),
        cascade_pick("moe_routing", (16384, 256, 8)),
        lm_head_pick(1, 128, 768, 30528),
        lm_head_pick(4, 128, 768, 30528),
        collective_pick("reduce_scatter", 4),
        collective_pick("all_exchange", 8, dtype="float16"),
    ]


def sanitizer_picks() -> list[Variant]:
    """Small shapes (few CTAs) of each family's pick; collectives at clusters of 2-16."""
    return [
        gemm_pick("G4a", 128, 3072, 768),  # c2
        gemm_pick("G4b", 128, 768, 3072),  # c8
        chain_pick("G2"),  # fused DSM chain, c2
        chain_pick("G4", unfused=True),  # unfused chain (two split-K GEMMs)
        chain_pick("G4", unfused=False),  # the best fused DSM plan of the same chain
        attention_pick(16, 512, 512, 64, False),
        attention_pick(16, 512, 512, 64, True),
        attention_pick(8, 512, 512, 128, False),
        decode_pick((8, 4096, 128), (4, 16, 8)),  # cluster 4 split-KV
        decode_pick((8, 4096, 128), (1, 8, 8)),
        cascade_pick("softmax_stats", (256, 4096)),
        cascade_pick("moe_routing", (1024, 256, 8)),
        lm_head_pick(1, 128, 768, 4096),
        *[collective_pick("reduce_scatter", s, clusters=2) for s in (2, 4, 8, 16)],
        collective_pick("all_exchange", 16, clusters=2),
        collective_pick("reduce_scatter", 4, bulk=True, clusters=2),
        # The other cp.async.bulk (DSM bulk copy) collectives.
        collective_pick("reduce_scatter", 2, bulk=True, clusters=2),
        collective_pick("broadcast", 4, bulk=True, clusters=2),
        collective_pick("all_exchange_rs_ag", 8, bulk=True, clusters=2),
    ]


def tutorial_picks() -> list[Variant]:
    """The kernels the tutorials time: attention's (tutorials/attention.py) and G9's chain pick
    (tutorials/fused_ffn.py), so the runner's numbers can be set beside the tutorials'."""
    return [attention_pick(2048, 512, 512, 64, False), chain_pick("G9")]


PICKS = {"timing": timing_picks, "sanitizer": sanitizer_picks, "tutorials": tutorial_picks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=sorted(PICKS))
    parser.add_argument("--out", type=Path, default=Path(".gpu/kernels"))
    args = parser.parse_args()
    from .export import export_variants

    print("exported to", export_variants(f"picks_{args.which}", PICKS[args.which](), args.out))


if __name__ == "__main__":
    main()
