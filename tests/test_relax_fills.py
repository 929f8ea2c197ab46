"""Fills of infinity or NaN (a causal mask as ``torch.full((s, s), -inf).triu(1)``), which TVM
0.27 cannot legalize, as broadcasts: the same tensors, through any pipeline."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from conftest import LLVM, TARGET
from tvm_dsm.relax_fills import NonFiniteFills


def _filled(value: float, like: bool):
    """``R.full([4, 8], value)`` (``like``: ``R.full_like`` of the input), added to the input."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            fill = relax.const(value, "float32")
            filled = bb.emit(relax.op.full_like(x, fill) if like else relax.op.full(relax.ShapeExpr([4, 8]), fill))
            out = bb.emit_output(relax.op.add(x, filled))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("value", [float("-inf"), float("inf"), float("nan")])
@pytest.mark.parametrize("like", [False, True])
def test_tvm_cannot_legalize_a_non_finite_fill_and_as_a_broadcast_it_computes_it(value, like):
    with pytest.raises(TypeError, match="PrimType"):
        relax.transform.LegalizeOps()(_filled(value, like))
    rewritten = NonFiniteFills(_filled(value, like))
    assert "broadcast_to" in rewritten.script() and "R.full" not in rewritten.script()
    x = np.arange(32, dtype="float32").reshape(4, 8)
    got = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, x + np.float32(value))


def test_a_finite_fill_is_left_as_it_is():
    mod = _filled(-1e9, like=False)
    assert NonFiniteFills(mod).script() == mod.script()


def test_eager_attention_with_a_triu_mask_imports_and_compiles_on_both_pipelines():
    """Llama's eager attention mask, ``torch.full((s, s), -inf).triu(1)`` added to the scores:
    imported by tvm-dsm's importer it compiles on TVM's default pipeline and on tvm-dsm's,
    where the mask, computed from constants, is read as causal and the attention is one kernel
    (beside the copy of k's transpose)."""
    torch = pytest.importorskip("torch")

    from tvm_dsm.model_report import relax_report
    from tvm_dsm.relax_torch import from_exported_program

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            s = q.shape[-2]
            scores = q @ k.transpose(-1, -2) / 8.0 + torch.full((s, s), float("-inf")).triu(1).to(q.dtype)
            return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v

    q, k, v = (torch.randn(1, 4, 128, 64, dtype=torch.float16) for _ in range(3))
    mod = from_exported_program(torch.export.export(Attention(), (q, k, v)))
    assert tvm.compile(mod, target=TARGET) is not None
    assert tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm") is not None
    wheres = [row.where for row in relax_report(mod, TARGET).kernels]
    assert wheres.count("attention") == 1 and "dlight" not in wheres, wheres
