"""Attention written over merged head axes (GPT-2's packed qkv sliced by index arithmetic, heads
merged in the output) reaches the attention kernel, split into heads and the head dim."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import LLVM, TARGET, relative_error_on_gpu
from tvm import te, topi

import tvm_dsm
from tvm_dsm.transform.merged_heads import heads_apart
from tvm_dsm.transform.rows_as_matrix import over_original_tensors


def _merged_attention(b: int, s: int, h: int, d: int, packed: bool, causal: bool, dtype: str = "float16"):
    """Attention over ``[B, S, H * D]`` tensors as a user writes it in TE: q, k and v sliced from
    one packed projection (``packed``) or three, the output ``[B, S, H * D]``."""
    c = h * d
    if packed:
        qkv = te.placeholder((b, s, 3 * c), dtype, name="qkv")
        inputs = [qkv]
        q = lambda bb, i, hh, dd: qkv[bb, i, hh * d + dd]  # noqa: E731
        k = lambda bb, j, hh, dd: qkv[bb, j, c + hh * d + dd]  # noqa: E731
        v = lambda bb, j, cc: qkv[bb, j, 2 * c + cc]  # noqa: E731
    else:
        qt, kt, vt = (te.placeholder((b, s, c), dtype, name=n) for n in "qkv")
        inputs = [qt, kt, vt]
        q = lambda bb, i, hh, dd: qt[bb, i, hh * d + dd]  # noqa: E731
        k = lambda bb, j, hh, dd: kt[bb, j, hh * d + dd]  # noqa: E731
        v = lambda bb, j, cc: vt[bb, j, cc]  # noqa: E731
    r = te.reduce_axis((0, d), name="r")
    scores = te.compute((b, h, s, s), lambda bb, hh, i, j: te.sum(
        q(bb, i, hh, r).astype("float32") * k(bb, j, hh, r).astype("float32"), axis=r), name="scores")
    scaled = te.compute((b, h, s, s), lambda bb, hh, i, j: (
        te.if_then_else(j <= i, scores[bb, hh, i, j] / float(np.sqrt(d)), -1e4) if causal
        else scores[bb, hh, i, j] / float(np.sqrt(d))), name="scaled")
    p = topi.cast(topi.nn.softmax(scaled, axis=-1), dtype)
    t = te.reduce_axis((0, s), name="t")
    o = te.compute((b, s, c), lambda bb, i, cc: te.sum(
        p[bb, cc // d, i, t].astype("float32") * v(bb, t, cc).astype("float32"), axis=t), name="o")
    return te.create_prim_func([*inputs, topi.cast(o, dtype)])


def _reference(b, s, h, d, packed, causal):
    def attention(*arrays):
        q, k, v = np.split(arrays[0], 3, -1) if packed else arrays
        q, k, v = (a.reshape(b, s, h, d).transpose(0, 2, 1, 3) for a in (q, k, v))
        scores = q @ k.swapaxes(-1, -2) / np.sqrt(d)
        if causal:
            scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return (p @ v).transpose(0, 2, 1, 3).reshape(b, s, h * d)
    return attention


def _inputs(b, s, h, d, packed, rng):
    return [rng.standard_normal((b, s, 3 * h * d if packed else h * d)) for _ in range(1 if packed else 3)]


@pytest.mark.parametrize("packed", [True, False], ids=["packed_qkv", "three_projections"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_split_heads_compute_the_same_on_llvm(packed, causal):
    func = _merged_attention(1, 16, 2, 8, packed, causal, "float32")
    matrices = heads_apart(func)
    assert matrices is not None
    split = over_original_tensors(func, matrices, matrices.func)
    rng = np.random.default_rng()
    inputs = _inputs(1, 16, 2, 8, packed, rng)
    outs = []
    for f in (func, split):
        out = tvm.runtime.tensor(np.full((1, 16, 16), np.nan, "float32"))
        tvm.compile(tvm.IRModule({"main": f}), target=LLVM)(*(tvm.runtime.tensor(a.astype("float32")) for a in inputs),
                                                            out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[1], outs[0])
    ref = _reference(1, 16, 2, 8, packed, causal)(*(a.astype("float32").astype(np.float64) for a in inputs))
    assert np.linalg.norm(outs[1] - ref) / np.linalg.norm(ref) < 1e-5


def test_split_heads_read_the_packed_projection_at_head_offsets():
    func = _merged_attention(2, 64, 12, 64, packed=True, causal=True)
    split = heads_apart(func).func
    assert [tuple(int(x) for x in p.ty.shape) for p in split.params] == [(2, 64, 36, 64), (2, 64, 12, 64)]
    assert tvm_dsm.plan(split).family.name == "attention"
    with pytest.raises(tvm_dsm.ClusterError, match=r"plan\(heads_apart\(func\).func\) ranks"):
        tvm_dsm.plan(func)  # as written: no family; the error says which form build takes


@pytest.mark.parametrize("packed", [True, False], ids=["packed_qkv", "three_projections"])
def test_merged_head_attention_builds_into_the_attention_kernel(packed):
    """One kernel on the tensor cores, where dlight's schedule of the same function is ten
    kernels materializing the scores."""
    source = tvm_dsm.build(_merged_attention(4, 256, 12, 64, packed, causal=True), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") == 2  # one kernel, declared and defined
    assert "wgmma" in source


def test_functions_without_merged_heads_are_left_alone():
    x = te.placeholder((4, 128, 768), "float16", name="x")
    w = te.placeholder((768, 768), "float16", name="w")
    k = te.reduce_axis((0, 768), name="k")
    y = te.compute((4, 128, 768), lambda b, i, j: te.sum(x[b, i, k].astype("float32") * w[j, k].astype("float32"),
                                                          axis=k), name="y")
    assert heads_apart(te.create_prim_func([x, w, y])) is None
    g = te.placeholder((768,), "float16", name="g")
    assert heads_apart(te.create_prim_func([x, g, topi.nn.rms_norm(x, g, axis=[2])])) is None


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [True, False], ids=["packed_qkv", "three_projections"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gpu_merged_head_attention_matches_float64(packed, causal):
    b, s, h, d = 2, 200, 12, 64
    err = relative_error_on_gpu(_merged_attention(b, s, h, d, packed, causal),
                                _inputs(b, s, h, d, packed, np.random.default_rng(7)),
                                _reference(b, s, h, d, packed, causal), (b, s, h * d), "float16")
    assert err < 2e-3
