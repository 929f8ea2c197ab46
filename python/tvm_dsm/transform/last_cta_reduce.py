"""Fold a split reduction's second kernel into the cluster kernel before it: one launch.

A fused GEMM chain's clusters each hold a partial sum of an output tile (one per column group
of the intermediate) and write it to global memory; a second kernel adds the partials in group
order. The schedule can instead mark that kernel's ``blockIdx.x`` loop with
:data:`~tvm_dsm.annotations.REDUCE_IN_LAST_CTA_KEY` (``[rows of tiles, arrivals]``), one iteration per
output tile. This pass then appends to the cluster kernel before it, after each CTA's own
work: "if this CTA is the last of ``arrivals`` to finish its tile, run the marked kernel's
iteration for the tile". A counter per tile kept in the CUDA module
(:func:`tvm_dsm.intrin.device_counters.last_to_arrive`) orders the CTAs; the reduction still adds
the partials in group order, so the result does not depend on which CTA arrives last.

The tile of CTA ``rank`` of cluster ``c`` is ``(c % rows) * cluster_size + rank``, the order in
which the schedule lays out the marked kernel's iterations.
"""

from __future__ import annotations

import re

import tvm
import tvm_ffi
from tvm import tirx

from ..annotations import CLUSTER_SIZE_KEY, REDUCE_IN_LAST_CTA_KEY
from ..errors import ClusterError
from ..intrin.device_counters import last_to_arrive
from ..ir import substitute


def _is_block_loop(stmt) -> bool:
    return (isinstance(stmt, tirx.For) and stmt.thread_binding is not None
            and stmt.thread_binding.thread_tag == "blockIdx.x")


def _fold(kernel: tirx.For, reduce: tirx.For, counters: str) -> tirx.For:
    """``kernel`` (clusters, then ranks) with ``reduce``'s iteration for each CTA's tile run by
    the last CTA to finish the tile."""
    rank = kernel.body
    if CLUSTER_SIZE_KEY not in kernel.annotations or not (
            isinstance(rank, tirx.For) and rank.thread_binding is not None
            and rank.thread_binding.thread_tag == "clusterCtaIdx.x"):
        raise ClusterError("a reduction marked to run in the last CTA must follow a cluster kernel "
                           "whose cluster loop holds its rank loop")
    rows, arrivals = (int(v) for v in reduce.annotations[REDUCE_IN_LAST_CTA_KEY])
    size = int(rank.extent)
    tiles = int(reduce.extent)
    if tiles != rows * size:
        raise ClusterError(f"the reduction runs {tiles} tiles, the cluster kernel's CTAs finish "
                           f"{rows} rows of {size}")
    tile_var = reduce.loop_var
    tile = tirx.floormod(kernel.loop_var, rows) * size + rank.loop_var
    tile = tile if str(tile.ty) == str(tile_var.ty) else tirx.Cast(str(tile_var.ty), tile)
    last = last_to_arrive(counters, tiles, tile, arrivals)
    body = tirx.SeqStmt([rank.body, tirx.IfThenElse(last, substitute(reduce.body, [(tile_var, tile)]), None)])
    rank = tirx.For(rank.loop_var, rank.min, rank.extent, rank.kind, body, rank.thread_binding, rank.annotations)
    return tirx.For(kernel.loop_var, kernel.min, kernel.extent, kernel.kind, rank, kernel.thread_binding,
                    kernel.annotations)


def fold_last_cta_reductions(func: tirx.PrimFunc, name: str) -> tirx.PrimFunc:
    """``func`` with each marked reduction kernel folded into the kernel before it; the counters
    are named after ``name`` (the function's)."""
    folded = []

    def on_seq(seq: tirx.SeqStmt):
        stmts = list(seq.seq)
        marked = [i for i, s in enumerate(stmts) if _is_block_loop(s) and REDUCE_IN_LAST_CTA_KEY in s.annotations]
        if not marked:
            return seq
        for i in reversed(marked):
            if i == 0 or not _is_block_loop(stmts[i - 1]):
                raise ClusterError("a reduction marked to run in the last CTA must follow its cluster kernel")
            folded.append(i)
            counters = re.sub(r"[^A-Za-z0-9]", "", name) + f"r{len(folded)}"
            stmts[i - 1] = _fold(stmts[i - 1], stmts[i], counters)
            del stmts[i]
        return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)

    body = tvm_ffi.structural_map(func.body, [(tirx.SeqStmt, on_seq)])
    return func if not folded else func.with_body(body)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.FoldLastCtaReductions")
def FoldLastCtaReductions(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """:func:`fold_last_cta_reductions` on every PrimFunc of ``mod``."""
    return tvm.IRModule({gv: fold_last_cta_reductions(f, gv.name_hint) if isinstance(f, tirx.PrimFunc) else f
                         for gv, f in mod.functions.items()}, attrs=mod.attrs, global_infos=mod.global_infos)
