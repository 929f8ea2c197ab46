"""Transformer layers written as torch users write them, the models a torch user hands TVM
through ``torch.export`` (:func:`exported_decoder_layer`):

- :class:`DecoderLayer`: a Llama decoder layer: ``nn.Linear`` projections, an RMSNorm module,
  SDPA with causal masking and the KV heads repeated for grouped-query attention, SwiGLU;
- :class:`GPT2Block`: pre-norm ``nn.LayerNorm``, one biased qkv projection split in three,
  causal SDPA, a GELU (tanh) MLP;
- :class:`BertLayer`: post-norm, attention spelled out (``softmax(q @ k^T / sqrt(d) + mask) @
  v``) with an additive mask, a GELU MLP;
- :class:`QwenLayer`: Hugging Face's Qwen2 decoder layer as its modeling code writes it: biased
  q, k and v projections, rotate-half RoPE on ``[batch, heads, tokens, dim]``, the KV heads
  repeated by ``expand`` and ``reshape``, an RMSNorm that widens the row twice, SwiGLU;
- :class:`ViTBlock`: timm's ViT block: one packed qkv projection reshaped, permuted to ``[3,
  batch, heads, tokens, dim]`` and unbound, non-causal SDPA, a GELU (erf) MLP;
- :class:`GemmaLayer`: Gemma-1's decoder layer as Hugging Face writes it: an fp32 RMSNorm scaling by
  ``1 + weight``, a head dimension independent of the width, multi-query attention (the one KV head
  repeated), rotate-half RoPE, causal SDPA, a GeGLU MLP (GELU (tanh) gate);
- :class:`Phi2Layer`: Phi-2 as Hugging Face writes it: one LayerNorm feeding attention and MLP in
  parallel, biased projections, RoPE on the first ``rotary_dim`` dimensions of each head only,
  attention spelled out in fp32 with an additive ``triu`` causal mask, a GELU (tanh) MLP;
- :class:`MistralLayer`: Mistral-7B's layer with sliding-window attention: a boolean mask (causal and
  the window) built from ``arange`` and handed to SDPA as ``attn_mask``, GQA, RoPE, SwiGLU;
- :class:`WhisperEncoderLayer`: Whisper's encoder layer: pre-norm, k projection without bias, q
  scaled before ``softmax(q @ k^T) @ v`` spelled out, a GELU (erf) MLP, fp16 activations clamped;
- :class:`CLIPEncoderLayer`: CLIP's vision encoder layer: pre-norm, biased projections, non-causal
  SDPA given its ``scale``, a quick-GELU (``x * sigmoid(1.702 x)``) MLP;
- :class:`GPTNeoXLayer`: Pythia / GPT-NeoX as Hugging Face writes it: a packed biased qkv projection
  interleaved per head (``[batch, tokens, heads, 3 * dim]`` split on the last axis), RoPE on the first
  ``rotary_pct`` of each head, eager attention as ``baddbmm`` into zeros on ``[batch * heads, ...]``
  views masked by ``where`` with a boolean ``tril``, a parallel residual over two LayerNorms, a GELU MLP;
- :class:`FalconLayer`: Falcon-7B: one LayerNorm feeding attention and MLP in parallel, multi-query
  attention from a packed bias-free projection (``heads`` query heads, then one key and one value
  head), RoPE, causal SDPA on the key and value expanded to every head, a bias-free GELU MLP;
- :class:`BloomLayer`: BLOOM: no position embedding but ALiBi, per-head slopes times key positions fed
  to ``baddbmm`` as the scores' starting value, a packed qkv projection viewed ``[..., heads, 3,
  dim]``, a ``masked_fill`` causal mask, softmax in fp32, ``bmm`` with v, a GELU (tanh) MLP;
- :class:`OPTDecoderLayer`: OPT: pre-norm, biased projections, q scaled after its projection, eager
  ``bmm`` attention on ``[batch * heads, ...]`` with an additive float causal mask built by
  ``full`` and ``masked_fill_``, the scores clamped at the dtype's minimum, softmax in fp32 when they
  are fp16, a ReLU MLP on the tokens flattened;
- :class:`MixtralMoEBlock`: Mixtral's sparse MoE block rewritten for static shapes: an fp32 softmax
  router, ``topk`` and the top-k weights renormalised, then scattered into a dense ``[tokens,
  experts]`` matrix weighting every expert's SwiGLU, each computed on all tokens."""

