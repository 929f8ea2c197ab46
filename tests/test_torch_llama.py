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
