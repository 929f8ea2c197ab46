"""Which configuration of its schedule family a MetaSchedule candidate applies.

A :class:`~tvm_dsm.meta_schedule.PlannedSpace` schedule carries its configuration's fields as
JSON in a root-block annotation (``CONFIG_KEY``); the family and the shape are not stored but
found again from the tuning task's function (``TuneContext.mod``), since a shape can be a
function itself. Reading the annotation back needs example configurations of the family (one of
each configuration type its space holds: a chain's space has fused and unfused plans) to give
the fields their type (:mod:`tvm_dsm.families.configs`).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import s_tir

from ..annotations import CONFIG_KEY
from ..transform.generate_kernels import config_json, recorded_config


def annotate_config(sch: s_tir.Schedule, config: Any) -> None:
    """Record ``config`` (a dataclass) on the root block of ``sch``."""
    sch.annotate(sch.get_sblock("root"), CONFIG_KEY, config_json(config))


def recorded_fields(mod: tvm.IRModule) -> dict | None:
    """The configuration fields recorded on the root block of ``mod``'s function, or None."""
    return recorded_config(mod["main"])
