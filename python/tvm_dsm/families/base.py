"""What a schedule family is: the one interface the driver, MetaSchedule and Relax see.

A family is to tvm-dsm what a rule is to ``tvm.s_tir.dlight``: it recognizes its operation in a
PrimFunc by meaning and returns the shape its planner needs (``match``, None to say no), lists
its valid configurations (``space``), predicts bytes and time per memory level for one
(``predict``), ranks them (``rank``) and schedules one (``apply``), each for the GPU a
:class:`~tvm_dsm.hardware.Hardware` describes. Adding or changing a family touches its own
module only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from tvm import s_tir, tirx

from tvm.s_tir.schedule.schedule import ScheduleError

from ..errors import ClusterError
from ..hardware import Hardware
from ..planners.report import Plan


class ScheduleFamily(ABC):
    """One schedule family. Subclasses set ``name`` and implement ``recognize``, ``rank`` and
    ``apply``; those with a separate configuration space and model also ``space`` and
    ``predict``.

    ``traced``: its schedules are traces of the user's function, which MetaSchedule can record
    and replay; a family that generates its kernel (a rewrite or a template) is recorded as the
    function marked with its configuration, and tvm-dsm's pipeline writes the kernel when it
    builds it (:mod:`tvm_dsm.transform.generate_kernels`). ``symbolic_rows``: its schedules take a function whose
    row count is a variable, planned for a known one (:mod:`tvm_dsm.families.row_ranges`).
    """

    name: str = ""
    traced: bool = True
    #: ``apply`` takes a function whose row count is a variable (:mod:`.row_ranges`).
    symbolic_rows: bool = False
    #: ``apply`` takes a function with several extent variables (:mod:`.row_ranges`).
    symbolic_extents: bool = False
    #: It takes any function of a broad form (any cascade, any reduction, any elementwise
    #: function) on a model of bytes alone, no compute: the driver compares the predictions of
    #: the other families that take a function, and uses a generic one only where none does.
    generic: bool = False

    @abstractmethod
    def recognize(self, func: tirx.PrimFunc) -> Any:
        """The shape the planner needs, or :class:`ClusterError` saying what ``func`` lacks."""

    def match(self, func: tirx.PrimFunc) -> Any | None:
        """The shape of ``func`` if this family takes it, else None."""
        try:
            return self.recognize(func)
        except (ClusterError, ScheduleError):
            return None

    @abstractmethod
    def rank(self, shape: Any, hw: Hardware) -> list[Plan]:
        """Every valid configuration's plan, best predicted first; ClusterError if none fits."""

    def space(self, shape: Any, hw: Hardware) -> list[Any]:
        """The valid configurations left after pruning."""
        return [plan.config for plan in self.rank(shape, hw)]

    def predict(self, shape: Any, config: Any, hw: Hardware) -> Plan:
        """The plan (bytes and time per level) of one configuration of the space."""
        for plan in self.rank(shape, hw):
            if plan.config == config:
                return plan
        raise ClusterError(f"{config} is not a valid {self.name} configuration here")

    def declines(self, shape: Any, plans: list[Plan], hw: Hardware) -> str | None:
        """Why a function this family takes, and has ``plans`` for, is better scheduled another
        way (its operators apart), or None: the planner then leaves it, while the family's space
        (``rank``, ``space``: tuning, search-quality pools) keeps every plan."""
        return None

    def leaves_symbolic_rows(self, func: tirx.PrimFunc) -> str | None:
        """Why a function of a symbolic row count (``func``, of a family with ``symbolic_rows``)
        is better left to TVM's stock schedules, or None where this family takes it."""
        return None

    def for_symbolic_rows(self, config: Any) -> Any:
        """The configuration nearest ``config`` whose kernel takes a symbolic row count (for a
        family with ``symbolic_rows``; ``config`` itself where it does)."""
        return config

    @abstractmethod
    def apply(self, func: tirx.PrimFunc, config: Any, hw: Hardware) -> s_tir.Schedule:
        """``func`` scheduled in ``config``, within the limits of the GPU ``hw`` describes."""

    def __repr__(self) -> str:
        return f"<schedule family {self.name}>"
