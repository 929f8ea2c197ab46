"""A few rows times a matrix stored ``[K, N]`` (``y[i, j] = sum_k x[i, k] W[k, j]``: GPT-2's
Conv1D, JAX and Keras layers, a Relax ``matmul`` with its weight not transposed) at a decode
batch, with its elementwise epilogue, or two such products over the same rows meeting in one
(a gated layer), streaming W from HBM at any element type.

W's rows run along the columns of the output, so the lanes of a warp (``threadIdx.x``) take
neighbouring 16-byte vectors of a row of W (``vector`` columns each, loads that coalesce), and
``slices`` thread rows (``threadIdx.y``) split K, each over a contiguous range of it in steps of
``unroll`` rows of W, whose loads are issued together before their multiply-adds (K splits
into whole steps; the last CTA's columns past N are predicated off); every thread
keeps its ``rows x vector`` sums in registers, multiplying each vector of W, loaded once, into
every row of x (whose ``unroll`` elements a row come in one vector load). A CTA owns
``lanes x vector`` columns; its slices' partial sums meet once in shared memory, where every
thread of the CTA adds the slices of its outputs in a fixed order (the same result every run)
and applies the epilogue.

A few columns over a long K (a narrow output: N = 128 to 1000 over K = 4096 to 14336) leave few
CTAs, each streaming its columns of W over the whole of K. A cluster of ``cluster_size`` CTAs
then splits K: each CTA's slices sum its range into its slice of a distributed shared memory
buffer (:func:`~tvm_dsm.schedule.place_in_dsm`), and after the cluster barrier each CTA adds
its peers' partials of a share of the columns in rank order (one kernel, the same result every
run).

The [N, K] layout is the row GEMV's (:mod:`tvm_dsm.rules.row_gemv`), whose lanes split K instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tvm import s_tir, tirx

from ..errors import ClusterError, passes
from ..hardware import MAX_CTA_THREADS, load_hardware
from ..ir import largest_power_of_two, uses
from ..schedule import DSM_SCOPE, bind_cluster_nest, bind_rank, check_cluster_size, place_in_dsm
from ..transform.programmatic_launch import launch_programmatically
from .elementwise import VECTOR_BYTES
from .row_gemv import Gemv, find_gemv

#: The most rows of x the rule takes, by element bytes (H200,
#: ``bench/results/archive/column_gemv_configs_s69.json``): 16-bit rows up to 4 ran faster than
#: or level with the tensor-core GEMM (4 x 14336 x 2048 19.8 us against 22.8), 8 slower (27.4
#: against 23.1); fp32 up to 8 ran at half the CUDA-core GEMM's time (8 x 14336 x 1000 27.3 us
#: against 51.2), 16 rows (16 x 4096 x 4096) took their best configuration to beat it (38.6
#: against 50.2). 8-bit types are not taken (not measured).
MAX_ROWS = {4: 8, 2: 4}
#: Columns a column GEMV of several rows of a 16-bit type takes at the least where they load in
#: 16-byte vectors (the split-K GEMM's copies take them too). H200
#: (``bench/results/archive/column_gemv_defaults_depth_s70.json``), against the split-K GEMM:
#: 2 x 1024 x 14336 fp16 19.3 us against 12.4, 4 x 1024 x 4096 7.5 against 5.3, 2 x 512 x 14336
#: 12.4 against 12.1; 4 x 2048 x 8192 bf16 16.2 against 17.7, 4 x 14336 x 2048 19.9 against
#: 22.6. Odd columns (a column a load) keep it: 2 x 1021 x 512 fp16 2.5 us against the CUDA-core
#: GEMM's 5.5 (``bench/results/archive/generality_column_gemv_s69.json``).
MIN_COLUMNS_FOR_ROWS = 2048
#: Shared memory the slices' partial sums may take (the static limit of a CTA).
SHARED_BYTES = 48 * 1024
#: Threads a CTA at the least (two warps).
MIN_THREADS = 64
#: The most steps a slice takes pipelined: the loop is unrolled (its double-buffered registers
#: indexed by constants), its code growing with them.
MAX_PIPELINED_STEPS = 32

#: The share of the SMs below which the default trades lanes for slices (more, narrower CTAs)
#: up to :data:`LONG_K`: 1 x 2048 x 2048 fp16 on 32 CTAs of 8 lanes took 10.1 us, on 64 of 4
#: lanes and 128 slices 6.9.
FEWEST_CTAS_PER_SM = 0.25
#: K past which a column GEMV must fill half the SMs, and a gated one is refused: each CTA
#: streams its columns of W over the whole of K, which a split-K GEMM spreads over clusters.
#: H200 generality run (``bench/results/archive/generality_column_gemv_s69.json``): three
#: projections over K = 14336 at 2 rows on 64, 64 and 8 CTAs 112.7 us against the split-K
#: GEMM's 36.1, an fp32 down projection (N = 1000, K = 14336) on 63 CTAs slower than the
#: CUDA-core GEMM (its FFN 92.8 -> 105.8 us), the gated 2 x 4096 x 14336 bf16 136.8 us against
#: the gated split-K GEMM's 89.2.
LONG_K = 4096
#: Bytes of each row of W a CTA reads past :data:`LONG_K`, and the default's, at the least:
#: 4 x 2048 x 8192 bf16 on 2 lanes (32 bytes a row, a sector) ran 22.2-26.5 us against the
#: split-K GEMM's 17.8.
LONG_K_ROW_BYTES = 64


def min_ctas() -> float:
    """The fewest CTAs a configuration past :data:`LONG_K` has, and the default narrows its CTAs
    to reach: half the SMs."""
    return 0.5 * load_hardware().sm_count


@dataclass(frozen=True)
class ColumnGemvConfig:
    """``lanes`` threads across a CTA's columns (a vector each), ``slices`` thread rows
    splitting K, ``unroll`` rows of W a thread loads a step; ``pipelined``: the next step's
    loads issued before this step's multiply-adds."""

    lanes: int
    slices: int
    unroll: int = 4
    pipelined: bool = False
    #: CTAs of a cluster splitting K, their partial sums added through DSM
    cluster_size: int = 1

    @property
    def threads(self) -> int:
        return self.lanes * self.slices

    def explain(self) -> str:
        cluster = f", K split over clusters of {self.cluster_size}" if self.cluster_size > 1 else ""
        return (f"column GEMV: {self.lanes} lanes of a vector across the columns, {self.slices} slices of K, "
                f"{self.unroll} rows of W a step" + (", pipelined" if self.pipelined else "") + cluster)


