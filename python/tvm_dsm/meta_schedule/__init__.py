"""tvm-dsm's MetaSchedule plug-ins: schedule rules and space generators that emit the cluster/DSM
design spaces, cost models from the analytical model and learned on its plan's features, and
the tuning of a Relax model's tasks."""

from ..rules.split_k_reduction import candidate_configs
from .learned_cost_model import LearnedPlanModel, plan_xgb_model
from .plan_features import FEATURE_NAMES, PlanFeatureExtractor, plan_features
from .planned_space import PlanCostModel, PlannedSearch, PlannedSpace
from .relax_tuning import tune_relax, tuning_contexts
from .split_k_reduction import AnalyticalCostModel, SplitKReductionRule

__all__ = ["AnalyticalCostModel", "FEATURE_NAMES", "LearnedPlanModel", "PlanCostModel", "PlanFeatureExtractor",
           "PlannedSearch", "PlannedSpace", "SplitKReductionRule", "candidate_configs", "plan_features", "plan_xgb_model",
           "tune_relax", "tuning_contexts"]
