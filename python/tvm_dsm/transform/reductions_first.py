"""A function's top-level blocks reordered so that each reduction runs as early as its inputs
allow, the element-wise blocks after them.

The order of independent blocks is how a function was written, not what it computes: TOPI's
gated layer (``silu(x @ Wg) * (x @ Wu)``) places the gate's sigmoid and product between its two
matmuls, where a hand-written one computes both matmuls first. The families recognize an
operation by its blocks in dataflow order (the products first, then the epilogue combining
them), so :func:`reductions_first` gives a function that order: a topological order of the
blocks' reads and writes that takes, among the blocks whose inputs are ready, the first
reduction as written, else the first block as written. Blocks that depend on each other keep
their order, so the function computes the same values.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import SBlockRealize

from ..ir import is_reduction, nest_block, with_block_body


def _depends(later, earlier) -> bool:
    """Whether block ``later`` must run after ``earlier``: it reads or writes what ``earlier``
    writes, or writes what ``earlier`` reads."""
    def buffers(regions):
        return [r.source for r in regions]

    written = buffers(earlier.writes)
    touched = buffers(later.reads) + buffers(later.writes)
    return (any(b.same_as(w) for b in touched for w in written)
            or any(b.same_as(r) for b in buffers(later.writes) for r in buffers(earlier.reads)))


def reductions_first(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with its top-level blocks in the order above; None where that is the order
    written, or where a top-level statement is not one block's loop nest."""
    root = func.body.block if isinstance(func.body, SBlockRealize) else None
    if root is None or not isinstance(root.body, tirx.SeqStmt):
        return None
    stmts = list(root.body.seq)
    blocks = [nest_block(s) for s in stmts]
    if any(b is None for b in blocks):
        return None
    after = [{j for j in range(i) if _depends(blocks[i], blocks[j])} for i in range(len(blocks))]
    order: list[int] = []
    while len(order) < len(stmts):
        ready = [i for i in range(len(stmts)) if i not in order and after[i] <= set(order)]
        order.append(next((i for i in ready if is_reduction(blocks[i])), ready[0]))
    if order == list(range(len(stmts))):
        return None
    realize = func.body
    return func.with_body(SBlockRealize(realize.iter_values, realize.predicate,
                                        with_block_body(root, tirx.SeqStmt([stmts[i] for i in order]))))
