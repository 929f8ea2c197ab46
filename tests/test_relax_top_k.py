"""tvm_dsm.relax_top_k: which R.topk calls become the top-k rows kernel's function, and that the
rest stay Relax's."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax, tirx

from tvm_dsm.relax_matmuls import is_op_call
from tvm_dsm.relax_top_k import TopKAsRows, family_takes


def _module(shape, x_dtype="float16", softmax=True, **topk):
    """``main(x) = R.topk(R.nn.softmax(x), **topk)`` (without the softmax where not ``softmax``)
    of a tensor of ``shape`` (a str extent is symbolic)."""
    dims = [tirx.Var(d, "int64") if isinstance(d, str) else d for d in shape]
    x = relax.Var("x", relax.TensorType(dims, x_dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            probs = bb.emit(relax.op.nn.softmax(x)) if softmax else x
            out = bb.emit_output(relax.op.topk(probs, **topk))
        bb.emit_func_output(out)
    return bb.get()


def _kept(mod: tvm.IRModule) -> bool:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(is_op_call(e, "relax.topk")))
    return any(found)


@pytest.mark.parametrize("shape, dtype, topk", [
    (("tokens", 64), "float16", {"k": 4, "ret_type": "both"}),
    ((96, 256), "float32", {"k": 8, "ret_type": "values"}),
    (("tokens", 8), "bfloat16", {"k": 2, "ret_type": "indices"}),
    (("tokens", 8), "float32", {"k": 2, "dtype": "int64"}),  # torch's indices (Mixtral's router)
])
def test_a_router_top_k_becomes_the_kernels_function(shape, dtype, topk):
    out = TopKAsRows(_module(shape, dtype, **topk))
    assert not _kept(out)
    func = out["top_k"]
    assert int(func.attrs["op_pattern"]) == 8  # kept out of Relax's fusion
    assert [str(p.ty.dtype) for p in func.params] == [dtype, dtype, topk.get("dtype", "int32")]


@pytest.mark.parametrize("shape, topk", [
    (("tokens", 64), {"k": 4, "largest": False}),   # the smallest: not the kernel's order
    ((4, "tokens"), {"k": 2, "axis": 0}),            # over the rows
    ((2, 8, 64), {"k": 4}),                          # 3-D
    (("tokens", 101), {"k": 4}),                     # rows of no whole 4-byte pieces
])
def test_any_other_top_k_is_left_to_relax(shape, topk):
    assert _kept(TopKAsRows(_module(shape, **topk)))


def test_a_top_k_of_anything_but_probabilities_is_left_to_relax():
    """Logits may hold -inf (masked experts), which R.topk returns with its index and the
    kernel's empty slot (the lowest finite value, index -1) ranks below."""
    assert _kept(TopKAsRows(_module(("tokens", 64), softmax=False, k=4)))


def test_a_row_count_that_is_an_expression_is_left_to_relax():
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([b, s, 64], "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(x, relax.ShapeExpr([b * s, 64])))
            out = bb.emit_output(relax.op.topk(bb.emit(relax.op.nn.softmax(rows)), k=4))
        bb.emit_func_output(out)
    assert _kept(TopKAsRows(bb.get()))


def test_two_different_top_ks_get_two_symbols_and_compile():
    """Routers of two widths in one model: two functions, each its own symbol, both taken."""
    from conftest import TARGET
    from tvm_dsm.relax_pipeline import schedule_kernels

    n = tirx.Var("n", "int64")
    xs = [relax.Var("x0", relax.TensorType([n, 64], "float16")), relax.Var("x1", relax.TensorType([n, 256], "float32"))]
    bb = relax.BlockBuilder()
    with bb.function("main", xs):
        with bb.dataflow():
            outs = [bb.emit(relax.op.topk(bb.emit(relax.op.nn.softmax(x)), k=k)) for x, k in zip(xs, (4, 8))]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    rewritten = TopKAsRows(bb.get())
    symbols = [str(f.attrs["global_symbol"]) for gv, f in rewritten.functions.items() if gv.name_hint.startswith("top_k")]
    assert len(symbols) == 2 and len(set(symbols)) == 2
    taken = schedule_kernels(bb.get(), tvm.target.Target(TARGET))[1]
    assert sorted(w for name, w in taken.items() if name.startswith("top_k")) == ["top_k_rows", "top_k_rows"]


def test_the_family_check_names_what_it_takes():
    assert family_takes("float16", 64, 4) and family_takes("float32", 4096, 8)
    assert family_takes("float16", 100, 4)  # 100 halves: 8-byte pieces
    assert not family_takes("float16", 101, 4)  # no whole 4-byte pieces
