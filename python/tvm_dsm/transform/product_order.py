"""A matmul block's iterators and operands in the order the GEMM families read them.

The families find a product by its block: iterators ``(i, j, k)`` (the output's row and column,
then the reduction) and the operand indexed ``[i, k]`` first. How a user writes the block does
not change what it computes: TVMScript may bind the reduction first (``T.axis.remap("RSS", [k,
i, j])``), and a product written into a transposed output (``C[n, m] = sum x[m, k] w[n, k]``)
multiplies the operand indexed by the output's row second. :func:`products_in_gemm_order`
reorders the iterators (spatial first, in their order) and, where the second operand is the one
indexed by the output's row, swaps the operands (their reads and the factors of the product),
so the function computes the same values in the families' order.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize

from ..ir import find_all, is_reduction, loads, with_block_fields


def _operands(block) -> list:
    """The block's reads other than its own output's."""
    return [r for r in block.reads if not r.source.same_as(block.writes[0].source)]


def _indexed_by_row(region, row) -> bool:
    """Whether ``region``'s first index is the output's row ``row``."""
    first = region.region[0].min if region.region else None
    return isinstance(first, tirx.Var) and first.same_as(row)


def _swapped(block: SBlock) -> SBlock:
    """``block`` with its two operands swapped: their reads, and the factors of the product
    that multiplies them."""
    x, w = _operands(block)

    def reads_only(expr, source) -> bool:
        found = loads(expr)
        return bool(found) and all(ld.source.same_as(source) for ld in found)

    def swap(mul):
        if reads_only(mul.a, x.source) and reads_only(mul.b, w.source):
            return tirx.Mul(mul.b, mul.a)
        return mul

    reads = [w if r.same_as(x) else x if r.same_as(w) else r for r in block.reads]
    return with_block_fields(block, reads=reads, body=tvm_ffi.structural_map(block.body, [(tirx.Mul, swap)]))


def _loops_in_iterator_order(sch: s_tir.Schedule, rv) -> None:
    """The block's loops reordered as its iterators are, where each iterator is bound to a loop
    of its own (the loop nest the families split)."""
    name = sch.get(rv).name_hint
    realize = next(r for r in find_all(sch.mod["main"].body, SBlockRealize) if r.block.name_hint == name)
    loops = {sch.get(loop).loop_var: loop for loop in sch.get_loops(rv)}
    bound = [next((loop for var, loop in loops.items() if value.same_as(var)), None) for value in realize.iter_values]
    if None not in bound and len(bound) == len(loops):
        sch.reorder(*bound)


def products_in_gemm_order(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with each product of two operands in the order above; None where every one
    already is (or where the function has no root block to read them from)."""
    if not isinstance(func.body, SBlockRealize):
        return None
    sch = s_tir.Schedule(func)
    changed = False
    swaps = []
    for rv in sch.get_child_blocks(sch.get_sblock(func.body.block.name_hint)):
        block = sch.get(rv)
        if not is_reduction(block) or len(_operands(block)) != 2:
            continue
        kinds = [iv.iter_type for iv in block.iter_vars]
        order = ([n for n, kind in enumerate(kinds) if kind == tirx.IterVar.DataPar]
                 + [n for n, kind in enumerate(kinds) if kind != tirx.IterVar.DataPar])
        if order != list(range(len(order))):
            sch.reorder_block_iter_var(rv, order)
            _loops_in_iterator_order(sch, rv)
            block = sch.get(rv)
            changed = True
        x, w = _operands(block)
        row = block.iter_vars[0].var
        if len(block.iter_vars) == 3 and not _indexed_by_row(x, row) and _indexed_by_row(w, row):
            swaps.append(block.name_hint)
    func = sch.mod["main"]
    if swaps:
        def rewrite(block):
            return _swapped(block) if block.name_hint in swaps else block

        func = func.with_body(tvm_ffi.structural_map(func.body, [(SBlock, rewrite)]))
    return func if changed or swaps else None
