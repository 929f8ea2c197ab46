"""Numerics at the edges (docs/guide.md, "Numerics at the edges"): rows that are all -inf, hold
a NaN or +inf, huge magnitudes, and an fp16 intermediate that overflows.

tvm-dsm's kernels compute the function as written in TE, with TVM's definitions: a max
reduction starts from the lowest finite float (``te.min_value``) and ``max`` ignores a NaN
operand (CUDA's fmaxf, LLVM's maxnum). The CPU tests pin that behaviour on the llvm build of the
unfused function and check the fused cascade (RedFuser's one-pass loop) against it; the GPU tests
check tvm-dsm's kernels against the same llvm build and what users compare with against PyTorch
(softmax, ``softmax(x) @ v``, SDPA, an RMSNorm written in torch, ``nn.Linear`` chains).
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm

import tvm_dsm
from tvm_dsm.transform import fuse_cascaded_reductions
from tvm_dsm.workloads.cascades import attention, rmsnorm_gemv, softmax_stats, softmax_v
from tvm_dsm.workloads.chains import gemm_chain
from conftest import LLVM

LOWEST = float(np.finfo(np.float32).min)


def edge_rows(rows: int, k: int, seed: int = 0, masked_prefix: bool = True) -> np.ndarray:
    """``rows`` x ``k`` fp32 logits, normal but for rows 0-5: all -inf; one NaN; one +inf; all
    scaled by 1e37 (differences overflow fp32); one finite among -inf, the first three -inf
    (unless not ``masked_prefix``: then row 4 is normal); all 3e38."""
    x = np.random.default_rng(seed).standard_normal((rows, k)).astype("float32")
    x[0] = -np.inf
    x[1, 5] = np.nan
    x[2, 7] = np.inf
    x[3] *= np.float32(1e37)
    if masked_prefix:
        x[4] = -np.inf
        x[4, 3] = 1.0
    x[5] = 3e38
    return x


def run_llvm(func, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """``func`` built for llvm, called on ``inputs``; its outputs (the other parameters)."""
    ex = tvm.compile(tvm.IRModule({"main": func}), target=LLVM)
    outputs = [tvm.runtime.tensor(np.full([int(d) for d in p.ty.shape], np.nan, str(p.ty.dtype)))
               for p in func.params[len(inputs):]]
    ex(*[tvm.runtime.tensor(a) for a in inputs], *outputs)
    return [o.numpy() for o in outputs]


def assert_same_specials(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 0.0) -> None:
    """NaN, +inf and -inf at the same places, the finite values close."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    for special in (np.isnan, np.isposinf, np.isneginf):
        np.testing.assert_array_equal(special(got), special(want), err_msg=special.__name__)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=atol)


# -- CPU: the defined behaviour, and the fused cascade equal to the unfused function --------------

def test_softmax_statistics_at_the_edges_on_llvm():
    x = edge_rows(8, 64)
    m, l = run_llvm(softmax_stats(8, 64), [x])
    assert (m[0], l[0]) == (LOWEST, 0.0)  # all -inf: the max's initial value, an empty sum
    assert m[1] == np.nanmax(x[1]) and np.isnan(l[1])  # the max skips NaN, exp(NaN) does not
    assert m[2] == np.inf and np.isnan(l[2])  # inf - inf
    assert np.isfinite(m[3]) and l[3] >= 1  # exp of overflowing differences: 0
    assert (m[4], l[4]) == (1.0, 1.0)
    assert (m[5], l[5]) == (np.float32(3e38), 64.0)
    normalized = np.exp(x - m[:, None]) / l[:, None]  # softmax from the statistics: PyTorch's
    assert np.isnan(normalized[:3]).all() and np.isfinite(normalized[3:]).all()


