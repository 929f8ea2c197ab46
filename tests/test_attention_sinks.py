"""Attention with a sink logit (gpt-oss's learned sink, one a head): the sink joins each row's
softmax without a value of its own. The tensor-core attention kernel starts each row's running
max at the sink and its sum at 1; forms where the sink is not of the heads alone are refused."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

import tvm_dsm
from tvm_dsm import driver
from tvm_dsm.errors import ClusterError
from tvm_dsm.kernels.attention_pattern import find_attention, find_decode_attention

from conftest import TARGET


def _gpt_oss(batch=1, heads=8, kv_heads=2, length=200, dim=64, causal=True, dtype="bfloat16", sink_shape=None,
             first_key=None):
    """gpt-oss's form, [B, H, S, D]: the row max joined by the sink, the probabilities divided by
    the row sum plus the sink's term and rounded to ``dtype`` before the product with v; with
    ``first_key``, the keys before it masked to -inf (left padding) instead of the causal mask."""
    group = heads // kv_heads
    q = te.placeholder((batch, heads, length, dim), dtype, name="q")
    k = te.placeholder((batch, kv_heads, length, dim), dtype, name="k")
    v = te.placeholder((batch, kv_heads, length, dim), dtype, name="v")
    sinks = te.placeholder(sink_shape or (heads,), dtype, name="sinks")
    sink = (lambda h, i: sinks[h].astype("float32")) if sink_shape is None else (
        lambda h, i: sinks[h, i].astype("float32"))
    d = te.reduce_axis((0, dim), name="d")
    scores = te.compute((batch, heads, length, length), lambda b, h, i, j: te.sum(
        q[b, h, i, d].astype("float32") * k[b, h // group, j, d].astype("float32"), axis=d), name="scores")
    def mask(b, h, i, j):
        if first_key is not None:
            return te.if_then_else(j >= first_key, scores[b, h, i, j] * dim ** -0.5, -float("inf"))
        return te.if_then_else(j <= i, scores[b, h, i, j] * dim ** -0.5, -1e30) if causal else \
            scores[b, h, i, j] * dim ** -0.5

    masked = te.compute(scores.shape, mask, name="masked")
    j1 = te.reduce_axis((0, length), name="j1")
    row_max = te.compute(scores.shape[:3], lambda b, h, i: te.max(masked[b, h, i, j1], axis=j1), name="row_max")
    top = te.compute(scores.shape[:3], lambda b, h, i: te.max(row_max[b, h, i], sink(h, i)), name="top")
    e = te.compute(scores.shape, lambda b, h, i, j: te.exp(masked[b, h, i, j] - top[b, h, i]), name="e")
    j2 = te.reduce_axis((0, length), name="j2")
    row_sum = te.compute(scores.shape[:3], lambda b, h, i: te.sum(e[b, h, i, j2], axis=j2), name="row_sum")
    den = te.compute(scores.shape[:3], lambda b, h, i: row_sum[b, h, i] + te.exp(sink(h, i) - top[b, h, i]), name="den")
    probs = te.compute(scores.shape, lambda b, h, i, j: (e[b, h, i, j] / den[b, h, i]).astype(dtype), name="probs")
    j = te.reduce_axis((0, length), name="j")
    out = te.compute((batch, heads, length, dim), lambda b, h, i, c: te.sum(
        probs[b, h, i, j].astype("float32") * v[b, h // group, j, c].astype("float32"), axis=j), name="o")
    return te.create_prim_func([q, k, v, sinks, te.compute(out.shape, lambda *x: out(*x).astype(dtype), name="out")])


def _inline(heads=4, length=130, dim=128, dtype="float16"):
    """The same softmax spelled in one expression a block, [H, S, D], the scale inside the
    exponent and an fp32 sink: ``exp(s c - max(M, sink)) / (L + exp(sink - max(M, sink)))``."""
    q = te.placeholder((heads, length, dim), dtype, name="q")
    k = te.placeholder((heads, length, dim), dtype, name="k")
    v = te.placeholder((heads, length, dim), dtype, name="v")
    sinks = te.placeholder((heads,), "float32", name="sinks")
    c = dim ** -0.5
    d = te.reduce_axis((0, dim), name="d")
    s = te.compute((heads, length, length), lambda h, i, j: te.sum(
        q[h, i, d].astype("float32") * k[h, j, d].astype("float32"), axis=d), name="s")
    j1, j2, j3 = (te.reduce_axis((0, length), name=n) for n in ("j1", "j2", "j3"))
    m = te.compute((heads, length), lambda h, i: te.max(s[h, i, j1] * c, axis=j1), name="m")
    top = lambda h, i: te.max(m[h, i], sinks[h])  # noqa: E731
    total = te.compute((heads, length), lambda h, i: te.sum(te.exp(s[h, i, j2] * c - top(h, i)), axis=j2), name="l")
    out = te.compute((heads, length, dim), lambda h, i, col: te.sum(
        te.exp(s[h, i, j3] * c - top(h, i)) / (total[h, i] + te.exp(sinks[h] - top(h, i)))
        * v[h, j3, col].astype("float32"), axis=j3), name="o")
    return te.create_prim_func([q, k, v, sinks, te.compute(out.shape, lambda *x: out(*x).astype(dtype), name="out")])


def _reference(q, k, v, sinks, causal, first_key=None):
    """float64, the sink a column of the scores dropped after the softmax; q, k, v as [B, H, S, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)
    s = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    if first_key is not None:
        s[..., :first_key] = -np.inf
    column = np.broadcast_to(sinks.reshape(1, -1, 1, 1), s.shape[:-1] + (1,))
    full = np.concatenate([s, column], -1)
    p = np.exp(full - full.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return p[..., :-1] @ v


@pytest.mark.parametrize("make", [_gpt_oss, _inline])
def test_the_sink_is_read_as_a_logit_of_the_heads(make):
    shape = find_attention(make())
    assert shape.sink is not None and shape.row_outputs == ()
    assert [ld.source.name for ld in tvm_dsm.ir.loads(shape.sink.value)] == ["sinks"]
    assert driver.plan(make()).family.name == "attention"


def test_the_kernel_starts_each_row_at_the_sink_and_takes_its_tensor():
    source = tvm_dsm.build(_gpt_oss(), TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") == 2 and "sinks" in source  # one kernel (declared, then defined)


def test_a_sink_of_each_query_position_is_refused_by_name():
    with pytest.raises(ClusterError, match="sink logit must be of the heads alone"):
        find_attention(_gpt_oss(sink_shape=(8, 200)))


def test_decode_attention_refuses_a_sink():
    with pytest.raises(ClusterError, match="no sink logit"):
        find_decode_attention(_gpt_oss(length=1, causal=False))


def _run(func, arrays, out_shape, dtype):
    import ml_dtypes  # noqa: F401  (numpy's bfloat16)

    dev = tvm.cuda(0)
    np_dtype = np.dtype(dtype if dtype != "bfloat16" else ml_dtypes.bfloat16)
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, np_dtype), dev)
    tvm_dsm.build(func, TARGET)(*(tvm.runtime.tensor(a, dev) for a in arrays), out)
    return out.numpy().astype(np.float64)


