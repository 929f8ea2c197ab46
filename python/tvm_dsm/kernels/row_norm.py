"""A row-wise normalization (softmax, log-softmax, RMSNorm, LayerNorm, a residual add before
the norm) as one kernel that reads each input row from HBM once.

The function is a cascade of row reductions over the last axis (max, sum, sum of squares, mean
then variance: each level a sum, max or min that may read earlier levels' results) followed by
element-wise stages that read the row again and write one output per element. Its unfused
schedules read the row once per level and once more per stage; here each row's elements are
loaded once, in 16-byte pieces, into the registers of the threads that own them:

    hold   = the row tensors' pieces        each thread its pieces, one 16-byte load each
    level  = op over the held elements      per thread, then shuffles over the warp, the warps
                                            of the row through shared memory and, where a
                                            cluster shares the row, the CTAs through DSM
    out    = the user's stage expression    its loads of the row redirected to the registers,
                                            one 16-byte store per piece

Levels that do not read each other's results (LayerNorm's sum and sum of squares) share one
pass and one combine. Each level is evaluated as the user wrote it, with the earlier levels'
final values: no online correction, so any expression works. Every expression is evaluated in
fp32 (16-bit loads widened, :func:`~tvm_dsm.ir.in_fp32`), the levels' results are kept in fp32,
and only what is stored is rounded to its type: never further from the exact values than the
function's own roundings (Relax's bf16 softmax rounds its exponentials and their sum to 8 bits). A row too long for
one CTA's registers is split over a cluster of up to 16 CTAs, which also spread a few long
rows over the SMs (a 128K-vocabulary softmax of 8 rows).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.script import tirx as T
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as B

from ..annotations import CLUSTER_LAUNCH_KEY
from ..errors import ClusterError, passes
from ..fusion.cascade import Level, indexed_by, inline_elementwise, parse_reduction
from ..hardware import MAX_CTA_THREADS, Hardware
from ..ir import (fast_exp, in_fp32, is_reduction, largest_power_of_two, loads, narrow_indices, root_blocks, shuffle_xor,
                  substitute, tree_reduce, uses, without_unit_iter_vars)
from ..schedule.cluster import MAX_CLUSTER_SIZE
from .template import KernelTemplate

_LOAD_BYTES = 16
_WARP = 32
#: Bytes of the row a thread holds in registers: 32 registers in CTAs of up to 512 threads
#: (128 registers a thread available), 16 in CTAs of 1024 (64 available).
_HELD_BYTES = {512: 128, 1024: 64}
#: Pieces a thread of a long row aims to hold: enough loads in flight per thread to cover HBM
#: latency.
_PIECES_PER_THREAD = 4
#: The fewest threads a row takes where it has the pieces (a piece a thread below that): on an
#: H200 one CTA of 256 threads a row was the fastest configuration of RMSNorm 2048, 4096 and 8192
#: wide at 16-128 rows, or within 5% of it (``bench/results/archive/row_norm_configs_s52.json``);
#: a quarter of the pieces (64 threads at 2048, 128 at 4096) ran 5-25% slower.
_ROW_THREADS = 256
#: Threads of a CTA when rows are shorter than that many pieces (several rows a CTA).
_CTA_THREADS = 128
#: Rows shorter than this never spread over a cluster: the cluster's exchange costs more than the
#: CTAs' shorter reads save (H200, RMSNorm: rows of 4-8 KB over 2-4 CTAs 0.73-0.85x torch.compile's
#: one CTA a row; 16 KB rows at 1-64 rows 1.15-1.25x slower over 2-8 CTAs than one CTA of 256
#: threads, ``archive/row_norm_configs_s52.json``; grids of twice the SMs' CTAs 0.63-0.71x, hence
#: a spread grid is kept within the SMs).
_SPREAD_MIN_ROW_BYTES = 32768
_COMBINE = {"sum": operator.add, "max": tirx.max, "min": tirx.min}
_FLOATS = ("float16", "bfloat16", "float32")


@dataclass(frozen=True)
class RowNormConfig:
    """``threads_per_row`` threads of a CTA per row (a power of two), ``rows_per_cta`` rows a
    CTA, ``ranks`` CTAs of a cluster sharing each row."""

    threads_per_row: int = 128
    rows_per_cta: int = 1
    ranks: int = 1

    @property
    def threads(self) -> int:
        return self.threads_per_row * self.rows_per_cta

    def explain(self) -> str:
        split = (f", each row split over a cluster of {self.ranks} CTAs (statistics merged through DSM)"
                 if self.ranks > 1 else "")
        return (f"row norm: {self.threads_per_row} threads a row, {self.rows_per_cta} rows ({self.threads} "
                f"threads) a CTA{split}; the row held in registers, read from HBM once")


@dataclass(frozen=True)
class RowNorm:
    """What the kernel takes from the function (inlined, int32 indices): the rows' shape and
    width, the levels in program order (each with the indices of the levels it reads), the row
    tensors the levels read (held), the element-wise stages, and the 16-byte piece's elements."""

    func: tirx.PrimFunc
    rows_shape: tuple  # extents: ints, or a variable (a batch or token count)
    width: int
    levels: tuple[Level, ...]
    held: tuple  # buffer Vars [*rows_shape, width]
    stages: tuple  # SBlocks writing out[*rows, k]
    vector: int
    row_stages: tuple = ()  # SBlocks writing out[*rows] from the levels' results (a quantization scale)
    stage_rows: tuple = ()  # parameters [*rows_shape, width] only the stages read (a residual added after)

    @property
    def rows(self):
        return math.prod(self.rows_shape[1:], start=self.rows_shape[0])

    @property
    def symbolic_rows(self) -> bool:
        return not all(isinstance(d, int) for d in self.rows_shape)

    @property
    def pieces(self) -> int:
        """Pieces of a row."""
        return self.width // self.vector

    @property
    def held_bytes(self) -> int:
        """Bytes of one element of every held tensor."""
        return sum(_bytes(h) for h in self.held)

    def waves(self) -> list[list[int]]:
        """The levels by the depth of their dependencies: a wave reads only earlier waves."""
        depth: list[int] = []
        for level in self.levels:
            depth.append(1 + max((depth[d] for d in level.deps), default=-1))
        return [[n for n, d in enumerate(depth) if d == w] for w in range(max(depth) + 1)]


