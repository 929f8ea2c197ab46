"""Attention over merged head axes, as attention over heads: GPT-2's ``qkv [B, S, 3 * H * D]``
sliced by index arithmetic (``qkv[b, i, C + h * D + d]``), its output written with the heads
merged (``o[b, i, c]`` reading the probabilities at head ``c // D``).

The attention pattern (:mod:`tvm_dsm.kernels.attention_pattern`) reads each operand as a head
axis and a head dim innermost. Here one axis holds both. For ``D``, the extent of a reduction
that indexes every tensor it reads by its iterator last (the scores' sum over the head dim),
:func:`heads_apart` splits that axis into ``[..., n / D, D]``: in the blocks, each spatial
iterator read as ``v // D`` (and, from there, each iterator that alone indexes the last axis
of a tensor so split or read at a head's element ``h * D + d``) becomes two
(``transform_block_layout``); in the tensors, each whose last axis every access reads as a
whole multiple of ``D`` plus an index below ``D`` (``transform_layout``; the same memory). The
heads of a packed projection are then an offset on the head axis, which the pattern takes.
:func:`~tvm_dsm.transform.rows_as_matrix.over_original_tensors` puts a schedule of it back behind
the original signature.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize

from ..ir import block_analyzer, find_all, items, nest_block, uses
from .rows_as_matrix import Matrices, accesses


def _head_dims(blocks: list) -> list[int]:
    """The constant extents of the reductions that index every tensor they read by their
    iterator last (a score's sum over the head dim, not the weighted sum over keys, which reads
    v by the key first): the head dims a merged axis may hold."""
    dims = []
    for block in blocks:
        for iv in block.iter_vars:
            if iv.iter_type == tirx.IterVar.DataPar or not isinstance(iv.dom.extent, tirx.IntImm):
                continue
            reading = [idx for _, idx in accesses(block) if any(uses(i, iv.var) for i in idx)]
            if len(reading) >= 2 and all(not any(uses(i, iv.var) for i in idx[:-1]) for idx in reading):
                dims.append(int(iv.dom.extent))
    return [d for d in dict.fromkeys(dims) if d > 1]


def _divided(block, var: tirx.Var, dim: int) -> bool:
    """Whether ``block`` reads ``var // dim`` anywhere."""
    return any(d.a.same_as(var) and isinstance(d.b, tirx.IntImm) and int(d.b) == dim
               for d in find_all(block.body, tirx.FloorDiv))


def _splits(index, analyzer, dim: int) -> bool:
    """Whether ``index`` is a whole multiple of ``dim`` plus an index below ``dim``: its quotient
    and remainder by ``dim`` divide by no multiple of ``dim`` (a head of a group, ``h // g``, may
    stay)."""
    parts = [analyzer.simplify(tirx.floordiv(index, dim)), analyzer.simplify(tirx.floormod(index, dim))]
    return not any(find_all(p, (tirx.FloorDiv, tirx.FloorMod),
                            lambda e: isinstance(e.b, tirx.IntImm) and int(e.b) % dim == 0) for p in parts)


def _merged_iterators(blocks: list, dim: int) -> dict[str, int]:
    """Block name -> position of its iterator that holds heads and the head dim: read as
    ``v // dim``, or indexing alone the last axis of a tensor that a merged iterator indexes or
    that is read at a head's element (``h * dim + d``); each a spatial iterator of a multiple of
    ``dim`` above it."""
    def candidates(block):
        return [(i, iv.var) for i, iv in enumerate(block.iter_vars) if iv.iter_type == tirx.IterVar.DataPar
                and isinstance(iv.dom.extent, tirx.IntImm) and int(iv.dom.extent) % dim == 0
                and int(iv.dom.extent) > dim]

    headed = [buf for b in blocks for buf, idx in accesses(b)
              if idx and not isinstance(idx[-1], (tirx.Var, tirx.IntImm)) and _splits(idx[-1], block_analyzer(b), dim)]
    merged = {str(b.name_hint): i for b in blocks for i, v in candidates(b) if _divided(b, v, dim)}
    changed = True
    while changed:
        changed = False
        tensors = headed + [buf for b in blocks if str(b.name_hint) in merged for buf, idx in accesses(b)
                            if idx and idx[-1].same_as(b.iter_vars[merged[str(b.name_hint)]].var)]
        for block in blocks:
            if str(block.name_hint) in merged:
                continue
            for i, var in candidates(block):
                if any(idx and idx[-1].same_as(var) and any(buf.same_as(t) for t in tensors)
                       for buf, idx in accesses(block)):
                    merged[str(block.name_hint)] = i
                    changed = True
                    break
    return merged


