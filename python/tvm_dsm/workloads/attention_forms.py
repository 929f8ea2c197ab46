"""Attention written the ways users write it, to check that tvm-dsm takes each by meaning.

Every form computes ``softmax(Q K^T / sqrt(D) [causal]) V`` in fp32 from 16-bit inputs and
returns the input type; they differ in what a matcher could trip on:

- :func:`te_attention`: hand-written TE over ``[B, H, S, D]`` (``layout="bhsd"``), ``[B, S, H,
  D]`` (``"bshd"``) or ``[H, S, D]`` (``"hsd"``); grouped-query (``kv_heads`` < ``heads``: key
  head ``h // (heads / kv_heads)``); the scale on q, on the scores or inside the softmax; the
  causal mask as a select, ``te.if_then_else`` or an added ``0 / -inf`` term; the probabilities
  normalized before the product with V or the output divided at the end.
- :func:`topi_attention`: TOPI's ``batch_matmul``, ``softmax`` and ``transpose`` over
  ``[B, S, H, D]`` inputs, as a Relax user's graph lowers them.
- :func:`relax_attention`: ``R.nn.attention`` (what ``relax.frontend.nn``'s
  ``scaled_dot_product_attention`` emits) legalized: fp16 scores, a causal mask that zeroes the
  masked scores and then their exponentials.
- :func:`attention_with_terms`: more than the scaled score in the exponent (a bias or mask
  tensor, ALiBi, a soft cap) or a mask other than the causal one (a sliding window, a padding
  mask, a fill that does not underflow); :func:`decode_attention_with_terms`, one query a head.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax, te, tirx, topi

_NEG_INF = float("-inf")


def _inputs(batch: int, heads: int, kv_heads: int, q_len: int, kv_len: int, dim: int, dtype: str,
            layout: str, value_dim: int | None = None) -> tuple:
    def shape(h, s, d=dim):
        return {"bhsd": (batch, h, s, d), "bshd": (batch, s, h, d), "hsd": (h, s, d)}[layout]

    return (te.placeholder(shape(heads, q_len), dtype, name="q"),
            te.placeholder(shape(kv_heads, kv_len), dtype, name="k"),
            te.placeholder(shape(kv_heads, kv_len, value_dim or dim), dtype, name="v"))


def _at(tensor, layout: str, b, h, s, d):
    """``tensor``'s element of batch ``b``, head ``h``, position ``s``, column ``d``."""
    return {"bhsd": lambda: tensor[b, h, s, d], "bshd": lambda: tensor[b, s, h, d],
            "hsd": lambda: tensor[h, s, d]}[layout]()


