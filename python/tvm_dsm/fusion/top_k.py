"""Top-k as a reduction: the k largest values of a row and their indices, as TE/TIR express it.

A top-k is a commutative reduction whose state is a list of k (value, index) pairs sorted best
first, best = larger value, then smaller index (a total order, so the result is unique even with
ties). :func:`top_k` builds it in TE with a ``comm_reducer`` whose combine is an exact merge of
two such lists (each element's rank in the union computed by counting, no nested merges), so the
unfused function is correct under any schedule, including cross-thread reductions. Compiling the
unfused function is slow for larger k (TVM's CompactBufferAllocation: 5 s at k = 4, 4.5 min at
k = 8, in the region analysis of the combine's loads); the fused kernel never contains it. The
block is annotated with :data:`TOP_K_KEY`; :func:`parse_top_k` recognizes it by rebuilding the
expected body and comparing, so only this reduction is treated as top-k.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import te, tirx

from ..ir import find_all, loads, uses
from ..annotations import TOP_K_KEY



def beats(v1, i1, v2, i2):
    """(v1, i1) ranks before (v2, i2)."""
    return tirx.Or(v1 > v2, tirx.And(v1 == v2, i1 < i2))


def merge(a: list, b: list, k: int) -> list:
    """The best k of two sorted lists of (value, index) pairs (pure expressions): an element of
    ``a`` at position j lands at j + (number of b that beat it), one of ``b`` at m + (number of a
    that it does not beat); ties between the lists go to ``a``."""
    placed = []
    for j, (v, i) in enumerate(a):
        rank = sum((tirx.Cast("int32", beats(bv, bi, v, i)) for bv, bi in b), tirx.const(j, "int32"))
        placed.append((rank, v, i))
    for m, (v, i) in enumerate(b):
        rank = sum((tirx.Cast("int32", tirx.Not(beats(v, i, av, ai))) for av, ai in a),
                   tirx.const(m, "int32"))
        placed.append((rank, v, i))
    out = []
    for c in range(k):
        value, index = placed[-1][1], placed[-1][2]
        for rank, v, i in reversed(placed[:-1]):
            value = tirx.Select(rank == c, v, value)
            index = tirx.Select(rank == c, i, index)
        out.append((value, index))
    return out


def identity(dtype: str) -> tuple:
    """The empty slot: below every value, after every index."""
    return tvm.te.min_value(dtype), tirx.const(-1, "int32")


def top_k_reducer(k: int, dtype: str):
    """A ``te.comm_reducer`` over 2k values: k values, then k int32 indices, best first."""

    def combine(x, y):
        merged = merge(list(zip(x[:k], x[k:])), list(zip(y[:k], y[k:])), k)
        return tuple(v for v, _ in merged) + tuple(i for _, i in merged)

    def ident(*dtypes):
        return tuple(identity(dtype)[0] for _ in range(k)) + tuple(identity(dtype)[1] for _ in range(k))

    return te.comm_reducer(combine, ident, name=f"top{k}")


def top_k(value, rows: tuple, extent: int, k: int, name: str = "topk") -> list:
    """TE tensors (k values, then k indices; each of shape ``rows``) of the best k of
    ``value(*row, r)`` over ``r`` in [0, extent)."""
    r = te.reduce_axis((0, extent), f"{name}_r")
    probe = value(*[tirx.const(0, "int32")] * len(rows), r)
    dtype = str(probe.ty.dtype)
    empty_v, empty_i = identity(dtype)
    reducer = top_k_reducer(k, dtype)

    def fcompute(*row):
        source = (value(*row, r),) + (empty_v,) * (k - 1) + (r.var,) + (empty_i,) * (k - 1)
        return reducer(source, axis=r)

    return te.compute(rows, fcompute, name=name, attrs={TOP_K_KEY: k})


def column(tensors: list, row, c):
    """``tensors[c][row]``, with ``c`` an expression (the column of a [rows, k] output of the
    k tensors :func:`top_k` gives)."""
    k = len(tensors)
    return functools.reduce(lambda rest, n: tirx.Select(c == n, tensors[n][row], rest),
                            range(k - 2, -1, -1), tensors[k - 1][row])


@dataclass
class TopK:
    """A recognized top-k block: ``values``/``indices`` output buffers (best first) of
    ``value`` (in the block's variables) over ``reduce_var``."""

    k: int
    values: list
    indices: list
    value: tvm.ir.PrimExpr


def parse_top_k(block) -> TopK | None:
    """The block's top-k, if it is exactly the reduction :func:`top_k` builds."""
    if TOP_K_KEY not in block.annotations:
        return None
    k = int(block.annotations[TOP_K_KEY])
    lets = find_all(block.body, tirx.LetStmt)
    stores = find_all(block.body, tirx.BufferStore)
    if len(stores) != 2 * k or len(lets) != 2 * k:
        return None
    outputs = [s.buffer for s in stores]
    reduce_var = block.iter_vars[-1].var
    value = _source_value(lets[0].value, outputs, reduce_var)
    if value is None:
        return None
    row = stores[0].indices
    state = [tirx.BufferLoad(b, row) for b in outputs]
    empty_v, empty_i = identity(str(value.ty.dtype))
    source = [(value, reduce_var)] + [(empty_v, empty_i)] * (k - 1)
    expected = merge(list(zip(state[:k], state[k:])), source, k)
    expected = [v for v, _ in expected] + [i for _, i in expected]
    if not all(tvm_ffi.structural_equal(let.value, e, map_free_vars=True) for let, e in zip(lets, expected)):
        return None
    return TopK(k, outputs[:k], outputs[k:], value)


def _source_value(expr, outputs: list, reduce_var):
    """The largest sub-expressions reading the reduced axis but not the state: the source
    value (``reduce_var`` itself is the source index)."""
    found = []

    def visit(e):
        if uses(e, reduce_var) and not _reads(e, outputs):
            if not e.same_as(reduce_var) and not any(tvm_ffi.structural_equal(e, f) for f in found):
                found.append(e)
            return
        for child in _children(e):
            visit(child)

    visit(expr)
    return found[0] if len(found) == 1 else None


def _reads(e, buffers) -> bool:
    return any(load.source.same_as(b) for load in loads(e) for b in buffers)


def _children(e) -> list:
    if isinstance(e, tirx.Select):
        return [e.condition, e.true_value, e.false_value]
    if isinstance(e, tirx.Cast):
        return [e.value]
    return [getattr(e, name) for name in ("a", "b") if hasattr(e, name)]
