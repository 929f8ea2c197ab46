"""Relax matmuls and row-wise operators as matrices, the form the families take (products in fp32).

A model written in ``relax.frontend.nn`` multiplies activations of rank 3 (``[batch, 1, in]``
when decoding, ``[1, tokens, in]`` in prefill) by ``[in, out]`` weights, and a 16-bit ``nn.Linear``
legalizes to a matmul that accumulates in 16 bits. :func:`MatmulsAsMatrices` rewrites each such
``R.matmul`` into a reshape of the activation to ``[rows, in]`` (one symbolic row count: the
batch, or the tokens), a matmul accumulated in fp32 (as cuBLAS and PyTorch accumulate a 16-bit
``nn.Linear``: rounding only at the end), a cast back, and a reshape to the original shape; an
fp32 matmul, or a 16-bit one with an fp32 result, likewise without the cast (the GEMM families
take matrices, not a product over ``[1, tokens, in]``).
Relax does not fuse a reshape into a matmul's group, so the matmul reaches TIR as one 2-D GEMM
with its cast as the epilogue, and the reshapes become views (``RewriteDataflowReshape``). What
follows such a product element by element (a bias, an activation, a residual add, a gate's
product, a cast) is made on the matrices too, so it stays in the epilogue; a norm over the
last axis of a tensor whose leading axes hold two variables or more (``[batch, seq, hidden]``)
is made on its matrix of rows, one row variable as for the products, so the row norm family
takes it.

Where the rows are a product of extent variables (``[batch, seq, in]``), each matrix is cast to
one row variable, the same for the same product: the GEMM families plan a row count that is a
variable (a kernel per range of rows), and the variable reaches the product's PrimFunc bound by
its operands' shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.sym import Analyzer

from .ir import find_all

#: Activation types whose matmuls the pass accumulates in fp32 and casts back.
SIXTEEN_BIT = ("float16", "bfloat16")
FP32 = "float32"


def _rewritable(call: relax.Call) -> bool:
    """A matmul of an activation of rank >= 2 by a 2-D weight of the same type (16-bit or
    fp32), whose result is of that type or fp32 (``nn.Linear(..., out_dtype="float32")``)."""
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.matmul"):
        return False
    x, w = (arg.ty for arg in call.args)
    out = call.ty
    return (isinstance(x, relax.TensorType) and isinstance(w, relax.TensorType)
            and x.dtype in (*SIXTEEN_BIT, FP32) and w.dtype == x.dtype and out.dtype in (x.dtype, FP32)
            and x.ndim >= 2 and w.ndim == 2 and x.shape is not None and out.shape is not None)


def rewrite_functions(mod: tvm.IRModule, rewriter: PyExprMutator,
                      before_each: Callable[[], None] = lambda: None) -> tvm.IRModule:
    """``mod`` (the module ``rewriter`` was made on) with each of its Relax functions rewritten by
    ``rewriter``; ``before_each`` resets what the rewriter keeps per function."""
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            before_each()
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()


def map_functions(mod: tvm.IRModule, rewrite: Callable[[relax.Function], relax.Function]) -> tvm.IRModule:
    """``mod`` with each Relax function ``f`` replaced by ``rewrite(f)``; ``mod`` itself where
    every ``rewrite`` returned its function unchanged."""
    updates = {}
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            new = rewrite(func)
            if not new.same_as(func):
                updates[gv] = new
    if not updates:
        return mod
    mod = mod.clone()
    for gv, func in updates.items():
        mod.update_func(gv, func)
    return mod


#: Relax's operator-pattern attribute value for a function ``FuseOps`` leaves alone.
_OPAQUE = 8


def add_opaque_function(builder: relax.BlockBuilder, func: tirx.PrimFunc, name: str) -> tvm.ir.GlobalVar:
    """``func`` added to ``builder``'s module under ``name`` (made unique) as its own symbol,
    marked for ``FuseOps`` to leave alone: a function written for a family to recognize whole."""
    func = func.with_attr("op_pattern", _OPAQUE)
    callee = builder.add_func(func, name)
    builder.update_func(callee, func.with_attr("global_symbol", callee.name_hint))
    return callee


def is_op_call(expr, name: str) -> bool:
    """Whether ``expr`` is a call of the Relax operator ``name`` (e.g. ``"relax.add"``)."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def constant_ints(values) -> list[int] | None:
    """``values`` (a shape's extents, an operator's attributes, a tuple argument's fields) as
    ints, or None where one is not a constant."""
    return [int(v) for v in values] if all(isinstance(v, (int, tirx.IntImm)) for v in values) else None


