"""Injective functions whose transcendental math does not depend on one axis, computed once per
thread for every element along that axis.

Rotary embedding (``nn.llm``'s ``fused_rope``) rotates each head's query and key by an angle of
the position and the head dim only: ``cos`` and ``sin`` of ``position / theta ** (2 d / D)``.
Written as one element per thread, every head recomputes them, and the kernel is bound by its
``powf``, ``sinf`` and ``cosf`` rather than by its bytes (1B Llama prefill of 2048 tokens: 21 us
a layer for 25 MB). Unrolling the heads inside a thread does not help by itself: each copy of
the math sits in its own branch (query, key or value heads), and the CUDA compiler keeps them
all. So :func:`per_thread_math` rewrites the function: a block over the other axes computes
each distinct transcendental call once into a small buffer, and the function's block reads it;
the schedule places that block in each thread (local memory, i.e. registers) and loops over the
axis inside the thread, unrolled.

Where every access moves contiguously along the innermost axis and each condition on it holds
alike for a 16-byte vector's elements (rotate-half's ``d < D / 2``:
:func:`~tvm_dsm.rules.elementwise.branch_lanes`), a thread takes a
vector of that axis: its loads and stores move 16 bytes, its math computed for the vector's
elements (the 1B Llama's at 16384 tokens: 62.2 us against 101.4 with 2-byte accesses, 47.4 at
HBM speed; H200, bench/results/archive/rope_parts_s73.json).

Taken where the function has one output block that cannot move in 16-byte vectors without
branches (those go to :mod:`tvm_dsm.rules.elementwise`), at least one transcendental call, and an
axis other than the innermost of constant extent up to :data:`MAX_IN_THREAD` that none of those
calls uses (``Let`` variables are followed to their values).
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize
from tvm.s_tir.analysis import get_sblock_read_write_region

from ..errors import ClusterError
from ..ir import block_analyzer, find_all, seq, substitute, uses
from .elementwise import (TRANSCENDENTAL, branch_lanes, output_blocks, transcendental_calls, vector_lanes,
                          vectorized_branches)

#: The longest axis looped over inside a thread (unrolled).
MAX_IN_THREAD = 64
#: The block the rewrite adds, and its buffers' prefix (one buffer a distinct call).
HOISTED = "per_thread_math"


@dataclass(frozen=True)
class PerThreadMathConfig:
    """Threads per CTA, and the parts the in-thread axis is split into: each thread takes one
    point of the other axes and one part of that axis (its math computed once a part), so that
    a few points (a decode step's one token) still spread over enough threads."""

    threads: int = 128
    parts: int = 1

    def explain(self) -> str:
        return (f"per-thread math: {self.threads} threads a CTA, the in-thread axis in {self.parts} part(s), "
                "each unrolled in a thread")


@dataclass(frozen=True)
class PerThreadMath:
    """The block whose math is computed once per thread, the position and extent of the axis
    looped over inside a thread, how many distinct calls are computed once, and the points of
    the other axes."""

    block: str
    axis: int
    extent: int
    calls: int
    points: tirx.PrimExpr | int  # of the other axes
    lanes: int = 1  # elements of the innermost axis a thread takes (a 16-byte vector, or 1)

    @property
    def threads(self) -> tirx.PrimExpr | int:
        """Threads where the in-thread axis is whole: a point of the other axes and vector each."""
        return self.points // self.lanes


def _transcendental(expr) -> list:
    """The outermost transcendental calls in ``expr`` (a call inside another is computed with it)."""
    calls = transcendental_calls(expr)
    return [c for c in calls if not any(d is not c and find_all(d, tvm.ir.Call, lambda n: n.same_as(c))
                                        for d in calls)]


def _lets(block: SBlock) -> list:
    """The (variable, value) of each ``Let`` expression in ``block``."""
    return [(let.var, let.value) for let in find_all(block.body, tirx.Let)]


def _inline_lets(expr, lets: list):
    """``expr`` with the variables of ``lets`` replaced by their values."""
    for _ in lets:
        expr = substitute(expr, lets)
    return expr


def _distinct(exprs: list) -> list:
    """``exprs`` without repeats (structurally) and without those inside another of them."""
    found: list = []
    for e in exprs:
        if not any(tvm_ffi.structural_equal(e, f) for f in found):
            found.append(e)
    return [e for e in found if not any(f is not e and find_all(f, tvm.ir.Call, lambda n: tvm_ffi.structural_equal(n, e))
                                        for f in found)]


def _analysis(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, SBlock, int, list]:
    """``func`` with every block but its output block inlined, that block, the position of its
    in-thread axis (the longest that qualifies) and its distinct transcendental calls with
    ``Let`` variables inlined; ClusterError saying what is missing."""
    sch = s_tir.Schedule(func)
    blocks = output_blocks(sch)
    if len(blocks) != 1:
        raise ClusterError(f"per-thread math takes one output block, found {len(blocks)}")
    block = sch.get(blocks[0])
    if vector_lanes(block) > 1:
        raise ClusterError("its accesses move in 16-byte vectors: the elementwise family's")
    loops = [sch.get(lp).loop_var for lp in sch.get_loops(blocks[0])]
    bound = find_all(sch.mod["main"].body, SBlockRealize, lambda r: r.block.name_hint == block.name_hint)
    if (len(bound) != 1 or len(loops) != len(block.iter_vars)
            or not all(v.same_as(lp) for v, lp in zip(bound[0].iter_values, loops))
            or not all(isinstance(iv.dom.min, tirx.IntImm) and int(iv.dom.min) == 0 for iv in block.iter_vars)):
        raise ClusterError("per-thread math takes a block whose iterators are its loops, in order, from 0")
    lets = _lets(block)
    calls = _distinct([_inline_lets(c, lets) for c in _transcendental(block.body)])
    if not calls:
        raise ClusterError("no transcendental function to compute once per thread")
    if len({str(c.ty) for c in calls}) != 1:
        raise ClusterError(f"its transcendental functions return {sorted({str(c.ty) for c in calls})}: one type expected")
    if any(find_all(c, tirx.Let) or any(uses(c, var) for var, _ in lets) for c in calls):
        raise ClusterError("a transcendental call depends on a variable it binds itself")
    params = [p for p in sch.mod["main"].params if hasattr(p.ty, "shape")]
    loads = [load for c in calls for load in find_all(c, tvm.ir.TensorLoad)]
    if not all(any(load.source.same_as(p) for p in params) for load in loads):
        raise ClusterError("a transcendental call reads a buffer the function defines: it cannot be computed first")
    if any(load.source.same_as(w.source) for load in loads for w in block.writes):
        raise ClusterError("a transcendental call reads what the block writes: it cannot be computed first")
    _check_in_bounds(loads, block)
    eligible = [n for n, iv in enumerate(block.iter_vars[:-1])
                if isinstance(iv.dom.extent, tirx.IntImm) and 1 < int(iv.dom.extent) <= MAX_IN_THREAD
                and not any(uses(c, iv.var) for c in calls)]
    if not eligible:
        raise ClusterError("every axis but the innermost is used by its transcendental functions, or longer than "
                           f"{MAX_IN_THREAD}")
    return sch.mod["main"], block, max(eligible, key=lambda n: int(block.iter_vars[n].dom.extent)), calls


def _check_in_bounds(loads: list, block: SBlock) -> None:
    """ClusterError unless every index of ``loads`` is provably inside its buffer over the
    block's whole domain: computed first, the calls run outside the conditions that guarded
    them."""
    analyzer = block_analyzer(block)
    for load in loads:
        for index, extent in zip(load.indices, load.source.ty.shape):
            if not (analyzer.can_prove(index >= 0) and analyzer.can_prove(index < extent)):
                raise ClusterError(f"{load} may read outside {load.source.name} where its block's conditions do not "
                                   "hold: it cannot be computed first")


def find_per_thread_math(func: tirx.PrimFunc) -> PerThreadMath:
    """What :func:`per_thread_math` computes once per thread in ``func`` (see the module
    docstring); ClusterError where it does not apply."""
    _, block, axis, calls = _analysis(func)
    return _found(block, axis, calls)


def _found(block: SBlock, axis: int, calls: list) -> PerThreadMath:
    points = 1
    for n, iv in enumerate(block.iter_vars):
        if n != axis:
            points = points * (int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else iv.dom.extent)
    return PerThreadMath(block.name_hint, axis, int(block.iter_vars[axis].dom.extent), len(calls), points,
                         branch_lanes(block))


def _with_regions(block: SBlock, buffers: list) -> SBlock:
    reads, writes = get_sblock_read_write_region(block, {b: b for b in buffers})
    return SBlock(block.iter_vars, reads, writes, block.name_hint, block.body, block.init, block.alloc_buffers,
                  block.match_buffers, block.annotations)


def per_thread_math(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its output block's distinct transcendental calls computed first, by a block
    over its other axes, into a buffer it reads (see the module docstring)."""
    return _rewritten(func)[0]


def _rewritten(func: tirx.PrimFunc) -> tuple[tirx.PrimFunc, PerThreadMath]:
    """:func:`per_thread_math`'s function and what it computes once per thread."""
    func, block, axis, calls = _analysis(func)
    lets = _lets(block)
    if not isinstance(func.body, SBlockRealize):
        raise ClusterError("per-thread math takes a function of one root block")
    others = [iv for i, iv in enumerate(block.iter_vars) if i != axis]
    dtype = str(calls[0].ty)
    hoisted = [tirx.decl_buffer([iv.dom.extent for iv in others], dtype, f"{HOISTED}_{n}") for n in range(len(calls))]
    buffers = [p for p in func.params if hasattr(p.ty, "shape")] + hoisted

    fresh = [tirx.Var(f"{iv.var.name}_t", iv.var.ty) for iv in others]
    renamed = list(zip([iv.var for iv in others], fresh))
    producer = SBlock([tirx.IterVar(iv.dom, v, iv.iter_type) for iv, v in zip(others, fresh)], [], [], HOISTED,
                      seq([tirx.BufferStore(b, substitute(c, renamed), fresh) for b, c in zip(hoisted, calls)]))
    producer = _with_regions(producer, buffers)

    def replace(call):
        inlined = _inline_lets(call, lets) if getattr(call.op, "name", None) in TRANSCENDENTAL else None
        index = next((n for n, c in enumerate(calls) if inlined is not None and tvm_ffi.structural_equal(inlined, c)),
                     None)
        if index is None:
            return call
        return tirx.BufferLoad(hoisted[index], [iv.var for iv in others])

    def drop_unused(let):
        return let if uses(let.body, let.var) else let.body

    body = tvm_ffi.structural_map(block.body, [(tvm.ir.Call, replace)], order="pre")
    found = _found(block, axis, calls)
    if found.lanes > 1:  # vectorized: its conditions in the forms kept one condition a vector
        body = vectorized_branches(body)
    consumer = SBlock(block.iter_vars, [], [], block.name_hint, tvm_ffi.structural_map(body, [(tirx.Let, drop_unused)]),
                      block.init, block.alloc_buffers, block.match_buffers, block.annotations)
    consumer = _with_regions(consumer, buffers)

    loop_vars = [tirx.Var(f"{iv.var.name}_l", iv.var.ty) for iv in others]
    nest = SBlockRealize(loop_vars, tirx.IntImm("bool", 1), producer)
    for iv, var in reversed(list(zip(others, loop_vars))):
        nest = tirx.For(var, iv.dom.min, iv.dom.extent, tirx.ForKind.SERIAL, nest)
    root = func.body.block
    body = tirx.SeqStmt([nest, tvm_ffi.structural_map(root.body, [(SBlock, lambda b: consumer if b.same_as(block)
                                                                    else b)], order="pre")])
    new_root = SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, body, root.init,
                      [*root.alloc_buffers, *hoisted], root.match_buffers, root.annotations)
    return func.with_body(SBlockRealize(func.body.iter_values, func.body.predicate, new_root)), found


def schedule_per_thread_math(func: tirx.PrimFunc, config: PerThreadMathConfig) -> s_tir.Schedule:
    """:func:`per_thread_math`'s rewrite of ``func``, scheduled: a thread per point of the
    other axes (a vector of the innermost, where it moves in vectors) and part of the in-thread
    axis, the hoisted calls in its registers, its part of the axis unrolled inside it."""
    rewritten, found = _rewritten(func)
    sch = s_tir.Schedule(rewritten)
    consumer, producer = sch.get_sblock(found.block), sch.get_sblock(HOISTED)
    if found.extent % config.parts:
        raise ClusterError(f"{config.parts} parts do not divide the in-thread axis of {found.extent}")
    loops = sch.get_loops(consumer)
    part, axis = sch.split(loops[found.axis], [config.parts, None])
    *outer, inner = [lp for i, lp in enumerate(loops) if i != found.axis]
    lane = None
    if found.lanes > 1:
        inner, lane = sch.split(inner, [None, found.lanes])
    sch.reorder(*outer, part, inner, axis, *([lane] if lane is not None else []))
    # the innermost other axis (contiguous) across neighbouring threads
    bx, tx = sch.split(sch.fuse(*outer, part, inner), [None, config.threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.compute_at(producer, tx)
    for n in range(found.calls):
        sch.set_scope(producer, n, "local")
    sch.unroll(axis)
    if lane is not None:
        sch.vectorize(lane)
    return sch
