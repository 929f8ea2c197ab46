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
    :func:`examples`) whose fields are those of ``fields`` and others with defaults (a record
    written before a field was added: the field takes its default); an exact match first."""
    names = set(fields)
    ordered = sorted(candidates, key=lambda e: names != {f.name for f in dataclasses.fields(e)})
    for example in ordered:
        try:
            return rebuild(fields, example)
        except ValueError:
            continue
    raise ValueError(f"no configuration type of the space has the fields {sorted(fields)}")


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    raise ValueError(f"no default for the missing field {field.name!r}")


def rebuild(fields: dict, example: Any) -> Any:
    """The configuration of ``example``'s type with ``fields`` (nested dataclasses rebuilt alike);
    a field ``fields`` lacks takes its default. ValueError where ``fields`` names a field the type
    lacks, or lacks one without a default."""
    own = {f.name: f for f in dataclasses.fields(example)}
    if not set(fields) <= set(own):
        raise ValueError(f"{type(example).__name__} has no field {sorted(set(fields) - set(own))}")
    values = {}
    for name, field in own.items():
        if name not in fields:
            values[name] = _default(field)
            continue
        value, current = fields[name], getattr(example, name)
        if dataclasses.is_dataclass(current):
            value = rebuild(value, current)
        elif isinstance(current, tuple):
            value = tuple(value)
        values[name] = value
    return dataclasses.replace(example, **values)
