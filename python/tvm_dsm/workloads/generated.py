"""A seeded generator of functions the way users write them, to measure how far tvm-dsm's
families and its fallback reach beyond the hand-picked suites.

:func:`generate` draws ``count`` :class:`Case` s round-robin over the op classes (:data:`CLASSES`:
dense, several projections of one input (q, k, v), gated dense, FFN/SwiGLU chain, attention
prefill and decode (also with a bias, ALiBi, a soft cap or a mask other than the causal one),
RMSNorm/LayerNorm (and RMSNorm followed by per-token fp8 quantization, fused add-RMSNorm),
softmax, logsumexp/cross-entropy, MoE routing),
each in one user style (hand-written TE, TOPI operators, TOPI's element-wise operators and
reductions composed with ``keepdims``, or a Relax function legalized and fused into one
PrimFunc, whose indices are int64), dtype (fp16, bf16, fp32), weight layout
([N, K] as torch.nn.Linear stores it, or [K, N]) and size (real-model widths and sizes off the
tiles, primes included), some with a symbolic row count ``m``. Each case carries its argument
specs (concrete shapes: a symbolic ``m`` bound to a drawn value) and a float64 numpy
reference (:meth:`Case.reference`) keyed by ``params`` (which :mod:`tvm_dsm.gpu.references`
also reads, in torch, on the GPU machine).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import tvm
from tvm import relax, te, tirx, topi

from .attention_forms import (attention_with_terms, decode_attention_with_terms, relax_attention, te_attention,
                              topi_attention)
from .cascades import moe_routing
from .dense import ACTIVATIONS, matmul
from .norms import EPS, composed_norm, residual_rms_norm_returned

CLASSES = ("dense", "gated_dense", "ffn", "attention", "decode_attention", "norm", "softmax",
           "logsumexp", "moe_routing", "projections")

DTYPES = ("float16", "bfloat16", "float32")

#: Rows (tokens): decode batches, prefill chunks, primes.
ROWS = (1, 2, 7, 13, 37, 64, 100, 128, 257, 512, 1024)
#: Feature widths: real models' (Llama, Mistral, Mixtral) and off-tile ones, primes included.
WIDTHS = (127, 512, 1000, 1021, 1024, 2048, 3000, 4096, 5120, 14336)
#: The same roles at sizes the llvm check runs in seconds.
SMALL_ROWS = (1, 2, 7, 13, 37)
SMALL_WIDTHS = (16, 61, 64, 100, 128)

#: Multiply-adds one GEMM-like case may cost (keeps each build and GPU run short).
MAX_MACS = 1 << 32

#: Largest finite float8_e4m3fn: per-token quantization maps each row's max |y| onto it.
FP8_MAX = 448.0

#: (op class, style, input types) whose function rounds beyond its dtype's tolerance against
#: float64 by its own definition: Relax's legalized attention computes its scores in the 16-bit
#: input type, and its softmax its exponentials and exp-sum (in bf16, 8 bits each).
ROUNDED = {("attention", "relax", ("float16", "bfloat16")), ("decode_attention", "relax", ("float16", "bfloat16")),
           ("softmax", "relax", ("bfloat16",))}


@dataclass
class Case:
    """One generated function: its PrimFunc, argument specs in call order
    (``{"name", "shape", "dtype", "output"}``, ``"scale"`` on weights: 1/sqrt(fan-in), which
    keeps chains inside fp16's range) and the parameters of its float64 reference."""

    name: str
    op_class: str
    style: str  # "te", "topi" or "relax"
    func: tirx.PrimFunc = field(repr=False)
    args: list[dict]
    params: dict  # "op" (a key of REFERENCES) and its keyword arguments
    symbolic: bool = False
    flops: int = 0

    @property
    def within_tolerance(self) -> bool:
        """Whether the function itself stays within its dtype's tolerance of float64."""
        return not any((self.op_class, self.style) == (op_class, style) and self.inputs[0]["dtype"] in types
                       for op_class, style, types in ROUNDED)

    @property
    def inputs(self) -> list[dict]:
        return [a for a in self.args if not a["output"]]

    @property
    def outputs(self) -> list[dict]:
        return [a for a in self.args if a["output"]]

    def reference(self, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        """The outputs in float64 (indices as int64) from ``inputs`` in call order."""
        params = {k: v for k, v in self.params.items() if k != "op"}
        out = REFERENCES[self.params["op"]](*[np.asarray(a).astype(np.float64) for a in inputs], **params)
        return out if isinstance(out, tuple) else (out,)


# ---- float64 references (numpy), by ``params["op"]`` ----

def _silu(x):
    return x / (1 + np.exp(-x))


def _gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


_ACTIVATIONS = {"relu": lambda x: np.maximum(x, 0), "silu": _silu, "gelu": _gelu}


def _weight(w, layout: str):
    """``w`` as [K, N] (it is [N, K] when ``layout`` is "nk")."""
    return w.T if layout == "nk" else w


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _logsumexp(x):
    top = x.max(-1)
    return np.log(np.exp(x - top[..., None]).sum(-1)) + top


def _attention(q, k, v, layout: str = "bhsd", causal: bool = False):
    """softmax(q K^T / sqrt(d) [query i sees keys t <= i]) V; key/value heads repeated for
    their group of query heads. q, k, v in ``layout`` ("bhsd", "bshd" or "hsd")."""
    to_bhsd = {"bhsd": lambda a: a, "bshd": lambda a: a.transpose(0, 2, 1, 3), "hsd": lambda a: a[None]}[layout]
    q, k, v = (to_bhsd(a) for a in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    if causal:
        hidden = np.triu(np.ones(scores.shape[-2:], bool), 1)
        scores = np.where(hidden, -np.inf, scores)
    out = _softmax(scores) @ v
    return {"bhsd": out, "bshd": out.transpose(0, 2, 1, 3), "hsd": out[0]}[layout]


#: Forms of :func:`~tvm_dsm.workloads.attention_forms.attention_with_terms` the generator draws
#: (not those that leave a row without keys: its output is NaN by definition).
ATTENTION_TERMS = ("bias", "alibi", "softcap", "window", "fp16_fill", "padding")


def _attention_terms(q, k, v, *extra, terms: str):
    """:func:`~tvm_dsm.workloads.attention_forms.attention_with_terms`'s form ``terms`` over
    [1, H, S, D] inputs (``extra``: its mask, slopes or kept keys)."""
    x = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
    i, t = np.indices(x.shape[-2:])
    lowest = float(np.finfo(np.float32).min)
    masked = {
        "bias": lambda: x + extra[0],
        "alibi": lambda: np.where(t <= i, x + extra[0][None, :, None, None] * (t - i), lowest),
        "softcap": lambda: np.tanh(x / 30.0) * 30.0,
        "window": lambda: np.where((t <= i) & (t > i - 64), x, lowest),
        "fp16_fill": lambda: np.where(t <= i, x, -65504.0),
        "strict": lambda: np.where(t < i, x, -np.inf),
        "after": lambda: np.where(t >= i, x, -np.inf),
        "padding": lambda: np.where(extra[0][None, None, None, :] != 0, x, lowest),
    }[terms]()
    with np.errstate(invalid="ignore"):  # a row without keys: NaN, as the function computes it
        p = np.exp(masked - masked.max(-1, keepdims=True))
        return (p @ v) / p.sum(-1, keepdims=True)


#: Forms of :func:`~tvm_dsm.workloads.attention_forms.decode_attention_with_terms` the
#: generator draws.
DECODE_TERMS = ("softcap", "window", "alibi")


def _decode_attention_terms(q, k, v, *extra, terms: str):
    """:func:`~tvm_dsm.workloads.attention_forms.decode_attention_with_terms`'s form ``terms``:
    q [B, H, D], k and v [B, Hkv, S, D] (``extra``: ALiBi's slopes)."""
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, 1), np.repeat(v, group, 1)
    x = np.einsum("bhd,bhtd->bht", q, k) / math.sqrt(q.shape[-1])
    keys = k.shape[2]
    t = np.arange(keys)
    x = {"softcap": lambda: np.tanh(x / 30.0) * 30.0,
         "window": lambda: np.where(t >= keys - 100, x, float(np.finfo(np.float32).min)),
         "alibi": lambda: x + extra[0][None, :, None] * (t - (keys - 1))}[terms]()
    p = np.exp(x - x.max(-1, keepdims=True))
    return np.einsum("bht,bhtd->bhd", p, v) / p.sum(-1)[..., None]


def _decode_attention(q, k, v):
    """One query per (batch, head): q [B, H, D], the KV cache k, v [B, Hkv, S, D]."""
    return _attention(q[:, :, None], k, v)[:, :, 0]


def _rms(x, eps):
    return np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _rms_norm_fp8(x, w, eps):
    """RMSNorm, then per-token fp8 e4m3 quantization: (quantized rows, their scales)."""
    y = x / _rms(x, eps) * w
    amax = np.maximum(np.abs(y).max(-1), 1e-12)
    quantized = (y * (FP8_MAX / amax)[:, None]).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return quantized, amax / FP8_MAX


def _moe_routing(x, k: int):
    """The k best experts per token (best first, ties to the lower index) and their softmax
    probabilities over all experts."""
    order = np.argsort(-x, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(_softmax(x), order, 1), order


REFERENCES: dict[str, Callable] = {
    "dense": lambda x, w, layout: x @ _weight(w, layout),
    "projections": lambda x, *ws, layout: tuple(x @ _weight(w, layout) for w in ws),
    "gated_dense": lambda x, wg, wu, layout: _silu(x @ _weight(wg, layout)) * (x @ _weight(wu, layout)),
    "ffn": lambda a, w1, w2, layout, activation: _ACTIVATIONS[activation](a @ _weight(w1, layout)) @ _weight(w2, layout),
    "swiglu": lambda a, wg, wu, w2, layout: (_silu(a @ _weight(wg, layout)) * (a @ _weight(wu, layout)))
    @ _weight(w2, layout),
    "attention": _attention,
    "attention_terms": _attention_terms,
    "decode_attention": _decode_attention,
    "decode_attention_terms": _decode_attention_terms,
    "rms_norm": lambda x, w, eps: x / _rms(x, eps) * w,
    "rms_norm_residual": lambda x, r, w, eps: (x + r, (x + r) / _rms(x + r, eps) * w),
    "layer_norm": lambda x, w, b, eps: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * w + b,
    "rms_norm_fp8": _rms_norm_fp8,
    "softmax": _softmax,
    "log_softmax": lambda x: x - _logsumexp(x)[..., None],
    "logsumexp": _logsumexp,
    "cross_entropy": lambda x, t: (t * (_logsumexp(x)[:, None] - x)).sum(-1),
    "moe_routing": _moe_routing,
}


# ---- the user styles ----

def _f32(x: te.Tensor) -> te.Tensor:
    """``x`` in float32 (itself if it is)."""
    return x if x.dtype == "float32" else topi.cast(x, "float32")


def relax_prim_func(inputs: list[tuple[str, tuple, str]], body: Callable) -> tirx.PrimFunc:
    """The one PrimFunc of a Relax function over ``inputs`` (name, shape, dtype) whose dataflow
    ``body(bb, *vars)`` emits, after the passes ``relax.build`` runs before it schedules:
    a transposed weight folded into its matmul, LegalizeOps, operator fusion."""
    bb = relax.BlockBuilder()
    params = [relax.Var(name, relax.TensorType(shape, dtype)) for name, shape, dtype in inputs]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([
        relax.transform.FuseTransposeMatmul(), relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
        relax.transform.FuseTIR(), relax.transform.DeadCodeElimination()])(bb.get())
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    if len(funcs) != 1:
        raise ValueError(f"the Relax function fuses into {len(funcs)} PrimFuncs, not one")
    return funcs[0]


def _rows(m, style: str):
    """The row count as a style writes a symbolic one (Relax: an int64 variable)."""
    if isinstance(m, int):
        return m
    return tirx.Var("m", "int64") if style == "relax" else m


def _topi_product(x: te.Tensor, w: te.Tensor, layout: str) -> te.Tensor:
    """``x @ W`` in float32 by TOPI's operator for the weight's layout: ``dense`` for [N, K],
    ``matmul`` for [K, N]."""
    return (topi.nn.dense if layout == "nk" else topi.nn.matmul)(x, w, out_dtype="float32")


def _product(style: str, x: te.Tensor, w: te.Tensor, layout: str) -> te.Tensor:
    """``x @ W`` in float32 as ``style`` ("te" or "topi") writes it."""
    return matmul(x, w, layout) if style == "te" else _topi_product(x, w, layout)


def _dense(style, m, n, k, dtype, layout):
    if style in ("te", "topi"):
        x = te.placeholder((m, k), dtype, name="X")
        w = te.placeholder((n, k) if layout == "nk" else (k, n), dtype, name="W")
        return te.create_prim_func([x, w, topi.cast(_product(style, x, w, layout), dtype)])

    def body(bb, x, w):
        wt = bb.emit(relax.op.permute_dims(w)) if layout == "nk" else w
        return relax.op.astype(bb.emit(relax.op.matmul(x, wt, out_dtype="float32")), dtype)

    return relax_prim_func([("x", (_rows(m, style), k), dtype), ("w", (n, k) if layout == "nk" else (k, n), dtype)], body)


def _projections(style, m, widths, k, dtype, layout):
    """Several projections of one input in one function, one output each (an attention layer's
    q, k and v written together: the widths differ under grouped-query attention)."""
    x = te.placeholder((m, k), dtype, name="X")
    ws = [te.placeholder((n, k) if layout == "nk" else (k, n), dtype, name=f"W{i}") for i, n in enumerate(widths)]
    return te.create_prim_func([x, *ws, *(topi.cast(_product(style, x, w, layout), dtype) for w in ws)])


def _gated_dense(style, m, n, k, dtype, layout):
    x = te.placeholder((m, k), dtype, name="X")
    wg, wu = (te.placeholder((n, k) if layout == "nk" else (k, n), dtype, name=name) for name in ("Wg", "Wu"))
    if style == "te":
        gate, up = matmul(x, wg, layout), matmul(x, wu, layout)
        h = te.compute(gate.shape, lambda i, j: (ACTIVATIONS["silu"](gate[i, j]) * up[i, j]).astype(dtype), name="H")
    else:
        gate, up = (_topi_product(x, w, layout) for w in (wg, wu))
        h = topi.cast(topi.multiply(topi.multiply(gate, topi.sigmoid(gate)), up), dtype)
    return te.create_prim_func([x, wg, wu, h])


def _ffn(style, m, n, k, dtype, layout, activation):
    """``act(A @ W1) @ W2`` or (``activation`` "swiglu") ``(silu(A @ Wg) * (A @ Wu)) @ W2``,
    the intermediate rounded to ``dtype``."""
    a = te.placeholder((m, k), dtype, name="A")
    weights = [te.placeholder((n, k) if layout == "nk" else (k, n), dtype, name=name)
               for name in (("Wg", "Wu") if activation == "swiglu" else ("W1",))]
    w2 = te.placeholder((k, n) if layout == "nk" else (n, k), dtype, name="W2")
    if style == "te":
        products = [matmul(a, w, layout) for w in weights]
        if activation == "swiglu":
            gate, up = products
            h = te.compute(gate.shape, lambda i, j: (ACTIVATIONS["silu"](gate[i, j]) * up[i, j]).astype(dtype), name="H")
        else:
            c = products[0]
            h = te.compute(c.shape, lambda i, j: ACTIVATIONS[activation](c[i, j]).astype(dtype), name="H")
        out = topi.cast(matmul(h, w2, layout), dtype)
    else:
        products = [_topi_product(a, w, layout) for w in weights]
        if activation == "swiglu":
            gate, up = products
            h = topi.multiply(topi.multiply(gate, topi.sigmoid(gate)), up)
        else:
            h = {"relu": topi.nn.relu, "silu": lambda c: topi.multiply(c, topi.sigmoid(c)),
                 "gelu": lambda c: topi.multiply(topi.multiply(c, 0.5),
                                                 topi.add(topi.erf(topi.multiply(c, 1 / math.sqrt(2))), 1.0)),
                 }[activation](products[0])
        out = topi.cast(_topi_product(topi.cast(h, dtype), w2, layout), dtype)
    return te.create_prim_func([a, *weights, w2, out])


def _row_op(style, m, width, dtype, op):
    """A row-wise operator over [m, width] of ``dtype``: "softmax" and "log_softmax" (out:
    ``dtype``), "logsumexp" (out: fp32 [m]), "rms_norm" and "layer_norm" (weight, bias [width];
    out: ``dtype``). TE and TOPI compute in fp32 (16-bit inputs cast up first, as
    mixed-precision models keep these in fp32); Relax applies the operator to ``dtype`` as a
    graph in that type has it (a cast before it would not fuse into the same PrimFunc)."""
    if style == "composed":
        return composed_norm(op, m, width, dtype)
    if style == "relax":
        inputs = [("x", (_rows(m, style), width), dtype), ("w", (width,), dtype), ("b", (width,), dtype)]
        inputs = inputs[:{"rms_norm": 2, "layer_norm": 3}.get(op, 1)]

        def body(bb, x, *wb):
            if op == "rms_norm":
                return relax.op.nn.rms_norm(x, *wb, axes=[-1], epsilon=EPS)
            if op == "layer_norm":
                return relax.op.nn.layer_norm(x, *wb, axes=[-1], epsilon=EPS)
            return getattr(relax.op.nn, op)(x, axis=-1)

        return relax_prim_func(inputs, body)
    x = te.placeholder((m, width), dtype, name="x")
    w = te.placeholder((width,), dtype, name="w")
    b = te.placeholder((width,), dtype, name="b")
    if style == "topi":
        outs = {"softmax": lambda: ([x], topi.nn.softmax(_f32(x))),
                "log_softmax": lambda: ([x], topi.nn.log_softmax(_f32(x))),
                "rms_norm": lambda: ([x, w], topi.nn.rms_norm(_f32(x), _f32(w), axis=[1], epsilon=EPS)),
                "layer_norm": lambda: ([x, w, b], topi.nn.layer_norm(_f32(x), _f32(w), _f32(b), axis=[1],
                                                                     epsilon=EPS))}
        params, y = outs[op]()
        return te.create_prim_func([*params, topi.cast(y, dtype)])
    xf = te.compute((m, width), lambda i, j: x[i, j].astype("float32"), name="xf")
    r = te.reduce_axis((0, width), "r")
    if op in ("rms_norm", "layer_norm"):
        mean = te.compute((m,), lambda i: te.sum(xf[i, r] / width, axis=r), name="mean")
        centered = ((lambda i, j: xf[i, j] - mean[i]) if op == "layer_norm" else (lambda i, j: xf[i, j]))
        r2 = te.reduce_axis((0, width), "r2")
        var = te.compute((m,), lambda i: te.sum(centered(i, r2) * centered(i, r2) / width, axis=r2), name="var")
        shift = (lambda j: b[j].astype("float32")) if op == "layer_norm" else (lambda j: 0.0)
        y = te.compute((m, width), lambda i, j: (centered(i, j) * te.rsqrt(var[i] + EPS) * w[j].astype("float32")
                                                 + shift(j)).astype(dtype), name="y")
        return te.create_prim_func([x, w, b, y] if op == "layer_norm" else [x, w, y])
    top = te.compute((m,), lambda i: te.max(xf[i, r], axis=r), name="row_max")
    r2 = te.reduce_axis((0, width), "r2")
    total = te.compute((m,), lambda i: te.sum(te.exp(xf[i, r2] - top[i]), axis=r2), name="row_sum")
    if op == "softmax":
        y = te.compute((m, width), lambda i, j: (te.exp(xf[i, j] - top[i]) / total[i]).astype(dtype), name="y")
    elif op == "log_softmax":
        y = te.compute((m, width), lambda i, j: (xf[i, j] - top[i] - te.log(total[i])).astype(dtype), name="y")
    else:
        y = te.compute((m,), lambda i: te.log(total[i]) + top[i], name="lse")
    return te.create_prim_func([x, y])


def _cross_entropy(m, width, dtype):
    """Cross-entropy of logits x [m, width] against soft targets t (fp32 [m]): the row's
    logsumexp times the targets' sum minus their dot with the logits, written as a user does."""
    x = te.placeholder((m, width), dtype, name="logits")
    t = te.placeholder((m, width), dtype, name="targets")
    xf = te.compute((m, width), lambda i, j: x[i, j].astype("float32"), name="xf")
    r = te.reduce_axis((0, width), "r")
    top = te.compute((m,), lambda i: te.max(xf[i, r], axis=r), name="row_max")
    r2 = te.reduce_axis((0, width), "r2")
    total = te.compute((m,), lambda i: te.sum(te.exp(xf[i, r2] - top[i]), axis=r2), name="row_sum")
    r3 = te.reduce_axis((0, width), "r3")
    loss = te.compute((m,), lambda i: te.sum(
        t[i, r3].astype("float32") * (te.log(total[i]) + top[i] - xf[i, r3]), axis=r3), name="loss")
    return te.create_prim_func([x, t, loss])


def _rms_norm_fp8(m, width, dtype):
    """RMSNorm in fp32, then per-token fp8 quantization: ``q = e4m3(y * 448 / amax)``, scales
    ``amax / 448`` (fp32 [m])."""
    x = te.placeholder((m, width), dtype, name="x")
    w = te.placeholder((width,), dtype, name="w")
    r = te.reduce_axis((0, width), "r")
    ss = te.compute((m,), lambda i: te.sum(x[i, r].astype("float32") * x[i, r].astype("float32") / width, axis=r),
                    name="mean_square")
    y = te.compute((m, width), lambda i, j: x[i, j].astype("float32") * te.rsqrt(ss[i] + EPS)
                   * w[j].astype("float32"), name="y")
    r2 = te.reduce_axis((0, width), "r2")
    tiny, top = tirx.const(1e-12, "float32"), tirx.const(FP8_MAX, "float32")
    amax = te.compute((m,), lambda i: te.max(te.abs(y[i, r2]), axis=r2), name="amax")
    q = te.compute((m, width), lambda i, j: (y[i, j] * (top / tirx.max(amax[i], tiny))).astype("float8_e4m3fn"),
                   name="q")
    scale = te.compute((m,), lambda i: tirx.max(amax[i], tiny) / top, name="scale")
    return te.create_prim_func([x, w, q, scale])


def _decode_attention_te(batch, heads, kv_heads, keys, dim, dtype):
    """One query per head over a KV cache: q [B, H, D], k, v [B, Hkv, S, D] (query head h reads
    key head h // (H / Hkv)), softmax in fp32, out [B, H, D] of ``dtype``."""
    group = heads // kv_heads
    q = te.placeholder((batch, heads, dim), dtype, name="q")
    k = te.placeholder((batch, kv_heads, keys, dim), dtype, name="k_cache")
    v = te.placeholder((batch, kv_heads, keys, dim), dtype, name="v_cache")
    d = te.reduce_axis((0, dim), "d")
    s = te.compute((batch, heads, keys), lambda b, h, t: te.sum(
        q[b, h, d].astype("float32") * k[b, h // group, t, d].astype("float32") / math.sqrt(dim), axis=d),
        name="scores")
    t1 = te.reduce_axis((0, keys), "t1")
    top = te.compute((batch, heads), lambda b, h: te.max(s[b, h, t1], axis=t1), name="row_max")
    t2 = te.reduce_axis((0, keys), "t2")
    total = te.compute((batch, heads), lambda b, h: te.sum(te.exp(s[b, h, t2] - top[b, h]), axis=t2), name="row_sum")
    t3 = te.reduce_axis((0, keys), "t3")
    o = te.compute((batch, heads, dim), lambda b, h, e: te.sum(
        te.exp(s[b, h, t3] - top[b, h]) * v[b, h // group, t3, e].astype("float32"), axis=t3), name="weighted")
    out = te.compute(o.shape, lambda b, h, e: (o[b, h, e] / total[b, h]).astype(dtype), name="out")
    return te.create_prim_func([q, k, v, out])


def _moe_topi(m, experts, k, dtype):
    """Router probabilities through ``topi.nn.softmax`` and the k best through ``topi.topk``."""
    x = te.placeholder((m, experts), dtype, name="logits")
    values, indices = topi.topk(topi.nn.softmax(_f32(x)), k=k, ret_type="both", dtype="int32")
    return te.create_prim_func([x, values, indices])


# ---- drawing the cases ----

class _Draw:
    """One case's random choices, from the generator's seeded stream."""

    def __init__(self, rng: random.Random, small: bool):
        self.rng, self.small = rng, small

    def pick(self, options):
        return self.rng.choice(list(options))

    def rows(self):
        return self.pick(SMALL_ROWS if self.small else ROWS)

    def width(self):
        return self.pick(SMALL_WIDTHS if self.small else WIDTHS)

    def gemm(self, products: int = 1):
        """(m, n, k) with ``products`` GEMMs of that size inside :data:`MAX_MACS`."""
        while True:
            m, n, k = self.rows(), self.width(), self.width()
            if products * m * n * k <= MAX_MACS:
                return m, n, k


def _symbolic(draw: _Draw) -> bool:
    """Whether this case's row count is a variable (a quarter of the classes that have one)."""
    return draw.rng.random() < 0.25


def _spec(func: tirx.PrimFunc, n_out: int, bindings: dict, scales: dict) -> list[dict]:
    """Argument specs of ``func``: the last ``n_out`` parameters are outputs; symbolic
    dimensions take their value in ``bindings`` (by variable name)."""
    params = list(func.params)

    def size(d):
        return int(d) if isinstance(d, tirx.IntImm) else bindings[d.name]

    specs = []
    for i, p in enumerate(params):
        spec = {"name": p.name, "shape": [size(d) for d in p.ty.shape],
                "dtype": str(p.ty.dtype), "output": i >= len(params) - n_out}
        if p.name in scales:
            spec["scale"] = scales[p.name]
        specs.append(spec)
    return specs


def _gemm_case(draw: _Draw, op_class: str):
    style = draw.pick(("te", "topi") if op_class != "dense" else ("te", "topi", "relax"))
    dtype, layout = draw.pick(DTYPES), draw.pick(("nk", "kn"))
    symbolic = _symbolic(draw)
    if op_class == "dense":
        m, n, k = draw.gemm()
        rows = te.var("m") if symbolic else m
        func = _dense(style, _rows(rows, style), n, k, dtype, layout)
        return (style, func, m, symbolic, {"op": "dense", "layout": layout}, 1, {"W": k ** -0.5, "w": k ** -0.5},
                f"{m}x{n}x{k}_{layout}", 2 * m * n * k)
    if op_class == "gated_dense":
        m, n, k = draw.gemm(2)
        func = _gated_dense(style, te.var("m") if symbolic else m, n, k, dtype, layout)
        return (style, func, m, symbolic, {"op": "gated_dense", "layout": layout}, 1,
                {"Wg": k ** -0.5, "Wu": k ** -0.5}, f"{m}x{n}x{k}_{layout}", 4 * m * n * k)
    if op_class == "projections":
        m, n, k = draw.gemm(3)
        widths = (n, *(max(1, n // draw.pick((1, 4, 8))) for _ in range(2)))
        func = _projections(style, te.var("m") if symbolic else m, widths, k, dtype, layout)
        return (style, func, m, symbolic, {"op": "projections", "layout": layout}, len(widths),
                {f"W{i}": k ** -0.5 for i in range(len(widths))}, f"{m}x{'_'.join(map(str, widths))}x{k}_{layout}",
                2 * m * sum(widths) * k)
    m, n, k = draw.gemm(3)
    activation = draw.pick(("relu", "gelu", "silu", "swiglu"))
    func = _ffn(style, te.var("m") if symbolic else m, n, k, dtype, layout, activation)
    params = ({"op": "swiglu", "layout": layout} if activation == "swiglu"
              else {"op": "ffn", "layout": layout, "activation": activation})
    return (style, func, m, symbolic, params, 1, {"W1": k ** -0.5, "Wg": k ** -0.5, "Wu": k ** -0.5, "W2": n ** -0.5},
            f"{m}x{n}x{k}_{activation}_{layout}", 2 * m * n * k * (3 if activation == "swiglu" else 2))


def _attention_case(draw: _Draw, op_class: str):
    dtype = draw.pick(("float16", "bfloat16"))
    dim = draw.pick((64, 80, 96, 128))
    batch = draw.pick((1, 2) if draw.small else (1, 2, 4))
    heads = draw.pick((2, 4) if draw.small else (8, 16, 32))
    kv_heads = heads // draw.pick(d for d in (1, 2, 4, 8) if heads % d == 0)
    lengths = (16, 37, 64) if draw.small else (128, 257, 512, 1000, 1024, 2048)
    flops = 4 * batch * heads * dim
    if op_class == "decode_attention":
        keys = draw.pick((17, 64, 100) if draw.small else (128, 1000, 2048, 4099, 8192))
        if draw.rng.random() < 0.2:
            terms = draw.pick(DECODE_TERMS)
            func = decode_attention_with_terms(terms, batch, heads, kv_heads, keys, dim, dtype)
            return ("te", func, None, False, {"op": "decode_attention_terms", "terms": terms}, 1, {},
                    f"{terms}_b{batch}h{heads}kv{kv_heads}s{keys}d{dim}", flops * keys)
        if draw.rng.random() < 0.8:
            func = _decode_attention_te(batch, heads, kv_heads, keys, dim, dtype)
            return ("te", func, None, False, {"op": "decode_attention"}, 1, {},
                    f"b{batch}h{heads}kv{kv_heads}s{keys}d{dim}", flops * keys)
        func = relax_attention(batch, heads, 1, keys, dim, dtype=dtype)
        return ("relax", func, None, False, {"op": "attention", "layout": "bshd"}, 1, {},
                f"b{batch}h{heads}s{keys}d{dim}", flops * keys)
    q_len, kv_len = draw.pick(lengths), draw.pick(lengths)
    causal = draw.rng.random() < 0.5
    style = draw.pick(("te", "te", "topi", "relax", "te_terms"))
    if style == "te_terms":
        terms = draw.pick(ATTENTION_TERMS)
        func = attention_with_terms(terms, heads, q_len, dim, dtype)
        return ("te", func, None, False, {"op": "attention_terms", "terms": terms}, 1, {},
                f"{terms}_h{heads}s{q_len}d{dim}", 4 * heads * dim * q_len * q_len)
    if style == "te":
        layout = draw.pick(("bhsd", "bshd", "hsd"))
        batch = 1 if layout == "hsd" else batch
        options = {"scale_on": draw.pick(("q", "scores", "softmax")), "mask": draw.pick(("select", "if_then_else", "add")),
                   "normalize": draw.pick(("output", "probabilities"))}
        func = te_attention(batch, heads, q_len, kv_len, dim, kv_heads=kv_heads, layout=layout, causal=causal,
                            dtype=dtype, **options)
        detail = f"{layout}_b{batch}h{heads}kv{kv_heads}q{q_len}k{kv_len}d{dim}{'_causal' if causal else ''}"
    elif style == "topi":
        layout, causal = "bshd", False
        func = topi_attention(batch, heads, q_len, kv_len, dim, dtype=dtype)
        detail = f"b{batch}h{heads}q{q_len}k{kv_len}d{dim}"
    else:
        layout = "bshd"
        func = relax_attention(batch, heads, q_len, kv_len, dim, causal=causal, dtype=dtype)
        detail = f"b{batch}h{heads}q{q_len}k{kv_len}d{dim}{'_causal' if causal else ''}"
    return (style, func, None, False, {"op": "attention", "layout": layout, "causal": causal}, 1, {}, detail,
            flops * q_len * kv_len)


def _row_case(draw: _Draw, op_class: str):
    dtype, m, width = draw.pick(DTYPES), draw.rows() * draw.pick((1, 4)), draw.width()
    if op_class == "moe_routing":
        experts = draw.pick((16, 64) if draw.small else (8, 16, 60, 64, 128, 256))
        # fusion.top_k's selection takes 30 s to 5 min to build for top-6 of 8 or 61 experts and
        # for top-8 of a symbolic row count: top-6 and top-8 (DeepSeek's) are left out, and 60
        # experts (Qwen-MoE's) take at most 2
        # (and top-4 only at real sizes: its unfused function takes the llvm check 6 s to build)
        k = draw.pick(c for c in ((1, 2) if draw.small else (1, 2, 4)) if c <= (2 if experts == 60 else experts // 2))
        if draw.rng.random() < 0.1:
            return ("topi", _moe_topi(m, experts, k, dtype), None, False, {"op": "moe_routing", "k": k}, 2, {},
                    f"{m}x{experts}_top{k}", 0)
        symbolic = _symbolic(draw)
        func = moe_routing(te.var("m") if symbolic else m, experts, k, dtype)
        return ("te", func, m, symbolic, {"op": "moe_routing", "k": k}, 2, {}, f"{m}x{experts}_top{k}", 0)
    ops = {"norm": ("rms_norm", "layer_norm", "rms_norm_fp8", "rms_norm_residual"), "softmax": ("softmax",),
           "logsumexp": ("logsumexp", "log_softmax", "cross_entropy")}[op_class]
    op = draw.pick(ops)
    style = {"rms_norm_fp8": ("te",), "rms_norm_residual": ("te",), "cross_entropy": ("te",), "logsumexp": ("te",),
             "layer_norm": ("te", "topi", "relax"), "log_softmax": ("topi", "relax", "composed")
             }.get(op, ("te", "topi", "relax", "composed"))
    style = draw.pick(style)
    if style == "relax" and op == "layer_norm":
        dtype = draw.pick(("float16", "float32"))  # TOPI's layer_norm refuses bf16
    symbolic = _symbolic(draw)
    rows = _rows(te.var("m") if symbolic else m, style)
    if op == "rms_norm_fp8":
        func, n_out, params = _rms_norm_fp8(rows, width, dtype), 2, {"op": op, "eps": EPS}
    elif op == "rms_norm_residual":
        func, n_out, params = residual_rms_norm_returned(rows, width, dtype), 2, {"op": op, "eps": EPS}
    elif op == "cross_entropy":
        func, n_out, params = _cross_entropy(rows, width, dtype), 1, {"op": op}
    else:
        func, n_out = _row_op(style, rows, width, dtype, op), 1
        params = {"op": op, "eps": EPS} if op in ("rms_norm", "layer_norm") else {"op": op}
    return style, func, m, symbolic, params, n_out, {}, f"{op}_{m}x{width}", 0


_DRAWS = {"dense": _gemm_case, "gated_dense": _gemm_case, "ffn": _gemm_case, "projections": _gemm_case,
          "attention": _attention_case, "decode_attention": _attention_case, "norm": _row_case, "softmax": _row_case,
          "logsumexp": _row_case, "moe_routing": _row_case}


def generate(seed: int, count: int, small: bool = False) -> list[Case]:
    """``count`` cases, the op classes in turn, every other choice drawn from ``seed``'s stream
    (the same seed and count give the same cases); ``small``: sizes the llvm check runs in
    seconds instead of real models'."""
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        op_class = CLASSES[i % len(CLASSES)]
        draw = _Draw(rng, small)
        style, func, m, symbolic, params, n_out, scales, detail, flops = _DRAWS[op_class](draw, op_class)
        func = func.with_attr("global_symbol", "main")  # Relax's PrimFuncs are private
        dtype = str(func.params[0].ty.dtype)
        name = f"{i:03d}_{op_class}_{style}_{detail}_{dtype}" + ("_symbolic" if symbolic else "")
        args = _spec(func, n_out, {"m": m}, scales)
        cases.append(Case(name, op_class, style, func, args, params, symbolic, flops))
    return cases


