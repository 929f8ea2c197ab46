"""The Llama decoder of :mod:`tvm_dsm.workloads.llama` as a torch user serves it: the torch
contenders of the LLM run (:mod:`tvm_dsm.gpu.llm`).

Weights in the model's type, a static KV cache of one buffer a layer and per keys and values
(``[batch, kv heads, max length, head dim]``, as ``transformers``' StaticCache), RMSNorm and
RoPE in the model's type, attention by ``scaled_dot_product_attention`` (grouped-query heads
through ``enable_gqa``): causal over the prompt in prefill, over the cache up to the current
position in decode (a boolean mask over the static length, the form that keeps every shape
fixed). :meth:`TorchLlama.decode` takes the position as a tensor, gathers its RoPE angles (a 0-d
index would read it on the host, a graph break) and writes each layer's new key and value in
place into that layer's buffers (static inputs whose in-place writes CUDA graphs allow; written
through a view of a buffer shared by every layer, torch.compile copies the whole cache at each
write), so ``torch.compile(mode="reduce-overhead")`` captures one decode step as one CUDA graph
and replays it: the strongest torch form of a serving step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..workloads.llama import LlamaConfig


class TorchLlama(torch.nn.Module):
    """The decoder on one device with a static KV cache for ``batch`` sequences of up to
    ``max_len`` tokens, every sequence at the same position."""

    def __init__(self, config: LlamaConfig, weights: dict[str, np.ndarray], batch: int, max_len: int,
                 device: str = "cuda"):
        super().__init__()
        self.config = c = config
        dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[c.dtype]
        self.names = {name: f"w{i}" for i, name in enumerate(weights)}  # buffer names take no dots
        for name, w in weights.items():
            self.register_buffer(self.names[name], torch.as_tensor(w, device=device).to(dtype))
        cache = (batch, c.num_key_value_heads, max_len, c.head_dim)
        for i in range(c.num_layers):
            self.register_buffer(f"k_cache{i}", torch.zeros(cache, dtype=dtype, device=device))
            self.register_buffer(f"v_cache{i}", torch.zeros(cache, dtype=dtype, device=device))
        half = c.head_dim // 2
        inv_freq = c.rope_theta ** (-np.arange(half, dtype=np.float64) * 2 / c.head_dim)
        angles = np.arange(max_len, dtype=np.float64)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", torch.as_tensor(np.concatenate([np.cos(angles)] * 2, -1), device=device).to(dtype))
        self.register_buffer("sin", torch.as_tensor(np.concatenate([np.sin(angles)] * 2, -1), device=device).to(dtype))
        self.register_buffer("positions", torch.arange(max_len, device=device))

    def w(self, name: str):
        """The weight of the export name ``name``."""
        return getattr(self, self.names[name])

    def cache(self, layer: int):
        """The key and value cache buffers of ``layer``."""
        return getattr(self, f"k_cache{layer}"), getattr(self, f"v_cache{layer}")

    def _rms_norm(self, x, weight):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)).to(x.dtype) * weight

    def _rope(self, x, cos, sin):  # x [batch, heads, seq, dim]; rotate-half, as nn.llm's
        half = self.config.head_dim // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def _layers(self, x, cos, sin, attend):
        """The decoder layers over ``x`` [batch, seq, hidden]; ``attend(layer, q, k, v)`` writes
        the cache and returns attention [batch, heads, seq, dim]."""
        c, w = self.config, self.w
        batch, seq, _ = x.shape
        hq, hkv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        for i in range(c.num_layers):
            p = f"layers.{i}."
            h = self._rms_norm(x, w(p + "input_layernorm.weight"))
            qkv = (h @ w(p + "self_attn.qkv_proj.weight").T).view(batch, seq, hq + 2 * hkv, d).transpose(1, 2)
            q = self._rope(qkv[:, :hq], cos, sin)
            k = self._rope(qkv[:, hq:hq + hkv], cos, sin)
            attn = attend(i, q, k, qkv[:, hq + hkv:])
            x = x + attn.transpose(1, 2).reshape(batch, seq, hq * d) @ w(p + "self_attn.o_proj.weight").T
            h = self._rms_norm(x, w(p + "post_attention_layernorm.weight"))
            gate, up = (h @ w(p + "mlp.gate_up_proj.weight").T).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ w(p + "mlp.down_proj.weight").T
        return x

    def _logits(self, x):
        c = self.config
        head = self.w("embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight")
        return (self._rms_norm(x, self.w("norm.weight")) @ head.T).float()

    def prefill(self, tokens) -> Any:
        """Logits ``[batch, vocab]`` after the prompts ``tokens`` [batch, seq] (from position 0),
        their keys and values written into the cache."""
        seq = tokens.shape[1]
        cos, sin = self.cos[:seq], self.sin[:seq]

        def attend(i, q, k, v):
            k_cache, v_cache = self.cache(i)
            k_cache[:, :, :seq] = k
            v_cache[:, :, :seq] = v
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

        x = self._layers(self.w("embed_tokens.weight")[tokens], cos, sin, attend)
        return self._logits(x[:, -1])

    def decode(self, tokens, position) -> Any:
        """Logits ``[batch, vocab]`` for one new token per sequence (``tokens`` [batch, 1]) at
        ``position`` (a 0-d integer tensor), its key and value written into the cache."""
        at = position.view(1)  # a gather: a 0-d index would read the position on the host (a graph break)
        cos, sin = self.cos.index_select(0, at)[None, None], self.sin.index_select(0, at)[None, None]
        visible = (self.positions <= position)[None, None, None, :]

        def attend(i, q, k, v):
            k_cache, v_cache = self.cache(i)
            k_cache.index_copy_(2, at, k)
            v_cache.index_copy_(2, at, v)
            return torch.nn.functional.scaled_dot_product_attention(
                q, k_cache, v_cache, attn_mask=visible, enable_gqa=True)

        x = self._layers(self.w("embed_tokens.weight")[tokens], cos, sin, attend)
        return self._logits(x[:, -1])
