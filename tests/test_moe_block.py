"""The mixture-of-experts block of tvm_dsm.workloads.moe: it computes what a gathered MoE
computes (float64 reference, on llvm), and tvm-dsm's Relax pipeline takes its GEMMs and its
router's softmax."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_dsm.model_report import relax_report
from tvm_dsm.relax_top_k import TopKAsRows
from tvm_dsm.workloads.moe import MOE_64X8, MOE_TINY, export_moe, random_moe_weights, reference_moe, routing_margins

#: Router logits closer than this (several times an fp16 logit's rounding near 1) are a tie.
_TIED_LOGITS = 5e-3


def test_the_dense_form_matches_a_gathered_moe_in_float64():
    config = MOE_TINY
    mod, names = export_moe(config)
    executable = tvm.compile(mod, tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    weights = random_moe_weights(config, names)
    x = _decided_tokens(config, weights, 7, np.random.default_rng())
    params = [tvm.runtime.tensor(weights[n].astype(config.dtype)) for n in names]
    out = vm["forward"](tvm.runtime.tensor(x), *params).numpy().astype(np.float64)
    ref = reference_moe(config, weights, x.astype(np.float32))
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 5e-3  # fp16 block: ~1.6e-3


def _decided_tokens(config, weights, tokens: int, rng) -> np.ndarray:
    """Fresh random tokens whose routing is decided: a token whose last chosen and first unchosen
    experts' logits lie within 16-bit rounding may route either way (one in 16 of the 64-expert
    router's tokens; the expert then differs entirely), so such rows are drawn again."""
    x = rng.standard_normal((tokens, config.hidden_size)).astype(config.dtype)
    while (tied := routing_margins(config, weights, x.astype(np.float32)) <= _TIED_LOGITS).any():
        x[tied] = rng.standard_normal((int(tied.sum()), config.hidden_size)).astype(config.dtype)
    return x


@pytest.mark.slow
def test_the_pipeline_takes_every_expert_gemm_and_the_router():
    report = relax_report(export_moe(MOE_64X8)[0])
    where = {row.name: row.where for row in report.rows}
    gemms = [name for name in where if "matmul" in name]
    # a row GEMV for one token, split-K GEMMs for the rest
    assert gemms and all(where[name] == "row_gemv/split_k_gemm" for name in gemms), report.format()
    assert where["softmax"] == "row_norm"
    assert where["top_k"] == "top_k_rows" and "topk" not in where  # not TVM's sort kernel


def test_the_router_top_k_rewritten_computes_what_relax_topk_does():
    """tvm_dsm.relax_top_k's function in place of R.topk, both compiled for llvm: the same
    block output, bit for bit, on tokens whose router rows include ties."""
    config = MOE_TINY
    mod, names = export_moe(config)
    weights = random_moe_weights(config, names)
    x = np.random.default_rng().standard_normal((9, config.hidden_size)).astype(config.dtype)
    x[3] = x[4] = 0  # all-zero rows: every expert ties, the lowest indices win
    params = [tvm.runtime.tensor(weights[n].astype(config.dtype)) for n in names]
    outs = []
    for module in (mod, TopKAsRows(mod)):
        executable = tvm.compile(module, tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
        outs.append(relax.VirtualMachine(executable, tvm.cpu())["forward"](tvm.runtime.tensor(x), *params).numpy())
    assert "top_k" in [gv.name_hint for gv in TopKAsRows(mod).functions]
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.gpu
@pytest.mark.parametrize("config", [MOE_TINY, MOE_64X8])
def test_gpu_the_block_through_tvm_dsms_pipeline_matches_a_gathered_moe(config):
    """The block compiled by relax_pipeline="tvm_dsm" (expert GEMMs, router softmax and top-k
    rows on tvm-dsm's kernels), one module called at token counts inside each of its ranges,
    against the float64 gathered MoE."""
    from conftest import TARGET

    mod, names = export_moe(config)
    vm = relax.VirtualMachine(tvm.compile(mod, tvm.target.Target(TARGET), relax_pipeline="tvm_dsm"), tvm.cuda(0))
    weights = random_moe_weights(config, names)
    params = [tvm.runtime.tensor(weights[n].astype(config.dtype), tvm.cuda(0)) for n in names]
    for tokens in (1, 13, 100):
        x = _decided_tokens(config, weights, tokens, np.random.default_rng())
        out = vm["forward"](tvm.runtime.tensor(x, tvm.cuda(0)), *params).numpy().astype(np.float64)
        ref = reference_moe(config, weights, x.astype(np.float32))
        assert np.isfinite(out).all(), tokens
        errors = np.linalg.norm(out - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
        assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 5e-3, (tokens, errors.round(4))
