"""Attention that reads q, k and v in place from the tensors they were cut from.

GPT-2, ViT, Falcon, Phi and many others project q, k and v in one GEMM and cut its output apart
(``qkv.split(C, dim=-1)``, ``qkv.reshape(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)``), and
grouped-query models repeat each K/V head for its query heads (``repeat_kv``: ``expand`` then
``reshape``); Relax runs each cut (``split``, ``strided_slice``, ``squeeze``, ``permute_dims``,
``reshape``, ``broadcast_to``, ``repeat``) as a copy kernel before the attention.
:data:`PackedAttentionOperands` rewrites ``R.nn.attention`` (with or without a bias) whose
operands are such cuts of a tensor: the tensor is reshaped (a view, no copy) to ``[B, S, heads,
D]`` or ``[B, heads, S, D]`` and the attention reads operand head ``h`` as head ``offset + h //
group`` of it, so the attention kernel's tensor maps copy the tiles straight from the
projection's output, each K/V head once for its group
(:class:`tvm_dsm.kernels.attention_pattern.HeadAxis` ``offset`` and ``divisor``).

Which element an operand's ``[b, s, h, d]`` is of the tensor is composed symbolically through
the cuts and proved equal to such a head of such a view by TVM's arithmetic analyzer (over the
operand's index ranges); an operand is rewritten only where that proof holds, and left as it is
otherwise (other cuts, symbolic shapes).

Grouped-query attention written as the operator documents it, k and v of fewer heads than q
(``nn.op.scaled_dot_product_attention`` with ``num_heads_kv``, torch's importer of
``enable_gqa``): query head ``h`` reads K/V head ``h // (H / H_kv)``. TVM's legalization
reshapes k and v as if they held ``H`` heads, reading past each batch's heads into the next
batch's (wrong values at every batch size, and with a symbolic batch an index the attention
family cannot read), so such an attention (with or without a bias, any shapes) is rewritten here
too, k and v read per query head through that division: one function the attention family takes,
each K/V head's tiles read for its group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.sym import Analyzer
# TVM's own legalization of R.nn.attention (q, k, v, bias, scale, causal_mask -> te.Tensor), so
# that the rewritten attention computes exactly what the operator does
from tvm.relax.transform.legalize_ops.nn import _te_attention

from .ir import substitute
from .relax_matmuls import constant_ints, is_op_call, rewrite_functions
from .relax_precision import ATTENTIONS

def _static(shape) -> tuple[int, ...] | None:
    """A shape's constant extents, or None."""
    extents = constant_ints(shape.values) if getattr(shape, "values", None) is not None else None
    return None if extents is None else tuple(extents)


def _ints(expr) -> list[int] | None:
    """A tuple argument of constant integers (a strided slice's axes, begins, ends, strides), or None."""
    fields = getattr(expr, "fields", None)
    return None if fields is None else constant_ints(fields)


def _unravel(flat, shape: tuple[int, ...]) -> list:
    """Row-major indices of element ``flat`` of a tensor of ``shape``."""
    out = []
    for n in range(len(shape)):
        inner = math.prod(shape[n + 1:])
        out.append(tvm.tirx.floormod(tvm.tirx.floordiv(flat, inner), shape[n]) if n else tvm.tirx.floordiv(flat, inner))
    return out


def _ravel(indices: list, shape: tuple[int, ...]):
    flat = tvm.tirx.const(0, "int64")
    for index, extent in zip(indices, shape):
        flat = flat * extent + index
    return flat


