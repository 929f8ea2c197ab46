"""tvm_dsm.relax_top_k: which R.topk calls become the top-k rows kernel's function, and that the
rest stay Relax's."""

from __future__ import annotations

import pytest
import tvm
from tvm import relax, tirx

from tvm_dsm.relax_matmuls import is_op_call
from tvm_dsm.relax_top_k import TopKAsRows, family_takes


def _module(shape, dtype="float16", **topk):
    """``main(x) = R.topk(x, **topk)`` of a tensor of ``shape`` (a str extent is symbolic)."""
    dims = [tirx.Var(d, "int64") if isinstance(d, str) else d for d in shape]
    x = relax.Var("x", relax.TensorType(dims, dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.topk(x, **topk))
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
])
def test_a_router_top_k_becomes_the_kernels_function(shape, dtype, topk):
    out = TopKAsRows(_module(shape, dtype, **topk))
    assert not _kept(out)
    func = out["top_k"]
    assert int(func.attrs["op_pattern"]) == 8  # kept out of Relax's fusion
    assert [str(p.ty.dtype) for p in func.params] == [dtype, dtype, "int32"]


@pytest.mark.parametrize("shape, topk", [
    (("tokens", 64), {"k": 4, "largest": False}),   # the smallest: not the kernel's order
    ((4, "tokens"), {"k": 2, "axis": 0}),            # over the rows
    ((2, 8, 64), {"k": 4}),                          # 3-D
    (("tokens", 64), {"k": 4, "dtype": "int64"}),    # int64 indices: the kernel writes int32
    (("tokens", 100), {"k": 4}),                     # rows of no whole 16-byte pieces
])
def test_any_other_top_k_is_left_to_relax(shape, topk):
    assert _kept(TopKAsRows(_module(shape, **topk)))


def test_the_family_check_names_what_it_takes():
    assert family_takes("float16", 64, 4) and family_takes("float32", 4096, 8)
    assert not family_takes("float16", 100, 4)  # 100 halves: no whole 16-byte pieces
