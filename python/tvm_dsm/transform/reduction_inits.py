"""Reductions that start from a value other than their identity, started from the identity
and the value combined after.

A user's TVMScript often starts a sum from a tensor: a T5-style attention starts the scores
``q . k`` from a position bias (``with T.init(): sc[b, h, i, j] = bias[h, i, j]``), a GEMM from
its bias. The families compute a reduction from its identity (0 for a sum, the lowest value
for a max), so :func:`inits_apart` rewrites each such reduction into one from its identity into
a new buffer, followed by an element-wise block combining it with the start value into the
original output (``sc = sc_from_0 + bias``), which the families read as an epilogue or a score
term. A sum that adds its start last rounds differently only in the last fp32 bits.
"""

from __future__ import annotations

import tvm_ffi
from tvm import te, tirx
from tvm.ir import TensorLoad
from tvm.s_tir import SBlock
from tvm.tirx.analysis import undefined_vars

from ..ir import loads, nest_realize, replace_node, rewrite_nests, spatial_nest, substitute, with_block_fields

#: The kernels' own identity of a max (and, negated, of a min): a start at or beyond it, or at
#: its type's lowest (highest) value, is one.
_BEYOND = 3.0e38

#: The combining ops of the reductions rewritten: each type is also its constructor.
_COMBINING = (tirx.Add, tirx.Max, tirx.Min)


def _is_identity(op, init, dtype: str) -> bool:
    if not isinstance(init, (tirx.FloatImm, tirx.IntImm)):
        return False
    value = init.value
    if op is tirx.Add:
        return value == 0
    if op is tirx.Max:
        return value <= max(-_BEYOND, te.min_value(dtype).value)
    return value >= min(_BEYOND, te.max_value(dtype).value)


def _identity(op, dtype: str):
    """0, or the type's lowest (highest) value for a max (min): the families' own starts."""
    if op is tirx.Add:
        return tirx.const(0, dtype)
    return te.min_value(dtype) if op is tirx.Max else te.max_value(dtype)


def _at(load, indices) -> bool:
    return len(load.indices) == len(indices) and all(
        tvm_ffi.structural_equal(a, b) for a, b in zip(load.indices, indices))


def starts_elsewhere(block: SBlock) -> bool:
    """Whether ``block`` is a sum, max or min of numbers started from something other than its
    identity, whether or not :func:`inits_apart` can rewrite it (what the families refuse)."""
    init, store = block.init, block.body
    return (isinstance(init, tirx.BufferStore) and isinstance(store, tirx.BufferStore)
            and type(store.value) in _COMBINING and str(store.buffer.dtype) != "bool"
            and not _is_identity(type(store.value), init.value, str(store.buffer.dtype)))


def started_reduction(block: SBlock) -> tuple[type, tirx.BufferStore] | None:
    """(the combining op, the update) of ``block`` where it :func:`starts_elsewhere` as
    ``Y[...] = op(Y[...], x)`` (the accumulator on either side), its start written where it
    updates and reading no reduction variable and not ``Y`` (a block combining it after would
    read and write ``Y``, which s_tir's schedules refuse); else None."""
    if not starts_elsewhere(block):
        return None
    init, store = block.init, block.body
    if not (init.buffer.same_as(store.buffer) and len(block.writes) == 1 and _at(init, store.indices)):
        return None
    own = [x for x in (store.value.a, store.value.b)
           if any(ld.source.same_as(store.buffer) for ld in loads(x))]
    if len(own) != 1 or not (isinstance(own[0], TensorLoad) and _at(own[0], store.indices)):
        return None
    reduced = [iv.var for iv in block.iter_vars if iv.iter_type != tirx.IterVar.DataPar]
    if (any(v.same_as(r) for v in undefined_vars(init.value) for r in reduced)
            or any(ld.source.same_as(store.buffer) for ld in loads(init.value))):
        return None
    return type(store.value), store


def _from_identity(block: SBlock, op, store: tirx.BufferStore, acc: tirx.Buffer) -> SBlock:
    """``block`` reducing into ``acc`` from the identity."""
    body = tirx.BufferStore(acc, reading(store.value, store.buffer, acc), store.indices)
    init = tirx.BufferStore(acc, _identity(op, str(acc.dtype)), store.indices)
    writes = [tirx.BufferRegion(acc, block.writes[0].region)]
    loaded = loads(body.value)
    reads = [tirx.BufferRegion(acc if r.source.same_as(store.buffer) else r.source, r.region) for r in block.reads
             if any(ld.source.same_as(r.source) for ld in loaded) or r.source.same_as(store.buffer)]
    return with_block_fields(block, reads=reads, writes=writes, body=body, init=init)


def reading(expr, old: tirx.Buffer, new: tirx.Buffer):
    """``expr`` with its loads of ``old`` reading ``new`` at the same indices."""
    return tvm_ffi.structural_map(expr, [(TensorLoad, lambda ld: tirx.BufferLoad(new, ld.indices)
                                          if ld.source.same_as(old) else ld)])


def _unpredicated(realize) -> bool:
    """Whether the block is run at every point of its iteration space (a ``T.where`` would leave
    elements unstarted that the combining nest writes)."""
    return isinstance(realize.predicate, tirx.IntImm) and bool(realize.predicate.value)


def inits_apart(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with every reduction started from a value other than its identity reduced from
    the identity and combined with that value after (see the module); None where none is."""
    def apart(nest, block):
        found = started_reduction(block)
        if found is None or not _unpredicated(nest_realize(nest)):
            return None
        op, store = found
        out = store.buffer
        acc = tirx.decl_buffer(out.shape, out.dtype, f"{out.name}_from_identity")
        start = block.init.value
        return [replace_node(nest, block, _from_identity(block, op, store, acc)),
                spatial_nest(block, f"{block.name_hint}_start", out,
                             lambda mapping, at: op(tirx.BufferLoad(acc, at), substitute(start, mapping)))
                ], [acc]

    return rewrite_nests(func, apart)
