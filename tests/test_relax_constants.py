"""Tensors computed from constants alone are evaluated at compile time
(tvm_dsm.relax_constants): their kernels are gone and the values are the same; a model's
large constants and symbolic shapes are left as they are."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

from conftest import LLVM
from tvm_dsm.relax_constants import MAX_SOURCE_ELEMENTS, FoldConstantTensors


def _ops(mod) -> list[str]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return found


def _masked(rows) -> tvm.IRModule:
    """``x + mask`` where the mask is built as a traced model builds one: ``arange`` compared
    into a causal keep, a window of it assigned into a zero image (``slice_scatter``), the fill
    selected by ``where``, a unit axis added."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, 16, 16), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            i = bb.emit(relax.op.arange(0, 16, 1, "int64"))
            keep = bb.emit(relax.op.less_equal(relax.op.expand_dims(i, 0), relax.op.expand_dims(i, 1)))
            zeros = bb.emit(relax.op.full((16, 16), relax.const(0.0, "float16"), "float16"))
            band = bb.emit(relax.op.full((4, 16), relax.const(1.0, "float16"), "float16"))
            image = bb.emit(relax.op.slice_scatter(zeros, band, 4, 8, 1, axis=0))
            mask = bb.emit(relax.op.where(keep, image, relax.const(-1e4, "float16")))
            out = bb.emit_output(relax.op.add(x, relax.op.expand_dims(mask, 0)))
        bb.emit_func_output(out)
    return bb.get()


def test_a_mask_built_from_constants_is_one_constant():
    mod = _masked(3)
    folded = FoldConstantTensors(mod)
    assert _ops(folded) == ["relax.expand_dims", "relax.add"] or _ops(folded) == ["relax.add"], _ops(folded)
    x = np.random.default_rng(0).standard_normal((3, 16, 16)).astype("float16")
    got, want = (relax.VirtualMachine(tvm.compile(m, target=LLVM), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
                 for m in (folded, mod))
    np.testing.assert_array_equal(got, want)


def test_symbolic_shapes_and_a_models_weights_stay():
    """A mask whose extent is a symbolic row count is computed where it runs; a weight above
    MAX_SOURCE_ELEMENTS (bound as a constant, as torch's importer binds them) is not transposed
    at compile time (that would change the product's layout and copy the weight)."""
    rows = tirx.Var("rows", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, 16), "float16"))
    with bb.function("main", [x]):
        ones = bb.emit(relax.op.full(relax.ShapeExpr([rows, 16]), relax.const(1.0, "float16"), "float16"))
        bb.emit_func_output(bb.emit(relax.op.add(x, bb.emit(relax.op.cumsum(ones, axis=1)))))
    assert "relax.cumsum" in _ops(FoldConstantTensors(bb.get()))
    side = int(np.sqrt(MAX_SOURCE_ELEMENTS)) * 2
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, side), "float16"))
    with bb.function("main", [x]):
        w = relax.const(np.ones((side, side), "float16"))
        bb.emit_func_output(bb.emit(relax.op.matmul(x, bb.emit(relax.op.permute_dims(w, [1, 0])))))
    mod = bb.get()
    assert "relax.permute_dims" in _ops(FoldConstantTensors(mod))


def _rotated(tokens: int, table_rows: int) -> tvm.IRModule:
    """``x * cos[:tokens][None, None]`` over a RoPE table of ``table_rows`` positions bound as a
    constant, as torch's importer binds a traced model's non-persistent buffer."""
    table = np.cos(np.arange(table_rows * 64, dtype=np.float64).reshape(table_rows, 64) / 997).astype("float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 4, tokens, 64), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            part = bb.emit(relax.op.strided_slice(relax.const(table), [0], [0], [tokens]))
            out = bb.emit_output(relax.op.multiply(x, relax.op.expand_dims(part, [0, 1])))
        bb.emit_func_output(out)
    return bb.get()


def test_a_small_part_of_a_large_table_is_folded_a_large_part_is_not():
    """RoPE's ``cos[:t]`` of a table past MAX_SOURCE_ELEMENTS is one constant of its t rows (a
    kernel a call before); a part as large as that is copied where it runs, as a weight is."""
    table_rows = MAX_SOURCE_ELEMENTS // 64 * 4
    mod = _rotated(96, table_rows)
    folded = FoldConstantTensors(mod)
    assert "relax.strided_slice" not in _ops(folded), _ops(folded)
    x = np.random.default_rng(0).standard_normal((2, 4, 96, 64)).astype("float16")
    got, want = (relax.VirtualMachine(tvm.compile(m, target=LLVM), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
                 for m in (folded, mod))
    np.testing.assert_array_equal(got, want)
    assert "relax.strided_slice" in _ops(FoldConstantTensors(_rotated(table_rows // 2, table_rows)))
