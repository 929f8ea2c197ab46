"""One row times a matrix (``y[j] = sum_k x[k] W[j, k]``, the matmul of a decode batch of
one) with its elementwise epilogue, streaming W from HBM with enough loads in flight; or two
such products over the same row (a SwiGLU's gate and up halves of one fused weight) meeting in
one epilogue (``silu(gate[j]) * up[j]``). Two rows (a decode batch of two) take the same
schedule with each lane's vector of W, loaded once, multiplied into both rows' sums. A batch of
one-row products, each over its own W (``torch.bmm`` of a decode step's per-head ``q @ k^T``),
takes it with the batch axes leading the grid.

Each CTA owns ``rows_per_cta`` rows of W (``threadIdx.y``), of each product; ``threads_per_row``
lanes (``threadIdx.x``) split each row's K, every lane loading 16-byte vectors of W and x,
``unroll`` of them a step in unrolled code (so their loads may issue ahead of the multiply-adds,
which the compiler schedules); the lanes' partial sums meet in a
cross-thread reduction (warp shuffles, through shared memory past one warp), then the epilogue
runs on the row's results. The kernel launches programmatically, each CTA prefetching its rows of
a model's weight into L2 before it waits for the kernel before it
(:mod:`tvm_dsm.transform.weight_prefetch`): HBM streams them while that kernel (a norm,
attention) runs; on the 1B Llama's decode at one row, 0.883 ms a step against 0.924 (H200,
``bench/results/archive/llama_1b_weight_prefetch_s52.json``). Against dlight's GEMV rule (16
rows a CTA, 32 lanes a row) more lanes a row keep a long K from serializing: on the 1B Llama's
2048 x 8192 down projection at one row 9.8 us against dlight's 11.5 (H200,
``bench/results/archive/row_gemv_configs_s51.json``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import tvm_ffi
from tvm import s_tir, tirx

from ..annotations import PREFETCH_ROWS_KEY
from ..errors import ClusterError, passes
from ..hardware import MAX_CTA_THREADS, load_hardware
from ..ir import largest_power_of_two, uses
from ..transform.buffers import element_bytes
from ..transform.programmatic_launch import launch_programmatically
from .elementwise import VECTOR_BYTES
from .fused_chain import merge_elementwise_blocks


@dataclass(frozen=True)
class RowGemvConfig:
    """``rows_per_cta`` rows of W a CTA, ``threads_per_row`` lanes splitting each row's K,
    ``unroll`` 16-byte loads of each operand a lane takes a step, in unrolled code."""

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
class Gemv:
    """A one- or few-row matmul ``func`` as the GEMV rules (this one, and the column GEMV's for
    ``[K, N]`` weights) see it: ``n`` outputs a row over ``k`` of each product, W's element
    bytes, the reduction blocks' names (one, or a gated layer's two), the epilogue block's (None
    without one), the rows (each vector of W, loaded once, multiplies every row) and the
    alignment of the elements read of each row of W (:func:`_product_shape`)."""

    func: tirx.PrimFunc
    n: int
    k: int
    elem_bytes: int
    reductions: tuple[str, ...]
    epilogue: str | None
    rows: int = 1
    row_alignment: int = 1
    #: Products of the batch (``torch.bmm`` of one-row products, decode's per-head ``q @ k^T``):
    #: each its own W, the leading axes of x, W and the output
    batch: int = 1

    @property
    def vector(self) -> int:
        return VECTOR_BYTES // self.elem_bytes


def find_row_gemv(func: tirx.PrimFunc) -> Gemv:
    """``func`` as one or two reduction blocks over (one row, or up to :data:`MAX_ROWS` of its
    element size; ``n`` columns; ``k``), each a sum of ``x[i, k] * W[j, k]`` (``k`` innermost in both, x and W of
    one element size), then at most one elementwise block (:func:`find_gemv`); ClusterError
    naming what differs. A matrix-vector product without the unit row
    (``y[i] = sum_k A[i, k] x[k]``) is the split-K reduction's; W stored ``[K, N]`` the column
    GEMV's (:mod:`tvm_dsm.rules.column_gemv`)."""
    found = find_gemv(func, weight_nk=True)
    most = MAX_ROWS.get(found.elem_bytes, 1)
    if found.rows > most:
        raise ClusterError(f"a row GEMV computes 1 to {most} rows of {found.elem_bytes}-byte elements")
    k = found.k
    vectors = k // found.vector
    if k % found.vector:
        raise ClusterError(f"K={k}: a row GEMV loads {found.vector} elements a vector; K must be a multiple")
    lanes = _default_lanes(found)
    if found.rows > 1 and lanes < min_lanes(found.rows):
        raise ClusterError(f"K={k}: {found.rows} rows take at least {min_lanes(found.rows)} lanes a row (a lane per 32 "
                           f"elements of K gives {lanes})")
    if vectors // lanes > MAX_VECTORS_PER_LANE and not _dlight_grid_leaves_sms_short(found, lanes):
        raise ClusterError(f"K={k}: its {vectors} vectors split over {lanes} lanes at most "
                           f"(a divisor of them): more than {MAX_VECTORS_PER_LANE} a lane (up to "
                           f"{MAX_LONG_VECTORS_PER_LANE} where {DLIGHT_GEMV_LANES}+ lanes split a row of fewer "
                           f"than {DLIGHT_GEMV_ROWS * 2} x the SMs' columns)")
    return found


