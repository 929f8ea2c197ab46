"""Attention computed on zero-padded copies where its head dims' rows are off 32-byte sectors.

The attention kernel computes a head dim in whole 64-column panels (:data:`~tvm_dsm.kernels.attention.PADDED_DIMS`),
its TMA loads filling the columns past the head dim with zeros. Where a row of 16-bit elements
is not a multiple of 32 bytes (head dims 40, 56, 72, ...: Stable Diffusion 1.5's 40), every
other row starts mid-sector and each K/V tile, which every query tile reads again from L2, costs
more sectors and TMA requests than its bytes: on the H200, 2 x 8 heads x 4096 x 4096 ran 289 us
at head dim 40 against 154 us at 64 (48: 179), same configuration, same instructions
(``bench/results/archive/attention_sd_head_dims_s82.json``). :data:`PadAttentionHeadDims`
gives such an attention zero-padded copies of q, k and v at the kernel's head dim and slices
the output back: the scores and the output are the same values (zero columns add nothing to
``q . k``; V's zero columns give output columns that are cut off), the scale kept at the head
dim's own; the output's columns are cut by a function of their own (a slice Relax's fusion would
put into the attention's function, which the family would then not take). The copies cost one
pass over q, k and v and the output; they are made only where every key is read
by many query tiles (:data:`MIN_QUERIES` queries and :data:`MIN_KEYS` keys or more, static).
Through the pipeline, Stable Diffusion 1.5's self-attention at 64 x 64 latents went from 197.8
to 167.4 us (SDPA 170.1; the copies are element-wise kernels in 16-byte vectors), 299.5 before
the padding (``bench/results/archive/attention_spellings_vector_pads_*_s83.json``). q and k
are padded to their head dim's panels, v (and the output) to theirs where it differs.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .kernels.attention import padded_dim, takes_head_dim
from .relax_matmuls import SIXTEEN_BIT, add_opaque_function, constant_ints, is_op_call, rewrite_functions
from .relax_precision import ATTENTIONS

#: Bytes a row of a K/V tile must be a multiple of to start on a sector.
SECTOR = 32
#: Queries and keys from which the copies pay for themselves (Stable Diffusion 1.5's 64 x 64
#: latents: 4096 each; its cross-attention's 77 keys stay unpadded).
MIN_QUERIES = 1024
MIN_KEYS = 512


def _columns(shape: list[int], dim: int, dtype: str) -> tirx.PrimFunc:
    """The first ``dim`` columns of a ``shape`` tensor (the last axis)."""
    x = te.placeholder(shape, dtype, name="x")
    return te.create_prim_func([x, te.compute([*shape[:-1], dim], lambda *i: x(*i), name="columns")])


@mutator
class _Padder(PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.slices: dict = {}

    def _first_columns(self, out: relax.Expr, shape: list[int], dim: int, dtype: str) -> relax.Expr:
        """``out[..., :dim]`` by a function of its own: a slice Relax would fuse into the
        attention (it reads as element-wise), which the attention family would then not take."""
        key = (tuple(shape), dim, dtype)
        if key not in self.slices:
            self.slices[key] = add_opaque_function(self.builder_, _columns(shape, dim, dtype), "attention_columns")
        return relax.call_tir(self.slices[key], [out], relax.TensorType([*shape[:-1], dim], dtype))

    def _padded(self, operand: relax.Expr, columns: int) -> relax.Expr:
        """``operand`` with ``columns`` zero columns more; where it is a transpose that keeps
        the last axis (torch's ``[B, H, S, D]`` tensor as the operator's ``[B, S, H, D]``), the
        transpose of its source padded, which the attention then reads in place, its rows
        copied whole rather than gathered across heads."""
        widths = [0, 0] * 3 + [0, columns]  # the operator's operands are 4-D
        bound = self.lookup_binding(operand) if isinstance(operand, relax.Var) else None
        axes = [int(a) for a in bound.attrs.axes] if is_op_call(bound, "relax.permute_dims") \
            and bound.attrs.axes is not None else None
        if axes is not None and axes[-1] == len(axes) - 1:
            padded = self.builder_.emit(relax.op.nn.pad(bound.args[0], widths))
            return self.builder_.emit(relax.op.permute_dims(padded, axes))
        return self.builder_.emit(relax.op.nn.pad(operand, widths))

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not any(is_op_call(call, op) for op in ATTENTIONS) or call.ty.dtype not in SIXTEEN_BIT:
            return call
        q, k, v, *bias = call.args
        shapes = [constant_ints(t.ty.shape.values) if t.ty.shape is not None else None for t in (q, k, v)]
        if None in shapes:
            return call
        (_, queries, _, dim), (_, keys, _, key_dim), (*_, value_dim) = shapes
        if key_dim != dim or queries < MIN_QUERIES or keys < MIN_KEYS:
            return call
        width = {d: d if (d * 2) % SECTOR == 0 else padded_dim(d) for d in (dim, value_dim)}
        if all(w == d for d, w in width.items()) or not all(takes_head_dim(w) for w in width.values()):
            return call  # aligned, or past the kernel's own limits (it refuses them by name)
        q, k, v = (self._padded(t, width[d] - d) if d < width[d] else t
                   for t, d in ((q, dim), (k, dim), (v, value_dim)))
        out = self._attention(call, q, k, v, bias, dim)
        return out if value_dim == width[value_dim] else self._first_columns(
            out, [*shapes[0][:-1], width[value_dim]], value_dim, str(call.ty.dtype))

    def _attention(self, call: relax.Call, q, k, v, bias: list, dim: int) -> relax.Expr:
        """``call``'s attention of ``q``, ``k`` and ``v``, its scale that of the head dim ``dim``."""
        attrs = call.attrs
        scale = float(attrs.scale) if attrs.scale is not None else 1.0 / math.sqrt(dim)
        return self.builder_.emit(relax.op.nn.attention(q, k, v, *bias, scale=scale, causal_mask=attrs.causal_mask,
                                                        window_size=attrs.window_size))


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.PadAttentionHeadDims")
def PadAttentionHeadDims(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's 16-bit attentions whose head dim is off 32-byte rows, on padded
    copies (see the module docstring)."""
    return rewrite_functions(mod, _Padder(mod))