def te_attention(batch: int, heads: int, q_len: int, kv_len: int, dim: int, *, kv_heads: int | None = None,
                 layout: str = "bhsd", causal: bool = False, scale_on: str = "scores", mask: str = "select",
                 normalize: str = "output", dtype: str = "float16", value_dim: int | None = None):
    """Attention as a PrimFunc (q, k, v, out); see the module docstring for the options.
    ``scale_on``: "q", "scores" or "softmax"; ``mask``: "select", "if_then_else" or "add";
    ``normalize``: "output" (divide at the end) or "probabilities" (before the product);
    ``value_dim``: v's and the output's head dim where it is not q's (DeepSeek's latent
    attention: 192 and 128)."""
    kv_heads = kv_heads or heads
    group = heads // kv_heads
    q, k, v = _inputs(batch, heads, kv_heads, q_len, kv_len, dim, dtype, layout, value_dim)
    dv = value_dim or dim
    scale = 1.0 / math.sqrt(dim)
    f32 = "float32"
    rows = (batch, heads, q_len)
    if scale_on == "q":
        qs = te.compute(q.shape, lambda *i: (q(*i).astype(f32) * scale), name="q_scaled")
        q_value = lambda b, h, i, d: _at(qs, layout, b, h, i, d)  # noqa: E731
    else:
        q_value = lambda b, h, i, d: _at(q, layout, b, h, i, d).astype(f32)  # noqa: E731
    d = te.reduce_axis((0, dim), "d")
    scores = te.compute((*rows, kv_len), lambda b, h, i, t: te.sum(
        q_value(b, h, i, d) * _at(k, layout, b, h // group, t, d).astype(f32), axis=d), name="scores")
    if scale_on == "scores":
        raw = scores
        scores = te.compute(raw.shape, lambda b, h, i, t: raw[b, h, i, t] * scale, name="scaled")
    if causal:
        unmasked = scores
        inf = tirx.const(_NEG_INF, f32)
        zero = tirx.const(0.0, f32)
        masks = {
            "select": lambda b, h, i, t: tirx.Select(t <= i, unmasked[b, h, i, t], inf),
            "if_then_else": lambda b, h, i, t: te.if_then_else(t <= i, unmasked[b, h, i, t], inf),
            "add": lambda b, h, i, t: unmasked[b, h, i, t] + te.if_then_else(t <= i, zero, inf),
        }
        scores = te.compute(unmasked.shape, masks[mask], name="masked")
    c = scale if scale_on == "softmax" else 1.0
    t1 = te.reduce_axis((0, kv_len), "t1")
    row_max = te.compute(rows, lambda b, h, i: te.max(scores[b, h, i, t1] * c, axis=t1), name="row_max")
    t2 = te.reduce_axis((0, kv_len), "t2")
    row_sum = te.compute(rows, lambda b, h, i: te.sum(
        te.exp(scores[b, h, i, t2] * c - row_max[b, h, i]), axis=t2), name="row_sum")
    t3 = te.reduce_axis((0, kv_len), "t3")
    if normalize == "probabilities":
        p = te.compute(scores.shape, lambda b, h, i, t: te.exp(scores[b, h, i, t] * c - row_max[b, h, i])
                       / row_sum[b, h, i], name="probabilities")
        weighted = te.compute((*rows, dv), lambda b, h, i, e: te.sum(
            p[b, h, i, t3] * _at(v, layout, b, h // group, t3, e).astype(f32), axis=t3), name="weighted")
        result = lambda b, h, i, e: weighted[b, h, i, e]  # noqa: E731
    else:
        weighted = te.compute((*rows, dv), lambda b, h, i, e: te.sum(
            te.exp(scores[b, h, i, t3] * c - row_max[b, h, i]) * _at(v, layout, b, h // group, t3, e).astype(f32),
            axis=t3), name="weighted")
        result = lambda b, h, i, e: weighted[b, h, i, e] / row_sum[b, h, i]  # noqa: E731
    out_shape = {"bhsd": (batch, heads, q_len, dv), "bshd": (batch, q_len, heads, dv), "hsd": (heads, q_len, dv)}
    index = {"bhsd": lambda b, h, i, e: (b, h, i, e), "bshd": lambda b, i, h, e: (b, h, i, e),
             "hsd": lambda h, i, e: (0, h, i, e)}[layout]
    out = te.compute(out_shape[layout], lambda *a: result(*index(*a)).astype(dtype), name="out")
    return te.create_prim_func([q, k, v, out])


def topi_attention(batch: int, heads: int, q_len: int, kv_len: int, dim: int, dtype: str = "float16"):
    """Attention over ``[B, S, H, D]`` inputs through TOPI: transpose to ``[B, H, S, D]``,
    reshape to ``[B * H, S, D]``, ``batch_matmul`` (fp32 out), scale, ``softmax``,
    ``batch_matmul`` with V, transpose back, cast."""
    q, k, v = _inputs(batch, heads, heads, q_len, kv_len, dim, dtype, "bshd")

    def heads_first(x, length):
        return topi.reshape(topi.transpose(x, (0, 2, 1, 3)), (batch * heads, length, dim))

    scores = topi.nn.batch_matmul(heads_first(q, q_len), heads_first(k, kv_len), out_dtype="float32",
                                  transpose_b=True)
    p = topi.nn.softmax(topi.multiply(scores, 1.0 / math.sqrt(dim)))
    values = topi.cast(heads_first(v, kv_len), "float32")
    o = topi.nn.batch_matmul(p, values, transpose_b=False)
    out = topi.cast(topi.transpose(topi.reshape(o, (batch, heads, q_len, dim)), (0, 2, 1, 3)), dtype)
    return te.create_prim_func([q, k, v, out])


def relax_attention(batch: int, heads: int, q_len: int, kv_len: int, dim: int, causal: bool = False,
                    dtype: str = "float16", bias_shape: tuple | None = None):
    """``R.nn.attention`` over ``[B, S, H, D]`` (``causal``: its "TopLeft" mask; ``bias_shape``:
    an additive bias of that shape, broadcast over ``[B, H, q_len, kv_len]``, in ``dtype``: a
    model's mask as tvm-dsm's torch importer adds it), legalized by ``relax.transform.LegalizeOps``
    into one PrimFunc."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((batch, q_len, heads, dim), dtype))
    k = relax.Var("k", relax.TensorType((batch, kv_len, heads, dim), dtype))
    v = relax.Var("v", relax.TensorType((batch, kv_len, heads, dim), dtype))
    bias = None if bias_shape is None else relax.Var("bias", relax.TensorType(bias_shape, dtype))
    with bb.function("main", [q, k, v] + ([] if bias is None else [bias])):
        out = bb.emit(relax.op.nn.attention(q, k, v, bias=bias, causal_mask="TopLeft" if causal else None))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


def attention_with_terms(terms: str, heads: int = 4, length: int = 200, dim: int = 64, dtype: str = "float16"):
    """``[1, H, S, D]`` attention with more than the scaled score in its exponent, written by
    hand: ``bias`` an additive fp16 mask tensor ``[S, S]`` (q, k, v, mask, out); ``alibi``
    ALiBi's ``slope[h] * (t - i)``, causal (q, k, v, slopes, out); ``softcap`` a tanh soft cap of
    30; ``window`` causal within the last 64 keys, filled with fp32's lowest value;
    ``fp16_fill`` causal filled with -65504 (whose weight need not underflow); ``strict`` the
    keys before the query only (row 0 sees none); ``after`` the keys from the query on;
    ``padding`` a bool tensor ``[S]`` of the keys kept (q, k, v, keep, out); ``two_masks`` two
    additive fp16 masks ``[S, S]`` both named "mask" (q, k, v, mask, mask, out: Relax names two
    variables alike)."""
    q, k, v = (te.placeholder((1, heads, length, dim), dtype, name=n) for n in "qkv")
    inputs = {"bias": te.placeholder((length, length), "float16", name="mask"),
              "alibi": te.placeholder((heads,), "float32", name="slopes"),
              "padding": te.placeholder((length,), "bool", name="keep"),
              "two_masks": te.placeholder((length, length), "float16", name="mask")}
    extra = inputs.get(terms)
    second = te.placeholder((length, length), "float16", name="mask") if terms == "two_masks" else None
    d = te.reduce_axis((0, dim), "d")
    raw = te.compute((1, heads, length, length), lambda b, h, i, t: te.sum(
        q[b, h, i, d].astype("float32") * k[b, h, t, d].astype("float32"), axis=d), name="raw")
    lowest = tirx.const(-3.4028234663852886e38, "float32")

    def logit(b, h, i, t):
        x = raw[b, h, i, t] * (1.0 / math.sqrt(dim))
        return {
            "bias": lambda: x + extra[i, t].astype("float32"),
            "alibi": lambda: te.if_then_else(t <= i, x + extra[h] * (t - i).astype("float32"), lowest),
            "softcap": lambda: te.tanh(x / 30.0) * 30.0,
            "window": lambda: te.if_then_else(tirx.all(t <= i, t > i - 64), x, lowest),
            "fp16_fill": lambda: tirx.Select(t <= i, x, tirx.const(-65504.0, "float32")),
            "strict": lambda: tirx.Select(t < i, x, tirx.const(float("-inf"), "float32")),
            "after": lambda: tirx.Select(t >= i, x, tirx.const(float("-inf"), "float32")),
            "padding": lambda: te.if_then_else(extra[t], x, lowest),
            "two_masks": lambda: x + extra[i, t].astype("float32") + second[i, t].astype("float32"),
        }[terms]()

    s = te.compute(raw.shape, logit, name="logits")
    t1, t2, t3 = (te.reduce_axis((0, length), n) for n in ("t1", "t2", "t3"))
    m = te.compute(s.shape[:3], lambda b, h, i: te.max(s[b, h, i, t1], axis=t1), name="m")
    e = te.compute(s.shape, lambda b, h, i, t: te.exp(s[b, h, i, t] - m[b, h, i]), name="e")
    l = te.compute(s.shape[:3], lambda b, h, i: te.sum(e[b, h, i, t2], axis=t2), name="l")
    o = te.compute((1, heads, length, dim), lambda b, h, i, c: te.sum(
        e[b, h, i, t3] * v[b, h, t3, c].astype("float32"), axis=t3), name="o")
    out = te.compute(o.shape, lambda b, h, i, c: (o[b, h, i, c] / l[b, h, i]).astype(dtype), name="out")
    return te.create_prim_func([q, k, v, *(x for x in (extra, second) if x is not None), out])


def decode_attention_with_terms(terms: str, batch: int = 2, heads: int = 8, kv_heads: int = 2, keys: int = 300,
                                dim: int = 64, dtype: str = "float16"):
    """Grouped decode attention (q ``[B, H, D]``, k and v ``[B, Hkv, S, D]``) with a tanh soft cap
    (``softcap``), the last 100 keys only (``window``, Mistral's sliding window at the newest
    query), ALiBi's ``slope[h] * (t - (S - 1))`` (``alibi``, q, k, v, slopes, out), or the first
    keys only (``first``, which a decode kernel cannot take: it may not keep the last key)."""
    group = heads // kv_heads
    q = te.placeholder((batch, heads, dim), dtype, name="q")
    k, v = (te.placeholder((batch, kv_heads, keys, dim), dtype, name=n) for n in "kv")
    slopes = te.placeholder((heads,), "float32", name="slopes")
    d, t1, t2, t3 = (te.reduce_axis((0, e), n) for e, n in ((dim, "d"), (keys, "t1"), (keys, "t2"), (keys, "t3")))
    raw = te.compute((batch, heads, keys), lambda b, h, t: te.sum(
        q[b, h, d].astype("float32") * k[b, h // group, t, d].astype("float32"), axis=d), name="raw")
    lowest = tirx.const(-3.4028234663852886e38, "float32")

    def logit(b, h, t):
        x = raw[b, h, t] * (1.0 / math.sqrt(dim))
        return {"softcap": lambda: te.tanh(x / 30.0) * 30.0,
                "window": lambda: te.if_then_else(t >= keys - 100, x, lowest),
                "alibi": lambda: x + slopes[h] * (t - (keys - 1)).astype("float32"),
                "first": lambda: te.if_then_else(t < 100, x, lowest)}[terms]()

    s = te.compute(raw.shape, logit, name="s")
    m = te.compute((batch, heads), lambda b, h: te.max(s[b, h, t1], axis=t1), name="m")
    l = te.compute((batch, heads), lambda b, h: te.sum(te.exp(s[b, h, t2] - m[b, h]), axis=t2), name="l")
    o = te.compute((batch, heads, dim), lambda b, h, c: te.sum(
        te.exp(s[b, h, t3] - m[b, h]) * v[b, h // group, t3, c].astype("float32"), axis=t3), name="o")
    out = te.compute(o.shape, lambda b, h, c: (o[b, h, c] / l[b, h]).astype(dtype), name="out")
    return te.create_prim_func([q, k, v, *([slopes] if terms == "alibi" else []), out])
