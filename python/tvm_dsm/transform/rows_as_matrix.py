"""Tensors whose leading axes are rows, as matrices: ``x[b, s, k] @ W`` as a GEMM of ``b * s`` rows.

(Likewise a norm over ``x[b, s, h]``: rows of ``h``, its statistics one value a row. A weight
with leading axes of one element, read at 0 along them, is taken as the matrix it holds: TOPI's
``batch_matmul`` of activations by a broadcast ``[1, N, K]`` weight, as a Linear over a
transposed 3-D input imports, is a GEMM of ``batch * M`` rows.)

A linear layer written over activations of rank 3 (``x[batch, seq, in]``: hand-written TE, or a
Relax ``matmul`` legalized outside tvm-dsm's pipeline) is a GEMM whose rows are the leading
axes taken together, but its blocks iterate ``(b, s, j, k)``, and the GEMM families take
``(i, j, k)``. Where every block of a function iterates the same leading row axes first and
every tensor indexed by them is indexed by exactly those, first and in order (the weights and
a bias by none), :func:`rows_as_matrix` gives the function over matrices: those tensors with
their leading axes merged into one (``s_tir``'s ``transform_layout``) and the blocks' row
iterators into one (``transform_block_layout``). :func:`over_original_tensors` then puts a
schedule of that function back behind the original signature, each merged tensor declared on
its original's data: the same memory read as a matrix, so a call takes the original tensors.

The families dispatch a symbolic row count on one variable (:mod:`tvm_dsm.families.row_ranges`):
where the rows are a product (``[batch, seq, hidden]`` with both symbolic, or ``[2, seq,
hidden]``), the matrices take a row variable of their own in its place, bound to that product
when the function is called.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.ir import TensorLoad
from tvm.s_tir import SBlock, SBlockRealize
from tvm.sym import Analyzer

from ..errors import ClusterError
from ..ir import find_all, items, substitute, uses, with_block_fields


def _nest_block(nest: tirx.Stmt) -> SBlock:
    """The one block of a loop nest in the form TE and legalization write (each loop one
    iterator of the block), else ClusterError."""
    loops = []
    while isinstance(nest, tirx.For):
        loops.append(nest)
        nest = nest.body
    if not isinstance(nest, SBlockRealize) or len(loops) != len(nest.iter_values) or not all(
            value.same_as(loop.loop_var) for value, loop in zip(nest.iter_values, loops)):
        raise ClusterError("rows as a matrix: a loop nest is not one loop per iterator of one block")
    return nest.block


def accesses(block: SBlock) -> list[tuple[tirx.Var, list]]:
    """(buffer, indices) of every load and store in ``block``'s body and initialization."""
    stmts = [block.body] + ([block.init] if block.init is not None else [])
    found = []
    for stmt in stmts:
        found += [(s.buffer, list(s.indices)) for s in find_all(stmt, tirx.BufferStore)]
        found += [(t.source, list(t.indices)) for t in find_all(stmt, TensorLoad)]
    return found


def _row_axes(func: tirx.PrimFunc) -> tuple[int, list, list, list, list] | None:
    """(how many leading axes are rows, their extents, the buffers indexed by them, the names of
    the blocks iterating them, the (block name, buffer) reads of a weight at rows of one
    element: :func:`_unit_rows_read_as_zero`) where ``func`` has that form (see the module
    docstring), else None. A block of no row (a weight's cast) touches none of those buffers."""
    if not isinstance(func.body, SBlockRealize):
        return None
    try:
        blocks = [_nest_block(nest) for nest in items(func.body.block.body)]
    except ClusterError:
        return None
    # the rows: the leading axes of a product's output (a linear layer), else of the function's
    # output (a norm: its statistics hold one value a row, indexed by the rows alone)
    params = list(func.params)
    products = [b for b in blocks if b.init is not None and any(
        len(buf.shape) >= 3 for buf, _ in accesses(b) if any(w.source.same_as(buf) for w in b.writes))]
    outputs = [b for b in blocks if len(b.writes) == 1 and len(b.writes[0].source.shape) >= 3
               and any(b.writes[0].source.same_as(p) for p in params)]
    defining = (products or outputs or [None])[0]
    if defining is None:
        return None
    rows = len(defining.writes[0].source.shape) - 1
    extents = [iv.dom.extent for iv in defining.iter_vars[:rows]]
    analyzer = Analyzer()
    indexed: list = []
    row_blocks, rowless, at_unit_rows = [], [], []
    for block in blocks:
        row_vars = [iv.var for iv in block.iter_vars[:rows]]
        if (len(block.iter_vars) < rows
                or any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars[:rows])
                or not all(analyzer.can_prove_equal(iv.dom.extent, e)
                           for iv, e in zip(block.iter_vars[:rows], extents))):
            rowless.append(block)
            continue
        row_blocks.append(str(block.name_hint))
        units = [iv.var for iv in block.iter_vars[:rows] if analyzer.can_prove_equal(iv.dom.extent, 1)]
        written = [w.source for w in block.writes]
        for buf, indices in accesses(block):
            if not any(uses(i, v) for i in indices for v in row_vars):
                continue  # a weight or a bias: indexed by none of the rows
            leading, rest = indices[:rows], indices[rows:]
            if (len(indices) < rows or not all(i.same_as(v) for i, v in zip(leading, row_vars))
                    or any(uses(i, v) for i in rest for v in row_vars)):
                if (any(buf.same_as(p) for p in params) and not any(buf.same_as(w) for w in written)
                        and not any(uses(i, v) for i in indices for v in row_vars if not any(
                            v.same_as(u) for u in units))):
                    at_unit_rows.append((str(block.name_hint), buf))  # a weight (MQA's one KV head)
                    continue
                return None
            if not any(buf.same_as(b) for b in indexed):
                # merged in memory as the rows are merged in the loops: the same leading extents
                # (a tensor longer than the rows iterate would be read at the wrong rows), compact
                if (not all(analyzer.can_prove_equal(d, e) for d, e in zip(buf.ty.shape[:rows], extents))
                        or list(buf.ty.strides) or not analyzer.can_prove_equal(buf.ty.elem_offset, 0)):
                    return None
                indexed.append(buf)
        # a row variable read other than as a row index (a position, a mask) keeps its axes
        values = [without_loads(s.value) for s in find_all(block.body, tirx.BufferStore)]
        if any(uses(value, v) for value in values for v in row_vars):
            return None
    if any(buf.same_as(b) for block in rowless for buf, _ in accesses(block) for b in indexed):
        return None
    return rows, extents, indexed, row_blocks, at_unit_rows