def find_column_gemv(func: tirx.PrimFunc) -> Gemv:
    """``func`` as one or two products of up to :data:`MAX_ROWS` rows of x and a matrix
    ``W[k, j]`` and at most one elementwise block (:func:`~.row_gemv.find_gemv`); ClusterError
    naming what differs."""
    found = find_gemv(func, weight_nk=False)
    if found.batch > 1:
        raise ClusterError("a column GEMV computes one product, not a batch of them")
    if found.elem_bytes not in MAX_ROWS:
        raise ClusterError(f"a column GEMV takes fp32 and 16-bit operands, not {found.elem_bytes}-byte ones")
    most = MAX_ROWS[found.elem_bytes]
    if found.rows > most:
        raise ClusterError(f"a column GEMV computes 1 to {most} rows of {found.elem_bytes}-byte elements")
    if len(found.reductions) == 2 and found.k > LONG_K:
        raise ClusterError(f"K={found.k}: a gated column GEMV takes K up to {LONG_K}")
    if (found.elem_bytes == 2 and found.rows > 1 and found.n < MIN_COLUMNS_FOR_ROWS
            and vector_columns(found) * found.elem_bytes == VECTOR_BYTES):
        raise ClusterError(f"N={found.n}: a column GEMV of {found.rows} rows of a 16-bit type takes "
                           f"{MIN_COLUMNS_FOR_ROWS}+ columns where they load in 16-byte vectors")
    if next(_candidates(found), None) is None:
        raise ClusterError(f"no column GEMV configuration fits {found.rows} x {found.n} x {found.k} (past K = "
                           f"{LONG_K}: {min_ctas():.0f}+ CTAs of {LONG_K_ROW_BYTES}+ bytes of a row of W)")
    return found


def vector_columns(found: Gemv) -> int:
    """Columns of W a lane loads at once: 16 bytes where N and the alignment of the columns read
    of each row of W are multiples of them (each row's columns then start a whole number of
    vectors in), else the largest power of two dividing both."""
    return largest_power_of_two(math.gcd(found.n, found.row_alignment), found.vector)


