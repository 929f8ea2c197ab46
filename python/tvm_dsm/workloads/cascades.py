"""Cascaded reductions as a user writes them in TE (inputs first, then every output)."""

from __future__ import annotations


from tvm import te, tirx

from ..fusion.top_k import column, top_k


def _row_max(x, m: int, k: int):
    r = te.reduce_axis((0, k), "mk")
    return te.compute((m,), lambda i: te.max(x[i, r], axis=r), name="m")


def softmax_stats(m: int, k: int) -> tirx.PrimFunc:
    """Row max and sum of exp(x - max): the statistics of a softmax (MoE routing, sampling)."""
    x = te.placeholder((m, k), name="x")
    mx = _row_max(x, m, k)
    r = te.reduce_axis((0, k), "lk")
    l = te.compute((m,), lambda i: te.sum(te.exp(x[i, r] - mx[i]), axis=r), name="l")
    return te.create_prim_func([x, mx, l])


def logsumexp(m: int, k: int) -> tirx.PrimFunc:
    """log(sum exp(x)) per row, the safe way (the cross-entropy normalizer)."""
    x = te.placeholder((m, k), name="x")
    mx = _row_max(x, m, k)
    r = te.reduce_axis((0, k), "lk")
    l = te.compute((m,), lambda i: te.sum(te.exp(x[i, r] - mx[i]), axis=r), name="l")
    lse = te.compute((m,), lambda i: te.log(l[i]) + mx[i], name="lse")
    return te.create_prim_func([x, lse])


def layernorm_stats(m: int, k: int) -> tirx.PrimFunc:
    """Mean and (two-pass) variance per row."""
    x = te.placeholder((m, k), name="x")
    r = te.reduce_axis((0, k), "uk")
    mu = te.compute((m,), lambda i: te.sum(x[i, r] / k, axis=r), name="mu")
    r2 = te.reduce_axis((0, k), "vk")
    var = te.compute((m,), lambda i: te.sum((x[i, r2] - mu[i]) * (x[i, r2] - mu[i]) / k, axis=r2), name="var")
    return te.create_prim_func([x, mu, var])


def rmsnorm_gemv(m: int, k: int) -> tirx.PrimFunc:
    """RMSNorm of each row followed by a dot with w: sum_k x w / sqrt(mean(x^2))."""
    x = te.placeholder((m, k), name="x")
    w = te.placeholder((k,), name="w")
    r = te.reduce_axis((0, k), "sk")
    ss = te.compute((m,), lambda i: te.sum(x[i, r] * x[i, r], axis=r), name="ss")
    r2 = te.reduce_axis((0, k), "yk")
    y = te.compute((m,), lambda i: te.sum(x[i, r2] * w[r2] / te.sqrt(ss[i] / k), axis=r2), name="y")
    return te.create_prim_func([x, w, ss, y])


def _softmax_statistics(m: int, k: int, j: int, dtype: str):
    """X [m, k] and V [k, j] of ``dtype``, their fp32 views, and the row max and exp-sum of X."""
    x = te.placeholder((m, k), dtype, name="x")
    v = te.placeholder((k, j), dtype, name="v")
    xf = x if dtype == "float32" else te.compute((m, k), lambda i, t: x[i, t].astype("float32"), name="xf")
    vf = v if dtype == "float32" else te.compute((k, j), lambda t, c: v[t, c].astype("float32"), name="vf")
    mx = _row_max(xf, m, k)
    r = te.reduce_axis((0, k), "lk")
    l = te.compute((m,), lambda i: te.sum(te.exp(xf[i, r] - mx[i]), axis=r), name="l")
    return x, v, xf, vf, mx, l


def softmax_pv(m: int, k: int, j: int, dtype: str = "float32") -> tirx.PrimFunc:
    """Row max, exp-sum and exp-weighted sum of V (unnormalized attention output), in fp32 from
    X and V of ``dtype``."""
    x, v, xf, vf, mx, l = _softmax_statistics(m, k, j, dtype)
    r2 = te.reduce_axis((0, k), "ok")
    o = te.compute((m, j), lambda i, c: te.sum(te.exp(xf[i, r2] - mx[i]) * vf[r2, c], axis=r2), name="o")
    return te.create_prim_func([x, v, mx, l, o])


def softmax_v(m: int, k: int, j: int, dtype: str = "float32") -> tirx.PrimFunc:
    """softmax(X)·V as usually written: P = exp(x - max) / sum, then O = P·V, in fp32 from X and
    V of ``dtype``; only O [m, j] is an output."""
    x, v, xf, vf, mx, l = _softmax_statistics(m, k, j, dtype)
    p = te.compute((m, k), lambda i, t: te.exp(xf[i, t] - mx[i]) / l[i], name="p")
    r2 = te.reduce_axis((0, k), "ok")
    o = te.compute((m, j), lambda i, c: te.sum(p[i, r2] * vf[r2, c], axis=r2), name="o")
    return te.create_prim_func([x, v, o])


