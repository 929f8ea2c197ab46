"""bf16 layer norms, which TVM 0.27 cannot legalize, computed in fp32 (tvm_dsm.relax_precision):
the rewritten module legalizes and the row norm family takes the norm; on the GPU it matches
float64."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from tvm_dsm.model_report import relax_report
from tvm_dsm.relax_precision import NormsInFp32


class _Norm(nn.Module):
    def __init__(self, width: int):
        self.norm = nn.LayerNorm(width, eps=1e-5, dtype="bfloat16")

    def forward(self, x):
        return self.norm(x)


def _exported(width: int = 256):
    return _Norm(width).export_tvm({"forward": {"x": nn.spec.Tensor(["batch", "seq", width], "bfloat16")}})


def test_tvm_cannot_legalize_a_bf16_layer_norm_and_in_fp32_it_can():
    mod, _ = _exported()
    with pytest.raises(Exception, match="layer_norm: only support float32 and float16"):
        relax.transform.LegalizeOps()(mod)
    rewritten = NormsInFp32(mod)
    script = rewritten["forward"].script()
    assert 'R.nn.layer_norm' in script and script.count('R.astype') == 4  # x, weight, bias up; the norm down
    relax.transform.LegalizeOps()(rewritten)


def test_the_row_norm_family_takes_a_bf16_layer_norm():
    report = relax_report(_exported()[0])
    norms = [row for row in report.rows if "layer_norm" in row.name]
    assert [row.where for row in norms] == ["row_norm"], report.format()


@pytest.mark.gpu
def test_gpu_a_bf16_layer_norm_matches_float64():
    import ml_dtypes

    mod, spec = _exported(1024)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline="tvm_dsm"), tvm.cuda())
    rng = np.random.default_rng(7)
    weight, bias = (rng.standard_normal(1024).astype(ml_dtypes.bfloat16) for _ in range(2))
    for b, s in ((1, 1), (3, 77)):
        x = rng.standard_normal((b, s, 1024)).astype(ml_dtypes.bfloat16)
        out = vm["forward"](*(tvm.runtime.tensor(a, tvm.cuda()) for a in (x, weight, bias))).numpy().astype(np.float64)
        x64 = x.astype(np.float64)
        ref = ((x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
               * weight.astype(np.float64) + bias.astype(np.float64))
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2 ** -8, (b, s)
