"""Matmul operands computed inside the product, computed first into a tensor of their own.

A weight-only quantized linear layer is often written with its dequantization inside the
product (``x[i, k] * (w[j, k].astype("float16") * scale[j])``, W8A16): one block that no GEMM
family takes and whose only stock schedule is dlight's fallback (10 ms on the H200 for a
256 x 18944 x 3584 layer, where torch takes 0.1 ms). :func:`operands_apart` computes such an
operand into a tensor first (``W[j, k] = w[j, k] * scale[j]`` in the operand's own type), and
the product reads that tensor: two operators, an element-wise kernel and a GEMM, the same
numbers (the operand is rounded where the function rounds it). An 8-bit operand read along
the reduced axis on its rows (an int8 weight stored ``[K, N]``, ``x @ W``) is copied transposed
the same way: the 8-bit tensor-core products read both operands K-major; so is the operand of
the output's rows read ``[K, M]`` in any type (a weight gradient's ``dy^T @ x``): the warpgroup
MMAs read only the second operand MN-major. A product of one row
is left as written: dlight's GEMV reads the quantized weight once, which writing it out would
multiply.
"""

from __future__ import annotations

import math

import tvm
from tvm import tirx
from tvm.ir import TensorLoad
from tvm.s_tir import SBlock
from tvm.tirx.analysis import undefined_vars

from ..ir import element_nest, loads, point_region, replace_node, rewrite_nests, substitute, uses, with_block_fields


def _computed(factor, block: SBlock):
    """(the operand below its outer casts, its two variables: a spatial one, then the
    reduction's) where ``factor`` is computed from more than a cast of one load, of those two
    variables alone (each from 0), and the product has more than one row of a constant count;
    else None."""
    operand = factor
    while isinstance(operand, tirx.Cast):
        operand = operand.value
    found = loads(operand)
    if not found or (len(found) == 1 and isinstance(operand, TensorLoad) and not _transposed(operand, block)):
        return None
    if any(ld.source.same_as(w.source) for ld in found for w in block.writes):
        return None
    used = [iv for iv in block.iter_vars if any(v.same_as(iv.var) for ld in found for i in ld.indices
                                                 for v in undefined_vars(i))]
    spatial = [iv for iv in used if iv.iter_type == tirx.IterVar.DataPar]
    reduced = [iv for iv in used if iv.iter_type == tirx.IterVar.CommReduce]
    if len(spatial) != 1 or len(reduced) != 1:
        return None
    axes = [spatial[0], reduced[0]]
    free = [v for v in undefined_vars(operand) if str(v.ty).startswith(("int", "uint"))]  # not the buffers
    if (not all(any(v.same_as(iv.var) for iv in axes) for v in free)
            or not all(isinstance(iv.dom.min, tirx.IntImm) and iv.dom.min.value == 0 for iv in axes)):
        return None  # it reads another variable (a mask on the row), or its axes do not start at 0
    rows = [iv.dom.extent for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar
            and not iv.same_as(spatial[0])]
    if not all(isinstance(e, tirx.IntImm) for e in rows) or math.prod(e.value for e in rows) < 2:
        return None  # one row (or a symbolic count, one at decode): dlight's GEMV reads the weight once as it is
    return operand, axes


def _transposed(load: TensorLoad, block: SBlock) -> bool:
    """Whether ``load`` reads a matrix along the reduced axis on its rows (``[K, *]``) where the
    GEMM families need it K-major: 1-byte elements either way (an int8 or fp8 weight stored
    ``[K, N]``: the 8-bit tensor-core products read both operands K-major, no transposing
    ``ldmatrix``, no MN-major 8-bit ``wgmma``), and a 16-bit operand of the output's rows
    (``dy^T`` of a weight gradient; the warpgroup MMAs read only the second operand MN-major)."""
    reduced = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if not (len(load.indices) == 2 and any(load.indices[0].same_as(v) for v in reduced)
            and not any(uses(load.indices[1], v) for v in reduced)):
        return False
    bits = tvm.DataType(str(load.ty)).bits
    written = [r.min for r in block.writes[0].region if isinstance(r.min, tirx.Var)]  # the output's row, column
    return bits == 8 or (bits == 16 and len(written) >= 2 and load.indices[1].same_as(written[-2]))


def operands_apart(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with each product operand computed inside a sum reduction (see the module)
    computed into a tensor before it; None where no reduction has one."""
    def apart(nest, block):
        store = block.body
        if not (block.init is not None and isinstance(store, tirx.BufferStore) and isinstance(store.value, tirx.Add)
                and isinstance(store.value.b, tirx.Mul)):
            return None
        product = store.value.b
        for factor in (product.a, product.b):
            found = _computed(factor, block)
            if found is None:
                continue
            operand, axes = found
            out = tirx.decl_buffer([iv.dom.extent for iv in axes], str(operand.ty), f"{block.name_hint}_operand")
            read = tirx.BufferLoad(out, [iv.var for iv in axes])
            new_block = replace_node(block, operand, read)
            reads = [r for r in new_block.reads if any(ld.source.same_as(r.source) for ld in loads(new_block.body))]
            reads.append(point_region(out, [iv.var for iv in axes]))
            new_block = with_block_fields(new_block, reads=reads)
            computed = element_nest(axes, f"{block.name_hint}_operand", out, lambda mapping: (
                [new for _, new in mapping], substitute(operand, mapping)))
            return [computed, replace_node(nest, block, new_block)], [out]
        return None

    return rewrite_nests(func, apart)
