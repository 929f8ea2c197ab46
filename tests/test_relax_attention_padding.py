"""Attention at a head dim whose 16-bit rows are off 32-byte sectors (Stable Diffusion 1.5's 40)
runs on copies padded to the kernel's 64 columns (tvm_dsm.relax_attention_padding): the same
values, the kernel's own head dim; an aligned head dim, or too few queries, stays."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from conftest import LLVM
from tvm_dsm.relax_attention_padding import MIN_QUERIES, PadAttentionHeadDims
from tvm_dsm.relax_precision import AttentionScaleOnQuery


def _attention(queries: int, keys: int, dim: int, causal: bool = False) -> tvm.IRModule:
    """``R.nn.attention`` of q ``[1, queries, 2, dim]`` and k, v ``[1, keys, 2, dim]``."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(name, relax.TensorType((1, n, 2, dim), "float16"))
               for name, n in (("q", queries), ("k", keys), ("v", keys)))
    with bb.function("main", [q, k, v]):
        out = bb.emit(relax.op.nn.attention(q, k, v, causal_mask="TopLeft" if causal else None))
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod) -> list[str]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return found


def test_head_dim_40_runs_padded_to_64_with_the_same_values():
    causal = True
    mod = _attention(MIN_QUERIES, MIN_QUERIES, 40, causal)
    padded = PadAttentionHeadDims(mod)
    assert _ops(padded).count("relax.nn.pad") == 3 and "relax.call_tir" in _ops(padded)
    (attention,) = [c for c in padded.script().splitlines() if "R.nn.attention" in c]
    assert "(1, 1024, 2, 64)" in attention and "scale=T.float32(0.158113" in attention  # 1 / sqrt(40)
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, MIN_QUERIES, 2, 40)).astype("float16") for _ in range(3))
    q64, k64, v64 = (a.astype(np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))
    s = q64 @ k64.transpose(0, 1, 3, 2) / np.sqrt(40)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = ((p / p.sum(-1, keepdims=True)) @ v64).transpose(0, 2, 1, 3)
    errors = []
    for m in (mod, padded):  # TVM's llvm legalization computes in fp16: the padded copy's error is its own
        got = relax.VirtualMachine(tvm.compile(AttentionScaleOnQuery(m), target=LLVM), tvm.cpu())["main"](
            *(tvm.runtime.tensor(a) for a in (q, k, v))).numpy().astype(np.float64)
        assert got.shape == ref.shape
        errors.append(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    assert errors[1] <= 1.25 * errors[0], errors


@pytest.mark.parametrize("queries, keys, dim", [(MIN_QUERIES, MIN_QUERIES, 48), (MIN_QUERIES, MIN_QUERIES, 64),
                                                (MIN_QUERIES, 77, 40), (256, MIN_QUERIES, 40)])
def test_aligned_rows_and_few_queries_or_keys_stay_unpadded(queries, keys, dim):
    mod = _attention(queries, keys, dim)
    assert PadAttentionHeadDims(mod).same_as(mod) or "relax.nn.pad" not in _ops(PadAttentionHeadDims(mod))


@pytest.mark.gpu
def test_gpu_head_dim_40_through_the_pipeline_matches_float64():
    """The padded attention compiled by ``relax.get_pipeline("tvm_dsm")``: the attention kernel
    at 64 columns on the padded copies, within 2e-3 of float64."""
    from conftest import TARGET

    mod = _attention(MIN_QUERIES, MIN_QUERIES, 40, causal=True)
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm"), tvm.cuda(0))
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, MIN_QUERIES, 2, 40)).astype("float16") for _ in range(3))
    got = vm["main"](*(tvm.runtime.tensor(a, tvm.cuda(0)) for a in (q, k, v))).numpy().astype(np.float64)
    q64, k64, v64 = (a.astype(np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))
    s = np.where(np.tril(np.ones((MIN_QUERIES, MIN_QUERIES), bool)), q64 @ k64.transpose(0, 1, 3, 2) / np.sqrt(40),
                 -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = ((p / p.sum(-1, keepdims=True)) @ v64).transpose(0, 2, 1, 3)
    assert np.isfinite(got).all() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_the_copies_are_vectorized_kernels():
    """The pads and the output's columns are elementwise kernels (16-byte accesses), not
    dlight's one element a thread: each is a pass over an operand the attention reads."""
    from tvm_dsm.model_report import relax_report

    report = relax_report(_attention(MIN_QUERIES, MIN_QUERIES, 40))
    copies = [row for row in report.rows if "pad" in row.name or "attention_columns" in row.name]
    assert len(copies) >= 2 and {row.where for row in copies} == {"elementwise"}, report.format()


@pytest.mark.parametrize("queries", [64, MIN_QUERIES])
def test_a_value_dim_other_than_the_querys_reaches_the_kernel_unpadded(queries):
    """DeepSeek's MLA in prefill: q and k of 192 columns, v of 128. The kernel computes each at
    its own width: no copies, and the attention family takes the legalized function."""
    from tvm_dsm.model_report import relax_report

    bb = relax.BlockBuilder()
    q, k = (relax.Var(n, relax.TensorType((1, queries, 2, 192), "float16")) for n in "qk")
    v = relax.Var("v", relax.TensorType((1, queries, 2, 128), "float16"))
    with bb.function("main", [q, k, v]):
        bb.emit_func_output(bb.emit(relax.op.nn.attention(q, k, v, causal_mask="TopLeft")))
    mod = bb.get()
    assert "relax.nn.pad" not in _ops(PadAttentionHeadDims(mod))
    report = relax_report(mod)
    assert [row.where for row in report.rows] == ["attention"], report.format()


def test_a_sector_padded_head_dim_pads_only_its_own_operands():
    """q and k at 40 columns (off 32-byte sectors) with v at 64: only q and k get copies."""
    bb = relax.BlockBuilder()
    q, k = (relax.Var(n, relax.TensorType((1, MIN_QUERIES, 2, 40), "float16")) for n in "qk")
    v = relax.Var("v", relax.TensorType((1, MIN_QUERIES, 2, 64), "float16"))
    with bb.function("main", [q, k, v]):
        bb.emit_func_output(bb.emit(relax.op.nn.attention(q, k, v)))
    padded = PadAttentionHeadDims(bb.get())
    assert _ops(padded).count("relax.nn.pad") == 2 and "relax.call_tir" not in _ops(padded)
