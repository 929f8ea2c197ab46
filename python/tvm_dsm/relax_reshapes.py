"""Reshapes over symbolic extents read in place.

Relax lowers ``R.reshape`` to a copy (TOPI's ``reshape``), and its ``RewriteDataflowReshape``
turns a call of that copy back into a view where ``has_reshape_pattern`` proves the indices a
reshape's. tvm-dsm's pipeline computes a symbolic model's products over a token matrix whose
rows are one variable (:mod:`tvm_dsm.relax_matmuls`: ``rows``, cast from ``b * s``), and the
reshape back to ``[b, s, h]`` reads ``x[(i * s + j) % rows, k]``: no analysis can drop that
modulus, so a ``relax.frontend.nn`` model copied the output of every such product.
:data:`ReshapesAsViews` calls ``R.reshape`` instead (a view, which the VM makes) where the
callee is TOPI's reshape of its input to its output's shape (rebuilt at the function's own
extents and compared) and the call's input and output hold the same number of elements, the
row variables read as what the function cast them from, or where the callee's blocks merged
into one copy the input in memory order (:func:`is_layout_copy`); Relax's own rewrite keeps the
rest.
"""

from __future__ import annotations

import functools

import tvm
import tvm_ffi
from tvm import relax, te, tirx, topi
from tvm.relax.expr_functor import PyExprMutator, mutator

from .ir import block_analyzer, root_blocks
from .relax_chains import merge_elementwise

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _one_to_one(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` takes one tensor and writes one of its type."""
    return (len(func.params) == 2 and all(isinstance(p.ty, tirx.buffer.BufferType) for p in func.params)
            and func.params[0].ty.dtype == func.params[1].ty.dtype)


def is_topi_reshape(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` (one input, one output of its type) is TOPI's reshape of its input to
    its output's shape."""
    if not _one_to_one(func) or len(func.params[1].ty.shape) == 0:
        return False
    source, target = (p.ty for p in func.params)
    x = te.placeholder(list(source.shape), str(source.dtype), name="x")
    written = te.create_prim_func([x, topi.reshape(x, list(target.shape))])
    return tvm_ffi.structural_equal(written.body, func.body, map_free_vars=True)


def is_layout_copy(func: tirx.PrimFunc) -> bool:
    """Whether ``func``, its blocks merged into one, copies its one input's elements to its
    output in memory order (each element's offset in the input is its offset in the output): a
    transpose of unit axes (``[B, H, 1, D]`` to ``[B, 1, H, D]``), perhaps fused with a multiply
    by a scale an earlier rewrite made 1, which Relax's own analysis does not read as a view."""
    if not _one_to_one(func):
        return False
    blocks = root_blocks(merge_elementwise(func))
    store = blocks[0].body if len(blocks) == 1 else None
    source, target = func.params
    if not (isinstance(store, tirx.BufferStore) and store.buffer.same_as(target)
            and isinstance(store.value, tvm.ir.TensorLoad) and store.value.source.same_as(source)):
        return False
    analyzer = block_analyzer(blocks[0])
    return (analyzer.can_prove_equal(_count(source.ty.shape, {}), _count(target.ty.shape, {}))
            and analyzer.can_prove_equal(_offset(store.value.indices, source.ty.shape),
                                         _offset(store.indices, target.ty.shape)))


def _offset(indices, shape) -> tirx.PrimExpr:
    """The row-major offset of ``indices`` in a tensor of ``shape``."""
    return functools.reduce(lambda offset, pair: offset * tirx.Cast("int64", pair[1]) + tirx.Cast("int64", pair[0]),
                            zip(indices, shape), tirx.const(0, "int64"))


def _count(shape, defined: dict) -> tirx.PrimExpr:
    """The elements of ``shape``, its variables read as the extents they were cast from."""
    dims = [tirx.Cast("int64", defined.get(d, d) if isinstance(d, tirx.Var) else d) for d in shape]
    return functools.reduce(lambda a, b: a * b, dims, tirx.const(1, "int64"))


def _cast_extents(func: relax.Function) -> dict:
    """Each extent variable a ``match_cast`` of ``func`` defines where its value's extent was an
    expression (``rows`` from ``b * s``), by that expression."""
    defined = {}

    def visit(binding):
        if isinstance(binding, relax.MatchCast) and isinstance(binding.value.ty, relax.TensorType):
            cast, value = binding.struct_info.shape, binding.value.ty.shape
            if isinstance(cast, relax.ShapeExpr) and isinstance(value, relax.ShapeExpr):
                for new, old in zip(cast.values, value.values):
                    if isinstance(new, tirx.Var) and not new.same_as(old):
                        defined[new] = old

    for block in func.body.blocks if isinstance(func.body, relax.SeqExpr) else []:
        for binding in block.bindings:
            visit(binding)
    return defined


@mutator
class _Views(PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.mod = mod
        self.defined: dict = {}
        self.kinds: dict[str, tuple[bool, bool] | None] = {}  # by callee: (a layout copy, TOPI's reshape)

    def _kind(self, gv: tvm.ir.GlobalVar) -> tuple[bool, bool] | None:
        """(whether ``gv``'s function is a layout copy, TOPI's reshape), None where Relax's own
        rewrite reads it in place or it is no PrimFunc; worked out once a callee."""
        if gv.name_hint not in self.kinds:
            callee = self.mod[gv]
            self.kinds[gv.name_hint] = None if (
                not isinstance(callee, tirx.PrimFunc) or relax.analysis.has_reshape_pattern(callee)) else (
                is_layout_copy(callee), is_topi_reshape(callee))
        return self.kinds[gv.name_hint]

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not (call.op.same_as(_CALL_TIR) and isinstance(call.args[0], tvm.ir.GlobalVar)
                and isinstance(call.args[1], relax.Tuple) and len(call.args[1].fields) == 1
                and isinstance(call.ty, relax.TensorType) and isinstance(call.ty.shape, relax.ShapeExpr)):
            return call
        data = call.args[1].fields[0]
        kind = self._kind(call.args[0])
        if kind is None or not isinstance(data.ty, relax.TensorType) or not isinstance(data.ty.shape, relax.ShapeExpr):
            return call
        layout_copy, topi_reshape = kind
        if layout_copy or (topi_reshape and tvm.sym.Analyzer().can_prove_equal(
                _count(data.ty.shape.values, self.defined), _count(call.ty.shape.values, self.defined))):
            return relax.op.reshape(data, call.ty.shape)
        return call


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.ReshapesAsViews")
def ReshapesAsViews(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """``mod`` with the calls of TOPI reshapes that Relax cannot read in place made views (see
    the module docstring), the functions no longer called removed."""
    views = _Views(mod)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            views.defined = _cast_extents(func)
            views.builder_.update_func(gv, views.visit_expr(func))
    return relax.transform.DeadCodeElimination()(views.builder_.get())
