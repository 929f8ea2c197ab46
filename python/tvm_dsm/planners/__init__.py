"""Planners: rank a schedule family's configurations with the analytical model, no measurement."""

from .split_k import SplitKPlan, plan_split_k_reduction

__all__ = ["SplitKPlan", "plan_split_k_reduction"]