#: Element-wise Relax operators an epilogue takes: on a product's matrix, they fuse into it.
ELEMENTWISE_UNARY = ("relax.astype", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu", "relax.nn.relu",
                     "relax.sigmoid", "relax.tanh")
ELEMENTWISE_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


#: Row-wise Relax operators (over the last axis) the row families take on a matrix. (Not a
#: softmax: over attention scores it would cut the attention apart, :mod:`tvm_dsm.relax_attention`.)
ROW_WISE = ("relax.nn.layer_norm", "relax.nn.rms_norm")


def rows_of_several_variables(call: relax.Call) -> bool:
    """Whether ``call`` (of :data:`ROW_WISE`) reduces over the last axis alone of a tensor whose
    leading axes hold two extent variables or more (``[batch, seq, hidden]``): a row count no
    family takes unless it is one variable. (With one, the families take the tensor as it is,
    and a reshape would only cut it off from the operators Relax fuses with it.)"""
    ty = call.args[0].ty
    if not (isinstance(ty, relax.TensorType) and ty.shape is not None and ty.ndim >= 3):
        return False
    axes = list(call.attrs.axes)
    variables = {v.name for d in ty.shape.values[:-1] for v in find_all(d, tirx.Var)}
    return [int(a) % ty.ndim for a in axes] == [ty.ndim - 1] and len(variables) >= 2


