"""The Gemma, Phi-2, Mistral, Whisper-encoder and CLIP-encoder layers of
:mod:`tvm_dsm.workloads.torch_layers` at small sizes, on the CPU: each runs in fp32, keeps the
activations' shape, and ``torch.export`` takes it with static shapes and computes what eager torch
does; Mistral's sliding window is applied (it changes the output against plain causal attention, and
matches attention spelled out with a ``tril``/``triu`` band mask)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tvm_dsm.workloads.torch_layers import (CLIPEncoderLayer, GemmaLayer, MistralLayer, Phi2Layer,  # noqa: E402
                                            WhisperEncoderLayer)

LAYERS = {
    "gemma": (lambda: GemmaLayer(256, 4, 1, 64, 512), 256, 96),
    "phi2": (lambda: Phi2Layer(320, 4, 1280, 32), 320, 96),
    "mistral": (lambda: MistralLayer(256, 4, 2, 512, window=16), 256, 96),
    "whisper": (lambda: WhisperEncoderLayer(256, 4, 1024), 256, 150),
    "clip": (lambda: CLIPEncoderLayer(256, 4, 1024), 256, 257),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_the_layer_runs_in_fp32_and_exports_with_static_shapes(name):
    make, hidden, tokens = LAYERS[name]
    torch.manual_seed(0)
    layer = make().eval()
    x = torch.randn(2, tokens, hidden)
    with torch.no_grad():
        y = layer(x)
    assert y.shape == x.shape and y.dtype == torch.float32 and torch.isfinite(y).all()
    program = torch.export.export(layer, (x,))
    torch.testing.assert_close(program.module()(x), y)


def _mistral_spelled_out(layer, x, window):
    b, t, _ = x.shape
    heads, kv, d = layer.heads, layer.kv_heads, layer.head_dim
    h = layer.input_layernorm(x)
    q = layer.q_proj(h).view(b, t, heads, d).transpose(1, 2)
    k = layer.k_proj(h).view(b, t, kv, d).transpose(1, 2).repeat_interleave(heads // kv, 1)
    v = layer.v_proj(h).view(b, t, kv, d).transpose(1, 2).repeat_interleave(heads // kv, 1)
    rotate = lambda z: torch.cat((-z[..., d // 2:], z[..., :d // 2]), -1)  # noqa: E731
    cos, sin = layer.cos[:t], layer.sin[:t]
    q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    keep = torch.ones(t, t, dtype=torch.bool).tril().triu(-(window - 1))
    a = ((q @ k.transpose(-1, -2)) / d ** 0.5).masked_fill(~keep, float("-inf")).softmax(-1) @ v
    x = x + layer.o_proj(a.transpose(1, 2).reshape(b, t, -1))
    h = layer.post_attention_layernorm(x)
    return x + layer.down_proj(torch.nn.functional.silu(layer.gate_proj(h)) * layer.up_proj(h))


def test_mistral_applies_its_sliding_window():
    torch.manual_seed(0)
    window, tokens = 16, 96
    layer = MistralLayer(256, 4, 2, 512, window=window).eval()
    x = torch.randn(2, tokens, 256)
    with torch.no_grad():
        y = layer(x)
        torch.testing.assert_close(y, _mistral_spelled_out(layer, x, window))
        layer.window = tokens
        causal = layer(x)
    torch.testing.assert_close(causal, _mistral_spelled_out(layer, x, tokens))
    torch.testing.assert_close(y[:, :window], causal[:, :window])
    assert (y[:, window:] - causal[:, window:]).abs().max() > 1e-2
