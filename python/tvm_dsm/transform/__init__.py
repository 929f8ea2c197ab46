"""tvm-dsm's lowering passes, in the order the tvm-dsm pipeline runs them."""

from .check_cluster import CheckClusterSchedule, check_function
from .cluster_launch import AttachClusterLaunch, attach_cluster_launch
from .fuse_cascaded_reductions import FuseCascadedReductions, fuse_cascaded_reductions
from .lower_cluster import LowerCluster, lower_cluster_function

__all__ = [
    "AttachClusterLaunch",
    "CheckClusterSchedule",
    "FuseCascadedReductions",
    "LowerCluster",
    "attach_cluster_launch",
    "check_function",
    "fuse_cascaded_reductions",
    "lower_cluster_function",
]
