"""Norms over several trailing axes, as norms over one: ``layer_norm(x[n, c, w], axis=[1, 2])``
as rows of ``c * w`` elements.

TOPI's ``layer_norm`` over the last two axes (torch's ``normalized_shape=(C, W)``) reduces each
row over two iterators, where the row norm family reads one. Where every reduction of a
function reduces the same trailing axes, every other block iterates those axes last or not at
all, and every tensor indexed by them is indexed by exactly those, last and in order (the
statistics by none), :func:`columns_as_one` gives the function with those axes merged into one
in the tensors (``s_tir``'s ``transform_layout``) and in the blocks
(``transform_block_layout``): the same memory, read as rows of one axis.
:func:`~tvm_dsm.transform.rows_as_matrix.over_original_tensors` puts a schedule of it back behind
the original signature.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import SBlockRealize
from tvm.sym import Analyzer

from ..ir import find_all, items, nest_block, uses
from .rows_as_matrix import Matrices, accesses, relayout, row_major, without_loads


def _trailing(func: tirx.PrimFunc) -> tuple[list, list, list] | None:
    """(the trailing extents, the buffers indexed by those axes, the blocks iterating them)
    where ``func`` has the form of the module docstring, else None."""
    if not isinstance(func.body, SBlockRealize):
        return None
    blocks = [nest_block(nest) for nest in items(func.body.block.body)]
    if any(b is None for b in blocks):
        return None
    reductions = [b for b in blocks if b.init is not None]
    reduced = [[iv for iv in b.iter_vars if iv.iter_type != tirx.IterVar.DataPar] for b in reductions]
    if not reductions or len(reduced[0]) < 2:
        return None
    k = len(reduced[0])
    extents = [iv.dom.extent for iv in reduced[0]]
    analyzer = Analyzer()

    def same_extents(ivs) -> bool:
        return len(ivs) == k and all(analyzer.can_prove_equal(iv.dom.extent, e) and isinstance(iv.dom.min, tirx.IntImm)
                                     and iv.dom.min.value == 0 for iv, e in zip(ivs, extents))

    indexed, merged_blocks = [], []
    for block in blocks:
        last = list(block.iter_vars[-k:])
        if block.init is not None:
            if not (same_extents(last) and all(iv.iter_type != tirx.IterVar.DataPar for iv in last)
                    and all(iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars[:-k])):
                return None
        elif not (len(block.iter_vars) > k and same_extents(last)
                  and all(iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars)):
            continue  # a block of the rows alone (a mean from a sum): checked below to read no merged tensor
        axes = [iv.var for iv in last]
        merged_blocks.append(str(block.name_hint))
        for buf, indices in accesses(block):
            tail, head = indices[-k:], indices[:-k]
            if not any(uses(i, v) for i in indices for v in axes):
                continue  # the statistics: indexed by the rows alone
            if (len(indices) < k or not all(isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(tail, axes))
                    or any(uses(i, v) for i in head for v in axes)):
                return None
            if not any(buf.same_as(b) for b in indexed):
                if (not all(analyzer.can_prove_equal(d, e) for d, e in zip(buf.ty.shape[-k:], extents))
                        or list(buf.ty.strides) or not analyzer.can_prove_equal(buf.ty.elem_offset, 0)):
                    return None
                indexed.append(buf)
        values = [without_loads(s.value) for s in find_all(block.body, tirx.BufferStore)]
        if any(uses(value, v) for value in values for v in axes):
            return None  # a column read other than as an index (a position) keeps its axes
    others = [b for b in blocks if str(b.name_hint) not in merged_blocks]
    if any(buf.same_as(m) for block in others for buf, _ in accesses(block) for m in indexed):
        return None
    return extents, indexed, merged_blocks


def _merging(ndim: int, extents: list) -> tirx.IndexMap:
    """The index map of ``ndim`` axes merging the last ``len(extents)`` (row-major)."""
    k = len(extents)
    return tirx.IndexMap.from_func(lambda *axes: [*axes[:ndim - k], row_major(list(axes[ndim - k:]), extents)],
                                   ndim=ndim, index_dtype=str(extents[0].ty))


def columns_as_one(func: tirx.PrimFunc) -> Matrices | None:
    """``func`` with its reductions' trailing axes merged into one (see the module), or None
    where it has no such form."""
    found = _trailing(func)
    if found is None:
        return None
    extents, indexed, merged_blocks = found
    sch = s_tir.Schedule(func)
    done = []
    for block_rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(block_rv)
        if str(block.name_hint) not in merged_blocks:
            continue
        relayout(sch, block_rv, indexed, done, lambda buf: _merging(len(buf.shape), extents))
        sch.transform_block_layout(block_rv, _merging(len(block.iter_vars), extents))
    return Matrices(sch.mod["main"])
