"""Functions no family takes and dlight cannot schedule whole build one schedule per operator."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import TARGET
from tvm import te

import tvm_dsm
from tvm_dsm.gpu.suites.generality import FFNS, dense, ffn
from tvm_dsm.transform.split_operators import merge_operators, split_operators
from tvm_dsm.workloads.chains import swiglu_ffn
from tvm_dsm.workloads.norms import topi_norm


@pytest.mark.parametrize("rows", [24, te.var("m")], ids=["constant_rows", "symbolic_rows"])
def test_split_then_merge_computes_the_same_on_llvm(rows):
    func = ffn(rows, 40, 16, 8, "float32", nk=False)
    operators = split_operators(func)
    assert [len(op.outputs) for op in operators] == [1, 1]
    assert operators[0].outputs[0].same_as(operators[1].inputs[0])  # H passes between them
    merged = merge_operators(func, [op.func for op in operators])
    rng = np.random.default_rng()
    shapes = [[24 if isinstance(d, tvm.tirx.Var) else int(d) for d in p.ty.shape] for p in func.params]
    args = [rng.standard_normal(shape).astype("float32") for shape in shapes]
    outs = []
    for f in (func, merged):
        tensors = [tvm.runtime.tensor(a) for a in args[:-1]] + [tvm.runtime.tensor(np.full_like(args[-1], np.nan))]
        tvm.compile(tvm.IRModule({"main": f}), target="llvm")(*tensors)
        outs.append(tensors[-1].numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6)
    a, w1, w2 = (x.astype(np.float64) for x in args[:3])
    ref = np.maximum(a @ w1, 0) @ w2
    assert np.linalg.norm(outs[1] - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("shape", FFNS, ids=lambda s: "x".join(map(str, s[:4])) + f"_{s[4]}_{'nk' if s[5] else 'kn'}")
def test_ffns_no_family_fuses_build_per_operator(shape):
    source = tvm_dsm.build(ffn(*shape), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") >= 4  # at least one kernel per GEMM, declared and defined


def test_a_function_without_a_root_block_is_left_to_tvm():
    """An extern call has no s_tir root block: every family says no (none raises), and the
    function builds the way stock TVM builds it."""
    x = te.placeholder((64, 64), "float32", name="x")
    y = te.extern((64, 64), [x], lambda ins, outs: tvm.tirx.call_packed("my.op", ins[0], outs[0]), name="y")
    func = te.create_prim_func([x, y])
    with pytest.raises(tvm_dsm.ClusterError, match="no tvm-dsm schedule family applies"):
        tvm_dsm.plan(func)
    tvm_dsm.build(func, TARGET)


def test_prime_batch_dense_builds():
    assert "__global__" in tvm_dsm.build(dense(37, 1024, 512, "bfloat16"), TARGET).mod.imports[0].inspect_source()


@pytest.mark.parametrize("m", [3, 7, 13])  # (two rows: the row GEMV's, tests/test_row_gemv.py)
def test_decode_batch_dense_takes_the_gemm_family_with_rows_padded_inside(m):
    assert tvm_dsm.plan(dense(m, 2048, 2048, "float16")).family.name == "split_k_gemm"
    source = tvm_dsm.build(dense(m, 2048, 2048, "float16"), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") == 2  # the GEMM alone: no kernel copies rows (declared and defined)
    assert "mma" in source  # tensor cores


def test_an_ffn_of_symbolic_rows_builds_per_operator():
    source = tvm_dsm.build(ffn(te.var("m"), 1024, 512, 256, "float16", False), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") >= 4  # at least one kernel per GEMM, declared and defined


def test_matmuls_are_told_from_reductions_of_one_tensor():
    assert [op.matmul for op in split_operators(swiglu_ffn(1, 256, 128, 128))] == [True, True, True]
    assert not any(op.matmul for op in split_operators(topi_norm("layer_norm", 4, 64, "float16")))


def test_a_single_row_swiglu_chain_takes_a_gemv_per_matmul_not_a_thread_per_output():
    """No chain plan takes M = 1, and dlight's only schedule for the whole function is its
    Fallback rule (every output element a thread, its K loop serial: 13 ms on the GPU where the
    operators take 40 us): each matmul is scheduled as an operator of its own."""
    source = tvm_dsm.build(swiglu_ffn(1, 8192, 2048, 2048), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") >= 6  # a kernel per GEMM, declared and defined
    assert "__shfl" in source  # the GEMV's warp reductions
