"""A few rows times a matrix stored as integer codes, several to a byte or word or one int8 each,
dequantized inside the product (``y[i, j] = sum_k x[i, k] * (q(P[j, k // d]) - z[j, k // g]) *
s[j, k // g]``): MLC-LLM's q4f16 and 4-bit codes with zero points in the ``[N, K / d]``
layout, or an int8 weight with a scale per column, at a decode step of up to :data:`MAX_ROWS`
tokens.

Such a product is bound by the arithmetic of the dequantization long before HBM: a 16-byte load
of 4-bit codes holds 32 weights, each unpacked, converted, offset, scaled and multiplied. The
kernel therefore keeps that arithmetic short:

* every lane loads a 16-byte vector of the codes (``span`` values of K) and the
  matching elements of x, of the scales and zero points, ``unroll`` such steps unrolled so that
  their loads issue together, ``lanes`` lanes splitting a row's K (a cross-thread sum after);
* each thread computes ``columns`` output columns, whose weights share its vector of x: x is
  loaded and converted once for all of them; and each of x's rows, which share the weight: each
  value is unpacked once for all rows (the rows' loop innermost, unrolled);
* the dequantized weight is computed in fp32 (its 16-bit arithmetic widened: closer to the exact
  values than the function's roundings, never further) and the unpacked codes are converted by
  their bits (:mod:`tvm_dsm.transform.exact_int_casts`), not by the quarter-rate conversion
  instruction.

The elementwise blocks that unpack the weight before the product (TE's ``decode`` stages) are
inlined into it. The output, or an elementwise epilogue reading it at its element (the cast of
an fp32 sum to fp16, a bias; several elementwise blocks merged into one), takes the columns. A
product of more rows keeps the packed weight out of this rule: the operands are computed apart
(:mod:`tvm_dsm.transform.computed_operands`) for the GEMM families, whose tensor cores then do
the rows' arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock

from ..errors import ClusterError, passes
from ..hardware import MAX_CTA_THREADS
from ..ir import block_allocations, in_fp32, is_reduction, is_zero, largest_power_of_two, reduced_values, uses
from ..transform.buffers import element_bytes
from ..transform.exact_int_casts import int_casts_by_bits
from ..transform.programmatic_launch import launch_programmatically
from .elementwise import VECTOR_BYTES
from .fused_chain import merge_elementwise_blocks
from .row_gemv import _check_epilogue


@dataclass(frozen=True)
class PackedGemvConfig:
    """``rows_per_cta`` threads along the columns of a CTA (``threadIdx.y``), each computing
    ``columns`` adjacent columns; ``lanes`` lanes splitting K (``threadIdx.x``); ``unroll``
    16-byte loads of the packed weight a lane takes a step, in unrolled code."""

    rows_per_cta: int
    columns: int
    lanes: int
    unroll: int = 2

    @property
    def threads(self) -> int:
        return self.rows_per_cta * self.lanes

    def explain(self) -> str:
        return (f"packed GEMV: {self.rows_per_cta} x {self.columns} columns a CTA ({self.columns} a thread), "
                f"{self.lanes} lanes a row, {self.unroll} 16-byte loads of packed weight a lane unrolled")


@dataclass(frozen=True)
class PackedGemv:
    """A product of up to :data:`MAX_ROWS` rows over a packed weight as the rule sees it: ``func`` with the unpacking
    blocks inlined and the weight's arithmetic in fp32, ``n`` columns over ``k``, ``span`` values
    of K in a 16-byte vector of the codes, the product's and the epilogue's block names, and the
    elements along K of each tensor it reads that a lane's ``span`` values take (x's ``span``,
    a code tensor's ``span / d``, a group scale's one)."""

    func: tirx.PrimFunc
    n: int
    k: int
    span: int
    reduction: str
    epilogue: str | None
    k_elements: tuple[tuple[str, int], ...] = ()
    #: rows of x, each thread's: the weight a thread unpacks is multiplied by each of them
    rows: int = 1


def _packing(index, depth: tirx.Var) -> int | None:
    """``d`` where ``index`` is ``k // d`` (1 where it is ``k``) for the reduced variable
    ``depth``; else None."""
    if isinstance(index, tirx.Var) and index.same_as(depth):
        return 1
    if (isinstance(index, tirx.FloorDiv) and isinstance(index.a, tirx.Var) and index.a.same_as(depth)
            and isinstance(index.b, tirx.IntImm) and index.b.value > 0):
        return int(index.b.value)
    return None


def _widened_weight(func: tirx.PrimFunc, name: str) -> tirx.PrimFunc:
    """``func`` with every 16-bit value its block ``name`` converts to fp32 computed in fp32."""
    def widen(cast):
        narrow = str(cast.value.ty) in ("float16", "bfloat16")
        return in_fp32(cast.value) if str(cast.ty) == "float32" and narrow else cast

    def block(stmt):
        return tvm_ffi.structural_map(stmt, [(tirx.Cast, widen)], order="pre") if stmt.name_hint == name else stmt
    return func.with_body(tvm_ffi.structural_map(func.body, [(SBlock, block)]))


def find_packed_gemv(func: tirx.PrimFunc) -> PackedGemv:
    """``func`` as a product of up to :data:`MAX_ROWS` rows over a packed weight (see the module):
    elementwise blocks that only unpack inputs, then one fp32 sum over ``k`` of rows ``x[.., k]`` times an
    expression of reads ``W[j, k // d]`` and ``s[j]`` (the column ``j`` first; at least one an
    integer tensor of codes of 8 bits or fewer: int8, or several codes an element), then at most
    one elementwise block reading the sum where it writes; ClusterError naming what differs."""
    sch = s_tir.Schedule(block_allocations(func))
    merge_elementwise_blocks(sch)  # an epilogue written as several blocks (a rounding, then a bias)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    sums = [b for b in blocks if is_reduction(sch.get(b))]
    if len(sums) != 1:
        raise ClusterError("a packed GEMV is one reduction")
    for block in blocks[:blocks.index(sums[0])]:
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError as err:
            raise ClusterError("a packed GEMV's blocks before its product unpack inputs elementwise") from err
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) > 2:
        raise ClusterError("a packed GEMV is its product, then at most one elementwise block")
    block = sch.get(blocks[0])
    spatial = [v for v in block.iter_vars if v.iter_type == tirx.IterVar.DataPar]
    reduce = [v for v in block.iter_vars if v.iter_type == tirx.IterVar.CommReduce]
    if (len(reduce) != 1 or not spatial
            or not all(isinstance(v.dom.extent, tirx.IntImm) for v in (*spatial, *reduce))
            or len([v for v in spatial[:-1] if int(v.dom.extent) != 1]) > 1):
        raise ClusterError("a packed GEMV computes rows: unit axes and at most one of rows, then the columns, over "
                           "one reduced axis")
    rows_count = math.prod(int(v.dom.extent) for v in spatial[:-1])
    if rows_count > MAX_ROWS:
        raise ClusterError(f"a packed GEMV takes at most {MAX_ROWS} rows (each thread's), not {rows_count}")
    if str(block.writes[0].source.ty.dtype) != "float32":
        raise ClusterError("a packed GEMV accumulates in fp32 (sums written in 16 bits are widened first)")
    if not (isinstance(block.init, tirx.BufferStore) and is_zero(block.init.value)):
        raise ClusterError("a packed GEMV's sum starts from 0")
    column, depth = spatial[-1].var, reduce[0].var
    n, k = int(spatial[-1].dom.extent), int(reduce[0].dom.extent)
    written = block.writes[0].source
    reads = [r for r in block.reads if not r.source.same_as(written)]
    rows = [r for r in reads if not any(uses(x.min, column) for x in r.region)]
    weights = [r for r in reads if any(uses(x.min, column) for x in r.region)]
    if len(rows) != 1 or not tvm_ffi.structural_equal(rows[0].region[-1].min, depth) or any(
            uses(x.min, depth) for x in rows[0].region[:-1]):
        raise ClusterError("a packed GEMV reads one tensor of rows x along K, K its innermost index")
    packing = {}
    for read in weights:
        indices = [x.min for x in read.region]
        if tvm_ffi.structural_equal(indices[0], column) and all(isinstance(i, tirx.IntImm) for i in indices[1:]):
            continue  # a scale per column (``s[j]``, ``s[j, 0]``): one element a thread's column
        d = _packing(indices[1], depth) if len(indices) == 2 else None
        if d is None or not tvm_ffi.structural_equal(indices[0], column):
            raise ClusterError(f"a packed GEMV reads its weights as W[j, k // d] or W[j]: {read.source.name} is not")
        packing[read.source] = d
    if any(tvm.DataType(str(w.ty.dtype)).bits < 8 for w in packing):
        raise ClusterError("a packed GEMV reads codes packed in bytes or words, not sub-byte tensors (int4)")
    codes = [(element_bytes(w) / d, w) for w, d in packing.items()
             if str(w.ty.dtype).startswith(("int", "uint")) and element_bytes(w) <= d]
    if not codes:
        raise ClusterError("a packed GEMV's weight is an integer tensor of codes of 8 bits or fewer")
    bytes_per_value, weight = max(codes, key=lambda p: p[0])
    span = int(VECTOR_BYTES / bytes_per_value)
    for w, d in packing.items():
        if span % d and d % span:
            raise ClusterError(f"{w.name}'s groups of {d} values of K neither divide nor are divided by the "
                               f"{span} values a 16-byte load of {weight.name} holds")
    if k % span or k < 2 * span:
        raise ClusterError(f"K={k} is not a multiple of the {span} values a 16-byte load of {weight.name} holds, "
                           "two of them at the least (a lane each)")
    epilogue = None
    if len(blocks) == 2:
        epilogue = sch.get(blocks[1])
        _check_epilogue(sch.mod["main"], epilogue, [written], rows_count, n)
    func = int_casts_by_bits(_widened_weight(sch.mod["main"], block.name_hint))
    k_elements = ((rows[0].source.name, span), *((w.name, max(1, span // d)) for w, d in packing.items()))
    return PackedGemv(func, n, k, span, block.name_hint, None if epilogue is None else epilogue.name_hint,
                      k_elements, rows_count)


def default_config(found: PackedGemv) -> PackedGemvConfig:
    """The lanes of :func:`default_lanes`, 4 columns a thread, 2 threads along the columns, one
    load a step; the columns reduced to powers of two the extents take. H200
    (``bench/results/archive/packed_gemv_configs_s98.json``): 18.0 us on MLC's q4f16 1 x 14336
    x 4096 (dlight's GEMV 18.5, the best configuration 17.0), 19.3 on 1 x 4096 x 14336 nibbles
    with zero points (dlight 34.9, the best 18.1); 32 lanes of 4 columns, 4 rows a CTA, took
    29.7 on the second, whose 4096 columns then fill the SMs with few warps."""
    columns = largest_power_of_two(found.n, 4)
    rows = largest_power_of_two(found.n // columns, 2)
    config = PackedGemvConfig(rows, columns, default_lanes(found.k // found.span), 1)
    check_config(found, config)
    return config


#: Rows of x a packed GEMV takes (a decode step's batch); more go to the GEMM families over the
#: unpacked weight.
MAX_ROWS = 8
ROWS_PER_CTA = (1, 2, 4, 8)
COLUMNS = (1, 2, 4)
UNROLLS = (1, 2, 4)
#: Lanes a row at the most.
MOST_LANES = 128
#: The default's lanes: the most powers of two up to PREFERRED_LANES (warp shuffles sum them)
#: where FEWEST_POWER_LANES or more divide K's loads, else the most other counts up to
#: PREFERRED_LANES where FEWEST_OTHER_LANES or more do, else the fewest counts above it.
PREFERRED_LANES = 64
FEWEST_POWER_LANES = 32
FEWEST_OTHER_LANES = 48


def lane_counts(vectors: int) -> list[int]:
    """The lane counts from 2 to :data:`MOST_LANES` that divide ``vectors`` 16-byte loads of a
    row's codes, ascending: each lane takes the same loads, none waits on a predicate."""
    return [lanes for lanes in range(2, MOST_LANES + 1) if vectors % lanes == 0]


def default_lanes(vectors: int) -> int:
    """The default's choice (:data:`PREFERRED_LANES`) of the lane counts that split ``vectors``
    evenly. The
    H100 (303c3e1 -> 4132e0a, ``bench/results/archive/user_functions_h100_s99*.json``): at K =
    3584 (112 vectors) 16 lanes took 14.7 us and 56 lanes 8.2 (dlight 7.3); at K = 18944 (592
    vectors) 16 lanes took 70.0 and 37 lanes 37.2 (dlight 25.6), still too few loads in flight
    over its 3584 columns, which 74 lanes double (not yet measured). On the H200, 16 and 32 lanes
    trailed 64 at every shape (``archive/packed_gemv_configs_s98.json``)."""
    counts = lane_counts(vectors)
    if not counts:
        raise ClusterError(f"a packed GEMV splits K's {vectors} 16-byte loads evenly over 2 to {MOST_LANES} lanes")
    below = [n for n in counts if n <= PREFERRED_LANES]
    above = [n for n in counts if n > PREFERRED_LANES]
    power = largest_power_of_two(vectors, PREFERRED_LANES)
    if power >= FEWEST_POWER_LANES:
        return power
    if below and below[-1] >= FEWEST_OTHER_LANES or not above:
        return below[-1]
    return above[0]


def candidate_configs(found: PackedGemv) -> list[PackedGemvConfig]:
    """The default, then every configuration of the tuples above, at lane counts of 8 or more
    (:func:`lane_counts`), valid for ``found``."""
    default = default_config(found)
    lanes = [count for count in lane_counts(found.k // found.span) if count >= 8]
    configs = [PackedGemvConfig(r, c, count, u) for r in ROWS_PER_CTA for c in COLUMNS for count in lanes
               for u in UNROLLS]
    return [default, *(c for c in configs if c != default and passes(check_config, found, c))]


def check_config(found: PackedGemv, config: PackedGemvConfig) -> None:
    """ClusterError naming the first limit ``config`` breaks for ``found``."""
    if config.lanes < 2:
        raise ClusterError("a packed GEMV splits K over 2 lanes at least")
    if config.threads > MAX_CTA_THREADS:
        raise ClusterError(f"{config.threads} threads a CTA > {MAX_CTA_THREADS}")
    if found.n % (config.rows_per_cta * config.columns):
        raise ClusterError(f"N={found.n} is not a multiple of {config.rows_per_cta} x {config.columns} columns a CTA")
    step = config.lanes * config.unroll * found.span
    if found.k % step:
        raise ClusterError(f"K={found.k} is not a multiple of a step's {step} values "
                           f"({config.lanes} lanes x {config.unroll} loads x {found.span})")


def schedule_packed_gemv(found: PackedGemv, config: PackedGemvConfig) -> s_tir.Schedule:
    """The schedule of the module docstring for ``found`` in ``config``."""
    check_config(found, config)
    sch = s_tir.Schedule(found.func)
    product = sch.get_sblock(found.reduction)
    k = sch.get_loops(product)[-1]
    _, _, lane, _ = sch.split(k, [None, config.unroll, config.lanes, found.span])
    partial = sch.rfactor(lane, factor_axis=0)
    owner = sch.get_sblock(found.epilogue) if found.epilogue else product
    spatial = sch.get_loops(owner)[:len(sch.get_loops(owner)) - (0 if found.epilogue else 1)]
    cta, row, column = sch.split(spatial[-1], [None, config.rows_per_cta, config.columns])
    sch.reorder(cta, row, column, *spatial[:-1])  # x's rows inside the thread, under its columns
    if found.epilogue:
        sch.compute_at(product, column)
    sch.bind(cta, "blockIdx.x")
    sch.bind(row, "threadIdx.y")
    launch_programmatically(sch)
    sch.compute_at(partial, row, preserve_unit_loops=True)
    loops = sch.get_loops(partial)
    sch.bind(loops[2], "threadIdx.x")
    steps, unrolled, values = loops[-3:]
    *x_rows, own = loops[3:-3]  # the partial sums' rows and columns
    x_rows = [loop for loop in x_rows if int(sch.get(loop).extent) > 1]
    # x's vector, loaded once, under every column; each unpacked weight value under every row
    sch.reorder(steps, unrolled, own, values, *x_rows)
    depth = [sch.get(loop).same_as(sch.get(unrolled)) for loop in sch.get_loops(partial)].index(True) + 1
    k_elements = dict(found.k_elements)
    for index, read in enumerate(sch.get(partial).reads):
        staged = sch.cache_read(partial, index, "local", consumer_blocks=[partial])
        sch.compute_at(staged, unrolled)  # every load of a step issued before its arithmetic
        if k_elements.get(read.source.name, 1) > 1:  # else its loop (if any) runs over columns
            _vectorize(sch, staged, depth)
    sch.unroll(unrolled)
    sch.unroll(values)
    for loop in (own, *x_rows):
        sch.unroll(loop)
    (lane_sum,) = reduced_values(sch, product)  # the sum over the lanes, x's rows outside it
    lanes = next(loop for loop in sch.get_loops(product) if uses(lane_sum, sch.get(loop).loop_var))
    sch.reorder(*[loop for loop in sch.get_loops(product)[3:] if not sch.get(loop).same_as(sch.get(lanes))], lanes)
    sch.bind(lanes, "threadIdx.x")
    sch.set_scope(partial, 0, "local")
    if found.epilogue:
        sch.set_scope(product, 0, "local")
    return sch


def _vectorize(sch: s_tir.Schedule, staged, depth: int) -> None:
    """The innermost loop of a staged copy (below its ``depth`` enclosing loops), which runs
    along K, in 16-byte vectors."""
    loops = sch.get_loops(staged)
    if len(loops) <= depth or not isinstance(sch.get(loops[-1]).extent, tirx.IntImm):
        return
    extent = int(sch.get(loops[-1]).extent)
    per_vector = VECTOR_BYTES // element_bytes(sch.get(staged).writes[0].source)
    if extent > per_vector:
        _, inner = sch.split(loops[-1], [None, per_vector])
        sch.vectorize(inner)
    elif extent > 1:
        sch.vectorize(loops[-1])