from __future__ import annotations

import math

import torch


class RMSNorm(torch.nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.input_norm, self.post_norm = RMSNorm(hidden), RMSNorm(hidden)
        linear = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.q, self.k, self.v = linear(hidden, heads * head_dim), linear(hidden, kv_heads * head_dim), \
            linear(hidden, kv_heads * head_dim)
        self.o = linear(heads * head_dim, hidden)
        self.gate, self.up, self.down = linear(hidden, intermediate), linear(hidden, intermediate), \
            linear(intermediate, hidden)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.input_norm(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        group = self.heads // self.kv_heads
        a = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.post_norm(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class GPT2Block(torch.nn.Module):
    def __init__(self, hidden=768, heads=12):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.qkv, self.proj = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)
        self.fc, self.out = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, dim=2))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class BertLayer(torch.nn.Module):
    def __init__(self, hidden=768, heads=12):
        super().__init__()
        self.heads = heads
        linear = torch.nn.Linear
        self.q, self.k, self.v, self.o = linear(hidden, hidden), linear(hidden, hidden), linear(hidden, hidden), \
            linear(hidden, hidden)
        self.fc, self.out = linear(hidden, 4 * hidden), linear(4 * hidden, hidden)
        self.ln1, self.ln2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, d // self.heads).permute(0, 2, 1, 3) for p in (self.q, self.k, self.v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads) + mask
        a = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, t, d)
        x = self.ln1(x + self.o(a))
        return self.ln2(x + self.out(torch.nn.functional.gelu(self.fc(x))))


class QwenLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, kv_heads=2, intermediate=512, positions=4096, theta=1e6):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        d = self.head_dim
        self.q, self.k, self.v = (torch.nn.Linear(hidden, n * d) for n in (heads, kv_heads, kv_heads))
        self.o = torch.nn.Linear(heads * d, hidden, bias=False)
        self.gate, self.up = torch.nn.Linear(hidden, intermediate, bias=False), torch.nn.Linear(hidden, intermediate, bias=False)
        self.down = torch.nn.Linear(intermediate, hidden, bias=False)
        self.input_weight, self.post_weight = torch.nn.Parameter(torch.ones(hidden)), torch.nn.Parameter(torch.ones(hidden))
        angles = torch.outer(torch.arange(positions).float(), 1.0 / theta ** (torch.arange(0, d, 2).float() / d))
        self.register_buffer("cos", torch.cat([angles, angles], -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat([angles, angles], -1).sin(), persistent=False)

    @staticmethod
    def _norm(x, weight, eps=1e-6):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return weight * (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)

    def _rotate_half(self, x):
        return torch.cat((-x[..., self.head_dim // 2:], x[..., :self.head_dim // 2]), dim=-1)

    def _repeat_kv(self, x):
        b, kv, t, d = x.shape
        group = self.heads // self.kv_heads
        return x[:, :, None].expand(b, kv, group, t, d).reshape(b, kv * group, t, d)

    def forward(self, x):
        b, t, _ = x.shape
        h = self._norm(x, self.input_weight)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:t].to(x.dtype)[None, None], self.sin[:t].to(x.dtype)[None, None]
        q, k = q * cos + self._rotate_half(q) * sin, k * cos + self._rotate_half(k) * sin
        a = torch.nn.functional.scaled_dot_product_attention(q, self._repeat_kv(k), self._repeat_kv(v), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self._norm(x, self.post_weight)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


class ViTBlock(torch.nn.Module):
    def __init__(self, hidden=768, heads=12):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(hidden, eps=1e-6), torch.nn.LayerNorm(hidden, eps=1e-6)
        self.qkv, self.proj = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


def _rope(positions, dim, theta):
    angles = torch.outer(torch.arange(positions).float(), 1.0 / theta ** (torch.arange(0, dim, 2).float() / dim))
    return torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _repeat_kv(x, group):
    b, kv, t, d = x.shape
    return x[:, :, None].expand(b, kv, group, t, d).reshape(b, kv * group, t, d)


class _RotaryDecoder(torch.nn.Module):
    """What Gemma's and Mistral's layers share as their modeling code writes them: bias-free
    q, k, v, o and gated-MLP projections (``q_proj`` ... ``down_proj``), rotate-half RoPE
    buffers, and q, k, v as ``[batch, heads, tokens, head_dim]`` with q and k rotated."""

    def __init__(self, hidden, heads, kv_heads, head_dim, intermediate, positions, theta):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        linear = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.q_proj, self.k_proj, self.v_proj = (linear(hidden, n * head_dim) for n in (heads, kv_heads, kv_heads))
        self.o_proj = linear(heads * head_dim, hidden)
        self.gate_proj, self.up_proj = linear(hidden, intermediate), linear(hidden, intermediate)
        self.down_proj = linear(intermediate, hidden)
        cos, sin = _rope(positions, head_dim, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def rotated_qkv(self, h):
        b, t, _ = h.shape
        q = self.q_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:t].to(h.dtype)[None, None], self.sin[:t].to(h.dtype)[None, None]
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


class GemmaRMSNorm(torch.nn.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        out = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class GemmaLayer(_RotaryDecoder):
    def __init__(self, hidden=256, heads=4, kv_heads=1, head_dim=64, intermediate=512, positions=4096, theta=10000.0):
        super().__init__(hidden, heads, kv_heads, head_dim, intermediate, positions, theta)
        self.input_layernorm, self.post_attention_layernorm = GemmaRMSNorm(hidden), GemmaRMSNorm(hidden)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.rotated_qkv(self.input_layernorm(x))
        group = self.heads // self.kv_heads
        a = torch.nn.functional.scaled_dot_product_attention(q, _repeat_kv(k, group), _repeat_kv(v, group),
                                                             is_causal=True, scale=self.head_dim ** -0.5)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        gelu = torch.nn.functional.gelu(self.gate_proj(h), approximate="tanh")
        return x + self.down_proj(gelu * self.up_proj(h))


class Phi2Layer(torch.nn.Module):
    def __init__(self, hidden=320, heads=4, intermediate=1280, rotary_dim=32, positions=2048, theta=10000.0):
        super().__init__()
        self.heads, self.head_dim, self.rotary_dim = heads, hidden // heads, rotary_dim
        self.input_layernorm = torch.nn.LayerNorm(hidden, eps=1e-5)
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.dense = torch.nn.Linear(hidden, hidden)
        self.fc1, self.fc2 = torch.nn.Linear(hidden, intermediate), torch.nn.Linear(intermediate, hidden)
        cos, sin = _rope(positions, rotary_dim, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _attention(self, h):
        b, t, _ = h.shape
        q, k, v = (p(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = self.cos[:t].to(h.dtype)[None, None], self.sin[:t].to(h.dtype)[None, None]
        r = self.rotary_dim
        q = torch.cat((q[..., :r] * cos + _rotate_half(q[..., :r]) * sin, q[..., r:]), dim=-1)
        k = torch.cat((k[..., :r] * cos + _rotate_half(k[..., :r]) * sin, k[..., r:]), dim=-1)
        scores = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(2, 3)) / math.sqrt(self.head_dim)
        mask = torch.full((t, t), torch.finfo(torch.float32).min, device=h.device).triu(1)
        weights = torch.softmax(scores + mask[None, None], dim=-1, dtype=torch.float32).to(v.dtype)
        return self.dense(torch.matmul(weights, v).transpose(1, 2).reshape(b, t, -1))

    def forward(self, x):
        h = self.input_layernorm(x)
        return self._attention(h) + self.fc2(torch.nn.functional.gelu(self.fc1(h), approximate="tanh")) + x


class MistralLayer(_RotaryDecoder):
    def __init__(self, hidden=256, heads=4, kv_heads=2, intermediate=512, window=64, positions=4096, theta=10000.0):
        super().__init__(hidden, heads, kv_heads, hidden // heads, intermediate, positions, theta)
        self.window = window
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(hidden), RMSNorm(hidden)

    def sliding_window_mask(self, t, device=None):
        query, key = torch.arange(t, device=device)[:, None], torch.arange(t, device=device)[None, :]
        return ~((key > query) | (query - key >= self.window))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.rotated_qkv(self.input_layernorm(x))
        group = self.heads // self.kv_heads
        a = torch.nn.functional.scaled_dot_product_attention(
            q, _repeat_kv(k, group), _repeat_kv(v, group), attn_mask=self.sliding_window_mask(t, x.device)[None, None])
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class WhisperEncoderLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, intermediate=1024):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.scaling = self.head_dim ** -0.5
        self.self_attn_layer_norm, self.final_layer_norm = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.q_proj, self.v_proj, self.out_proj = (torch.nn.Linear(hidden, hidden) for _ in range(3))
        self.k_proj = torch.nn.Linear(hidden, hidden, bias=False)
        self.fc1, self.fc2 = torch.nn.Linear(hidden, intermediate), torch.nn.Linear(intermediate, hidden)

    def forward(self, x):
        b, t, d = x.shape
        h = self.self_attn_layer_norm(x)
        q = (self.q_proj(h) * self.scaling).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        weights = torch.softmax(torch.matmul(q, k.transpose(2, 3)), dim=-1)
        x = x + self.out_proj(torch.matmul(weights, v).transpose(1, 2).reshape(b, t, d))
        x = x + self.fc2(torch.nn.functional.gelu(self.fc1(self.final_layer_norm(x))))
        if x.dtype == torch.float16:
            clamp = torch.finfo(x.dtype).max - 1000
            x = torch.clamp(x, min=-clamp, max=clamp)
        return x


class CLIPEncoderLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, intermediate=1024):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.scale = self.head_dim ** -0.5
        self.layer_norm1, self.layer_norm2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (torch.nn.Linear(hidden, hidden) for _ in range(4))
        self.fc1, self.fc2 = torch.nn.Linear(hidden, intermediate), torch.nn.Linear(intermediate, hidden)

    def forward(self, x):
        b, t, d = x.shape
        h = self.layer_norm1(x)
        q, k, v = (p(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=self.scale)
        x = x + self.out_proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.fc1(self.layer_norm2(x))
        return x + self.fc2(h * torch.sigmoid(1.702 * h))


class GPTNeoXLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, intermediate=1024, rotary_pct=0.25, positions=2048, theta=10000.0):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.rotary_ndims = int(self.head_dim * rotary_pct)
        self.input_layernorm, self.post_attention_layernorm = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.query_key_value, self.dense = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)
        self.dense_h_to_4h, self.dense_4h_to_h = torch.nn.Linear(hidden, intermediate), torch.nn.Linear(intermediate, hidden)
        cos, sin = _rope(positions, self.rotary_ndims, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _attn(self, q, k, v):
        b, heads, t, d = q.shape
        scores = torch.zeros(b * heads, t, t, dtype=q.dtype, device=q.device)
        scores = torch.baddbmm(scores, q.reshape(b * heads, t, d), k.reshape(b * heads, t, d).transpose(1, 2),
                               beta=1.0, alpha=1.0 / math.sqrt(d)).view(b, heads, t, t)
        causal_mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
        scores = torch.where(causal_mask, scores, torch.finfo(scores.dtype).min)
        return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)

    def _attention(self, h):
        b, t, _ = h.shape
        d, r = self.head_dim, self.rotary_ndims
        qkv = self.query_key_value(h).view(b, t, self.heads, 3 * d)
        q, k, v = (qkv[..., i * d:(i + 1) * d].permute(0, 2, 1, 3) for i in range(3))
        cos, sin = self.cos[:t].to(h.dtype)[None, None], self.sin[:t].to(h.dtype)[None, None]
        q = torch.cat((q[..., :r] * cos + _rotate_half(q[..., :r]) * sin, q[..., r:]), dim=-1)
        k = torch.cat((k[..., :r] * cos + _rotate_half(k[..., :r]) * sin, k[..., r:]), dim=-1)
        return self.dense(self._attn(q, k, v).permute(0, 2, 1, 3).reshape(b, t, -1))

    def forward(self, x):
        mlp = self.dense_4h_to_h(torch.nn.functional.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x))))
        return x + self._attention(self.input_layernorm(x)) + mlp


class FalconLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, intermediate=1024, positions=2048, theta=10000.0):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.input_layernorm = torch.nn.LayerNorm(hidden)
        linear = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.query_key_value, self.dense = linear(hidden, (heads + 2) * self.head_dim), linear(heads * self.head_dim, hidden)
        self.dense_h_to_4h, self.dense_4h_to_h = linear(hidden, intermediate), linear(intermediate, hidden)
        cos, sin = _rope(positions, self.head_dim, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.input_layernorm(x)
        qkv = self.query_key_value(h).view(b, t, self.heads + 2, self.head_dim)
        q, k, v = (z.transpose(1, 2) for z in qkv.split([self.heads, 1, 1], dim=2))
        cos, sin = self.cos[:t].to(x.dtype)[None, None], self.sin[:t].to(x.dtype)[None, None]
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        shape = (b, self.heads, t, self.head_dim)
        a = torch.nn.functional.scaled_dot_product_attention(q, k.expand(shape), v.expand(shape), is_causal=True)
        attention = self.dense(a.transpose(1, 2).reshape(b, t, -1))
        return self.dense_4h_to_h(torch.nn.functional.gelu(self.dense_h_to_4h(h))) + attention + x


def _alibi_slopes(heads):
    closest = 2 ** math.floor(math.log2(heads))
    base = torch.tensor(2 ** (-(2 ** -(math.log2(closest) - 3))), dtype=torch.float32)
    slopes = torch.pow(base, torch.arange(1, 1 + closest, dtype=torch.int32))
    if closest != heads:
        extra_base = torch.tensor(2 ** (-(2 ** -(math.log2(2 * closest) - 3))), dtype=torch.float32)
        extra_powers = torch.arange(1, 1 + 2 * min(closest, heads - closest), 2, dtype=torch.int32)
        slopes = torch.cat([slopes, torch.pow(extra_base, extra_powers)], dim=0)
    return slopes


class BloomLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, intermediate=1024):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.input_layernorm, self.post_attention_layernorm = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.query_key_value, self.dense = torch.nn.Linear(hidden, 3 * hidden), torch.nn.Linear(hidden, hidden)
        self.dense_h_to_4h, self.dense_4h_to_h = torch.nn.Linear(hidden, intermediate), torch.nn.Linear(intermediate, hidden)
        self.register_buffer("slopes", _alibi_slopes(heads), persistent=False)

    def build_alibi_tensor(self, b, t, dtype, device=None):
        alibi = self.slopes[None, :, None] * torch.arange(t, device=device, dtype=torch.float32)[None, None]
        return alibi.expand(b, self.heads, t).reshape(b * self.heads, 1, t).to(dtype)

    def _attention(self, h):
        b, t, hidden = h.shape
        q, k, v = self.query_key_value(h).view(b, t, self.heads, 3, self.head_dim).unbind(3)
        q = q.transpose(1, 2).reshape(b * self.heads, t, self.head_dim)
        k = k.permute(0, 2, 3, 1).reshape(b * self.heads, self.head_dim, t)
        v = v.transpose(1, 2).reshape(b * self.heads, t, self.head_dim)
        scores = self.build_alibi_tensor(b, t, h.dtype, h.device).baddbmm(
            q, k, beta=1.0, alpha=1.0 / math.sqrt(self.head_dim)).view(b, self.heads, t, t)
        causal_mask = torch.ones(t, t, dtype=torch.bool, device=h.device).triu(1)
        scores = scores.masked_fill(causal_mask, torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(h.dtype)
        context = torch.bmm(probs.view(b * self.heads, t, t), v).view(b, self.heads, t, self.head_dim)
        return self.dense(context.permute(0, 2, 1, 3).reshape(b, t, hidden))

    def forward(self, x):
        x = x + self._attention(self.input_layernorm(x))
        h = torch.nn.functional.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x)), approximate="tanh")
        return x + self.dense_4h_to_h(h)


class OPTDecoderLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, intermediate=1024):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.scaling = self.head_dim ** -0.5
        self.self_attn_layer_norm, self.final_layer_norm = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (torch.nn.Linear(hidden, hidden) for _ in range(4))
        self.fc1, self.fc2 = torch.nn.Linear(hidden, intermediate), torch.nn.Linear(intermediate, hidden)

    @staticmethod
    def _make_causal_mask(t, dtype, device=None):
        mask = torch.full((t, t), torch.finfo(dtype).min, dtype=dtype, device=device)
        mask_cond = torch.arange(t, device=device)
        mask.masked_fill_(mask_cond < (mask_cond + 1).view(t, 1), 0)
        return mask.to(dtype)[None, None]

    def _attention(self, h):
        b, t, d = h.shape
        shape = lambda z: z.view(b, t, self.heads, self.head_dim).transpose(1, 2).reshape(b * self.heads, t, -1)  # noqa: E731
        q, k, v = shape(self.q_proj(h) * self.scaling), shape(self.k_proj(h)), shape(self.v_proj(h))
        scores = torch.bmm(q, k.transpose(1, 2)).view(b, self.heads, t, t) + self._make_causal_mask(t, h.dtype, h.device)
        scores = torch.clamp(scores, min=torch.finfo(scores.dtype).min).view(b * self.heads, t, t)
        if scores.dtype == torch.float16:
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(torch.float16)
        else:
            weights = torch.softmax(scores, dim=-1)
        a = torch.bmm(weights, v).view(b, self.heads, t, self.head_dim).transpose(1, 2).reshape(b, t, d)
        return self.out_proj(a)

    def forward(self, x):
        x = x + self._attention(self.self_attn_layer_norm(x))
        shape = x.shape
        x = x.reshape(-1, x.size(-1))
        return (x + self.fc2(torch.relu(self.fc1(self.final_layer_norm(x))))).view(shape)


