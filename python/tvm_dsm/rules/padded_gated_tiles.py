"""A gated layer (``silu(X @ Wg^T) * (X @ Wu^T)``: two products of one X, then elementwise
blocks) whose rows overrun its tiles (a symbolic row count, or one off the tiles), or whose N or
K do, rewritten to compute whole tiles before the split-K GEMM schedules it.

s_tir's ``pad_einsum`` pads one product at a time, each with its own zero-filled copy of X, and
refuses a product reading a fused weight from a row on (``W[n + j, k]``, not an einsum). So the
function is rewritten once, on a schedule of its own: a read from a row on is first reindexed,
each product padded to whole tiles, the second product made to read the first's padded X (one
tile of X serves both products in a K loop), the epilogue merged into one block and padded too,
and every plain copy that leaves inlined. The result reads X through one zero-filled ``X_pad``
(and each weight past N or K through a zero-filled copy of its own), computes both products and
the epilogue over whole tiles and copies the output's real rows and columns last; the split-K
GEMM inlines the zero fills into its tile copies. Tuning records its ranges' specializations of
whole tiles, not this rewrite.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize

from ..errors import ClusterError
from ..ir import find_all, is_reduction, substitute, with_block_body


def pad_gated_to_tiles(func: tirx.PrimFunc, tiles: list[int]) -> tirx.PrimFunc:
    """``func``, a gated layer, computing whole ``tiles`` (``[rows, columns, K]``, see the
    module docstring); past N and K each product reads its own zero-filled copy of its weight,
    which the schedule inlines into the weight's tile copies."""
    block_m, block_n, _ = tiles
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    products = [b for b in blocks if is_reduction(sch.get(b))]
    epilogue = [b for b in blocks if not is_reduction(sch.get(b))]
    reindexed = []
    for product in products:
        block = sch.get(product)
        for n, region in enumerate(block.reads):
            if not all(isinstance(r.min, tirx.Var) for r in region.region):
                reindexed.append(sch.reindex(product, ("read", n)))
    for product in products:
        sch.pad_einsum(product, tiles)
    for block in reindexed:
        sch.compute_inline(block)
    copies = [c for product in products for c in sch.get_consumers(product)]
    for block in [*copies, *epilogue[:-1]]:  # the products' row copies, then the inner epilogue
        sch.compute_inline(block)
    output = epilogue[-1]
    sch.pad_einsum(output, [block_m, block_n])
    for block in sch.get_producers(output):
        if not is_reduction(sch.get(block)):  # pad_einsum's copies of the padded products
            sch.compute_inline(block)
    return share_padded_input(sch.mod["main"])


def share_padded_input(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the products' zero-filled copies of X made one: the second product reads
    the first's, the second copy gone (``func`` itself where X is not padded)."""
    root = func.body.block
    nests = list(root.body.seq)
    pads = []  # (position, block) of each copy of a parameter into a buffer of the function's own
    copied = []  # the parameter each copies
    for n, nest in enumerate(nests):
        (block,) = find_all(nest, SBlock)
        param = next((p for p in func.params if len(block.reads) == 1 and block.reads[0].source.same_as(p)), None)
        if not is_reduction(block) and param is not None and any(block.writes[0].source.same_as(b) for b in root.alloc_buffers):
            pads.append((n, block))
            copied.append(param)

    # X's two copies: the parameter copied twice the same way (a fused weight padded past N is
    # also copied twice, its gate's rows and its up's; a weight of its own once)
    def same(first, second) -> bool:
        kept, dropped = first.writes[0].source, second.writes[0].source
        return tvm_ffi.structural_equal(first.body, substitute(second.body, [(dropped, kept)]), map_free_vars=True)

    pairs = [[pad for pad, q in zip(pads, copied) if q.same_as(param)] for param in func.params]
    pairs = [pair for pair in pairs if len(pair) == 2 and same(pair[0][1], pair[1][1])]
    if not pairs:  # X's rows and K are whole tiles: no copy of it
        return func
    if len(pairs) > 1:
        raise ClusterError(f"a gated layer padded to whole tiles has {len(pairs)} inputs its products copy alike")
    (_, first), (second_at, second) = pairs[0]
    kept, dropped = first.writes[0].source, second.writes[0].source
    del nests[second_at]
    body = substitute(tirx.SeqStmt(nests), [(dropped, kept)])
    allocs = [b for b in root.alloc_buffers if not b.same_as(dropped)]
    return func.with_body(SBlockRealize([], True, with_block_body(root, body, allocs)))
