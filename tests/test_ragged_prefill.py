"""tvm-dsm's prefill attention over nn.llm's ragged sequences (tvm_dsm.kernels.ragged_prefill):
which functions it takes, the kernel it writes, and on the GPU its output and log-sum-exp against
float64 and against nn.llm's own kernel on the same packed batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm.relax.frontend.nn.llm._prefill_kernels import _attention_prefill_ragged

from conftest import TARGET, cuda_source, host_launch
from tvm_dsm.errors import ClusterError
from tvm_dsm.kernels.attention import RaggedSequences
from tvm_dsm.kernels.ragged_prefill import PARAMS, find_ragged_prefill, ragged_prefill_kernel


def nn_llm_prefill(qo_heads: int, kv_heads: int, head_dim: int, dtype: str = "float16"):
    return _attention_prefill_ragged(kv_heads, qo_heads, head_dim, head_dim, dtype, {}, tvm.target.Target(TARGET))


def test_it_takes_nn_llm_ragged_prefill_and_reads_its_sizes():
    assert find_ragged_prefill(nn_llm_prefill(32, 8, 64)) == RaggedSequences(32, 8, 64, "float16")
    assert find_ragged_prefill(nn_llm_prefill(28, 4, 128, "bfloat16")) == RaggedSequences(28, 4, 128, "bfloat16")


@pytest.mark.parametrize("make, limit", [
    (lambda: nn_llm_prefill(8, 8, 320), "up to 256"),
    (lambda: nn_llm_prefill(8, 8, 64, "float32"), "float16 or bfloat16"),
    (lambda: nn_llm_prefill(8, 8, 64).with_attr("global_symbol", "other"), "not nn.llm's ragged prefill"),
])
def test_it_refuses_with_the_limit_named(make, limit):
    with pytest.raises(ClusterError, match=limit):
        find_ragged_prefill(make())


@pytest.mark.parametrize("qo_heads, kv_heads, head_dim, dtype", [
    (32, 8, 64, "float16"), (28, 4, 128, "bfloat16"), (8, 8, 96, "float16")])
def test_the_kernel_keeps_nn_llms_parameters_and_assembles_without_spills(qo_heads, kv_heads, head_dim, dtype,
                                                                          ptxas_report):
    original = nn_llm_prefill(qo_heads, kv_heads, head_dim, dtype)
    ours = ragged_prefill_kernel(original)
    assert tuple(p.name for p in ours.params) == PARAMS
    for theirs, mine in zip(original.params, ours.params, strict=True):
        assert str(theirs.ty) == str(mine.ty) or [str(x) for x in theirs.ty.shape] == [str(x) for x in mine.ty.shape]
    assert ours.attrs["global_symbol"] == "batch_prefill_ragged_kv" and ours.attrs["tirx.is_scheduled"]
    mod = tvm.IRModule({"main": ours})
    (launch,) = host_launch(mod, "tvm_dsm")
    assert "wgmma" in cuda_source(mod, "tvm_dsm")
    report = ptxas_report(cuda_source(mod, "tvm_dsm"), f"ragged_{head_dim}_{dtype}")
    assert "0 bytes spill stores" in report, report


def _packed(rng, q_lens, kv_lens, heads, kv_heads, dim, np_dtype):
    """Sequences packed end to end: q, k, v and their index pointers."""
    q = rng.standard_normal((sum(q_lens), heads, dim)).astype(np_dtype)
    k = rng.standard_normal((sum(kv_lens), kv_heads, dim)).astype(np_dtype)
    v = rng.standard_normal((sum(kv_lens), kv_heads, dim)).astype(np_dtype)
    return q, k, v, np.cumsum([0, *q_lens]).astype(np.int32), np.cumsum([0, *kv_lens]).astype(np.int32)


def _reference(q, k, v, q_indptr, kv_indptr, group, sm_scale, causal):
    """float64 attention per sequence and query head, causal aligning the last query with the
    last key; the log-sum-exp in base 2."""
    out, lse = np.zeros(q.shape), np.zeros(q.shape[:2])
    for b in range(len(q_indptr) - 1):
        qs, ks = slice(q_indptr[b], q_indptr[b + 1]), slice(kv_indptr[b], kv_indptr[b + 1])
        n_q, n_kv = qs.stop - qs.start, ks.stop - ks.start
        for h in range(q.shape[1]):
            s = q[qs, h].astype(np.float64) @ k[ks, h // group].astype(np.float64).T * sm_scale
            if causal:
                s = np.where(np.arange(n_kv)[None, :] <= np.arange(n_q)[:, None] + n_kv - n_q, s, -np.inf)
            w = np.exp(s - s.max(1, keepdims=True))
            out[qs, h] = w @ v[ks, h // group].astype(np.float64) / w.sum(1, keepdims=True)
            lse[qs, h] = (s.max(1) + np.log(w.sum(1))) * math.log2(math.e)
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("qo_heads, kv_heads, head_dim, dtype, causal", [
    (32, 8, 64, "float16", 1), (32, 8, 64, "float16", 0), (28, 4, 128, "bfloat16", 1), (8, 8, 96, "float16", 1),
])
def test_it_matches_float64_and_nn_llm_on_the_gpu(qo_heads, kv_heads, head_dim, dtype, causal):
    import ml_dtypes  # noqa: F401  (numpy's bfloat16)

    rng = np.random.default_rng()
    np_dtype = np.dtype(dtype if dtype != "bfloat16" else ml_dtypes.bfloat16)
    q_lens = [1, 64, 65, 531, 100, 7]
    kv_lens = [1, 64, 65, 531, 160, 7]  # one sequence with keys before its queries (a prefix)
    q, k, v, q_indptr, kv_indptr = _packed(rng, q_lens, kv_lens, qo_heads, kv_heads, head_dim, np_dtype)
    sm_scale = head_dim ** -0.5
    ref_out, ref_lse = _reference(q, k, v, q_indptr, kv_indptr, qo_heads // kv_heads, sm_scale, causal)
    dev = tvm.cuda(0)
    original = nn_llm_prefill(qo_heads, kv_heads, head_dim, dtype)
    results = {}
    for name, func, pipeline in (("ours", ragged_prefill_kernel(original), "tvm_dsm"), ("nn_llm", original, "default")):
        lib = tvm.compile(tvm.IRModule({"main": func}), target=TARGET, tir_pipeline=pipeline)
        out = tvm.runtime.tensor(np.full(q.shape, np.nan, np_dtype), dev)
        lse = tvm.runtime.tensor(np.full(q.shape[:2], np.nan, np.float32), dev)
        positions = tvm.runtime.tensor(np.zeros(len(q), np.int32), dev)
        offsets = tvm.runtime.tensor(np.zeros(len(q_lens), np.int32), dev)
        args = [tvm.runtime.tensor(a, dev) for a in (q, q_indptr, k, v, kv_indptr)]
        lib(*args, positions, offsets, out, lse, causal, 0, 1.0, 1e4, sm_scale)
        results[name] = (out.numpy().astype(np.float64), lse.numpy().astype(np.float64))
    out, lse = results["ours"]
    assert np.linalg.norm(out - ref_out) / np.linalg.norm(ref_out) < 2e-3
    assert np.abs(lse - ref_lse).max() < 1e-3
    theirs, their_lse = results["nn_llm"]
    assert np.linalg.norm(out - theirs) / np.linalg.norm(theirs) < 2e-3
    assert np.abs(lse - their_lse).max() < 1e-3


@pytest.mark.gpu
def test_in_kernel_rope_stops_before_launch_with_the_reason():
    dev = tvm.cuda(0)
    lib = tvm.compile(tvm.IRModule({"main": ragged_prefill_kernel(nn_llm_prefill(8, 2, 64))}),
                      target=TARGET, tir_pipeline="tvm_dsm")
    q, k, v, q_indptr, kv_indptr = _packed(np.random.default_rng(), [5], [5], 8, 2, 64, np.float16)
    args = [tvm.runtime.tensor(a, dev) for a in (q, q_indptr, k, v, kv_indptr)]
    positions, offsets = (tvm.runtime.tensor(np.zeros(n, np.int32), dev) for n in (5, 1))
    out = tvm.runtime.tensor(np.zeros(q.shape, np.float16), dev)
    lse = tvm.runtime.tensor(np.zeros(q.shape[:2], np.float32), dev)
    with pytest.raises(Exception, match="RoPE"):
        lib(*args, positions, offsets, out, lse, 1, 1, 1.0, 1e4, 0.125)
