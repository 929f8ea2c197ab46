"""Grouped rasterization of a GEMM's clusters over rows of tiles whose count is a variable.

A GEMM's clusters walk its output tiles in launch order. Row by row, one wave covers a row or
two of tiles and streams all of W through L2; a W larger than L2 then comes from HBM once per
row of tiles. A schedule of constant M walks ``group`` rows of tiles per column of tiles with
splits and a reorder (:func:`tvm_dsm.rules.split_k_gemm.raster_group`), which needs the rows of
tiles to divide into groups. Over a symbolic M they need not: the schedule walks row by row and
marks its cluster loop with :data:`~tvm_dsm.annotations.RASTER_GROUP_KEY` (the group and the
columns of tiles), and :func:`RasterClusters` renumbers the loop's iterations. Cluster ``c``
takes the tile that the row-major walk gives to

    first = (c // (group * columns)) * group      (the group's first row of tiles)
    rows  = min(group, row_tiles - first)          (the last group may be shorter)
    r     = c % (group * columns)
    tile  = (first + r % rows) * columns + r // rows

a permutation of the clusters (every tile once), so the kernel computes the same tiles in a
different order, each cluster computing its tile's index once. Runs after the TMA pipeline (which reads
copy indices as the schedule wrote them), while the loop still carries its annotations.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from ..annotations import RASTER_GROUP_KEY
from ..ir import substitute


def grouped_tile(cluster: tirx.PrimExpr, clusters: tirx.PrimExpr, group: int, columns: int) -> tirx.PrimExpr:
    """The row-major tile index cluster ``cluster`` of ``clusters`` computes when clusters walk
    ``group`` rows of ``columns`` tiles per column (see the module docstring)."""
    per_group = group * columns
    first = tirx.floordiv(cluster, per_group) * group
    # at least 1 (only a cluster past the last tile would make it less): a provably positive
    # divisor, which TVM divides without sign corrections
    rows = tirx.max(tirx.min(tirx.floordiv(clusters, columns) - first, group), 1)
    r = tirx.floormod(cluster, per_group)
    return (first + tirx.floormod(r, rows)) * columns + tirx.floordiv(r, rows)


def raster_clusters(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each marked cluster loop's iterations renumbered (see the module docstring)."""

    def on_for(loop: tirx.For):
        if RASTER_GROUP_KEY not in loop.annotations:
            return loop
        group, columns = (int(v) for v in loop.annotations[RASTER_GROUP_KEY])
        tile = tirx.Var("tile", loop.loop_var.ty)
        body = tirx.SeqStmt([tirx.Bind(tile, grouped_tile(loop.loop_var, loop.extent, group, columns)),
                             substitute(loop.body, [(loop.loop_var, tile)])])
        annotations = {k: v for k, v in loop.annotations.items() if k != RASTER_GROUP_KEY}
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.For, on_for)]))


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.RasterClusters")
def RasterClusters(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """:func:`raster_clusters` on every PrimFunc of ``mod``."""
    return tvm.IRModule({gv: raster_clusters(f) if isinstance(f, tirx.PrimFunc) else f
                         for gv, f in mod.functions.items()}, attrs=mod.attrs, global_infos=mod.global_infos)
