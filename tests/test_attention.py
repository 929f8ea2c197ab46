"""Attention as one kernel: the proof and shape it is read from, the generated CUDA (both
products on warpgroup MMAs, registers without spills), refusals and (GPU) the kernel itself
against float64."""

from __future__ import annotations


import numpy as np
import pytest
import tvm
from tvm.s_tir import SBlock

from conftest import TARGET, cuda_source, registers
from tvm_dsm.errors import ClusterError
from tvm_dsm.kernels.attention import (CONFIGS, AttentionConfig, default_config, find_attention, fuse_attention,
                                       overlaps_softmax)
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


def test_the_shape_comes_from_the_function():
    shape = find_attention(attention(4, 256, 512, 64))
    assert (shape.heads, shape.q_len, shape.kv_len, shape.dim) == (4, 256, 512, 64)
    assert shape.scale == pytest.approx(0.125)
    assert not shape.causal and shape.head_extents == (4,)


def _masked(mask):
    """Attention whose scores a user masked with ``mask(t, i, score)``."""
    func = attention(4, 256, 256, 64, causal=True)
    block = next(b for b in find_all(func.body, SBlock) if b.name_hint == "masked")
    _, i, t = block.body.indices
    store = tvm.tirx.BufferStore(block.body.buffer, mask(t, i, block.body.value.args[1]), block.body.indices)
    return func.with_body(replace_node(func.body, block.body, store))


@pytest.mark.parametrize("causal", [False, True])
def test_one_kernel_runs_both_products_on_warpgroup_mmas(assemble, causal):
    source = cuda_source(fuse_attention(attention(4, 256, 512, 64, causal), AttentionConfig(64)))
    assert source.count("__global__") == 2  # one fused kernel (declaration and definition)
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in source  # S = Q K^T, O += P V
    # S waited for alone on the first tile, then while the previous tile's P V runs on
    assert source.count("tvm_dsm_attention_wait32_1(") == 2  # defined and called once
    body = source[source.index("__global__ void"):]
    assert body.index("tvm_dsm_attention_values_") < body.index("tvm_dsm_attention_wait32_1(")
    assert "cp.async.bulk.tensor.3d" in source and "mbarrier" in source  # TMA tiles
    assert "cp.async.cg" not in source
    assert "ex2.approx.ftz.f32" in source
    assert "__shfl_xor_sync" in source  # a row's max and sum over its quad
    assert "expf(" in source  # the proof's correction exp(m_old - m_new)
    assert ("-CUDART_INF_F" in source) == causal  # the diagonal tiles' mask
    assemble(source, f"attention_causal{causal}")


@pytest.mark.parametrize("config", CONFIGS)
def test_probabilities_and_output_are_rounded_in_pairs(config):
    """One cvt.rn.f16x2.f32 per two values, O staged in shared memory and written by TMA (scalar
    casts wrote the output 2 bytes at a time, measured up to 1.42x slower), and the
    probabilities' register array keeps every element although only pairs' addresses are taken."""
    source = cuda_source(fuse_attention(attention(2, 256, 512, 64), config))
    scores = config.row_blocks * config.block_n // 2  # per-thread fp32 scores (and fp16 P)
    outputs = config.row_blocks * 64 // 2
    assert f"half p_ptr[{scores}]" in source
    # overlapped, the first key tile's step is written apart (no P V before it)
    steps = 2 if overlaps_softmax(find_attention(attention(2, 256, 512, 64)), config) else 1
    assert source.count("tvm_dsm_pack_half2((&(p_ptr[") == steps * scores // 2
    assert source.count("tvm_dsm_pack_half2((&(((half*)buf_dyn_shmem_ptr)[") == outputs // 2  # O staged
    # the TMA store helper's definition, then one call per 64-column panel of the 64-wide head
    assert source.count("s2g_async_bulk_tensor_3d_global_shared__cta_bulk_group(") == 1 + 64 // 64
    assert "((half)" not in source[source.index("for (int t = 0"):]  # no scalar cast in the loop or after


@pytest.mark.parametrize(("dim", "config"), [*((dim, config) for dim in (64, 128) for config in CONFIGS),
                                           (192, AttentionConfig(128)), (192, AttentionConfig(64, 1, 2)),
                                           (256, AttentionConfig(64)),
                                           (256, AttentionConfig(64, 1, 2))])