@mutator
class _Rewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        #: The 2-D results the pass made (each viewed back in its original shape by a reshape).
        self.matrices: list[relax.Var] = []
        #: (tensor, its matrix): one reshape of a tensor however many products read it, so that
        #: products of one input (a gate and an up projection) read one matrix.
        self.reshaped: list[tuple[relax.Expr, relax.Var]] = []

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if _rewritable(call):
            return self._matrix_product(call)
        if isinstance(call.op, tvm.ir.Op) and call.op.name in (*ELEMENTWISE_UNARY, *ELEMENTWISE_BINARY):
            mapped = self._matrix_elementwise(call)
            return call if mapped is None else mapped
        if isinstance(call.op, tvm.ir.Op) and call.op.name in ROW_WISE and rows_of_several_variables(call):
            return self._matrix_row_wise(call)
        if is_op_call(call, "relax.reshape"):  # a view of a product reshaped back to its matrix: the matrix
            matrix = self._matrix_viewed(call.args[0])
            if matrix is not None and tvm_ffi.structural_equal(matrix.ty.shape, call.ty.shape):
                return matrix
            if self._splits_product_rows(call):  # a frontend's own view of its 2-D product (torch's ``view``)
                self.matrices.append(call.args[0])
        return call

    def _splits_product_rows(self, reshape: relax.Call) -> bool:
        """Whether ``reshape`` views a 2-D matmul's result (or what element-wise operators made
        of it: a bias, a cast) with the rows split over leading axes, its columns last:
        element-wise operators of the view may then be made on the product's matrix as on the
        pass's own."""
        source = reshape.args[0]
        if not (source.ty.ndim == 2 and reshape.ty.ndim > 2 and reshape.ty.shape is not None):
            return False
        value = self._value(source)
        while isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in (
                *ELEMENTWISE_UNARY, *ELEMENTWISE_BINARY):
            operands = [a for a in value.args if isinstance(a.ty, relax.TensorType)
                        and tvm_ffi.structural_equal(a.ty.shape, source.ty.shape)]
            value = self._value(operands[0]) if operands else None
        if not is_op_call(value, "relax.matmul"):
            return False
        rows, width = source.ty.shape.values
        dims = list(reshape.ty.shape.values)
        analyzer = Analyzer()
        return analyzer.can_prove_equal(dims[-1], width) and analyzer.can_prove_equal(math.prod(dims[:-1]), rows)

    def _value(self, expr) -> relax.Expr | None:
        """What the variable ``expr`` is bound to, through variables bound to variables (a
        product this pass rewrote binds the original name to the new one)."""
        while isinstance(expr, relax.Var):
            expr = self.lookup_binding(expr)
        return expr

    def _matrix_viewed(self, expr) -> relax.Var | None:
        """The pass's 2-D product that ``expr`` (a variable) views in another shape, if any."""
        view = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        if is_op_call(view, "relax.reshape") and any(view.args[0].same_as(m) for m in self.matrices):
            return view.args[0]
        return None

    def _matrix_product(self, call: relax.Call) -> relax.Expr:
        x, w = call.args
        lead, depth = list(x.ty.shape.values[:-1]), x.ty.shape.values[-1]
        out_shape = list(call.ty.shape.values)
        if len(lead) > 1:
            x = self._matrix_of(x)
        product = self.builder_.emit(relax.op.matmul(x, w, out_dtype=FP32))
        result = product if call.ty.dtype == FP32 else self.builder_.emit(relax.op.astype(product, call.ty.dtype))
        if len(lead) == 1:
            return result
        return self._viewed(result, out_shape)

    def _matrix_of(self, tensor: relax.Expr) -> relax.Var:
        """``tensor`` (of rank 3 or more) as a matrix of its rows: the matrix it views, or its
        reshape (one per tensor)."""
        viewed = self._matrix_viewed(tensor)
        if viewed is not None:
            return viewed
        known = next((m for t, m in self.reshaped if t.same_as(tensor)), None)
        if known is not None:
            return known
        shape = list(tensor.ty.shape.values)
        rows = Analyzer().simplify(math.prod(shape[1:-1], start=shape[0]))
        matrix = self.builder_.emit(relax.op.reshape(tensor, relax.ShapeExpr([rows, shape[-1]])))
        self.reshaped.append((tensor, matrix))
        return matrix

    def _viewed(self, matrix: relax.Var, shape: list) -> relax.Expr:
        self.matrices.append(matrix)
        return relax.op.reshape(matrix, relax.ShapeExpr(shape))

    def _matrix_row_wise(self, call: relax.Call) -> relax.Expr:
        """``call`` (a norm over the last axis of a tensor of rows of several variables) on the
        tensor as a matrix of its rows, cast to one row variable (:class:`_RowVariables`), which
        the row norm family takes."""
        data = call.args[0]
        shape = list(data.ty.shape.values)
        matrix = self._matrix_of(data)
        attrs, name = call.attrs, call.op.name
        if name == "relax.nn.layer_norm":
            on_rows = relax.op.nn.layer_norm(matrix, call.args[1], call.args[2], axes=[-1], epsilon=attrs.epsilon,
                                             center=attrs.center, scale=attrs.scale)
        else:
            on_rows = relax.op.nn.rms_norm(matrix, call.args[1], axes=[-1], epsilon=attrs.epsilon)
        return self._viewed(self.builder_.emit(on_rows), shape)

    def _matrix_elementwise(self, call: relax.Call) -> relax.Expr | None:
        """``call`` (an element-wise operator) of one of the pass's products viewed in its
        original shape, applied to the product's matrix instead: Relax then fuses it into the
        product's epilogue (a reshape between them would end the group). The other operand of
        a binary one is a tensor of the result's shape (a residual: its matrix), one broadcast
        along the rows (a bias ``[N]`` or ``[1, .., 1, N]``: as ``[N]``) or a scalar."""
        shape = call.ty.shape if isinstance(call.ty, relax.TensorType) else None
        for position, ours in enumerate(call.args):
            matrix = self._matrix_viewed(ours)
            if matrix is None or shape is None:
                continue
            others = [self._as_matrix_operand(other, matrix, shape)
                      for i, other in enumerate(call.args) if i != position]
            if any(o is None for o in others):
                return None
            args = others[:position] + [matrix] + others[position:]
            mapped = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args))
            return self._viewed(mapped, list(shape.values))
        return None

    def _as_matrix_operand(self, other: relax.Expr, matrix: relax.Var, shape: relax.ShapeExpr) -> relax.Expr | None:
        """``other`` as the operand of an element-wise operator on ``matrix`` (the result's
        ``shape`` viewed as a matrix), or None where it broadcasts otherwise."""
        ty = other.ty
        if not (isinstance(ty, relax.TensorType) and ty.dtype == matrix.ty.dtype and ty.shape is not None):
            return None
        dims, width = list(ty.shape.values), shape.values[-1]
        if tvm_ffi.structural_equal(ty.shape, shape):
            return self._matrix_of(other)
        analyzer = Analyzer()
        if not dims or all(analyzer.can_prove_equal(d, 1) for d in dims):  # a scalar, kept of rank 1 at most
            return other if len(dims) <= 1 else self.builder_.emit(relax.op.reshape(other, relax.ShapeExpr([1])))
        if analyzer.can_prove_equal(dims[-1], width) and all(analyzer.can_prove_equal(d, 1) for d in dims[:-1]):
            return other if len(dims) == 1 else self.builder_.emit(relax.op.reshape(other, relax.ShapeExpr([width])))
        return None


