"""Float64 references and torch peers per workload, by name (runtime side: torch only)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Reference:
    """How to check and compete with one workload: called with the kernel's input tensors and
    the manifest's ``reference_kwargs`` (sizes the tensors alone do not determine)."""

    float64: Callable[..., torch.Tensor]
    torch_eager: Callable[..., torch.Tensor]
    torch_sdpa: Callable[..., torch.Tensor] | None = None  # PyTorch's fused attention


def _shuffle(a: torch.Tensor) -> torch.Tensor:
    size = a.shape[1]
    rounds = [(t + 1) * torch.roll(a, shifts=-t, dims=1) for t in range(size)]
    return torch.stack(rounds).sum(0)  # O[c, r] = sum_t (t + 1) A[c, (r + t) % S]


def _reduce_scatter(a: torch.Tensor) -> torch.Tensor:
    c, size, n = a.shape
    return a.sum(1).reshape(c, size, n // size)  # O[c, r, j] = sum_p A[c, p, r m + j]


# Collectives: A[c, r, :] is the tile of CTA r of cluster c (tvm_dsm.workloads.collectives).
_COLLECTIVES = {
    "copy": lambda a: a,
    "all_exchange": lambda a: a.sum(1, keepdim=True).expand_as(a),
    "all_exchange_rs_ag": lambda a: a.sum(1, keepdim=True).expand_as(a),
    "reduce_scatter": _reduce_scatter,
    "broadcast": lambda a: a[:, :1].expand_as(a),
    "shuffle": _shuffle,
    "gated": lambda a: (F.silu(a[:, :1]) * a[:, 1:2]).expand_as(a),
}


def _resident(f: Callable, a: torch.Tensor, n: int) -> torch.Tensor:
    """A resident collective: each tile repeats its pattern A[c, r, :] to n elements, and
    O[c, r] is the sum of CTA r's result."""
    return f(a.repeat(1, 1, n // a.shape[2])).sum(-1)


def _softmax_stats(x):
    m = x.max(1).values
    return m, torch.exp(x - m[:, None]).sum(1)


def _softmax_pv(x, v):
    m = x.max(1).values
    p = torch.exp(x - m[:, None])
    return m, p.sum(1), p @ v


def _rmsnorm_gemv(x, w):
    ss = (x * x).sum(1)
    return ss, (x @ w) / torch.sqrt(ss / x.shape[1])


def _moe_routing(x, k):
    """Softmax over all experts at the k best, best first, ties to the lower index (a stable
    sort), indices int32; the same order tvm-dsm's top-k defines."""
    order = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :k]
    return torch.softmax(x, 1).gather(1, order), order.int()


def _moe_routing_eager(x, k):
    weights, indices = torch.softmax(x.float(), 1).topk(k)
    return weights, indices.int()


#: TOPI's default epsilon of rms_norm and layer_norm.
_NORM_EPS = 1e-5

_CASCADES = {
    "cascade_softmax_stats": _softmax_stats,
    "cascade_logsumexp": lambda x: torch.logsumexp(x, 1),
    "cascade_layernorm_stats": lambda x: tuple(reversed(torch.var_mean(x, 1, unbiased=False))),
    "cascade_rmsnorm_gemv": _rmsnorm_gemv,
    "cascade_softmax_pv": _softmax_pv,
    "cascade_softmax_v": lambda x, v: torch.softmax(x.float(), 1) @ v.float(),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "rms_norm": lambda x, w: F.rms_norm(x, w.shape, w, _NORM_EPS),
    "layer_norm": lambda x, w, b: F.layer_norm(x, w.shape, w, b, _NORM_EPS),
    "split_silu_mul": lambda x: (lambda gate, up: F.silu(gate) * up)(*x.chunk(2, -1)),
    "cast": lambda x: x.half(),
}


def _decode_attention(q, k, v):
    """softmax(q K^T / sqrt(d)) V per row, as a user writes it (the softmax in at least fp32)."""
    scores = torch.einsum("rd,rtd->rt", q, k) / q.shape[1] ** 0.5
    wide = torch.promote_types(scores.dtype, torch.float32)
    p = torch.softmax(scores, 1, dtype=wide)
    return torch.einsum("rt,rtd->rd", p.to(v.dtype), v).to(wide)


def _decode_sdpa(q, k, v):
    """The same through F.scaled_dot_product_attention: rows as heads of one sequence."""
    out = F.scaled_dot_product_attention(q[None, :, None], k[None], v[None])
    return out[0, :, 0].float()


def _attention(q, k, v, causal: bool = False):
    """softmax(q K^T / sqrt(d)) V per head, as a user writes it (softmax in at least fp32);
    ``causal``: query i sees keys t <= i."""
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if causal:
        hidden = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    p = torch.softmax(scores, -1, dtype=torch.promote_types(scores.dtype, torch.float32))
    return p.to(v.dtype) @ v


def _heads_first(x, layout: str):
    """``x`` ([B, S, H, D] when ``layout`` is "bshd") as [B, H, S, D] (a view)."""
    return x.transpose(1, 2) if layout == "bshd" else x


def _attention_layout(q, k, v, layout: str = "bhsd", causal: bool = False):
    """Attention over [B, H, S, D] or [B, S, H, D] as a user writes it: key/value heads of a
    group repeated for its query heads (grouped-query attention), then :func:`_attention`."""
    q, k, v = (_heads_first(x, layout) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return _heads_first(_attention(q, k, v, causal), layout)


def _logits_with_terms(q, k, extra, terms: str):
    """The exponents of :func:`tvm_dsm.workloads.attention_forms.attention_with_terms`'s form
    ``terms`` (scores in q's type, the terms in at least fp32)."""
    x = (q @ k.transpose(-1, -2)).to(torch.promote_types(q.dtype, torch.float32)) / q.shape[-1] ** 0.5
    i = torch.arange(x.shape[-2], device=x.device)[:, None]
    t = torch.arange(x.shape[-1], device=x.device)[None, :]
    lowest = torch.finfo(torch.float32).min
    if terms == "bias":
        return x + extra
    if terms == "alibi":
        return torch.where(t <= i, x + extra[:, None, None] * (t - i), lowest)
    if terms == "softcap":
        return torch.tanh(x / 30.0) * 30.0
    if terms == "window":
        return torch.where((t <= i) & (t > i - 64), x, lowest)
    if terms == "fp16_fill":
        return torch.where(t <= i, x, -65504.0)
    if terms == "padding":
        return torch.where(extra != 0, x, lowest)
    raise ValueError(terms)


def _attention_with_terms(q, k, v, *extra, terms: str):
    p = torch.softmax(_logits_with_terms(q, k, extra[0] if extra else None, terms), -1)
    return p.to(v.dtype) @ v


def _sdpa_with_terms(q, k, v, *extra, terms: str):
    """SDPA with the terms as its ``attn_mask`` (built per call where they are not an input)."""
    mask = {
        "bias": lambda: extra[0],
        "padding": lambda: extra[0][None, None, None, :],
        "alibi": lambda: _logits_with_terms(torch.zeros_like(q[..., :1]), torch.zeros_like(k[..., :1]),
                                            extra[0], "alibi").to(q.dtype),
        "window": lambda: _logits_with_terms(torch.zeros_like(q[..., :1]), torch.zeros_like(k[..., :1]),
                                             None, "window") == 0,
    }[terms]()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _decode_attention_terms(q, k, v, *extra, terms: str):
    """:func:`tvm_dsm.workloads.attention_forms.decode_attention_with_terms`'s form ``terms``:
    q [B, H, D], k and v [B, Hkv, S, D] (``extra``: ALiBi's slopes)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    x = torch.einsum("bhd,bhtd->bht", q, k).to(torch.promote_types(q.dtype, torch.float32)) / q.shape[-1] ** 0.5
    keys = k.shape[2]
    t = torch.arange(keys, device=x.device)
    if terms == "softcap":
        x = torch.tanh(x / 30.0) * 30.0
    elif terms == "window":
        x = torch.where(t >= keys - 100, x, torch.finfo(torch.float32).min)
    else:
        x = x + extra[0][None, :, None] * (t - (keys - 1))
    return torch.einsum("bht,bhtd->bhd", torch.softmax(x, -1), v.to(x.dtype))


def _sdpa_layout(q, k, v, layout: str = "bhsd", causal: bool = False):
    q, k, v = (_heads_first(x, layout) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return _heads_first(out, layout)


def _conv_chain(x, w1, w2, k1):
    """conv_1x1(relu(conv_k1(X, W1)), W2) in NHWC with OHWI weights, through torch's NCHW convs
    on channels-last tensors (cuDNN), the intermediate in the input type."""
    def conv(a, w, k):
        return F.conv2d(a, w.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last), padding=k // 2)

    h = torch.relu(conv(x.permute(0, 3, 1, 2), w1, k1)).to(x.dtype)
    return conv(h, w2, 1).permute(0, 2, 3, 1)


def _lm_head_max(h, w, b, seq):
    """Sparton's term weights the way a PyTorch user writes them: the logits materialized."""
    logits = F.linear(h, w, b)
    return torch.log1p(torch.relu(logits)).view(-1, seq, w.shape[0]).amax(1).float()


def _scaled_mm(xq, wq, sx, sw):
    """torch's fp8 GEMM with row-wise scales (cuBLASLt on the H100)."""
    return torch._scaled_mm(xq, wq.t(), scale_a=sx[:, None].contiguous(),
                            scale_b=sw[None, :].contiguous(), out_dtype=torch.float16)


def _quantize(x):
    """Per-token e4m3 quantization as tvm_dsm.workloads.dense.quantized_dense defines it, with
    its scales correctly rounded fp32 quotients (torch divides by a scalar, and a scalar by a
    tensor, through a reciprocal: 1-ulp-off scales flip roundings across whole rows)."""
    amax = x.abs().amax(1).double().clamp(min=1e-12)
    inverse, sx = (448.0 / amax).float(), (amax / 448.0).float()
    return (x.float() * inverse[:, None]).to(torch.float8_e4m3fn), sx


def _scaled_mm_float64(xq, wq, sx, sw):
    return (xq.double() @ wq.double().T) * sx.double()[:, None] * sw.double()[None, :]


def _quantized_dense(x, wq, sw):
    xq, sx = _quantize(x)
    return _scaled_mm(xq, wq, sx, sw)


def _quantized_dense_float64(x, wq, sw):
    xq, sx = _quantize(x)
    return _scaled_mm_float64(xq, wq, sx, sw)


def _split_sum(a: torch.Tensor, clusters_per_group: int) -> torch.Tensor:
    k = clusters_per_group  # O[g] = sum of the tiles of the group's k clusters x S CTAs
    return a.reshape(a.shape[0] // k, k * a.shape[1], a.shape[2]).sum(1)


def _weight(w, layout: str):
    """``w`` as [..., K, N] (it is [..., N, K], torch.nn.Linear's, when ``layout`` is "nk")."""
    return w.mT if layout == "nk" else w


def _any_attention(q, k, v, layout: str = "bhsd", causal: bool = False):
    """:func:`_attention_layout`, and for "hsd" (no batch axis) over one batch."""
    if layout == "hsd":
        return _attention_layout(q[None], k[None], v[None], "bhsd", causal)[0]
    return _attention_layout(q, k, v, layout, causal)


def _rms_norm_fp8(x, w, eps):
    """RMSNorm, then per-token float8_e4m3fn quantization (each row's max |y| onto 448):
    (quantized rows, in x's type, and their scales)."""
    y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w
    amax = y.abs().amax(-1).clamp(min=1e-12)
    return (y * (448.0 / amax)[:, None]).to(torch.float8_e4m3fn).to(x.dtype), amax / 448.0


#: tvm_dsm.workloads.generated's functions, by their ``op`` (the same definitions as that
#: module's numpy references, which the CPU tests check against TVM's llvm build).
_GENERATED = {
    "dense": lambda x, w, layout: x @ _weight(w, layout),
    "projections": lambda x, *ws, layout: tuple(x @ _weight(w, layout) for w in ws),
    "gated_dense": lambda x, wg, wu, layout: F.silu(x @ _weight(wg, layout)) * (x @ _weight(wu, layout)),
    "ffn": lambda a, w1, w2, layout, activation: getattr(F, activation)(a @ _weight(w1, layout)) @ _weight(w2, layout),
    "swiglu": lambda a, wg, wu, w2, layout: (F.silu(a @ _weight(wg, layout)) * (a @ _weight(wu, layout)))
    @ _weight(w2, layout),
    "attention": _any_attention,
    "attention_terms": _attention_with_terms,
    "decode_attention": lambda q, k, v: _attention_layout(q[:, :, None], k, v)[:, :, 0],
    "decode_attention_terms": _decode_attention_terms,
    "rms_norm": lambda x, w, eps: F.rms_norm(x, w.shape, w, eps),
    "rms_norm_residual": lambda x, r, w, eps: (x + r, F.rms_norm(x + r, w.shape, w, eps)),
    "layer_norm": lambda x, w, b, eps: F.layer_norm(x, w.shape, w, b, eps),
    "rms_norm_fp8": _rms_norm_fp8,
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "logsumexp": lambda x: torch.logsumexp(x, -1),
    "cross_entropy": lambda x, t: (t * (torch.logsumexp(x, -1, keepdim=True) - x)).sum(-1),
    "moe_routing": _moe_routing,
}


REFERENCES: dict[str, Reference] = {
    "row_sum": Reference(
        float64=lambda a: a.double().sum(1),
        torch_eager=lambda a: a.float().sum(1),
    ),
    "gemv": Reference(
        float64=lambda a, x: a.double() @ x.double(),
        torch_eager=lambda a, x: torch.mv(a, x).float(),
    ),
    **{
        f"collective_{kind}": Reference(
            float64=lambda a, f=f: f(a.double()),
            torch_eager=lambda a, f=f: f(a.float()).to(a.dtype).contiguous(),
        )
        for kind, f in _COLLECTIVES.items()
    },
    **{
        f"collective_resident_{kind}": Reference(
            float64=lambda a, n, f=f: _resident(f, a.double(), n),
            torch_eager=lambda a, n, f=f: _resident(f, a.float(), n),
        )
        for kind, f in _COLLECTIVES.items()
    },
    **{
        name: Reference(
            float64=lambda *t, f=f: f(*[a.double() for a in t]),
            torch_eager=f,
        )
        for name, f in _CASCADES.items()
    },
    "cascade_moe_routing": Reference(
        float64=lambda x, k: _moe_routing(x.double(), k),
        torch_eager=_moe_routing_eager,
    ),
    "decode_attention": Reference(
        float64=lambda q, k, v: _decode_attention(q.double(), k.double(), v.double()),
        torch_eager=_decode_attention,
        torch_sdpa=_decode_sdpa,
    ),
    "attention": Reference(
        float64=lambda q, k, v, causal=False: _attention(q.double(), k.double(), v.double(), causal),
        torch_eager=_attention,
        torch_sdpa=lambda q, k, v, causal=False: F.scaled_dot_product_attention(
            q[None], k[None], v[None], is_causal=causal)[0],
    ),
    "attention_layout": Reference(
        float64=lambda q, k, v, **kw: _attention_layout(q.double(), k.double(), v.double(), **kw),
        torch_eager=_attention_layout,
        torch_sdpa=_sdpa_layout,
    ),
    "attention_terms": Reference(
        float64=lambda *t, terms: _attention_with_terms(*(a.double() for a in t), terms=terms),
        torch_eager=_attention_with_terms,
        torch_sdpa=_sdpa_with_terms,
    ),
    "batched_matmul": Reference(
        float64=lambda x, w, layout: x.double() @ _weight(w.double(), layout),
        torch_eager=lambda x, w, layout: x @ _weight(w, layout),
    ),
    "dense": Reference(
        float64=lambda x, w: x.double() @ w.double().T,
        torch_eager=torch.nn.functional.linear,
    ),
    "dense_bias_silu": Reference(
        float64=lambda x, w, b: torch.nn.functional.silu(x.double() @ w.double().T + b.double()),
        torch_eager=lambda x, w, b: torch.nn.functional.silu(torch.nn.functional.linear(x, w, b)),
    ),
    "gated_dense": Reference(
        float64=lambda x, wg, wu: F.silu(x.double() @ wg.double().T) * (x.double() @ wu.double().T),
        torch_eager=lambda x, wg, wu: F.silu(F.linear(x, wg)) * F.linear(x, wu),
    ),
    "gemm_chain_relu": Reference(
        float64=lambda a, w1, w2: torch.relu(a.double() @ w1.double().T) @ w2.double().T,
        torch_eager=lambda a, w1, w2: F.linear(torch.relu(F.linear(a, w1)), w2),
    ),
    "ffn_relu_nk": Reference(
        float64=lambda a, w1, w2: torch.relu(a.double() @ w1.double().T) @ w2.double().T,
        torch_eager=lambda a, w1, w2: F.linear(torch.relu(F.linear(a, w1)), w2),
    ),
    "ffn_relu_kn": Reference(
        float64=lambda a, w1, w2: torch.relu(a.double() @ w1.double()) @ w2.double(),
        torch_eager=lambda a, w1, w2: torch.relu(a @ w1) @ w2,
    ),
    "swiglu": Reference(
        float64=lambda a, wg, wu, w2: (F.silu(a.double() @ wg.double().T) * (a.double() @ wu.double().T)) @ w2.double().T,
        torch_eager=lambda a, wg, wu, w2: F.linear(F.silu(F.linear(a, wg)) * F.linear(a, wu), w2),
    ),
    "conv_chain_relu": Reference(
        float64=lambda x, w1, w2, k1: _conv_chain(x.double(), w1.double(), w2.double(), k1),
        torch_eager=_conv_chain,
    ),
    "lm_head_max": Reference(
        float64=lambda h, w, b, seq: _lm_head_max(h.double(), w.double(), b.double(), seq),
        torch_eager=_lm_head_max,
    ),
    "scaled_dense": Reference(float64=_scaled_mm_float64, torch_eager=_scaled_mm),
    "quantized_dense": Reference(float64=_quantized_dense_float64, torch_eager=_quantized_dense),
    "generated": Reference(
        float64=lambda *t, op, **kw: _GENERATED[op](*[a.double() for a in t], **kw),
        torch_eager=lambda *t, op, **kw: _GENERATED[op](*t, **kw),
    ),
    "split_sum": Reference(
        float64=lambda a, clusters_per_group: _split_sum(a.double(), clusters_per_group),
        torch_eager=lambda a, clusters_per_group: _split_sum(a.float(), clusters_per_group),
    ),
}
