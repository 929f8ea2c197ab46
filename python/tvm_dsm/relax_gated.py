"""Gated projections as one gated GEMM: ``act(gate) * up`` (SwiGLU's SiLU, GeGLU's GELU) of the
halves of one ``x @ W^T`` (``W[2n, k]``, the gate's rows first, the way a ``relax.frontend.nn``
Llama MLP writes it: ``op.split(self.gate_up_proj(x), 2, axis=-1)``), or of a gate and an up
projection of one input (two ``Linear`` layers, as torch users write it).

Relax makes the first two kernels, the GEMM writing both halves (``[rows, 2n]``) and a fused
``split``/``silu``/``multiply`` reading them back, and the second three. :func:`FuseGatedProjections`
rewrites either, after :mod:`tvm_dsm.relax_matmuls` has made the products matrices accumulated in
fp32, into one call of :func:`tvm_dsm.workloads.dense.gated_dense`: the split-K GEMM family
computes both products on one output tile and writes ``act(gate) * up`` from its epilogue, with
the rows a variable (a kernel per range of rows), where the family takes the layer
(:func:`family_takes`). The products are rounded once, at the end, where the model rounded them
to 16 bits before the activation: never less accurate than what was asked.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from .driver import plan
from .errors import ClusterError
from .relax_matmuls import add_opaque_function, is_op_call, rewrite_functions
from .workloads.dense import gated_dense

#: The row count a gated layer is planned at to learn whether the family takes it.
_PROBE_ROWS = 16


#: The gate activations a gated GEMM takes: Relax's operator, and its name in
#: :data:`tvm_dsm.workloads.dense.ACTIVATIONS`.
GATE_ACTIVATIONS = {"relax.nn.silu": "silu", "relax.nn.gelu": "gelu", "relax.nn.gelu_tanh": "gelu_tanh",
                    "relax.nn.relu": "relu"}


def family_takes(n: int, k: int, dtype: str, fused_weight: bool = True, activation: str = "silu") -> bool:
    """Whether the split-K GEMM takes the gated layer of a fused ``[2n, k]`` weight (or of two
    ``[n, k]`` weights), planned at :data:`_PROBE_ROWS` rows. Where it does not, the layer is
    left as Relax writes it: split into its operators, the gated function would be three
    kernels where Relax's form is two."""
    try:
        func = gated_dense(_PROBE_ROWS, n, k, dtype, fused_weight=fused_weight, activation=activation)
        return plan(func).family.name == "split_k_gemm"
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
        # the gated GEMM of each (rows, n, k, type, fused weight, activation), None where the family does not take it
        self.functions: dict[tuple, tvm.ir.GlobalVar | None] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM visitor name
        call = super().visit_call_(call)
        if not is_op_call(call, "relax.multiply"):
            return call
        for act_arg, up_arg in (call.args, call.args[::-1]):
            found = self._activation(act_arg)
            if found is None:
                continue
            activation, gate_arg = found
            gate, up = (_half(self, e) for e in (gate_arg, up_arg))
            if gate is not None and up is not None and gate[0].same_as(up[0]) and (gate[1], up[1]) == (0, 1):
                rewritten = self._gated(up_arg.ty, gate[0], activation)
            else:
                rewritten = self._gated_pair(gate_arg, up_arg, activation)
            if rewritten is not None:
                return rewritten
        return call

    def _activation(self, expr) -> tuple[str, relax.Expr] | None:
        """(the activation's name, its input) where ``expr`` is a gate activation of a product:
        ``act(gate)``, or ``act(gate)`` computed on the gate widened to fp32 and rounded back to
        its 16-bit type (torch's decomposition of ``silu``)."""
        act = self.lookup_binding(expr) if isinstance(expr, relax.Var) else None
        narrowed = act if is_op_call(act, "relax.astype") else None
        if narrowed is not None:
            act = self.lookup_binding(narrowed.args[0]) if isinstance(narrowed.args[0], relax.Var) else None
        if not (isinstance(act, relax.Call) and isinstance(act.op, tvm.ir.Op) and act.op.name in GATE_ACTIVATIONS):
            return None
        gate = act.args[0]
        if narrowed is not None:
            widened = _binding(self, gate, "relax.astype")
            if widened is None or act.ty.dtype != "float32" or widened.args[0].ty.dtype != narrowed.ty.dtype:
                return None
            gate = widened.args[0]
        return GATE_ACTIVATIONS[act.op.name], gate

    def _product(self, expr) -> tuple[relax.Expr, relax.Expr] | None:
        """(x, W) where ``expr`` is ``astype(matmul(x, permute_dims(W)))``: a matrix
        product accumulated in fp32 and rounded to x's 16-bit type (:mod:`tvm_dsm.relax_matmuls`),
        or that reshaped (torch's ``view`` back to ``[batch, tokens, n]``)."""
        reshape = _binding(self, expr, "relax.reshape")
        cast = _binding(self, reshape.args[0] if reshape is not None else expr, "relax.astype")
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
        return x, w

    def _gated_pair(self, gate, up, activation: str) -> relax.Expr | None:
        """``act(gate) * up`` of two products of one input by weights ``[n, k]`` (a gate and an
        up projection of their own, as torch and ``nn`` users write SwiGLU) as one gated GEMM,
        or None where they are not such products or the family does not take them."""
        products = [self._product(e) for e in (gate, up)]
        if None in products or not self._same_matrix(products[0][0], products[1][0]):
            return None
        (x, wg), (_, wu) = products
        if not tvm_ffi.structural_equal(wg.ty.shape, wu.ty.shape):
            return None
        rows, depth = x.ty.shape.values
        width, w_depth = wg.ty.shape.values
        if not isinstance(width, tirx.IntImm):
            return None
        out = self._call_gated(x, [wg, wu], rows, int(width), depth, w_depth, False, activation)
        return out if out is None or up.ty.ndim == 2 else relax.op.reshape(out, up.ty.shape)

    def _same_matrix(self, a, b) -> bool:
        """Whether ``a`` and ``b`` are one matrix: one variable (:mod:`tvm_dsm.relax_matmuls`
        makes one), or reshapes of one variable to one shape (torch's ``view`` before each
        ``mm``)."""
        if a.same_as(b):
            return True
        ra, rb = (_binding(self, e, "relax.reshape") for e in (a, b))
        return (ra is not None and rb is not None and ra.args[0].same_as(rb.args[0])
                and tvm_ffi.structural_equal(a.ty.shape, b.ty.shape))

    def _gated(self, half: relax.TensorType, halves, activation: str) -> relax.Expr | None:
        """``act(gate) * up`` of ``halves`` (a split's variable; each half of type ``half``) as
        one gated GEMM, or None where they are not the halves of a fused projection the
        rewrite takes."""
        split = _binding(self, halves, "relax.split")
        if split is None or not self._halves_of_last_axis(split):
            return None
        product = split.args[0]
        reshape = _binding(self, product, "relax.reshape")
        if reshape is not None and not _same_last_extent(reshape.args[0], product):
            return None  # a view that regroups the product's rows: its halves are not gate and up
        found = self._product(reshape.args[0] if reshape is not None else product)
        if found is None:
            return None
        x, w = found
        rows, depth = x.ty.shape.values
        width, w_depth = w.ty.shape.values
        if not isinstance(width, tirx.IntImm) or int(width) % 2:
            return None
        out = self._call_gated(x, [w], rows, int(width) // 2, depth, w_depth, True, activation)
        return out if out is None or half.ndim == 2 else relax.op.reshape(out, half.shape)

    def _call_gated(self, x, weights: list, rows, width: int, depth, w_depth, fused_weight: bool,
                    activation: str) -> relax.Expr | None:
        """A call of the gated GEMM (gate ``activation``) of ``width`` outputs over ``x`` and
        ``weights``, or None where the depths are not one constant or the family does not take
        the layer."""
        if not all(isinstance(e, tirx.IntImm) for e in (depth, w_depth)) or int(depth) != int(w_depth):
            return None
        dtype = x.ty.dtype
        # rows of its own (bound by X's shape when called): one function for every layer's call
        key = (int(rows) if isinstance(rows, tirx.IntImm) else str(rows.ty.dtype), int(width), int(depth), dtype,
               fused_weight, activation)
        if key not in self.functions:
            own_rows = rows if isinstance(rows, tirx.IntImm) else tirx.Var("rows", rows.ty.dtype)
            taken = family_takes(int(width), int(depth), dtype, fused_weight, activation)
            self.functions[key] = add_opaque_function(self.builder_, gated_dense(
                own_rows, int(width), int(depth), dtype, fused_weight=fused_weight, activation=activation),
                "gated_projection") if taken else None
        callee = self.functions[key]
        if callee is None:
            return None
        return self.builder_.emit(relax.call_tir(callee, [x, *weights], relax.TensorType([rows, int(width)], dtype)))

    @staticmethod
    def _halves_of_last_axis(split: relax.Call) -> bool:
        """Whether ``split`` cuts the last axis into two halves: two sections, or one index at
        the middle (torch's ``chunk(2)`` as the importer writes it)."""
        sections, axis = split.attrs.indices_or_sections, int(split.attrs.axis)
        ndim = split.args[0].ty.ndim
        if axis not in (-1, ndim - 1):
            return False
        if isinstance(sections, tirx.IntImm):
            return int(sections) == 2
        width = _last_extent(split.args[0])
        return (len(sections) == 1 and width is not None and isinstance(sections[0], tirx.IntImm)
                and 2 * int(sections[0]) == width)


def _last_extent(tensor: relax.Expr) -> int | None:
    """The last extent of ``tensor`` where it is a constant, else None."""
    extent = tensor.ty.shape.values[-1] if tensor.ty.shape is not None else None
    return int(extent) if isinstance(extent, tirx.IntImm) else None


def _same_last_extent(a: relax.Expr, b: relax.Expr) -> bool:
    """Whether tensors ``a`` and ``b`` have one constant last extent."""
    return _last_extent(a) is not None and _last_extent(a) == _last_extent(b)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.FuseGatedProjections")
def FuseGatedProjections(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Every Relax function of ``mod`` with its fused gate/up projections made gated GEMMs (see
    the module docstring)."""
    return rewrite_functions(mod, _GatedProjectionRewriter(mod))