def test_every_configuration_fits_in_registers(ptxas_report, dim, config):
    """A spill would put the scores in local memory; CONFIGS lists only the ones that fit, and
    wider heads take those within the accumulator and shared-memory limits (the most of each)."""
    report = ptxas_report(cuda_source(fuse_attention(attention(2, 256, 512, dim, True), config)),
                          f"attention_d{dim}_m{config.block_m}n{config.block_n}")
    assert "0 bytes spill stores" in report and "0 bytes stack frame" in report


@pytest.mark.parametrize(("dim", "causal", "config"), [(64, False, AttentionConfig(128, 1, 2)),
                                                     (128, False, AttentionConfig(64, 1, 2)),
                                                     (128, True, AttentionConfig(64, 1, 2))])
def test_two_warpgroup_configurations_keep_two_ctas_per_sm(ptxas_report, dim, causal, config):
    """Two warpgroups (256 threads) take 80 KB (head dim 64, 128-key tiles) or 96 KB (head dim
    128, 64-key tiles) of shared memory: two CTAs share an SM only while a thread needs at most
    128 registers. An epilogue rewrite that cost the head-dim-64 configuration 2 registers more
    made it 1.2-1.3x slower on the H100 (bench/results/attention_producer_ab.json)."""
    func = attention(2, 256, 512, dim, causal)
    report = ptxas_report(cuda_source(fuse_attention(func, config)), f"attention_d{dim}_causal{causal}_two_ctas")
    used = registers(report)
    assert used * 256 * 2 <= 64 * 1024, used


@pytest.mark.parametrize(("func", "config", "message"), [
    (attention(4, 256, 512, 64), AttentionConfig(block_n=32), "checked to fit"),
    (attention(4, 256, 512, 64), AttentionConfig(block_n=256), "checked to fit"),
    (attention(4, 256, 512, 320), AttentionConfig(), "head dim 320"),
    (attention(4, 256, 512, 256), AttentionConfig(64, 2), "320 fp32 accumulators a thread"),
    (attention(4, 256, 512, 256), AttentionConfig(128), "295936 B of shared memory"),
    (attention(4, 256, 512, 100), AttentionConfig(), "head dim 100"),
    (softmax_stats(256, 512), AttentionConfig(), "a row max and two row sums"),
    (_masked(lambda t, i, score: tvm.tirx.if_then_else(t <= i, score, score * 0.5)),
     AttentionConfig(), "a masked score must be a constant"),
])
def test_unsupported_inputs_get_clear_errors(func, config, message):
    with pytest.raises(ClusterError, match=message):
        fuse_attention(func, config)


def test_wider_heads_are_planned_in_the_configurations_that_fit():
    """Head dims 192 and 256 (three and four panels, wgmma N up to 256): the planner offers the
    configurations within the accumulator and shared-memory limits, the default among them: one
    warpgroup a CTA where the CTAs of 64 query rows are one wave, two beyond it."""
    from tvm_dsm.kernels.attention import TEMPLATE

    wide, many = (find_attention(attention(heads, 256, 512, 256, True)) for heads in (4, 64))
    assert (default_config(wide), default_config(many)) == (AttentionConfig(64), AttentionConfig(64, 1, 2))
    for shape in (wide, many):
        assert default_config(shape) in TEMPLATE.configs(shape) and len(TEMPLATE.configs(shape)) < len(CONFIGS)
    source = cuda_source(fuse_attention(attention(4, 256, 512, 256, True)))
    assert "wgmma.mma_async.sync.aligned.m64n256k16" in source  # O += P V over the whole head
    assert TEMPLATE.configs(find_attention(attention(4, 256, 512, 128))) == list(CONFIGS)


@pytest.mark.gpu
@pytest.mark.parametrize(("causal", "kv_len", "dim", "config"), [
    (False, 1024, 64, AttentionConfig()), (True, 256, 64, AttentionConfig()),
    (False, 512, 64, CONFIGS[1]), (True, 512, 64, CONFIGS[2]),
    (False, 512, 128, AttentionConfig()), (True, 256, 128, CONFIGS[1]),
    (False, 512, 64, CONFIGS[4]), (True, 512, 128, CONFIGS[3]),
    (True, 512, 192, AttentionConfig(128)), (False, 320, 256, AttentionConfig(64, 1, 2)),
    (True, 256, 256, AttentionConfig(64)), (False, 512, 160, AttentionConfig(64, 1, 2)),
])
def test_gpu_matches_float64(causal, kv_len, dim, config):
    heads, q_len = 8, 256
    func = attention(heads, q_len, kv_len, dim, causal)
    module = tvm.compile(fuse_attention(func, config), target=TARGET)
    dev = tvm.cuda(0)
    q, k, v = _inputs(heads, q_len, kv_len, dim)
    out = tvm.runtime.tensor(np.full((heads, q_len, dim), np.nan, np.float16), dev)
    module(*(tvm.runtime.tensor(a, dev) for a in (q, k, v)), out)
    ref = _reference(q, k, v, find_attention(func).scale, causal)
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3


