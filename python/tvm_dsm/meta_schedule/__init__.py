"""tvm-dsm's MetaSchedule plug-ins: schedule rules and space generators that emit the cluster/DSM
design spaces, and cost models from the analytical model."""

from ..rules.split_k_reduction import candidate_configs
from .planned_space import PlanCostModel, PlannedSpace
from .split_k_reduction import AnalyticalCostModel, SplitKReductionRule

__all__ = ["AnalyticalCostModel", "PlanCostModel", "PlannedSpace", "SplitKReductionRule",
           "candidate_configs"]
