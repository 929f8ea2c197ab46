"""A fused gate/up projection as one gated GEMM: ``silu(gate) * up`` of the halves of one
``x @ W^T`` (``W[2n, k]``, the gate's rows first), the way a ``relax.frontend.nn`` Llama MLP
writes SwiGLU (``op.split(self.gate_up_proj(x), 2, axis=-1)``).

Relax makes that two kernels: the GEMM writes both halves (``[rows, 2n]``), then a fused
``split``/``silu``/``multiply`` reads them back and writes ``[rows, n]``. :func:`FuseGatedProjections`
rewrites it, after :mod:`tvm_dsm.relax_matmuls` has made the product a matrix accumulated in
fp32, into one call of :func:`tvm_dsm.workloads.dense.gated_dense` over the fused weight: the
split-K GEMM family computes both products on one output tile and writes ``silu(gate) * up``
from its epilogue, with the rows a variable (a kernel per range of rows), where the family
takes the layer (:func:`family_takes`). The products are
rounded once, at the end, where the model rounded them to 16 bits before the SiLU: never less
accurate than what was asked.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .driver import plan
from .errors import ClusterError
from .relax_matmuls import add_opaque_function, is_op_call, rewrite_functions
from .workloads.dense import gated_dense

#: The row count a gated layer is planned at to learn whether the family takes it.
_PROBE_ROWS = 16


def family_takes(n: int, k: int, dtype: str) -> bool:
    """Whether the split-K GEMM takes the gated layer of a fused ``[2n, k]`` weight (planned at
    :data:`_PROBE_ROWS` rows). Where it does not, the layer is left as Relax writes it: split
    into its operators, the gated function would be three kernels where Relax's form is two."""
    try:
        return plan(gated_dense(_PROBE_ROWS, n, k, dtype, fused_weight=True)).family.name == "split_k_gemm"
    except ClusterError:
        return False


def _binding(mutator: PyExprMutator, expr, op: str) -> relax.Call | None:
    """The call of ``op`` bound to ``expr`` (a variable), if that is what it is."""
    value = mutator.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
    return value if is_op_call(value, op) else None


def _half(mutator: PyExprMutator, expr) -> tuple[relax.Expr, int] | None:
    """(the split call's variable, which half) where ``expr`` is a half of a two-way split."""
    value = mutator.lookup_binding(expr) if isinstance(expr, relax.Var) else expr
    if not isinstance(value, relax.TupleGetItem):
        return None
    return value.tuple_value, int(value.index)


@mutator
class _GatedProjectionRewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        # the gated GEMM of each (rows, 2n, k, type), None where the family does not take it
        self.functions: dict[tuple, tvm.ir.GlobalVar | None] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not is_op_call(call, "relax.multiply"):
            return call
        for silu_arg, up_arg in (call.args, call.args[::-1]):
            silu = _binding(self, silu_arg, "relax.nn.silu")
            gate, up = (_half(self, e) for e in (silu.args[0] if silu is not None else None, up_arg))
            if gate is None or up is None or not gate[0].same_as(up[0]) or (gate[1], up[1]) != (0, 1):
                continue
            rewritten = self._gated(up_arg.ty, gate[0])
            if rewritten is not None:
                return rewritten
        return call

    def _gated(self, half: relax.TensorType, halves) -> relax.Expr | None:
        """``silu(gate) * up`` of ``halves`` (a split's variable; each half of type ``half``) as
        one gated GEMM, or None where they are not the halves of a fused projection the
        rewrite takes."""
        split = _binding(self, halves, "relax.split")
        if split is None or not self._halves_of_last_axis(split):
            return None
        product = split.args[0]
        reshape = _binding(self, product, "relax.reshape")
        cast = _binding(self, reshape.args[0] if reshape is not None else product, "relax.astype")
        matmul = _binding(self, cast.args[0], "relax.matmul") if cast is not None else None
        transpose = _binding(self, matmul.args[1], "relax.permute_dims") if matmul is not None else None
        if transpose is None:
            return None
        x, w = matmul.args[0], transpose.args[0]
        dtype = x.ty.dtype
        if not (x.ty.ndim == 2 and w.ty.ndim == 2 and w.ty.dtype == dtype == str(cast.attrs.dtype)
                and matmul.ty.dtype == "float32" and (transpose.attrs.axes is None
                                                     or [int(a) for a in transpose.attrs.axes] == [1, 0])):
            return None
        rows, depth = x.ty.shape.values
        width, w_depth = w.ty.shape.values
        if not all(isinstance(e, tirx.IntImm) for e in (depth, width, w_depth)) or int(depth) != int(w_depth) \
                or int(width) % 2:
            return None
        # rows of its own (bound by X's shape when called): one function for every layer's call
        key = (int(rows) if isinstance(rows, tirx.IntImm) else str(rows.ty.dtype), int(width), int(depth), dtype)
        if key not in self.functions:
            own_rows = rows if isinstance(rows, tirx.IntImm) else tirx.Var("rows", rows.ty.dtype)
            taken = family_takes(int(width) // 2, int(depth), dtype)
            self.functions[key] = add_opaque_function(self.builder_, gated_dense(
                own_rows, int(width) // 2, int(depth), dtype, fused_weight=True), "gated_projection") if taken else None
        callee = self.functions[key]
        if callee is None:
            return None
        out = self.builder_.emit(relax.call_tir(callee, [x, w], relax.TensorType([rows, int(width) // 2], dtype)))
        return out if half.ndim == 2 else relax.op.reshape(out, half.shape)

    @staticmethod
    def _halves_of_last_axis(split: relax.Call) -> bool:
        sections, axis = split.attrs.indices_or_sections, int(split.attrs.axis)
        ndim = split.args[0].ty.ndim
        return isinstance(sections, tirx.IntImm) and int(sections) == 2 and axis in (-1, ndim - 1)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.FuseGatedProjections")
def FuseGatedProjections(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function of ``mod`` with its fused gate/up projections made gated GEMMs (see
    the module docstring)."""
    return rewrite_functions(mod, _GatedProjectionRewriter(mod))