def _bytes(buf) -> int:
    return tvm.DataType(str(buf.ty.dtype)).bits // 8


def _extents(values) -> tuple:
    """Extents as ints, a symbolic one as its expression."""
    return tuple(int(v) if isinstance(v, tirx.IntImm) else v for v in values)


def _same(a: tuple, b: tuple) -> bool:
    """Whether two tuples of extents are equal (a symbolic extent: the same variable)."""
    return len(a) == len(b) and all(
        x == y if isinstance(x, int) and isinstance(y, int) else
        not isinstance(x, int) and not isinstance(y, int) and x.same_as(y) for x, y in zip(a, b))


def _is_row_load(load, row_vars, last_var, rows_shape, width) -> bool:
    """Whether ``load`` reads ``buf[*rows, k]`` of a ``[*rows_shape, width]`` tensor."""
    return (len(load.indices) == len(row_vars) + 1 and indexed_by(load, *row_vars, last_var)
            and _same(_extents(load.source.ty.shape), (*rows_shape, width)))


def find_row_norm(func: tirx.PrimFunc) -> RowNorm:
    """The normalization of ``func`` as the kernel takes it; ClusterError naming what does not
    match (a reduction over another axis, a stage reading a row the statistics do not, ...)."""
    func = without_unit_iter_vars(narrow_indices(func))
    func = inline_elementwise(_outputs_recomputed(func))
    blocks = root_blocks(func)
    params = list(func.params)
    # parameters of one element a row that no block writes (read where used: none is written first)
    inputs = [p for p in params if not any(w.source.same_as(p) for b in blocks for w in b.writes)]
    levels: list[Level] = []
    stages = []
    for block in blocks:
        if is_reduction(block):
            if not isinstance(block.iter_vars[-1].dom.extent, tirx.IntImm):
                raise ClusterError(f"{block.name_hint} reduces over {block.iter_vars[-1].dom.extent} elements: a row "
                                   "norm's rows have a constant width")
            level = parse_reduction(block)
            if level is None or level.op not in _COMBINE:
                raise ClusterError(f"{block.name_hint}: a row norm's reductions are single-axis sums, maxima "
                                   "or minima")
            levels.append(level)
        else:
            stages.append(block)
    if not levels:
        raise ClusterError("no row reductions")
    first = levels[0]
    rows_shape = _extents(iv.dom.extent for iv in _block(blocks, first.block).iter_vars[:-1])
    if not isinstance(first.extent, int):
        raise ClusterError(f"rows of {first.extent} elements: a row norm holds rows of a constant width")
    width = first.extent
    held: list = []
    for n, level in enumerate(levels):
        if len(level.spatial) != len(rows_shape) or level.extent != width or not _same(
                _extents(iv.dom.extent for iv in _block(blocks, level.block).iter_vars[:-1]), rows_shape):
            raise ClusterError(f"{level.block} reduces other rows than {first.block}: one row shape and width")
        if str(level.output.ty.dtype) not in _FLOATS:
            raise ClusterError(f"{level.block} is {level.output.ty.dtype}: the statistics are fp16, bf16 or fp32")
        level.deps = []
        for load in loads(level.value):
            earlier = next((j for j, prev in enumerate(levels[:n]) if load.source.same_as(prev.output)), None)
            if earlier is not None:
                if not _reads_row_result(load, level.spatial):
                    raise ClusterError(f"{level.block} reads {load}: an earlier level's result of another row")
                level.deps.append(earlier)
            elif _is_row_load(load, level.spatial, level.reduce_var, rows_shape, width):
                if any(load.source.same_as(p) for p in params):
                    held += [] if any(load.source.same_as(h) for h in held) else [load.source]
                else:
                    raise ClusterError(f"{level.block} reads {load.source.name}, a row the function computes")
            elif _column_load(load, level.reduce_var):  # a weight inside the statistic (absmax of x * w)
                if not any(load.source.same_as(p) for p in params):
                    raise ClusterError(f"{level.block} reads {load.source.name}, a column the function computes")
            elif _row_operand(load, level.spatial, rows_shape, inputs):
                continue  # a temperature: read at the row where used
            elif any(uses(i, v) for i in load.indices for v in level.spatial) or uses(load, level.reduce_var):
                raise ClusterError(f"{level.block} reads {load}: a row norm reduces over the last axis of "
                                   f"[*rows, {width}] tensors")
    results = [lvl.output for lvl in levels]
    row_stages = [b for b in stages if len(b.iter_vars) == len(rows_shape)]
    stages = [b for b in stages if len(b.iter_vars) != len(rows_shape)]
    for block in row_stages:
        _check_row_stage(block, params, results, rows_shape)
    stage_rows: list = []
    for block in stages:
        stage_rows += [r for r in _check_stage(block, params, inputs, results, held, rows_shape, width)
                       if not any(r.same_as(s) for s in stage_rows)]
    rewritten = [r.name for r in stage_rows if any(r.same_as(b.body.buffer) for b in stages)]
    if rewritten:  # each piece of a stage row is loaded before the stages run
        raise ClusterError(f"a stage reads {', '.join(rewritten)}'s row, which a stage writes: only rows no stage "
                           "writes are read at the element")
    if not any(_reads_held(block, held) for block in stages):
        raise ClusterError("no element-wise stage reads the row again: not a normalization")
    widest = max(_bytes(b) for b in [*held, *stage_rows, *(s.body.buffer for s in stages)])
    vector = largest_power_of_two(width, _LOAD_BYTES // widest)
    return RowNorm(func, rows_shape, width, tuple(levels), tuple(held), tuple(stages), vector, tuple(row_stages),
                   tuple(stage_rows))


def _outputs_recomputed(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each load of an output an element-wise block writes replaced by that
    block's value at the load's indices: a residual sum the norm then reduces (``h = x + r``,
    returned and normalized, as fused add-RMSNorm is) is computed from the rows the kernel holds,
    where reading the output back would wait for the whole row to be written."""
    blocks = root_blocks(func)
    writers = []
    for n, block in enumerate(blocks):
        store = block.body
        variables = [iv.var for iv in block.iter_vars]
        if (not is_reduction(block) and isinstance(store, tirx.BufferStore)
                and any(store.buffer.same_as(p) for p in func.params)
                and len(store.indices) == len(variables) and indexed_by(store, *variables)
                # written once, from other tensors (an update in place reads what it replaces),
                # and read by no block before (which reads the value it had)
                and sum(w.source.same_as(store.buffer) for b in blocks for w in b.writes) == 1
                and not any(r.source.same_as(store.buffer) for b in blocks[:n + 1] for r in b.reads)):
            writers.append((store.buffer, variables, store.value))
    if not writers:
        return func

    def value_at(load):
        for buffer, variables, value in writers:
            if load.source.same_as(buffer):
                return substitute(value, list(zip(variables, load.indices)))
        return load

    return func.with_body(tvm_ffi.structural_map(func.body, [(tvm.ir.TensorLoad, value_at)]))


def _block(blocks, name: str):
    return next(b for b in blocks if b.name_hint == name)


def _reads_held(block, held) -> bool:
    return any(ld.source.same_as(h) for ld in loads(block.body.value) for h in held)


def _check_stage(block, params, inputs, results, held, rows_shape, width) -> list:
    """The parameters whose rows ``block`` reads at its element besides the held ones (a
    residual added to the normalized row); ClusterError unless ``block`` writes a parameter
    ``out[*rows, k]`` from those, the held rows, the levels' results of its row and tensors
    indexed by ``k`` alone (a weight, a bias)."""
    store = block.body
    variables = [iv.var for iv in block.iter_vars]
    extents = _extents(iv.dom.extent for iv in block.iter_vars)
    if not (isinstance(store, tirx.BufferStore) and any(store.buffer.same_as(p) for p in params)
            and _same(extents, (*rows_shape, width)) and len(store.indices) == len(variables)
            and indexed_by(store, *variables)):
        raise ClusterError(f"{block.name_hint}: after the statistics only element-wise stages writing "
                           f"out[*rows, k] of the rows' shape {(*rows_shape, width)} are taken")
    *row_vars, last = variables
    rows = []
    for load in loads(store.value):
        if any(load.source.same_as(r) for r in results):
            if not _reads_row_result(load, row_vars):
                raise ClusterError(f"{block.name_hint} reads {load}: a level's result of another row")
        elif _is_row_load(load, row_vars, last, rows_shape, width):
            if any(load.source.same_as(h) for h in held + rows):
                continue
            if not any(load.source.same_as(p) for p in params):
                raise ClusterError(f"{block.name_hint} reads {load.source.name}, a row the function computes")
            rows.append(load.source)
        elif any(uses(i, v) for i in load.indices for v in row_vars) and not _row_operand(
                load, row_vars, rows_shape, inputs):
            raise ClusterError(f"{block.name_hint} reads {load}: only the held rows, the levels' results, "
                               "tensors indexed by the last axis alone and parameters of one element a row")
    return rows


def _check_row_stage(block, params, results, rows_shape) -> None:
    """ClusterError unless ``block`` writes a parameter ``out[*rows]`` from the levels' results
    of its row alone."""
    store = block.body
    variables = [iv.var for iv in block.iter_vars]
    extents = _extents(iv.dom.extent for iv in block.iter_vars)
    if not (isinstance(store, tirx.BufferStore) and any(store.buffer.same_as(p) for p in params)
            and _same(extents, rows_shape) and len(store.indices) == len(variables) and indexed_by(store, *variables)):
        raise ClusterError(f"{block.name_hint}: a stage of the rows' shape {rows_shape} writes out[*rows]")
    for load in loads(store.value):
        if not (any(load.source.same_as(r) for r in results) and _reads_row_result(load, variables)):
            raise ClusterError(f"{block.name_hint} reads {load}: a stage once a row reads only the levels' "
                               "results of its row")


def _reads_row_result(load, row_vars) -> bool:
    """Whether ``load`` reads a level's result at the rows ``row_vars``, then along kept
    dimensions of extent 1 (``keepdims``), where any index in bounds is 0 (a row of width 1
    indexes them with its reduced iterator)."""
    kept = load.indices[len(row_vars):]
    extents = load.source.ty.shape[len(row_vars):]
    return (len(load.indices) >= len(row_vars) and indexed_by(load, *row_vars)
            and all(isinstance(e, tirx.IntImm) and e.value == 1 or isinstance(i, tirx.IntImm) and i.value == 0
                    for i, e in zip(kept, extents)))


def _row_operand(load, row_vars, rows_shape, inputs) -> bool:
    """Whether ``load`` reads one of ``inputs`` (parameters no block writes) of one element a row
    at the row (a sampler's temperature, a per-token scale): the kernel reads it where the
    expression uses it."""
    extents = load.source.ty.shape
    return (any(load.source.same_as(p) for p in inputs) and len(extents) >= len(rows_shape)
            and _same(_extents(extents[:len(rows_shape)]), rows_shape) and _reads_row_result(load, row_vars))


def _column_load(load, last) -> bool:
    """A 1-D tensor read at the element's column (a weight, a bias): loaded a piece at a time."""
    return len(load.indices) == 1 and indexed_by(load, last)


def check_config(found: RowNorm, c: RowNormConfig) -> None:
    """ClusterError naming the first limit ``c`` breaks on ``found``."""
    held = pieces_per_thread(found, c) * found.vector * found.held_bytes
    limit = held_limit(c.threads)
    checks = [
        (c.threads_per_row & (c.threads_per_row - 1) == 0, f"threads_per_row={c.threads_per_row}: a power of two"),
        (c.threads_per_row >= _WARP or c.rows_per_cta * c.threads_per_row % _WARP == 0 or c.rows_per_cta == 1,
         f"{c.rows_per_cta} rows of {c.threads_per_row} threads do not fill whole warps"),
        (c.threads <= MAX_CTA_THREADS, f"{c.threads} threads a CTA: at most {MAX_CTA_THREADS}"),
        (1 <= c.ranks <= MAX_CLUSTER_SIZE, f"a cluster of {c.ranks}: 1 to {MAX_CLUSTER_SIZE} CTAs"),
        (c.ranks == 1 or c.rows_per_cta == 1, "a cluster shares one row a CTA"),
        (c.rows_per_cta == 1 if found.symbolic_rows else found.rows % c.rows_per_cta == 0,
         f"{found.rows} rows are not a multiple of rows_per_cta={c.rows_per_cta}"),
        (held <= limit, f"each thread would hold {held} B of the row; a CTA of {c.threads} threads holds at "
                        f"most {limit} B a thread in registers"),
    ]
    for ok, message in checks:
        if not ok:
            raise ClusterError(f"row norm {found.rows}x{found.width}, {c}: {message}")


def held_limit(threads: int) -> int:
    """Bytes of the row a thread of a ``threads``-thread CTA may hold in registers."""
    return _HELD_BYTES[512] if threads <= 512 else _HELD_BYTES[1024]


def slice_pieces(found: RowNorm, c: RowNormConfig) -> int:
    """Pieces of a row each CTA of the cluster holds (the last may hold fewer)."""
    return -(-found.pieces // c.ranks)


def pieces_per_thread(found: RowNorm, c: RowNormConfig) -> int:
    return -(-slice_pieces(found, c) // c.threads_per_row)


def _rows_per_cta(found: RowNorm, threads: int) -> int:
    """Rows a CTA of rows of ``threads`` threads takes: up to ``_CTA_THREADS`` threads, a divisor
    of the rows, and whole warps (else one row a CTA: 2 rows of 2 threads cannot share a warp)."""
    rows = max(1, _CTA_THREADS // threads)
    while rows > 1 and found.rows % rows:
        rows //= 2
    if threads < _WARP and rows * threads % _WARP:
        return 1
    return rows


def candidate_configs(found: RowNorm) -> list[RowNormConfig]:
    """Every configuration that fits: powers of two of threads a row and CTAs a row, and rows a
    CTA where a row takes fewer than ``_CTA_THREADS`` threads."""
    configs = []
    for ranks in (1, 2, 4, 8, 16):
        if ranks > 1 and found.pieces < ranks * _WARP:
            continue
        for log in range(11):
            threads = 1 << log
            config = RowNormConfig(threads, _rows_per_cta(found, threads) if ranks == 1 else 1, ranks)
            if threads > 1 and (threads // 2) * ranks >= found.pieces:
                continue  # idle threads: half as many hold the row
            if not passes(check_config, found, config):
                continue
            configs.append(config)
    return configs


def check_fits(found: RowNorm) -> None:
    """ClusterError naming the limit where a row exceeds a cluster of 16 CTAs' registers."""
    most = MAX_CLUSTER_SIZE * MAX_CTA_THREADS * held_limit(MAX_CTA_THREADS)
    if found.width * found.held_bytes > most:
        raise ClusterError(f"a row of {found.width} elements ({found.width * found.held_bytes} B held) exceeds "
                           f"the registers of a cluster of {MAX_CLUSTER_SIZE} CTAs ({most} B)")


def default_config(found: RowNorm, hw: Hardware) -> RowNormConfig:
    """The fewest CTAs a row within the register limit, split over a cluster further while the
    rows alone leave SMs of ``hw`` idle (the grid kept within them) where a row holds
    ``_SPREAD_MIN_ROW_BYTES`` or more; a CTA's threads each hold about ``_PIECES_PER_THREAD``
    pieces, at least ``_ROW_THREADS`` threads where the row has as many pieces (else a piece
    each), within the register limit; ClusterError naming the limit where a row does not fit
    (:func:`check_fits`)."""
    check_fits(found)
    row_bytes = found.width * found.held_bytes
    ranks = 1
    while ranks < MAX_CLUSTER_SIZE and (
            -(-found.pieces // (ranks * MAX_CTA_THREADS)) * found.vector * found.held_bytes > held_limit(MAX_CTA_THREADS)
            or (found.rows * ranks * 2 <= hw.sm_count and row_bytes >= _SPREAD_MIN_ROW_BYTES
                and found.pieces >= 2 * ranks * _WARP * _PIECES_PER_THREAD)):
        ranks *= 2
    per_cta = -(-found.pieces // ranks)
    aim = min(per_cta, max(_ROW_THREADS, -(-per_cta // _PIECES_PER_THREAD)))
    threads = 1
    while threads < MAX_CTA_THREADS and threads < aim:
        threads *= 2
    while threads < MAX_CTA_THREADS and -(-per_cta // threads) * found.vector * found.held_bytes > held_limit(threads):
        threads *= 2
    config = RowNormConfig(threads, _rows_per_cta(found, threads) if ranks == 1 else 1, ranks)
    check_config(found, config)
    return config


class RowNormTemplate(KernelTemplate):
    """The row norm kernel of a normalization :func:`find_row_norm` takes."""

    def find(self, func: tirx.PrimFunc) -> RowNorm:
        return find_row_norm(func)

    def configs(self, found: RowNorm) -> list[RowNormConfig]:
        check_fits(found)
        return candidate_configs(found)

    def default_config(self, found: RowNorm, hw: Hardware) -> RowNormConfig:
        return default_config(found, hw)

    def check(self, found: RowNorm, config: RowNormConfig) -> None:
        check_config(found, config)

    def kernel(self, found: RowNorm, config: RowNormConfig) -> tirx.PrimFunc:
        return row_norm_kernel(found, config)


TEMPLATE = RowNormTemplate()
#: The kernel of a function (see :func:`find_row_norm`), in a configuration or the default's
#: for a GPU.
fuse_row_norm = TEMPLATE.fuse


def row_norm_kernel(found: RowNorm, c: RowNormConfig) -> tirx.PrimFunc:
    """The passes of the module docstring as one CUDA kernel's TIR."""
    with IRBuilder() as ib:
        with B.prim_func(s_tir=True):
            B.func_name("row_norm")
            B.func_attr({"tirx.noalias": True})
            with B.thread_binding(found.rows // c.rows_per_cta * c.ranks, thread="blockIdx.x") as bx:
                with B.thread_binding(c.threads, thread="threadIdx.x") as tx:
                    with B.sblock("row_norm"):
                        B.reads()
                        B.writes()
                        _KernelBody(found, c, bx, tx).emit()
    fused = ib.get()
    return tirx.PrimFunc(list(found.func.params), fused.body, attrs=fused.attrs)


class _KernelBody:
    """The statements of one CTA's thread ``tx`` (block ``bx``), emitted into the open block."""

    def __init__(self, found: RowNorm, c: RowNormConfig, bx, tx):
        self.found, self.c = found, c
        self.vec, self.q_count = found.vector, pieces_per_thread(found, c)
        self.slice = slice_pieces(found, c)
        self.warps = max(1, c.threads_per_row // _WARP)
        n_levels = len(found.levels)
        self.regs = [B.sblock_alloc_buffer((self.q_count * self.vec,), str(h.ty.dtype), scope="local")
                     for h in found.held]
        self.acc = B.sblock_alloc_buffer((n_levels,), "float32", scope="local")
        self.stats = B.sblock_alloc_buffer((n_levels,), "float32", scope="local")
        if self.warps > 1:  # each warp's partial statistics, for the row's other warps
            self.warp_parts = B.sblock_alloc_buffer((n_levels, c.rows_per_cta, self.warps), "float32",
                                                    scope="shared")
        if c.ranks > 1:  # the CTA's partial statistics, for the cluster's other CTAs
            self.cta_parts = B.sblock_alloc_buffer((n_levels,), "float32", scope="shared")
            self.peer = B.sblock_alloc_buffer((1,), "uint32", scope="local")
            self.remote = B.sblock_alloc_buffer((1,), "float32", scope="local")
        # Tensors read at the element's column (a weight, a bias): a piece at a time where it is
        # used, or in a cluster held like the row and loaded with it, so that no load waits
        # behind the cluster's exchange of statistics (RMSNorm of 8192 columns over 2-4 CTAs
        # ran 1.25-1.35x faster so on an H200; without a cluster the extra registers cost up to
        # 0.81x, bench/results/row_norm_columns).
        self.hold_columns = c.ranks > 1
        self.columns = {}
        reads = [(block.body.value, block.iter_vars[-1].var) for block in found.stages]
        reads += [(level.value, level.reduce_var) for level in found.levels]
        for value, last in reads:
            for load in loads(value):
                if _column_load(load, last) and not any(load.source.same_as(b) for b in self.columns):
                    self.columns[load.source] = B.sblock_alloc_buffer(
                        ((self.q_count if self.hold_columns else 1) * self.vec,), str(load.source.ty.dtype),
                        scope="local")
        # Rows only the stages read (a residual added after the norm): a piece where it is used.
        self.stage_rows = {buf: B.sblock_alloc_buffer((self.vec,), str(buf.ty.dtype), scope="local")
                           for buf in found.stage_rows}
        self.outs = [B.sblock_alloc_buffer((self.vec,), str(b.body.buffer.ty.dtype), scope="local")
                     for b in found.stages]
        self.tx = tx
        self.lane, self.row_in_cta = tx % c.threads_per_row, tx // c.threads_per_row
        self.rank = bx % c.ranks
        self.row = row_indices(found.rows_shape, bx // c.ranks * c.rows_per_cta + self.row_in_cta)

    def emit(self) -> None:
        if self.c.ranks == 1:
            self._emit_row()
            return
        with B.attr(tvm.ir.StringImm("cluster"), CLUSTER_LAUNCH_KEY, self.c.ranks):
            self._emit_row()
            B.evaluate(T.cuda.cluster_sync())  # peers have read this CTA's partials

    def _emit_row(self) -> None:
        found = self.found
        for q in range(self.q_count):  # hold: every row tensor's pieces, one 16-byte load each
            with self._guard(q):
                for h, reg in zip(found.held, self.regs):
                    with B.vectorized(0, self.vec) as e:
                        B.buffer_store(reg, h[(*self.row, self._column(q) + e)], [q * self.vec + e])
                if self.hold_columns:
                    self._load_columns(q, None)
        for wave in found.waves():
            self._emit_wave(wave)
        for q in range(self.q_count):  # the stages from the held row, one 16-byte store per piece
            with self._guard(q):
                self._emit_stages(q)
        kept = [(n, p) for n, level in enumerate(found.levels) for p in found.func.params
                if p.same_as(level.output)]
        if kept or found.row_stages:  # the levels' results the function keeps, and what it computes from them, once a row
            with B.If(tirx.And(self.lane == 0, self.rank == 0)):
                with B.Then():
                    for n, p in kept:
                        B.buffer_store(p, T.Cast(str(p.ty.dtype), self.stats[n]), self.row)
                    for block in found.row_stages:
                        store = block.body
                        value = self._statistics(in_fp32(store.value))
                        value = substitute(value, list(zip([iv.var for iv in block.iter_vars], self.row)))
                        B.buffer_store(store.buffer, _as(store.buffer, value), self.row)

    def _emit_wave(self, wave: list[int]) -> None:
        """Levels reading only earlier waves: one pass over the held row, one combine."""
        levels, acc = self.found.levels, self.acc
        for n in wave:
            B.buffer_store(acc, _identity(levels[n].op), [n])
        for q in range(self.q_count):
            with self._guard(q):
                self._load_columns(q, [levels[n].value for n in wave])
                for n in wave:
                    level, op = levels[n], _COMBINE[levels[n].op]
                    terms = [_widen(self._value(in_fp32(level.value), level.spatial, level.reduce_var, q, e))
                             for e in range(self.vec)]
                    B.buffer_store(acc, op(acc[n], tree_reduce(op, terms)), [n])
        mask = 1
        while mask < min(self.c.threads_per_row, _WARP):  # over the row's lanes of the warp
            for n in wave:
                B.buffer_store(acc, _COMBINE[levels[n].op](acc[n], shuffle_xor(acc[n], mask)), [n])
            mask *= 2
        if self.warps > 1:
            with B.If(self.tx % _WARP == 0):
                with B.Then():
                    for n in wave:
                        B.buffer_store(self.warp_parts, acc[n], [n, self.row_in_cta, self.lane // _WARP])
            B.evaluate(T.tvm_storage_sync("shared"))
            for n in wave:
                B.buffer_store(acc, tree_reduce(_COMBINE[levels[n].op], [
                    self.warp_parts[n, self.row_in_cta, w] for w in range(self.warps)]), [n])
        if self.c.ranks > 1:
            with B.If(self.tx == 0):
                with B.Then():
                    for n in wave:
                        B.buffer_store(self.cta_parts, acc[n], [n])
            B.evaluate(T.cuda.cluster_sync())  # every rank's partials are in place
            for n in wave:
                B.buffer_store(acc, _identity(levels[n].op), [n])
                for r in range(self.c.ranks):
                    B.evaluate(T.ptx.mapa.shared__cluster.u32(
                        self.peer[0], T.cuda.cvta_generic_to_shared(self.cta_parts.access_ptr("r", offset=n)),
                        T.Cast("uint32", r)))
                    B.evaluate(T.ptx.ld.shared__cluster.f32(self.remote[0], self.peer[0]))
                    B.buffer_store(acc, _COMBINE[levels[n].op](acc[n], self.remote[0]), [n])
        for n in wave:  # the level's own init once; kept in fp32 (rounded only where stored)
            level = levels[n]
            B.buffer_store(self.stats, _COMBINE[level.op](_widen(level.init), acc[n]), [n])

    def _load_columns(self, q: int, values: list | None) -> None:
        """Piece ``q`` of each column tensor that ``values`` read (every one where None; one
        vector load each); nothing where the thread holds them from the start."""
        if self.hold_columns and values is not None:
            return
        column, at = self._column(q), (q * self.vec if self.hold_columns else 0)
        for buf, reg in self.columns.items():
            if values is None or any(load.source.same_as(buf) for value in values for load in loads(value)):
                with B.vectorized(0, self.vec) as e:
                    B.buffer_store(reg, buf[column + e], [at + e])

    def _emit_stages(self, q: int) -> None:
        self._load_columns(q, [block.body.value for block in self.found.stages])
        for buf, reg in self.stage_rows.items():
            with B.vectorized(0, self.vec) as e:
                B.buffer_store(reg, buf[(*self.row, self._column(q) + e)], [e])
        for block, out in zip(self.found.stages, self.outs):
            store = block.body
            *row_vars, last = [iv.var for iv in block.iter_vars]
            for e in range(self.vec):
                B.buffer_store(out, _as(out, self._value(in_fp32(store.value), row_vars, last, q, e)), [e])
            with B.vectorized(0, self.vec) as e:
                B.buffer_store(store.buffer, out[e], [*self.row, self._column(q) + e])

    def _piece(self, q: int):
        return self.rank * self.slice + q * self.c.threads_per_row + self.lane

    def _column(self, q: int):
        return self._piece(q) * self.vec

    def _guard(self, q: int):
        """A frame around piece ``q``'s statements: the thread holds it (a row need not split
        evenly over the cluster and the threads)."""
        conds = []
        if (q + 1) * self.c.threads_per_row > self.slice:
            conds.append(q * self.c.threads_per_row + self.lane < self.slice)
        if self.found.pieces % self.c.ranks:
            conds.append(self._piece(q) < self.found.pieces)
        return _If(tree_reduce(tirx.And, conds) if conds else None)

    def _statistic(self, load):
        """A load of a level's result, read from the statistics (fp32: the expressions reading
        them are evaluated in fp32, :func:`~tvm_dsm.ir.in_fp32`); None for any other load."""
        for n, level in enumerate(self.found.levels):
            if load.source.same_as(level.output):
                return self.stats[n]
        return None

    def _statistics(self, expr):
        """``expr`` with the levels' results read from the statistics."""
        def bind(load):
            statistic = self._statistic(load)
            return load if statistic is None else statistic

        return tvm_ffi.structural_map(expr, [(tvm.ir.TensorLoad, bind)])

    def _value(self, expr, row_vars, last_var, q: int, e: int):
        """``expr`` at element ``e`` of the thread's piece ``q``: the held rows from registers,
        level results from the statistics, column tensors from their pieces, other loads at the
        element (the user's own expression, its loads redirected)."""
        found = self.found

        def bind(load):
            for h, reg in zip(found.held, self.regs):
                if load.source.same_as(h) and _is_row_load(load, row_vars, last_var, found.rows_shape, found.width):
                    return reg[q * self.vec + e]
            statistic = self._statistic(load)
            if statistic is not None:
                return statistic
            for buf, reg in self.columns.items():
                if load.source.same_as(buf) and _column_load(load, last_var):
                    return reg[q * self.vec + e if self.hold_columns else e]
            for buf, reg in self.stage_rows.items():
                if load.source.same_as(buf) and _is_row_load(load, row_vars, last_var, found.rows_shape, found.width):
                    return reg[e]
            return load

        value = tvm_ffi.structural_map(expr, [(tvm.ir.TensorLoad, bind), (tvm.ir.Call, fast_exp)])
        return substitute(value, list(zip(row_vars, self.row)) + [(last_var, self._column(q) + e)])


class _If:
    """``with B.If(cond): with B.Then():`` as one frame; no frame where ``cond`` is None."""

    def __init__(self, cond):
        self.cond, self.frames = cond, []

    def __enter__(self):
        if self.cond is not None:
            self.frames = [B.If(self.cond), B.Then()]
            for frame in self.frames:
                frame.__enter__()

    def __exit__(self, *exc):
        for frame in reversed(self.frames):
            frame.__exit__(*exc)


def row_indices(rows_shape: tuple[int, ...], row) -> list:
    """A row's indices in ``rows_shape`` from its flat number."""
    indices = []
    for extent in reversed(rows_shape[1:]):
        indices.insert(0, row % extent)
        row = row // extent
    return [row, *indices]


def _identity(op: str):
    return {"sum": tirx.const(0.0, "float32"), "max": tvm.te.min_value("float32"),
            "min": tvm.te.max_value("float32")}[op]


def _widen(value):
    return value if str(value.ty.dtype) == "float32" else T.Cast("float32", value)


def _as(buf, value):
    """``value`` rounded to ``buf``'s type where it differs (an fp32 result stored in 16 bits)."""
    return value if str(value.ty.dtype) == str(buf.ty.dtype) else T.Cast(str(buf.ty.dtype), value)
