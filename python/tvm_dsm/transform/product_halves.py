"""A product over a fused gate/up weight as the gated layer's two products.

Phi-3, vLLM and MLC-LLM store a gated layer's two weights as one ``W[2N, K]``, the gate's rows
first, and compute ``Y = X @ W^T`` once, then ``silu(Y[:, :N]) * Y[:, N:]``. Written so in one
function, the product is a single ``[M, 2N]`` matmul whose epilogue reads two of its columns
per element (``Y[i, j]`` and ``Y[i, j + N]``), which no GEMM family's tile holds (each CTA owns
its own output columns). :func:`products_of_halves` writes the same function as the form the
gated split-K GEMM takes with a fused weight: two matmul blocks, ``G[i, j] = sum X[i, k] W[j, k]``
and ``U[i, j] = sum X[i, k] W[j + N, k]`` over ``j < N``, the epilogue reading ``G[i, j]`` where
it read ``Y[i, j]`` and ``U[i, j]`` where it read ``Y[i, j + N]``. Each product computes the
same sums in the same order as the columns of ``Y`` it replaces.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize

from ..ir import (find_all, fresh_definitions, is_reduction, items, loads, nest_block, substitute, with_block_body,
                  with_block_fields)


def _half_of(index, var_extents: dict, half: int):
    """0 where ``index`` is a block variable of extent ``half``, 1 where it is one plus
    ``half``, else None."""
    if isinstance(index, tirx.Var) and var_extents.get(index) == half:
        return 0
    if (isinstance(index, tirx.Add) and isinstance(index.a, tirx.Var) and var_extents.get(index.a) == half
            and isinstance(index.b, tirx.IntImm) and index.b.value == half):
        return 1
    return None


def products_of_halves(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with its product over a fused gate/up weight as two products (see the module
    docstring); None where it has no such product."""
    if not isinstance(func.body, SBlockRealize):
        return None
    root = func.body.block
    nests = items(root.body)
    blocks = [nest_block(s) for s in nests]
    if any(b is None for b in blocks) or not blocks or not is_reduction(blocks[0]):
        return None
    product = blocks[0]
    y = product.writes[0].source
    store = product.body
    if (len(product.iter_vars) != 3 or not any(y.same_as(b) for b in root.alloc_buffers)
            or not isinstance(store, tirx.BufferStore) or len(y.ty.shape) != 2
            or not all(isinstance(d, tirx.IntImm) for d in y.ty.shape) or int(y.ty.shape[1]) % 2):
        return None
    i, j, k = (iv.var for iv in product.iter_vars)
    half = int(y.ty.shape[1]) // 2
    operands = [ld for ld in loads(store.value) if not ld.source.same_as(y)]
    if not (len(store.indices) == 2 and store.indices[0].same_as(i) and store.indices[1].same_as(j)
            and len(operands) == 2 and all(len(ld.indices) == 2 for ld in operands)):
        return None
    x, w = sorted(operands, key=lambda ld: not ld.indices[0].same_as(i))
    # X[i, k] by W[j, k], two tensors: j indexes W alone, so shifting it shifts W's rows
    if not (x.indices[0].same_as(i) and x.indices[1].same_as(k) and w.indices[0].same_as(j)
            and w.indices[1].same_as(k) and not x.source.same_as(w.source)
            and any(w.source.same_as(p) for p in func.params)):
        return None
    w = w.source
    if any(wr.source.same_as(y) for block in blocks[1:] for wr in block.writes):
        return None  # a later update of Y in place reads what both halves hold
    if not _narrowable(nests[0], int(y.ty.shape[1])):
        return None
    # every later read of Y is Y[., j'] or Y[., j' + N] for a variable j' of extent N
    reads = []
    for block in blocks[1:]:
        extents = {iv.var: int(iv.dom.extent) for iv in block.iter_vars if isinstance(iv.dom.extent, tirx.IntImm)}
        for load in loads(block.body):
            if load.source.same_as(y):
                which = _half_of(load.indices[1], extents, half)
                if which is None:
                    return None
                reads.append(which)
    if sorted(set(reads)) != [0, 1]:
        return None
    gate, up = (tirx.decl_buffer([y.ty.shape[0], half], str(y.ty.dtype), name=f"{y.name}_{n}") for n in ("gate", "up"))
    products = [_half_product(nests[0], product, y, out, w, j, half, shift) for out, shift in ((gate, 0), (up, half))]

    def reread(load):
        if not load.source.same_as(y):
            return load
        column = load.indices[1]
        return gate[load.indices[0], column] if isinstance(column, tirx.Var) else up[load.indices[0], column.a]

    def epilogue(block):
        if not any(r.source.same_as(y) for r in block.reads):
            return block
        body = tvm_ffi.structural_map(block.body, [(tvm.ir.TensorLoad, reread)])
        halves = {(ld.source.name, str(ld.indices)): ld for ld in loads(body)
                  if ld.source.same_as(gate) or ld.source.same_as(up)}
        regions = [tirx.BufferRegion(ld.source, [tvm.ir.Range.from_min_extent(i, 1) for i in ld.indices])
                   for ld in halves.values()]
        return with_block_fields(block, body=body, reads=[r for r in block.reads if not r.source.same_as(y)] + regions)

    rest = [tvm_ffi.structural_map(nest, [(SBlock, epilogue)]) for nest in nests[1:]]
    allocated = [b for b in root.alloc_buffers if not b.same_as(y)] + [gate, up]
    body = with_block_body(root, tirx.SeqStmt([*products, *rest]), alloc_buffers=allocated)
    return func.with_body(SBlockRealize(func.body.iter_values, func.body.predicate, body))


