"""Transformer layers written as torch users write them, the models a torch user hands TVM
through ``torch.export`` (:func:`exported_decoder_layer`):

- :class:`DecoderLayer`: a Llama decoder layer: ``nn.Linear`` projections, an RMSNorm module,
  SDPA with causal masking and the KV heads repeated for grouped-query attention, SwiGLU;
- :class:`GPT2Block`: pre-norm ``nn.LayerNorm``, one biased qkv projection split in three,
  causal SDPA, a GELU (tanh) MLP;
- :class:`BertLayer`: post-norm, attention spelled out (``softmax(q @ k^T / sqrt(d) + mask) @
  v``) with an additive mask, a GELU MLP."""

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


def exported_decoder_layer(layer: torch.nn.Module, example, importer):
    """``layer`` (in its example inputs' dtype; ``example`` one tensor or a tuple) as a Relax
    module whose ``main`` takes the inputs then the parameters, and those parameters (torch
    tensors, in order), imported by ``importer``: tvm-dsm's
    (:func:`tvm_dsm.relax_torch.from_exported_program`) or TVM's own ``from_exported_program``."""
    from tvm.relax.frontend import detach_params

    program = torch.export.export(layer, example if isinstance(example, tuple) else (example,))
    mod, params = detach_params(importer(program, keep_params_as_input=True))
    return mod, params["main"]
