"""A few rows times a packed (weight-quantized) matrix, dequantized inside the product
(:mod:`tvm_dsm.rules.packed_gemv`): a decode step of a 4-bit model.

The model is a roofline: every tensor read once at HBM bandwidth, at the share of the SMs the
grid fills, against the dequantizing arithmetic (:data:`OPERATIONS_PER_VALUE` fp32 operations a
weight, once for all rows) and each row's multiply-add on the CUDA cores, plus a launch. The
rule's default comes first.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..hardware import Hardware
from ..rules.packed_gemv import (PackedGemv, PackedGemvConfig, candidate_configs, find_packed_gemv,
                                 schedule_packed_gemv)
from ..transform.buffers import buffer_bytes
from .base import ScheduleFamily
from .kernel_plan import KernelPlan, default_first, roofline

#: fp32 operations a weight costs: the unpacking shift and mask, the subtraction of the offset,
#: the scale and the multiply-add (each counted twice: the rate is of FMAs as two)
OPERATIONS_PER_VALUE = 2 * 5


class PackedGemvFamily(ScheduleFamily):
    name = "packed_gemv"

    def recognize(self, func: tirx.PrimFunc) -> PackedGemv:
        return find_packed_gemv(func)

    def predict(self, found: PackedGemv, config: PackedGemvConfig, hw: Hardware) -> KernelPlan:
        ctas = found.n // (config.rows_per_cta * config.columns)
        operations = (OPERATIONS_PER_VALUE + 2 * (found.rows - 1)) * found.n * found.k
        return roofline(config, {"hbm": sum(buffer_bytes(p) for p in found.func.params)},
                        {"fp32": operations}, hw, busy=ctas / hw.sm_count)

    def rank(self, found: PackedGemv, hw: Hardware) -> list[KernelPlan]:
        configs = candidate_configs(found)
        return default_first([self.predict(found, c, hw) for c in configs], configs[0])

    def apply(self, func: tirx.PrimFunc, config: PackedGemvConfig, hw: Hardware) -> s_tir.Schedule:
        return schedule_packed_gemv(find_packed_gemv(func), config)
