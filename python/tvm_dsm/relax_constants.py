"""Tensors a model computes from constants alone, evaluated once when it is compiled.

A traced model rebuilds on every call what depends on none of its inputs: Swin's shifted-window
mask is a zero image assigned region by region (twelve ``slice_scatter`` kernels, then its
windows cut out and compared), its relative position bias a gather of a table by a constant
index; masks come from ``arange`` comparisons. Each of these is a kernel a call (a Swin layer:
49 kernels, 29 of them for its mask and bias). :data:`FoldConstantTensors` evaluates every such
tensor that the rest of the function reads (all of them in one host module a function) and
binds it as a constant: the kernels are gone, and what reads the tensor sees its value (an
attention mask the rewrites of :mod:`tvm_dsm.relax_attention_masks` then read as what it is).

Only tensors of static shape up to :data:`MAX_FOLDED_ELEMENTS` elements, computed from constants
of at most :data:`MAX_SOURCE_ELEMENTS` elements each, are folded: a model's weights bound as
constants stay what the operators read (a transposed weight folded would change the product's
layout, and copy the weight), and a mask of symbolic extents is computed where it runs.
"""

from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .relax_matmuls import map_functions

#: Elements of the largest tensor folded (a 2048 x 2048 mask).
MAX_FOLDED_ELEMENTS = 1 << 22
#: Elements of the largest constant a folded tensor is computed from (Swin's bias table, an
#: index of 49 x 49 positions; not a model's weight matrices).
MAX_SOURCE_ELEMENTS = 1 << 16
#: Operators that read a part of a tensor: one of a constant of any size is folded where the part
#: is no larger than :data:`MAX_SOURCE_ELEMENTS` (a traced model's RoPE table sliced to its
#: tokens, ``cos[:t]``: a copy kernel a call, of a table the rest of the model never reads).
_PARTS = ("relax.strided_slice",)


def static(ty) -> bool:
    """Whether ``ty`` is a tensor type of constant extents."""
    return isinstance(ty, relax.TensorType) and ty.shape is not None and all(
        isinstance(x, tirx.IntImm) for x in ty.shape.values)


def closed(expr: relax.Expr, values: dict) -> list | None:
    """The bindings (var, value) ``expr`` is computed from, in order, where it depends on
    nothing but constants (no parameter of the function); else None."""
    order, seen = [], set()

    def visit(e) -> bool:
        if isinstance(e, relax.Var):
            if e in seen:
                return True
            if e not in values:
                return False  # a parameter: known only when the function runs
            seen.add(e)
            if not visit(values[e]):
                return False
            order.append((e, values[e]))
            return True
        if isinstance(e, relax.Call):
            return isinstance(e.op, tvm.ir.Op) and all(visit(a) for a in e.args)
        if isinstance(e, relax.Tuple):
            return all(visit(f) for f in e.fields)
        return isinstance(e, (tvm.ir.Constant, relax.ShapeExpr, tvm.ir.StringImm))  # prim values are constants

    return order if visit(expr) else None


def evaluate(exprs: list, bindings: list) -> list[np.ndarray]:
    """The values of ``exprs``, bound by ``bindings`` to constants alone, computed on the host
    in one module."""
    outs = [relax.Var(f"value{n}", e.ty) for n, e in enumerate(exprs)]
    result = relax.Tuple(outs)
    block = relax.DataflowBlock([*(relax.VarBinding(v, value) for v, value in bindings),
                                 *(relax.VarBinding(o, e) for o, e in zip(outs, exprs))])
    mod = tvm.IRModule({"main": relax.Function([], relax.SeqExpr([block], result), result.ty)})
    executable = tvm.compile(relax.transform.LegalizeOps()(mod), "llvm")
    values = relax.VirtualMachine(executable, tvm.cpu())["main"]()
    return [values[n].numpy() for n in range(len(exprs))]


def floating(value: np.ndarray) -> bool:
    """Whether ``value`` holds floating-point numbers: numpy's types and ml_dtypes' (bfloat16,
    fp8), which numpy does not count as floating."""
    return np.issubdtype(value.dtype, np.floating) or value.dtype.name.startswith(("bfloat16", "float8"))


def elements(ty) -> int:
    """The element count of a static tensor type."""
    return math.prod(int(x) for x in ty.shape.values)


def _foldable(var: relax.Var, value, constant: set) -> bool:
    """Whether ``var`` (bound to ``value``) is a small static tensor computed by an operator
    from constants alone (``constant``: the variables already known to be): small ones, or a
    small part of one of any size (:data:`_PARTS`)."""
    small_part = (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _PARTS
                  and static(var.ty) and elements(var.ty) <= MAX_SOURCE_ELEMENTS)

    def known(arg) -> bool:
        if isinstance(arg, (tirx.IntImm, tirx.FloatImm, tvm.ir.StringImm)):  # (IntImm is a Constant too)
            return True
        if isinstance(arg, relax.Var):
            return arg in constant
        if isinstance(arg, tvm.ir.Constant):
            return static(arg.ty) and (small_part or elements(arg.ty) <= MAX_SOURCE_ELEMENTS)
        if isinstance(arg, relax.Tuple):
            return all(known(f) for f in arg.fields)
        return isinstance(arg, relax.ShapeExpr) and all(isinstance(x, tirx.IntImm) for x in arg.values)

    if isinstance(value, (relax.Var, tvm.ir.Constant)):  # an alias, or a constant bound to a variable
        return known(value)
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and all(known(a) for a in value.args) \
        and static(var.ty) and elements(var.ty) <= MAX_FOLDED_ELEMENTS


@mutator
class _Folder(PyExprMutator):
    def __init__(self, folded: dict):
        super().__init__()
        self.folded = folded

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:  # noqa: N802 - TVM visitor name
        if binding.var in self.folded:
            self.builder_.emit_normalized(relax.VarBinding(binding.var, self.folded[binding.var]))
        else:
            super().visit_var_binding_(binding)


def fold_constant_tensors(func: relax.Function) -> relax.Function:
    """``func`` with every tensor computed from constants alone that the rest of it reads bound
    as its value (see the module docstring); ``func`` itself where there is none."""
    values = relax.analysis.get_var2val(func)
    constant: set = set()
    for var, value in values.items():  # in binding order
        if _foldable(var, value, constant):
            constant.add(var)
    read_by_others: set = set()
    for var, value in values.items():
        if var not in constant:
            relax.analysis.post_order_visit(value, lambda e: read_by_others.add(e) if e in constant else None)
    relax.analysis.post_order_visit(func.body.body, lambda e: read_by_others.add(e) if e in constant else None)
    frontier = [v for v in values if v in read_by_others and isinstance(values[v], relax.Call)]
    if not frontier:
        return func
    bindings = closed(relax.Tuple(frontier), values)
    evaluated = evaluate(frontier, bindings)
    folded = {v: relax.const(x, str(v.ty.dtype)) for v, x in zip(frontier, evaluated)}
    return relax.analysis.remove_all_unused(_Folder(folded).visit_expr(func))


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.FoldConstantTensors")
def FoldConstantTensors(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function of ``mod`` with its tensors computed from constants alone folded
    (:func:`fold_constant_tensors`); ``mod`` itself where none is."""
    return map_functions(mod, fold_constant_tensors)