class MixtralExpert(torch.nn.Module):
    def __init__(self, hidden, intermediate):
        super().__init__()
        self.w1, self.w3 = (torch.nn.Linear(hidden, intermediate, bias=False) for _ in range(2))
        self.w2 = torch.nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class MixtralMoEBlock(torch.nn.Module):
    def __init__(self, hidden=256, intermediate=512, experts=8, top_k=2):
        super().__init__()
        self.experts_count, self.top_k = experts, top_k
        self.gate = torch.nn.Linear(hidden, experts, bias=False)
        self.experts = torch.nn.ModuleList(MixtralExpert(hidden, intermediate) for _ in range(experts))

    def routing(self, h):
        weights = torch.softmax(self.gate(h), dim=1, dtype=torch.float)
        weights, selected = torch.topk(weights, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(h.dtype)
        return torch.zeros(h.shape[0], self.experts_count, dtype=h.dtype, device=h.device).scatter(1, selected, weights)

    def forward(self, x):
        b, t, d = x.shape
        h = x.reshape(-1, d)
        weights = self.routing(h)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            out = out + weights[:, e, None] * expert(h)
        return out.view(b, t, d)


def exported_decoder_layer(layer: torch.nn.Module, example, importer):
    """``layer`` (in its example inputs' dtype; ``example`` one tensor or a tuple) as a Relax
    module whose ``main`` takes the inputs then the parameters, and those parameters (torch
    tensors, in order), imported by ``importer``: tvm-dsm's
    (:func:`tvm_dsm.relax_torch.from_exported_program`) or TVM's own ``from_exported_program``."""
    from tvm.relax.frontend import detach_params

    program = torch.export.export(layer, example if isinstance(example, tuple) else (example,))
    mod, params = detach_params(importer(program, keep_params_as_input=True))
    return mod, params["main"]
