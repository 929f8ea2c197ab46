"""The Gemma, Phi-2, Mistral, Whisper-encoder, CLIP-encoder, GPT-NeoX, Falcon, BLOOM and OPT layers
and the Mixtral MoE block of :mod:`tvm_dsm.workloads.torch_layers` at small sizes, on the CPU: each
runs in fp32, keeps the activations' shape, and ``torch.export`` takes it with static shapes and
computes what eager torch does; the last five also run in fp16 (close to fp32, and exported the
same), and the causal ones let no token see a later one; Mistral's sliding window is applied (it
changes the output against plain causal attention, and matches attention spelled out with a
``tril``/``triu`` band mask); BLOOM's ALiBi slopes are the closed form's, and its layer matches
attention spelled out with the bias added; the MoE block matches routing done token by token."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tvm_dsm.workloads.torch_layers import (BloomLayer, CLIPEncoderLayer, FalconLayer, GemmaLayer,  # noqa: E402
                                            GPTNeoXLayer, MistralLayer, MixtralMoEBlock, OPTDecoderLayer,
                                            Phi2Layer, WhisperEncoderLayer, _alibi_slopes)

LAYERS = {
    "gemma": (lambda: GemmaLayer(256, 4, 1, 64, 512), 256, 96),
    "phi2": (lambda: Phi2Layer(320, 4, 1280, 32), 320, 96),
    "mistral": (lambda: MistralLayer(256, 4, 2, 512, window=16), 256, 96),
    "whisper": (lambda: WhisperEncoderLayer(256, 4, 1024), 256, 150),
    "clip": (lambda: CLIPEncoderLayer(256, 4, 1024), 256, 257),
    "gpt_neox": (lambda: GPTNeoXLayer(256, 4, 1024, rotary_pct=0.25), 256, 96),
    "falcon": (lambda: FalconLayer(320, 5, 1280), 320, 96),
    "bloom": (lambda: BloomLayer(384, 12, 1536), 384, 96),
    "opt": (lambda: OPTDecoderLayer(256, 4, 1024), 256, 96),
    "mixtral_moe": (lambda: MixtralMoEBlock(128, 256, 8, 2), 128, 48),
}
HALF = ("gpt_neox", "falcon", "bloom", "opt", "mixtral_moe")
CAUSAL = ("gpt_neox", "falcon", "bloom", "opt")


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


@pytest.mark.parametrize("name", HALF)
def test_the_layer_runs_in_fp16_close_to_fp32_and_exports(name):
    make, hidden, tokens = LAYERS[name]
    torch.manual_seed(0)
    layer = make().eval()
    x = torch.randn(2, tokens, hidden)
    with torch.no_grad():
        y32 = layer(x)
        layer.half()
        y = layer(x.half())
    assert y.shape == x.shape and y.dtype == torch.float16 and torch.isfinite(y).all()
    torch.testing.assert_close(y.float(), y32, atol=2e-2, rtol=2e-2)
    program = torch.export.export(layer, (x.half(),))
    torch.testing.assert_close(program.module()(x.half()), y)


@pytest.mark.parametrize("name", CAUSAL)
def test_no_token_sees_a_later_one(name):
    make, hidden, tokens = LAYERS[name]
    torch.manual_seed(0)
    layer = make().eval()
    x = torch.randn(1, tokens, hidden)
    changed = x.clone()
    changed[:, tokens // 2:] = torch.randn(1, tokens - tokens // 2, hidden)
    with torch.no_grad():
        y, z = layer(x), layer(changed)
    torch.testing.assert_close(y[:, :tokens // 2], z[:, :tokens // 2])
    assert (y[:, tokens // 2:] - z[:, tokens // 2:]).abs().max() > 1e-2


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


def test_bloom_alibi_slopes_are_the_closed_form():
    assert torch.equal(_alibi_slopes(8), 2.0 ** -torch.arange(1, 9.0))
    torch.testing.assert_close(_alibi_slopes(16), 2.0 ** (-0.5 * torch.arange(1, 17.0)))
    # 12 heads: the 8-head slopes, then every other one of the 16-head slopes (2^-0.5, 2^-1.5, ...)
    torch.testing.assert_close(_alibi_slopes(12), torch.cat([2.0 ** -torch.arange(1, 9.0),
                                                             2.0 ** -(torch.arange(0, 4.0) + 0.5)]))
    layer = BloomLayer(384, 12, 1536)
    alibi = layer.build_alibi_tensor(2, 5, torch.float32)
    assert alibi.shape == (24, 1, 5)
    torch.testing.assert_close(alibi.view(2, 12, 5)[1], _alibi_slopes(12)[:, None] * torch.arange(5.0))


def test_bloom_matches_attention_spelled_out_with_alibi():
    torch.manual_seed(0)
    layer = BloomLayer(384, 12, 1536).eval()
    b, t, heads, d = 2, 40, 12, 32
    x = torch.randn(b, t, 384)
    with torch.no_grad():
        h = layer.input_layernorm(x)
        q, k, v = layer.query_key_value(h).view(b, t, heads, 3, d).permute(3, 0, 2, 1, 4)
        bias = _alibi_slopes(heads)[:, None, None] * torch.arange(t)[None, None, :]
        scores = q @ k.transpose(-1, -2) / d ** 0.5 + bias
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        x1 = x + layer.dense((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))
        h = layer.post_attention_layernorm(x1)
        expected = x1 + layer.dense_4h_to_h(torch.nn.functional.gelu(layer.dense_h_to_4h(h), approximate="tanh"))
        torch.testing.assert_close(layer(x), expected)


def test_mixtral_moe_matches_routing_token_by_token():
    torch.manual_seed(0)
    hidden, experts, top_k = 64, 8, 2
    block = MixtralMoEBlock(hidden, 96, experts, top_k).eval()
    x = torch.randn(2, 12, hidden)
    with torch.no_grad():
        y = block(x)
        expected = torch.zeros(24, hidden)
        for i, token in enumerate(x.reshape(-1, hidden)):
            probs = torch.softmax(block.gate(token), dim=-1)
            weights, chosen = probs.topk(top_k)
            for w, e in zip(weights / weights.sum(), chosen.tolist()):
                expert = block.experts[e]
                expected[i] += w * expert.w2(torch.nn.functional.silu(expert.w1(token)) * expert.w3(token))
    torch.testing.assert_close(y, expected.view(2, 12, hidden))
    routing = block.routing(x.reshape(-1, hidden))
    assert ((routing > 0).sum(-1) == top_k).all()
    torch.testing.assert_close(routing.sum(-1), torch.ones(24))
