"""Attention as torch model code spells it out by hand (``softmax(q @ k^T * scale + mask) @ v`` in
the forms Hugging Face's eager attention, BERT, GPT-2, OPT, GPT-NeoX, BLOOM, Phi-2, Llama and
Mistral write it), exported with ``torch.export``, imported with
:func:`tvm_dsm.relax_torch.from_exported_program`, rewritten by
:data:`tvm_dsm.relax_patterns.RewriteToRelaxOps` and
:data:`tvm_dsm.relax_attention_masks.AttentionMasksFromConstants`, compiled for llvm: the same
values as the module in float64 (relative L2 error below 2e-3 over the queries that keep a key),
finite wherever torch's own fp16 output is finite; and each read as :data:`READS` says (the
attention operator, the function made of it, or left spelled out)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import tvm  # noqa: E402
from tvm import relax  # noqa: E402
from tvm_dsm.relax_attention_masks import AttentionMasksFromConstants  # noqa: E402
from tvm_dsm.relax_patterns import RewriteToRelaxOps  # noqa: E402
from tvm_dsm.relax_torch import from_exported_program  # noqa: E402
from conftest import LLVM  # noqa: E402  (llvm unoptimized: the same values bit for bit here, checked)

B, H, KVH, T, D = 2, 4, 2, 16, 64
SCALE = D ** -0.5  # 0.125: exact in fp16
WINDOW = 5
MASKED = -3.0e4  # a mask value at or below this hides its key (tvm_dsm.relax_attention_masks.MASKED_FILL)


def _wide(x: torch.Tensor) -> torch.dtype:
    """fp32 for a 16-bit model (Hugging Face's ``softmax(.., dtype=torch.float32)``), float64 for
    the float64 reference run of the same module."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _causal_keep(tq: int, tk: int) -> torch.Tensor:
    """Bottom-right aligned causal keep mask (top-left where ``tq == tk``), from ``arange``."""
    i = torch.arange(tq).view(-1, 1)
    j = torch.arange(tk).view(1, -1)
    return j <= i + (tk - tq)


# ---------------------------------------------------------------------------------------------
# The spellings. Each takes q, k, v (and a mask where the spelling takes one) and returns the
# attention output; each computes its fills from the scores' dtype, so ``module.double()`` on
# float64 inputs is the float64 equivalent.
# ---------------------------------------------------------------------------------------------


class MaskedFillTriuFinfoMin(torch.nn.Module):
    """``masked_fill(ones(t, t, bool).triu(1), finfo.min)``, scores divided by ``sqrt(d)``,
    softmax in fp32 rounded back (Hugging Face eager)."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        masked = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(masked, torch.finfo(s.dtype).min)
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


class MaskedFillNegInf(torch.nn.Module):
    """``masked_fill(triu, -inf)``, scores multiplied by the scale, softmax in fp16."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        s = (q @ k.transpose(-2, -1)) * SCALE
        masked = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        s = s.masked_fill(masked, float("-inf"))
        return s.softmax(dim=-1) @ v


class GPT2WhereKeep(torch.nn.Module):
    """GPT-2's eager attention: a bool ``tril`` buffer sliced to the lengths, the scores divided
    by ``torch.full([], sqrt(d))``, ``torch.where(causal, scores, full([], finfo.min))``, softmax
    in the scores' type."""

    def __init__(self, positions: int = 32):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(positions, positions, dtype=torch.bool))
                             .view(1, 1, positions, positions), persistent=False)

    def forward(self, q, k, v):
        s = torch.matmul(q, k.transpose(-1, -2))
        s = s / torch.full([], v.size(-1) ** 0.5, dtype=s.dtype, device=s.device)
        ql, kl = q.size(-2), k.size(-2)
        causal = self.bias[:, :, kl - ql:kl, :kl]
        fill = torch.full([], torch.finfo(s.dtype).min, dtype=s.dtype, device=s.device)
        s = torch.where(causal, s.to(s.dtype), fill)
        return torch.matmul(F.softmax(s, dim=-1).type(v.dtype), v)


class WhereKeepScoresFill(torch.nn.Module):
    """``torch.where(keep, scores * scale, tensor(finfo.min))``, keep a ``tril`` of ones."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        keep = torch.tril(torch.ones(t, t, dtype=torch.bool))
        s = torch.matmul(q, k.transpose(2, 3)) * SCALE
        s = torch.where(keep, s, torch.tensor(torch.finfo(s.dtype).min, dtype=s.dtype))
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


class WhereMaskedFillScores(torch.nn.Module):
    """``torch.where(key > query, tensor(finfo.min), scores / sqrt(d))``, the condition built
    from ``arange``."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        masked = torch.arange(t).view(1, -1) > torch.arange(t).view(-1, 1)
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        s = torch.where(masked, torch.tensor(torch.finfo(s.dtype).min, dtype=s.dtype), s)
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


class AdditiveFullMinTriu(torch.nn.Module):
    """Llama's eager attention with its causal mask ``full((t, t), finfo.min).triu(1)`` added."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        mask = torch.full((t, t), torch.finfo(q.dtype).min, dtype=q.dtype, device=q.device).triu(1)
        s = torch.matmul(q, k.transpose(2, 3)) * SCALE + mask[None, None, :, :]
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


class AdditiveMaskInput(torch.nn.Module):
    """An additive ``[batch, 1, queries, keys]`` mask passed in (causal and left padding, a query
    whose every key is masked), softmax in fp32 rounded back."""

    def forward(self, q, k, v, mask):
        s = torch.matmul(q, k.transpose(2, 3)) * SCALE + mask
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


class BoolMaskInputFinfoMin(torch.nn.Module):
    """A bool keep mask passed in (a query with no key), ``masked_fill(~keep, finfo.min)``."""

    def forward(self, q, k, v, keep):
        s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~keep, torch.finfo(s.dtype).min)
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


class BoolMaskInputNegInf(torch.nn.Module):
    """A bool keep mask passed in (a query with no key), ``masked_fill(~keep, -inf)``, softmax
    in fp16: torch's own empty row is NaN."""

    def forward(self, q, k, v, keep):
        s = torch.matmul(q, k.transpose(2, 3)) * SCALE
        s = s.masked_fill(~keep, float("-inf"))
        return torch.matmul(F.softmax(s, dim=-1), v)


