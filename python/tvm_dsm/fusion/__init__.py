"""RedFuser: fuse cascaded reductions into one incremental loop (see cascade.py for the method)."""

from .cascade import GroupReport, Level, analyze, find_cascades, prove

__all__ = ["GroupReport", "Level", "analyze", "find_cascades", "prove"]