@mutator
class _RowVariables(PyExprMutator):
    """Every reshape to a matrix whose row count is a product of extent variables, cast to a
    matrix of one variable row count (the same for the same product in a function), and every
    later tensor with an axis of that product cast to the variable there."""

    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.variables: list[tuple[tirx.PrimExpr, tirx.Var]] = []

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        shape = call.ty.shape if isinstance(call.ty, relax.TensorType) else None
        if not isinstance(shape, relax.ShapeExpr):
            return call
        dims = list(shape.values)
        if (is_op_call(call, "relax.reshape") and len(dims) == 2
                and not isinstance(dims[0], (tirx.IntImm, tirx.Var))):
            if self._variable(dims[0]) is None:
                self.variables.append((dims[0], tirx.Var("rows", dims[0].ty)))
        # every tensor with those rows (also one no reshape made: a sorted router's weights), so
        # that the products' rows and theirs are one variable where they meet
        variables = [self._variable(d) for d in dims]
        if all(v is None for v in variables):
            return call
        cast = [d if v is None else v for v, d in zip(variables, dims)]
        return self.builder_.match_cast(self.builder_.emit(call),
                                        relax.TensorType(relax.ShapeExpr(cast), call.ty.dtype))

    def _variable(self, rows) -> tirx.Var | None:
        """The row variable of the product of extent variables ``rows``, if one was made."""
        return next((v for e, v in self.variables if tvm_ffi.structural_equal(e, rows)), None)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.MatmulsAsMatrices")
def MatmulsAsMatrices(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function's 16-bit matmuls by 2-D weights as 2-D matmuls accumulated in fp32
    (see the module docstring)."""
    # A reshape folded away leaves its product bound to a second name and its view dead: left
    # in, the extra use would keep Relax from fusing the product's add.
    cleanup = tvm.transform.Sequential([relax.transform.CanonicalizeBindings(),
                                        relax.transform.DeadCodeElimination()])
    mod = cleanup(rewrite_functions(mod, _Rewriter(mod)))
    # after the cleanup, whose canonicalization would put the products back for the variables
    rows = _RowVariables(mod)
    return rewrite_functions(mod, rows, before_each=lambda: setattr(rows, "variables", []))


@mutator
class _OwnTransposes(PyExprMutator):
    """Every matmul whose right operand is a transpose reading its own transpose of it."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        right = call.args[1] if is_op_call(call, "relax.matmul") else None
        bound = self.lookup_binding(right) if isinstance(right, relax.Var) else None
        if bound is None or not is_op_call(bound, "relax.permute_dims"):
            return call
        own = self.builder_.emit(relax.op.permute_dims(bound.args[0], bound.attrs.axes))
        return relax.Call(call.op, [call.args[0], own], call.attrs)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.TransposePerMatmul")
def TransposePerMatmul(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Each matmul of a transposed operand given a transpose of its own, the shared one left to
    dead-code elimination: TVM's ``FuseTransposeMatmul`` fails on a transpose two matmuls read
    (its fused function returns both products; DeBERTa projects its tokens and its relative
    positions by one transposed weight), and fuses each pair once they are apart."""
    return relax.transform.DeadCodeElimination()(rewrite_functions(mod, _OwnTransposes(mod)))
