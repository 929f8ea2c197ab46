"""Injective functions whose transcendental math does not depend on one axis (rotary
embedding), their math computed once per thread for every element along it
(:mod:`tvm_dsm.rules.per_thread_math`).

The model is a roofline: every operand read and every output written once at HBM bandwidth, at
the share of the SMs the grid fills (a thread a point of the axes other than the in-thread
one), plus a launch. It cannot tell CTA sizes of a filled machine apart; 128 threads come first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import s_tir, tirx

from ..hardware import Hardware
from ..rules import per_thread_math as rule
from ..transform.buffers import buffer_bytes
from .base import ScheduleFamily
from .kernel_plan import KernelPlan, default_first, roofline

CONFIGS = tuple(rule.PerThreadMathConfig(threads) for threads in (64, 128, 256))


@dataclass(frozen=True)
class PerThreadMathShape:
    """What the rule found, the bytes the function reads and writes and its threads."""

    found: rule.PerThreadMath
    bytes: int
    threads: int


class PerThreadMath(ScheduleFamily):
    name = "per_thread_math"
    traced = False  # the function gets a block of its own before it is scheduled
    symbolic_rows = True  # the grid covers any row count, the tail predicated

    def recognize(self, func: tirx.PrimFunc) -> PerThreadMathShape:
        found = rule.find_per_thread_math(func)
        params = [p for p in func.params if hasattr(p.ty, "shape")]
        outputs = [p for p in params if all(isinstance(d, tirx.IntImm) for d in p.ty.shape)]
        elements = max(math.prod(int(d) for d in p.ty.shape) for p in outputs)
        return PerThreadMathShape(found, sum(buffer_bytes(p) for p in outputs), elements // found.extent)

    def predict(self, shape: PerThreadMathShape, config: rule.PerThreadMathConfig, hw: Hardware) -> KernelPlan:
        ctas = math.ceil(shape.threads / config.threads)
        return roofline(config, {"hbm": shape.bytes}, {}, {"hbm": hw.hbm_bw}, busy=ctas / hw.sm_count)

    def rank(self, shape: PerThreadMathShape, hw: Hardware) -> list[KernelPlan]:
        return default_first([self.predict(shape, c, hw) for c in CONFIGS], rule.PerThreadMathConfig())

    def apply(self, func: tirx.PrimFunc, config: rule.PerThreadMathConfig, hw: Hardware) -> s_tir.Schedule:
        return rule.schedule_per_thread_math(func, config)
