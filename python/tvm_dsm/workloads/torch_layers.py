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
  batch, heads, tokens, dim]`` and unbound, non-causal SDPA, a GELU (erf) MLP."""

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


def exported_decoder_layer(layer: torch.nn.Module, example, importer):
    """``layer`` (in its example inputs' dtype; ``example`` one tensor or a tuple) as a Relax
    module whose ``main`` takes the inputs then the parameters, and those parameters (torch
    tensors, in order), imported by ``importer``: tvm-dsm's
    (:func:`tvm_dsm.relax_torch.from_exported_program`) or TVM's own ``from_exported_program``."""
    from tvm.relax.frontend import detach_params

    program = torch.export.export(layer, example if isinstance(example, tuple) else (example,))
    mod, params = detach_params(importer(program, keep_params_as_input=True))
    return mod, params["main"]
