"""Relax matmuls in the form the GEMM families take: matrices, accumulated in fp32.

A model written in ``relax.frontend.nn`` multiplies activations of rank 3 (``[batch, 1, in]``
when decoding, ``[1, tokens, in]`` in prefill) by ``[in, out]`` weights, and a 16-bit ``nn.Linear``
legalizes to a matmul that accumulates in 16 bits. :func:`MatmulsAsMatrices` rewrites each such
``R.matmul`` into a reshape of the activation to ``[rows, in]`` (one symbolic row count: the
batch, or the tokens), a matmul accumulated in fp32 (as cuBLAS and PyTorch accumulate a 16-bit
``nn.Linear``: rounding only at the end), a cast back, and a reshape to the original shape.
Relax does not fuse a reshape into a matmul's group, so the matmul reaches TIR as one 2-D GEMM
with its cast as the epilogue, and the reshapes become views (``RewriteDataflowReshape``).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.sym import Analyzer

#: Activation types whose matmuls the pass rewrites.
SIXTEEN_BIT = ("float16", "bfloat16")


def _rewritable(call: relax.Call) -> bool:
    """A matmul of a 16-bit activation of rank >= 2 by a 2-D weight of the same type, whose
    result is of that type."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.matmul"):
        return False
    x, w = (arg.ty for arg in call.args)
    out = call.ty
    return (isinstance(x, relax.TensorType) and isinstance(w, relax.TensorType)
            and x.dtype in SIXTEEN_BIT and w.dtype == x.dtype and out.dtype == x.dtype
            and x.ndim >= 2 and w.ndim == 2 and x.shape is not None and out.shape is not None)


@mutator
class _Rewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not _rewritable(call):
            return call
        x, w = call.args
        lead, depth = list(x.ty.shape.values[:-1]), x.ty.shape.values[-1]
        out_shape = list(call.ty.shape.values)
        rows = Analyzer().simplify(math.prod(lead[1:], start=lead[0]))
        if len(lead) > 1:
            x = self.builder_.emit(relax.op.reshape(x, relax.ShapeExpr([rows, depth])))
        product = self.builder_.emit(relax.op.matmul(x, w, out_dtype="float32"))
        result = relax.op.astype(product, call.ty.dtype)
        if len(lead) > 1:
            result = relax.op.reshape(self.builder_.emit(result), relax.ShapeExpr(out_shape))
        return result


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.MatmulsAsMatrices")
def MatmulsAsMatrices(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's 16-bit matmuls by 2-D weights as 2-D matmuls accumulated in fp32
    (see the module docstring)."""
    rewriter = _Rewriter(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()
