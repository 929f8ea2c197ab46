"""Elementwise and injective functions streamed at HBM speed, 16 bytes per thread access
(:mod:`tvm_dsm.rules.elementwise`; through registers where a condition differs between lanes);
one whose accesses cannot move in vectors is left to dlight (its fallback is the same kernel one
element a thread; its transpose rule tiles).

The model is a roofline: every operand read and every output written once at HBM bandwidth, at
the share of the SMs the grid fills, plus a launch. It cannot tell the configurations of a
filled machine apart; more vectors per thread come first where the grid fills it many times
over (more bytes in flight per thread, fewer CTAs to schedule).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tvm import relax, s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import loads, root_blocks
from ..rules.elementwise import ElementwiseConfig, find_elementwise, schedule_elementwise
from ..transform.buffers import buffer_bytes, element_bytes
from .base import ScheduleFamily
from .kernel_plan import KernelPlan, default_first, roofline

#: The configurations ranked (smaller CTAs spread a few rows' elements over more SMs).
CONFIGS = tuple(ElementwiseConfig(threads, vectors) for threads in (64, 128, 256, 512) for vectors in (1, 2, 4))
#: Waves of 256-thread CTAs past which four vectors per thread come first; below one, CTAs of
#: 128 threads spread the elements over twice the SMs (H200, ``archive/elementwise_configs.json``:
#: a SwiGLU product of 8 x 8192, 1.5 us against 1.7; 1 x 8192, 1.4 against 1.5).
_MANY_WAVES = 8


@dataclass(frozen=True)
class ElementwiseShape:
    """The bytes the function reads and writes, its output elements and vector lanes."""

    bytes: int
    elements: int
    lanes: int


def _loads_per_element(func: tirx.PrimFunc) -> dict:
    """How many loads of each parameter one element of the function's blocks makes (the most
    over its blocks; every block's elements are at most the outputs')."""
    found: dict = {}
    for block in root_blocks(func):
        counts: dict = {}
        for load in loads(block.body):
            param = next((p for p in func.params if load.source.same_as(p)), None)
            if param is not None:
                counts[param] = counts.get(param, 0) + 1
        for param, n in counts.items():
            found[param] = max(found.get(param, 0), n)
    return found


def _constant(buffer) -> bool:
    return all(isinstance(d, tirx.IntImm) for d in buffer.ty.shape)


class Elementwise(ScheduleFamily):
    name = "elementwise"
    generic = True
    symbolic_rows = True  # the grid covers any element count, the tail predicated
    symbolic_extents = True  # so it does over several variables (a batch and a sequence length)

    def recognize(self, func: tirx.PrimFunc) -> ElementwiseShape:
        if relax.analysis.has_reshape_pattern(func):  # Relax's lowering finds the pattern in dlight's schedule
            raise ClusterError("a reshape: Relax makes it a view of its input, no kernel")
        lanes, written = find_elementwise(func)
        if lanes == 1:  # one element a thread is dlight's fallback; its transpose rule tiles
            raise ClusterError("an access does not move contiguously along the innermost loop "
                               "(rules.elementwise.vector_lanes): left to dlight")
        params = [p for p in func.params if hasattr(p.ty, "shape") and _constant(p)]
        outputs = [p for p in params if any(w.same_as(p) for w in written)]
        elements = sum(math.prod(int(d) for d in p.ty.shape) for p in outputs)
        read = _loads_per_element(func)
        # an input is read whole at most, and at most its loads a written element (a gather
        # reads the rows it takes, not the table)
        return ElementwiseShape(sum(buffer_bytes(p) if p in outputs else min(
            buffer_bytes(p), elements * read.get(p, 0) * element_bytes(p)) for p in params),
            elements, lanes)

    def predict(self, shape: ElementwiseShape, config: ElementwiseConfig, hw: Hardware) -> KernelPlan:
        ctas = math.ceil(shape.elements / shape.lanes / (config.threads * config.vectors_per_thread))
        return roofline(config, {"hbm": shape.bytes}, {}, hw, busy=ctas / hw.sm_count)

    def rank(self, shape: ElementwiseShape, hw: Hardware) -> list[KernelPlan]:
        waves = shape.elements / shape.lanes / (256 * hw.sm_count)
        default = ElementwiseConfig(128 if waves < 1 else 256, 4 if waves > _MANY_WAVES else 1)
        return default_first([self.predict(shape, c, hw) for c in CONFIGS], default)

    def apply(self, func: tirx.PrimFunc, config: ElementwiseConfig, hw: Hardware) -> s_tir.Schedule:
        return schedule_elementwise(func, config)