class BertExtendedMask(torch.nn.Module):
    """BERT: a ``[batch, keys]`` 0/1 padding mask passed in, extended as ``(1 - m[:, None, None,
    :]) * finfo.min`` and added to ``scores / sqrt(d)``, softmax in fp16."""

    def forward(self, q, k, v, attention_mask):
        extended = (1.0 - attention_mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        s = s + extended
        return torch.matmul(F.softmax(s, dim=-1), v)


def _opt_causal_mask(t: int, dtype: torch.dtype) -> torch.Tensor:
    """OPT's (old Hugging Face) ``_make_causal_mask``."""
    mask = torch.full((t, t), torch.finfo(dtype).min, dtype=dtype)
    cond = torch.arange(mask.size(-1))
    mask = mask.masked_fill(cond < (cond + 1).view(mask.size(-1), 1), 0)
    return mask.to(dtype)[None, None, :, :]


class OPTClamp(torch.nn.Module):
    """OPT: q scaled first, ``bmm`` of ``[batch * heads, tokens, dim]`` views, the view back plus
    the causal mask, ``clamp(min=finfo.min)``, softmax in fp32 rounded back over the views."""

    def __init__(self, max_tensor: bool = False):
        super().__init__()
        self.max_tensor = max_tensor

    def forward(self, q, k, v):
        b, h, t, d = q.shape
        q = (q * SCALE).reshape(b * h, t, d)
        k, v = k.reshape(b * h, t, d), v.reshape(b * h, t, d)
        w = torch.bmm(q, k.transpose(1, 2))
        w = w.view(b, h, t, t) + _opt_causal_mask(t, q.dtype)
        if self.max_tensor:  # the literal code of transformers 4.2x
            w = torch.max(w, torch.tensor(torch.finfo(w.dtype).min))
        else:
            w = w.clamp(min=torch.finfo(w.dtype).min)
        w = w.view(b * h, t, t)
        p = F.softmax(w, dim=-1, dtype=_wide(w)).to(q.dtype)
        return torch.bmm(p, v).view(b, h, t, d)


class NeoXBaddbmm(torch.nn.Module):
    """GPT-NeoX: ``baddbmm(zeros, q, k^T, beta=1, alpha=1/sqrt(d))`` over ``[batch * heads,
    tokens, dim]`` views, viewed back, ``where(causal buffer slice, scores, tensor(finfo.min))``,
    softmax in the scores' type."""

    def __init__(self, positions: int = 32):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(positions, positions, dtype=torch.bool))
                             .view(1, 1, positions, positions), persistent=False)

    def forward(self, q, k, v):
        b, h, ql, d = q.shape
        kl = k.size(-2)
        causal = self.bias[:, :, kl - ql:kl, :kl]
        qv, kv = q.reshape(b * h, ql, d), k.reshape(b * h, kl, d)
        scores = torch.zeros(b * h, ql, kl, dtype=q.dtype, device=q.device)
        scores = torch.baddbmm(scores, qv, kv.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(d))
        scores = scores.view(b, h, ql, kl)
        fill = torch.tensor(torch.finfo(scores.dtype).min, dtype=scores.dtype).to(scores.device)
        scores = torch.where(causal, scores, fill)
        p = F.softmax(scores, dim=-1).to(v.dtype)
        return torch.matmul(p, v)


class BloomAlibi(torch.nn.Module):
    """BLOOM: q, k, v ``[batch, tokens, heads, dim]``; ``alibi.baddbmm(q, k, beta=1,
    alpha=1/sqrt(d))`` of ALiBi ``[batch * heads, 1, keys]`` (built from constants), k permuted to
    ``[batch, heads, dim, tokens]`` before its view; ``masked_fill(causal, finfo.min)``; softmax
    in fp32 rounded back; ``bmm`` with v, viewed back to ``[batch, tokens, heads, dim]``."""

    def forward(self, q, k, v):
        b, t, h, d = q.shape
        slopes = torch.pow(2.0, -8.0 * torch.arange(1, h + 1, dtype=torch.float32) / h)
        alibi = (slopes[:, None] * torch.arange(t, dtype=torch.float32)[None, :])[:, None, :]  # [h, 1, t]
        alibi = alibi.expand(b, h, 1, t).reshape(b * h, 1, t).to(q.dtype)
        qv = q.transpose(1, 2).reshape(b * h, t, d)
        kv = k.permute(0, 2, 3, 1).reshape(b * h, d, t)
        vv = v.transpose(1, 2).reshape(b * h, t, d)
        scores = alibi.baddbmm(batch1=qv, batch2=kv, beta=1.0, alpha=1.0 / math.sqrt(d)).view(b, h, t, t)
        masked = torch.ones(t, t, dtype=torch.bool).triu(1)[None, None]
        w = torch.masked_fill(scores, masked, torch.finfo(scores.dtype).min)
        p = F.softmax(w, dim=-1, dtype=_wide(w)).to(q.dtype).view(b * h, t, t)
        return torch.bmm(p, vv).view(b, h, t, d).permute(0, 2, 1, 3)


class BartScaledQuery(torch.nn.Module):
    """BART/Whisper cross attention: q scaled before the product, ``bmm`` of ``[batch * heads,
    tokens, dim]`` views (fewer queries than keys), no mask, softmax in fp16."""

    def forward(self, q, k, v):
        b, h, tq, d = q.shape
        tk = k.size(2)
        qv = (q * SCALE).reshape(b * h, tq, d)
        kv, vv = k.reshape(b * h, tk, d), v.reshape(b * h, tk, d)
        w = F.softmax(torch.bmm(qv, kv.transpose(1, 2)), dim=-1)
        return torch.bmm(w, vv).view(b, h, tq, d)