def find_gemv(func: tirx.PrimFunc, weight_nk: bool) -> Gemv:
    """``func`` as one or two reduction blocks, each a product of a few rows of x and a matrix W
    stored ``[N, K]`` (``weight_nk``) or ``[K, N]`` (:func:`_product_shape`), or of one row of
    each of a batch of x and W, all of one shape,
    then at most one elementwise block over the rows and columns reading every product where it
    writes (a residual, a bias, a cast; a gated layer's ``silu(gate) * up``), the products its
    own buffers; ClusterError naming what differs. Elementwise blocks feeding only elementwise
    blocks (TOPI's SiLU: a sigmoid, then the product) are first inlined into them (the found
    function is that one)."""
    sch = s_tir.Schedule(func)
    merge_elementwise_blocks(sch)
    func = sch.mod["main"]
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    reductions = [b for b in blocks if any(v.iter_type == tirx.IterVar.CommReduce for v in b.iter_vars)]
    if (not 1 <= len(reductions) <= 2 or any(a is not b for a, b in zip(blocks, reductions))
            or len(blocks) > len(reductions) + 1):
        raise ClusterError("a GEMV is one or two reduction blocks, then at most one elementwise block")
    epilogue = blocks[len(reductions)] if len(blocks) > len(reductions) else None
    if len(reductions) == 2 and epilogue is None:
        raise ClusterError("two GEMVs meet in an epilogue")
    found = [_product_shape(block, weight_nk) for block in reductions]
    shapes = {shape for shape, _ in found}
    if len(shapes) != 1:
        raise ClusterError(f"the products of a GEMV have one shape, got {sorted(shapes)}")
    ((batch, rows, n, k, elem_bytes),) = shapes
    if batch > 1 and rows > 1:
        raise ClusterError("a GEMV over a batch of products computes one row of each")
    products = [block.writes[0].source for block in reductions]
    if any(str(p.dtype) != "float32" for p in products):
        raise ClusterError("a GEMV accumulates in fp32 (sums written in 16 bits are widened first)")
    if any(r.source.same_as(p) for block in reductions for r in block.reads for p in products):
        raise ClusterError("a GEMV's product reads the other's")
    if epilogue is not None:
        _check_epilogue(func, epilogue, products, rows, n, batch)
    return Gemv(func, n, k, elem_bytes, tuple(b.name_hint for b in reductions),
                None if epilogue is None else epilogue.name_hint, rows, math.gcd(*(a for _, a in found)), batch)


#: The most rows of x the rule takes, by element bytes: each lane multiplies its vector of W into
#: every row. 16-bit: at 2 rows it ran the 2048 x 2048 and 2048 x 8192 products in 4.1 and 11.8 us
#: against the split-K GEMM's 6.0 and 15.3 (torch 6.1, 13.8); at 8 rows it lost on every shape,
#: the lanes' conversions and multiply-adds bound (H200,
#: ``bench/results/archive/batched_row_gemv_s58.json``). fp32 has no tensor-core GEMM to lose to
#: and half the multiply-adds per byte of W: up to 8 rows. fp8 as 16-bit. 16-bit at 3 and 4 rows
#: lost to the split-K GEMM on 6 of 7 layers of 2048-28672 x 2048-8192 (``row_gemv_rows_s92.json``).
MAX_ROWS = {1: 2, 2: 2, 4: 8}
#: The fewest lanes any row takes: with one, s_tir binds the rows' loop to threadIdx.x beside the
#: lane's (the rows' threadIdx.y dropped), and each CTA computed its first row alone (a MoE
#: block's 64 x 32 expert GEMV at one token: 7 of 8 outputs zero on the H200).
MIN_LANES = 2
#: The fewest lanes a row of several rows' schedule takes (more lanes than rows: each row's lane
#: sum is told from the rows by its extent).
MIN_LANES_FOR_ROWS = 4
#: The most 16-byte vectors of K one lane reads (the measured default reads 4): past it a row's
#: loads serialize, and dlight's GEMV, whose lanes predicate a tail, keeps the function (except
#: where :func:`_dlight_grid_leaves_sms_short`, up to :data:`MAX_LONG_VECTORS_PER_LANE`).
MAX_VECTORS_PER_LANE = 16
#: The most a lane reads where dlight's grid leaves SMs short (measured up to 37).
MAX_LONG_VECTORS_PER_LANE = 48
#: Lanes and rows dlight's GEMV gives a row and a CTA.
DLIGHT_GEMV_LANES, DLIGHT_GEMV_ROWS = 32, 16


