"""Grouped rasterization of a GEMM over a symbolic row count (tvm_dsm.transform.raster_clusters)."""

import pytest
from tvm import te, tirx
from tvm.sym import Analyzer

import tvm_dsm
from tvm_dsm.transform.raster_clusters import grouped_tile
from tvm_dsm.workloads.dense import dense


@pytest.mark.parametrize("columns", [1, 3, 125])
@pytest.mark.parametrize("row_tiles", [1, 2, 7, 8, 9, 16, 17, 33])
def test_every_tile_is_computed_once_in_groups_of_rows(row_tiles, columns):
    """The renumbering is a permutation of the tiles; within a full group consecutive clusters
    walk down its rows before the next column; the last group may hold fewer rows."""
    analyzer = Analyzer()
    clusters = row_tiles * columns
    tiles = [int(analyzer.simplify(grouped_tile(tirx.IntImm("int32", c), tirx.IntImm("int32", clusters), 8, columns)))
             for c in range(clusters)]
    assert sorted(tiles) == list(range(clusters))
    if row_tiles >= 8 and columns > 1:
        assert [t // columns for t in tiles[:9]] == [0, 1, 2, 3, 4, 5, 6, 7, 0]
        assert [t % columns for t in tiles[:9]] == [0] * 8 + [1]


def _kernel_source(func) -> str:
    return tvm_dsm.build(func).mod.imports[0].inspect_source()


def test_a_symbolic_row_count_walks_groups_of_rows_and_a_constant_one_splits(assemble):
    """Over ``m`` rows the kernels past the smallest ranges compute their tile once from the
    cluster index; a constant M keeps the schedule's own grouped walk."""
    symbolic = _kernel_source(dense(te.var("m"), 3072, 512))
    assert "int tile = " in symbolic
    assemble(symbolic, "raster_clusters_symbolic")
    assert "int tile = " not in _kernel_source(dense(1024, 3072, 512))
