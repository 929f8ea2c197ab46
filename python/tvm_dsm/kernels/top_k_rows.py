"""Softmax statistics and top-k of rows (MoE routing) as one kernel that inserts only the few
elements that can still make the top k.

The generic fused rows (:mod:`tvm_dsm.rules.fused_rows`) stream a row once and insert every
element into each thread's k best (a branch-free network of k max/min pairs on packed keys,
:mod:`tvm_dsm.fusion.top_k_keys`), which leaves MoE routing 4096x4096 at ~3.4x its HBM floor
(``bench/results/cascades/latest.json``). A branch that skipped the network for elements
below a thread's k-th best would not help there: the 32 lanes of a warp test different
elements, and some lane almost always inserts.

Here each row is copied whole into shared memory (each of its ``lanes`` threads, one warp's,
copies its own pieces, 16 bytes or the widest of 8 and 4 that divides the row, by ``cp.async``
and reads back only those: no barrier), so the
row can be visited again for the price of a shared-memory read:

    m    = max over the row                 each lane's max, then a shuffle over the row's lanes
    T    = k-th largest of the lanes' maxima
    l    = sum F(x, m)                      with the final max: no rescaling, as the user wrote it
    keep = the k best of the elements >= T  each lane its own (one pass with l's), then a
                                            butterfly of bitonic merges
    out  = the function's epilogue (e.g. exp(top - m) / l and the indices), lanes over its columns

``T`` is a lower bound of the row's k-th value (the k lanes whose maxima are >= T hold k
elements >= T), so no element of the top k is below it, and on random logits only ~k+1
elements of a 4096-wide row reach it: the network runs for them, not for every element.
Elements compare as the function's value does (ties to the lower index through the keys; NaN
never enters), so the result is the unfused function's. Rows with fewer lanes than k take
every element (T is the lowest value then). Measured on the H100:
``bench/results/top_k_rows/latest.json``.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.script import tirx as T
from tvm.tirx.script.builder import ir as B

from ..errors import ClusterError
from ..fusion import top_k_keys
from ..fusion.cascade import (Level, indexed_by, inline_elementwise, only_load, parse_reduction,
                              single_fusible_cascade)
from ..fusion.epilogue import bind_stage, find_epilogue
from ..fusion.top_k import identity
from ..hardware import MAX_CTA_THREADS, Hardware
from ..ir import fast_exp, largest_power_of_two, loads, narrow_indices, root_blocks, shuffle_xor, substitute, tree_reduce
from .template import KernelTemplate

_LOAD_BYTES, _MIN_COPY_BYTES = 16, 4  # the widest and narrowest cp.async copies
_WARP = 32
#: Static shared memory of a CTA (the rows it stages).
_SHARED_BYTES = 48 * 1024
_ELEMENTS_PER_LANE = 32
_FULL = 0xFFFFFFFF
_LOWEST = -3.4028234663852886e38


@dataclass(frozen=True)
class TopKRowsConfig:
    """``lanes`` threads of a warp per row (a power of two), ``rows_per_cta`` rows per CTA."""

    lanes: int = 32
    rows_per_cta: int = 4

    @property
    def threads(self) -> int:
        return self.lanes * self.rows_per_cta

    def explain(self) -> str:
        return (f"top-k rows: {self.lanes} lanes a row, {self.rows_per_cta} rows ({self.threads} threads) a "
                "CTA, copied whole into shared memory; row max and sum by shuffles, then only elements at "
                "or above the k-th largest lane maximum enter the k best")


@dataclass(frozen=True)
class TopKRows:
    """What the kernel takes from the function: X [rows, width], the levels (a top-k, and a max
    and a sum of F(x, max) where present) and the element-wise blocks that read their results."""

    func: tirx.PrimFunc
    x: tirx.Var
    rows: int | tirx.PrimExpr  # a variable where the function's row count is known when called
    width: int
    top_k: Level
    max_level: Level | None
    sum_level: Level | None
    epilogue: tuple  # SBlocks

    @property
    def symbolic_rows(self) -> bool:
        return not isinstance(self.rows, int)

    @property
    def element_bytes(self) -> int:
        return tvm.DataType(str(self.x.ty.dtype)).bits // 8

    @property
    def vector(self) -> int:
        """Elements of X in a lane's copy unit: a 16-byte piece, or the widest power of two of
        elements that divides the row (60 experts in fp16: 8-byte pieces), so that every
        row's pieces start on their own size."""
        return largest_power_of_two(self.width, _LOAD_BYTES // self.element_bytes)

    def row_bytes(self, rows: int) -> int:
        """Shared memory for ``rows`` staged rows."""
        return rows * self.width * self.element_bytes


def find_top_k_rows(func: tirx.PrimFunc) -> TopKRows:
    """The cascade of ``func`` as the kernel takes it; ClusterError saying what does not match."""
    func = inline_elementwise(narrow_indices(func))
    group = _top_k_alone(func) or single_fusible_cascade(func, "top-k rows (a top-k, with a row max and sum)")[0]
    by_op = {lvl.op: lvl for lvl in group}
    top, mx, total = by_op.get("top_k"), by_op.get("max"), by_op.get("sum")
    if top is None or len(by_op) != len(group) or set(by_op) - {"top_k", "max", "sum"} or (total and not mx):
        raise ClusterError(f"top-k rows take one top-k with an optional row max and a sum reading it; got "
                           f"{[lvl.op for lvl in group]}")
    raw = top_k_keys.packable_value(top.value, top.extent, wide=True)
    if raw is None:
        raise ClusterError(f"the top-k must rank 16-bit or fp32 floats (as packed keys); got {top.value}")
    x_load = only_load(raw, "the top-k")
    if not raw.same_as(x_load):
        raise ClusterError(f"the top-k must rank X[row, key] as loaded (or widened to fp32); got {top.value}")
    x = x_load.source
    if len(x.ty.shape) != 2 or len(top.spatial) != 1 or not indexed_by(x_load, top.spatial[0], top.reduce_var):
        raise ClusterError(f"the top-k must rank X[row, key] of a 2-D X; got {top.value}")
    if mx is not None and not _same_value(mx.value, top.value, mx, top):
        raise ClusterError(f"the max must reduce the top-k's value; got {mx.value}")
    if total is not None and not all(
            (ld.source.same_as(x) and indexed_by(ld, total.spatial[0], total.reduce_var))
            or (ld.source.same_as(mx.output) and indexed_by(ld, total.spatial[0])) for ld in loads(total.value)):
        raise ClusterError(f"the sum may read only X[row, key] and the row max; got {total.value}")
    rows, width = x.ty.shape
    if not isinstance(width, tirx.IntImm):
        raise ClusterError(f"the top-k's rows must have a constant width; got {width}")
    rows, width = (int(rows) if isinstance(rows, tirx.IntImm) else rows), int(width)
    params = list(func.params)
    epilogue = find_epilogue(func, {lvl.block for lvl in group}, [b for lvl in group for b in lvl.results], rows)
    for lvl in group:
        for buf in lvl.results:
            if any(p.same_as(buf) for p in params) and str(buf.ty.dtype) not in ("float32", "int32"):
                raise ClusterError(f"{lvl.block} is written as {buf.ty.dtype}: the kernel keeps float32 / int32")
    return TopKRows(func, x, rows, width, top, mx, total, epilogue)


def _top_k_alone(func: tirx.PrimFunc) -> list[Level]:
    """``[the top-k]`` where it is the function's only reduction (a cascade of one level, which
    the cascade analysis does not list), else []."""
    levels = [lvl for lvl in map(parse_reduction, root_blocks(func)) if lvl is not None]
    return levels if len(levels) == 1 and levels[0].op == "top_k" else []


def _same_value(a, b, level_a: Level, level_b: Level) -> bool:
    """Whether two levels reduce the same expression (up to their own variables)."""
    renamed = substitute(a, [(level_a.spatial[0], level_b.spatial[0]), (level_a.reduce_var, level_b.reduce_var)])
    return tvm_ffi.structural_equal(renamed, b)


def check_config(found: TopKRows, c: TopKRowsConfig) -> None:
    """ClusterError naming the first constraint ``c`` breaks on ``found``."""
    vector = found.vector
    checks = [
        (c.lanes in (1, 2, 4, 8, 16, 32), f"lanes={c.lanes}: a power of two <= 32"),
        (vector * found.element_bytes >= _MIN_COPY_BYTES,
         f"rows of {found.width} x {found.element_bytes} B are not whole pieces of {_MIN_COPY_BYTES} bytes or "
         f"more (cp.async copies {_MIN_COPY_BYTES}, 8 or {_LOAD_BYTES})"),
        (found.width % (c.lanes * vector) == 0,
         f"the {found.width}-wide row does not split into {c.lanes} lanes of {vector}-element pieces"),
        (found.row_bytes(c.rows_per_cta) <= _SHARED_BYTES,
         f"{c.rows_per_cta} rows of {found.width} elements exceed {_SHARED_BYTES} bytes of shared memory"),
        (c.threads % _WARP == 0 and c.threads <= MAX_CTA_THREADS, f"{c.threads} threads a CTA: whole warps, at most {MAX_CTA_THREADS}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ClusterError(f"top-k rows {found.rows}x{found.width}, {c}: {message}")


def default_config(found: TopKRows) -> TopKRowsConfig:
    """A lane per 32 elements of the row (at most a warp), in CTAs of 128 threads (fewer where
    the rows or shared memory ask). Fitted on ``bench/results/top_k_rows/latest.json`` (H100, 5
    router shapes, 8-4096 experts): fewer lanes cost shuffles and merges per row, more leave
    each lane too little to do between them; 32 elements a lane was at or near the fastest on
    every shape, and CTAs of 64-256 threads within a few percent of each other."""
    lanes = max(1, min(_WARP, found.width // _ELEMENTS_PER_LANE))
    while lanes > 1 and found.width % (lanes * found.vector):
        lanes //= 2
    rows_per_cta = max(1, 128 // lanes)
    # Fewer rows a CTA where they do not divide the rows (whole CTAs of rows, as measured), down
    # to a warp; below that, the last CTA's spare row slots write nothing.
    while rows_per_cta > 1 and (found.row_bytes(rows_per_cta) > _SHARED_BYTES or (
            not found.symbolic_rows and found.rows % rows_per_cta and lanes * rows_per_cta > _WARP)):
        rows_per_cta //= 2
    config = TopKRowsConfig(lanes, rows_per_cta)
    check_config(found, config)
    return config


class TopKRowsTemplate(KernelTemplate):
    """The top-k rows kernel of a cascade :func:`find_top_k_rows` takes: its default split
    alone (every split moves the same bytes, see :mod:`tvm_dsm.families.top_k_rows`)."""

    def find(self, func: tirx.PrimFunc) -> TopKRows:
        return find_top_k_rows(func)

    def configs(self, found: TopKRows) -> list[TopKRowsConfig]:
        return [default_config(found)]

    def default_config(self, found: TopKRows, hw: Hardware | None = None) -> TopKRowsConfig:
        return default_config(found)

    def check(self, found: TopKRows, config: TopKRowsConfig) -> None:
        check_config(found, config)

    def kernel(self, found: TopKRows, config: TopKRowsConfig) -> tirx.PrimFunc:
        return top_k_rows_kernel(found, config)


TEMPLATE = TopKRowsTemplate()
#: The kernel of a function (see :func:`find_top_k_rows`), in a configuration or the default's.
fuse_top_k_rows = TEMPLATE.fuse


def top_k_rows_kernel(found: TopKRows, c: TopKRowsConfig) -> tirx.PrimFunc:  # noqa: C901
    """The passes of the module docstring as one CUDA kernel's TIR."""
    x, top, mx, total = found.x, found.top_k, found.max_level, found.sum_level
    L, W = c.lanes, c.rows_per_cta
    x_dtype = str(x.ty.dtype)
    X_BYTES = found.element_bytes
    VEC = found.vector  # check_config: every lane holds whole pieces
    # cp.async.cg copies 16 bytes only; .ca also 4 and 8
    copy_piece = T.ptx.cp.async_.cg.shared.global_ if VEC * X_BYTES == _LOAD_BYTES else T.ptx.cp.async_.ca.shared.global_
    PIECES = found.width // L // VEC
    K = top.top_k.k
    LOG_L = L.bit_length() - 1
    KEY = top_k_keys.key_dtype(x_dtype)
    value_dtype = str(top.value.ty.dtype)
    lowest = tvm.te.min_value(value_dtype)
    params = list(found.func.params)

    def key_of(q, e, lane):  # the key a lane's element (piece q, element e) sits at
        return (q * L + lane) * VEC + e

    def value(level: Level, element, m=None):
        """``level``'s reduced value at ``element`` (X's register) with the max ``m``."""
        def bind(load):
            if load.source.same_as(x):
                return element
            return m  # the sum's only other read: the max (find_top_k_rows checks)

        return tvm_ffi.structural_map(level.value, [(tvm.ir.TensorLoad, bind), (tvm.ir.Call, fast_exp)])

    def raw_max(a, b):  # in X's type (exact, NaN-ignoring as fmaxf): no widened copies to keep
        return tirx.max(a, b) if x_dtype == "float32" else tirx.call_pure_extern(x_dtype, "__hmax", a, b)

    def count_at_least(v):  # lanes of the row whose value is >= v
        return tree_reduce(operator.add, [tirx.Cast("int32", tirx.op.tvm_warp_shuffle(
            tirx.const(_FULL, "uint32"), v, s, L, _WARP) >= v) for s in range(L)])

    rows = found.rows
    if found.symbolic_rows and str(rows.ty) != "int32":
        rows = tirx.Cast("int32", rows)
    partial = found.symbolic_rows or found.rows % W != 0  # the last CTA holds rows past the count
    grid = (rows + (W - 1)) // W

    def write_results(row, lane, keys, m, l, valid):
        """The levels' results the function keeps, and its element-wise stages, for ``row``
        (where ``valid``: see ``partial``)."""
        registers = {}
        empty_value, empty_index = identity(value_dtype)
        for n in range(K):
            v, i = top_k_keys.unpack_pair(keys[n], x_dtype, value_dtype, empty_value, int(empty_index))
            registers[top.top_k.values[n]], registers[top.top_k.indices[n]] = v, i
        if mx is not None:
            registers[mx.output] = m
        if total is not None:
            registers[total.output] = l

        for buf, r in registers.items():
            param = next((p for p in params if p.same_as(buf)), None)
            if param is not None:
                with B.If(tirx.And(lane == 0, valid)):
                    with B.Then():
                        B.buffer_store(param, r, [row])
        for block in found.epilogue:
            extents = [int(iv.dom.extent) for iv in block.iter_vars[1:]]
            count = functools.reduce(operator.mul, extents, 1)
            for n in range((count + L - 1) // L):  # the lanes take the row's outputs in turn
                flat = lane + n * L
                columns, rest = [], flat
                for extent in reversed(extents):
                    columns.insert(0, rest % extent)
                    rest = rest // extent
                with B.If(tirx.And(flat < count, valid)):
                    with B.Then():
                        B.buffer_store(*bind_stage(block, [row] + columns, registers))

    def merge_lanes(keys):  # the row's lanes' k best, by a butterfly of bitonic merges
        mask = 1
        while mask < L:
            top_k_keys.merge_sorted(keys, functools.partial(shuffle_xor, mask=mask), K)
            mask *= 2

    @T.macro
    def load_piece(xr, xs, r, q, lane):
        for e in T.vectorized(VEC):
            xr[e] = xs[r, key_of(q, e, lane)]

    @T.macro
    def over_lanes(combine, st, i):  # st[i] combined over the row's lanes (each lane ends with it)
        for s in T.unroll(LOG_L):
            st[i] = combine(st[i], shuffle_xor(st[i], 1 << s))

    @T.prim_func(s_tir=True, check_well_formed=False)
    def fused():
        T.func_attr({"tirx.noalias": True})
        for bx in T.thread_binding(grid, thread="blockIdx.x"):
            for tx in T.thread_binding(c.threads, thread="threadIdx.x"):
                with T.sblock("top_k_rows"):
                    T.reads()
                    T.writes()
                    xs = T.sblock_alloc_buffer((W, found.width), x_dtype, scope="shared")
                    xr = T.sblock_alloc_buffer((VEC,), x_dtype, scope="local")
                    keys = T.sblock_alloc_buffer((K,), KEY, scope="local")
                    st = T.sblock_alloc_buffer((4,), "float32", scope="local")  # lane max, m, l, threshold
                    count = T.sblock_alloc_buffer((1,), "int32", scope="local")
                    base = T.sblock_alloc_buffer((1,), "uint32", scope="local")
                    lane = T.meta_var(tx % L)
                    r = T.meta_var(tx // L)
                    # Past the row count, a row slot reads the last row (its lanes stay in the
                    # warp's shuffles) and writes nothing.
                    row = T.meta_var(T.min(bx * W + r, rows - 1) if partial else bx * W + r)
                    valid = T.meta_var(bx * W + r < rows if partial else T.bool(True))
                    # Each lane copies and reads back only its own pieces of its row, so the copy
                    # needs no barrier, only the thread's own wait. By cp.async rather than through
                    # registers: 51 instead of 74 registers, and TVM sees no shared-memory write to
                    # put a __syncthreads after (docs/cascades.md).
                    base[0] = T.cuda.cvta_generic_to_shared(T.address_of(xs[r, 0]))
                    for q in T.unroll(PIECES):
                        T.evaluate(copy_piece(
                            base[0] + T.Cast("uint32", key_of(q, 0, lane) * X_BYTES),
                            T.address_of(x[row, key_of(q, 0, lane)]), VEC * X_BYTES, T.bool(False)))
                    T.evaluate(T.ptx.cp.async_.commit_group())
                    T.evaluate(T.ptx.cp.async_.wait_group(0))
                    st[0] = T.float32(_LOWEST)
                    for q in range(PIECES):
                        load_piece(xr, xs, r, q, lane)
                        st[0] = T.max(st[0], value(top, tree_reduce(raw_max, [xr[e] for e in range(VEC)])))
                    st[1] = st[0]
                    over_lanes(T.max, st, 1)
                    st[3] = lowest
                    if L >= K:
                        count[0] = count_at_least(st[0])
                        if count[0] >= K:
                            st[3] = st[0]
                        over_lanes(T.max, st, 3)
                    for n in T.unroll(K):
                        keys[n] = T.Cast(KEY, 0)
                    st[2] = T.float32(0)
                    for q in range(PIECES):  # the sum and the candidates in one more pass
                        load_piece(xr, xs, r, q, lane)
                        if total is not None:
                            st[2] = st[2] + tree_reduce(operator.add, [value(total, xr[e], st[1]) for e in range(VEC)])
                        for e in T.unroll(VEC):
                            if xr[e] >= T.Cast(x_dtype, st[3]):
                                top_k_keys.insert(keys, xr[e], key_of(q, e, lane), K, top.init)
                    if total is not None:
                        over_lanes(operator.add, st, 2)
                    merge_lanes(keys)
                    write_results(row, lane, keys, st[1], st[2], valid)

    return tirx.PrimFunc(params, fused.body, attrs=fused.attrs)