def _unit_rows_read_as_zero(func: tirx.PrimFunc, reads: list) -> tirx.PrimFunc:
    """``func`` with each of ``reads`` (block name, parameter) taken at its block's row iterators
    of one element as their one value: Relax's matmul of ``q [1, H, S, D]`` by a broadcast
    ``k [1, 1, D, S]`` reads ``k[b, 0, d, s]`` with ``b`` the batch of one, which makes the
    weight look indexed by a row; read at ``k[0, 0, d, s]`` it is a weight of leading unit
    axes, read at 0."""
    if not reads:
        return func

    def rewrite(realize):
        block = realize.block
        targets = [buf for name, buf in reads if name == str(block.name_hint)]
        if not targets:
            return realize
        units = [(iv.var, iv.dom.min) for iv in block.iter_vars
                 if isinstance(iv.dom.extent, tirx.IntImm) and iv.dom.extent.value == 1]

        def load(node):
            if not any(node.source.same_as(t) for t in targets):
                return node
            return tirx.BufferLoad(node.source, [substitute(i, units) for i in node.indices])

        def region(r):
            if not any(r.source.same_as(t) for t in targets):
                return r
            return tirx.BufferRegion(r.source, [tvm.ir.Range.from_min_extent(substitute(x.min, units), x.extent)
                                                for x in r.region])

        body = tvm_ffi.structural_map(block.body, [(TensorLoad, load)])
        return SBlockRealize(realize.iter_values, realize.predicate, with_block_fields(
            block, body=body, reads=[region(r) for r in block.reads]))

    return func.with_body(tvm_ffi.structural_map(func.body, [(SBlockRealize, rewrite)]))


def without_loads(value):
    """``value`` with each load replaced by zero: what it computes from its indices' variables
    other than through the tensors it reads."""
    return tvm_ffi.structural_map(value, [(TensorLoad, lambda load: tirx.const(0, str(load.ty)))])


def row_major(axes: list, extents: list):
    """``axes`` (of ``extents``) as one index, row-major."""
    return functools.reduce(lambda acc, pair: acc * pair[1] + pair[0], zip(axes[1:], extents[1:]), axes[0])


def _merged(axes: list, extents: list, rows: int):
    """The first ``rows`` of ``axes`` as one row index (row-major), then the rest."""
    return [row_major(axes[:rows], extents[:rows]), *axes[rows:]]


def _merging(ndim: int, extents: list, rows: int) -> tirx.IndexMap:
    """The index map of ``ndim`` axes merging the first ``rows`` (of ``extents``), in the
    extents' index type."""
    return tirx.IndexMap.from_func(lambda *axes: _merged(list(axes), extents, rows), ndim=ndim,
                                   index_dtype=str(extents[0].ty))


@dataclass(frozen=True)
class Matrices:
    """A function over matrices (:func:`rows_as_matrix`) and, where the original's rows are a
    product with a variable (``[batch, seq, hidden]``, ``[2, seq, hidden]``), the row variable
    it takes instead and the product that variable is bound to when it is called as the
    original."""

    func: tirx.PrimFunc
    rows: tuple[tirx.Var, tirx.PrimExpr] | None = None


def _unit_axes_read_at_zero(region, params) -> int:
    """How many leading axes of one element the parameter read in ``region`` has, each read at 0
    (a weight of a batch of one: ``w[0, j, k]``), short of the last two; 0 for any other read."""
    buf, units = region.source, 0
    if not any(buf.same_as(p) for p in params):
        return 0
    for extent, r in zip(buf.shape[:-2], region.region):
        if not (isinstance(extent, tirx.IntImm) and int(extent) == 1 and isinstance(r.min, tirx.IntImm)
                and int(r.min) == 0):
            break
        units += 1
    return units


