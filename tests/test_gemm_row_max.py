"""Sparton's LM-head max as one kernel: the split-K GEMM main loop, the activation tile kept in
shared memory, a max over each sequence's rows (tvm_dsm.rules.gemm_row_max)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from conftest import LLVM, TARGET, cuda_source

from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners.gemm_row_max import plan_gemm_row_max, row_max_shape, schedule_row_max
from tvm_dsm.rules.gemm_row_max import schedule_gemm_row_max
from tvm_dsm.rules.split_k_gemm import SplitKGemmConfig
from tvm_dsm.workloads.dense import dense
from tvm_dsm.workloads.lm_head import lm_head_max


def _reference(h, w, b, seq):
    logits = h.astype(np.float64) @ w.astype(np.float64).T + b
    return np.log1p(np.maximum(logits, 0)).reshape(-1, seq, w.shape[0]).max(1)


def test_workload_matches_numpy_on_cpu():
    batch, seq, hidden, vocab = 2, 8, 32, 64
    func = tvm.compile(lm_head_max(batch, seq, hidden, vocab), target=LLVM)
    rng = np.random.default_rng(0)
    h = rng.standard_normal((batch * seq, hidden)).astype(np.float16)
    w = (rng.standard_normal((vocab, hidden)) / np.sqrt(hidden)).astype(np.float16)
    b = rng.standard_normal(vocab).astype(np.float16)
    y = tvm.runtime.tensor(np.full((batch, vocab), np.nan, np.float32))
    func(*(tvm.runtime.tensor(a) for a in (h, w, b)), y)
    np.testing.assert_allclose(y.numpy(), _reference(h, w, b, seq), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 128, 768, 4096), (4, 32, 256, 1024)])
def test_kernel_keeps_the_logits_on_chip_and_assembles(shape, assemble):
    sch, plan = schedule_row_max(lm_head_max(*shape))
    source = cuda_source(sch.mod)
    assert ("mma.sync.aligned.m16n8k16" in source or "wgmma.mma_async" in source) \
        and "extern __shared__" in source
    # the kernel's global buffers are the parameters (no workspace for the logits; H and W as
    # pointers or TMA tensor maps), and it stores only the [batch, vocab] result
    signature = source[source.index("main_kernel("):].split(")", 1)[0]
    assert set(re.findall(r"(\w+?)_(?:ptr|tensormap)\b", signature)) == {"H", "W", "bias", "Y"}
    assert "Y_ptr[" in source and not re.search(r"\b(H|W|bias)_ptr\[[^]]*\] = ", source)
    assert plan.config.cluster_size == 1 and "GEMM" in plan.explain()
    assemble(source, f"lm_head_{'x'.join(map(str, shape))}")


def test_every_thread_reduces_when_outputs_are_fewer_than_threads():
    """128-row sequences in a 128x64 tile: 64 outputs for 128 threads, so two threads reduce
    64 rows each (rfactor) and the output takes the larger; without it, the register cache's
    write-back lost the block's predicate and wrote past the tile."""
    config = SplitKGemmConfig(1, 128, 64, 64, 2, 2, 3)
    sch = schedule_gemm_row_max(lm_head_max(1, 128, 768, 4096), config, load_hardware())
    assert "Y_rf" in sch.mod.script()
    source = cuda_source(sch.mod)
    assert "Y_rf_shared_ptr" in source


@pytest.mark.parametrize(("func", "config", "reason"), [
    (lm_head_max(1, 128, 768, 4096), SplitKGemmConfig(2, 128, 64, 64, 2, 2, 3), "K is not split"),
    (lm_head_max(1, 256, 768, 4096), SplitKGemmConfig(1, 128, 64, 64, 2, 2, 3), "whole groups"),
    (lm_head_max(1, 128, 768, 4096), SplitKGemmConfig(1, 128, 256, 64, 2, 4, 4), "shared memory"),
    (dense(128, 256, 512), SplitKGemmConfig(1, 128, 64, 64, 2, 2, 3), "max block"),
])
def test_unsupported_inputs_are_refused_with_a_reason(func, config, reason):
    with pytest.raises(ClusterError, match=reason):
        schedule_gemm_row_max(func, config, load_hardware())


def test_planner_refuses_a_vocabulary_off_the_tile():
    with pytest.raises(ClusterError, match="multiple of 64"):
        plan_gemm_row_max(row_max_shape(lm_head_max(1, 128, 768, 30522)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 128, 768, 4096), (8, 32, 768, 2048)])
def test_gpu_matches_float64(shape):
    batch, seq, hidden, vocab = shape
    sch, _ = schedule_row_max(lm_head_max(*shape))
    func = tvm.compile(sch.mod, target=TARGET)
    dev = tvm.cuda(0)
    rng = np.random.default_rng()
    h = rng.standard_normal((batch * seq, hidden)).astype(np.float16)
    w = (rng.standard_normal((vocab, hidden)) / np.sqrt(hidden)).astype(np.float16)
    b = rng.standard_normal(vocab).astype(np.float16)
    y = tvm.runtime.tensor(np.full((batch, vocab), np.nan, np.float32), dev)
    func(*(tvm.runtime.tensor(a, dev) for a in (h, w, b)), y)
    ref = _reference(h, w, b, seq)
    assert np.linalg.norm(y.numpy() - ref) / np.linalg.norm(ref) < 2e-3


def test_user_entry_points_pick_the_row_max_family():
    import tvm_dsm

    ranking = tvm_dsm.plan(lm_head_max(1, 128, 768, 4096))
    assert ranking.explain().startswith("gemm_row_max:")
