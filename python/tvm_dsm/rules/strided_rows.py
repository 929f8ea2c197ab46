"""Reductions over an axis that is not the innermost (a norm over the channels of an NCHW
tensor, a sum over ``dim=1``), or over a window the points slide along (a depthwise
convolution's kernel, a pooling window), a thread per point of the other axes, its row in
registers.

ConvNeXt's ``LayerNorm(data_format="channels_first")`` takes the mean and variance of
``x[n, :, i, j]``, 96 channels a ``H * W`` stride apart. The row norm kernel needs the row
contiguous (16-byte pieces along the last axis), and dlight's reduction rules give a row to a
group of threads reading one element each a stride apart: 338 us for a 32 x 96 x 56 x 56 layer
whose bytes take 13 (H100, ``bench/user_functions`` 204). Here neighbouring threads take
neighbouring points, so each step along the reduced axis is a coalesced load across a warp; a
thread loads its row once into registers (where it fits, :data:`MAX_HELD_BYTES`), computes the
statistics in order and writes its outputs along the row, every loop over the row unrolled.

A depthwise 7 x 7 convolution is the same loop over 49 terms: Relax's legalization of
ConvNeXt's (32 x 96 x 56 x 56, fp16) took 9.5 ms under dlight, where torch.compile takes 96 us
(H100, ``bench/user_functions`` 214); its window's innermost index is ``w + rx``, so
neighbouring threads still read neighbouring addresses.

Taken where the function's blocks are its statistics (reductions of one length, the product of
their reduced axes' extents, up to :data:`MAX_ROW`) and element-wise blocks (a padding), one of
which writes the output, and every multi-dimensional access moves along its innermost axis
with the points (its innermost index is a point's variable plus an offset or a window's): the
function is scheduled as written, so any statistic and any expression of them is computed as
the user wrote it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock
from tvm.sym import Analyzer

from ..errors import ClusterError
from ..ir import IF_THEN_ELSE, is_reduction, loads, narrow_indices, root_blocks, uses

#: The longest reduced axis a thread loops over (unrolled).
MAX_ROW = 256
#: Bytes of a row a thread holds in registers (96 fp16 channels: 48 registers).
MAX_HELD_BYTES = 256
#: The fewest points per SM: a thread's loads follow one another along the row, so only other
#: threads hide their latency.
MIN_POINTS_PER_SM = 64


@dataclass(frozen=True)
class StridedRowsConfig:
    """Threads per CTA, and whether each thread first loads its row into registers."""

    threads: int = 128
    held: bool = True

    def explain(self) -> str:
        held = "its row loaded once into registers" if self.held else "its row read again by each pass"
        return f"strided rows: a thread per point of the other axes, {self.threads} a CTA, {held}"


@dataclass(frozen=True)
class StridedRows:
    """The function, its output block, the output block's variable along the reduced axis (None
    where the output is the reduction itself), the row's length (the product of the reduced
    axes' extents), the points (the other axes' elements), and the tensors read along the
    reduced axis by more than one block (held in registers)."""

    func: tirx.PrimFunc
    output: str
    axis: tirx.Var | None
    row: int
    points: int
    held: tuple[tirx.Var, ...]

    @property
    def held_bytes(self) -> int:
        return sum(self.row * tvm.DataType(str(b.ty.dtype)).bits // 8 for b in self.held)


def _reduced_vars(block: SBlock) -> list[tirx.IterVar]:
    reduced = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if not all(isinstance(iv.dom.extent, tirx.IntImm) for iv in reduced):
        raise ClusterError(f"strided rows: {block.name_hint} reduces over axes of constant extents only")
    return reduced


def _row_length(block: SBlock) -> int:
    return math.prod(int(iv.dom.extent) for iv in _reduced_vars(block))


def _spatial_vars(block: SBlock) -> list[tirx.Var]:
    return [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]


def _innermost_point(block: SBlock) -> tirx.Var | None:
    """The block's last spatial variable of more than one value: neighbouring threads' points
    differ along it."""
    spatial = [iv.var for iv in block.iter_vars
               if iv.iter_type == tirx.IterVar.DataPar and not (isinstance(iv.dom.extent, tirx.IntImm)
                                                                and int(iv.dom.extent) == 1)]
    return spatial[-1] if spatial else None


def _coalesced(indices, inner) -> bool:
    """Whether neighbouring points access one address (``inner``, the points' innermost
    variable, indexes nothing: a broadcast) or neighbouring ones (only the innermost index uses
    it, as ``inner`` plus terms free of it: an offset, a window's variable)."""
    if inner is None or not any(uses(i, inner) for i in indices):
        return True
    return (not any(uses(i, inner) for i in indices[:-1])
            and not uses(Analyzer().simplify(indices[-1] - inner), inner))


def _store(block: SBlock) -> tirx.BufferStore:
    if not isinstance(block.body, tirx.BufferStore):
        raise ClusterError(f"strided rows: {block.name_hint} is one store")
    return block.body


def _index_of(items, var) -> int | None:
    return next((n for n, item in enumerate(items) if item.same_as(var)), None)


def _row_axis(blocks: list, along: list, output: SBlock) -> tirx.Var | None:
    """The output block's variable along the reduced axis: the row positions of the tensors the
    reductions read along it carried through the element-wise blocks (a tensor written at
    ``[.., a, ..]`` from one read at its row position with ``a``, and back), until none
    changes; None where the output has no such axis (a statistic per point)."""
    positions = list(along)  # (tensor, position)

    def position(tensor) -> int | None:
        return next((at for t, at in positions if t.same_as(tensor)), None)

    changed = True
    while changed:
        changed = False
        for b in (b for b in blocks if not is_reduction(b)):
            store = _store(b)
            accesses = [(store.buffer, store.indices), *((ld.source, ld.indices) for ld in loads(store.value))]
            for tensor, indices in accesses:
                at = position(tensor)
                if at is None or not isinstance(indices[at], tirx.Var):
                    continue
                for other, other_indices in accesses:
                    spot = _index_of(other_indices, indices[at])
                    if spot is not None and position(other) is None:
                        positions.append((other, spot))
                        changed = True
    at = position(_store(output).buffer)
    return None if at is None or is_reduction(output) else _store(output).indices[at]


def _check_not_a_matmul(block: SBlock, reduced: list, spatial: list) -> None:
    """ClusterError where ``block`` multiplies two tensors read along its reduced axes that
    each vary with a point variable the other does not (``a[i, k] * b[k, j]``; a convolution
    over input channels, ``x[n, c, h + ry, w + rx] * w[o, c, ry, rx]``): a matmul, the GEMM
    families' work, which a thread per point would do on CUDA cores. A depthwise kernel
    (``w[c, 0, ry, rx]``: of no variable ``x`` lacks) or a product of two tensors at one point
    (``x[n, c, i, j] * y[n, c, i, j]`` over ``c``) is not one. ``reduced`` and ``spatial``: the
    block's reduced and spatial variables."""
    operands = []  # (tensor, the point variables it varies with)
    for ld in loads(_store(block).value):
        if any(uses(i, r) for i in ld.indices for r in reduced):
            operands.append((ld.source, {n for n, v in enumerate(spatial) if any(uses(i, v) for i in ld.indices)}))
    for n, (a, of_a) in enumerate(operands):
        for b, of_b in operands[n + 1:]:
            if not a.same_as(b) and of_a - of_b and of_b - of_a:
                raise ClusterError(f"strided rows: {block.name_hint} multiplies {a.name} and {b.name} along its "
                                   "reduced axes, each over points the other is not: a matmul (the GEMM families')")


def find_strided_rows(func: tirx.PrimFunc) -> StridedRows:
    """What :func:`schedule_strided_rows` needs of ``func``; ClusterError naming what does not
    hold."""
    blocks = root_blocks(func)
    params = [p for p in func.params if hasattr(p.ty, "shape")]
    if any(not isinstance(d, tirx.IntImm) for p in params for d in p.ty.shape):
        raise ClusterError("strided rows: constant extents only")
    reductions = [b for b in blocks if is_reduction(b)]
    if not reductions:
        raise ClusterError("strided rows: no reduction")
    outputs = [b for b in blocks if any(_index_of(params, w.source) is not None for w in b.writes)]
    if len(outputs) != 1 or not outputs[0].same_as(blocks[-1]):
        raise ClusterError("strided rows: one block, the last, writes the output")
    extents = {_row_length(b) for b in reductions}
    if len(extents) != 1:
        raise ClusterError(f"strided rows: the reductions are over one length (not {sorted(extents)})")
    (row,) = extents
    if row > MAX_ROW:
        raise ClusterError(f"strided rows: a row of at most {MAX_ROW} elements a thread loops over (not {row})")
    along = []  # (tensor, position of the reduced axis) the reductions read along it
    for b in reductions:
        reduced, spatial, inner = [iv.var for iv in _reduced_vars(b)], _spatial_vars(b), _innermost_point(b)
        _check_not_a_matmul(b, reduced, spatial)
        for ld in loads(_store(b).value):
            positions = [n for n, i in enumerate(ld.indices) if any(uses(i, r) for r in reduced)]
            if not positions:
                continue
            if positions[-1] == len(ld.indices) - 1 and not _coalesced(ld.indices, inner):
                raise ClusterError(f"strided rows: {b.name_hint} reduces {ld.source.name} over its innermost axis "
                                   "(the row norm's form)")
            if not any(uses(ld.indices[n], v) for n in positions for v in spatial):
                along.append((ld.source, positions[0]))  # a row along an axis (a window's read slides: none)
    output = outputs[0]
    axis = _row_axis(blocks, along, output)
    for b in blocks:
        store, inner = _store(b), _innermost_point(b)
        accesses = [(store.indices, store.buffer.name), *((ld.indices, ld.source.name) for ld in loads(store.value))]
        for indices, name in accesses:
            if len(indices) >= 2 and (not _coalesced(indices, inner) or (axis is not None and uses(indices[-1], axis))):
                raise ClusterError(f"strided rows: {b.name_hint} accesses {name} along an innermost axis the points "
                                   "do not move along")
    out_elements = math.prod(int(d) for d in output.writes[0].source.ty.shape)
    readers = {}  # a parameter read along the reduced axis: the blocks reading it
    for b in blocks:
        for ld in loads(_store(b).value):
            n = _index_of(params, ld.source)
            if n is not None and any(ld.source.same_as(source) for source, _ in along):
                readers.setdefault(n, set()).add(b.name_hint)
    held = tuple(params[n] for n, names in readers.items() if len(names) > 1)
    if all(math.prod(int(d) for d in p.ty.shape) < 2 ** 31 for p in params):
        func = narrow_indices(func)  # Relax's int64 indices: a thread's divisions in 32 bits
    return StridedRows(_unbranched_padding(func), output.name_hint, axis, row,
                       out_elements // (row if axis is not None else 1), held)


def _unbranched_padding(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each padding read of an input, ``if_then_else(inside, x[idx], fill)``, as a
    select of a load at the indices clamped into ``x`` (the same value wherever ``inside`` holds,
    as ``x[idx]`` is then in bounds; in bounds where it does not). A window's thread makes one
    such read per term: as branches, each recomputed its address (a 7 x 7 depthwise convolution
    ran 1,093 instructions a point, bound by them; 536 without), where straight-line loads share
    one base the compiler computes once."""
    inputs = list(func.params)

    def unbranched(call):
        if not (call.op.same_as(IF_THEN_ELSE) and isinstance(call.args[1], tvm.ir.TensorLoad)
                and any(call.args[1].source.same_as(b) for b in inputs)):
            return call
        load = call.args[1]
        clamped = [tirx.max(tirx.min(i, tirx.const(int(extent) - 1, i.ty)), tirx.const(0, i.ty))
                   for i, extent in zip(load.indices, load.source.ty.shape)]
        read = tirx.Var("padded", load.ty)  # bound outside the select: TVM turns a select of loads into a branch
        return tirx.Let(read, tirx.BufferLoad(load.source, clamped), tirx.Select(call.args[0], read, call.args[2]))

    return func.with_body(tvm_ffi.structural_map(func.body, [(tvm.ir.Call, unbranched)]))


def schedule_strided_rows(found: StridedRows, config: StridedRowsConfig) -> s_tir.Schedule:
    """``found``'s function scheduled: the output block's loops along the points fused, split
    over CTAs of ``config.threads`` threads, every other block computed in its thread (its
    results in registers), the held tensors' rows loaded into registers first where
    ``config.held``, every loop left inside a thread unrolled."""
    sch = s_tir.Schedule(found.func)
    output = sch.get_sblock(found.output)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    loops = sch.get_loops(output)
    block = sch.get(output)
    if found.axis is not None:
        at = next(n for n, iv in enumerate(block.iter_vars) if iv.var.same_as(found.axis))
        row_loops = [loops[at]]
    else:
        row_loops = [lp for lp, iv in zip(loops, block.iter_vars) if iv.iter_type == tirx.IterVar.CommReduce]
    points = [lp for lp in loops if not any(lp.same_as(r) for r in row_loops)]
    sch.reorder(*points, *row_loops)
    bx, tx = sch.split(sch.fuse(*points), [None, config.threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    others = [b for b in blocks if not sch.get(b).same_as(block)]
    for b in reversed(others):
        sch.compute_at(b, tx)
        sch.set_scope(b, 0, "local")
    inside = [*others, output]
    for tensor in found.held if config.held else ():
        users = [b for b in inside if any(ld.source.same_as(tensor) for ld in loads(sch.get(b).body))]
        index = next(n for n, r in enumerate(sch.get(users[0]).reads) if r.source.same_as(tensor))
        cache = sch.cache_read(users[0], index, "local", consumer_blocks=users)
        sch.compute_at(cache, tx)
        inside.append(cache)
    for b in inside:
        for lp in sch.get_loops(b)[2:]:
            sch.unroll(lp)
    return sch