def _narrowable(nest, extent: int) -> bool:
    """Whether ``nest`` binds its block's second variable (the column) to a loop of its own of
    ``extent`` iterations, which the halves narrow."""
    realize = find_all(nest, SBlockRealize)[0]
    column = realize.iter_values[1]
    return isinstance(column, tirx.Var) and any(
        f.loop_var.same_as(column) and isinstance(f.extent, tirx.IntImm) and int(f.extent) == extent
        for f in find_all(nest, tirx.For))


def _half_product(nest, product: SBlock, y, out, w, j, half: int, shift: int):
    """``nest`` (the product's loop nest) computing ``out[i, j] = sum X[i, k] W[j + shift, k]``
    over ``j < half``."""
    realize = find_all(nest, SBlockRealize)[0]
    loop = realize.iter_values[1]

    def narrowed(f):
        return tirx.For(f.loop_var, f.min, half, f.kind, f.body, f.thread_binding, f.annotations) \
            if f.loop_var.same_as(loop) else f

    def shifted(load):
        if load.source.same_as(w) and shift:
            return w[load.indices[0] + shift, load.indices[1]]
        return load

    def moved(r):
        if r.source.same_as(w) and shift:
            return tirx.BufferRegion(w, [tvm.ir.Range.from_min_extent(r.region[0].min + shift, r.region[0].extent),
                                         r.region[1]])
        return r

    def block(b):
        if not b.name_hint == product.name_hint:
            return b
        iter_vars = [tirx.IterVar(tvm.ir.Range.from_min_extent(0, half), iv.var, iv.iter_type, iv.thread_tag)
                     if iv.var.same_as(j) else iv for iv in b.iter_vars]
        renamed = substitute(tvm_ffi.structural_map(b, [(tvm.ir.TensorLoad, shifted), (tvm.ir.TensorRegion, moved)]),
                             [(y, out)])
        return with_block_fields(renamed, iter_vars=iter_vars, name_hint=out.name)

    computed = tvm_ffi.structural_map(nest, [(tirx.For, narrowed), (SBlock, block)])
    return fresh_definitions(computed) if shift else computed
