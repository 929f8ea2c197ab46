"""reductions_first: a function's top-level blocks in dataflow order with each reduction as
early as its inputs allow; the families take a TOPI gated layer (its gate's sigmoid and product
written between its two matmuls) in that form, and it computes the same values."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, topi

from tvm_dsm import driver
from tvm_dsm.errors import ClusterError
from tvm_dsm.families import match_family
from tvm_dsm.transform.reductions_first import reductions_first
from conftest import LLVM


def _blocks(func) -> list[str]:
    return [line.split('"')[1] for line in func.script().splitlines() if "T.sblock(" in line and '"root"' not in line]


def topi_gated(m: int, n: int, k: int, dtype: str = "float16"):
    """``silu(x @ Wg^T) * (x @ Wu^T)`` as TOPI writes it: the gate's sigmoid and product come
    before the up matmul."""
    x = te.placeholder((m, k), dtype, name="X")
    wg = te.placeholder((n, k), dtype, name="Wg")
    wu = te.placeholder((n, k), dtype, name="Wu")
    gate, up = (topi.nn.dense(x, w, out_dtype="float32") for w in (wg, wu))
    y = topi.cast(topi.multiply(topi.multiply(gate, topi.sigmoid(gate)), up), dtype)
    return te.create_prim_func([x, wg, wu, y])


def test_a_topi_gated_layer_takes_its_matmuls_first():
    func = topi_gated(128, 512, 1024)
    written = _blocks(func)
    assert written.index("T_matmul_NT_1") > written.index("T_multiply")  # TOPI's order
    with pytest.raises(ClusterError):
        match_family(func)
    reordered = _blocks(reductions_first(func))
    assert reordered[:2] == ["T_matmul_NT", "T_matmul_NT_1"]
    assert sorted(reordered) == sorted(written)
    assert driver.plan(func).family.name == "split_k_gemm"  # the reordered form, a gated GEMM


def test_an_order_the_dataflow_fixes_is_kept():
    """A chain's second matmul reads the first's activation: nothing moves (None)."""
    x = te.placeholder((16, 64), "float32", name="X")
    w1 = te.placeholder((128, 64), "float32", name="W1")
    w2 = te.placeholder((64, 128), "float32", name="W2")
    y = topi.nn.dense(topi.nn.relu(topi.nn.dense(x, w1)), w2)
    assert reductions_first(te.create_prim_func([x, w1, w2, y])) is None


def test_the_reordered_function_computes_the_same_values():
    func = topi_gated(6, 40, 24, "float32")
    rng = np.random.default_rng(0)
    x, wg, wu = (rng.uniform(-1, 1, s).astype("float32") for s in ((6, 24), (40, 24), (40, 24)))
    outputs = []
    for f in (func, reductions_first(func)):
        out = tvm.runtime.tensor(np.full((6, 40), np.nan, "float32"))
        tvm.compile(tvm.IRModule({"main": f}), target=LLVM)["main"](
            *(tvm.runtime.tensor(a) for a in (x, wg, wu)), out)
        outputs.append(out.numpy())
    gate = x @ wg.T
    np.testing.assert_allclose(outputs[1], gate / (1 + np.exp(-gate)) * (x @ wu.T), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(outputs[0], outputs[1])
