"""Attention that reads q, k and v in place from the tensors they were cut from.

GPT-2, ViT, Falcon, Phi and many others project q, k and v in one GEMM and cut its output apart
(``qkv.split(C, dim=-1)``, ``qkv.reshape(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)``), and
grouped-query models repeat each K/V head for its query heads (``repeat_kv``: ``expand`` then
``reshape``); Relax runs each cut (``split``, ``strided_slice``, ``squeeze``, ``permute_dims``,
``reshape``, ``broadcast_to``, ``repeat``) as a copy kernel before the attention.
:data:`PackedAttentionOperands` rewrites ``R.nn.attention`` whose operands are such cuts of a
tensor: the tensor is reshaped (a view, no copy) to ``[B, S, heads, D]`` or ``[B, heads, S, D]``
and the attention reads operand head ``h`` as head ``offset + h // group`` of it, so the attention
kernel's tensor maps copy the tiles straight from the projection's output, each K/V head once
for its group (:class:`tvm_dsm.kernels.attention_pattern.HeadAxis` ``offset`` and ``divisor``).

Which element an operand's ``[b, s, h, d]`` is of the tensor is worked out by running the cuts
on the tensor's flat element indices (numpy, every element: exact, not sampled); an operand is
rewritten only where that is such a head of such a view, and left as it is otherwise (other
cuts, symbolic shapes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.relax.transform.legalize_ops.nn import _te_attention  # the legalization of R.nn.attention itself

from .relax_matmuls import is_op_call, rewrite_functions

#: ``R.nn.attention``'s operator name.
_ATTENTION = "relax.nn.attention"


def _static(shape) -> tuple[int, ...] | None:
    values = getattr(shape, "values", None)
    if values is None or not all(isinstance(v, tvm.tirx.IntImm) for v in values):
        return None
    return tuple(int(v) for v in values)


#: Relax operators that cut, rearrange or repeat one tensor without computing (``relax.split``
#: is read through its ``TupleGetItem``).
_CUTS = ("relax.permute_dims", "relax.reshape", "relax.squeeze", "relax.expand_dims", "relax.strided_slice",
         "relax.broadcast_to", "relax.repeat")


def _cut(call: relax.Call, flat: np.ndarray) -> np.ndarray:
    """``call`` (one of :data:`_CUTS`) applied to ``flat``."""
    if is_op_call(call, "relax.permute_dims"):
        axes = call.attrs.axes
        return np.transpose(flat, None if axes is None else [int(a) for a in axes])
    if is_op_call(call, "relax.strided_slice"):
        index = [slice(None)] * flat.ndim
        axes, begin, end, strides = ([int(x.value) for x in call.args[n].fields] for n in range(1, 5))
        for a, b, e, s in zip(axes, begin, end, strides):
            index[a] = slice(b, e, s)
        return flat[tuple(index)]
    if is_op_call(call, "relax.broadcast_to"):
        return np.broadcast_to(flat, _static(call.ty.shape))
    if is_op_call(call, "relax.repeat"):
        return np.repeat(flat, int(call.attrs.repeats), axis=int(call.attrs.axis))
    return flat.reshape(_static(call.ty.shape))  # reshape, squeeze, expand_dims


def _split_part(split: relax.Call, index: int, flat: np.ndarray) -> np.ndarray:
    sections = split.attrs.indices_or_sections
    cuts = int(sections) if isinstance(sections, tvm.tirx.IntImm) else [int(i) for i in sections]
    return np.split(flat, cuts, axis=int(split.attrs.axis))[index]


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


def _packed(binding_of, operand: relax.Expr) -> _Operand | None:
    """``operand`` (``[B, S, H, D]``) as heads of the tensor its cuts start from, or None."""
    steps, value = [], operand
    while isinstance(value, relax.Var):
        bound = binding_of(value)
        if isinstance(bound, relax.TupleGetItem) and is_op_call(binding_of(bound.tuple_value), "relax.split"):
            split = binding_of(bound.tuple_value)
            steps.append(lambda flat, split=split, index=bound.index: _split_part(split, index, flat))
            value = split.args[0]
        elif any(is_op_call(bound, op) for op in _CUTS) and _static(bound.ty.shape) is not None:
            steps.append(lambda flat, call=bound: _cut(call, flat))
            value = bound.args[0]
        else:
            break
    shape, source_shape = _static(operand.ty.shape), _static(getattr(value.ty, "shape", None))
    if not steps or shape is None or source_shape is None:
        return None
    size = math.prod(source_shape)
    flat = np.arange(size, dtype=np.int64).reshape(source_shape)
    for step in reversed(steps):
        flat = step(flat)
    b, s, h, d = shape
    heads = size // (b * s * d)
    if flat.shape != shape or heads * b * s * d != size:
        return None
    group = int(np.sum(flat[0, 0, :, 0] == flat[0, 0, 0, 0]))  # query heads reading the first head
    first = int(flat[0, 0, 0, 0])
    bi, si, hi, di = np.indices(shape, dtype=np.int64)
    for heads_first, stride in ((False, d), (True, s * d)):
        offset = first // stride
        if h % group or first % stride or offset + h // group > heads:
            continue
        head = offset + hi // group
        expected = ((bi * heads + head) * s + si if heads_first else (bi * s + si) * heads + head) * d + di
        if np.array_equal(flat, expected):
            return _Operand(value, heads, offset, group, heads_first)
    return None


@mutator
class _PackedRewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not is_op_call(call, _ATTENTION) or call.attrs.window_size is not None:
            return call
        found = [_packed(self.lookup_binding, arg) for arg in call.args]
        if not any(found):
            return call
        # q, k and v stay three arguments, each its own tensor or a view of the one it was cut from
        # (one view a source and shape): a call of one argument is what RewriteDataflowReshape
        # tries as a reshape.
        views: list[tuple[relax.Expr, tuple, relax.Expr]] = []
        args = []
        for arg, packed in zip(call.args, found):
            if packed is None:
                args.append(arg)
                continue
            b, s, _, d = _static(arg.ty.shape)
            shape = packed.view_shape(b, s, d)
            view = next((v for source, at, v in views if source.same_as(packed.source) and at == shape), None)
            if view is None:
                view = self.builder_.emit(relax.op.reshape(packed.source, shape))
                views.append((packed.source, shape, view))
            args.append(view)
        shapes = [_static(arg.ty.shape) for arg in call.args]
        scale, causal = call.attrs.scale, call.attrs.causal_mask

        def attention(*tensors):
            q, k, v = (t if packed is None else packed.read(t, shape) for t, packed, shape in zip(tensors, found, shapes))
            return _te_attention(q, k, v, None, scale, causal)

        return self.builder_.call_te(attention, *args, primfunc_name_hint="attention")


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.PackedAttentionOperands")
def PackedAttentionOperands(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's attentions read their operands in place from the packed projection
    they were cut from (see the module docstring)."""
    return rewrite_functions(mod, _PackedRewriter(mod))
