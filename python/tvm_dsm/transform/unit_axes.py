"""Reductions' results without the trailing axes of extent 1 they keep.

A reduction written with ``keepdims`` (TOPI's ``max(..., keepdims=True)`` before a softmax or a
logsumexp) holds ``[rows, 1]`` results, which a later ``reshape`` reads at ``m[v % rows, 0]``;
the same function written without keepdims holds ``[rows]`` and reads ``m[v]``. The families
match the second form (a cascade's levels are indexed by their rows alone), so
:func:`unit_axes_dropped` lays each intermediate tensor out without the trailing unit axes its
reduction keeps, those no input of the reduction is indexed by (a row of one is a row), with
s_tir's ``transform_layout``, which rewrites every access and simplifies its indices within the
blocks' ranges; then it drops the block iterators that indexed only those axes
(:func:`~tvm_dsm.ir.without_unit_iter_vars`). The function's parameters keep their shapes.
"""

from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.tirx.analysis import undefined_vars

from ..ir import is_reduction, loads, uses, without_unit_iter_vars


def _unit_axes(buffer) -> list[int]:
    """The trailing axes of extent 1 of ``buffer`` (a keepdims reduction's), where an axis of
    another extent leads them; leading ones (the one row of ``[1, width]``) are rows."""
    shape = list(buffer.ty.shape)
    count = 0
    while count < len(shape) and isinstance(shape[-1 - count], tirx.IntImm) and shape[-1 - count].value == 1:
        count += 1
    last = len(shape) - count - 1
    if count == 0 or last < 0 or (isinstance(shape[last], tirx.IntImm) and shape[last].value == 1):
        return []
    return list(range(len(shape) - count, len(shape)))


def _kept(block, buffer, units: list[int]) -> bool:
    """Whether ``block`` is a reduction writing ``buffer``'s ``units`` axes at an index no input
    of it depends on (a dimension the reduction keeps, not a row of one of its inputs)."""
    if not is_reduction(block) or not isinstance(block.body, tirx.BufferStore):
        return False
    read = [i for ld in loads(block.body.value) if not ld.source.same_as(buffer) for i in ld.indices]
    return all(isinstance(block.body.indices[n], tirx.IntImm)
               or not any(uses(i, v) for i in read for v in undefined_vars(block.body.indices[n]))
               for n in units)


def _without(units: list[int]):
    """The index map of a tensor's axes to those not in ``units``."""
    return lambda *axes: [a for n, a in enumerate(axes) if n not in units]


def unit_axes_dropped(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with the reductions' results among its root block's tensors held without their
    trailing unit axes (see the module); None where it has none."""
    try:
        sch = s_tir.Schedule(func)
        root = sch.get_sblock("root")
    except (s_tir.ScheduleError, tvm.error.InternalError):
        return None  # not an s_tir function of one root block (an extern call)
    changed = False
    for buffer in list(sch.get(root).alloc_buffers):
        units = _unit_axes(buffer)
        writers = [(rv, n) for rv in sch.get_child_blocks(root)
                   for n, w in enumerate(sch.get(rv).writes) if w.source.same_as(buffer)]
        if not units or not writers or not all(_kept(sch.get(rv), buffer, units) for rv, _ in writers):
            continue
        block, index = writers[0]
        try:
            sch.transform_layout(block, ("write", index), _without(units), assume_injective_transform=True)
            changed = True
        except (s_tir.ScheduleError, tvm.error.InternalError):
            continue
    return without_unit_iter_vars(sch.mod["main"]) if changed else None
