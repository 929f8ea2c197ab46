"""A few rows of a matmul over a weight stored ``[K, N]`` (a decode batch; fp32, fp16 or bf16)
as a GEMV streaming W at HBM speed (:mod:`tvm_dsm.rules.column_gemv`), where the tensor-core
GEMM's tiles would compute rows of padding and the CUDA-core GEMM tile W for reuse a few rows
cannot give.

The model is a roofline: W, x and the epilogue's operands read once and the rows written once at
HBM bandwidth, the multiply-adds at the CUDA cores' fp32 rate, each at the share of the SMs the
grid fills, plus a launch. It cannot tell configurations of a filled machine apart; the rule's
default (:func:`~tvm_dsm.rules.column_gemv.default_config`) comes first.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..hardware import Hardware
from ..rules.column_gemv import (ColumnGemvConfig, candidate_configs, default_config, find_column_gemv,
                                 ctas, schedule_column_gemv)
from ..rules.row_gemv import Gemv
from ..transform.buffers import buffer_bytes
from .base import ScheduleFamily
from .kernel_plan import KernelPlan, default_first, roofline


class ColumnGemvFamily(ScheduleFamily):
    name = "column_gemv"

    def recognize(self, func: tirx.PrimFunc) -> Gemv:
        return find_column_gemv(func)

    def predict(self, found: Gemv, config: ColumnGemvConfig, hw: Hardware) -> KernelPlan:
        flops = 2 * found.rows * found.n * found.k * len(found.reductions)
        return roofline(config, {"hbm": sum(buffer_bytes(p) for p in found.func.params)}, {"fp32": flops}, hw,
                        busy=ctas(found, config) / hw.sm_count)

    def rank(self, found: Gemv, hw: Hardware) -> list[KernelPlan]:
        default = default_config(found)
        return default_first([self.predict(found, c, hw) for c in candidate_configs(found)], default)

    def apply(self, func: tirx.PrimFunc, config: ColumnGemvConfig, hw: Hardware) -> s_tir.Schedule:
        return schedule_column_gemv(find_column_gemv(func), config)
