"""tvm-dsm's MetaSchedule plug-ins: schedule rules that emit the cluster/DSM design spaces as
trace decisions, and cost models from the analytical model."""

from ..rules.split_k_reduction import candidate_configs
from .split_k_reduction import AnalyticalCostModel, SplitKReductionRule

__all__ = ["AnalyticalCostModel", "SplitKReductionRule", "candidate_configs"]
