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
from tvm.ir import TensorLoad
from tvm.s_tir import SBlock

from ..ir import loads, replace_node, rewrite_nests, spatial_nest, with_block_fields

NARROW = ("float16", "bfloat16")


def _narrow_product(block: SBlock) -> tuple[tirx.BufferStore, tirx.PrimExpr] | None:
    """(the update, its product term) of ``block`` where it is ``Y[...] = Y[...] + a * b`` with
    Y 16-bit, started from 0, else None."""
    if (block.init is None or len(block.writes) != 1 or str(block.writes[0].source.dtype) not in NARROW
            or not (isinstance(block.init, tirx.BufferStore) and isinstance(block.init.value, tirx.FloatImm)
                    and block.init.value.value == 0)):
        return None  # a sum started elsewhere keeps its start (tvm_dsm.transform.reduction_inits)
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
    return with_block_fields(block, reads=reads, writes=writes, body=body, init=init)


def widen_accumulation(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with every 16-bit product reduction accumulated in fp32 (see the module), None
    where it has none (or is not one root block over loop nests of one block each)."""
    def widened(nest, block):
        found = _narrow_product(block)
        if found is None:
            return None
        store, product = found
        out = store.buffer
        acc = tirx.decl_buffer(out.shape, "float32", f"{out.name}_fp32")
        return [replace_node(nest, block, _widened_block(block, store, product, acc)),
                spatial_nest(block, f"{block.name_hint}_round", out,
                             lambda _, at: tirx.Cast(str(out.dtype), tirx.BufferLoad(acc, at)))], [acc]

    return rewrite_nests(func, widened)
