"""Workloads as ordinary TVM PrimFuncs, the way a user writes them."""

from .reductions import gemv, row_sum

__all__ = ["gemv", "row_sum"]