def decode_attention(rows: int, keys: int, dim: int) -> tirx.PrimFunc:
    """One query per row (a (batch, head) pair) attending to ``keys`` cached keys and values:
    softmax(q K^T / sqrt(dim)) V in fp32 from fp16 q [rows, dim], K and V [rows, keys, dim].
    The scores are a sum over ``dim`` that the fused loop computes per key (an element
    producer); output [rows, dim] fp32."""
    q = te.placeholder((rows, dim), "float16", name="q")
    k = te.placeholder((rows, keys, dim), "float16", name="k")
    v = te.placeholder((rows, keys, dim), "float16", name="v")
    scale = 1.0 / dim ** 0.5
    d = te.reduce_axis((0, dim), "d")
    s = te.compute((rows, keys), lambda i, t: te.sum(
        q[i, d].astype("float32") * k[i, t, d].astype("float32") * scale, axis=d), name="s")
    mx = _row_max(s, rows, keys)
    r = te.reduce_axis((0, keys), "lk")
    l = te.compute((rows,), lambda i: te.sum(te.exp(s[i, r] - mx[i]), axis=r), name="l")
    r2 = te.reduce_axis((0, keys), "ok")
    o = te.compute((rows, dim), lambda i, c: te.sum(
        te.exp(s[i, r2] - mx[i]) * v[i, r2, c].astype("float32"), axis=r2), name="o")
    out = te.compute((rows, dim), lambda i, c: o[i, c] / l[i], name="out")
    return te.create_prim_func([q, k, v, out])


def moe_routing(tokens: int, experts: int, k: int, dtype: str = "float16", index_dtype: str = "int32") -> tirx.PrimFunc:
    """MoE router: the k best experts per token and their softmax probabilities (over all
    experts, best first; ties go to the lower expert index), from logits of ``dtype``. Outputs
    weights [tokens, k] fp32 and indices [tokens, k] of ``index_dtype`` (TOPI's and torch's
    topk: int64)."""
    x = te.placeholder((tokens, experts), dtype, name="x")

    def logit(i, r):
        return x[i, r].astype("float32")

    r = te.reduce_axis((0, experts), "mk")
    mx = te.compute((tokens,), lambda i: te.max(logit(i, r), axis=r), name="m")
    r2 = te.reduce_axis((0, experts), "lk")
    l = te.compute((tokens,), lambda i: te.sum(te.exp(logit(i, r2) - mx[i]), axis=r2), name="l")
    best = top_k(logit, (tokens,), experts, k)

    weights = te.compute((tokens, k), lambda i, c: te.exp(column(best[:k], i, c) - mx[i]) / l[i],
                         name="weights")
    indices = te.compute((tokens, k), lambda i, c: column(best[k:], i, c).astype(index_dtype), name="indices")
    return te.create_prim_func([x, weights, indices])


def attention(heads: int, q_len: int, kv_len: int, dim: int, causal: bool = False) -> tirx.PrimFunc:
    """softmax(Q K^T / sqrt(dim)) V per head, as a user writes it: fp16 q [heads, q_len, dim],
    k and v [heads, kv_len, dim]; scores, max, exp-sum and the weighted sum of V in fp32;
    output fp16 [heads, q_len, dim]. ``causal``: query i sees keys t <= i (PyTorch's
    ``is_causal``), the others' scores set to -inf."""
    q = te.placeholder((heads, q_len, dim), "float16", name="q")
    k = te.placeholder((heads, kv_len, dim), "float16", name="k")
    v = te.placeholder((heads, kv_len, dim), "float16", name="v")
    scale = 1.0 / dim ** 0.5
    d = te.reduce_axis((0, dim), "d")
    s = te.compute((heads, q_len, kv_len), lambda h, i, t: te.sum(
        q[h, i, d].astype("float32") * k[h, t, d].astype("float32") * scale, axis=d), name="s")
    if causal:
        scores = s
        s = te.compute((heads, q_len, kv_len), lambda h, i, t: te.if_then_else(
            t <= i, scores[h, i, t], tirx.const(float("-inf"), "float32")), name="masked")
    r = te.reduce_axis((0, kv_len), "mk")
    mx = te.compute((heads, q_len), lambda h, i: te.max(s[h, i, r], axis=r), name="m")
    r1 = te.reduce_axis((0, kv_len), "lk")
    l = te.compute((heads, q_len), lambda h, i: te.sum(te.exp(s[h, i, r1] - mx[h, i]), axis=r1), name="l")
    r2 = te.reduce_axis((0, kv_len), "ok")
    o = te.compute((heads, q_len, dim), lambda h, i, c: te.sum(
        te.exp(s[h, i, r2] - mx[h, i]) * v[h, r2, c].astype("float32"), axis=r2), name="o")
    out = te.compute((heads, q_len, dim), lambda h, i, c: (o[h, i, c] / l[h, i]).astype("float16"),
                     name="out")
    return te.create_prim_func([q, k, v, out])
