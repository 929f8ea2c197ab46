"""Which configuration of its schedule family a MetaSchedule candidate applies.

A :class:`~tvm_dsm.meta_schedule.PlannedSpace` schedule carries its configuration's fields as
JSON in a root-block annotation (``CONFIG_KEY``); the family and the shape are not stored but
found again from the tuning task's function (``TuneContext.mod``), since a shape can be a
function itself. Reading the annotation back needs example configurations of the family (one of
each configuration type its space holds: a chain's space has fused and unfused plans) to give
the fields their type, nested configurations included.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import tvm
from tvm import s_tir

from ..annotations import CONFIG_KEY


def annotate_config(sch: s_tir.Schedule, config: Any) -> None:
    """Record ``config`` (a dataclass) on the root block of ``sch``."""
    sch.annotate(sch.get_sblock("root"), CONFIG_KEY, json.dumps(dataclasses.asdict(config), sort_keys=True))


def recorded_fields(mod: tvm.IRModule) -> dict | None:
    """The configuration fields recorded on ``mod``'s root block, or None if there are none."""
    body = mod["main"].body
    root = getattr(body, "block", None)
    if root is None or CONFIG_KEY not in root.annotations:
        return None
    return json.loads(str(root.annotations[CONFIG_KEY]))


def examples(space: list) -> list:
    """One configuration of each type in ``space``."""
    return list({type(config): config for config in reversed(space)}.values())


def config_from(fields: dict, candidates: list) -> Any:
    """The configuration ``fields`` describe, typed like the one of ``candidates`` (see
    :func:`examples`) that has exactly those fields."""
    for example in candidates:
        if {f.name for f in dataclasses.fields(example)} == set(fields):
            return rebuild(fields, example)
    raise ValueError(f"no configuration type of the space has the fields {sorted(fields)}")


def rebuild(fields: dict, example: Any) -> Any:
    """The configuration of ``example``'s type with ``fields`` (nested dataclasses rebuilt alike)."""
    values = {}
    for name, value in fields.items():
        current = getattr(example, name)
        if dataclasses.is_dataclass(current):
            value = rebuild(value, current)
        elif isinstance(current, tuple):
            value = tuple(value)
        values[name] = value
    return dataclasses.replace(example, **values)
