"""One or two rows of a matmul (a decode batch of one or two), or one row of each of a batch of
products, as a GEMV streaming W at HBM speed
(:mod:`tvm_dsm.rules.row_gemv`), where the split-K GEMM family's 16-row tensor-core tile would
compute 15 or 14 rows for nothing (it refuses M = 1), and its clusters' reduction costs a GEMV
more than the product.

The model is a roofline: W, x and the epilogue's operands read once and the row written once at
HBM bandwidth, at the share of the SMs the grid fills, plus a launch. It cannot tell the
configurations of a filled machine apart; the rule's measured default comes first.
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..hardware import Hardware
from ..rules.row_gemv import (Gemv, RowGemvConfig, candidate_configs, default_config, find_row_gemv,
                              schedule_row_gemv)
from ..transform.buffers import buffer_bytes
from .base import ScheduleFamily
from .kernel_plan import KernelPlan, default_first, roofline


class RowGemvFamily(ScheduleFamily):
    name = "row_gemv"

    def recognize(self, func: tirx.PrimFunc) -> Gemv:
        return find_row_gemv(func)

    def predict(self, found: Gemv, config: RowGemvConfig, hw: Hardware) -> KernelPlan:
        return roofline(config, {"hbm": sum(buffer_bytes(p) for p in found.func.params)}, {}, hw,
                        busy=found.batch * found.n // config.rows_per_cta / hw.sm_count)

    def rank(self, found: Gemv, hw: Hardware) -> list[KernelPlan]:
        default = default_config(found)
        return default_first([self.predict(found, c, hw) for c in candidate_configs(found, default)], default)

    def apply(self, func: tirx.PrimFunc, config: RowGemvConfig, hw: Hardware) -> s_tir.Schedule:
        return schedule_row_gemv(find_row_gemv(func), config)