@pytest.mark.gpu
@pytest.mark.parametrize("causal, dtype, length", [(True, "bfloat16", 200), (False, "float16", 333)])
def test_gpu_gpt_oss_sinks_match_float64(causal, dtype, length):
    import ml_dtypes  # noqa: F401

    rng = np.random.default_rng()
    np_dtype = np.dtype(dtype if dtype != "bfloat16" else ml_dtypes.bfloat16)
    q = (rng.standard_normal((1, 8, length, 64)) * 2).astype(np_dtype)
    k = (rng.standard_normal((1, 2, length, 64)) * 2).astype(np_dtype)
    v = rng.standard_normal((1, 2, length, 64)).astype(np_dtype)
    sinks = rng.uniform(-1, 6, 8).astype(np_dtype)  # some above every score of a row: most weight on the sink
    got = _run(_gpt_oss(length=length, causal=causal, dtype=dtype), [q, k, v, sinks], q.shape, dtype)
    ref = _reference(*(a.astype(np.float64) for a in (q, k, v, sinks)), causal)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
def test_gpu_a_sink_of_minus_infinity_over_a_masked_first_tile_is_plain_attention():
    """A head whose sink is -inf weighs its keys alone, also where a row's first key tiles are all
    masked (left padding past a tile): the running max starts at the kernel's own start there."""
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal(shape).astype(np.float16) for shape in
               [(1, 8, 300, 64), (1, 2, 300, 64), (1, 2, 300, 64)])
    sinks = rng.uniform(-1, 3, 8).astype(np.float16)
    sinks[[0, 5]] = -np.inf
    func = _gpt_oss(length=300, causal=False, dtype="float16", first_key=150)
    got = _run(func, [q, k, v, sinks], q.shape, "float16")
    ref = _reference(*(a.astype(np.float64) for a in (q, k, v, sinks)), False, first_key=150)
    assert np.isfinite(got).all() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
def test_gpu_inline_sinks_match_float64():
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((4, 130, 128)).astype(np.float16) for _ in range(3))
    sinks = rng.uniform(-2, 4, 4).astype(np.float32)
    got = _run(_inline(), [q, k, v, sinks], q.shape, "float16")
    ref = _reference(*(a.astype(np.float64)[None] for a in (q, k, v)), sinks.astype(np.float64), False)[0]
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