def _dropping(units: int, buf: tirx.Buffer) -> tirx.IndexMap:
    """The index map of ``buf``'s axes without its first ``units`` (of one element each)."""
    return tirx.IndexMap.from_func(lambda *axes: list(axes[units:]), ndim=len(buf.shape),
                                   index_dtype=str(buf.shape[0].ty))


def has_row_axes(func: tirx.PrimFunc) -> bool:
    """Whether ``func``'s tensors have leading row axes to merge (the analysis alone, without
    the schedule :func:`rows_as_matrix` runs)."""
    found = _row_axes(func)
    return found is not None and found[0] >= 2  # else no row axes, or already a matrix


def relayout(sch: s_tir.Schedule, block_rv, buffers: list, done: list, index_map) -> None:
    """Each of ``buffers`` that the block reads or writes and is not in ``done`` laid out by
    ``index_map(buffer)`` (``transform_layout``, which rewrites every block's accesses), then
    added to ``done``."""
    block = sch.get(block_rv)
    for kind, regions in (("read", block.reads), ("write", block.writes)):
        for index, region in enumerate(regions):
            buf = region.source
            if any(buf.same_as(b) for b in buffers) and not any(buf.same_as(d) for d in done):
                sch.transform_layout(block_rv, (kind, index), index_map(buf))
                done.append(buf)


def rows_as_matrix(func: tirx.PrimFunc) -> Matrices | None:
    """``func`` over matrices (see the module docstring), or None where its tensors have no
    leading row axes to merge."""
    found = _row_axes(func)
    if found is None or found[0] < 2:
        return None  # no row axes, or already a matrix
    rows, extents, indexed, row_blocks, at_unit_rows = found
    sch = s_tir.Schedule(_unit_rows_read_as_zero(func, at_unit_rows))
    done = []
    for block_rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(block_rv)
        if str(block.name_hint) not in row_blocks:
            continue
        relayout(sch, block_rv, indexed, done, lambda buf: _merging(len(buf.shape), extents, rows))
        for index, region in enumerate(block.reads):
            units = _unit_axes_read_at_zero(region, func.params)
            if units and not any(region.source.same_as(d) for d in done):
                sch.transform_layout(block_rv, ("read", index), _dropping(units, region.source))
                done.append(region.source)
        sch.transform_block_layout(block_rv, _merging(len(block.iter_vars), extents, rows))
    merged = sch.mod["main"]
    count = Analyzer().simplify(functools.reduce(lambda a, b: a * b, extents))
    if isinstance(count, (tirx.IntImm, tirx.Var)):
        return Matrices(merged)
    # a product of extents (batch * seq, 3 * seq): a row variable of the matrices' own
    variable = tirx.Var("rows", str(count.ty))
    merged = tvm_ffi.structural_map(
        merged, [(type(count), lambda e: variable if tvm_ffi.structural_equal(e, count) else e)])
    if any(uses(d, v) for p in merged.params for d in getattr(p.ty, "shape", None) or ()
           for v in find_all(count, tirx.Var)):
        return None  # the product written otherwise somewhere: the row variable would not stand for it
    return Matrices(merged, (variable, count))


def over_original_tensors(func: tirx.PrimFunc, matrices: Matrices, scheduled: tirx.PrimFunc) -> tirx.PrimFunc:
    """``scheduled`` (a schedule of ``matrices.func``, :func:`rows_as_matrix`'s for ``func``)
    called as ``func``: the variables of its parameters' shapes bound (the row variable to the
    product of ``func``'s row extents, a variable narrowed to int32 by scheduling to ``func``'s
    of its name), each of its parameters declared on the data of ``func``'s parameter in its
    place."""
    own = {v.name: v for p in func.params for d in getattr(p.ty, "shape", None) or () for v in find_all(d, tirx.Var)}
    if matrices.rows is not None:
        own[matrices.rows[0].name] = matrices.rows[1]
    stmts, bound = [], []
    for param in scheduled.params:
        for var in (v for d in getattr(param.ty, "shape", None) or () for v in find_all(d, tirx.Var)):
            if not any(var.same_as(o) for o in [*bound, *own.values()]):
                value = own.get(var.name)
                if value is None:
                    raise ClusterError(f"rows as a matrix: the schedule's extent {var.name} is none of the function's")
                stmts.append(tirx.Bind(var, value if str(value.ty) == str(var.ty) else tirx.Cast(str(var.ty), value)))
                bound.append(var)
    stmts += [tirx.DeclBuffer(merged, data=original.data) for original, merged in zip(func.params, scheduled.params)
              if not merged.same_as(original)]
    return tirx.PrimFunc(func.params, tirx.SeqStmt([*stmts, scheduled.body]) if stmts else scheduled.body,
                         func.ret_type, scheduled.attrs)
