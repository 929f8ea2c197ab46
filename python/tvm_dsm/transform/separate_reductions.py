"""A block that accumulates several independent reductions, one block per reduction.

A hand-written LayerNorm often sums ``x`` and ``x * x`` in one block (two stores in its init and
two in its body, as TVMScript writes them, or a TE tuple reducer with each new value bound
first): one loop over the row, two buffers. The families read a reduction as one block writing
one buffer (a row norm's levels, a cascade's), so :func:`reductions_apart` gives each reduction
a loop nest and block of its own.
The split computes the same values only where the reductions are independent: each store reads,
of the buffers the block writes, only its own element (``sum += f(x)``, not an arg-max's pair
of stores that read each other).
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import SBlockRealize

from ..ir import (fresh_definitions, items, loads, nest_realize, replace_node, substitute, with_block_body,
                  with_block_fields)


def _bound(stmts: list) -> list:
    """``stmts`` with each value a ``Bind`` names (TE's tuple reducers bind each new
    accumulator value, then store them) substituted where it is used, the binds left out."""
    bound, kept = [], []
    for stmt in stmts:
        stmt = substitute(stmt, bound)
        if isinstance(stmt, tirx.Bind):
            bound.append((stmt.var, stmt.value))
        else:
            kept.append(stmt)
    return kept


def _own_stores(realize) -> list[tirx.BufferStore] | None:
    """The body of ``realize``'s block as one store per buffer it writes, each with one init,
    each store reading of those buffers only its own element at the indices it writes; its
    inits, its stores' indices and the block's predicate reading none of them (each would read
    another reduction's finished value once apart); else None."""
    block = realize.block
    stores = _bound(items(block.body))
    inits = items(block.init) if block.init is not None else []
    written = [w.source for w in block.writes]
    if (len(stores) < 2 or len(inits) != len(stores) or len(written) != len(stores) or block.match_buffers
            or block.alloc_buffers
            or not all(isinstance(s, tirx.BufferStore) for s in [*stores, *inits])):
        return None

    def one_each(buffers) -> bool:  # each written buffer exactly once
        return all(sum(b.same_as(w) for b in buffers) == 1 for w in written)

    def reads_written(expr) -> bool:
        return any(load.source.same_as(w) for load in loads(expr) for w in written)

    if not one_each([s.buffer for s in stores]) or not one_each([s.buffer for s in inits]):
        return None
    if (reads_written(realize.predicate) or any(reads_written(s.value) for s in inits)
            or any(reads_written(i) for s in [*stores, *inits] for i in s.indices)):
        return None
    for store in stores:
        for load in loads(store.value):
            if any(load.source.same_as(w) for w in written) and not (
                    load.source.same_as(store.buffer) and len(load.indices) == len(store.indices)
                    and all(a.same_as(b) for a, b in zip(load.indices, store.indices))):
                return None
    return stores


def _one_reduction(block, store: tirx.BufferStore, index: int):
    """``block`` reduced to the reduction that ``store`` computes."""
    init = next(s for s in items(block.init) if s.buffer.same_as(store.buffer))
    read = loads(store.value)
    reads = [r for r in block.reads if any(ld.source.same_as(r.source) for ld in read)]
    writes = [w for w in block.writes if w.source.same_as(store.buffer)]
    return with_block_fields(block, name_hint=f"{block.name_hint}_{index}", body=store, init=init,
                             reads=reads, writes=writes)


def reductions_apart(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with every top-level block that accumulates independent reductions split into one
    loop nest per reduction, in the order of its stores; None where no block does."""
    root = func.body.block if isinstance(func.body, SBlockRealize) else None
    if root is None:
        return None
    stmts, changed = [], False
    for stmt in items(root.body):
        nest = nest_realize(stmt)
        stores = None if nest is None else _own_stores(nest)
        if stores is None:
            stmts.append(stmt)
            continue
        changed = True
        block = nest.block
        for n, store in enumerate(stores):
            stmts.append(fresh_definitions(replace_node(stmt, block, _one_reduction(block, store, n))))
    if not changed:
        return None
    realize = func.body
    return func.with_body(SBlockRealize(realize.iter_values, realize.predicate,
                                        with_block_body(root, tirx.SeqStmt(stmts))))
