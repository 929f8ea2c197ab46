"""tvm_dsm.transform.product_halves: a product over a fused gate/up weight, its epilogue reading
two columns of it, as the gated layer's two products (Phi-3's and vLLM's form, written in one
function)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.script import tirx as T

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


@T.prim_func(s_tir=True)
def _product_updated_in_place(x: T.Buffer((4, 16), "float32"), w: T.Buffer((32, 16), "float32"),
                              out: T.Buffer((4, 16), "float32")):
    y = T.sblock_alloc_buffer((4, 32))
    for i, j, k in T.grid(4, 32, 16):
        with T.sblock("y"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                y[vi, vj] = T.float32(0)
            y[vi, vj] = y[vi, vj] + x[vi, vk] * w[vj, vk]
    for i, j in T.grid(4, 32):
        with T.sblock("scale"):
            vi, vj = T.axis.remap("SS", [i, j])
            y[vi, vj] = y[vi, vj] * T.float32(2)
    for i, j in T.grid(4, 16):
        with T.sblock("out"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = y[vi, vj] * y[vi, vj + 16]


@T.prim_func(s_tir=True)
def _columns_on_a_split_loop(x: T.Buffer((4, 16), "float32"), w: T.Buffer((32, 16), "float32"),
                             out: T.Buffer((4, 16), "float32")):
    y = T.sblock_alloc_buffer((4, 32))
    for i, j0, j1, k in T.grid(4, 4, 8, 16):
        with T.sblock("y"):
            vi = T.axis.spatial(4, i)
            vj = T.axis.spatial(32, j0 * 8 + j1)
            vk = T.axis.reduce(16, k)
            with T.init():
                y[vi, vj] = T.float32(0)
            y[vi, vj] = y[vi, vj] + x[vi, vk] * w[vj, vk]
    for i, j in T.grid(4, 16):
        with T.sblock("out"):
            vi, vj = T.axis.remap("SS", [i, j])
            out[vi, vj] = y[vi, vj] * y[vi, vj + 16]


def test_products_it_cannot_split_in_halves_are_left_as_written():
    """W times itself (its rows are read at the row index too: shifting W's loads would shift
    both), a later update of Y in place (it reads both halves' columns as one tensor), and
    columns bound to a split loop (no one loop to narrow)."""
    n, k = 8, 16
    w = te.placeholder((2 * n, k), "float32", name="w")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((2 * n, 2 * n), lambda i, j: te.sum(w[i, r] * w[j, r], axis=r), name="y")
    gram = te.create_prim_func([w, te.compute((2 * n, n), lambda i, j: y[i, j] * y[i, j + n], name="out")])
    assert products_of_halves(gram) is None
    assert products_of_halves(_columns_on_a_split_loop) is None
    assert products_of_halves(_product_updated_in_place) is None
