"""A Llama decoder layer written as a torch user writes it (nn.Linear, SDPA, an RMSNorm
module), exported with ``torch.export`` and imported with ``from_exported_program``: the
"tvm_dsm" pipeline's report names a family for its projections and for both RMSNorms (put back
as ``R.nn.rms_norm`` by tvm_dsm.relax_patterns) and no kernel crashes, and that rewrite computes
what torch does (where torch is installed; the GPU machine has it)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tvm_dsm.workloads.torch_layers import DecoderLayer, exported_decoder_layer  # noqa: E402


def test_a_torch_exported_decoder_layer_gets_tvm_dsm_kernels_and_none_crashes():
    from tvm_dsm.model_report import relax_report

    layer = DecoderLayer().half().eval()
    mod, _ = exported_decoder_layer(layer, torch.randn(1, 128, 256, dtype=torch.float16))
    report = relax_report(mod)
    assert not [row.name for row in report.rows if "crashed" in row.reason], report.format()
    assert report.counts().get("split_k_gemm", 0) >= 3  # the projections' distinct shapes
    norms = [row.name for row in report.rows if row.where == "row_norm"]
    assert len(norms) == 2 and all("rms_norm" in name for name in norms), report.format()


def _run(mod, x, params):
    import tvm
    from tvm import relax

    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()), *params)
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
    mod, params = exported_decoder_layer(layer, x)
    rewritten = RewriteToRelaxOps(mod)
    calls = []
    relax.analysis.post_order_visit(rewritten["main"], lambda e: calls.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    assert calls.count("relax.nn.rms_norm") == 2 and "relax.power" not in calls, rewritten.script()
    with torch.no_grad():
        want = layer(x).numpy()
    for got in (_run(mod, x, params), _run(rewritten, x, params)):
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
