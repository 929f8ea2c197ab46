"""Elementwise and injective functions (casts, activations, a split's halves multiplied, gathers)
streamed at HBM speed: every block inlined into the ones that write the outputs, each of those a
grid of CTAs whose threads move 16 bytes per access.

dlight's fallback gives each thread one element: a 2-byte load per input per thread, so an SM
holds too few bytes in flight to stream from HBM (the 1B Llama's ``split``/``silu``/``multiply``
ran at 3.4x its floor in prefill). Here the innermost loop is split into vectors of
``16 / element bytes`` lanes where every access moves along it contiguously: an index ``x + c``
on the last axis (``c`` a multiple of the lanes, a constant or an expression of the other
iterators such as a head's columns ``h // g * D``), ``x`` on no other axis, every accessed
buffer contiguous with rows a multiple of the lanes, and every condition on ``x`` alike for the
lanes of a vector (a pad's ``x < 40`` at 8 lanes, rotate-half's ``x < D / 2``: the vector is
loaded or filled whole) and written as an ``if_then_else`` of ``x`` compared with constants (the
form TVM's vectorizer keeps one condition a vector). Each thread takes ``vectors_per_thread``
vectors a CTA's width apart, so a warp's accesses stay coalesced. A block whose accesses do not
move that way (a transpose) keeps one element per vector; one whose vectors need such a
condition and that computes transcendental functions is left to
:mod:`tvm_dsm.rules.per_thread_math` (rotary embedding: its angles computed once per thread
rather than once per head).

The function is first simplified within its iterators' ranges and its branches' conditions
(:func:`simplified`): a reshape's and a transpose's modular indices reduce to ``x + c``, which
is how a rotary embedding written as torch writes it moves in vectors.

A condition that differs between the lanes of a vector (``leaky_relu``'s ``x > 0`` as a Select,
``masked_fill``'s bool mask, a pad that ends inside a vector) would be a vector of bools, which
TVM's CUDA code cannot declare: such a block is staged (:func:`staged_lanes`). Its store, and
each operand read at the element it writes with rows of the block's width, move in 16-byte
vectors through registers, and each lane's value is computed alone between them; bool
operands are read an element at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import SBlock
from tvm.sym import Analyzer
from tvm.s_tir.schedule.schedule import ScheduleError

from ..errors import ClusterError
from ..ir import IF_THEN_ELSE, block_analyzer, find_all, is_reduction, substitute, uses, with_block_body
from ..transform.buffers import element_bytes

#: Bytes a thread moves per access.
VECTOR_BYTES = 16
#: Functions whose evaluation costs tens of instructions.
TRANSCENDENTAL = frozenset(f"tirx.{name}" for name in (
    "sin", "cos", "tan", "pow", "exp", "exp2", "log", "log2", "tanh", "erf", "sigmoid"))


@dataclass(frozen=True)
class ElementwiseConfig:
    """Threads per CTA and vectors per thread (a CTA's width apart)."""

    threads: int = 256
    vectors_per_thread: int = 1

    def explain(self) -> str:
        return f"elementwise: {self.threads} threads a CTA, {self.vectors_per_thread} vector(s) of 16 B a thread"


def _buffer(access):
    return access.buffer if isinstance(access, tirx.BufferStore) else access.source


def output_blocks(sch: s_tir.Schedule) -> list:
    """The blocks left after inlining every other one into its consumers: those writing the
    outputs (ClusterError where a block reduces, or one cannot be inlined)."""
    func = sch.mod["main"]
    params = [p for p in func.params if hasattr(p.ty, "shape")]
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        if is_reduction(block):
            raise ClusterError(f"{block.name_hint} reduces: not an elementwise function")
        if any(w.source.same_as(p) for w in block.writes for p in params):
            continue
        try:
            sch.compute_inline(rv)
        except ScheduleError as err:
            raise ClusterError(f"{block.name_hint} cannot be inlined into its consumers") from err
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if not blocks:
        raise ClusterError("no block writes an output")
    return blocks


def vector_lanes(block: tirx.SBlock, uniform_conditions: bool = False, staged: bool = False) -> int:
    """The elements a thread moves per access of ``block``: ``VECTOR_BYTES`` of its widest
    element where every access moves contiguously along its innermost iterator (see the module
    docstring), else 1. ``uniform_conditions``: a condition on that iterator is allowed where it
    holds alike for every lane of a vector (rotate-half's ``d < D / 2``), and so are stores in
    branches (rotary embedding's query, key and value heads). ``staged``: the lanes of
    :func:`staged_lanes`, whose values are computed a lane at a time (any condition allowed, bool
    operands read an element at a time)."""
    if not block.iter_vars:
        return 1
    stores = find_all(block.body, tirx.BufferStore)
    if not stores or (not uniform_conditions and not isinstance(block.body, tirx.BufferStore)):
        return 1
    x, extent = block.iter_vars[-1].var, block.iter_vars[-1].dom.extent
    analyzer = block_analyzer(block)  # a reshape's `(i * n + x // n) % m` reads `i * n` within the ranges
    accesses = [(a, [analyzer.simplify(i) for i in a.indices])
                for a in [*stores, *find_all(block.body, tvm.ir.TensorLoad)]]
    if not all(len(indices) for _, indices in accesses) or any(
            uses(i, x) for _, indices in accesses for i in indices[:-1]):
        return 1
    if not all(uses(indices[-1], x) for _, indices in accesses[:len(stores)]):
        return 1
    moving = [(a, indices) for a, indices in accesses if uses(indices[-1], x)]  # the rest: one element for all lanes
    if any(_is_bool(a) for a, _ in moving if not staged or isinstance(a, tirx.BufferStore)):
        return 1  # TVM's CUDA codegen stores two bools as a ushort2: 4 bytes, 2-byte aligned (misaligned address)
    moving = [(a, indices) for a, indices in moving if not _is_bool(a)]  # staged: a bool an element at a time
    lanes = VECTOR_BYTES // max([element_bytes(_buffer(a)) for a, _ in moving]
                                + ([] if staged else [element_bytes(v) for v in broadcast_values(block.body, x)]))
    if not isinstance(extent, tirx.IntImm) or int(extent) % lanes:
        return 1
    for access, indices in moving:
        buffer = _buffer(access)
        row = buffer.ty.shape[-1]
        if list(buffer.ty.strides) or not isinstance(row, tirx.IntImm) or int(row) % lanes:
            return 1  # a row of another length would start vectors off their 16-byte alignment
        offset = analyzer.simplify(indices[-1] - x)  # a constant, or a head's columns (h // g * D)
        if uses(offset, x) or not analyzer.can_prove(tirx.floormod(offset, lanes) == 0):
            return 1
    if staged:
        return lanes
    conditions = _value_conditions(block.body) + [s.condition for s in find_all(block.body, tirx.IfThenElse)]
    varying = [c for c in conditions if uses(c, x)]
    if not varying:
        return lanes
    if not uniform_conditions:
        return 1
    return lanes if all(_uniform(c, x, lanes, analyzer) for c in varying) else 1


