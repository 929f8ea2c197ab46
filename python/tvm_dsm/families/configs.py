"""A family configuration from its fields: the configurations a tuning record or a candidate
stores as JSON, read back with the types of the family's space (nested configurations included).
"""

from __future__ import annotations

import dataclasses
from typing import Any


def examples(space: list) -> list:
    """One configuration of each type in ``space``."""
    return list({type(config): config for config in reversed(space)}.values())


def config_from(fields: dict, candidates: list) -> Any:
    """The configuration ``fields`` describe, typed like the one of ``candidates`` (see
    :func:`examples`) that has exactly those fields, or else those fields and others with
    defaults (a record written before a field was added: the field takes its default)."""
    for exact in (True, False):
        for example in candidates:
            missing = [f for f in dataclasses.fields(example) if f.name not in fields]
            if not set(fields) <= {f.name for f in dataclasses.fields(example)} or (exact and missing):
                continue
            if all(f.default is not dataclasses.MISSING for f in missing):
                return rebuild({**fields, **{f.name: f.default for f in missing}}, example)
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
