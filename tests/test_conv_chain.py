"""Convolution chains as GEMM chains over pixels (tvm_dsm.rules.conv_chain): the match, the
plan (views or a gather first), the generated CUDA, refusals, and (GPU) C-chains against
float64 with poisoned outputs."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, tirx, topi

import tvm_dsm
from conftest import TARGET, cuda_source
from tvm_dsm.errors import ClusterError
from tvm_dsm.rules.conv_chain import find_conv_chain
from tvm_dsm.workloads.chains import CONV_CHAINS, conv_chain, gemm_chain


def test_the_builders_chain_is_read_with_its_shape_and_activation():
    shape = find_conv_chain(conv_chain(64, 14, 128, 64, 3, 1, batch=2, activation="gelu"))
    assert (shape.batch, shape.hw, shape.ic, shape.oc1, shape.oc2, shape.k1) == (2, 14, 64, 128, 64, 3)
    assert shape.activation == "gelu" and shape.pixels == 2 * 14 * 14 and shape.depth == 9 * 64


def _topi_chain(layout: str, ic: int, hw: int, oc1: int, oc2: int, k: int, batch: int = 1,
                stride: int = 1, padding=None) -> tvm.tirx.PrimFunc:
    """TOPI's convolutions (``topi.nn.conv`` in ``layout``, weights OHWI or OIHW, float32
    accumulation), TOPI's relu before the rounding to float16."""
    nhwc = layout == "NHWC"
    x = te.placeholder((batch, hw, hw, ic) if nhwc else (batch, ic, hw, hw), "float16", name="X")
    w1 = te.placeholder((oc1, k, k, ic) if nhwc else (oc1, ic, k, k), "float16", name="W1")
    w2 = te.placeholder((oc2, 1, 1, oc1) if nhwc else (oc2, oc1, 1, 1), "float16", name="W2")
    kernel_layout = "OHWI" if nhwc else "OIHW"
    c1 = topi.nn.conv(x, w1, stride, k // 2 if padding is None else padding, 1, 1, layout, kernel_layout, "float32")
    h = topi.cast(topi.nn.relu(c1), "float16")
    c2 = topi.nn.conv(h, w2, 1, 0, 1, 1, layout, kernel_layout, "float32")
    return te.create_prim_func([x, w1, w2, topi.cast(c2, "float16")])


def _hand_chain(ic: int, hw: int, oc1: int, oc2: int, k: int, batch: int = 1, stride: int = 1,
                pad: int | None = None, inside=None) -> tvm.tirx.PrimFunc:
    """The chain in another TE style: a Select padding block whose bounds are written as
    differences, the reduction over (channel, kh, kw) with the weight first, the rounding before
    the relu, and the 1x1 convolution over the channels only, its weight read at [o, 0, 0, c]."""
    pad = k // 2 if pad is None else pad
    size = hw + 2 * pad
    x = te.placeholder((batch, hw, hw, ic), "float16", name="image")
    w1 = te.placeholder((oc1, k, k, ic), "float16", name="filters")
    w2 = te.placeholder((oc2, 1, 1, oc1), "float16", name="projection")
    inside = inside or (lambda a, b: te.all(a - pad >= 0, b - pad >= 0, a - pad <= hw - 1, b - pad <= hw - 1))
    padded = te.compute((batch, size, size, ic), lambda b, a, c, ch: tirx.Select(
        inside(a, c), x[b, a - pad, c - pad, ch], tirx.const(0, "float16")), name="padded")
    ch, dy, dx = te.reduce_axis((0, ic), "ch"), te.reduce_axis((0, k), "dy"), te.reduce_axis((0, k), "dx")
    out = (size - k) // stride + 1
    y1 = te.compute((batch, out, out, oc1), lambda b, i, j, f: te.sum(
        w1[f, dy, dx, ch].astype("float32") * padded[b, i * stride + dy, j * stride + dx, ch].astype("float32"),
        axis=[ch, dy, dx]), name="y1")
    h = te.compute(y1.shape, lambda *i: te.max(y1(*i).astype("float16"), tirx.const(0, "float16")), name="h")
    f = te.reduce_axis((0, oc1), "f")
    y2 = te.compute((batch, out, out, oc2), lambda b, i, j, g: te.sum(
        h[b, i, j, f].astype("float32") * w2[g, 0, 0, f].astype("float32"), axis=f), name="y2")
    return te.create_prim_func([x, w1, w2, te.compute(y2.shape, lambda *i: y2(*i).astype("float16"))])


@pytest.mark.parametrize(("func", "shape"), [
    (_topi_chain("NHWC", 64, 14, 128, 64, 3, batch=2), (2, 14, 64, 128, 64, 3)),
    (_topi_chain("NHWC", 128, 28, 512, 128, 1), (1, 28, 128, 512, 128, 1)),
    (_hand_chain(64, 7, 64, 128, 5), (1, 7, 64, 64, 128, 5)),
    (_hand_chain(32, 9, 48, 16, 1, batch=3), (3, 9, 32, 48, 16, 1)),
])
def test_chains_written_otherwise_are_read_with_their_shape(func, shape):
    found = find_conv_chain(func)
    assert (found.batch, found.hw, found.ic, found.oc1, found.oc2, found.k1) == shape
    assert (found.activation, found.dtype) == ("relu", "float16")


def test_a_topi_chain_gets_the_builders_kernels():
    """What the family schedules depends only on the shape read: TOPI's C7 compiles to the
    kernels of the builder's C7."""
    ic, hw, oc1, oc2, k1, _ = CONV_CHAINS["C7"]
    topi_ranking = tvm_dsm.plan(_topi_chain("NHWC", ic, hw, oc1, oc2, k1))
    ranking = tvm_dsm.plan(conv_chain(*CONV_CHAINS["C7"]))
    assert topi_ranking.family.name == "conv_chain" and topi_ranking.best.config == ranking.best.config
    assert cuda_source(topi_ranking.schedule().mod) == cuda_source(ranking.schedule().mod)


@pytest.mark.parametrize(("func", "message"), [
    (_topi_chain("NCHW", 64, 14, 128, 64, 3), "channels on axis 1 \\(NCHW\\)"),
    (_topi_chain("NHWC", 64, 14, 128, 64, 3, stride=2), "stride 2 along axis 1"),
    (_topi_chain("NHWC", 64, 14, 128, 64, 3, padding=0), "pads X by 0 for a 3x3 kernel, 14x14 -> 12x12"),
    (_topi_chain("NHWC", 64, 14, 128, 64, 3, padding=(1, 1, 2, 2)), "not 1 on every side"),
    (_hand_chain(64, 7, 64, 128, 5, stride=2), "stride 2 along axis 1"),
    (_hand_chain(64, 7, 64, 128, 5, pad=1), "pads image by 1 for a 5x5 kernel"),
    (_hand_chain(64, 7, 64, 128, 5, inside=lambda a, b: te.all(a >= 2, b >= 2, a < 9, b < 8)),
     "keeps image where .*: not the image"),
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
    (``chains.fused_pick_bias``); a convolution chain ranks its GEMM chain the same way, plus the gather."""
    from tvm_dsm.families.conv_chain import conv_rank_key

    ranking = tvm_dsm.plan(conv_chain(*CONV_CHAINS["C4"]))
    keys = [conv_rank_key(p, ranking.hw) for p in ranking.plans]
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
