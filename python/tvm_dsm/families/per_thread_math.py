"""Injective functions whose transcendental math does not depend on one axis (rotary
embedding), their math computed once per thread for every element along it
(:mod:`tvm_dsm.rules.per_thread_math`).

The model is a roofline: every operand read and every output written once at HBM bandwidth, at
the share of the SMs the grid fills (a thread a point of the axes other than the in-thread
one and part of it), plus a launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware
from ..rules import per_thread_math as rule
from ..transform.buffers import buffer_bytes
from .base import ScheduleFamily
from .kernel_plan import KernelPlan, default_first, roofline

#: CTA sizes.
THREADS = (64, 128, 256)
#: Threads an SM keeps resident: a grid of fewer per SM leaves each thread's loads (one after
#: another along the in-thread axis) latency the other threads cannot hide.
RESIDENT_THREADS_PER_SM = 2048


@dataclass(frozen=True)
class PerThreadMathShape:
    """What the rule found, the bytes of the function's parameters (read or written once), and
    its threads where the in-thread axis is whole."""

    found: rule.PerThreadMath
    bytes: int
    threads: int


class PerThreadMath(ScheduleFamily):
    name = "per_thread_math"
    generic = True
    traced = False  # the function gets a block of its own before it is scheduled
    symbolic_rows = True  # the grid covers any row count, the tail predicated

    def recognize(self, func: tirx.PrimFunc) -> PerThreadMathShape:
        found = rule.find_per_thread_math(func)
        params = [p for p in func.params if hasattr(p.ty, "shape") and all(isinstance(d, tirx.IntImm) for d in p.ty.shape)]
        if not isinstance(found.points, int):
            raise ClusterError("per-thread math plans constant extents (a symbolic row count per range of rows)")
        return PerThreadMathShape(found, sum(buffer_bytes(p) for p in params), found.threads)

    def predict(self, shape: PerThreadMathShape, config: rule.PerThreadMathConfig, hw: Hardware) -> KernelPlan:
        ctas = math.ceil(shape.threads * config.parts / config.threads)
        return roofline(config, {"hbm": shape.bytes}, {}, hw, busy=ctas / hw.sm_count)

    def rank(self, shape: PerThreadMathShape, hw: Hardware) -> list[KernelPlan]:
        """Every CTA size and split of the in-thread axis; first, 128 threads and: where a thread
        moves elements one at a time, the fewest parts whose threads fill every SM's resident
        threads (each thread's loads along its part follow one another, so only threads hide
        their latency: measured on nn.llm's rotary embedding, the axis whole at 512 tokens took
        twice dlight's time, at 4096 half), else the most; where it moves 16-byte vectors, two
        elements of the axis a thread (the 1B Llama's rotary embedding, 48 heads: 9.8 us at 2048
        tokens against 12.6-27.6 with 4-48 heads a thread, 62.2 at 16384 against 63.7-84.6;
        H200, bench/results/archive/rope_parts_s73.json)."""
        extent = shape.found.extent
        parts = [p for p in range(1, extent + 1) if extent % p == 0]
        configs = [rule.PerThreadMathConfig(t, p) for t in THREADS for p in parts]
        if shape.found.lanes > 1:
            default = extent // 2 if extent % 2 == 0 else extent
        else:
            resident = RESIDENT_THREADS_PER_SM * hw.sm_count
            default = next((p for p in parts if shape.threads * p >= resident), parts[-1])
        return default_first([self.predict(shape, c, hw) for c in configs], rule.PerThreadMathConfig(128, default))

    def apply(self, func: tirx.PrimFunc, config: rule.PerThreadMathConfig, hw: Hardware) -> s_tir.Schedule:
        return rule.schedule_per_thread_math(func, config)
