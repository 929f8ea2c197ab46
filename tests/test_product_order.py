"""Products written in another order than the GEMM families read them
(tvm_dsm.transform.product_order): the reduction bound first, a transposed output. The reordered
function computes what the written one does (both run by TVM's llvm build), and the families
take it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, tirx
from tvm.script import tirx as T

import tvm_dsm
from tvm_dsm.transform.product_order import products_in_gemm_order

from conftest import LLVM, TARGET


def reduction_first(size: int):
    """C = A @ B in fp16 with the reduction iterator bound first, as TVMScript lets one write it."""

    @T.prim_func(s_tir=True)
    def func(A: T.Buffer((size, size), "float16"), B: T.Buffer((size, size), "float16"),
             C: T.Buffer((size, size), "float32")):
        for k, i, j in T.grid(size, size, size):
            with T.sblock("C"):
                vk, vi, vj = T.axis.remap("RSS", [k, i, j])
                with T.init():
                    C[vi, vj] = T.float32(0)
                C[vi, vj] = C[vi, vj] + T.Cast("float32", A[vi, vk]) * T.Cast("float32", B[vk, vj])

    return func


def transposed_output(m: int, n: int, k: int):
    """``C[n, m] = sum_k x[m, k] w[n, k]``: the product written into its transpose."""
    x = te.placeholder((m, k), "float16", name="x")
    w = te.placeholder((n, k), "float16", name="w")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((n, m), lambda j, i: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r),
                   name="c")
    out = te.compute(c.shape, lambda j, i: c[j, i].astype("float16"), name="out")
    return te.create_prim_func([x, w, out])


def _on_llvm(func, inputs, out_shape, out_dtype):
    out = tvm.runtime.tensor(np.zeros(out_shape, out_dtype))
    tvm.compile(func, target=LLVM)(*(tvm.runtime.tensor(a) for a in inputs), out)
    return out.numpy()


@pytest.mark.parametrize("build", ["reduction_first", "transposed_output"])
def test_the_reordered_product_computes_what_the_written_one_does(build):
    func = reduction_first(48) if build == "reduction_first" else transposed_output(40, 24, 56)
    ordered = products_in_gemm_order(func)
    block = next(b for b in tvm_dsm.ir.find_all(ordered.body, tvm.s_tir.SBlock) if b.name_hint in ("C", "c"))
    assert [int(iv.iter_type) for iv in block.iter_vars] == [0, 0, 2]
    first = block.reads[0] if not block.reads[0].source.same_as(block.writes[0].source) else block.reads[1]
    assert first.region[0].min.same_as(block.iter_vars[0].var)  # the operand of the output's row first
    shapes = [[int(x) for x in p.ty.shape] for p in func.params]
    rng = np.random.default_rng()
    inputs = [rng.standard_normal(s).astype("float16") for s in shapes[:-1]]
    dtype = str(func.params[-1].ty.dtype)
    np.testing.assert_array_equal(_on_llvm(ordered, inputs, shapes[-1], dtype),
                                  _on_llvm(func, inputs, shapes[-1], dtype))


def test_a_product_in_the_gemm_order_is_left_alone():
    x = te.placeholder((64, 32), "float16", name="x")
    w = te.placeholder((16, 32), "float16", name="w")
    r = te.reduce_axis((0, 32), name="r")
    c = te.compute((64, 16), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r))
    assert products_in_gemm_order(te.create_prim_func([x, w, c])) is None


@pytest.mark.parametrize("build", ["reduction_first", "transposed_output"])
def test_the_split_k_family_takes_them(build, assemble):
    func = reduction_first(1024) if build == "reduction_first" else transposed_output(1024, 4096, 1024)
    assert tvm_dsm.plan(func).family.name == "split_k_gemm"
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert assemble(source, f"product_order_{build}")


@pytest.mark.gpu
@pytest.mark.parametrize("build", ["reduction_first", "transposed_output"])
def test_gpu_they_match_float64(build):
    func = reduction_first(1024) if build == "reduction_first" else transposed_output(1024, 4096, 1024)
    shapes = [[int(x) for x in p.ty.shape] for p in func.params]
    rng = np.random.default_rng()
    a, b = (rng.standard_normal(s).astype("float16") for s in shapes[:2])
    dev = tvm.cuda(0)
    out_dtype = str(func.params[-1].ty.dtype)
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, out_dtype), dev)
    tvm_dsm.build(func, TARGET)(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), out)
    want = a.astype(np.float64) @ b.astype(np.float64) if build == "reduction_first" else (
        b.astype(np.float64) @ a.astype(np.float64).T)
    got = out.numpy().astype(np.float64)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3