_SIGMOID = tvm.ir.Op.get("tirx.sigmoid")


def broadcast_values(body, x: tirx.Var) -> list:
    """The floating-point values a store in ``body`` computes with that are alike for every lane
    of ``x`` (the largest parts of its value without ``x``, outside loads' indices and math
    calls' arguments, which each lane computes apart), whose vector TVM writes as a broadcast. A broadcast of more than
    16 bytes (fp32 by 8 lanes: rotate-half's ``-1.0`` times an fp32 cast) comes out of TVM's CUDA
    code as an invalid ``make_ulonglong4`` of 8 values, so they bound the lanes as what the block
    moves does."""
    found: list = []

    def visit(expr) -> None:
        if isinstance(expr, tirx.Let):  # its variable read as its value
            visit(substitute(expr.body, [(expr.var, expr.value)]))
        elif isinstance(expr, tvm.ir.Call) and expr.op.same_as(IF_THEN_ELSE):
            for arg in expr.args:
                visit(arg)
        elif isinstance(expr, tvm.ir.Call) and expr.op.same_as(_SIGMOID):
            # CUDA has no sigmoid: TVM writes it 1 / (1 + exp(-x)) after vectorizing, its ones a
            # broadcast of the call's type
            found.append(tirx.const(1, str(expr.ty.dtype)))
        elif isinstance(expr, (tvm.ir.TensorLoad, tvm.ir.Call)) or not uses(expr, x):
            if not uses(expr, x) and str(expr.ty.dtype).startswith(("float", "bfloat")):
                found.append(expr)
        else:
            for field in _OPERANDS.get(type(expr), ()):
                visit(getattr(expr, field))

    for store in find_all(body, tirx.BufferStore):
        visit(store.value)
    return found


