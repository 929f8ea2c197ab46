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


def _merged_attention(b: int, s: int, h: int, d: int, packed: bool, causal: bool, dtype: str = "float16",
                      kv_heads: int | None = None, scale_on_q: bool = False):
    """Attention over ``[B, S, H * D]`` tensors as a user writes it in TE: q, k and v sliced from
    one packed projection (``packed``) or three, ``kv_heads`` heads of k and v (grouped-query
    attention), the scale on the scores or on q, the output ``[B, S, H * D]``."""
    c, g = h * d, h // (kv_heads or h)
    ckv = c // g
    if packed:
        qkv = te.placeholder((b, s, c + 2 * ckv), dtype, name="qkv")
        inputs = [qkv]
        q = lambda bb, i, cc: qkv[bb, i, cc]  # noqa: E731
        k = lambda bb, j, hh, dd: qkv[bb, j, c + hh // g * d + dd]  # noqa: E731
        v = lambda bb, j, cc: qkv[bb, j, c + ckv + cc // d // g * d + cc % d]  # noqa: E731
    else:
        qt, kt, vt = (te.placeholder((b, s, n), dtype, name=name) for n, name in ((c, "q"), (ckv, "k"), (ckv, "v")))
        inputs = [qt, kt, vt]
        q = lambda bb, i, cc: qt[bb, i, cc]  # noqa: E731
        k = lambda bb, j, hh, dd: kt[bb, j, hh // g * d + dd]  # noqa: E731
        v = lambda bb, j, cc: vt[bb, j, cc // d // g * d + cc % d]  # noqa: E731
    scale = 1 / float(np.sqrt(d))
    if scale_on_q:
        qs = te.compute((b, s, c), lambda bb, i, cc: (q(bb, i, cc).astype("float32") * scale).astype(dtype), name="qs")
        q = lambda bb, i, cc: qs[bb, i, cc]  # noqa: E731
    r = te.reduce_axis((0, d), name="r")
    scores = te.compute((b, h, s, s), lambda bb, hh, i, j: te.sum(
        q(bb, i, hh * d + r).astype("float32") * k(bb, j, hh, r).astype("float32"), axis=r), name="scores")
    score_scale = 1.0 if scale_on_q else scale
    scaled = te.compute((b, h, s, s), lambda bb, hh, i, j: (
        te.if_then_else(j <= i, scores[bb, hh, i, j] * score_scale, -1e4) if causal
        else scores[bb, hh, i, j] * score_scale), name="scaled")
    p = topi.cast(topi.nn.softmax(scaled, axis=-1), dtype)
    t = te.reduce_axis((0, s), name="t")
    o = te.compute((b, s, c), lambda bb, i, cc: te.sum(
        p[bb, cc // d, i, t].astype("float32") * v(bb, t, cc).astype("float32"), axis=t), name="o")
    return te.create_prim_func([*inputs, topi.cast(o, dtype)])


def _reference(b, s, h, d, packed, causal, kv_heads=None):
    hkv = kv_heads or h

    def attention(*arrays):
        q, k, v = np.split(arrays[0], [h * d, (h + hkv) * d], -1) if packed else arrays
        q = q.reshape(b, s, h, d).transpose(0, 2, 1, 3)
        k, v = (np.repeat(a.reshape(b, s, hkv, d).transpose(0, 2, 1, 3), h // hkv, 1) for a in (k, v))
        scores = q @ k.swapaxes(-1, -2) / np.sqrt(d)
        if causal:
            scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return (p @ v).transpose(0, 2, 1, 3).reshape(b, s, h * d)
    return attention


def _inputs(b, s, h, d, packed, rng, kv_heads=None):
    hkv = kv_heads or h
    if packed:
        return [rng.standard_normal((b, s, (h + 2 * hkv) * d))]
    return [rng.standard_normal((b, s, n * d)) for n in (h, hkv, hkv)]


FORMS = [dict(packed=True, causal=True), dict(packed=False, causal=False), dict(packed=True, causal=False, kv_heads=2),
         dict(packed=False, causal=True, kv_heads=1), dict(packed=True, causal=True, scale_on_q=True)]


def _form_id(form: dict) -> str:
    return "_".join(k if v is True else f"{k}{v}" for k, v in form.items() if v)


@pytest.mark.parametrize("form", FORMS, ids=_form_id)
@pytest.mark.parametrize("batch", [1, 2])
def test_split_heads_compute_the_same_on_llvm(form, batch):
    func = _merged_attention(batch, 16, 4, 8, dtype="float32", **form)
    matrices = heads_apart(func)
    assert matrices is not None
    split = over_original_tensors(func, matrices, matrices.func)
    inputs = _inputs(batch, 16, 4, 8, form["packed"], np.random.default_rng(), form.get("kv_heads"))
    outs = []
    for f in (func, split):
        out = tvm.runtime.tensor(np.full((batch, 16, 32), np.nan, "float32"))
        tvm.compile(tvm.IRModule({"main": f}), target=LLVM)(*(tvm.runtime.tensor(a.astype("float32")) for a in inputs),
                                                            out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[1], outs[0])
    ref = _reference(batch, 16, 4, 8, form["packed"], form["causal"], form.get("kv_heads"))(
        *(a.astype("float32").astype(np.float64) for a in inputs))
    assert np.linalg.norm(outs[1] - ref) / np.linalg.norm(ref) < 1e-5


def test_split_heads_read_the_packed_projection_at_head_offsets():
    func = _merged_attention(2, 64, 12, 64, packed=True, causal=True)
    split = heads_apart(func).func
    assert [tuple(int(x) for x in p.ty.shape) for p in split.params] == [(2, 64, 36, 64), (2, 64, 12, 64)]
    assert tvm_dsm.plan(split).family.name == "attention"
    with pytest.raises(tvm_dsm.ClusterError, match=r"plan\(heads_apart\(func\).func\) ranks"):
        tvm_dsm.plan(func)  # as written: no family; the error says which form build takes


@pytest.mark.parametrize("form", FORMS, ids=_form_id)
@pytest.mark.parametrize("batch", [1, 4])
def test_merged_head_attention_builds_into_the_attention_kernel(form, batch):
    """One kernel on the tensor cores, where dlight's schedule of the same function is ten
    kernels materializing the scores; at a batch of one too (an axis of one element keeps its
    binding, which the attention pattern reads) and for grouped-query attention, whose heads of
    k and v are ``h // g`` of a merged axis (128 keys: as many as a group's heads' elements)."""
    func = _merged_attention(batch, 128, 8, 64, **form)
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
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
@pytest.mark.parametrize("form", FORMS, ids=_form_id)
@pytest.mark.parametrize("batch", [1, 2])
def test_gpu_merged_head_attention_matches_float64(form, batch):
    s, h, d = 200, 12, 64
    form = {**form, "kv_heads": form.get("kv_heads") and form["kv_heads"] * 3}  # 6 or 3 of 12 heads
    err = relative_error_on_gpu(_merged_attention(batch, s, h, d, **form),
                                _inputs(batch, s, h, d, form["packed"], np.random.default_rng(7), form["kv_heads"]),
                                _reference(batch, s, h, d, form["packed"], form["causal"], form["kv_heads"]),
                                (batch, s, h * d), "float16")
    assert err < 2e-3
