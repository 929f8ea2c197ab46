"""Patch-embedding convolutions (windows that tile the image, a vision transformer's
``nn.Conv2D(c, d, p, stride=p)``) as GEMMs (tvm_dsm.relax_patches): the same values on llvm,
the split-K GEMM family takes the product, and other convolutions are left alone."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from tvm_dsm.model_report import relax_report
from tvm_dsm.relax_patches import PatchesAsMatrices
from conftest import LLVM


def _conv(channels: int, dim: int, kernel: int, stride: int, padding: int = 0, groups: int = 1,
          image: int = 32, batch: int = 2):
    class Embed(nn.Module):
        def __init__(self):
            self.conv = nn.Conv2D(channels, dim, kernel, stride=stride, padding=padding, groups=groups, bias=True,
                                  dtype="float16")

        def forward(self, x):
            return self.conv(x)

    return Embed().export_tvm({"forward": {"x": nn.spec.Tensor([batch, channels, image, image], "float16")}})


def _patches(x, w, b, p):
    """float64 patch embedding: out[n, o, i, j] = sum over the (i, j) patch of x times w[o], + b[o]."""
    n, c, h, wd = x.shape
    windows = x.reshape(n, c, h // p, p, wd // p, p).transpose(0, 2, 4, 1, 3, 5).reshape(n, h // p, wd // p, -1)
    return (windows @ w.reshape(w.shape[0], -1).T + b).transpose(0, 3, 1, 2)


def test_a_patch_embedding_is_a_gemm_with_the_same_values_on_llvm():
    mod, spec = _conv(3, 64, 8, 8)
    rewritten = PatchesAsMatrices(mod)
    script = rewritten["forward"].script()
    assert "R.nn.conv2d" not in script and "R.matmul" in script
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 32, 32)).astype("float16")
    weights = [(rng.standard_normal([int(d) for d in p.shape]) / 8).astype("float16") for _, p in spec]
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    got = vm["forward"](*(tvm.runtime.tensor(a) for a in (x, *weights))).numpy().astype(np.float64)
    ref = _patches(*(a.astype(np.float64) for a in (x, *weights)), 8)
    assert got.shape == ref.shape and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.parametrize("form", [dict(kernel=8, stride=4), dict(kernel=8, stride=8, padding=1),
                                  dict(kernel=8, stride=8, groups=3), dict(kernel=6, stride=6)])
def test_overlapping_padded_grouped_or_ragged_convolutions_are_left_alone(form):
    """Windows that overlap, padding, groups, or an image of 32 pixels in patches of 6."""
    mod, _ = _conv(3, 63 if form.get("groups") else 64, **form)  # groups of 3 divide 63
    assert "R.nn.conv2d" in PatchesAsMatrices(mod)["forward"].script()


def test_the_split_k_gemm_takes_the_patch_embedding():
    report = relax_report(_conv(3, 384, 16, 16, image=224, batch=8)[0])
    assert not [row for row in report.rows if "conv2d" in row.name], report.format()
    assert [row.where for row in report.rows if "matmul" in row.name] == ["split_k_gemm"], report.format()


@pytest.mark.gpu
def test_gpu_a_patch_embedding_matches_float64():
    mod, spec = _conv(3, 384, 16, 16, image=224, batch=4)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline="tvm_dsm"), tvm.cuda())
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3, 224, 224)).astype("float16")
    weights = [(rng.standard_normal([int(d) for d in p.shape]) / 16).astype("float16") for _, p in spec]
    got = vm["forward"](*(tvm.runtime.tensor(a, tvm.cuda()) for a in (x, *weights))).numpy().astype(np.float64)
    ref = _patches(*(a.astype(np.float64) for a in (x, *weights)), 16)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_a_patch_embedding_with_an_fp32_result_is_a_gemm_too():
    """TVM's torch importer gives every 16-bit convolution an fp32 result: the rewrite takes it
    (no cast after the product)."""
    from tvm.script import relax as R

    @R.function
    def main(x: R.Tensor((2, 3, 32, 32), "float16"), w: R.Tensor((64, 3, 8, 8), "float16")):
        out = R.nn.conv2d(x, w, strides=8, out_dtype="float32")
        return out

    rewritten = PatchesAsMatrices(tvm.IRModule({"main": main}))
    assert "R.nn.conv2d" not in rewritten.script()
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 32, 32)).astype("float16"), (rng.standard_normal((64, 3, 8, 8)) / 8).astype("float16")
    got = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())["main"](
        tvm.runtime.tensor(x), tvm.runtime.tensor(w)).numpy()
    ref = _patches(x.astype(np.float64), w.astype(np.float64), np.zeros(64), 8)
    assert got.dtype == np.float32 and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