def _split_at(ndim: int, position: int, dim: int, dtype: str) -> tirx.IndexMap:
    """The index map of ``ndim`` axes splitting the one at ``position`` into ``(// dim, % dim)``."""
    return tirx.IndexMap.from_func(
        lambda *a: [*a[:position], tirx.floordiv(a[position], dim), tirx.floormod(a[position], dim),
                    *a[position + 1:]], ndim=ndim, index_dtype=dtype)


def _split_tensors(blocks: list, dim: int) -> list:
    """The tensors whose last axis every access in ``blocks`` reads as a whole multiple of ``dim``
    plus an index below ``dim``, one access at least more than a plain iterator."""
    reads: dict = {}  # tensor -> (every access splits, one reads more than an iterator)
    for block in blocks:
        analyzer = block_analyzer(block)
        for buf, idx in (a for a in accesses(block) if a[1]):
            key = next((k for k in reads if k.same_as(buf)), buf)
            splits, merged = reads.get(key, (True, False))
            reads[key] = (splits and _splits(idx[-1], analyzer, dim), merged or not isinstance(idx[-1], tirx.Var))
    return [buf for buf, (splits, merged) in reads.items() if splits and merged and _divisible(buf, dim)]


def _divisible(buf, dim: int) -> bool:
    """Whether ``buf``'s last axis is a constant multiple of ``dim`` above it."""
    last = buf.ty.shape[-1] if buf.ty.shape else None
    return isinstance(last, tirx.IntImm) and int(last) % dim == 0 and int(last) > dim


def heads_apart(func: tirx.PrimFunc) -> Matrices | None:
    """``func`` with its merged head axes split (see the module), or None where it has none."""
    if not isinstance(func.body, SBlockRealize):
        return None
    blocks = [nest_block(n) for n in items(func.body.block.body)]
    if not blocks or any(b is None for b in blocks):
        return None
    for dim in _head_dims(blocks):
        merged = _merged_iterators(blocks, dim)
        if not merged:
            continue
        try:
            sch = s_tir.Schedule(func)
            for name, position in merged.items():
                block_rv = sch.get_sblock(name)
                dtype = str(sch.get(block_rv).iter_vars[position].var.ty)
                sch.transform_block_layout(block_rv, _split_at(len(sch.get(block_rv).iter_vars), position, dim, dtype))
            split = _simplified(sch.mod["main"])
            tensors = _split_tensors([nest_block(n) for n in items(split.body.block.body)], dim)
            sch, done = s_tir.Schedule(split), []
            for block_rv in sch.get_child_blocks(sch.get_sblock("root")):
                block = sch.get(block_rv)
                for kind, regions in (("read", block.reads), ("write", block.writes)):
                    for index, region in enumerate(regions):
                        buf = region.source
                        if any(buf.same_as(t) for t in tensors) and not any(buf.same_as(d) for d in done):
                            sch.transform_layout(block_rv, (kind, index),
                                                 _split_at(len(buf.ty.shape), len(buf.ty.shape) - 1, dim,
                                                           str(buf.ty.shape[-1].ty)))
                            done.append(buf)
            return Matrices(_simplified(sch.mod["main"]))
        except s_tir.ScheduleError:
            continue
    return None


def _simplified(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the divisions and remainders in its blocks simplified within each block's
    iterator ranges (only those: an iterator bound to a loop of one keeps its binding, which
    the attention pattern reads)."""
    def simplified(block: SBlock) -> SBlock:
        simplify = block_analyzer(block).simplify
        return tvm_ffi.structural_map(block, [(tirx.FloorDiv, simplify), (tirx.FloorMod, simplify)])

    return func.with_body(tvm_ffi.structural_map(func.body, [(SBlock, simplified)]))