def min_lanes(rows: int) -> int:
    """The fewest lanes a row of ``rows`` rows' schedule takes: :data:`MIN_LANES_FOR_ROWS`, and
    twice the rows (more lanes than rows: each row's lane sum is told from the rows by its
    extent)."""
    return max(MIN_LANES_FOR_ROWS, 2 * rows)


def _dlight_grid_leaves_sms_short(found: Gemv, lanes: int) -> bool:
    """Whether the rule keeps a row GEMV past :data:`MAX_VECTORS_PER_LANE` a lane (up to
    :data:`MAX_LONG_VECTORS_PER_LANE`): where as many lanes split a row as dlight's GEMV gives it
    and dlight's grid leaves SMs fewer than two CTAs (the SM count of the GPU planned for).
    H200, the SwiGLU down projections at one row (``bench/results/archive/row_gemv_long_k_s57.json``):
    896 x 4864 (dlight's 56 CTAs) and 3584 x 18944 (224) ran their chains 23.1 -> 13.9 us and
    136 -> 118; 8192 x 28672 (dlight's 512 CTAs) 337 -> 373, which dlight keeps."""
    return (lanes >= DLIGHT_GEMV_LANES and found.k // found.vector // lanes <= MAX_LONG_VECTORS_PER_LANE
            and found.n < DLIGHT_GEMV_ROWS * 2 * load_hardware().sm_count)


def _product_shape(block, weight_nk: bool) -> tuple[tuple[int, int, int, int, int], int]:
    """(batch, rows, columns, K, element bytes) of one reduction block of a GEMV, and the
    alignment of the elements it reads of each row of W (the elements a row of W holds, and the
    offset of its first column read, if any: the largest number dividing both). It reads exactly
    a matrix W of each product of the batch (no row index: ``W[b.., j, k]``, K its innermost
    index, where ``weight_nk``, else ``W[b.., k, j + c]``, the column innermost) and rows
    ``x[b.., .., k]`` (no column index, K innermost), of one element size: the batch axes are
    the leading axes of W, each indexed by an axis of the block that x's index names too;
    ClusterError naming what differs."""
    spatial = [v for v in block.iter_vars if v.iter_type == tirx.IterVar.DataPar]
    reduce = [v for v in block.iter_vars if v.iter_type == tirx.IterVar.CommReduce]
    if not all(isinstance(v.dom.extent, tirx.IntImm) for v in (*spatial, *reduce)) or len(reduce) != 1:
        raise ClusterError("a GEMV has constant extents and one reduced axis")
    if len(spatial) < 2:
        raise ClusterError("a GEMV computes rows of a matmul (rows, then the columns)")
    column, depth = spatial[-1].var, reduce[0].var
    reads = [(read.source, [r.min for r in read.region]) for read in block.reads]
    matrix = [(source, indices) for source, indices in reads if any(uses(i, column) for i in indices)]
    row = [(source, indices) for source, indices in reads if not any(uses(i, column) for i in indices)]
    batch = _batch_axes(matrix[0][1], spatial[:-1]) if len(matrix) == 1 else []
    outer = [v for v in spatial[:-1] if int(v.dom.extent) != 1 and not any(v.same_as(b) for b in batch)]
    rows = int(outer[0].dom.extent) if outer else 1
    if len(outer) > 1:
        raise ClusterError("a GEMV computes rows of a matmul (rows, then the columns)")
    n, k = int(spatial[-1].dom.extent), int(reduce[0].dom.extent)
    for source, indices in reads:
        if not any(uses(i, depth) for i in indices):
            raise ClusterError(f"a GEMV reads {source.name} along K (a factor outside the sum)")
    if len(matrix) != 1 or len(row) != 1 or len(matrix[0][0].ty.shape) != 2 + len(batch):
        raise ClusterError(f"a GEMV reads one matrix W (of each product of its batch) and one row x[.., k]; "
                           f"got {len(matrix)} and {len(row)}")
    (w, w_indices), (x, x_indices) = matrix[0], row[0]
    if not all(any(tvm_ffi.structural_equal(i, b.var) for i in x_indices) for b in batch):
        raise ClusterError("a GEMV over a batch of products reads the row x of each product")
    w_indices = w_indices[len(batch):]
    if any(uses(i, v.var) for i in w_indices for v in spatial[:-1]):
        raise ClusterError("a GEMV's W is the same for every row")
    # the row of W a column reads may sit at an offset (a gated layer's halves of one weight)
    if weight_nk and not (tvm_ffi.structural_equal(w_indices[1], depth) and uses(w_indices[0], column)
                          and not uses(w_indices[0], depth)):
        raise ClusterError("this GEMV reads its matrix as W[j, k], K innermost")
    if not weight_nk and not (tvm_ffi.structural_equal(w_indices[0], depth) and _column_at_offset(w_indices[1], column)):
        raise ClusterError("this GEMV reads its matrix as W[k, j + c], the column innermost")
    if not tvm_ffi.structural_equal(x_indices[-1], depth) or any(uses(i, depth) for i in x_indices[:-1]):
        raise ClusterError(f"a GEMV reads {x.name} along K as its innermost index only")
    if element_bytes(w) != element_bytes(x):
        raise ClusterError("a GEMV's x and W have one element size (vector loads of both)")
    row_length = int(w.ty.shape[-1])
    offset = int(w_indices[1].b) if not weight_nk and isinstance(w_indices[1], tirx.Add) else 0
    return (math.prod(int(b.dom.extent) for b in batch), rows, n, k, element_bytes(w)), math.gcd(row_length, offset)


