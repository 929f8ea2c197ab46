"""Fold a split reduction's second kernel into the cluster kernel before it: one launch.

A fused GEMM chain's clusters each hold a partial sum of an output tile (one per column group
of the intermediate) and write it to global memory; a second kernel adds the partials in group
order. The schedule can instead mark that kernel's ``blockIdx.x`` loop with
:data:`~tvm_dsm.annotations.TILE_REDUCE_KEY` (``[rows of tiles, arrivals, gathered]``), one
iteration per output tile. This pass then appends to the cluster kernel before it, after each
CTA's own work, the marked kernel's iteration for the CTA's tile, ordered through a counter per
tile kept in the CUDA module (:mod:`tvm_dsm.intrin.device_counters`):

* run by the last of the tile's ``arrivals`` CTAs to finish it (``gathered`` 0);
* or (``gathered`` 1) by each of them, once all have arrived: the marked loop holds a
  ``blockIdx.y`` loop over ``arrivals`` shares of the tile, and CTA ``g`` of the tile (its
  cluster's column group) runs share ``g``.

Either way the reduction adds the partials in group order, so the result does not depend on
which CTA arrives when. The tile of CTA ``rank`` of cluster ``c`` is ``(c % rows) * cluster_size
+ rank`` and its column group ``c // rows``: the order in which the schedule lays out the
clusters and the marked kernel's iterations.
"""

from __future__ import annotations

import re
import zlib

import tvm
import tvm_ffi
from tvm import tirx

from ..annotations import CLUSTER_SIZE_KEY, TILE_REDUCE_KEY
from ..errors import ClusterError
from ..intrin.device_counters import gather, last_to_arrive, leave
from ..ir import substitute


def _bound_to(stmt, tag: str) -> bool:
    return isinstance(stmt, tirx.For) and stmt.thread_binding is not None and stmt.thread_binding.thread_tag == tag


def _typed(expr, var: tirx.Var):
    return expr if str(expr.ty) == str(var.ty) else tirx.Cast(str(var.ty), expr)


def _fold(kernel: tirx.For, reduce: tirx.For, counters: str) -> tirx.For:
    """``kernel`` (clusters, then ranks) with ``reduce``'s iteration for each CTA's tile run
    after the CTA's own work (see the module docstring)."""
    rank = kernel.body
    if CLUSTER_SIZE_KEY not in kernel.annotations or not _bound_to(rank, "clusterCtaIdx.x"):
        raise ClusterError("a reduction marked to run in the kernel before it must follow a cluster "
                           "kernel whose cluster loop holds its rank loop")
    rows, arrivals, gathered = (int(v) for v in reduce.annotations[TILE_REDUCE_KEY])
    size = int(rank.extent)
    tiles = int(reduce.extent)
    if tiles != rows * size:
        raise ClusterError(f"the reduction runs {tiles} tiles, the cluster kernel's CTAs finish "
                           f"{rows} rows of {size}")
    tile = _typed(tirx.floormod(kernel.loop_var, rows) * size + rank.loop_var, reduce.loop_var)
    body = substitute(reduce.body, [(reduce.loop_var, tile)])
    if gathered:
        if not (_bound_to(body, "blockIdx.y") and int(body.extent) == arrivals):
            raise ClusterError(f"a gathered reduction holds a blockIdx.y loop over its {arrivals} shares")
        share = _typed(tirx.floordiv(kernel.loop_var, rows), body.loop_var)
        work = [tirx.Evaluate(gather(counters, tiles, tile, arrivals)),
                substitute(body.body, [(body.loop_var, share)]),
                tirx.Evaluate(leave(counters, tiles, tile, arrivals))]
    else:
        work = [tirx.IfThenElse(last_to_arrive(counters, tiles, tile, arrivals), body, None)]
    rank = tirx.For(rank.loop_var, rank.min, rank.extent, rank.kind, tirx.SeqStmt([rank.body, *work]),
                    rank.thread_binding, rank.annotations)
    return tirx.For(kernel.loop_var, kernel.min, kernel.extent, kernel.kind, rank, kernel.thread_binding,
                    kernel.annotations)


def fold_tile_reductions(func: tirx.PrimFunc, name: str) -> tirx.PrimFunc:
    """``func`` with each marked reduction kernel folded into the kernel before it; the counters
    are named after ``name`` (the function's: its letters and digits, and its checksum, which
    tells apart names that differ elsewhere)."""
    folded = []

    def on_seq(seq: tirx.SeqStmt):
        stmts = list(seq.seq)
        marked = [i for i, s in enumerate(stmts) if _bound_to(s, "blockIdx.x") and TILE_REDUCE_KEY in s.annotations]
        if not marked:
            return seq
        for i in reversed(marked):
            if i == 0 or not _bound_to(stmts[i - 1], "blockIdx.x"):
                raise ClusterError("a reduction marked to run in the kernel before it must follow its cluster kernel")
            folded.append(i)
            counters = f"{re.sub(r'[^A-Za-z0-9]', '', name)}{zlib.crc32(name.encode()):08x}r{len(folded)}"
            stmts[i - 1] = _fold(stmts[i - 1], stmts[i], counters)
            del stmts[i]
        return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)

    body = tvm_ffi.structural_map(func.body, [(tirx.SeqStmt, on_seq)])
    return func if not folded else func.with_body(body)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.FoldTileReductions")
def FoldTileReductions(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """:func:`fold_tile_reductions` on every PrimFunc of ``mod``."""
    return tvm.IRModule({gv: fold_tile_reductions(f, gv.name_hint) if isinstance(f, tirx.PrimFunc) else f
                         for gv, f in mod.functions.items()}, attrs=mod.attrs, global_infos=mod.global_infos)
