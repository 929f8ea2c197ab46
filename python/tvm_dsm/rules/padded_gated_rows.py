"""A gated layer (``silu(X @ Wg^T) * (X @ Wu^T)``: two products of one X, then elementwise
blocks) whose rows overrun its tiles (a symbolic row count, or one off the tiles), rewritten to
compute whole tiles of rows before the split-K GEMM schedules it.

s_tir's ``pad_einsum`` pads one product at a time, each with its own zero-filled copy of X, and
refuses a product reading a fused weight from a row on (``W[n + j, k]``, not an einsum). So the
function is rewritten once, on a schedule of its own: a read from a row on is first reindexed,
each product padded to whole tiles of rows, the second product made to read the first's padded
X (one tile of X serves both products in a K loop), the epilogue merged into one block and padded
too, and every plain copy that leaves inlined. The result reads X through one zero-filled
``X_pad``, computes both products and the epilogue over whole tiles and copies the output's
real rows last; :func:`~tvm_dsm.rules.split_k_gemm.apply_padded_split_k_gemm` schedules that.
Tuning records its ranges' specializations of whole tiles, not this rewrite.
"""

from __future__ import annotations

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize

from ..errors import ClusterError
from ..ir import find_all, is_reduction, substitute, with_block_body


def pad_gated_rows(func: tirx.PrimFunc, block_m: int) -> tirx.PrimFunc:
    """``func``, a gated layer, computing whole tiles of ``block_m`` rows (see the module
    docstring); its N and K must be whole tiles already."""
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
        sch.pad_einsum(product, [block_m, 1, 1])
    for block in reindexed:
        sch.compute_inline(block)
    copies = [c for product in products for c in sch.get_consumers(product)]
    for block in [*copies, *epilogue[:-1]]:  # the products' row copies, then the inner epilogue
        sch.compute_inline(block)
    output = epilogue[-1]
    sch.pad_einsum(output, [block_m, 1])
    for block in sch.get_producers(output):
        if not is_reduction(sch.get(block)):  # pad_einsum's copies of the padded products
            sch.compute_inline(block)
    return _share_padded_input(sch.mod["main"])


def _share_padded_input(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the products' zero-filled copies of X made one: the second product reads
    the first's, the second copy gone."""
    root = func.body.block
    nests = list(root.body.seq)
    pads = []  # (position, block) of each copy of a parameter into a buffer of the function's own
    for n, nest in enumerate(nests):
        (block,) = find_all(nest, SBlock)
        reads_param = len(block.reads) == 1 and any(block.reads[0].source.same_as(p) for p in func.params)
        if not is_reduction(block) and reads_param and any(block.writes[0].source.same_as(b) for b in root.alloc_buffers):
            pads.append((n, block))
    if len(pads) != 2:
        raise ClusterError(f"a gated layer padded to whole rows has two copies of X; found {len(pads)}")
    (_, first), (second_at, second) = pads
    kept, dropped = first.writes[0].source, second.writes[0].source
    if not tvm_ffi.structural_equal(first.body, substitute(second.body, [(dropped, kept)]), map_free_vars=True):
        raise ClusterError("the products of a gated layer read different inputs")
    del nests[second_at]
    body = substitute(tirx.SeqStmt(nests), [(dropped, kept)])
    allocs = [b for b in root.alloc_buffers if not b.same_as(dropped)]
    return func.with_body(SBlockRealize([], True, with_block_body(root, body, allocs)))