#: The operand fields of the expressions a store's value is made of.
_OPERANDS = {**{op: ("a", "b") for op in (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Mod, tirx.FloorDiv,
                                          tirx.FloorMod, tirx.Min, tirx.Max, tirx.EQ, tirx.NE, tirx.LT, tirx.LE,
                                          tirx.GT, tirx.GE, tirx.And, tirx.Or)},
             tirx.Not: ("a",), tirx.Cast: ("value",), tirx.Select: ("condition", "true_value", "false_value")}


def _uniform(condition, x: tirx.Var, lanes: int, analyzer: Analyzer) -> bool:
    """Whether ``condition`` is the same for the ``lanes`` values of ``x`` in each aligned vector:
    with ``x = lanes * vector + lane``, it or its negation simplifies to an expression without
    ``lane``."""
    vector, lane = tirx.Var("vector", x.ty), tirx.Var("lane", x.ty)
    within = Analyzer()
    within.bind(lane, tvm.ir.Range(0, lanes))
    within.bind(vector, tvm.ir.Range(0, analyzer.const_int_bound(x).max_value // lanes + 1))
    split = substitute(condition, [(x, vector * lanes + lane)])
    return any(not uses(within.simplify(c), lane) for c in (split, tirx.Not(split)))


def transcendental_calls(expr) -> list:
    """The calls of :data:`TRANSCENDENTAL` functions in ``expr``."""
    return [c for c in find_all(expr, tvm.ir.Call) if getattr(c.op, "name", None) in TRANSCENDENTAL]


def block_lanes(block: tirx.SBlock) -> int:
    """The lanes the elementwise rule moves ``block``'s accesses in (see the module docstring):
    a single store, its conditions on ``x`` uniform over a vector and bounds of ``x``
    (:func:`_bounds`), unless the block computes transcendental functions."""
    lanes = vector_lanes(block)
    if lanes > 1 or not isinstance(block.body, tirx.BufferStore) or transcendental_calls(block.body):
        return lanes
    return branch_lanes(block)


def staged_lanes(block: tirx.SBlock) -> int:
    """The lanes of a block with one store whose conditions differ between the lanes of a vector
    (a Select on the values, ``leaky_relu``'s ``x > 0``; a mask's ``if_then_else``), which TVM's
    vectorizer would compute as a vector of bools that its CUDA code cannot declare: its store,
    and each load of :func:`staged_loads`, move 16-byte vectors through registers, and each lane
    is computed alone between them; 1 where the accesses do not move along the innermost
    iterator, or the block stores bools."""
    if not isinstance(block.body, tirx.BufferStore) or str(block.body.buffer.ty.dtype) == "bool":
        return 1
    return vector_lanes(block, staged=True)


def staged_loads(block: tirx.SBlock) -> list[str]:
    """The buffers a staged block (:func:`staged_lanes`) loads in vectors: read at one element,
    at its innermost iterator ``x`` itself on its last axis, with rows of ``x``'s extent (a
    vector never runs past a row, whatever the conditions that guard the load), and not bool."""
    x, extent = block.iter_vars[-1].var, block.iter_vars[-1].dom.extent
    by_buffer: dict[str, list] = {}
    for load in find_all(block.body, tvm.ir.TensorLoad):
        by_buffer.setdefault(load.source.name, []).append(load)
    return [name for name, loads in by_buffer.items()
            if all(tvm_ffi.structural_equal(load.indices, loads[0].indices) for load in loads)
            and not _is_bool(loads[0]) and loads[0].indices[-1].same_as(x)
            and not any(uses(i, x) for i in loads[0].indices[:-1])
            and tvm_ffi.structural_equal(loads[0].source.ty.shape[-1], extent)]


def _is_bool(access) -> bool:
    return str(_buffer(access).ty.dtype) == "bool"


def branch_lanes(block: tirx.SBlock) -> int:
    """:func:`vector_lanes` with ``uniform_conditions``, where every condition on ``block``'s
    innermost iterator ``x`` (an ``if_then_else``'s, a ``Select``'s) compares ``x`` alone with
    constants (:func:`_bounds`): written as :func:`vectorized_branches`, TVM's vectorizer keeps
    those one condition a vector; else 1."""
    x = block.iter_vars[-1].var
    if not all(_bounds(c, x) for c in _value_conditions(block.body) if uses(c, x)):
        return 1
    return vector_lanes(block, uniform_conditions=True)


def _value_conditions(body) -> list:
    """The conditions of ``body``'s ``if_then_else`` calls and Selects."""
    conditions = [c.args[0] for c in find_all(body, tvm.ir.Call) if c.op.same_as(IF_THEN_ELSE)]
    return conditions + [s.condition for s in find_all(body, tirx.Select)]


def vectorized_branches(body: tirx.Stmt) -> tirx.Stmt:
    """``body`` with its conditions in the forms TVM's vectorizer keeps one condition a vector
    where they bound the vector's axis (:func:`branch_lanes`): each Select an ``if_then_else`` of
    the same operands (neither side has an effect, so the value is the same; vectorized, a
    Select's condition stays a vector of bools, ``boolx8``, which TVM's CUDA code cannot
    declare), and each ``if_then_else(c <= x, a, b)`` of an integer at least a constant (the
    canonical form of ``x >= c``: a concatenation's second half, ``rotate_half``'s
    ``d >= D / 2``) written ``if_then_else(x < c, b, a)`` (``c <= x`` stays a vector of bools,
    and the loop is left scalar)."""

    def swapped(call):
        if call.op.same_as(IF_THEN_ELSE):
            cond, a, b = call.args
            if isinstance(cond, tirx.LE) and isinstance(cond.a, tirx.IntImm):
                return tirx.if_then_else(tirx.LT(cond.b, cond.a), b, a)
            if isinstance(cond, tirx.GE) and isinstance(cond.b, tirx.IntImm):
                return tirx.if_then_else(tirx.LT(cond.a, cond.b), b, a)
        return call

    branches = tvm_ffi.structural_map(body, [(tirx.Select, lambda s: tirx.if_then_else(s.condition, s.true_value,
                                                                                          s.false_value))])
    return tvm_ffi.structural_map(branches, [(tvm.ir.Call, swapped)])


def _bounds(condition, x: tirx.Var) -> bool:
    """Whether ``condition`` compares ``x`` alone with constants, joined by ``and`` (``0 <= x and
    x < 40``: a pad) with each other and with conditions without ``x`` (``nn.llm``'s rotary
    ``apply_rope > 0 and d < 64``): the forms TVM's vectorizer reads as one condition a vector
    (others stay a vector of bools, ``boolx8``, which its CUDA code cannot declare: a slice
    assignment's clamped, cast comparison)."""
    if isinstance(condition, tirx.And):
        return _bounds(condition.a, x) and _bounds(condition.b, x)
    if not uses(condition, x):
        return True
    return isinstance(condition, (tirx.LT, tirx.LE, tirx.GT, tirx.GE)) and any(
        a.same_as(x) and isinstance(b, tirx.IntImm) for a, b in ((condition.a, condition.b), (condition.b, condition.a)))


def lanes_and_staging(block: tirx.SBlock) -> tuple[int, bool]:
    """The lanes the elementwise rule moves ``block`` in: its :func:`block_lanes`, else its
    :func:`staged_lanes` (staged: True)."""
    lanes = block_lanes(block)
    if lanes > 1:
        return lanes, False
    lanes = staged_lanes(block)
    return lanes, lanes > 1


def simplified(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its expressions simplified within their iterators' ranges and the
    conditions of the branches they sit in (s_tir's ``StmtSimplify``, then each
    ``if_then_else``'s operands under its condition and its negation: StmtSimplify keeps neither
    where the blocks were merged first, as the Relax pipeline does): a rotary embedding
    written as torch does (a reshape, a transpose, ``rotate_half``'s slices and concatenation)
    reads ``q[(b * 128 + ((d // 64 + s) // 128 + h) // 16 ...) % 256, (... + d % 64 + 32) % 1024]``
    until then, and ``q[b * 128 + s, h * 64 + d + 32]`` under its ``d < 32`` branch after: its
    accesses move along ``d`` in vectors."""
    func = s_tir.transform.StmtSimplify()(tvm.IRModule({"main": func}))["main"]
    return func.with_body(tvm_ffi.structural_map(func.body, [(SBlock, _branches_simplified)]))


def _branches_simplified(block: SBlock) -> SBlock:
    """``block`` with each ``if_then_else``'s operands simplified within the block's iterator
    ranges under its condition (the first) and the condition's negation (the second)."""
    if not block.iter_vars:
        return block
    analyzer = block_analyzer(block)

    def branch(call):
        if not call.op.same_as(IF_THEN_ELSE):
            return call
        condition, then, otherwise = call.args
        with analyzer.constraint_scope(analyzer.simplify(condition)):
            then = analyzer.simplify(then)
        with analyzer.constraint_scope(analyzer.simplify(tirx.Not(condition))):
            otherwise = analyzer.simplify(otherwise)
        return tirx.if_then_else(condition, then, otherwise)

    return with_block_body(block, tvm_ffi.structural_map(block.body, [(tvm.ir.Call, branch)]))


def find_elementwise(func: tirx.PrimFunc) -> tuple[int, list]:
    """The fewest vector lanes among an elementwise function's output blocks (the function
    :func:`simplified`) and the buffers they write; ClusterError where it is not one."""
    sch = s_tir.Schedule(simplified(func))
    blocks = [sch.get(b) for b in output_blocks(sch)]
    return min(lanes_and_staging(b)[0] for b in blocks), [w.source for b in blocks for w in b.writes]


def schedule_elementwise(func: tirx.PrimFunc, config: ElementwiseConfig) -> s_tir.Schedule:
    """``func`` (:func:`simplified`) with each output block a grid of ``config.threads``-thread
    CTAs, each thread ``config.vectors_per_thread`` vectors (see the module docstring)."""
    func = simplified(func)
    sch = s_tir.Schedule(func)
    if any(block_lanes(sch.get(rv)) > 1 and _value_conditions(sch.get(rv).body) for rv in output_blocks(sch)):
        sch = s_tir.Schedule(func.with_body(vectorized_branches(func.body)))
    for rv in output_blocks(sch):
        lanes, staged = lanes_and_staging(sch.get(rv))
        loops = sch.get_loops(rv)
        if not loops:
            raise ClusterError(f"{sch.get(rv).name_hint} writes a scalar: nothing to spread over threads")
        vector = None
        if lanes > 1:
            inner, vector = sch.split(loops[-1], [None, lanes])
            loops = [*loops[:-1], inner]
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        bx, k, tx = sch.split(fused, [None, config.vectors_per_thread, config.threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.unroll(k)
        if staged:
            _stage_in_registers(sch, rv, tx, vector)
        elif vector is not None:
            sch.vectorize(vector)
    return sch


def _stage_in_registers(sch: s_tir.Schedule, rv, at, lanes) -> None:
    """``rv``'s :func:`staged_loads` and its store moved as vectors through registers under the
    thread's loop ``at`` (one vector each), its value computed a lane at a time (``lanes``
    unrolled)."""
    for name in staged_loads(sch.get(rv)):
        index = next(i for i, region in enumerate(sch.get(rv).reads) if region.source.name == name)
        cache = sch.cache_read(rv, index, "local")
        sch.compute_at(cache, at)
        sch.vectorize(sch.get_loops(cache)[-1])
    store = sch.cache_write(rv, 0, "local")
    sch.reverse_compute_at(store, at)
    sch.vectorize(sch.get_loops(store)[-1])
    sch.unroll(lanes)
