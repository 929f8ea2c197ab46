"""Matmuls that accumulate in a 16-bit type, accumulated in fp32 and rounded once instead.

TOPI's ``dense`` and ``matmul`` without an ``out_dtype``, and a hand-written
``te.sum(x[i, k] * w[j, k])`` over fp16 or bf16 tensors, accumulate in the tensors' own type: K
additions each rounded to 8 or 11 bits. Tensor-core GEMMs (tvm-dsm's, cuBLAS's behind torch's
fp16 ``nn.Linear``) accumulate in fp32 and round the result once, which is closer to the exact
product, never further. :func:`widen_accumulation` gives such a function that form: each
16-bit product reduction accumulates into an fp32 buffer, and an element-wise block after it
rounds that buffer into the original output, so the GEMM families take the function (their
epilogue is the rounding).
"""

from __future__ import annotations

from tvm import tirx
from tvm.ir import Range, TensorLoad
from tvm.s_tir import SBlock, SBlockRealize

from ..ir import find_all, items, loads, replace_node, substitute

NARROW = ("float16", "bfloat16")


def _narrow_product(block: SBlock) -> tuple[tirx.BufferStore, tirx.PrimExpr] | None:
    """(the update, its product term) of ``block`` where it is ``Y[...] = Y[...] + a * b`` with
    Y 16-bit and an initialization, else None."""
    if block.init is None or len(block.writes) != 1 or str(block.writes[0].source.dtype) not in NARROW:
        return None
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not isinstance(store.value, tirx.Add):
        return None
    first, product = store.value.a, store.value.b
    if not (isinstance(first, TensorLoad) and first.source.same_as(store.buffer)
            and isinstance(product, tirx.Mul)
            and not any(load.source.same_as(store.buffer) for load in loads(product))):
        return None
    return store, product


def _widened_block(block: SBlock, store: tirx.BufferStore, product: tirx.Mul,
                   acc: tirx.Buffer) -> SBlock:
    """``block`` accumulating ``product`` (its factors widened) into ``acc``."""
    widened = tirx.Mul(tirx.Cast("float32", product.a), tirx.Cast("float32", product.b))
    body = tirx.BufferStore(acc, tirx.BufferLoad(acc, store.indices) + widened, store.indices)
    init = tirx.BufferStore(acc, tirx.const(0.0, "float32"), block.init.indices)
    written = block.writes[0]
    writes = [tirx.BufferRegion(acc, written.region)]
    reads = [tirx.BufferRegion(acc, r.region) if r.source.same_as(store.buffer) else r for r in block.reads]
    return SBlock(block.iter_vars, reads, writes, block.name_hint, body, init, list(block.alloc_buffers),
                  block.match_buffers, block.annotations)


def _rounding_nest(block: SBlock, out: tirx.Buffer, acc: tirx.Buffer) -> tirx.Stmt:
    """A loop nest over the reduction's spatial axes writing ``out[...] = round(acc[...])``."""
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    loops = [tirx.Var(f"{iv.var.name}_r", str(iv.var.ty)) for iv in spatial]
    block_vars = [tirx.IterVar(iv.dom, tirx.Var(f"v_{iv.var.name}", str(iv.var.ty)), tirx.IterVar.DataPar)
                  for iv in spatial]
    # the output is indexed as the reduction wrote it, by the spatial variables
    written = block.writes[0]
    mapping = [(iv.var, bv.var) for iv, bv in zip(spatial, block_vars)]
    region = [Range.from_min_extent(substitute(r.min, mapping), substitute(r.extent, mapping)) for r in written.region]
    indices = [r.min for r in region]
    rounding = SBlock(block_vars, [tirx.BufferRegion(acc, region)], [tirx.BufferRegion(out, region)],
                      f"{block.name_hint}_round",
                      tirx.BufferStore(out, tirx.Cast(str(out.dtype), tirx.BufferLoad(acc, indices)), indices))
    stmt: tirx.Stmt = SBlockRealize(loops, True, rounding)
    for loop, iv in reversed(list(zip(loops, spatial))):
        stmt = tirx.For(loop, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, stmt)
    return stmt


def widen_accumulation(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with every 16-bit product reduction accumulated in fp32 (see the module), None
    where it has none (or is not one root block over loop nests of one block each)."""
    if not isinstance(func.body, SBlockRealize):
        return None
    root = func.body.block
    nests = items(root.body)
    out_nests, added = [], []
    for nest in nests:
        blocks = [r.block for r in find_all(nest, SBlockRealize)]
        found = _narrow_product(blocks[0]) if len(blocks) == 1 else None
        if found is None:
            out_nests.append(nest)
            continue
        block, (store, product) = blocks[0], found
        out = store.buffer
        acc = tirx.decl_buffer(out.shape, "float32", f"{out.name}_fp32")
        out_nests += [replace_node(nest, block, _widened_block(block, store, product, acc)),
                      _rounding_nest(block, out, acc)]
        added.append(acc)
    if not added:
        return None
    body = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, tirx.SeqStmt(out_nests), root.init,
                  list(root.alloc_buffers) + added, root.match_buffers, root.annotations)
    return tirx.PrimFunc(func.params, SBlockRealize([], True, body), func.ret_type, func.attrs)
