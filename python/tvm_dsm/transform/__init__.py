"""tvm-dsm's lowering passes, in the order the tvm-dsm pipeline runs them."""

import importlib

from .check_cluster import CheckClusterSchedule, check_function
from .cluster_launch import AttachClusterLaunch, attach_cluster_launch
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


def __getattr__(name: str):
    """The fusion pass loads on first use: it imports SymPy, and ``import tvm`` loads this
    package (tvm.backends entry point), which must stay cheap."""
    if name in ("FuseCascadedReductions", "fuse_cascaded_reductions"):
        module = importlib.import_module(f"{__name__}.cascaded_reductions")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
