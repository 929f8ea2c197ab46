"""The torch contenders of the LLM run compute the same model: TorchLlama (static KV cache,
SDPA) against the float64 numpy evaluation, in prefill and teacher-forced decode, on the CPU
(where torch is installed; the GPU machine has it)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tvm_dsm.workloads.llama import LLAMA_TINY, random_weights, reference_logits

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_prefill_and_decode_match_the_float64_model(compiled):
    from tvm_dsm.gpu.torch_llama import TorchLlama

    config = dataclasses.replace(LLAMA_TINY, dtype="float32")
    weights = random_weights(config)
    rng = np.random.default_rng(0)
    batch, prompt, steps = 2, 7, 3
    tokens = rng.integers(0, config.vocab_size, (batch, prompt + steps))
    ref = reference_logits(config, {k: v.astype(np.float64) for k, v in weights.items()}, tokens,
                           np.arange(prompt - 1, prompt + steps), np, lambda a: a)
    model = TorchLlama(config, weights, batch, max_len=16, device="cpu")
    decode = torch.compile(model.decode) if compiled else model.decode
    with torch.no_grad():
        got = [model.prefill(torch.as_tensor(tokens[:, :prompt]))]
        for step in range(steps):
            position = torch.tensor(prompt + step)
            got.append(decode(torch.as_tensor(tokens[:, prompt + step:prompt + step + 1]), position))
    got = np.stack([g.numpy() for g in got], axis=1)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


def test_a_compiled_decode_step_is_one_graph_writing_its_layer_buffers_in_place():
    """No graph break (the position is gathered on the device), and each layer's key and value
    go into that layer's own buffers, as a StaticCache holds them."""
    from tvm_dsm.gpu.torch_llama import TorchLlama

    config = dataclasses.replace(LLAMA_TINY, dtype="float32")
    model = TorchLlama(config, random_weights(config), 2, max_len=16, device="cpu")
    tokens, position = torch.zeros((2, 1), dtype=torch.long), torch.tensor(3)
    with torch.no_grad():
        explained = torch._dynamo.explain(model.decode)(tokens, position)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        torch.compile(model.decode)(tokens, position)
    for layer in range(config.num_layers):
        for cache in model.cache(layer):
            assert cache.shape == (2, config.num_key_value_heads, 16, config.head_dim)
            assert cache[:, :, 3].abs().sum() > 0 and cache[:, :, 4:].abs().sum() == 0