class ScaleFoldedIntoQK(torch.nn.Module):
    """The scale folded into q and k (``d ** -0.25`` each, as guided diffusion writes it "more
    stable with f16 than dividing afterwards"), the softmax of ``.float()`` cast back, a causal
    ``masked_fill``."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        scale = 1.0 / math.sqrt(math.sqrt(q.shape[-1]))
        w = torch.matmul(q * scale, (k * scale).transpose(-1, -2))
        w = w.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), torch.finfo(w.dtype).min)
        w = torch.softmax(w.to(_wide(w)), dim=-1).type(w.dtype)
        return torch.matmul(w, v)


class EinsumAttention(torch.nn.Module):
    """Stable Diffusion's ``CrossAttention``: ``einsum('b i d, b j d -> b i j') * scale`` over
    ``[batch * heads, tokens, dim]``, softmax in fp16, ``einsum('b i j, b j d -> b i d')``."""

    def forward(self, q, k, v):
        b, h, t, d = q.shape
        q, k, v = (x.reshape(b * h, t, d) for x in (q, k, v))
        sim = torch.einsum("bid,bjd->bij", q, k) * SCALE
        out = torch.einsum("bij,bjd->bid", sim.softmax(dim=-1), v)
        return out.view(b, h, t, d)


class Phi2Widened(torch.nn.Module):
    """Phi-2: ``q.float() @ k.float().transpose(2, 3) / sqrt(d)``, an fp16 causal mask (fp16's
    minimum above the diagonal, from ``arange``) added to the fp32 scores, softmax in fp32
    rounded to v's type."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        wide = _wide(q)
        keep = _causal_keep(t, t)
        mask = torch.where(keep, torch.zeros((), dtype=q.dtype), torch.finfo(q.dtype).min)[None, None]
        w = torch.matmul(q.to(wide), k.to(wide).transpose(2, 3)) / math.sqrt(q.shape[-1])
        w = w + mask
        w = F.softmax(w, dim=-1, dtype=wide).to(v.dtype)
        return torch.matmul(w, v)


class GQARepeatInterleave(torch.nn.Module):
    """Grouped-query attention, k and v ``repeat_interleave``-d to q's heads, a causal
    ``masked_fill(finfo.min)``."""

    def forward(self, q, k, v):
        group, t = q.size(1) // k.size(1), q.size(2)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        s = torch.matmul(q, k.transpose(-1, -2)) * SCALE
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), torch.finfo(s.dtype).min)
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Llama's ``repeat_kv``."""
    b, kvh, t, d = x.shape
    return x[:, :, None, :, :].expand(b, kvh, n_rep, t, d).reshape(b, kvh * n_rep, t, d)


class LlamaGQAExpand(torch.nn.Module):
    """Llama's eager attention: ``repeat_kv`` (expand + reshape), scores times the scale plus a
    ``full(finfo.min).triu(1)`` mask, softmax in fp32 rounded to q's type."""

    def forward(self, q, k, v):
        group, t = q.size(1) // k.size(1), q.size(2)
        k, v = _repeat_kv(k, group), _repeat_kv(v, group)
        mask = torch.full((t, t), torch.finfo(q.dtype).min, dtype=q.dtype).triu(1)[None, None]
        w = torch.matmul(q, k.transpose(2, 3)) * SCALE + mask[:, :, :, : k.shape[-2]]
        return torch.matmul(F.softmax(w, dim=-1, dtype=_wide(w)).to(q.dtype), v)


class MQABroadcast(torch.nn.Module):
    """Multi-query attention: one k and v head ``[batch, 1, tokens, dim]`` broadcast by
    ``matmul`` over q's heads, a causal ``masked_fill``, softmax in fp16."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        s = torch.matmul(q, k.transpose(-1, -2)) * SCALE
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), torch.finfo(s.dtype).min)
        return torch.matmul(s.softmax(-1), v)


class MistralSlidingWindow(torch.nn.Module):
    """Mistral's sliding window from ``arange`` comparisons (``key > query | key <= query -
    window``) as an additive ``zeros.masked_fill(.., finfo.min)`` mask, ``repeat_kv``, softmax
    in fp32 rounded back."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        k, v = _repeat_kv(k, q.size(1) // k.size(1)), _repeat_kv(v, q.size(1) // v.size(1))
        i, j = torch.arange(t).view(-1, 1), torch.arange(t).view(1, -1)
        masked = (j > i) | (j <= i - WINDOW)
        mask = torch.zeros(t, t, dtype=q.dtype).masked_fill(masked, torch.finfo(q.dtype).min)
        w = torch.matmul(q, k.transpose(2, 3)) * SCALE + mask
        return torch.matmul(F.softmax(w, dim=-1, dtype=_wide(w)).to(q.dtype), v)


class BottomRightCausal(torch.nn.Module):
    """A chunk of queries after cached keys (fewer queries than keys): ``ones(tq, tk,
    bool).tril(tk - tq)``, ``torch.where(keep, scores, finfo.min)``."""

    def forward(self, q, k, v):
        tq, tk = q.shape[-2], k.shape[-2]
        keep = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
        s = torch.matmul(q, k.transpose(-1, -2)) * SCALE
        s = torch.where(keep, s, torch.finfo(s.dtype).min)
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


class BottomRightSlidingWindow(torch.nn.Module):
    """A chunk of queries after cached keys within a sliding window, the mask additive from
    ``arange``: ``key > query + (tk - tq)`` or ``key <= query + (tk - tq) - window``."""

    def forward(self, q, k, v):
        tq, tk = q.shape[-2], k.shape[-2]
        i, j = torch.arange(tq).view(-1, 1) + (tk - tq), torch.arange(tk).view(1, -1)
        masked = (j > i) | (j <= i - WINDOW)
        mask = torch.where(masked, torch.finfo(q.dtype).min, torch.zeros((), dtype=q.dtype))
        w = torch.matmul(q, k.transpose(2, 3)) * SCALE + mask
        return torch.matmul(F.softmax(w, dim=-1, dtype=_wide(w)).to(q.dtype), v)


