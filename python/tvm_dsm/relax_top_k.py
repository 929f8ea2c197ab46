"""``R.topk`` of a Relax model as tvm-dsm's top-k rows kernel instead of TVM's sort.

TVM's CUDA pipeline dispatches ``R.topk`` to its sort kernels before legalization (library
dispatch): each row is sorted whole to keep k of its elements, in several launches. A MoE
router ranks a few to a few hundred experts per token and keeps 1-8 of them, which
:mod:`tvm_dsm.kernels.top_k_rows` does in one kernel that reads each row once, for a token count
known only when called too (a kernel per range of tokens, :mod:`tvm_dsm.families.row_ranges`).

:data:`TopKAsRows` replaces an ``R.topk`` of a router's probabilities (the input an
``R.nn.softmax`` of a 2-D tensor whose row count is a constant or a variable; the last axis,
largest first, int32 or int64 indices, as TVM's and torch's importers write them) by a call of a
TE function computing the same k values and indices (ties to the lower index, as TVM's ``topk``
orders them), where that family takes the function; any other ``R.topk`` is left to TVM.
Probabilities are never -inf, which the kernel's empty slot (the lowest finite value, index -1)
ranks above; a NaN, which never enters the kernel's k best, comes only from a NaN logit, whose
row TVM's sort leaves unordered too. The function is marked opaque to Relax's operator fusion: a
following element-wise operation fused into it (a renormalization of the weights) would leave a
function the family does not take, and the unfused top-k reduction compiles slowly
(:mod:`tvm_dsm.fusion.top_k`).
"""

from __future__ import annotations

import tvm
from tvm import relax, te, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .errors import ClusterError
from .fusion.top_k import column, top_k
from .kernels.top_k_rows import TEMPLATE, find_top_k_rows
from .relax_matmuls import add_opaque_function, is_op_call, rewrite_functions

#: The row count the family's checks are made at where the model's is symbolic (any whole
#: number of CTAs' rows).
_PROBE_ROWS = 128
_RANKED = ("float16", "bfloat16", "float32")
#: Index types of the rewritten calls: the kernel ranks with int32 indices, widened where stored.
_INDEX_TYPES = ("int32", "int64")


def top_k_te(x: te.Tensor, k: int, index_dtype: str = "int32") -> list[te.Tensor]:
    """The k largest elements of each row of the 2-D ``x`` (in ``x``'s type, best first) and
    their indices (computed in int32, stored as ``index_dtype``): [values, indices], each [rows, k]."""
    rows, width = x.shape
    wide = x.dtype != "float32"  # 16-bit values ranked as fp32, which is exact

    def value(i, r):
        return x(i, r).astype("float32") if wide else x(i, r)

    best = top_k(value, (rows,), int(width), k)  # int32 indices, whatever the shapes' type
    values = te.compute((rows, k), lambda i, c: column(best[:k], i, c).astype(x.dtype), name="values")
    indices = te.compute((rows, k), lambda i, c: column(best[k:], i, c).astype(index_dtype), name="indices")
    return [values, indices]


def family_takes(dtype: str, width: int, k: int, index_dtype: str = "int32") -> bool:
    """Whether the top-k rows family takes the top-k of rows of ``width`` elements of
    ``dtype`` (checked on :func:`top_k_te`'s function at :data:`_PROBE_ROWS` rows)."""
    x = te.placeholder((_PROBE_ROWS, width), dtype, name="x")
    func = te.create_prim_func([x, *top_k_te(x, k, index_dtype)])
    try:
        TEMPLATE.configs(find_top_k_rows(func))
    except ClusterError:
        return False
    return True


def _rewritable(call: relax.Call, producer) -> bool:
    """Whether the family takes ``call`` (an ``R.topk``) as :func:`top_k_te` computes it, its
    input computed by ``producer`` (the call bound to it, if any)."""
    attrs, ty = call.attrs, call.args[0].ty
    if not (isinstance(ty, relax.TensorType) and ty.ndim == 2 and isinstance(ty.shape, relax.ShapeExpr)
            and is_op_call(producer, "relax.nn.softmax")):
        return False
    rows, width = ty.shape.values
    return (isinstance(rows, (tirx.IntImm, tirx.Var)) and isinstance(width, tirx.IntImm)
            and int(attrs.axis) in (-1, 1) and bool(attrs.largest) and str(attrs.dtype) in _INDEX_TYPES
            and ty.dtype in _RANKED and 1 <= int(attrs.k) <= int(width)
            and family_takes(ty.dtype, int(width), int(attrs.k), str(attrs.dtype)))


@mutator
class _TopKRewriter(PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not is_op_call(call, "relax.topk"):
            return call
        x, k = call.args[0], int(call.attrs.k)
        if not _rewritable(call, self.lookup_binding(x) if isinstance(x, relax.Var) else None):
            return call
        rows, width = x.ty.shape.values
        placeholder = te.placeholder((rows, width), x.ty.dtype, name="x")
        index_dtype = str(call.attrs.dtype)
        outputs = top_k_te(placeholder, k, index_dtype)
        # The function as TE writes it (BlockBuilder.call_te's rewriting of it hides the top-k
        # reduction from the family's recognition), under its own symbol.
        callee = add_opaque_function(self.builder_, te.create_prim_func([placeholder, *outputs]), "top_k")
        out = [relax.TensorType([rows, k], x.ty.dtype), relax.TensorType([rows, k], index_dtype)]
        both = self.builder_.emit(relax.call_tir(callee, [x], out))
        ret = str(call.attrs.ret_type)
        if ret == "both":
            return both
        return relax.TupleGetItem(both, 0 if ret == "values" else 1)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.TopKAsRows")
def TopKAsRows(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function of ``mod`` with its ``R.topk`` calls rewritten (see the module
    docstring)."""
    return rewrite_functions(mod, _TopKRewriter(mod))
