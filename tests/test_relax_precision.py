"""Relax operators TVM 0.27 cannot legalize in 16 bits (tvm_dsm.relax_precision): bf16 layer
norms computed in fp32 (the row norm family takes them; on the GPU they match float64), and a
16-bit attention's explicit scale moved onto its query (the same values on llvm)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax.frontend import nn

from tvm_dsm.model_report import relax_report
from tvm_dsm.relax_precision import AttentionScaleOnQuery, NormsInFp32
from conftest import LLVM


class _Norm(nn.Module):
    def __init__(self, width: int):
        self.norm = nn.LayerNorm(width, eps=1e-5, dtype="bfloat16")

    def forward(self, x):
        return self.norm(x)


def _exported(width: int = 256, shape=("batch", "seq")):
    return _Norm(width).export_tvm({"forward": {"x": nn.spec.Tensor([*shape, width], "bfloat16")}})


def test_tvm_cannot_legalize_a_bf16_layer_norm_and_in_fp32_it_can():
    mod, _ = _exported()
    with pytest.raises(Exception, match="layer_norm: only support float32 and float16"):
        relax.transform.LegalizeOps()(mod)
    rewritten = NormsInFp32(mod)
    script = rewritten["forward"].script()
    assert 'R.nn.layer_norm' in script and script.count('R.astype') == 4  # x, weight, bias up; the norm down
    relax.transform.LegalizeOps()(rewritten)
    # rows of one variable: the casts inside the norm's own function
    script = NormsInFp32(_exported(shape=(4, "seq"))[0])["forward"].script()
    assert 'R.nn.layer_norm' not in script and 'R.astype' not in script and script.count("R.call_tir") == 1


@pytest.mark.parametrize("shape", [(4, 77), (1, "seq"), ("batch", "seq")])
def test_the_row_norm_family_takes_a_bf16_layer_norm(shape):
    """With its casts in its one kernel, except over rows of two variables (merged into one
    first, the casts kernels of their own)."""
    report = relax_report(_exported(shape=shape)[0])
    assert "row_norm" in [row.where for row in report.rows], report.format()
    if shape != ("batch", "seq"):
        assert [row.where for row in report.rows] == ["row_norm"], report.format()


def _layer_norm_reference(x, weight, bias) -> np.ndarray:
    x64 = x.astype(np.float64)
    return ((x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
            * weight.astype(np.float64) + bias.astype(np.float64))


def test_a_bf16_layer_norm_with_its_casts_inside_matches_float64_on_llvm():
    import ml_dtypes

    mod = NormsInFp32(_exported(64, (2, 5))[0])
    vm = relax.VirtualMachine(tvm.compile(mod, target=LLVM), tvm.cpu())
    rng = np.random.default_rng()
    x, weight, bias = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in ((2, 5, 64), (64,), (64,)))
    out = vm["forward"](*map(tvm.runtime.tensor, (x, weight, bias))).numpy().astype(np.float64)
    ref = _layer_norm_reference(x, weight, bias)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2 ** -8


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [("batch", "seq"), (3, 77)])
def test_gpu_a_bf16_layer_norm_matches_float64(shape):
    import ml_dtypes

    mod, spec = _exported(1024, shape)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    vm = relax.VirtualMachine(tvm.compile(mod, target=target, relax_pipeline="tvm_dsm"), tvm.cuda())
    rng = np.random.default_rng(7)
    weight, bias = (rng.standard_normal(1024).astype(ml_dtypes.bfloat16) for _ in range(2))
    for b, s in ((1, 1), (3, 77)) if shape[0] == "batch" else (shape,):
        x = rng.standard_normal((b, s, 1024)).astype(ml_dtypes.bfloat16)
        out = vm["forward"](*(tvm.runtime.tensor(a, tvm.cuda()) for a in (x, weight, bias))).numpy().astype(np.float64)
        ref = _layer_norm_reference(x, weight, bias)
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2 ** -8, (b, s)


class _ScaledAttention(nn.Module):
    """``scaled_dot_product_attention`` with an explicit scale (q, k, v ``[batch, seq, heads,
    dim]``), then an output projection of its heads."""

    def __init__(self, scale: float, causal: bool):
        self.scale, self.causal = scale, causal
        self.out = nn.Linear(16, 16, bias=False, dtype="float16")

    def forward(self, q, k, v):
        a = nn.op.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale)
        return self.out(nn.op.reshape(a, [1, 16, 16]))


def test_an_explicit_attention_scale_on_16_bit_tensors_builds_and_keeps_the_values():
    scale, causal = 0.3, True  # a factor off a power of two, and the mask
    spec = {name: nn.spec.Tensor([1, 16, 2, 8], "float16") for name in "qkv"}
    mod, _ = _ScaledAttention(scale, causal).export_tvm({"forward": spec})
    gpu = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    with pytest.raises(Exception, match="same datatype|float32"):  # TVM's own pipeline
        tvm.compile(mod, target=gpu)
    tvm.compile(mod, target=gpu, relax_pipeline="tvm_dsm")
    vm = relax.VirtualMachine(tvm.compile(AttentionScaleOnQuery(mod), target=LLVM), tvm.cpu())
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 16, 2, 8)).astype("float16") for _ in range(3))
    w = (rng.standard_normal((16, 16)) / 4).astype("float16")
    got = vm["forward"](*(tvm.runtime.tensor(a) for a in (q, k, v, w))).numpy().astype(np.float64)
    q64, k64, v64 = (a.astype(np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))
    s = q64 @ k64.transpose(0, 1, 3, 2) * scale
    if causal:
        s = np.where(np.tril(np.ones((16, 16), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = ((p / p.sum(-1, keepdims=True)) @ v64).transpose(0, 2, 1, 3).reshape(1, 16, 16) @ w.astype(np.float64).T
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 5e-3  # fp16 arithmetic on llvm


def test_an_explicit_scale_with_a_bias_moves_onto_the_query_too():
    """``R.nn.attention`` with a bias is ``relax.nn.attention_bias``: its 16-bit explicit scale
    fails to build as well, and moves onto the query the same way."""
    from tvm.script import relax as R

    @R.function
    def main(q: R.Tensor((1, 16, 2, 8), "float16"), k: R.Tensor((1, 16, 2, 8), "float16"),
             v: R.Tensor((1, 16, 2, 8), "float16"), bias: R.Tensor((1, 1, 16, 16), "float16")):
        out = R.nn.attention(q, k, v, bias, scale=0.3)
        return out

    mod = tvm.IRModule({"main": main})
    rewritten = AttentionScaleOnQuery(mod)
    assert "scale=None" in rewritten.script().split("R.nn.attention_bias")[1].split("\n")[0]
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 16, 2, 8)).astype("float16") for _ in range(3))
    bias = rng.standard_normal((1, 1, 16, 16)).astype("float16")
    got = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())["main"](
        *(tvm.runtime.tensor(a) for a in (q, k, v, bias))).numpy().astype(np.float64)
    q64, k64, v64 = (a.astype(np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))
    s = q64 @ k64.transpose(0, 1, 3, 2) * 0.3 + bias.astype(np.float64)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = ((p / p.sum(-1, keepdims=True)) @ v64).transpose(0, 2, 1, 3)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 5e-3


def _linear(compute_dtype: str, scaled: bool = False):
    """A fp16 model's linear layer computing in ``compute_dtype``: in fp32 as TVM's torch
    importer writes it (input and weight widened, the product's fp32 result kept); ``scaled``:
    the widened input scaled in fp32 before the product (as its attention's query is)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((128, 512), "float16"))
    w = relax.Var("w", relax.TensorType((512, 1024), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            a, b = (bb.emit(relax.op.astype(t, compute_dtype)) for t in (x, w))
            if scaled:
                a = bb.emit(relax.op.multiply(a, relax.const(0.125, compute_dtype)))
            out = bb.emit_output(relax.op.matmul(a, b, out_dtype="float32"))
        bb.emit_func_output(out)
    return bb.get()


def _widened_warnings(mod, caplog) -> list[str]:
    from conftest import TARGET

    caplog.clear()
    with caplog.at_level("WARNING", logger="tvm_dsm.relax"):
        relax_report(mod, TARGET)
    return [r.getMessage() for r in caplog.records if "compute in fp32" in r.getMessage()]


def test_a_16_bit_model_computing_its_products_in_fp32_is_named_in_a_warning(caplog):
    """A product TVM's torch importer widens to fp32 and computes on (the operand scaled in fp32
    first) runs on CUDA cores: the pipeline says so and names the importer that keeps torch's
    types. A product of two widened 16-bit tensors, which the pipeline computes from the 16-bit
    ones, and a product in 16 bits draw no warning."""
    (warning,) = _widened_warnings(_linear("float32", scaled=True), caplog)
    assert warning.startswith("main: 1 matrix products") and "tvm_dsm.relax_torch.from_exported_program" in warning
    assert not _widened_warnings(_linear("float32"), caplog)
    assert not _widened_warnings(_linear("float16"), caplog)