class BertNoMaskGiven(torch.nn.Module):
    """BERT called without an attention mask: Hugging Face makes one of ones, ``[batch,
    keys]``, and extends it as ``(1 - m[:, None, None, :]) * finfo.min`` (a constant
    ``[batch, 1, 1, keys]`` of zeros, broadcast over the queries), softmax in fp16."""

    def forward(self, q, k, v):
        attention_mask = torch.ones(q.size(0), k.size(-2))
        extended = (1.0 - attention_mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + extended
        return torch.matmul(F.softmax(s, dim=-1), v)


class AlibiNoCausal(torch.nn.Module):
    """MPT's ``build_alibi_bias`` (``slope[h] * arange(1 - keys, 1)``, ``[1, heads, 1, keys]``,
    broadcast over the queries) added to the scores with no causal mask (MPT's bidirectional /
    prefix-LM use, an ALiBi encoder), softmax in fp16."""

    def forward(self, q, k, v):
        h, tk = q.size(1), k.size(-2)
        slopes = torch.pow(2.0, -8.0 * torch.arange(1, h + 1, dtype=torch.float32) / h)
        alibi = (slopes.view(1, h, 1, 1) * torch.arange(1 - tk, 1, dtype=torch.float32).view(1, 1, 1, tk))
        s = torch.matmul(q, k.transpose(-1, -2)) * SCALE + alibi.to(q.dtype)
        return torch.matmul(s.softmax(dim=-1), v)


class GPTJWhereThenScale(torch.nn.Module):
    """GPT-J's eager attention: q and k widened to fp32, ``where(causal, scores, finfo(fp32).min)``
    before the scores are divided by ``sqrt(d)``, softmax in fp32 rounded to v's type."""

    def __init__(self, positions: int = 32):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones(positions, positions, dtype=torch.bool))
                             .view(1, 1, positions, positions), persistent=False)

    def forward(self, q, k, v):
        ql, kl = q.size(-2), k.size(-2)
        causal = self.bias[:, :, kl - ql:kl, :kl]
        s = torch.matmul(q.to(_wide(q)), k.to(_wide(k)).transpose(-1, -2))
        s = torch.where(causal, s, torch.tensor(torch.finfo(s.dtype).min, dtype=s.dtype))
        s = s / math.sqrt(q.shape[-1])
        return torch.matmul(F.softmax(s, dim=-1).to(v.dtype), v)


class MPTAlibiWidened(torch.nn.Module):
    """MPT's eager attention: the scores scaled in the model's type, an fp32 ALiBi bias
    ``[heads, 1, positions]`` (``slope[h] * arange(1 - positions, 1)``) sliced to the keys and
    added (widening the scores), ``masked_fill(triu, finfo(fp16).min)``, softmax in fp32 rounded
    back."""

    def __init__(self, heads: int = H, positions: int = 32):
        super().__init__()
        slopes = 1.0 / torch.pow(2, torch.arange(1, heads + 1, dtype=torch.float32) * (8 / heads))
        alibi = torch.arange(1 - positions, 1, dtype=torch.int32).view(1, 1, positions) * slopes.view(heads, 1, 1)
        self.register_buffer("alibi", alibi, persistent=False)

    def forward(self, q, k, v):
        tq, tk = q.size(-2), k.size(-2)
        s = torch.matmul(q, k.transpose(-1, -2)) * SCALE
        s = s + self.alibi[:, max(0, self.alibi.size(1) - tq):, self.alibi.size(2) - tk:].to(_wide(s))
        causal = torch.triu(torch.ones(tq, tk, dtype=torch.bool), diagonal=1)[None, None]
        s = s.masked_fill(causal, torch.finfo(q.dtype).min)
        return torch.matmul(F.softmax(s.to(_wide(s)), dim=-1).to(v.dtype), v)


class Gemma2SoftCap(torch.nn.Module):
    """Gemma-2's eager attention: scores times ``query_pre_attn_scalar ** -0.5``, capped by
    ``tanh(s / cap) * cap``, a causal additive mask sliced from a longer one, softmax in fp32
    rounded back (the cap keeps the kernel from reading the problem as R.nn.attention). A cap of
    5, not Gemma-2's 50: TVM's llvm fp16 ``tanh`` of the small arguments ``s / 50`` misses by
    5x torch's error (the per-operator CPU build this file checks; the GPU's is fp32)."""

    def __init__(self, cap: float = 5.0, positions: int = 32):
        super().__init__()
        self.cap = cap
        self.register_buffer("mask", torch.full((positions, positions), -1e4).triu(1)[None, None], persistent=False)

    def forward(self, q, k, v):
        tq, tk = q.size(-2), k.size(-2)
        s = torch.matmul(q, k.transpose(2, 3)) * SCALE
        s = torch.tanh(s / self.cap) * self.cap
        s = s + self.mask[:, :, :tq, :tk].to(s.dtype)
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


class MQASoftCapMaskedFill(torch.nn.Module):
    """Multi-query attention (one k and v head broadcast by ``matmul``) with a tanh soft cap and a
    causal ``masked_fill(finfo.min)``, softmax in fp32 rounded back: the cap keeps it from
    ``R.nn.attention``."""

    def __init__(self, cap: float = 5.0):
        super().__init__()
        self.cap = cap

    def forward(self, q, k, v):
        t = q.shape[-2]
        s = torch.matmul(q, k.transpose(-1, -2)) * SCALE
        s = torch.tanh(s / self.cap) * self.cap
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), torch.finfo(s.dtype).min)
        return torch.matmul(F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype), v)


