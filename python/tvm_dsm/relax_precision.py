"""Relax operators TVM 0.27 cannot legalize in 16 bits, rewritten into forms it can.

TOPI's ``layer_norm`` takes fp32 and fp16 only: a bf16 model with ``nn.LayerNorm`` (a BERT, a
GPT-2, a ViT in bf16) fails to compile on TVM's own pipeline ("layer_norm: only support float32
and float16"). :data:`NormsInFp32` computes each such norm in fp32, its input, weight and bias
cast up, and rounds the result to bf16 once: what mixed-precision frameworks compute, never less
accurate than the bf16 arithmetic asked for. The casts are written into the norm's own function
(Relax would not fuse a cast into a norm's input: the activation's cast would be a kernel of
its own, and the weight's and bias's a kernel every call), which the row norm family takes;
except where the rows are of several extent variables (``[batch, seq, width]``, both symbolic),
which :mod:`tvm_dsm.relax_matmuls` first merges into one row variable from the operator.

``R.nn.attention`` (``nn.op.scaled_dot_product_attention``) of 16-bit tensors with an explicit
``scale`` (with or without a bias) legalizes to a multiplication by an fp32 constant whose result the function declares
16-bit, which fails to build ("asserts result type T.float16, but its source ... imply
T.float32"); the default scale, ``1 / sqrt(head dim)``, builds. :data:`AttentionScaleOnQuery`
moves an explicit scale onto the query: ``q * (scale * sqrt(head dim))`` in the query's type,
then the attention with its default scale, the same scores up to the one rounding of the scaled
query (what a model that scales q itself computes; exact where the factor is a power of two).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_matmuls import SIXTEEN_BIT, is_op_call, rewrite_functions, rows_of_several_variables

#: Relax's attention operators (``R.nn.attention`` is ``relax.nn.attention_bias`` with a bias).
ATTENTIONS = ("relax.nn.attention", "relax.nn.attention_bias")
#: The type whose layer norms are computed in fp32.
_NARROW = "bfloat16"


def _layer_norm_in_fp32(x: te.Tensor, weight: te.Tensor, bias: te.Tensor, axes: list, epsilon: float) -> te.Tensor:
    """TOPI's ``layer_norm`` of ``x``, ``weight`` and ``bias`` cast to fp32, rounded back to
    ``x``'s type: one function, the casts read where the norm reads its operands."""
    wide = [topi.cast(t, "float32") for t in (x, weight, bias)]
    return topi.cast(topi.nn.layer_norm(*wide, axis=axes, epsilon=epsilon), x.dtype)


@mutator
class _NormRewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not (is_op_call(call, "relax.nn.layer_norm") and call.ty.dtype == _NARROW):
            return call
        attrs = call.attrs
        if attrs.center and attrs.scale and not rows_of_several_variables(call):
            # the casts inside the norm's own function (Relax would not fuse a cast into a
            # norm's input); rows of several variables are first merged into one by
            # MatmulsAsMatrices, which reads the operator, and keep their casts apart
            return self.builder_.call_te(_layer_norm_in_fp32, *call.args, axes=[int(a) for a in attrs.axes],
                                         epsilon=float(attrs.epsilon), primfunc_name_hint="layer_norm")
        wide = [self.builder_.emit(relax.op.astype(arg, "float32")) for arg in call.args]
        norm = relax.op.nn.layer_norm(*wide, axes=list(attrs.axes), epsilon=attrs.epsilon, center=attrs.center,
                                      scale=attrs.scale)
        return relax.op.astype(self.builder_.emit(norm), _NARROW)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.NormsInFp32")
def NormsInFp32(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's bf16 layer norms computed in fp32 (see the module docstring)."""
    return rewrite_functions(mod, _NormRewriter(mod))


@mutator
class _ScaleRewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not (any(is_op_call(call, op) for op in ATTENTIONS) and call.ty.dtype in SIXTEEN_BIT
                and call.attrs.scale is not None):
            return call
        q, *rest = call.args
        factor = float(call.attrs.scale) * math.sqrt(int(q.ty.shape.values[-1]))
        scaled = q if factor == 1.0 else self.builder_.emit(relax.op.multiply(q, relax.const(factor, q.ty.dtype)))
        attrs = call.attrs
        return relax.op.nn.attention(scaled, *rest, causal_mask=attrs.causal_mask, window_size=attrs.window_size)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.AttentionScaleOnQuery")
def AttentionScaleOnQuery(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's 16-bit attentions with an explicit scale, the scale on the query
    (see the module docstring)."""
    return rewrite_functions(mod, _ScaleRewriter(mod))
