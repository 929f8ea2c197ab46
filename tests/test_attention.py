"""Attention on tensor cores: the proof and shape it is read from, the tile-incremental form
against float64 (llvm), the generated CUDA, refusals and (GPU) the kernel itself."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.s_tir import SBlock

from conftest import TARGET, cuda_source
from tvm_dsm.errors import ClusterError
from tvm_dsm.rules.attention import (
    AttentionConfig,
    find_attention,
    schedule_attention,
    tile_incremental_form,
)
from tvm_dsm.ir import find_all, replace_node
from tvm_dsm.workloads.cascades import attention, softmax_stats


def _reference(q, k, v, scale, causal=False):
    s = np.einsum("hid,hkd->hik", q.astype(np.float64), k.astype(np.float64)) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p @ v.astype(np.float64)) / p.sum(-1, keepdims=True)


def _inputs(heads, q_len, kv_len, dim):
    rng = np.random.default_rng()
    return [(rng.standard_normal(s) * 2).astype(np.float16)
            for s in ((heads, q_len, dim), (heads, kv_len, dim), (heads, kv_len, dim))]


def test_the_shape_and_correction_come_from_the_proof():
    shape, correction = find_attention(attention(4, 256, 512, 64))
    assert (shape.heads, shape.q_len, shape.kv_len, shape.dim) == (4, 256, 512, 64)
    assert shape.scale == pytest.approx(0.125)
    assert str(correction) == "exp(-y0_new + y0_old)"


@pytest.mark.parametrize(("block_n", "causal", "kv_len"), [(64, False, 512), (128, False, 512), (64, True, 128)])
def test_tile_incremental_form_matches_float64(block_n, causal, kv_len):
    """Several key tiles (the states cross tiles through M/L and Mn/Ln), on the CPU."""
    heads, q_len, dim = 2, 128, 64
    shape, correction = find_attention(attention(heads, q_len, kv_len, dim, causal))
    assert shape.causal == causal
    fused = tile_incremental_form(shape, AttentionConfig(block_n=block_n), correction)
    module = tvm.compile(tvm.IRModule({"main": fused}), target="llvm")
    q, k, v = _inputs(heads, q_len, kv_len, dim)
    out = tvm.runtime.tensor(np.full((heads, q_len, dim), np.nan, np.float16))
    module(*(tvm.runtime.tensor(a) for a in (q, k, v)), out)
    ref = _reference(q, k, v, shape.scale, causal)
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3


def _masked(mask):
    """Attention whose scores a user masked with ``mask(t, i, score)``."""
    func = attention(4, 256, 256, 64, causal=True)
    block = next(b for b in find_all(func.body, SBlock) if b.name_hint == "masked")
    _, i, t = block.body.indices
    store = tvm.tirx.BufferStore(block.body.buffer, mask(t, i, block.body.value.args[1]), block.body.indices)
    return func.with_body(replace_node(func.body, block.body, store))


@pytest.mark.parametrize("causal", [False, True])
def test_generated_cuda_runs_both_products_on_tensor_cores(assemble, causal):
    source = cuda_source(schedule_attention(attention(4, 256, 512, 64, causal)).mod)
    assert source.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") >= 2
    assert source.count("ldmatrix") >= 4  # Q, K, P, V fragments
    assert source.count("__global__") == 2  # one fused kernel
    assemble(source, f"attention_causal{causal}")


@pytest.mark.parametrize(("func", "config", "message"), [
    (attention(4, 256, 512, 64), AttentionConfig(block_n=32), "multiple of 32"),
    (attention(4, 256, 512, 64), AttentionConfig(block_n=128), "only 32"),
    (attention(4, 200, 512, 64), AttentionConfig(), "not multiples"),
    (attention(4, 256, 512, 64), AttentionConfig(block_m=64), "one thread per query row"),
    (softmax_stats(256, 512), AttentionConfig(), "row max and two rescaled sums"),
    (_masked(lambda t, i, score: tvm.tirx.if_then_else(t < i, score, tvm.tirx.const(float("-inf"), "float32"))),
     AttentionConfig(), "only the causal mask"),
    (_masked(lambda t, i, score: tvm.tirx.if_then_else(t <= i, score, tvm.tirx.const(-1e4, "float32"))),
     AttentionConfig(), "only the causal mask"),
])
def test_unsupported_inputs_get_clear_errors(func, config, message):
    with pytest.raises(ClusterError, match=message):
        schedule_attention(func, config)


@pytest.mark.gpu
@pytest.mark.parametrize(("causal", "kv_len"), [(False, 1024), (True, 256)])
def test_gpu_matches_float64(causal, kv_len):
    heads, q_len, dim = 8, 256, 64
    func = attention(heads, q_len, kv_len, dim, causal)
    module = tvm.compile(schedule_attention(func).mod, target=TARGET)
    dev = tvm.cuda(0)
    q, k, v = _inputs(heads, q_len, kv_len, dim)
    out = tvm.runtime.tensor(np.full((heads, q_len, dim), np.nan, np.float16), dev)
    module(*(tvm.runtime.tensor(a, dev) for a in (q, k, v)), out)
    ref = _reference(q, k, v, find_attention(func)[0].scale, causal)
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3
