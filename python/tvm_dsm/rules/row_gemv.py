"""One row times a matrix (``y[j] = sum_k x[k] W[j, k]``, the matmul of a decode batch of
one) with its elementwise epilogue, streaming W from HBM with enough loads in flight; or two
such products over the same row (a SwiGLU's gate and up halves of one fused weight) meeting in
one epilogue (``silu(gate[j]) * up[j]``).

Each CTA owns ``rows_per_cta`` rows of W (``threadIdx.y``), of each product; ``threads_per_row``
lanes (``threadIdx.x``) split each row's K, every lane loading 16-byte vectors of W and x,
``unroll`` of them issued before the first multiply-add; the lanes' partial sums meet in a
cross-thread reduction (warp shuffles, through shared memory past one warp), then the epilogue
runs on the row's results. Against dlight's GEMV rule (16 rows a CTA, 32 lanes a row) more lanes
a row keep a long K from serializing: on the 1B Llama's 2048 x 8192 down projection at one row
9.8 us against dlight's 11.5 (H200, ``bench/results/archive/row_gemv_configs_s51.json``).
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm_ffi
from tvm import s_tir, tirx

from ..errors import ClusterError
from ..transform.buffers import element_bytes

VECTOR_BYTES = 16
MAX_THREADS = 1024


@dataclass(frozen=True)
class RowGemvConfig:
    """``rows_per_cta`` rows of W a CTA, ``threads_per_row`` lanes splitting each row's K,
    ``unroll`` 16-byte loads a lane issues before it multiplies."""

    rows_per_cta: int
    threads_per_row: int
    unroll: int = 4

    @property
    def threads(self) -> int:
        return self.rows_per_cta * self.threads_per_row

    def explain(self) -> str:
        return (f"row GEMV: {self.rows_per_cta} rows of W a CTA, {self.threads_per_row} lanes a row, "
                f"{self.unroll} 16-byte loads a lane unrolled")


@dataclass(frozen=True)
class RowGemv:
    """A one-row matmul ``func`` as this rule sees it: ``n`` outputs over ``k`` of each product,
    W's element bytes, the reduction blocks' names (one, or a gated layer's two) and the
    epilogue block's (None without one)."""

    func: tirx.PrimFunc
    n: int
    k: int
    elem_bytes: int
    reductions: tuple[str, ...]
    epilogue: str | None

    @property
    def vector(self) -> int:
        return VECTOR_BYTES // self.elem_bytes


def find_row_gemv(func: tirx.PrimFunc) -> RowGemv:
    """``func`` as one or two reduction blocks over (unit rows, ``n`` columns, ``k``) each
    reading a matrix of ``k`` columns, then at most one elementwise block reading each product
    where it writes (a residual, a bias, a cast; a gated layer's ``silu(gate) * up``); ClusterError
    naming what differs. A matrix-vector product without the unit row (``y[i] = sum_k A[i, k]
    x[k]``) is the split-K reduction's."""
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    reductions = [b for b in blocks if any(v.iter_type == tirx.IterVar.CommReduce for v in b.iter_vars)]
    if (not 1 <= len(reductions) <= 2 or any(a is not b for a, b in zip(blocks, reductions))
            or len(blocks) > len(reductions) + 1):
        raise ClusterError("a row GEMV is one or two reduction blocks, then at most one elementwise block")
    epilogue = blocks[len(reductions)] if len(blocks) > len(reductions) else None
    if len(reductions) == 2 and epilogue is None:
        raise ClusterError("two row GEMVs meet in an epilogue")
    shapes = {_product_shape(block) for block in reductions}
    if len(shapes) != 1:
        raise ClusterError(f"the products of a row GEMV have one shape, got {sorted(shapes)}")
    ((n, k, elem_bytes),) = shapes
    if epilogue is not None:
        products = [block.writes[0].source for block in reductions]
        written = epilogue.writes[0].region
        for read in epilogue.reads:
            if any(read.source.same_as(p) for p in products) and not all(  # (one region a buffer)
                    tvm_ffi.structural_equal(a.min, b.min) and tvm_ffi.structural_equal(a.extent, b.extent)
                    for a, b in zip(read.region, written)):
                raise ClusterError("the epilogue reads a product off the element it writes")
    found = RowGemv(func, n, k, elem_bytes, tuple(b.name_hint for b in reductions),
                    None if epilogue is None else epilogue.name_hint)
    if k % found.vector:
        raise ClusterError(f"K={k}: a row GEMV loads {found.vector} elements a vector; K must be a multiple")
    return found


def _product_shape(block) -> tuple[int, int, int]:
    """(columns, K, W's element bytes) of one reduction block of a row GEMV; ClusterError
    naming what differs."""
    spatial = [v for v in block.iter_vars if v.iter_type == tirx.IterVar.DataPar]
    reduce = [v for v in block.iter_vars if v.iter_type == tirx.IterVar.CommReduce]
    if not all(isinstance(v.dom.extent, tirx.IntImm) for v in (*spatial, *reduce)) or len(reduce) != 1:
        raise ClusterError("a row GEMV has constant extents and one reduced axis")
    if len(spatial) < 2 or any(int(v.dom.extent) != 1 for v in spatial[:-1]):
        raise ClusterError("a row GEMV computes one row of a matmul (unit rows, then the columns)")
    n, k = int(spatial[-1].dom.extent), int(reduce[0].dom.extent)
    matrices = [r.source for r in block.reads
                if len(r.source.ty.shape) == 2 and int(r.source.ty.shape[1]) == k and int(r.source.ty.shape[0]) >= n]
    if not matrices:
        raise ClusterError(f"a row GEMV reads a matrix of {k} columns and {n} rows or more (W as [N, K])")
    return n, k, element_bytes(matrices[0])


def default_config(found: RowGemv) -> RowGemvConfig:
    """The configuration measured fastest on the 1B Llama's decode GEMMs at one row (H200,
    ``bench/results/archive/row_gemv_configs_s51.json``): a lane per 32 elements of K (4
    vectors), up to 128 lanes a row, 512 threads a CTA, the lane's vectors in two or more steps
    of at most 4 unrolled loads; each a power of two that divides the extents (ClusterError
    where K's vectors take too few lanes: dlight's GEMV predicates a tail). QKV 4.9 us
    (dlight's GEMV 5.4), o_proj 4.1 (4.2), the gate/up projection 17.2 (18.3), the down
    projection (K = 8192) 9.8 (11.5); each within 0.1 us of the best configuration."""
    vectors = found.k // found.vector
    wanted = min(128, max(1, found.k // 32))
    lanes = _largest_power_of_two(vectors, wanted)
    needed = min(32, 1 << (wanted.bit_length() - 1))
    if lanes < needed:
        raise ClusterError(f"K={found.k}: its {vectors} vectors split over {lanes} lanes at most (a power of two "
                           f"dividing them), fewer than {needed}")
    unroll = _largest_power_of_two(vectors // lanes, max(1, min(4, vectors // lanes // 2)))
    config = RowGemvConfig(_largest_power_of_two(found.n, max(1, min(8, 512 // lanes))), lanes, unroll)
    check_config(found, config)
    return config


def _largest_power_of_two(extent: int, most: int) -> int:
    """The largest power of two that divides ``extent`` and is at most ``most``."""
    power = 1
    while power * 2 <= most and extent % (power * 2) == 0:
        power *= 2
    return power


ROWS_PER_CTA = (1, 2, 4, 8)
THREADS_PER_ROW = (4, 8, 16, 32, 64, 128, 256)
UNROLLS = (1, 2, 4, 8)


def candidate_configs(found: RowGemv) -> list[RowGemvConfig]:
    """Every configuration of :data:`ROWS_PER_CTA` x :data:`THREADS_PER_ROW` x :data:`UNROLLS`
    valid for ``found`` (the default among them, whatever the extents)."""
    configs = []
    for rows in ROWS_PER_CTA:
        for lanes in THREADS_PER_ROW:
            for unroll in UNROLLS:
                config = RowGemvConfig(rows, lanes, unroll)
                try:
                    check_config(found, config)
                except ClusterError:
                    continue
                configs.append(config)
    default = default_config(found)
    return configs if default in configs else [default, *configs]


def check_config(found: RowGemv, config: RowGemvConfig) -> None:
    """ClusterError naming the first limit ``config`` breaks for ``found``."""
    if config.threads > MAX_THREADS:
        raise ClusterError(f"{config.threads} threads a CTA > {MAX_THREADS}")
    if found.n % config.rows_per_cta:
        raise ClusterError(f"N={found.n} is not a multiple of {config.rows_per_cta} rows a CTA")
    step = config.threads_per_row * found.vector * config.unroll
    if found.k % step:
        raise ClusterError(f"K={found.k} is not a multiple of a step's {step} elements "
                           f"({config.threads_per_row} lanes x {found.vector} x {config.unroll} unrolled)")


def schedule_row_gemv(found: RowGemv, config: RowGemvConfig) -> s_tir.Schedule:
    """The schedule of the module docstring for ``found`` in ``config``."""
    check_config(found, config)
    sch = s_tir.Schedule(found.func)
    partials = []
    for name in found.reductions:  # K over the lanes: their partial sums, then the lanes' sum
        k = sch.get_loops(sch.get_sblock(name))[-1]
        _, _, lane, _ = sch.split(k, [None, config.unroll, config.threads_per_row, found.vector])
        partials.append(sch.rfactor(lane, factor_axis=0))
    if found.epilogue is None:
        columns = sch.get_loops(sch.get_sblock(found.reductions[0]))[:-1]
    else:  # each product's lane sum where the epilogue reads it
        columns = sch.get_loops(sch.get_sblock(found.epilogue))
        for name in found.reductions:  # (its lane loop innermost: a cross-thread reduction's must be)
            sch.compute_at(sch.get_sblock(name), columns[-1])
    cta, row = sch.split(sch.fuse(*columns), [None, config.rows_per_cta])
    sch.bind(cta, "blockIdx.x")
    sch.bind(row, "threadIdx.y")
    for name, partial in zip(found.reductions, partials):
        _stage_lanes(sch, sch.get_sblock(name), partial, row, found.epilogue is not None)
    return sch


def _stage_lanes(sch: s_tir.Schedule, block, partial, row, local: bool) -> None:
    """A product's ``partial`` sums under ``row`` with every loop kept (unit ones too: the
    lanes, the row's unit axes, then the steps, the unrolled loads and the vector), each lane's
    unrolled vectors of W and x staged in registers; its lane sum ``block`` a cross-thread
    reduction, its result in a register where ``local`` (an epilogue reads it)."""
    sch.compute_at(partial, row, preserve_unit_loops=True)
    loops = sch.get_loops(partial)
    lane, unrolled = loops[2], loops[-2]
    sch.bind(lane, "threadIdx.x")
    for index in range(len(sch.get(partial).reads)):
        staged = sch.cache_read(partial, index, "local", consumer_blocks=[partial])  # (x: the other product's too)
        sch.compute_at(staged, unrolled)  # unrolled: the step's loads are issued before its multiplies
        sch.vectorize(sch.get_loops(staged)[-1])
    sch.unroll(unrolled)
    sch.bind(sch.get_loops(block)[-1], "threadIdx.x")
    sch.set_scope(partial, 0, "local")
    if local:
        sch.set_scope(block, 0, "local")