def _values(k: int, j: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((k, j)).astype("float32")


@pytest.mark.parametrize("make, inputs", [
    (lambda: softmax_stats(8, 64), lambda: [edge_rows(8, 64)]),
    (lambda: softmax_v(8, 64, 16), lambda: [edge_rows(8, 64, masked_prefix=False), _values(64, 16)]),
    pytest.param(lambda: softmax_v(8, 64, 16), lambda: [edge_rows(8, 64), _values(64, 16)],
                 id="softmax_v-masked-prefix"),
    (lambda: rmsnorm_gemv(6, 64), lambda: [_rms_rows(6, 64), np.random.default_rng(1).standard_normal(64).astype("float32")]),
])
def test_fused_cascade_equals_unfused_at_the_edges(make, inputs):
    """RedFuser's one-pass loop keeps the unfused function's NaN, inf and -inf, element by
    element (its rescaling leaves a state at its identity alone: no -inf - -inf)."""
    func, args = make(), inputs()
    fused, reports = fuse_cascaded_reductions(func)
    assert any(r.fusible for r in reports)
    for got, want in zip(run_llvm(fused, args), run_llvm(func, args)):
        assert_same_specials(got, want, rtol=1e-4, atol=1e-6)


def _rms_rows(rows: int, k: int) -> np.ndarray:
    """RMSNorm inputs: row 0 zeros (0/0), row 1 1e20 (the sum of squares overflows to inf),
    row 2 a NaN, row 3 an inf, the rest normal."""
    x = np.random.default_rng(2).standard_normal((rows, k)).astype("float32")
    x[0] = 0
    x[1] = 1e20
    x[2, 3] = np.nan
    x[3, 4] = np.inf
    return x


def test_rmsnorm_at_the_edges_on_llvm():
    x, w = _rms_rows(6, 64), np.random.default_rng(1).standard_normal(64).astype("float32")
    _, y = run_llvm(rmsnorm_gemv(6, 64), [x, w])
    assert np.isnan(y[0]) and y[1] == 0 and np.isnan(y[2]) and np.isnan(y[3])
    assert np.isfinite(y[4:]).all()


def test_fp16_chain_overflow_on_llvm():
    """An FFN whose fp16 intermediate overflows: the rows that overflow give inf or NaN (inf
    products of both signs), the others are untouched, as in an unfused fp16 model."""
    m, n, k, l = 8, 64, 32, 16
    a, w1, w2 = _chain_inputs(m, n, k, l)
    (out,) = run_llvm(gemm_chain(m, n, k, l, "relu"), [a, w1, w2])
    assert_same_specials(out, _chain_reference(a, w1, w2), rtol=2e-2, atol=2e-2)
    assert not np.isfinite(out[:2]).any() and np.isfinite(out[2:]).all()


def _chain_inputs(m: int, n: int, k: int, l: int, seed: int = 3):
    """fp16 A (rows 0 and 1 at +-60000: their hidden values reach ~1e6, past fp16's 65504),
    W1 and W2 scaled like nn.Linear's."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype("float16")
    a[:2] = np.where(rng.random((2, k)) < 0.5, -60000, 60000)
    w1 = (rng.standard_normal((n, k)) / np.sqrt(k)).astype("float16")
    w2 = (rng.standard_normal((l, n)) / np.sqrt(n)).astype("float16")
    return a, w1, w2


def _chain_reference(a, w1, w2) -> np.ndarray:
    """relu(A W1^T) rounded to fp16, times W2^T, in float64, rounded to fp16: an unfused model."""
    with np.errstate(over="ignore", invalid="ignore"):
        h = np.maximum(a.astype(np.float64) @ w1.astype(np.float64).T, 0).astype("float16")
        return (h.astype(np.float64) @ w2.astype(np.float64).T).astype("float16")


# -- GPU: tvm-dsm's kernels against the llvm build and PyTorch -----------------------------------

def _gpu_call(func, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """tvm_dsm.build(func) on the GPU, called on ``inputs``, its outputs poisoned first."""
    module = tvm_dsm.build(func)
    dev = tvm.cuda(0)
    outputs = [tvm.runtime.tensor(np.full([int(d) for d in p.ty.shape], np.nan, str(p.ty.dtype)), dev)
               for p in func.params[len(inputs):]]
    module(*[tvm.runtime.tensor(a, dev) for a in inputs], *outputs)
    dev.sync()
    return [o.numpy() for o in outputs]


@pytest.mark.gpu
def test_gpu_softmax_statistics_at_the_edges():
    """The cluster-split softmax statistics equal the llvm build (max of the finite values,
    exp-sum NaN for a NaN or +inf, (lowest, 0) for an all -inf row); the softmax made from them
    is torch.softmax's, NaN rows included."""
    torch = pytest.importorskip("torch")
    rows, k = 64, 8192
    x = edge_rows(rows, k)
    func = softmax_stats(rows, k)
    m, l = _gpu_call(func, [x])
    want_m, want_l = run_llvm(func, [x])
    assert_same_specials(m, want_m)
    assert_same_specials(l, want_l, rtol=1e-4)
    with np.errstate(invalid="ignore", over="ignore"):
        ours = np.exp(x - m[:, None]) / l[:, None]
    expected = torch.softmax(torch.from_numpy(x), dim=1).numpy()
    assert_same_specials(ours, expected, rtol=1e-4, atol=1e-7)


@pytest.mark.gpu
@pytest.mark.parametrize("masked_prefix", [False, True])
def test_gpu_softmax_v_at_the_edges(masked_prefix):
    """softmax(X) V with a row of X all -inf (a fully masked row): NaN there, as
    ``torch.softmax(x, 1) @ v``; every other row equal to it, NaN and inf rows included."""
    torch = pytest.importorskip("torch")
    m, k, j = 64, 1024, 64
    x = edge_rows(m, k, masked_prefix=masked_prefix)
    v = _values(k, j)
    (out,) = _gpu_call(softmax_v(m, k, j), [x, v])
    expected = (torch.softmax(torch.from_numpy(x).double(), 1) @ torch.from_numpy(v).double()).numpy()
    assert np.isnan(out[0]).all()
    assert_same_specials(out, expected, rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("magnitude", [1.0, 30.0, 200.0])
def test_gpu_attention_with_large_scores_matches_sdpa(magnitude):
    """Scores of magnitude up to ~1e5 (q, k fp16 of that spread): the online softmax's
    rescaling keeps it exact; output equal to SDPA's in float64 within fp16 rounding."""
    torch = pytest.importorskip("torch")
    heads, q_len, kv_len, dim = 8, 256, 512, 64
    rng = np.random.default_rng(4)
    q, k = ((rng.standard_normal((heads, n, dim)) * magnitude).astype("float16") for n in (q_len, kv_len))
    v = rng.standard_normal((heads, kv_len, dim)).astype("float16")
    (out,) = _gpu_call(attention(heads, q_len, kv_len, dim), [q, k, v])
    expected = torch.nn.functional.scaled_dot_product_attention(
        *(torch.from_numpy(t).double() for t in (q, k, v))).numpy()
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - expected) / np.linalg.norm(expected) < 5e-3


@pytest.mark.gpu
def test_gpu_rmsnorm_at_the_edges():
    """Zeros (0/0), a sum of squares overflowing to inf, a NaN and an inf: the llvm build's
    results, which are those of the RMSNorm written in torch (fp32, no eps)."""
    torch = pytest.importorskip("torch")
    rows, k = 64, 8192
    x = _rms_rows(rows, k)
    w = np.random.default_rng(1).standard_normal(k).astype("float32")
    func = rmsnorm_gemv(rows, k)
    ss, y = _gpu_call(func, [x, w])
    want_ss, want_y = run_llvm(func, [x, w])
    assert_same_specials(ss, want_ss, rtol=1e-4)
    assert_same_specials(y, want_y, rtol=1e-3, atol=1e-4)
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    in_torch = (xt * wt / torch.sqrt((xt * xt).sum(1, keepdim=True) / k)).sum(1).numpy()
    assert_same_specials(y, in_torch, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(64, 256, 128, 128), (128, 512, 512, 256)])
def test_gpu_fp16_chain_overflow_matches_linear_layers(shape):
    """An FFN (fused in DSM, or two split-K GEMMs) whose fp16 intermediate overflows in two rows:
    inf and NaN where ``nn.Linear -> relu -> nn.Linear`` in fp16 has them, the other rows equal."""
    torch = pytest.importorskip("torch")
    m, n, k, l = shape
    a, w1, w2 = _chain_inputs(m, n, k, l)
    (out,) = _gpu_call(gemm_chain(m, n, k, l, "relu"), [a, w1, w2])
    at, w1t, w2t = (torch.from_numpy(t).cuda() for t in (a, w1, w2))
    expected = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(at, w1t)), w2t).cpu().numpy()
    assert not np.isfinite(expected[:2]).all()
    assert_same_specials(out, expected, rtol=2e-2, atol=2e-2)