def row_vector(found: Gemv, config: ColumnGemvConfig) -> int:
    """Elements of a row of x a thread loads at once: its step's ``unroll`` elements, up to 16
    bytes, a power of two dividing K (each row of x starts a whole number of them in)."""
    return largest_power_of_two(found.k, min(config.unroll, found.vector))


def shared_bytes(found: Gemv, config: ColumnGemvConfig) -> int:
    """Shared memory of the slices' fp32 partial sums of every product, and in a cluster of the
    partials its CTAs exchange."""
    columns = config.lanes * vector_columns(found)
    return 4 * found.rows * columns * len(found.reductions) * (config.slices + (config.cluster_size > 1))


def ctas(found: Gemv, config: ColumnGemvConfig) -> int:
    """CTAs of the grid: one per ``lanes x vector`` columns (the last one's past N predicated
    off) and rank of a cluster."""
    return -(-found.n // (config.lanes * vector_columns(found))) * config.cluster_size


def check_config(found: Gemv, config: ColumnGemvConfig) -> None:
    """ClusterError naming the first limit ``config`` breaks for ``found``."""
    c = config
    if not MIN_THREADS <= c.threads <= MAX_CTA_THREADS:
        raise ClusterError(f"{c.threads} threads a CTA: between {MIN_THREADS} and {MAX_CTA_THREADS}")
    check_cluster_size(c.cluster_size)
    # whole steps (TVM's compute_at drops the predicate of a reduction's tail)
    if found.k % (c.cluster_size * c.slices * c.unroll):
        ctas = f"{c.cluster_size} CTAs x " if c.cluster_size > 1 else ""
        raise ClusterError(f"K={found.k} is not a multiple of {ctas}{c.slices} slices x {c.unroll} rows of W a step")
    if (c.lanes * vector_columns(found)) % c.cluster_size:
        raise ClusterError(f"a CTA's {c.lanes * vector_columns(found)} columns do not split over its cluster's "
                           f"{c.cluster_size} CTAs")
    if c.pipelined and not 2 <= steps(found, c) <= MAX_PIPELINED_STEPS:
        raise ClusterError(f"{steps(found, c)} steps a slice: pipelined (unrolled), 2 to {MAX_PIPELINED_STEPS}")
    if shared_bytes(found, c) > SHARED_BYTES:
        raise ClusterError(f"the slices' partial sums take {shared_bytes(found, c)} bytes of shared memory "
                           f"> {SHARED_BYTES}")


def steps(found: Gemv, config: ColumnGemvConfig) -> int:
    """Steps of each slice: its share of K over the step's rows."""
    return found.k // (config.cluster_size * config.slices * config.unroll)


LANES = (2, 4, 8, 16, 32)
UNROLLS = (1, 2, 4, 8)
#: The most slices of K a CTA (any divisor of K's steps up to it).
MAX_SLICES = 128
#: CTAs of a cluster splitting K (portable sizes).
CLUSTER_SIZES = (1, 2, 4, 8)


def candidate_configs(found: Gemv) -> list[ColumnGemvConfig]:
    """Every valid configuration for ``found`` of :data:`LANES` x :data:`UNROLLS` x
    :data:`CLUSTER_SIZES` (clusters where columns load in 16-byte vectors), each divisor of the
    steps of K up to :data:`MAX_SLICES` slices, pipelined or not; past :data:`LONG_K`, those of
    :func:`min_ctas` CTAs or more, each reading :data:`LONG_K_ROW_BYTES` of a row."""
    return list(_candidates(found))


def _candidates(found: Gemv) -> Iterator[ColumnGemvConfig]:
    """:func:`candidate_configs` one at a time."""
    fewest, lane_bytes = min_ctas(), vector_columns(found) * found.elem_bytes
    clusters = CLUSTER_SIZES if lane_bytes == VECTOR_BYTES else (1,)  # (measured over 16-byte vectors only)
    return (c for cluster in clusters for unroll in UNROLLS
            for slices in range(2, MAX_SLICES + 1) if found.k % (cluster * slices * unroll) == 0  # (whole steps)
            for lanes in LANES for pipelined in (False, True)
            if passes(check_config, found, c := ColumnGemvConfig(lanes, slices, unroll, pipelined, cluster))
            and (found.k <= LONG_K or (ctas(found, c) >= fewest and lanes * lane_bytes >= LONG_K_ROW_BYTES)))


#: The slices, lanes and bytes of W a thread loads a step the default aims at: the sweep's best
#: at most shapes (H200, ``bench/results/archive/column_gemv_configs_s69.json``).
DEFAULT_SLICES, DEFAULT_LANES, DEFAULT_STEP_BYTES = 64, 8, 64
#: A thread's fp32 sums (rows x vector) past which the default takes fewer lanes in proportion:
#: 4 rows of a 16-bit type ran fastest on 4 lanes, 8 rows on 2.
DEFAULT_SUMS = 16
#: CTAs the default's clusters (splitting K) reach, a share of the SMs: about two an SM. Threads
#: of a CTA in a cluster: 256. H200 sweep (``bench/results/archive/column_gemv_clusters_s70.json``,
#: 10 shapes): 1 x 512 x 4096 fp32 on 8-CTA clusters 5.7 us against 10.5 on 64 lone CTAs (torch 6.6),
#: 1 x 1000 x 14336 fp32 21.8 (the CUDA-core GEMM 43.6, torch 18.5), 4 x 2048 x 8192 bf16 16.2
#: (the split-K GEMM 17.6), 1 x 2048 x 2048 fp16 5.4 (6.7); wide outputs keep lone CTAs or
#: clusters of 2 at the same time.
DEFAULT_CTAS_PER_SM = 1.9
CLUSTER_THREADS = 256
#: Rows of W each CTA of a default cluster keeps at the least; clusters split only columns read
#: in 16-byte vectors (the sweeps measured no other). H200 runs of a default without these
#: (``bench/results/archive/generality_column_clusters_s70.json``,
#: ``bench/results/archive/column_gemv_defaults_s70.json``), lone CTAs against its clusters:
#: 2 x 1021 x 512 fp16 2.5 -> 3.0 us, 4 x 1021 x 4096 fp16 8.1 -> 10.0 (a column a load), 2 x
#: 3000 x 2048 bf16 6.2 -> 7.1 (256 rows of K a CTA).
MIN_CLUSTER_DEPTH = 512


def default_config(found: Gemv) -> ColumnGemvConfig:
    """Pipelined wherever a slice's steps allow, then the cluster size, slices, lanes and step
    closest to these: :data:`DEFAULT_LANES` lanes (fewer where a thread holds more than
    :data:`DEFAULT_SUMS` sums), clusters up to 8 CTAs (as K allows, each CTA keeping
    :data:`MIN_CLUSTER_DEPTH` of it) until the CTAs number :data:`DEFAULT_CTAS_PER_SM` of the
    SMs, then half as many lanes while they number under :func:`min_ctas` (down to
    :data:`LONG_K_ROW_BYTES` of a row of W a CTA), or for lone CTAs up to :data:`LONG_K` under
    :data:`FEWEST_CTAS_PER_SM` of the SMs; :data:`DEFAULT_SLICES` slices (lone CTAs up to
    :data:`LONG_K`: twice as many for each halving of their lanes), or :data:`CLUSTER_THREADS`
    threads in a cluster; the step's loads :data:`DEFAULT_STEP_BYTES` a thread."""
    configs = candidate_configs(found)  # not empty: find_column_gemv refuses where it is
    vector = vector_columns(found)
    lanes = max(2, DEFAULT_LANES * DEFAULT_SUMS // max(found.rows * vector, DEFAULT_SUMS))
    sms = load_hardware().sm_count
    target = DEFAULT_CTAS_PER_SM * sms
    # clusters where each CTA keeps MIN_CLUSTER_DEPTH of K: the smallest of the valid sizes that
    # reaches the target, else the largest
    sizes = sorted({c.cluster_size for c in configs if found.k // c.cluster_size >= MIN_CLUSTER_DEPTH})
    cluster = next((s for s in sizes if ctas(found, ColumnGemvConfig(lanes, 1, cluster_size=s)) >= target),
                   sizes[-1] if sizes else 1)
    # then narrower CTAs: clustered or past LONG_K under half the SMs, down to LONG_K_ROW_BYTES of
    # a row of W; lone ones up to it under FEWEST_CTAS_PER_SM of them, with twice the slices
    lone = cluster == 1 and found.k <= LONG_K
    fewest = FEWEST_CTAS_PER_SM * sms if lone else min_ctas()
    floor, row_bytes, halvings = 0 if lone else LONG_K_ROW_BYTES, vector * found.elem_bytes, 0
    while (lanes > 2 and lanes // 2 * row_bytes >= floor
           and ctas(found, ColumnGemvConfig(lanes, 1, cluster_size=cluster)) < fewest):
        lanes, halvings = lanes // 2, halvings + 1
    slices = DEFAULT_SLICES * 2 ** (halvings if lone else 0) if cluster == 1 else CLUSTER_THREADS // lanes
    unroll = max(1, DEFAULT_STEP_BYTES // (vector * found.elem_bytes))

    def order(c: ColumnGemvConfig) -> tuple:
        return (abs(math.log2(c.cluster_size / cluster)), not c.pipelined, abs(math.log2(c.slices / slices)),
                abs(math.log2(c.lanes / lanes)), abs(math.log2(c.unroll / unroll)))

    return min(configs, key=order)


def schedule_column_gemv(found: Gemv, config: ColumnGemvConfig) -> s_tir.Schedule:
    """The schedule of the module docstring for ``found`` in ``config``."""
    check_config(found, config)
    c, vector = config, vector_columns(found)
    sch = s_tir.Schedule(found.func)
    if found.epilogue is None:  # the product's write-back takes the epilogue's place
        last = sch.cache_write(sch.get_sblock(found.reductions[0]), 0, "local")
    else:
        last = sch.get_sblock(found.epilogue)
    *outer, column = sch.get_loops(last)
    cta, in_cta = sch.split(column, [None, c.lanes * vector])
    if c.cluster_size > 1:  # each CTA of a cluster adds up its peers' partials of a share of the columns
        rank, in_cta = sch.split(in_cta, [c.cluster_size, None])
        sch.reorder(cta, rank, *outer, in_cta)
        bind_cluster_nest(sch, cta, rank)
    else:
        sch.reorder(cta, *outer, in_cta)
        sch.bind(cta, "blockIdx.x")
    launch_programmatically(sch)
    partials = []
    for name in found.reductions:  # K over the slices (of each rank): their partial sums, then their sum
        depth = sch.get_loops(sch.get_sblock(name))[-1]
        if c.cluster_size > 1:
            by_rank, _, _, _ = sch.split(depth, [c.cluster_size, c.slices, None, c.unroll])
            by_rank = sch.rfactor(by_rank, factor_axis=0)
            # the slices' buffer indexed by rank first: placed in DSM, each CTA holds its own slice
            partials.append((by_rank, sch.rfactor(sch.get_loops(by_rank)[-3], factor_axis=1)))
        else:
            part, _, _ = sch.split(depth, [c.slices, None, c.unroll])
            partials.append((None, sch.rfactor(part, factor_axis=0)))
    # each output's sum where it is written, the partial sums at the CTA's loop (placed while the
    # CTA's loops are exact: they cover its columns alone)
    for name, (by_rank, by_slice) in zip(found.reductions, partials):
        total = sch.get_sblock(name)
        sch.compute_at(total, in_cta)
        sch.set_scope(total, 0, "local")
        if by_rank is None:
            sch.compute_at(by_slice, cta, preserve_unit_loops=True)
            _slice_sums(sch, by_slice, sch.get_loops(by_slice)[1:], found, c, vector)
        else:
            _rank_sums(sch, cta, by_rank, by_slice, found, c, vector)
    _over_threads(sch, in_cta, outer, c)
    return sch


def _over_threads(sch: s_tir.Schedule, columns, rows: list, c: ColumnGemvConfig) -> None:
    """Outputs of a CTA over its threads: lanes along the ``columns``, thread rows over the
    ``rows`` and the columns' vectors (a split past the extent predicates the threads left
    over)."""
    in_vector, lane = sch.split(columns, [None, c.lanes])
    _, thread_row = sch.split(sch.fuse(*rows, in_vector) if rows else in_vector, [None, c.slices])
    sch.bind(thread_row, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")


def _rank_sums(sch: s_tir.Schedule, cta, by_rank, by_slice, found: Gemv, c: ColumnGemvConfig, vector: int) -> None:
    """A cluster's split of a product: each CTA's slices' partial sums (``by_slice``), their sum
    over the slices (``by_rank``) stored into the CTA's slice of a DSM buffer, both computed at
    the cluster's loop under the rank's."""
    sch.compute_at(by_rank, cta, preserve_unit_loops=True)
    _, part, rank, *cells = sch.get_loops(by_rank)  # (regenerated in block-variable order)
    sch.reorder(rank, *cells, part)
    sch.compute_at(by_slice, rank, preserve_unit_loops=True)
    # the rank bound after the operands' caches are placed (s_tir's compute_at rejects a scope
    # with a rank-bound producer), before the reduction is decomposed (a bound loop's subtree
    # must be complete blocks)
    _slice_sums(sch, by_slice, sch.get_loops(by_slice)[2:], found, c, vector, lambda: bind_rank(sch, rank), DSM_SCOPE)
    *rows, columns, _ = sch.get_loops(by_rank)[2:]
    exchanged = sch.cache_write(by_rank, 0, "local")  # summed in a register, stored once
    sch.reverse_compute_at(exchanged, columns)  # before the thread split: both blocks take its predicate
    place_in_dsm(sch, exchanged, 0)
    _as_cta_tile(sch, exchanged, c.lanes * vector)
    _over_threads(sch, columns, rows, c)


def _slice_sums(sch: s_tir.Schedule, partial, loops: list, found: Gemv, c: ColumnGemvConfig, vector: int,
                before_decompose: Callable[[], None] | None = None, scope: str = "shared") -> None:
    """A product's ``partial`` sums of each slice over its ``loops`` (the slices, rows and
    columns, then the steps and a step's rows of W), computed at the CTA's loop: thread rows
    over the slices, lanes over the columns' vectors; each thread's sums in registers over its
    steps (W's ``unroll`` rows and x's elements loaded first, then every row's multiply-adds),
    written to the slices' buffer at the end (in ``scope``: in a cluster, the CTA's slice of a
    DSM buffer indexed by rank first, which no other CTA reads). ``before_decompose`` runs once
    the operands' caches are placed."""
    part, *rows, columns, step_loop, unrolled = loops
    lane, in_vector = sch.split(columns, [c.lanes, vector])
    sch.reorder(part, lane, step_loop, unrolled, *rows, in_vector)
    sch.bind(part, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    sch.set_scope(partial, 0, scope)
    _as_cta_tile(sch, partial, c.lanes * vector)
    sums = sch.cache_write(partial, 0, "local")
    sch.reverse_compute_at(sums, lane)
    if vector > 1:  # 16-byte stores at the most (one column a lane: its loop is the lanes')
        _, stored = sch.split(sch.get_loops(sums)[-1], [None, largest_power_of_two(vector, 4)])
        sch.vectorize(stored)
    block = sch.get(partial)
    w_index = next(n for n, r in enumerate(block.reads) if _reads_columns(r, block))
    for index in (w_index, 1 - w_index):
        staged = sch.cache_read(partial, index, "local", consumer_blocks=[partial])
        sch.compute_at(staged, step_loop)
        inner = sch.get_loops(staged)[-1]
        width = vector if index == w_index else row_vector(found, c)
        if width > 1:
            _, inner = sch.split(inner, [None, width])
            sch.vectorize(inner)
    if before_decompose is not None:
        before_decompose()
    sch.decompose_reduction(partial, step_loop)
    for loop in (unrolled, *rows, in_vector):
        sch.unroll(loop)
    if c.pipelined:  # the next step's loads issued before this step's multiply-adds, the steps
        # unrolled (the double-buffered registers then indexed by constants)
        sch.annotate(step_loop, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(step_loop, "software_pipeline_order", [0, 1, 2])
        sch.unroll(step_loop)


def _as_cta_tile(sch: s_tir.Schedule, block, columns_per_cta: int) -> None:
    """The buffer ``block`` writes laid out as the CTA's tile, each column at its place in it: the
    buffer is the tile whatever the extents TVM unifies the thread loops to before it compacts
    buffers."""
    sch.transform_layout(block, ("write", 0), lambda *index: (*index[:-1], index[-1] % columns_per_cta))


def _reads_columns(read, block) -> bool:
    """Whether ``read`` (of ``block``, a product's partial sums) is W's: it varies with the
    output column, the block's last spatial iterator."""
    column = [v for v in block.iter_vars if v.iter_type == tirx.IterVar.DataPar][-1].var
    return any(uses(r.min, column) for r in read.region)
