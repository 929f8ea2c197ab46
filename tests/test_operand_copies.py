"""Products whose operands are copies of a parameter (TOPI's split) read the parameter in place,
the form the gated GEMM families take."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import LLVM, TARGET, relative_error_on_gpu
from tvm import te, topi

import tvm_dsm
from tvm_dsm.transform.operand_copies import copies_inlined


def _swiglu_over_split_weight(m: int, h: int, i: int, dtype: str = "float16"):
    """A gated layer whose fused gate/up weight ``[2I, H]`` is cut by ``topi.split``."""
    x = te.placeholder((m, h), dtype, name="x")
    w = te.placeholder((2 * i, h), dtype, name="gate_up")
    wg, wu = topi.split(w, 2, axis=0)
    g, u = (topi.nn.dense(x, part, out_dtype="float32") for part in (wg, wu))
    o = te.compute((m, i), lambda a, b: (g[a, b] * te.sigmoid(g[a, b]) * u[a, b]).astype(dtype), name="swiglu")
    return te.create_prim_func([x, w, o])


def _swiglu_reference(x, w):
    i = w.shape[0] // 2
    g, u = x @ w[:i].T, x @ w[i:].T
    return g / (1 + np.exp(-g)) * u


def test_inlined_copies_compute_the_same_on_llvm():
    func = _swiglu_over_split_weight(5, 32, 24, "float32")
    inlined = copies_inlined(func)
    assert inlined is not None
    rng = np.random.default_rng()
    x, w = rng.standard_normal((5, 32)).astype("float32"), rng.standard_normal((48, 32)).astype("float32")
    outs = []
    for f in (func, inlined):
        out = tvm.runtime.tensor(np.full((5, 24), np.nan, "float32"))
        tvm.compile(tvm.IRModule({"main": f}), target=LLVM)(tvm.runtime.tensor(x), tvm.runtime.tensor(w), out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[1], outs[0])
    ref = _swiglu_reference(x.astype(np.float64), w.astype(np.float64))
    assert np.linalg.norm(outs[1] - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("m", [1, 512])
def test_a_gated_layer_over_a_split_weight_is_the_gated_gemm(m):
    """One kernel (row GEMV or gated split-K GEMM) where the operators apart made four: the
    weight's halves copied out, each product, the epilogue."""
    func = _swiglu_over_split_weight(m, 1536, 8960)
    tvm_dsm.plan(func)  # a family takes it (at one row the fused cascade's GEMV)
    assert tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source().count("__global__") == 2


def test_copies_read_by_other_than_products_stay():
    x = te.placeholder((64, 64), "float16", name="x")
    y = topi.strided_slice(x, [0, 0], [64, 32])
    assert copies_inlined(te.create_prim_func([x, topi.exp(y)])) is None


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 200])
def test_gpu_a_gated_layer_over_a_split_weight_matches_float64(m):
    rng = np.random.default_rng(11)
    inputs = [rng.uniform(-1, 1, (m, 512)), rng.uniform(-1, 1, (2 * 768, 512)) * 2 / np.sqrt(512)]
    err = relative_error_on_gpu(_swiglu_over_split_weight(m, 512, 768), inputs, _swiglu_reference, (m, 768),
                                "float16")
    assert err < 2e-3
