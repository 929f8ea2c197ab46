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
from tvm.s_tir.schedule import SBlockRV

from ..errors import ClusterError
from ..ir import find_all, is_reduction, product_outputs, substitute, with_block_body, writes_parameter


def outputs_through_copies(sch: s_tir.Schedule, products: list[SBlockRV]) -> list[SBlockRV]:
    """A copy of each of ``products`` that writes an output of the function as it is, the
    product then summed into a buffer of its own: the epilogue blocks its sums reach the
    output through."""
    func = sch.mod["main"]
    return [sch.cache_write(p, 0, "global") for p in products if writes_parameter(func, sch.get(p))]


def pad_gated_to_tiles(func: tirx.PrimFunc, tiles: list[int], separate_outputs: bool = False) -> tirx.PrimFunc:
    """``func``, a gated layer (or, ``separate_outputs``, sibling products of one X, each
    epilogue and output padded on its own), computing whole ``tiles`` (``[rows, columns, K]``,
    see the module docstring); past N and K each product reads its own zero-filled copy of its
    weight, which the schedule inlines into the weight's tile copies."""
    block_m, block_n, _ = tiles
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    products = [b for b in blocks if is_reduction(sch.get(b))]
    epilogue = [b for b in blocks if not is_reduction(sch.get(b))] + outputs_through_copies(sch, products)
    # the epilogue's outputs: the last block, combining the products, or each sibling product's own
    outputs = (product_outputs([sch.get(p).writes[0].source for p in products], [sch.get(b) for b in epilogue])
               if separate_outputs else [len(epilogue) - 1])
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
    inner = [b for n, b in enumerate(epilogue) if n not in outputs]
    for block in [*copies, *inner]:  # the products' row copies, then the inner epilogue
        sch.compute_inline(block)
    for output in [epilogue[n] for n in outputs]:
        sch.pad_einsum(output, [block_m, block_n])
        for block in sch.get_producers(output):
            if not is_reduction(sch.get(block)):  # pad_einsum's copies of the padded products
                sch.compute_inline(block)
    return _products_first(share_padded_input(sch.mod["main"]))


def _products_first(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its root's statements in the split-K GEMM's order: the zero fills the
    products read, the products, the epilogue, then the copies of the outputs' real rows and
    columns (a sibling product's each)."""
    root = func.body.block
    nests = list(root.body.seq)
    blocks = [find_all(nest, SBlock)[0] for nest in nests]
    products = [n for n, b in enumerate(blocks) if is_reduction(b)]
    read = [r.source for n in products for r in blocks[n].reads]
    fills = [n for n, b in enumerate(blocks) if n not in products and any(b.writes[0].source.same_as(r) for r in read)]
    rest = [n for n in range(len(nests)) if n not in products and n not in fills]
    copies = [n for n in rest if writes_parameter(func, blocks[n])]
    order = [*fills, *products, *(n for n in rest if n not in copies), *copies]
    body = tirx.SeqStmt([nests[n] for n in order])
    return func.with_body(SBlockRealize([], True, with_block_body(root, body)))


def share_padded_input(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the products' zero-filled copies of X made one: the later products read
    the first's, their copies gone (``func`` itself where X is not padded)."""
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

    # X's copies: the parameter copied more than once the same way (a fused weight padded past
    # N is also copied twice, its gate's rows and its up's; a weight of its own once)
    def same(first, second) -> bool:
        kept, dropped = first.writes[0].source, second.writes[0].source
        return tvm_ffi.structural_equal(first.body, substitute(second.body, [(dropped, kept)]), map_free_vars=True)

    pairs = [[pad for pad, q in zip(pads, copied) if q.same_as(param)] for param in func.params]
    pairs = [pair for pair in pairs if len(pair) > 1 and all(same(pair[0][1], b) for _, b in pair[1:])]
    if not pairs:  # X's rows and K are whole tiles: no copy of it
        return func
    if len(pairs) > 1:
        raise ClusterError(f"a gated layer padded to whole tiles has {len(pairs)} inputs its products copy alike")
    (_, first), *later = pairs[0]
    kept = first.writes[0].source
    dropped = [block.writes[0].source for _, block in later]
    nests = [nest for n, nest in enumerate(nests) if n not in {at for at, _ in later}]
    body = substitute(tirx.SeqStmt(nests), [(d, kept) for d in dropped])
    allocs = [b for b in root.alloc_buffers if not any(b.same_as(d) for d in dropped)]
    return func.with_body(SBlockRealize([], True, with_block_body(root, body, allocs)))
