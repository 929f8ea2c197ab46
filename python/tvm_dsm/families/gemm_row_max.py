"""A GEMM whose output is reduced to a max over groups of rows in the same kernel (Sparton's LM
head: the logits are never written; :mod:`tvm_dsm.rules.gemm_row_max`)."""

from __future__ import annotations

from tvm import s_tir, tirx

from ..hardware import Hardware
from ..planners import split_k_gemm as gemm_model
from ..planners.gemm_row_max import RowMaxShape, plan_gemm_row_max, row_max_shape
from ..rules.gemm_row_max import schedule_gemm_row_max
from ..rules.split_k_gemm import SplitKGemmConfig
from .base import ScheduleFamily


class GemmRowMax(ScheduleFamily):
    name = "gemm_row_max"

    def recognize(self, func: tirx.PrimFunc) -> RowMaxShape:
        return row_max_shape(func)

    def predict(self, shape: RowMaxShape, config: SplitKGemmConfig, hw: Hardware) -> gemm_model.GemmPlan:
        return gemm_model.predict(shape.gemm, config, hw)

    def rank(self, shape: RowMaxShape, hw: Hardware) -> list[gemm_model.GemmPlan]:
        return plan_gemm_row_max(shape, hw)

    def apply(self, func: tirx.PrimFunc, config: SplitKGemmConfig, hw: Hardware) -> s_tir.Schedule:
        return schedule_gemm_row_max(func, config, hw)
