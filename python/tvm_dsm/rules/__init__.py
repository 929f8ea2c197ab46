"""Schedule rules: one schedule family per module, in the style of tvm.s_tir.dlight."""

from .split_k_reduction import SplitKReductionConfig, schedule_split_k_reduction

__all__ = ["SplitKReductionConfig", "schedule_split_k_reduction"]