class WidenedFp32MaskInput(torch.nn.Module):
    """Phi-2's widened scores with an fp32 additive mask passed in (finfo(float32).min where
    masked, a query with no key), softmax in fp32 rounded back."""

    def forward(self, q, k, v, mask):
        wide = _wide(q)
        w = torch.matmul(q.to(wide), k.to(wide).transpose(2, 3)) * SCALE + mask
        return torch.matmul(F.softmax(w, dim=-1, dtype=wide).to(v.dtype), v)


class ManualSoftmax(torch.nn.Module):
    """The softmax written out, ``e = exp(s - s.max(-1)); e / e.sum(-1)``, in fp16, after a
    causal ``masked_fill(finfo.min)``."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        s = torch.matmul(q, k.transpose(-1, -2)) * SCALE
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), torch.finfo(s.dtype).min)
        e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
        return torch.matmul(e / e.sum(dim=-1, keepdim=True), v)


class MegatronBaddbmmBetaZero(torch.nn.Module):
    """Megatron / ChatGLM: ``baddbmm(torch.empty(..), q, k^T, beta=0.0, alpha=1/sqrt(d))`` over
    ``[batch * heads, tokens, dim]`` views (the empty buffer's contents ignored), viewed back, a
    causal ``masked_fill(finfo.min)``, softmax in fp32 rounded back, ``bmm`` with v."""

    def forward(self, q, k, v):
        b, h, t, d = q.shape
        out = torch.empty(b * h, t, t, dtype=q.dtype, device=q.device)
        s = torch.baddbmm(out, q.reshape(b * h, t, d), k.reshape(b * h, t, d).transpose(1, 2), beta=0.0,
                          alpha=1.0 / math.sqrt(d)).view(b, h, t, t)
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), torch.finfo(s.dtype).min)
        p = F.softmax(s, dim=-1, dtype=_wide(s)).to(q.dtype).view(b * h, t, t)
        return torch.bmm(p, v.reshape(b * h, t, d)).view(b, h, t, d)


class GPTBigCodeHeadRows(torch.nn.Module):
    """GPT-BigCode's (StarCoder's) eager multi-query attention: q ``[batch, tokens, heads * dim]``
    folded into rows of ``[batch, tokens * heads, dim]``, ``baddbmm`` against the one KV head's
    ``k^T`` with ``alpha = 1 / (sqrt(d) * unscale)``, the scores viewed as ``[batch, tokens, heads,
    keys]``, widened and multiplied by ``unscale`` (the layer's index plus one), a causal
    ``where`` over ``[1, tokens, 1, keys]`` with fp32's minimum, softmax rounded back, ``bmm`` with
    v ``[batch, keys, dim]``, viewed back."""

    def forward(self, q, k, v):
        b, t, width = q.shape
        dim, unscale = k.shape[-1], 2
        heads = width // dim
        s = torch.baddbmm(torch.empty(b, t * heads, t, dtype=q.dtype, device=q.device), q.reshape(b, t * heads, dim),
                          k.transpose(-1, -2), beta=0, alpha=dim ** -0.5 / unscale).view(b, t, heads, t)
        x = s.to(_wide(q)) * unscale
        keep = torch.tril(torch.ones(t, t, dtype=torch.bool, device=q.device))[None, :, None, :]
        x = torch.where(keep, x, torch.full([], torch.finfo(x.dtype).min, dtype=x.dtype))
        p = F.softmax(x, dim=-1).to(q.dtype)
        return torch.bmm(p.view(b, t * heads, t), v).view(b, t, width)


class SwinShiftedWindows(torch.nn.Module):
    """Swin's window attention over 4 x 4 windows of an 8 x 8 image shifted by 2 (four windows a
    batch, q ``[batch * windows, heads, 16, dim]``): the scores scaled, plus a relative position
    bias gathered from a per-head table by a constant index, plus the shifted-window mask built
    as Swin builds it (a zero image assigned region by region, its windows compared: 0 or -100)
    added over the scores viewed ``[batch, windows, heads, 16, 16]``, softmax in the model's type."""

    def __init__(self, window: int = 4, shift: int = 2, side: int = 8):
        super().__init__()
        self.window, self.shift, self.side = window, shift, side
        self.table = torch.nn.Parameter(torch.randn((2 * window - 1) ** 2, H, generator=torch.Generator().manual_seed(1)))
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("index", relative[:, :, 0] * (2 * window - 1) + relative[:, :, 1], persistent=False)

    def _mask(self, dtype: torch.dtype) -> torch.Tensor:
        w, s, n = self.window, self.shift, self.side
        image = torch.zeros((1, n, n, 1), dtype=dtype)
        count = 0
        for rows in (slice(0, -w), slice(-w, -s), slice(-s, None)):
            for cols in (slice(0, -w), slice(-w, -s), slice(-s, None)):
                image[:, rows, cols, :] = count
                count += 1
        windows = image.view(1, n // w, w, n // w, w, 1).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w)
        mask = windows.unsqueeze(1) - windows.unsqueeze(2)
        return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)

    def forward(self, q, k, v):
        batch_windows, heads, tokens, dim = q.shape
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(dim)
        bias = self.table[self.index.view(-1)].view(tokens, tokens, -1).permute(2, 0, 1).contiguous()
        s = s + bias.to(s.dtype).unsqueeze(0)
        mask = self._mask(s.dtype)
        windows = mask.shape[0]
        s = s.view(batch_windows // windows, windows, heads, tokens, tokens) + mask.unsqueeze(1).unsqueeze(0)
        p = F.softmax(s.view(-1, heads, tokens, tokens), dim=-1)
        return torch.matmul(p, v)


class DifferentValueDim(torch.nn.Module):
    """DeepSeek's multi-head latent attention, eager: q and k of head dim 96 (64 + 32 rotary),
    v of 64, scaled by ``96 ** -0.5``, an additive ``full(finfo.min).triu(1)`` mask, softmax in
    fp32 rounded back."""

    def forward(self, q, k, v):
        t = q.shape[-2]
        mask = torch.full((t, t), torch.finfo(q.dtype).min, dtype=q.dtype).triu(1)
        w = torch.matmul(q, k.transpose(2, 3)) * q.shape[-1] ** -0.5 + mask
        return torch.matmul(F.softmax(w, dim=-1, dtype=_wide(w)).to(q.dtype), v)


# ---------------------------------------------------------------------------------------------
# Cases: the module, its inputs, and which output rows keep a key.
# ---------------------------------------------------------------------------------------------


def _qkv(rng, q_shape, kv_shape=None):
    kv_shape = kv_shape or q_shape
    return [torch.from_numpy(rng.standard_normal(s).astype(np.float16)) for s in (q_shape, kv_shape, kv_shape)]


def _padding_keep(tq: int = T, tk: int = T) -> np.ndarray:
    """``[B, 1, tq, tk]`` keep mask: causal; batch 1 left padded by 3 (its first 3 keys masked,
    so its first 3 queries keep no key)."""
    keep = np.broadcast_to(np.tri(tq, tk, tk - tq, dtype=bool), (B, 1, tq, tk)).copy()
    keep[1, :, :, :3] = False
    return keep


def _self_attention(rng):
    """q, k and v of one shape ``[B, H, T, D]``, without a mask."""
    return _qkv(rng, (B, H, T, D))


@dataclass
class Case:
    make: Callable[[], torch.nn.Module]
    inputs: Callable[[np.random.Generator], list] = _self_attention
    rows: Callable[[list], np.ndarray] | None = None  # output rows that keep a key, as out[..., 0]


def _keep_rows_of(keep_index: int):
    """Rows that keep a key of a ``[B, 1, tq, tk]`` keep mask input (bool, or additive)."""
    def rows(inputs):
        mask = inputs[keep_index].numpy()
        keep = mask if mask.dtype == bool else mask > MASKED
        return keep.any(-1)  # [B, 1, tq]: broadcasts over heads of a [B, H, tq, D] output's [..., 0]
    return rows


def _additive_padding(rng):
    keep = _padding_keep()
    mask = np.where(keep, 0.0, np.finfo(np.float16).min).astype(np.float16)
    return [*_qkv(rng, (B, H, T, D)), torch.from_numpy(mask)]


def _fp32_padding(rng):
    keep = _padding_keep()
    mask = np.where(keep, 0.0, np.finfo(np.float32).min).astype(np.float32)
    return [*_qkv(rng, (B, H, T, D)), torch.from_numpy(mask)]


def _negative_first_score(rng):
    """Normal q, k, v but each head's first query ``-3 * k[0]``: its one causal key scores about
    ``-3 * 64 / 8 = -24``, whose exponent underflows in fp16 (a causal flag lowered as ``trilu``
    of the scores, 0 above the diagonal, would shift that row by 0, not by its own maximum)."""
    q, k, v = _qkv(rng, (B, H, T, D))
    q[:, :, 0, :] = -3 * k[:, :, 0, :]
    return [q, k, v]


def _bool_padding(rng):
    return [*_qkv(rng, (B, H, T, D)), torch.from_numpy(_padding_keep())]


def _bert_padding(rng):
    attention_mask = np.ones((B, T), np.int64)
    attention_mask[1, -5:] = 0  # batch 1 padded on the right
    return [*_qkv(rng, (B, H, T, D)), torch.from_numpy(attention_mask)]


CASES = {
    # masks built from constants: the causal flag, a window, ALiBi's slopes
    "masked_fill_triu_finfo_min": Case(MaskedFillTriuFinfoMin),
    "masked_fill_neg_inf_fp16_softmax": Case(MaskedFillNegInf),
    "gpt2_where_keep_full_scale": Case(GPT2WhereKeep),
    "where_keep_scores_fill": Case(WhereKeepScoresFill),
    "where_masked_fill_scores": Case(WhereMaskedFillScores),
    "additive_full_min_triu": Case(AdditiveFullMinTriu),
    "opt_clamp": Case(OPTClamp),
    "opt_max_tensor": Case(lambda: OPTClamp(max_tensor=True)),
    "neox_baddbmm_where": Case(NeoXBaddbmm),
    "megatron_baddbmm_beta0_empty": Case(MegatronBaddbmmBetaZero),
    "bloom_baddbmm_alibi": Case(BloomAlibi, lambda r: _qkv(r, (B, T, H, D))),
    "scale_folded_into_q_and_k": Case(ScaleFoldedIntoQK),
    "manual_softmax_fp16": Case(ManualSoftmax),
    "phi2_widened_qk": Case(Phi2Widened),
    "gqa_repeat_interleave": Case(GQARepeatInterleave, lambda r: _qkv(r, (B, H, T, D), (B, KVH, T, D))),
    "llama_gqa_expand_reshape": Case(LlamaGQAExpand, lambda r: _qkv(r, (B, H, T, D), (B, KVH, T, D))),
    "mla_value_dim_differs": Case(DifferentValueDim,
                                  lambda r: [*_qkv(r, (B, H, T, 96))[:2], *_qkv(r, (B, H, T, D))[2:]]),
    "mistral_sliding_window_arange": Case(MistralSlidingWindow, lambda r: _qkv(r, (B, H, T, D), (B, KVH, T, D))),
    "bottom_right_causal": Case(BottomRightCausal, lambda r: _qkv(r, (B, H, 6, D), (B, H, T, D))),
    "bottom_right_sliding_window": Case(BottomRightSlidingWindow, lambda r: _qkv(r, (B, H, 6, D), (B, H, T, D))),
    "causal_first_query_scores_minus_24": Case(MaskedFillTriuFinfoMin, _negative_first_score),
    # A constant mask of one query row broadcast over all queries: causal_band reads its [.., 1, keys]
    # shape as one query, BottomRight (every key), and the attention (16 queries) becomes causal.
    "bert_no_mask_given_constant_ones": Case(BertNoMaskGiven),
    "alibi_query_broadcast_no_causal": Case(AlibiNoCausal),
    "gptj_where_then_scale": Case(GPTJWhereThenScale),
    "gemma2_soft_cap": Case(Gemma2SoftCap),
    "mpt_alibi_widened": Case(MPTAlibiWidened),
    # masks passed in (padding; a query with no key)
    "additive_mask_input_empty_row": Case(AdditiveMaskInput, _additive_padding, _keep_rows_of(3)),
    "bool_mask_input_finfo_min_empty_row": Case(BoolMaskInputFinfoMin, _bool_padding, _keep_rows_of(3)),
    "bool_mask_input_neg_inf_empty_row": Case(BoolMaskInputNegInf, _bool_padding, _keep_rows_of(3)),
    "bert_extended_padding_mask": Case(BertExtendedMask, _bert_padding),
    # attention_bias casts an fp32 mask to fp16: fp32's minimum becomes -inf, the empty row 0 / 0
    "widened_fp32_mask_input_empty_row": Case(WidenedFp32MaskInput, _fp32_padding, _keep_rows_of(3)),
    # no mask
    "bart_scaled_query_cross": Case(BartScaledQuery, lambda r: _qkv(r, (B, H, T, D), (B, H, 24, D))),
    "einsum_attention": Case(EinsumAttention),
    # k and v broadcast by matmul itself (one head for all, one batch for all): R.nn.attention takes
    # them broadcast to q's heads and batch (a copy relax_packed_attention reads in place); with a
    # soft cap, one grouped TIR function reads the single head
    "mqa_matmul_broadcast": Case(MQABroadcast, lambda r: _qkv(r, (B, H, T, D), (B, 1, T, D))),
    "mqa_soft_cap_masked_fill": Case(MQASoftCapMaskedFill, lambda r: _qkv(r, (B, H, T, D), (B, 1, T, D))),
    "kv_batch_broadcast": Case(MQABroadcast, lambda r: _qkv(r, (B, H, T, D), (1, H, T, D))),
    # q's heads in its rows against one KV head: the scores transposed to heads first
    "gpt_bigcode_head_rows": Case(GPTBigCodeHeadRows, lambda r: _qkv(r, (B, T, H * D), (B, T, D))),
    # a bias from constants over the batch viewed as [batch, windows, ..], plus another
    "swin_shifted_windows": Case(SwinShiftedWindows, lambda r: _qkv(r, (4 * B, H, T, D))),
}


# ---------------------------------------------------------------------------------------------
# The check.
# ---------------------------------------------------------------------------------------------


def _double(x: torch.Tensor) -> torch.Tensor:
    """An input in float64: a float mask's fills (at or below :data:`MASKED`) as float64's
    minimum, the fp64 equivalent of a model's finfo(fp16).min; integer and bool inputs as they
    are."""
    if not x.is_floating_point():
        return x
    wide = x.double()
    return torch.where(wide <= MASKED, torch.finfo(torch.float64).min, wide)


def _attention_calls(mod: tvm.IRModule) -> list[str]:
    """How each attention of ``mod`` reads: the operator and its causal flag, or the TIR function
    AttentionMasksFromConstants made of it (``windowed_attention``, ``alibi_attention``)."""
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name.startswith("relax.nn.attention"):
            found.append(f"{e.op.name}(causal={e.attrs.causal_mask})")
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
        elif "attention" in gv.name_hint:  # windowed_attention, alibi_attention
            found.append(str(gv.name_hint))
    return found


#: How each spelling reads after the rewrites (:func:`_attention_calls`): the operator and its
#: causal flag, the TIR function made of it, or nothing (left spelled out, its values still
#: checked). A change here is a change of what the attention family sees.
READS = {
    "additive_full_min_triu": ['relax.nn.attention(causal=TopLeft)'],
    "additive_mask_input_empty_row": ['relax.nn.attention_bias(causal=None)'],
    "alibi_query_broadcast_no_causal": ['relax.nn.attention_bias(causal=None)'],
    "bart_scaled_query_cross": ['relax.nn.attention(causal=None)'],
    "bert_extended_padding_mask": ['relax.nn.attention_bias(causal=None)'],
    "bert_no_mask_given_constant_ones": ['relax.nn.attention(causal=None)'],
    "bloom_baddbmm_alibi": ['alibi_attention'],
    "bool_mask_input_finfo_min_empty_row": ['relax.nn.attention_bias(causal=None)'],
    "bool_mask_input_neg_inf_empty_row": ['relax.nn.attention_bias(causal=None)'],
    "bottom_right_causal": ['relax.nn.attention(causal=BottomRight)'],
    "bottom_right_sliding_window": ['windowed_attention'],
    "causal_first_query_scores_minus_24": ['relax.nn.attention(causal=TopLeft)'],
    "einsum_attention": ['relax.nn.attention(causal=None)'],
    "gpt2_where_keep_full_scale": ['relax.nn.attention(causal=TopLeft)'],
    "gpt_bigcode_head_rows": ['relax.nn.attention(causal=TopLeft)'],
    "gemma2_soft_cap": [],  # one TIR function the attention family takes: test_a_soft_cap_is_one_attention_kernel
    "gptj_where_then_scale": ['relax.nn.attention(causal=TopLeft)'],
    "gqa_repeat_interleave": ['relax.nn.attention(causal=TopLeft)'],
    "kv_batch_broadcast": ['relax.nn.attention(causal=TopLeft)'],
    "llama_gqa_expand_reshape": ['relax.nn.attention(causal=TopLeft)'],
    "manual_softmax_fp16": ['relax.nn.attention(causal=TopLeft)'],
    "masked_fill_neg_inf_fp16_softmax": ['relax.nn.attention(causal=TopLeft)'],
    "masked_fill_triu_finfo_min": ['relax.nn.attention(causal=TopLeft)'],
    "megatron_baddbmm_beta0_empty": ['relax.nn.attention(causal=TopLeft)'],
    "mistral_sliding_window_arange": ['windowed_attention'],
    "mla_value_dim_differs": ['relax.nn.attention(causal=TopLeft)'],
    "mpt_alibi_widened": ['alibi_attention'],
    "mqa_matmul_broadcast": ['relax.nn.attention(causal=TopLeft)'],
    "mqa_soft_cap_masked_fill": [],
    "neox_baddbmm_where": ['relax.nn.attention(causal=TopLeft)'],
    "opt_clamp": ['relax.nn.attention(causal=TopLeft)'],
    "opt_max_tensor": [],
    "phi2_widened_qk": ['relax.nn.attention(causal=TopLeft)'],
    "scale_folded_into_q_and_k": ['relax.nn.attention(causal=TopLeft)'],
    "swin_shifted_windows": ['relax.nn.attention_bias(causal=None)'],
    "where_keep_scores_fill": ['relax.nn.attention(causal=TopLeft)'],
    "where_masked_fill_scores": ['relax.nn.attention(causal=TopLeft)'],
    "widened_fp32_mask_input_empty_row": ['relax.nn.attention_bias(causal=None)'],
}


@pytest.mark.parametrize("name", list(CASES))
def test_hand_written_attention_keeps_its_values(name, record_property):
    case = CASES[name]
    inputs = case.inputs(np.random.default_rng(sum(map(ord, name))))
    module = case.make().half().eval()
    with torch.no_grad():
        torch_fp16 = module(*inputs).numpy()
    program = torch.export.export(module, tuple(inputs))
    mod = AttentionMasksFromConstants(RewriteToRelaxOps(from_exported_program(program)))
    reached = _attention_calls(mod)
    record_property("reached", reached)
    assert reached == READS[name], f"{name} reads as {reached or 'nothing (left spelled out)'}"

    error = _checked(name, tvm.compile(mod, target=LLVM), tvm.cpu(), inputs, torch_fp16)
    record_property("relative_error", float(error))
    assert error < 2e-3, f"relative error {error:.3e}; reached {reached}"


#: Spellings Relax keeps spelled out (:data:`READS` empty) that are grouped into one TIR function
#: the attention family reads, and what its score terms hold: Gemma-2's cap (its batched views put
#: back as 4-D matmuls); with one KV head broadcast by ``matmul`` and the mask a ``masked_fill``
#: (``where(masked, fill, scores)``: the grouping takes the scores' operand of the ``where``, the
#: family reads the mask negated).
GROUPED = {
    "gemma2_soft_cap": "tanh",
    "mqa_soft_cap_masked_fill": "tanh",
}


@pytest.mark.parametrize("name", list(GROUPED))
def test_spelled_out_attention_is_one_attention_kernel(name):
    from tvm_dsm.kernels.attention_pattern import find_attention
    from tvm_dsm.relax_integration import lower_to_tir

    case = CASES[name]
    inputs = case.inputs(np.random.default_rng(0))
    program = torch.export.export(case.make().half().eval(), tuple(inputs))
    mod = lower_to_tir(from_exported_program(program))
    (func,) = [f for gv, f in mod.functions.items() if "softmax" in gv.name_hint]
    terms = find_attention(func).terms
    assert terms.score is not None and GROUPED[name] in str(terms.mask if GROUPED[name] == "not " else terms.value)


@pytest.mark.parametrize("name", list(CASES))
def test_the_pipeline_schedules_each_spelling_on_the_attention_kernel(name):
    """What ``relax.get_pipeline("tvm_dsm")`` makes of each spelling (its report: the pipeline up
    to dlight, with the library dispatch of ``R.topk`` a softmax's row max may come as): one
    kernel of the attention family."""
    from tvm_dsm.model_report import relax_report

    case = CASES[name]
    program = torch.export.export(case.make().half().eval(), tuple(case.inputs(np.random.default_rng(0))))
    report = relax_report(from_exported_program(program))
    assert report.counts().get("attention") == 1, report.format()


def _checked(name: str, executable, dev, inputs, torch_fp16) -> float:
    """``executable``'s relative error from float64 on ``inputs``, over the queries that keep a
    key; asserts it is finite wherever torch's own fp16 output is."""
    case = CASES[name]
    vm = relax.VirtualMachine(executable, dev)
    got = vm["main"](*(tvm.runtime.tensor(x.numpy(), dev) for x in inputs))
    got = (got if hasattr(got, "numpy") else got[0]).numpy().astype(np.float64)
    with torch.no_grad():
        ref = case.make().double().eval()(*(_double(x) for x in inputs)).numpy()
    rows = np.ones(got.shape[:-1], dtype=bool) if case.rows is None else np.broadcast_to(
        case.rows(inputs), got.shape[:-1])
    finite_in_torch = np.isfinite(torch_fp16)
    assert np.isfinite(got[finite_in_torch]).all(), (
        f"{int((~np.isfinite(got) & finite_in_torch).sum())} non-finite outputs where torch's fp16 output is finite")
    error = np.linalg.norm(got[rows] - ref[rows]) / np.linalg.norm(ref[rows])
    torch_error = np.linalg.norm(torch_fp16[rows] - ref[rows]) / np.linalg.norm(ref[rows])
    print(f"{name}: relative error {error:.2e} (torch fp16's own {torch_error:.2e})")
    return float(error)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_each_spelling_through_the_pipeline_keeps_its_values(name):
    """The whole "tvm_dsm" pipeline (the attention kernels, or per-operator kernels where the
    kernel refuses) on the GPU, held to the same bound."""
    from conftest import TARGET

    case = CASES[name]
    inputs = case.inputs(np.random.default_rng(sum(map(ord, name))))
    module = case.make().half().eval()
    with torch.no_grad():
        torch_fp16 = module(*inputs).numpy()
    mod = from_exported_program(torch.export.export(module, tuple(inputs)))
    executable = tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm")
    assert _checked(name, executable, tvm.cuda(0), inputs, torch_fp16) < 2e-3
