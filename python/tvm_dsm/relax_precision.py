"""Relax operators TVM 0.27 cannot legalize in bfloat16, computed in fp32 and rounded once.

TOPI's ``layer_norm`` takes fp32 and fp16 only: a bf16 model with ``nn.LayerNorm`` (a BERT, a
GPT-2, a ViT in bf16) fails to compile on TVM's own pipeline ("layer_norm: only support float32
and float16"). :data:`NormsInFp32` computes each such norm in fp32, its input, weight and bias
cast up, and rounds the result to bf16 once: what mixed-precision frameworks compute, never less
accurate than the bf16 arithmetic asked for. Relax fuses the casts into the norm's function,
which the row norm family takes.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_matmuls import is_op_call, rewrite_functions

#: The type whose layer norms are computed in fp32.
_NARROW = "bfloat16"


@mutator
class _Rewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not (is_op_call(call, "relax.nn.layer_norm") and call.ty.dtype == _NARROW):
            return call
        wide = [self.builder_.emit(relax.op.astype(arg, "float32")) for arg in call.args]
        attrs = call.attrs
        norm = relax.op.nn.layer_norm(*wide, axes=list(attrs.axes), epsilon=attrs.epsilon, center=attrs.center,
                                      scale=attrs.scale)
        return relax.op.astype(self.builder_.emit(norm), _NARROW)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.NormsInFp32")
def NormsInFp32(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's bf16 layer norms computed in fp32 (see the module docstring)."""
    return rewrite_functions(mod, _Rewriter(mod))
