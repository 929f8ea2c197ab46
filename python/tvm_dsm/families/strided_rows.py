"""Reductions over an axis that is not the innermost, a thread per point of the other axes
(:mod:`tvm_dsm.rules.strided_rows`).

The model is a roofline: the function's parameters read or written once at HBM bandwidth, at
the share of the SMs the grid's CTAs occupy. Holding the row in registers ranks first where it
fits: the roofline does not see the passes that re-read it (from L1 or L2) without.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware
from ..rules import strided_rows as rule
from ..transform.buffers import buffer_bytes
from .base import ScheduleFamily
from .kernel_plan import KernelPlan, default_first, roofline

#: CTA sizes.
THREADS = (64, 128, 256)


class StridedRows(ScheduleFamily):
    name = "strided_rows"

    def recognize(self, func: tirx.PrimFunc) -> rule.StridedRows:
        return rule.find_strided_rows(func)

    def predict(self, found: rule.StridedRows, config: rule.StridedRowsConfig, hw: Hardware) -> KernelPlan:
        ctas = math.ceil(found.points / config.threads)
        params = [p for p in found.func.params if hasattr(p.ty, "shape")]
        return roofline(config, {"hbm": sum(buffer_bytes(p) for p in params)}, {}, hw, busy=ctas / hw.sm_count)

    def rank(self, found: rule.StridedRows, hw: Hardware) -> list[KernelPlan]:
        """Every CTA size, held or not (held only where the row fits :data:`~.rule.MAX_HELD_BYTES`);
        first, 128 threads holding the row where it fits. ClusterError where the points are too
        few to hide the latency of each thread's loads along its row."""
        if found.points < rule.MIN_POINTS_PER_SM * hw.sm_count:
            raise ClusterError(f"strided rows: {found.points} points, fewer than {rule.MIN_POINTS_PER_SM} an SM "
                               "(each thread's loads along its row follow one another)")
        fits = bool(found.held) and found.held_bytes <= rule.MAX_HELD_BYTES
        configs = [rule.StridedRowsConfig(t, held) for t in THREADS for held in ((True, False) if fits else (False,))]
        return default_first([self.predict(found, c, hw) for c in configs], rule.StridedRowsConfig(128, fits))

    def apply(self, func: tirx.PrimFunc, config: rule.StridedRowsConfig, hw: Hardware) -> s_tir.Schedule:
        return rule.schedule_strided_rows(rule.find_strided_rows(func), config)