def _input_indices(call, out: list, in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list | None:
    """The input element a cut ``call`` (of :data:`_CUTS`) reads for output element ``out``, or
    None where its form is not one read here."""
    if is_op_call(call, "relax.permute_dims"):
        axes = list(range(len(out)))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
        at = [None] * len(out)
        for j, a in enumerate(axes):
            at[a] = out[j]
        return at
    if is_op_call(call, "relax.strided_slice"):
        axes, begin, end = (_ints(call.args[n]) for n in (1, 2, 3))
        strides = _ints(call.args[4]) if len(call.args) > 4 else [1] * len(axes or [])
        if axes is None or begin is None or end is None or strides is None:
            return None
        at = list(out)
        for a, b, st in zip(axes, begin, strides):
            a = a % len(out)
            if st <= 0 or not 0 <= b < in_shape[a]:  # forward, in-bounds slices only
                return None
            at[a] = b + out[a] * st
        return at
    if is_op_call(call, "relax.broadcast_to"):
        lead = len(out_shape) - len(in_shape)
        return [tvm.tirx.const(0, "int64") if n == 1 and out_shape[lead + a] != 1 else out[lead + a]
                for a, n in enumerate(in_shape)]
    if is_op_call(call, "relax.repeat"):
        if call.attrs.axis is None:
            return None
        axis = int(call.attrs.axis) % len(out)
        return [tvm.tirx.floordiv(i, int(call.attrs.repeats)) if n == axis else i for n, i in enumerate(out)]
    return _unravel(_ravel(out, out_shape), in_shape)  # reshape, squeeze, expand_dims: row-major


#: Relax operators that cut, rearrange or repeat one tensor without computing (``relax.split``
#: is read through its ``TupleGetItem``).
_CUTS = ("relax.permute_dims", "relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.strided_slice",
         "relax.broadcast_to", "relax.repeat")


def _split_offset(split: relax.Call, index: int, in_shape: tuple[int, ...]) -> tuple[int, int]:
    """(axis, first element along it) of part ``index`` of ``split``: ``n`` sections are
    ``ceil(L / n)`` long (the last shorter), or the parts start at the given indices."""
    axis = int(split.attrs.axis) % len(in_shape)
    sections = split.attrs.indices_or_sections
    if isinstance(sections, tvm.tirx.IntImm):
        return axis, index * -(-in_shape[axis] // int(sections))
    return axis, [0, *(int(i) for i in sections)][index]


@dataclass(frozen=True)
class _Operand:
    """Where an attention operand's elements sit in the tensor its cuts start from: ``source``
    read as ``[B, S, heads, D]`` (``heads_first``: ``[B, heads, S, D]``), the operand's head ``h``
    its head ``offset + h // group`` (``group`` > 1: grouped-query heads repeated for each query
    head, as ``repeat_kv`` writes them)."""

    source: relax.Expr
    heads: int
    offset: int
    group: int = 1
    heads_first: bool = False

    def view_shape(self, b: int, s: int, d: int) -> tuple[int, ...]:
        return (b, self.heads, s, d) if self.heads_first else (b, s, self.heads, d)

    def read(self, tensor: te.Tensor, shape: tuple[int, ...]) -> te.Tensor:
        """The operand (``shape``: ``[B, S, H, D]``) read in place from ``tensor``, the source's view."""
        def at(b, s, h, d):
            head = self.offset + (h // self.group if self.group > 1 else h)
            return tensor[b, head, s, d] if self.heads_first else tensor[b, s, head, d]
        return te.compute(shape, at, name="packed_heads")


def _sized(shape) -> tuple[int, ...] | None:
    """``shape`` as constant extents, none of them 0, or None."""
    extents = _static(shape)
    return extents if extents is not None and 0 not in extents else None


def _step_back(binding_of, value: relax.Var, at: list) -> tuple[relax.Expr, list] | None:
    """The tensor cut ``value`` is bound to reads, and the element of it that element ``at`` of
    ``value`` is; None where ``value`` is not a cut of one tensor."""
    bound = binding_of(value)
    if isinstance(bound, relax.Var):  # another name for it (a dataflow block's output)
        return bound, at
    if isinstance(bound, relax.TupleGetItem) and isinstance(bound.tuple_value, relax.Var):
        split = binding_of(bound.tuple_value)
        in_shape = _sized(split.args[0].ty.shape) if is_op_call(split, "relax.split") else None
        if in_shape is None:
            return None
        axis, first = _split_offset(split, bound.index, in_shape)
        return split.args[0], [i + first if n == axis else i for n, i in enumerate(at)]
    if not any(is_op_call(bound, op) for op in _CUTS):
        return None
    in_shape, out_shape = _sized(bound.args[0].ty.shape), _sized(value.ty.shape)
    read = _input_indices(bound, at, in_shape, out_shape) if in_shape and out_shape else None
    return None if read is None else (bound.args[0], read)


def _as_heads(source: relax.Expr, at: list, shape: tuple[int, ...], indices: list,
              analyzer: Analyzer) -> _Operand | None:
    """The operand (``shape``, element ``indices`` of it being element ``at`` of ``source``) as
    heads of a view of ``source``, where the analyzer proves it one."""
    source_shape = _sized(getattr(source.ty, "shape", None))
    if source_shape is None:
        return None
    b, s, h, d = shape
    size = math.prod(source_shape)
    heads = size // (b * s * d)
    if heads * b * s * d != size:
        return None
    flat = analyzer.simplify(_ravel(at, source_shape))

    def element(*values) -> int | None:  # the source element of operand element ``values``
        e = analyzer.simplify(substitute(flat, [(v, tvm.tirx.const(x, "int64")) for v, x in zip(indices, values)]))
        return int(e.value) if isinstance(e, tvm.tirx.IntImm) else None

    first = element(0, 0, 0, 0)
    if first is None:
        return None
    group = next((g for g in range(1, h) if element(0, 0, g, 0) != first), h)  # query heads reading one
    if h % group:
        return None
    bi, si, hi, di = indices
    for heads_first, stride in ((False, d), (True, s * d)):
        offset = first // stride
        if first % stride or offset + h // group > heads:
            continue
        head = offset + tvm.tirx.floordiv(hi, group)
        expected = ((bi * heads + head) * s + si if heads_first else (bi * s + si) * heads + head) * d + di
        if analyzer.can_prove_equal(flat, expected):
            return _Operand(source, heads, offset, group, heads_first)
    return None


def _packed(binding_of, operand: relax.Expr, in_dataflow: bool) -> _Operand | None:
    """``operand`` (``[B, S, H, D]``) as heads of the furthest tensor its cuts start from that is
    in scope where the attention is (``in_dataflow``: inside a dataflow block), or None."""
    shape = _sized(operand.ty.shape)
    if shape is None or len(shape) != 4:
        return None
    indices = [tvm.tirx.Var(n, "int64") for n in "bshd"]
    analyzer = Analyzer()
    for var, extent in zip(indices, shape):
        analyzer.bind(var, tvm.ir.Range(tvm.tirx.const(0, "int64"), tvm.tirx.const(extent, "int64")))
    reached = []  # (tensor, element) of each tensor in scope the cuts read, nearest first
    at, value, past_block_output = list(indices), operand, False
    while isinstance(value, relax.Var) and (step := _step_back(binding_of, value, at)) is not None:
        past_block_output = past_block_output or not isinstance(value, relax.DataflowVar)
        value, at = step
        # a dataflow block's variables are out of scope outside it, and in later blocks
        if not (isinstance(value, relax.DataflowVar) and (past_block_output or not in_dataflow)):
            reached.append(step)
    return next((found for source, at in reversed(reached)
                 if (found := _as_heads(source, at, shape, indices, analyzer)) is not None), None)


def _scaled(binding_of, operand: relax.Expr) -> tuple[relax.Expr, float] | None:
    """(``x``, ``c``) where ``operand`` is bound to ``x * c``, ``c`` a scalar constant (the
    query :data:`~tvm_dsm.relax_precision.AttentionScaleOnQuery` scales); else None."""
    bound = binding_of(operand) if isinstance(operand, relax.Var) else None
    if bound is None or not is_op_call(bound, "relax.multiply"):
        return None
    x, c = bound.args
    if not isinstance(c, tvm.ir.Constant) or c.value.numpy().size != 1:
        return None
    return x, float(c.value.numpy().reshape(()))


def _query_heads_per_kv_head(call: relax.Call) -> int:
    """How many query heads read each K/V head of the attention ``call`` (q, k, v ``[B, S, H,
    D]``): ``H / H_kv`` where k and v hold fewer heads that divide the query's, else 1."""
    heads = [constant_ints([t.ty.shape.values[2]]) if t.ty.shape is not None else None for t in call.args[:3]]
    if None in heads:
        return 1
    (query,), (key,), (value,) = heads
    return query // key if key == value and key < query and query % key == 0 else 1


def _per_query_head(tensor: te.Tensor, group: int) -> te.Tensor:
    """``tensor`` (``[B, S, H_kv, D]``) read as ``[B, S, H_kv * group, D]``, head ``h`` its head
    ``h // group``."""
    b, s, heads, d = tensor.shape
    return te.compute((b, s, heads * group, d), lambda i, t, h, c: tensor[i, t, h // group, c], name="grouped_heads")


@mutator
class _PackedRewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not any(is_op_call(call, op) for op in ATTENTIONS) or call.attrs.window_size is not None:
            return call
        group = _query_heads_per_kv_head(call)
        in_dataflow = any(isinstance(arg, relax.DataflowVar) for arg in call.args)
        operands, bias = call.args[:3], call.args[3:]
        found = [_packed(self.lookup_binding, arg, in_dataflow) for arg in operands]
        factor = None
        scaled = _scaled(self.lookup_binding, operands[0]) if found[0] is None else None
        if scaled is not None and (query := _packed(self.lookup_binding, scaled[0], in_dataflow)) is not None:
            found[0], factor = query, scaled[1]
        if not any(found) and group == 1:
            return call
        # q, k and v stay three arguments even where one view serves them all: TVM's
        # RewriteDataflowReshape takes any call of one argument for a reshape, and would fail on
        # the scheduled attention kernel.
        views: list[tuple[relax.Expr, tuple, relax.Expr]] = []  # (source, view shape, view)
        args = []
        shapes = [_static(arg.ty.shape) for arg in operands]
        for arg, packed, operand_shape in zip(operands, found, shapes):
            if packed is None:  # its shape may be symbolic
                args.append(arg)
                continue
            b, s, _, d = operand_shape
            shape = packed.view_shape(b, s, d)
            view = next((v for source, view_shape, v in views if source.same_as(packed.source) and view_shape == shape),
                        None)
            if view is None:
                view = self.builder_.emit(relax.op.reshape(packed.source, shape))
                views.append((packed.source, shape, view))
            args.append(view)
        scale, causal = call.attrs.scale, call.attrs.causal_mask

        def attention(*tensors):
            q, k, v = (t if packed is None else packed.read(t, shape)
                       for t, packed, shape in zip(tensors, found, shapes))
            if factor is not None:
                q = te.compute(q.shape, lambda *i: q(*i) * tvm.tirx.const(factor, q.dtype), name="scaled_query")
            if group > 1:
                k, v = _per_query_head(k, group), _per_query_head(v, group)
            return _te_attention(q, k, v, tensors[3] if bias else None, scale, causal)

        return self.builder_.call_te(attention, *args, *bias, primfunc_name_hint="attention")


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.PackedAttentionOperands")
def PackedAttentionOperands(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's attentions read their operands in place from the packed projection
    they were cut from, and grouped-query attentions their K/V heads per query head (see the
    module docstring)."""
    return rewrite_functions(mod, _PackedRewriter(mod))
