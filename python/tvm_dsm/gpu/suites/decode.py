"""Decode attention fused by FuseCascadedReductions."""

from __future__ import annotations

import itertools
from ...errors import ClusterError
from ...planners.cascade_split import plan_cascade_split
from ...rules.fused_rows import schedule_fused_rows
from ...transform.cascaded_reductions import fuse_cascaded_reductions
from ...workloads import cascades as cascade_workloads
from .base import Variant, args_of, nbytes_of


#: Decode attention (rows = batch x heads, cached keys, head dim): 32 heads of one sequence
#: with a long cache, 8 and 32 sequences with shorter ones, a 64-wide head.
DECODE_SHAPES = [(32, 16384, 128), (256, 4096, 128), (1024, 1024, 128), (64, 8192, 64)]


def decode() -> list[Variant]:
    """Decode attention fused by FuseCascadedReductions: scores computed per key inside the
    loop (an element producer), each part ``lanes`` = dim/8 threads (one 16-byte slice of each
    K and V row per thread) or dim/16 (two slices: half the shuffles per key), ``groups`` parts
    per CTA, the row's parts spread over a cluster of ``ranks`` CTAs whose last partials meet
    through DSM (split-KV, merged in fp32 by the cascade's rule); ``planner`` in the plan marks
    the split tvm_dsm's planner picks."""
    plans = decode_plans()
    return [v for shape, ranks, groups, vector, key_slices in itertools.product(
                DECODE_SHAPES, (1, 2, 4, 8, 16), (8, 16, 32, 64), (2, 4, 8, 16), (1, 2))
            for v in decode_variant(shape, ranks, groups, vector, dim_lanes(shape) // key_slices, 0, plans)]


def dim_lanes(shape: tuple) -> int:
    """Lanes per key of a decode shape: one 16-byte slice of the fp16 head per lane."""
    return shape[2] // 8


def decode_plans() -> dict:
    return {shape: plan_cascade_split(cascade_workloads.decode_attention(*shape)) for shape in DECODE_SHAPES}


def decode_variant(shape: tuple, ranks: int, groups: int, vector: int, lanes: int, copy_stages: int,
                    plans: dict) -> list[Variant]:
    """The decode kernel of one split ([] where it does not divide or does not build)."""
    rows, keys, dim = shape
    if keys % (ranks * groups * vector) or groups * lanes < 32:
        return []
    func = cascade_workloads.decode_attention(rows, keys, dim)
    plan = plans[shape]
    fused, reports = fuse_cascaded_reductions(func, parts=groups * ranks, vector=vector, lanes=lanes,
                                              ranks=ranks, shuffle=True, copy_stages=copy_stages)
    if not all(r.fusible for r in reports):
        raise ValueError(f"decode {rows}x{keys}x{dim}: {[str(r) for r in reports]}")
    name = (f"decode_{rows}x{keys}x{dim}_c{ranks}_g{groups}_v{vector}"
            + (f"_l{lanes}" if lanes != dim_lanes(shape) else "")
            + (f"_s{copy_stages}" if copy_stages else ""))
    try:
        mod = schedule_fused_rows(fused).mod
    except ClusterError as err:  # e.g. too many partial states for a cluster merge
        print(f"{name}: refused: {err}")
        return []
    args = args_of(func)
    return [Variant(
        name=name,
        workload="decode_attention",
        mod=mod,
        args=args,
        bytes=nbytes_of(args),
        flops=4 * rows * keys * dim,
        plan={"ranks": ranks, "groups": groups, "lanes": lanes, "vector": vector,
              "copy_stages": copy_stages,
              "planner": (plan.ranks, plan.parts, plan.vector, plan.lanes, plan.copy_stages)
              == (ranks, groups * ranks, vector, lanes, copy_stages)},
        peers=("torch_eager", "torch_compile", "torch_sdpa"),
    )]


#: Decode (ranks, groups, vector) measured fastest on some shape (decode.json, decode_wide.json).
_DECODE_FASTEST = ((4, 8, 16), (2, 32, 8), (4, 16, 8), (4, 16, 4), (1, 32, 8), (2, 64, 4))


def decode_picks() -> list[Variant]:
    """Decode attention, per shape the planner's split and the splits in ``_DECODE_FASTEST``
    (the ``decode`` sweep's contenders worth re-measuring, without building the sweep)."""
    plans = decode_plans()
    variants = []
    for shape in DECODE_SHAPES:
        plan = plans[shape]
        splits = {(plan.ranks, plan.parts // plan.ranks, plan.vector), *_DECODE_FASTEST}
        for ranks, groups, vector in sorted(splits):
            variants += decode_variant(shape, ranks, groups, vector, dim_lanes(shape), 0, plans)
    return variants