def _batch_axes(w_indices: list, outer: list) -> list:
    """The axes of ``outer`` (a reduction block's spatial axes before its column) that are the
    leading indices ``w_indices`` of the matrix it reads, beyond its last two: the products of a
    batch, each over its own W."""
    batch = []
    for index in w_indices[:-2]:
        axis = next((v for v in outer if tvm_ffi.structural_equal(index, v.var)), None)
        if axis is None:
            break
        batch.append(axis)
    return batch


def _column_at_offset(index: tirx.PrimExpr, column: tirx.Var) -> bool:
    """Whether ``index`` is ``column`` or ``column + c`` for a constant ``c``."""
    if isinstance(index, tirx.Add):
        return tvm_ffi.structural_equal(index.a, column) and isinstance(index.b, tirx.IntImm)
    return tvm_ffi.structural_equal(index, column)


def _check_epilogue(func: tirx.PrimFunc, epilogue, products: list, rows: int, n: int, batch: int = 1) -> None:
    """ClusterError unless ``epilogue`` covers the ``rows`` x ``n`` outputs (of each product of
    the ``batch``), reads every product, each exactly at the element it writes, and the products
    are the function's own buffers."""
    params = list(func.params)
    if any(p.same_as(q) for p in products for q in params):
        raise ClusterError("a GEMV with an epilogue keeps its products in buffers of its own")
    columns = [v for v in epilogue.iter_vars if v.iter_type == tirx.IterVar.DataPar]
    outer = [int(v.dom.extent) for v in columns[:-1] if int(v.dom.extent) != 1]
    covered = outer in ([], [rows]) if batch == 1 else math.prod(outer) == batch
    if int(columns[-1].dom.extent) != n or not covered or (rows > 1 and not outer):
        raise ClusterError(f"a GEMV's epilogue covers its {n} columns of its {rows} row(s)"
                           + (f" of each of its {batch} products" if batch > 1 else ""))
    written = epilogue.writes[0].region
    for product in products:
        reads = [r for r in epilogue.reads if r.source.same_as(product)]
        # a block's read region of a buffer covers all its accesses: one element, if only one
        if len(reads) != 1 or len(reads[0].region) != len(written) or not all(
                tvm_ffi.structural_equal(a.min, b.min) and tvm_ffi.structural_equal(a.extent, b.extent)
                for a, b in zip(reads[0].region, written)):
            raise ClusterError("the epilogue reads each product once, at the element it writes")


