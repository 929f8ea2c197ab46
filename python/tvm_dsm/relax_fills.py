"""Tensors filled with infinity or NaN, which TVM 0.27 cannot legalize, written as broadcasts.

A causal mask as Llama's eager attention writes it, ``torch.full((s, s), float("-inf")).triu(1)``,
imports as ``R.full(shape, R.const(-inf))``. Relax legalizes ``R.full`` and ``R.full_like``
through ``topi.full``, which checks that a non-finite fill has a floating-point type by looking
for ``"float"`` in the type, and receives a ``PrimType``: "argument of type 'PrimType' is not
iterable", and the model compiles on no pipeline. :data:`NonFiniteFills` writes each such fill
as ``R.broadcast_to`` of the same scalar constant to the same shape: the same tensor, through
a legalization that takes any value (and constant-folds like the fill).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_matmuls import is_op_call, rewrite_functions
from .relax_patterns import scalar_value

#: The fill operators and whether their first argument is a tensor whose shape they take (then
#: written as a broadcast to the result's shape, where it is known before the call runs).
FILLS = {"relax.full": False, "relax.full_like": True}


def non_finite_fill(call: relax.Expr) -> bool:
    """Whether ``call`` fills a tensor with a scalar constant that is infinite or NaN."""
    if not any(is_op_call(call, op) for op in FILLS):
        return False
    value = scalar_value(call.args[1])
    return value is not None and not math.isfinite(value)


@mutator
class _FillRewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not non_finite_fill(call):
            return call
        shape = call.ty.shape if FILLS[call.op.name] else call.args[0]  # full_like's: the result's
        if not isinstance(shape, relax.ShapeExpr):
            return call  # a shape unknown until it runs: left as it is
        return relax.op.broadcast_to(relax.const(scalar_value(call.args[1]), call.ty.dtype), shape)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.NonFiniteFills")
def NonFiniteFills(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's fills with infinity or NaN as broadcasts (see the module docstring)."""
    return rewrite_functions(mod, _FillRewriter(mod))
