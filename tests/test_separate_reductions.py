"""Independent reductions accumulated in one block, split one block per reduction
(tvm_dsm.transform.separate_reductions): the same values bit for bit, arg-max's pair of stores
that read each other left as written, and the LayerNorm that sums x and x * x in one block
planned by the row-norm family."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, tirx
from tvm.script import tirx as T

import tvm_dsm
from tvm_dsm.ir import root_blocks
from tvm_dsm.transform.separate_reductions import reductions_apart


def _moments_layer_norm(rows: int | None = 100, width: int = 1024):
    """LayerNorm as Relax's legalization once wrote it, in TVMScript with int64 indices: the sum
    and the sum of squares in one block, fp16 in and out (``rows`` None: a symbolic count)."""
    s, h = (T.int64(rows) if rows is not None else tirx.Var("s", "int64")), T.int64(width)
    inv = 1.0 / width

    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((T.int64(1), s, h), "float16"), g: T.Buffer((h,), "float16"),
             b: T.Buffer((h,), "float16"), out: T.Buffer((T.int64(1), s, h), "float16")):
        T.func_attr({"tir.noalias": True})
        red = T.alloc_buffer((T.int64(1), s), "float32")
        red2 = T.alloc_buffer((T.int64(1), s), "float32")
        for a0, a1, k in T.grid(T.int64(1), s, h):
            with T.sblock("x_red"):
                v0, v1, vk = T.axis.remap("SSR", [a0, a1, k])
                with T.init():
                    red[v0, v1] = T.float32(0)
                    red2[v0, v1] = T.float32(0)
                red[v0, v1] = red[v0, v1] + T.Cast("float32", x[v0, v1, vk])
                red2[v0, v1] = red2[v0, v1] + T.Cast("float32", x[v0, v1, vk]) * T.Cast("float32", x[v0, v1, vk])
        for a0, a1, a2 in T.grid(T.int64(1), s, h):
            with T.sblock("ln"):
                v0, v1, v2 = T.axis.remap("SSS", [a0, a1, a2])
                out[v0, v1, v2] = T.Cast("float16", (T.Cast("float32", x[v0, v1, v2]) - red[v0, v1] * T.float32(inv))
                                         * T.rsqrt(red2[v0, v1] * T.float32(inv) - red[v0, v1] * T.float32(inv)
                                                   * (red[v0, v1] * T.float32(inv)) + T.float32(1e-5))
                                         * T.Cast("float32", g[v2]) + T.Cast("float32", b[v2]))

    return main


def _arg_max(rows: int = 8, width: int = 64):
    """Arg-max as a TE tuple reducer: each store reads both accumulators."""
    x = te.placeholder((rows, width), "float32", name="x")
    reducer = te.comm_reducer(
        lambda p, q: (tirx.Select(p[1] >= q[1], p[0], q[0]), tirx.Select(p[1] >= q[1], p[1], q[1])),
        lambda t0, t1: (tirx.const(-1, t0), tirx.min_value(t1)), name="argmax")
    k = te.reduce_axis((0, width), "k")
    index, value = te.compute((rows,), lambda i: reducer((k, x[i, k]), axis=k), name="best")
    return te.create_prim_func([x, index, value])


@T.prim_func(s_tir=True)
def _init_reads_the_other(x: T.Buffer((4, 8), "float32"), a: T.Buffer((4,), "float32"),
                          b: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 8):
        with T.sblock("r"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                a[vi] = T.float32(0)
                b[vi] = a[vi]
            a[vi] = a[vi] + x[vi, vk]
            b[vi] = b[vi] + x[vi, vk] * x[vi, vk]


@T.prim_func(s_tir=True)
def _predicate_reads_the_other(x: T.Buffer((4, 8), "float32"), a: T.Buffer((4,), "float32"),
                               b: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 8):
        with T.sblock("r"):
            vi, vk = T.axis.remap("SR", [i, k])
            T.where(a[i] < T.float32(2))
            with T.init():
                a[vi] = T.float32(0)
                b[vi] = T.float32(0)
            a[vi] = a[vi] + x[vi, vk]
            b[vi] = b[vi] + x[vi, vk]


@T.prim_func(s_tir=True)
def _one_buffer_initialized_twice(x: T.Buffer((4, 8), "float32"), a: T.Buffer((4,), "float32"),
                                  b: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 8):
        with T.sblock("r"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                a[vi] = T.float32(1)
                a[vi] = T.float32(0)
            a[vi] = a[vi] + x[vi, vk]
            b[vi] = b[vi] + x[vi, vk]


@pytest.mark.parametrize("func", [_init_reads_the_other, _predicate_reads_the_other, _one_buffer_initialized_twice],
                         ids=["init", "predicate", "inits"])
def test_reductions_that_read_each_other_outside_their_updates_are_left_as_written(func):
    """An init that starts one sum at the other's start, a predicate over the other's running
    sum (apart, each would read the other's finished value), or two inits of one sum and none
    of the other."""
    assert reductions_apart(func) is None


def _run_llvm(func, args):
    lib = tvm.compile(tvm.IRModule({"main": func}), "llvm")
    arrays = [tvm.runtime.tensor(a) for a in args]
    lib(*arrays)
    return arrays[-1].numpy()


def test_the_reductions_of_one_block_get_a_block_each_and_compute_the_same_values():
    func = _moments_layer_norm(7, 64)
    split = reductions_apart(func)
    assert [b.name_hint for b in root_blocks(split)] == ["x_red_0", "x_red_1", "ln"]
    assert all(len(b.writes) == 1 and len(b.reads) == 1 for b in root_blocks(split)[:2])
    rng = np.random.default_rng()
    args = [rng.standard_normal((1, 7, 64)).astype("float16"), rng.uniform(0.5, 1.5, 64).astype("float16"),
            rng.uniform(-0.5, 0.5, 64).astype("float16"), np.full((1, 7, 64), np.nan, "float16")]
    want, got = _run_llvm(func, args), _run_llvm(split, args)
    assert not np.isnan(got).any() and np.array_equal(got, want)


def test_a_tuple_reducer_whose_stores_read_each_other_is_left_as_written():
    assert reductions_apart(_arg_max()) is None


def test_a_function_without_such_a_block_is_left_as_written():
    x = te.placeholder((4, 8), "float32", name="x")
    k = te.reduce_axis((0, 8), "k")
    assert reductions_apart(te.create_prim_func([x, te.compute((4,), lambda i: te.sum(x[i, k], axis=k))])) is None


@pytest.mark.parametrize("rows", [1, 100])
def test_a_layer_norm_summing_x_and_its_square_in_one_block_is_a_row_norm(rows):
    assert tvm_dsm.plan(_moments_layer_norm(rows)).family.name == "row_norm"


def test_over_a_symbolic_row_count_too():
    from tvm_dsm.driver import schedule_row_ranges

    kernels, _ = schedule_row_ranges(_moments_layer_norm(None))
    assert {kernel.family.name for kernel in kernels} == {"row_norm"}