def default_config(found: Gemv) -> RowGemvConfig:
    """The configuration measured fastest on the 1B Llama's decode GEMMs at one row (H200,
    ``bench/results/archive/row_gemv_configs_s51.json``): a lane per 32 elements of K (4
    vectors), up to 128 lanes a row, 512 threads a CTA, the lane's vectors in two or more steps
    of at most 4 unrolled loads; each a power of two that divides the extents. QKV 4.9 us
    (dlight's GEMV 5.4), o_proj 4.1 (4.2), the gate/up projection 17.2 (18.3), the down
    projection (K = 8192) 9.8 (11.5); each within 0.1 us of the best configuration."""
    if found.batch > 1:
        lanes = _batch_lanes(found)
        rows = BATCH_CTA_THREADS // lanes
    else:
        lanes = _default_lanes(found)
        rows = min(8, 512 // lanes)
    per_lane = found.k // found.vector // lanes
    unroll = largest_power_of_two(per_lane, max(1, min(4, per_lane // 2)))
    config = RowGemvConfig(largest_power_of_two(found.n, max(1, rows)), lanes, unroll)
    check_config(found, config)
    return config


#: Threads of a CTA of a batch of one-row products, two 16-byte vectors of K a lane: their rows
#: are short (decode's per-head ``q @ k^T``, K the head dimension), and the one-row default's 8
#: rows of 4 lanes made CTAs of one warp, of which an SM holds 32: on the H200, 32 x 4096 x 128
#: 20.7 us against 9.3, 64 x 8192 x 128 79.9 against 32.6, 256 x 2048 x 64 80.1 against 17.5
#: (torch.bmm 10.8, 36.9, 22.0; 32-128 rows of 4-16 lanes measured,
#: ``bench/results/archive/batched_row_gemv_s92.json``).
BATCH_CTA_THREADS = 256


def _batch_lanes(found: Gemv) -> int:
    """Lanes of a row of a batch of products: two vectors of K each (the largest power of two
    dividing K's vectors, at most 128; see :data:`BATCH_CTA_THREADS`)."""
    vectors = found.k // found.vector
    return largest_power_of_two(vectors, min(128, max(MIN_LANES, vectors // 2)))


def _default_lanes(found: Gemv) -> int:
    """A lane per 32 elements of K, at most 128: the largest power of two that divides K's
    vectors below that; where that leaves a lane more than :data:`MAX_LONG_VECTORS_PER_LANE`
    vectors (K = 3000 in bf16: 375 vectors, one lane), the largest divisor below it (75 lanes
    of 5) where that is a warp or more, or for fp32, whose other kernels run on the CUDA cores.
    H200 (``bench/results/archive/generality_row_gemv_lanes_s64.json``): 1 x 127 x 3000 bf16
    on 75 lanes 2.2 us (dlight's GEMV 20.9, torch 6.1), fp32 2 x 14336 x 3000 45.3 (the CUDA-core
    GEMM 130.6, torch 69.5), an fp32 FFN of one row over K = 1000 on 25 lanes 6.6 (19.3, torch
    14.3); 16-bit rows over K = 1000 on 25 lanes ran 10-16% slower than the split-K GEMM."""
    vectors, most = found.k // found.vector, min(128, max(MIN_LANES, found.k // 32))
    lanes = largest_power_of_two(vectors, most)
    if vectors // lanes > MAX_LONG_VECTORS_PER_LANE:
        divisor = max(d for d in range(1, most + 1) if vectors % d == 0)
        if divisor >= DLIGHT_GEMV_LANES or found.elem_bytes == 4:
            lanes = divisor
    return lanes


ROWS_PER_CTA = (1, 2, 4, 8)
THREADS_PER_ROW = (4, 8, 16, 32, 64, 128, 256)
UNROLLS = (1, 2, 4, 8)


def candidate_configs(found: Gemv, default: RowGemvConfig | None = None) -> list[RowGemvConfig]:
    """Every configuration of :data:`ROWS_PER_CTA` x :data:`THREADS_PER_ROW` x :data:`UNROLLS`
    valid for ``found``, and the default (whose lanes may be fewer than those; computed unless
    given)."""
    configs = []
    for rows in ROWS_PER_CTA:
        for lanes in THREADS_PER_ROW:
            for unroll in UNROLLS:
                config = RowGemvConfig(rows, lanes, unroll)
                if not passes(check_config, found, config):
                    continue
                configs.append(config)
    default = default or default_config(found)
    return configs if default in configs else [default, *configs]


def check_config(found: Gemv, config: RowGemvConfig) -> None:
    """ClusterError naming the first limit ``config`` breaks for ``found``."""
    if config.threads_per_row < MIN_LANES:
        raise ClusterError(f"{config.threads_per_row} lane a row: at least {MIN_LANES} (s_tir binds one lane's rows "
                           "to threadIdx.x, and the kernel computes each CTA's first row alone)")
    if config.threads > MAX_CTA_THREADS:
        raise ClusterError(f"{config.threads} threads a CTA > {MAX_CTA_THREADS}")
    if found.rows > 1 and config.threads_per_row < min_lanes(found.rows):
        raise ClusterError(f"{found.rows} rows take at least {min_lanes(found.rows)} lanes a row, not {config.threads_per_row}")
    if found.n % config.rows_per_cta:
        raise ClusterError(f"N={found.n} is not a multiple of {config.rows_per_cta} rows a CTA")
    step = config.threads_per_row * found.vector * config.unroll
    if found.k % step:
        raise ClusterError(f"K={found.k} is not a multiple of a step's {step} elements "
                           f"({config.threads_per_row} lanes x {found.vector} x {config.unroll} unrolled)")


def schedule_row_gemv(found: Gemv, config: RowGemvConfig) -> s_tir.Schedule:
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
    else:
        columns = sch.get_loops(sch.get_sblock(found.epilogue))
    if found.rows > 1:  # the rows inside each column: the CTAs split the columns alone
        rows = sch.fuse(*columns[:-1]) if len(columns) > 2 else columns[0]
        sch.reorder(columns[-1], rows)
        columns = columns[-1:]
    if found.epilogue is not None:  # each product's lane sum where the epilogue reads it
        for name in found.reductions:  # (its lane loop innermost: a cross-thread reduction's must be)
            sch.compute_at(sch.get_sblock(name), columns[-1])
    cta, row = sch.split(sch.fuse(*columns) if len(columns) > 1 else columns[0], [None, config.rows_per_cta])
    sch.bind(cta, "blockIdx.x")
    sch.bind(row, "threadIdx.y")
    sch.annotate(sch.get_sblock("root"), PREFETCH_ROWS_KEY, config.rows_per_cta)
    launch_programmatically(sch)
    for name, partial in zip(found.reductions, partials):
        _sum_over_lanes(sch, sch.get_sblock(name), partial, row, found, config)
    return sch


def _sum_over_lanes(sch: s_tir.Schedule, lane_sum, partial, row, found: Gemv, config: RowGemvConfig) -> None:
    """A product's ``partial`` sums under ``row`` with every loop kept (unit ones too: the
    lanes, the row's axes, then the steps, the unrolled loads and the vector), each lane's
    unrolled vectors of W and x staged in registers; ``lane_sum`` a cross-thread reduction of
    them, its result in a register where an epilogue reads it. With several rows, each lane's
    sums of every row sit innermost, under its loads, so that a vector of W, loaded once,
    multiplies each row's vector of x; the lanes' sums a cross-thread reduction per row."""
    sch.compute_at(partial, row, preserve_unit_loops=True)
    loops = sch.get_loops(partial)
    lane, (steps, unrolled, vector) = loops[2], loops[-3:]
    if found.rows > 1:
        (of_rows,) = [loop for loop in loops[3:-3] if int(sch.get(loop).extent) == found.rows]
        sch.reorder(steps, unrolled, vector, of_rows)
    sch.bind(lane, "threadIdx.x")
    for index in range(len(sch.get(partial).reads)):
        staged = sch.cache_read(partial, index, "local", consumer_blocks=[partial])  # (x: the other product's too)
        sch.compute_at(staged, unrolled)  # a vector a load; unrolled, the compiler may issue them ahead
        sch.vectorize(sch.get_loops(staged)[-1])
    sch.unroll(unrolled)
    summed = sch.get_loops(lane_sum)
    if found.rows > 1:
        sch.unroll(vector)
        sch.unroll(of_rows)
        lanes = [loop for loop in summed if int(sch.get(loop).extent) == config.threads_per_row][-1]
        (sum_rows,) = [loop for loop in summed[2:] if int(sch.get(loop).extent) == found.rows]
        sch.reorder(sum_rows, lanes)  # the lanes innermost: a cross-thread reduction's must be
        sch.bind(lanes, "threadIdx.x")
    else:
        sch.bind(summed[-1], "threadIdx.x")
    sch.set_scope(partial, 0, "local")
    if found.epilogue is not None:
        sch.set_scope(lane_sum, 0, "local")
