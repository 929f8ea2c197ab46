"""tvm_dsm.transform.product_halves: a product over a fused gate/up weight, its epilogue reading
two columns of it, as the gated layer's two products (Phi-3's and vLLM's form, written in one
function)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_dsm
from tvm_dsm.ir import root_blocks
from tvm_dsm.transform.product_halves import products_of_halves

from conftest import LLVM


def _fused_gate_up(m: int, n: int, k: int, gate_second: bool = False, offset: int | None = None):
    """``Y = X @ W^T`` over ``W[2n, k]``, then ``silu(Y[:, :n]) * Y[:, n:]`` (the halves the
    other way round with ``gate_second``; ``offset``: the second column read at ``j + offset``
    instead of ``j + n``)."""
    x = te.placeholder((m, k), "float16", name="x")
    w = te.placeholder((2 * n, k), "float16", name="w_gate_up")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((m, 2 * n), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r),
                   name="y")
    second = n if offset is None else offset

    def gated(i, j):
        gate, up = (y[i, j + second], y[i, j]) if gate_second else (y[i, j], y[i, j + second])
        return (gate * te.sigmoid(gate) * up).astype("float16")

    return te.create_prim_func([x, w, te.compute((m, n), gated, name="out")])


def _run_llvm(func, x, w, n):
    out = tvm.runtime.tensor(np.full((x.shape[0], n), np.nan, "float16"))
    tvm.compile(tvm.IRModule({"main": func}), target=LLVM)(tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
    return out.numpy()


@pytest.mark.parametrize("gate_second", [False, True])
def test_the_two_products_compute_what_the_fused_one_did(gate_second):
    """Each product sums the same terms in the same order as the columns it replaces: the
    outputs are bit-identical (on the CPU)."""
    m, n, k = 16, 24, 64
    func = _fused_gate_up(m, n, k, gate_second)
    halves = products_of_halves(func)
    assert halves is not None and [b.name_hint for b in root_blocks(halves)] == ["y_gate", "y_up", "out"]
    rng = np.random.default_rng()
    x = rng.standard_normal((m, k)).astype("float16")
    w = (rng.standard_normal((2 * n, k)) / 8).astype("float16")
    want = _run_llvm(func, x, w, n)
    assert not np.isnan(want).any() and np.array_equal(_run_llvm(halves, x, w, n), want)


def test_an_epilogue_reading_other_columns_is_left_as_written():
    assert products_of_halves(_fused_gate_up(16, 24, 64, offset=1)) is None


def test_the_user_form_is_planned_as_a_gated_gemm():
    ranking = tvm_dsm.plan(_fused_gate_up(256, 8192, 2048))
    assert ranking.family.name == "split_k_gemm"
    assert (ranking.shape.products, ranking.shape.outputs) == (2, 1)
