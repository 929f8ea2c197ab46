"""One row times a matrix (``y[j] = sum_k x[k] W[j, k]``, the matmul of a decode batch of
one) with its elementwise epilogue, streaming W from HBM with enough loads in flight.

Each CTA owns ``rows_per_cta`` rows of W (``threadIdx.y``); ``threads_per_row`` lanes
(``threadIdx.x``) split each row's K, every lane loading 16-byte vectors of W and x, ``unroll``
of them issued before the first multiply-add; the lanes' partial sums meet in a cross-thread
reduction (warp shuffles, through shared memory past one warp), then the epilogue runs on the
row's result. Against dlight's GEMV rule (16 rows a CTA, 32 lanes a row) more lanes a row keep
a long K from serializing: dlight took 29 us for the 1B Llama's 2048 x 8192 down projection at
one row where its 12.6 MB QKV took 5 (``bench/results/archive/llama_1b_one_row_gemv_every_k_s51.json``).
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
    """A one-row matmul ``func`` as this rule sees it: ``n`` outputs over ``k``, W's element
    bytes, the reduction block's name and its epilogue block's (None without one)."""

    func: tirx.PrimFunc
    n: int
    k: int
    elem_bytes: int
    reduction: str
    epilogue: str | None

    @property
    def vector(self) -> int:
        return VECTOR_BYTES // self.elem_bytes


def find_row_gemv(func: tirx.PrimFunc) -> RowGemv:
    """``func`` as one reduction block over (unit rows, ``n`` columns, ``k``) reading a
    ``[n, k]`` matrix, then at most one elementwise block reading the product where it writes
    (a residual, a bias, a cast); ClusterError naming what differs. A matrix-vector product
    without the unit row (``y[i] = sum_k A[i, k] x[k]``) is the split-K reduction's."""
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    reductions = [b for b in blocks if any(v.iter_type == tirx.IterVar.CommReduce for v in b.iter_vars)]
    if len(reductions) != 1 or blocks[0] is not reductions[0] or len(blocks) > 2:
        raise ClusterError("a row GEMV is one reduction block, then at most one elementwise block")
    block = reductions[0]
    spatial = [v for v in block.iter_vars if v.iter_type == tirx.IterVar.DataPar]
    reduce = [v for v in block.iter_vars if v.iter_type == tirx.IterVar.CommReduce]
    extents = [v.dom.extent for v in (*spatial, *reduce)]
    if not all(isinstance(e, tirx.IntImm) for e in extents) or len(reduce) != 1:
        raise ClusterError("a row GEMV has constant extents and one reduced axis")
    if len(spatial) < 2 or any(int(v.dom.extent) != 1 for v in spatial[:-1]):
        raise ClusterError("a row GEMV computes one row of a matmul (unit rows, then the columns)")
    n, k = int(spatial[-1].dom.extent), int(reduce[0].dom.extent)
    matrices = [r.source for r in block.reads if [int(x) for x in r.source.ty.shape][-2:] == [n, k]]
    if not matrices:
        raise ClusterError(f"a row GEMV reads a [{n}, {k}] matrix (W as [N, K])")
    epilogue = blocks[1] if len(blocks) == 2 else None
    if epilogue is not None:
        product = block.writes[0].source
        written = epilogue.writes[0].region
        for read in epilogue.reads:
            if read.source.same_as(product) and not all(  # (a block's reads of a buffer are one region)
                    tvm_ffi.structural_equal(a.min, b.min) and tvm_ffi.structural_equal(a.extent, b.extent)
                    for a, b in zip(read.region, written)):
                raise ClusterError("the epilogue reads the product off the element it writes")
    found = RowGemv(func, n, k, element_bytes(matrices[0]), block.name_hint,
                    None if epilogue is None else epilogue.name_hint)
    if k % found.vector:
        raise ClusterError(f"K={k}: a row GEMV loads {found.vector} elements a vector; K must be a multiple")
    return found


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
    block = sch.get_sblock(found.reduction)
    *spatial, k = sch.get_loops(block)
    column = sch.fuse(*spatial)
    cta, row = sch.split(column, [None, config.rows_per_cta])
    steps, unrolled, lane, vector = sch.split(k, [None, config.unroll, config.threads_per_row, found.vector])
    partial = sch.rfactor(lane, factor_axis=0)
    sch.bind(cta, "blockIdx.x")
    sch.bind(row, "threadIdx.y")
    # the partial sums (rfactor put them in a loop nest of their own): each lane's unrolled
    # vectors of W and x staged in registers
    # every loop kept, unit ones too: under (cta, row) the lanes, the row's unit axes, then
    # the steps, the unrolled loads and the vector
    sch.compute_at(partial, row, preserve_unit_loops=True)
    loops = sch.get_loops(partial)
    lane_loop, (steps, unrolled, vector) = loops[2], loops[-3:]
    sch.bind(lane_loop, "threadIdx.x")
    for index in range(len(sch.get(partial).reads)):
        staged = sch.cache_read(partial, index, "local")
        sch.compute_at(staged, unrolled)  # unrolled: the step's loads are issued before its multiplies
        sch.vectorize(sch.get_loops(staged)[-1])
    sch.unroll(unrolled)
    # the lanes' sums meet in a cross-thread reduction
    sch.bind(sch.get_loops(block)[-1], "threadIdx.x")
    sch.set_scope(partial, 0, "local")
    if found.epilogue is not None:  # (without one the reduction writes the output itself)
        sch.set_scope(block, 0, "local")
    if found.epilogue is not None:
        epilogue = sch.get_sblock(found.epilogue)
        sch.reverse_compute_at(epilogue, row)
    return sch