def test_two_warpgroups_share_each_key_tile():
    """Two warpgroups of 64 rows each: 256 threads, one set of key/value copies per step for
    both, each warpgroup's score MMAs reading its own 64 query rows."""
    func = attention(2, 256, 512, 64)
    assert default_config(find_attention(func)) == AttentionConfig(64)
    assert default_config(find_attention(attention(2, 256, 1024, 64, True))) == AttentionConfig(128)
    source = cuda_source(fuse_attention(func, AttentionConfig(128, 1, 2)))
    assert "__launch_bounds__(256)" in source
    loop = source[source.index("for (int t = 0"):]
    assert loop.count("mbarrier__complete_tx__bytes(") == 2  # this step's K and V panels, once
    assert "(((int)threadIdx.x) >> 7) * 4096)" in loop  # warpgroup w: Q rows 64w.. (64 x 64 halves)

    def skips(loop):  # conditions on the step that depend on the warpgroup
        return [line for line in loop.splitlines() if "if (t <" in line and "threadIdx.x) >> 7)" in line]

    assert not skips(loop)  # unmasked: every warpgroup computes every tile
    # Causal at head dim 128 over more CTAs than SMs and fewer than 2048 keys (the pick there;
    # unmasked, one warpgroup of two row blocks): a warpgroup skips the tiles past its rows' diagonal.
    assert default_config(find_attention(attention(64, 1024, 512, 128))) == AttentionConfig(64, 2)
    causal = attention(64, 1024, 512, 128, True)
    assert default_config(find_attention(causal)) == AttentionConfig(64, 1, 2)
    source = cuda_source(fuse_attention(causal))
    assert len(skips(source[source.index("for (int t = 0"):])) == 1


@pytest.mark.parametrize("heads, q_len, kv_len, causal, expected", [
    (16, 1024, 1024, False, AttentionConfig(128, 1, 2)),  # 128 CTAs of 128 rows: one wave
    (32, 1024, 1024, False, AttentionConfig(64, 2)),  # 256: two row blocks, two CTAs an SM
    (28, 4096, 4096, False, AttentionConfig(128, 1, 2)),  # 896: 6.8 waves of one an SM, 3.4 of two
    (32, 4096, 4096, False, AttentionConfig(64, 2)),  # 1024: 7.8 waves against 3.9
    (32, 2048, 2048, True, AttentionConfig(128, 1, 2)),  # masked, 2048 keys
    (32, 1024, 1024, True, AttentionConfig(64, 1, 2)),
])
def test_head_dim_128_picks_by_wave_and_keys(heads, q_len, kv_len, causal, expected):
    """Two warpgroups share 128-key tiles where a CTA of 128 rows per SM is one wave (on the
    H100's and H200's 132 SMs) or, masked, from 2048 keys; elsewhere the 64-key forms."""
    assert default_config(find_attention(attention(heads, q_len, kv_len, 128, causal))) == expected


def test_tutorial_proves_fuses_and_assembles(capsys):
    from conftest import run_tutorial

    out = run_tutorial("attention", capsys)
    assert "fusible: every level is separable" in out
    assert "correction exp(-y0_new + y0_old)" in out
    assert "warpgroup MMAs: 2" in out
    assert "nvcc sm_90a: assembles" in out or "skipped (no nvcc)" in out


@pytest.mark.parametrize(("dim", "config", "overlapped"), [
    (64, AttentionConfig(128), True), (128, AttentionConfig(128), True), (128, AttentionConfig(64), True),
    (64, AttentionConfig(64, 2), False),  # each row block's MMAs a group: the wait would take both
    (128, AttentionConfig(64, 1, 2), False), (256, AttentionConfig(64), False),  # two warpgroups; 176 registers
])
def test_the_softmax_overlaps_with_one_row_block_of_one_warpgroup(dim, config, overlapped):
    assert overlaps_softmax(find_attention(attention(2, 256, 512, dim)), config) == overlapped

