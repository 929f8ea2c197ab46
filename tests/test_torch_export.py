"""A Llama decoder layer written as a torch user writes it (nn.Linear, SDPA, an RMSNorm
module), exported with ``torch.export`` and imported with ``from_exported_program``: the
"tvm_dsm" pipeline's report names a family for its projections and for both RMSNorms (put back
as ``R.nn.rms_norm`` by tvm_dsm.relax_patterns) and no kernel crashes, and that rewrite computes
what torch does (where torch is installed; the GPU machine has it)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")


class RMSNorm(torch.nn.Module):
    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class DecoderLayer(torch.nn.Module):
    def __init__(self, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.input_norm, self.post_norm = RMSNorm(hidden), RMSNorm(hidden)
        linear = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.q, self.k, self.v = linear(hidden, heads * head_dim), linear(hidden, kv_heads * head_dim), \
            linear(hidden, kv_heads * head_dim)
        self.o = linear(heads * head_dim, hidden)
        self.gate, self.up, self.down = linear(hidden, intermediate), linear(hidden, intermediate), \
            linear(intermediate, hidden)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.input_norm(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        group = self.heads // self.kv_heads
        a = torch.nn.functional.scaled_dot_product_attention(
            q, k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        h = self.post_norm(x)
        return x + self.down(torch.nn.functional.silu(self.gate(h)) * self.up(h))


def test_a_torch_exported_decoder_layer_gets_tvm_dsm_kernels_and_none_crashes():
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program
    from tvm_dsm.model_report import relax_report

    layer = DecoderLayer().half().eval()
    program = torch.export.export(layer, (torch.randn(1, 128, 256, dtype=torch.float16),))
    mod, _ = detach_params(from_exported_program(program, keep_params_as_input=True))
    report = relax_report(mod)
    assert not [row.name for row in report.rows if "crashed" in row.reason], report.format()
    assert report.counts().get("split_k_gemm", 0) >= 3  # the projections' distinct shapes
    norms = [row.name for row in report.rows if row.where == "row_norm"]
    assert len(norms) == 2 and all("rms_norm" in name for name in norms), report.format()


def _import(layer, x):
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

    return detach_params(from_exported_program(torch.export.export(layer, (x,)), keep_params_as_input=True))


def _run(mod, x, params):
    import tvm
    from tvm import relax

    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()), *params["main"])
    return out[0].numpy()


def test_the_rms_norm_rewrite_computes_what_torch_does_in_fp32():
    """The layer in fp32 on CPU, before and after tvm_dsm.relax_patterns, against torch."""
    import tvm
    from tvm import relax
    from tvm_dsm.relax_patterns import RewriteToRelaxOps

    torch.manual_seed(0)
    layer = DecoderLayer(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128).float().eval()
    with torch.no_grad():
        for norm in (layer.input_norm, layer.post_norm):
            norm.weight.normal_()
    x = torch.randn(2, 8, 64)
    mod, params = _import(layer, x)
    rewritten = RewriteToRelaxOps(mod)
    calls = []
    relax.analysis.post_order_visit(rewritten["main"], lambda e: calls.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    assert calls.count("relax.nn.rms_norm") == 2 and "relax.power" not in calls, rewritten.script()
    with torch.no_grad():
        want = layer(x).numpy()
    for got in (_run(mod, x, params), _run(rewritten, x, params)):
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
