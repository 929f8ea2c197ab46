"""tvm-dsm's lowering passes, in the order the tvm-dsm pipeline runs them."""

from .check_cluster import CheckClusterSchedule, check_function
from .cluster_launch import AttachClusterLaunch, attach_cluster_launch
from .lower_cluster import LowerCluster, lower_cluster_function

__all__ = [
    "AttachClusterLaunch",
    "CheckClusterSchedule",
    "LowerCluster",
    "attach_cluster_launch",
    "check_function",
    "lower_cluster_function",
]
