"""Elementwise functions: the schedule ``tvm_dsm.build`` gives them (the elementwise family's
16-byte vectors) beside dlight's, at the 1B and 8B Llamas' SwiGLU widths in prefill (512 and
32768 tokens) and decode (8 rows), and a cast."""

from __future__ import annotations

from ... import driver
from ...families.elementwise import CONFIGS
from ...rules.elementwise import schedule_elementwise
from ...workloads.elementwise import cast, split_silu_mul
from .base import Variant, args_of, nbytes_of, ours_and_dlight

#: (workload, rows, width): the SwiGLU's intermediate width, or the cast's row width.
SHAPES = [("split_silu_mul", rows, width) for rows in (8, 512, 32768) for width in (8192, 14336)]
SHAPES += [("cast", 4096, 32000)]


def elementwise() -> list[Variant]:
    return [variant for workload, rows, width in SHAPES
            for variant in ours_and_dlight(f"{workload}_{rows}x{width}", workload,
                                           split_silu_mul(rows, width) if workload == "split_silu_mul"
                                           else cast(rows, width),
                                           ("torch_eager", "torch_compile"), {"class": "elementwise"})]


def elementwise_configs() -> list[Variant]:
    """The decode-sized SwiGLU activations (8 rows) in every configuration of the family's space,
    beside the planner's pick: whether smaller CTAs over more SMs shorten a call that fills
    a fraction of the GPU."""
    variants = []
    for rows, width in ((8, 8192), (8, 14336), (1, 8192)):
        func = split_silu_mul(rows, width)
        args = args_of(func)
        schedules = [("tvm_dsm", driver.schedule(func).mod, {"planner": True})]
        schedules += [(f"t{c.threads}_v{c.vectors_per_thread}", schedule_elementwise(func, c).mod,
                       {"planner": False, "threads": c.threads, "vectors_per_thread": c.vectors_per_thread})
                      for c in CONFIGS]
        variants += [Variant(name=f"split_silu_mul_{rows}x{width}_{label}", workload="split_silu_mul", mod=mod,
                             args=args, bytes=nbytes_of(args), flops=0, plan=plan,
                             peers=("torch_eager", "torch_compile"), extra={"class": "elementwise"})
                     for label, mod, plan in schedules]
    return variants
