"""Convolution chains as GEMM chains over pixels (tvm_dsm.rules.conv_chain): the match, the
plan (views or a gather first), the generated CUDA, refusals, and (GPU) C-chains against
float64 with poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvm_dsm
from conftest import TARGET, cuda_source
from tvm_dsm.errors import ClusterError
from tvm_dsm.rules.conv_chain import find_conv_chain
from tvm_dsm.workloads.chains import CONV_CHAINS, conv_chain, gemm_chain


def test_the_chain_is_matched_structurally_with_its_activation():
    shape = find_conv_chain(conv_chain(64, 14, 128, 64, 3, 1, batch=2, activation="gelu"))
    assert (shape.batch, shape.hw, shape.ic, shape.oc1, shape.oc2, shape.k1) == (2, 14, 64, 128, 64, 3)
    assert shape.activation == "gelu" and shape.pixels == 2 * 14 * 14 and shape.depth == 9 * 64


@pytest.mark.parametrize(("func", "message"), [
    (conv_chain(64, 14, 128, 64, 3, 3), "only 1x1"),
    (conv_chain(12, 14, 128, 64, 1, 1), "8-channel vectors"),
    (gemm_chain(128, 256, 128, 64), "X \\[N, H, W, C\\]"),
])
def test_other_functions_are_refused_with_the_reason(func, message):
    with pytest.raises(ClusterError, match=message):
        find_conv_chain(func)


def test_a_1x1_chain_that_fits_the_tiles_runs_on_views_of_the_callers_tensors():
    ranking = tvm_dsm.plan(conv_chain(*CONV_CHAINS["C2"]))
    assert ranking.family.name == "conv_chain"
    assert "no copies" in ranking.best.summary() and "gather" not in ranking.best.bytes
    source = cuda_source(ranking.schedule().mod)
    assert source.count("__global__") == 4  # the unfused chain's two kernels, declared and defined


def test_a_3x3_chain_gathers_its_windows_then_runs_the_chain(assemble):
    ranking = tvm_dsm.plan(conv_chain(*CONV_CHAINS["C7"]))
    best = ranking.best
    assert best.config.rows == 208 and best.config.depth == 9 * 256  # 196 pixels padded to 16s
    assert best.bytes["gather"] > 0 and "a gather kernel first" in best.summary()
    source = cuda_source(ranking.schedule().mod)
    assert source.count("__global__") >= 6  # gather, the chain's kernel(s), the rows copied out
    assemble(source, "conv_chain_c7")


def test_fused_plans_are_weighed_as_in_the_chain_family():
    """The chain family's fused predictions carry the fused model's measured optimism
    (FUSED_PICK_BIAS); a convolution chain ranks its GEMM chain the same way, plus the gather."""
    from tvm_dsm.families.conv_chain import conv_rank_key

    ranking = tvm_dsm.plan(conv_chain(*CONV_CHAINS["C4"]))
    keys = [conv_rank_key(p) for p in ranking.plans]
    assert keys == sorted(keys)
    assert min(p.predicted_us for p in ranking.plans) < ranking.best.predicted_us  # a fused plan


@pytest.mark.parametrize("label", sorted(CONV_CHAINS))
def test_every_chain_plans_and_its_pick_lowers(label):
    ranking = tvm_dsm.plan(conv_chain(*CONV_CHAINS[label]))
    tvm.compile(ranking.schedule().mod, target=TARGET)


@pytest.mark.parametrize("label", ["C5", "C6"])
def test_chains_after_a_gather_assemble(label, assemble):
    """C5 runs cp.async main loops on the gathered workspace, C6 a fused chain reading it by
    TMA: both failed to lower while StorageRewrite retyped or reused that workspace."""
    ranking = tvm_dsm.plan(conv_chain(*CONV_CHAINS[label]))
    assert "gather" in ranking.best.bytes
    assemble(cuda_source(ranking.schedule().mod), f"conv_chain_{label.lower()}")


@pytest.mark.gpu
@pytest.mark.parametrize(("label", "batch"), [("C1", 1), ("C2", 1), ("C3", 1), ("C5", 1), ("C6", 2),
                                              ("C7", 2), ("C8", 1)])
def test_gpu_matches_float64(label, batch):
    ic, hw, oc1, oc2, k1, k2 = CONV_CHAINS[label]
    func = conv_chain(ic, hw, oc1, oc2, k1, k2, batch=batch)
    module = tvm_dsm.build(func, TARGET)
    rng = np.random.default_rng()
    x = rng.standard_normal((batch, hw, hw, ic)).astype(np.float16)
    w1 = (rng.standard_normal((oc1, k1, k1, ic)) / np.sqrt(k1 * k1 * ic)).astype(np.float16)
    w2 = (rng.standard_normal((oc2, 1, 1, oc1)) / np.sqrt(oc1)).astype(np.float16)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((batch, hw, hw, oc2), np.nan, np.float16), dev)
    module(*(tvm.runtime.tensor(a, dev) for a in (x, w1, w2)), out)
    pad = k1 // 2
    padded = np.pad(x.astype(np.float64), ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    c1 = sum(np.einsum("nhwc,oc->nhwo", padded[:, r:r + hw, s:s + hw], w1[:, r, s].astype(np.float64))
             for r in range(k1) for s in range(k1))
    ref = np.einsum("nhwc,oc->nhwo", np.maximum(c1, 0), w2[:, 0, 0].astype(np.float64))
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3
