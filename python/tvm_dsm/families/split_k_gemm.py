"""A GEMM (``x @ w^T`` or ``x @ w`` with an elementwise epilogue, or a batch of them) whose K is split over the CTAs
of a cluster, partial sums reduced through DSM (:mod:`tvm_dsm.rules.split_k_gemm`); M, N and K
need not be multiples of the tiles (``apply_padded_split_k_gemm``)."""

from __future__ import annotations

from tvm import s_tir, tirx

from ..hardware import Hardware
from ..planners import split_k_gemm as model
from ..rules.split_k_gemm import (SPLIT_K_TYPES, GemmShape, SplitKGemmConfig, check_rows_aligned, find_gemm,
                                  schedule_split_k_gemm)
from .base import ScheduleFamily


class SplitKGemm(ScheduleFamily):
    name = "split_k_gemm"
    symbolic_rows = True

    def recognize(self, func: tirx.PrimFunc) -> GemmShape:
        shape = find_gemm(s_tir.Schedule(func), SPLIT_K_TYPES, batched=True)[2]
        check_rows_aligned(shape)  # else the CUDA-core GEMM's (no configuration copies its rows)
        return shape

    def space(self, shape: GemmShape, hw: Hardware) -> list[SplitKGemmConfig]:
        return model.candidate_configs(shape, padded=True, hw=hw)

    def predict(self, shape: GemmShape, config: SplitKGemmConfig, hw: Hardware) -> model.GemmPlan:
        return model.predict(shape, config, hw)

    def rank(self, shape: GemmShape, hw: Hardware) -> list[model.GemmPlan]:
        return model.plan_split_k_gemm(shape, hw, padded=True)

    def apply(self, func: tirx.PrimFunc, config: SplitKGemmConfig, hw: Hardware) -> s_tir.Schedule:
        return schedule_split_k_gemm(func, config, hw)
