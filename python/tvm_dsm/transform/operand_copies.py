"""Products whose operands are copies of a parameter, reading the parameter in place.

TOPI's ``split`` (a fused gate/up weight cut into its halves), ``strided_slice``, ``transpose``
and ``reshape`` write a new tensor that a product then reads: ``Wg[j, k] = W[j, k]``,
``Wu[j, k] = W[j + N, k]``. The GEMM families take products of the function's own tensors, so
they see a block before the products and take nothing. :func:`copies_inlined` writes the same
function with each such copy inlined into the products (``s_tir``'s ``compute_inline``): the
products read ``W[j, k]`` and ``W[j + N, k]``, the form the gated split-K GEMM takes with a fused
weight (a single product over rows of a larger weight is no GEMM family's form yet: such a
function keeps its copy). A copy is a block that stores one element of a parameter, cast or
not, and that only products read.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import SBlockRealize

from ..ir import find_all, is_reduction, items, loads, nest_block

#: TE's annotation of a product's operands that MetaSchedule may lay out anew.
LAYOUT_FREE = "layout_free_placeholders"


def _is_copy(block, params: list) -> bool:
    """Whether ``block`` stores one element of a parameter (cast or not) and nothing else."""
    if is_reduction(block) or len(block.writes) != 1:
        return False
    stores = find_all(block.body, tirx.BufferStore)
    if len(stores) != 1:
        return False
    value = stores[0].value
    while isinstance(value, tirx.Cast):
        value = value.value
    read = loads(stores[0].value)
    return (len(read) == 1 and read[0].same_as(value) and any(read[0].source.same_as(p) for p in params)
            and not any(loads(i) for i in read[0].indices))


def copies_inlined(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with the copies its products read inlined into them (see the module), or None
    where it has none."""
    if not isinstance(func.body, SBlockRealize):
        return None
    blocks = [nest_block(n) for n in items(func.body.block.body)]
    if any(b is None for b in blocks):
        return None
    params = list(func.params)
    copies = []
    for block in blocks:
        if not _is_copy(block, params):
            continue
        out = block.writes[0].source
        readers = [b for b in blocks if any(r.source.same_as(out) for r in b.reads)]
        if readers and all(is_reduction(r) for r in readers):
            copies.append(str(block.name_hint))
    if not copies:
        return None
    sch = s_tir.Schedule(func)
    inlined = [sch.get(sch.get_sblock(name)).writes[0].source for name in copies]
    try:
        for name in copies:
            sch.compute_inline(sch.get_sblock(name))
    except s_tir.ScheduleError:
        return None
    for block_rv in sch.get_child_blocks(sch.get_sblock("root")):
        # TE marks the product's weight for MetaSchedule's layout rewrite: the copy is gone
        free = sch.get(block_rv).annotations.get(LAYOUT_FREE)
        if free is not None and any(b.same_as(c) for b in free for c in inlined):
            sch.unannotate(block_rv, LAYOUT_FREE)
            kept = [b for b in free if not any(b.same_as(c) for c in inlined)]
            if kept:
                sch.annotate(block_rv, LAYOUT_FREE, kept)
    return sch.mod["main"]
