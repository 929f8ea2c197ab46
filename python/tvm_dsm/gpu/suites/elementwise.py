"""Elementwise functions: the schedule ``tvm_dsm.build`` gives them (the elementwise family's
16-byte vectors) beside dlight's, at the 1B and 8B Llamas' SwiGLU widths in prefill (512 and
32768 tokens) and decode (8 rows), and a cast."""

from __future__ import annotations

from ...workloads.elementwise import cast, split_silu_mul
from .base import Variant, ours_and_dlight

#: (workload, rows, width): the SwiGLU's intermediate width, or the cast's row width.
SHAPES = [("split_silu_mul", rows, width) for rows in (8, 512, 32768) for width in (8192, 14336)]
SHAPES += [("cast", 4096, 32000)]


def elementwise() -> list[Variant]:
    return [variant for workload, rows, width in SHAPES
            for variant in ours_and_dlight(f"{workload}_{rows}x{width}", workload,
                                           split_silu_mul(rows, width) if workload == "split_silu_mul"
                                           else cast(rows, width),
                                           ("torch_eager", "torch_compile"), {"class": "elementwise"})]
