"""FuseCascadedReductions on 31 cascaded-reduction expressions (llvm): fusible ones are rewritten
into one incremental loop and compute the same outputs as the unfused function on random inputs;
the others come back as the same object with a reason."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import tvm
from tvm import te, topi

import tvm_dsm
from tvm_dsm.errors import ClusterError
from tvm_dsm.families.fused_cascade import FusedCascade
from conftest import LLVM, TARGET
from tvm_dsm.fusion.cascade import find_cascades
from tvm_dsm.transform import FuseCascadedReductions, fuse_cascaded_reductions
from tvm_dsm.workloads.cascades import decode_attention

M, K, J = 6, 48, 8


def _x(name="x", shape=(M, K)):
    return te.placeholder(shape, name=name)


def _k(name):
    return te.reduce_axis((0, K), name)


def row_max(x, name="m"):
    k = _k(name + "_k")
    return te.compute((M,), lambda i: te.max(x[i, k], axis=k), name=name)


def row_min(x, name="mn"):
    k = _k(name + "_k")
    return te.compute((M,), lambda i: te.min(x[i, k], axis=k), name=name)


def row_sum(x, f, name):
    k = _k(name + "_k")
    return te.compute((M,), lambda i: te.sum(f(i, k), axis=k), name=name)


def row_maxof(f, name):
    k = _k(name + "_k")
    return te.compute((M,), lambda i: te.max(f(i, k), axis=k), name=name)


def func(inputs, outputs):
    return te.create_prim_func(inputs + outputs)


# -- fusible ------------------------------------------------------------------------------------
def softmax_stats():
    x = _x(); m = row_max(x)
    return func([x], [m, row_sum(x, lambda i, k: te.exp(x[i, k] - m[i]), "l")])


def softmax_pv():
    x, v = _x(), _x("v", (K, J)); m = row_max(x)
    l = row_sum(x, lambda i, k: te.exp(x[i, k] - m[i]), "l")
    k = _k("o_k")
    o = te.compute((M, J), lambda i, j: te.sum(te.exp(x[i, k] - m[i]) * v[k, j], axis=k), name="o")
    return func([x, v], [m, l, o])


def softmax_pv_inlined_producer():
    x, v = _x(), _x("v", (K, J)); m = row_max(x)
    p = te.compute((M, K), lambda i, k: te.exp(x[i, k] - m[i]), name="p")  # element-wise stage
    l = row_sum(x, lambda i, k: p[i, k], "l")
    k = _k("o_k")
    o = te.compute((M, J), lambda i, j: te.sum(p[i, k] * v[k, j], axis=k), name="o")
    return func([x, v], [m, l, o])


def causal_softmax_pv():
    """A mask on the scores (key k of row i visible if k <= i + K - M) is one more operand."""
    x, v = _x(), _x("v", (K, J))
    masked = te.compute((M, K), lambda i, k: te.if_then_else(
        k <= i + (K - M), x[i, k], tvm.tirx.const(float("-inf"), "float32")), name="masked")
    m = row_max(masked)
    l = row_sum(x, lambda i, k: te.exp(masked[i, k] - m[i]), "l")
    k = _k("o_k")
    o = te.compute((M, J), lambda i, j: te.sum(te.exp(masked[i, k] - m[i]) * v[k, j], axis=k), name="o")
    return func([x, v], [m, l, o])


def normalized_softmax_sum():
    x = _x(); m = row_max(x)
    l = row_sum(x, lambda i, k: te.exp(x[i, k] - m[i]), "l")
    return func([x], [m, l, row_sum(x, lambda i, k: te.exp(x[i, k] - m[i]) / l[i], "n")])


def logsumexp():
    x = _x(); m = row_max(x)
    l = row_sum(x, lambda i, k: te.exp(x[i, k] - m[i]), "l")
    lse = te.compute((M,), lambda i: te.log(l[i]) + m[i], name="lse")
    return func([x], [m, lse])


def softmin():
    x = _x(); mn = row_min(x)
    return func([x], [mn, row_sum(x, lambda i, k: te.exp(mn[i] - x[i, k]), "l")])


def second_moment_softmax():
    x = _x(); m = row_max(x)
    return func([x], [m, row_sum(x, lambda i, k: te.exp(2.0 * (x[i, k] - m[i])), "l2")])


def variance():
    x = _x(); mu = row_sum(x, lambda i, k: x[i, k] / K, "mu")
    return func([x], [mu, row_sum(x, lambda i, k: (x[i, k] - mu[i]) * (x[i, k] - mu[i]) / K, "var")])


def third_central_moment():
    x = _x(); mu = row_sum(x, lambda i, k: x[i, k] / K, "mu")
    d = lambda i, k: x[i, k] - mu[i]  # noqa: E731
    return func([x], [mu, row_sum(x, lambda i, k: d(i, k) * d(i, k) * d(i, k), "m3")])


def layernorm_gemv():
    x, w = _x(), _x("w", (K,))
    mu = row_sum(x, lambda i, k: x[i, k] / K, "mu")
    return func([x, w], [mu, row_sum(x, lambda i, k: (x[i, k] - mu[i]) * w[k], "y")])


def rmsnorm_gemv():
    x, w = _x(), _x("w", (K,))
    ss = row_sum(x, lambda i, k: x[i, k] * x[i, k], "ss")
    return func([x, w], [ss, row_sum(x, lambda i, k: x[i, k] * w[k] / te.sqrt(ss[i] / K), "y")])


def rmsnorm_gemm():
    x, w = _x(), _x("w", (K, J))
    ss = row_sum(x, lambda i, k: x[i, k] * x[i, k], "ss")
    k = _k("y_k")
    y = te.compute((M, J), lambda i, j: te.sum(x[i, k] * w[k, j] / te.sqrt(ss[i] / K), axis=k), name="y")
    return func([x, w], [ss, y])


def absmax_scaled_gemv():  # FP8-style per-token scale, without the rounding cast
    x, w = _x(), _x("w", (K,))
    a = row_maxof(lambda i, k: te.abs(x[i, k]), "amax")
    return func([x, w], [a, row_sum(x, lambda i, k: x[i, k] * 448.0 / a[i] * w[k], "y")])


def max_then_centered_sum():
    x = _x(); m = row_max(x)
    return func([x], [m, row_sum(x, lambda i, k: x[i, k] - m[i], "s")])


def max_then_shifted_max():
    x, b = _x(), _x("b")
    m = row_max(x)
    return func([x, b], [m, row_maxof(lambda i, k: b[i, k] - m[i], "z")])


def max_then_exp_max():
    x, b = _x(), _x("b")
    m = row_max(x)
    return func([x, b], [m, row_maxof(lambda i, k: te.exp(b[i, k] - m[i]), "z")])


def sum_then_normalized_dot():
    x, w = _x(), _x("w", (K,))
    s = row_sum(x, lambda i, k: x[i, k], "s")
    return func([x, w], [s, row_sum(x, lambda i, k: x[i, k] * w[k] / s[i], "y")])


def sum_then_exp_weighted():
    x = _x(); s = row_sum(x, lambda i, k: x[i, k], "s")
    return func([x], [s, row_sum(x, lambda i, k: x[i, k] * te.exp(-s[i] / K), "y")])


def min_then_variance_about_min():
    x = _x(); mn = row_min(x)
    return func([x], [mn, row_sum(x, lambda i, k: (x[i, k] - mn[i]) * (x[i, k] - mn[i]), "v")])


def sum_then_shifted_max():
    x = _x(); s = row_sum(x, lambda i, k: x[i, k], "s")
    return func([x], [s, row_maxof(lambda i, k: x[i, k] - s[i], "z")])


def four_level_chain():
    x, v = _x(), _x("v", (K, J)); m = row_max(x)
    l = row_sum(x, lambda i, k: te.exp(x[i, k] - m[i]), "l")
    n = row_sum(x, lambda i, k: te.exp(x[i, k] - m[i]) / l[i], "n")
    k = _k("o_k")
    o = te.compute((M, J), lambda i, j: te.sum(te.exp(x[i, k] - m[i]) / l[i] * v[k, j], axis=k), name="o")
    return func([x, v], [m, l, n, o])


# -- not fusible --------------------------------------------------------------------------------
def sin_of_centered():
    x = _x(); m = row_max(x)
    return func([x], [m, row_sum(x, lambda i, k: te.sin(x[i, k] - m[i]), "y")])


def tanh_of_centered():
    x = _x(); m = row_max(x)
    return func([x], [m, row_sum(x, lambda i, k: te.tanh(x[i, k] - m[i]), "y")])


def exp_of_product():
    x = _x(); m = row_max(x)
    return func([x], [m, row_sum(x, lambda i, k: te.exp(x[i, k] * m[i]), "y")])


def reciprocal_of_centered():
    x = _x(); m = row_max(x)
    return func([x], [m, row_sum(x, lambda i, k: 1.0 / (x[i, k] - m[i] - 1.0), "y")])


def log_of_centered():
    x = _x(); m = row_max(x)
    return func([x], [m, row_sum(x, lambda i, k: te.log(m[i] - x[i, k] + 1.0), "y")])


def abs_deviation():
    x = _x(); mu = row_sum(x, lambda i, k: x[i, k] / K, "mu")
    return func([x], [mu, row_sum(x, lambda i, k: te.abs(x[i, k] - mu[i]), "mad")])


def max_with_signed_scale():  # max_k x_k * m: the correction m_new / m_old may be negative
    x, b = _x(), _x("b")
    m = row_max(x)
    return func([x, b], [m, row_maxof(lambda i, k: b[i, k] * m[i], "z")])


def max_of_square_distance():
    x, b = _x(), _x("b")
    m = row_max(x)
    return func([x, b], [m, row_maxof(lambda i, k: (b[i, k] - m[i]) * (b[i, k] - m[i]), "z")])


def select_inside_level():
    x = _x(); m = row_max(x)
    y = row_sum(x, lambda i, k: te.if_then_else(x[i, k] > m[i] - 1.0, x[i, k], 0.0), "y")
    return func([x], [m, y])


def rounding_cast_in_level():  # FP8-style quantization: fused rounding differs -> approximate
    x, w = _x(), _x("w", (K,))
    a = row_maxof(lambda i, k: te.abs(x[i, k]), "amax")
    q = lambda i, k: (x[i, k] * 448.0 / a[i]).astype("float16").astype("float32")  # noqa: E731
    return func([x, w], [a, row_sum(x, lambda i, k: q(i, k) * w[k], "y")])


@dataclass
class Case:
    build: object
    reason: str | None = None  # None: fusible

    @property
    def name(self) -> str:
        return self.build.__name__


FUSIBLE = [Case(f) for f in (
    softmax_stats, softmax_pv, softmax_pv_inlined_producer, causal_softmax_pv,
    normalized_softmax_sum, logsumexp,
    softmin, second_moment_softmax, variance, third_central_moment, layernorm_gemv, rmsnorm_gemv,
    rmsnorm_gemm, absmax_scaled_gemv, max_then_centered_sum, max_then_shifted_max, max_then_exp_max,
    sum_then_normalized_dot, sum_then_exp_weighted, min_then_variance_about_min,
    sum_then_shifted_max, four_level_chain,
)]
NOT_FUSIBLE = [
    Case(sin_of_centered, "neither G\\(x\\)\\*H\\(y\\) nor a sum"),
    Case(tanh_of_centered, "neither G\\(x\\)\\*H\\(y\\) nor a sum"),
    Case(exp_of_product, "neither G\\(x\\)\\*H\\(y\\) nor a sum"),
    Case(reciprocal_of_centered, "neither G\\(x\\)\\*H\\(y\\) nor a sum"),
    Case(log_of_centered, "neither G\\(x\\)\\*H\\(y\\) nor a sum"),
    Case(abs_deviation, "neither G\\(x\\)\\*H\\(y\\) nor a sum"),
    Case(max_with_signed_scale, "with H provably positive"),
    Case(max_of_square_distance, "neither G\\(x\\) \\+ H\\(y\\)"),
    Case(select_inside_level, "select reading the result of m"),
    Case(rounding_cast_in_level, "approximate: a rounding cast"),
]


def _build(f):
    return tvm.compile(tvm.IRModule({"main": f}), target=LLVM)


@pytest.fixture(scope="module")
def unfused():
    """Each fusible case's function and its llvm build, made once: the reference of every test
    of the case."""
    cache: dict = {}

    def get(case: Case):
        if case.name not in cache:
            f = case.build()
            cache[case.name] = f, _build(f)
        return cache[case.name]

    return get


def _run(f, seed: int, ex=None) -> list[np.ndarray]:
    """Outputs of ``f`` (built as ``ex``, or now) on random inputs in [0.5, 1.5) (positive: sqrt,
    log and 1/x stay defined)."""
    ex = _build(f) if ex is None else ex
    rng = np.random.default_rng(seed)
    n_in = len(f.params) - sum(1 for p in f.params if str(p.name) not in ("x", "v", "w", "b"))
    args = []
    for n, p in enumerate(f.params):
        shape = [int(d) for d in p.ty.shape]
        data = rng.uniform(0.5, 1.5, shape) if n < n_in else np.full(shape, np.nan)
        args.append(tvm.runtime.tensor(data.astype("float32")))
    ex["main"](*args)
    return [a.numpy() for a in args[n_in:]]


def test_at_least_25_expressions():
    assert len(FUSIBLE) + len(NOT_FUSIBLE) >= 25


@pytest.mark.parametrize("case", FUSIBLE, ids=lambda c: c.name)
def test_fusible_cascade_is_rewritten_and_equal(case, unfused):
    f, reference = unfused(case)
    fused, reports = fuse_cascaded_reductions(f)
    assert reports and all(r.fusible for r in reports), [str(r) for r in reports]
    assert "fused_" in fused.script()
    built = _build(fused)
    for seed in (1, 2):
        for got, want in zip(_run(fused, seed, built), _run(f, seed, reference)):
            assert np.isfinite(got).all()  # poisoned outputs: every element written
            assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-5


@pytest.mark.parametrize(("parts", "vector", "marker"), [
    (8, 1, "_part"),  # 8 strided parts per row, merged with the levels' corrections
    (4, 4, "T.vectorized(4)"),  # 4 parts of 4-element chunks, each row staged by one vector copy
])
@pytest.mark.parametrize("case", FUSIBLE, ids=lambda c: c.name)
def test_split_parts_merge_by_the_same_rule(case, parts, vector, marker, unfused):
    """Split partials merge by the rule that fused them: the same outputs as unfused."""
    f, reference = unfused(case)
    fused, reports = fuse_cascaded_reductions(f, parts=parts, vector=vector)
    assert all(r.fusible for r in reports) and marker in fused.script()
    for got, want in zip(_run(fused, parts), _run(f, parts, reference)):
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-5


@pytest.mark.parametrize(("parts", "vector"), [
    (8, 4),  # 12 chunks of K = 48: parts 0-3 read two, parts 4-7 one
    (32, 1),  # 48 elements over 32 parts
])
@pytest.mark.parametrize("case", FUSIBLE, ids=lambda c: c.name)
def test_parts_that_do_not_divide_the_chunks_predicate_their_last_step(case, parts, vector, unfused):
    """Where the parts do not divide a row's chunks, the parts past the last chunk skip their
    last step: the same outputs as unfused."""
    f, reference = unfused(case)
    fused, reports = fuse_cascaded_reductions(f, parts=parts, vector=vector)
    assert all(r.fusible for r in reports), [str(r) for r in reports]
    assert f" < {K // vector}:" in fused.script()  # the step's predicate: a chunk of the row
    for got, want in zip(_run(fused, parts), _run(f, parts, reference)):
        assert np.isfinite(got).all()
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-5


def test_fewer_chunks_than_parts_are_refused():
    f = logsumexp()
    fused, reports = fuse_cascaded_reductions(f, parts=16, vector=4)  # 12 chunks
    assert fused.same_as(f) and "at least one for each of 16 parts" in reports[0].reason


def test_a_cascade_with_an_element_producer_splits_evenly_only():
    f = decode_attention(4, 120, 64)  # 15 chunks of 8 keys over 8 parts
    fused, reports = fuse_cascaded_reductions(f, parts=8, vector=8)
    assert fused.same_as(f) and "element producer" in reports[0].reason


@pytest.mark.parametrize("case", NOT_FUSIBLE, ids=lambda c: c.name)
def test_not_fusible_is_unchanged_with_a_reason(case):
    f = case.build()
    out, reports = fuse_cascaded_reductions(f)
    assert out.same_as(f)
    assert any(not r.fusible for r in reports)
    reason = " ".join(r.reason for r in reports)
    import re

    assert re.search(case.reason, reason), reason


def test_approximate_rewrite_on_request():
    f = rounding_cast_in_level()
    fused, reports = fuse_cascaded_reductions(f, allow_approximate=True)
    assert reports[0].fusible and reports[0].approximate and "fused_" in fused.script()


def test_the_family_refuses_what_its_rewrite_refuses():
    """A rounding cast inside a level: the rewrite refuses it without allow_approximate, so the
    fused-cascade family does not take it either (a plan it cannot schedule)."""
    from tvm_dsm.families.fused_cascade import FusedCascade

    with pytest.raises(ClusterError, match="a rounding cast inside it"):
        FusedCascade().recognize(rounding_cast_in_level())


def test_pass_form_on_a_module():
    mod = tvm.IRModule({"main": softmax_pv()})
    out = FuseCascadedReductions()(mod)
    assert "fused_m_l_o" in out["main"].script()
    unchanged = tvm.IRModule({"main": sin_of_centered()})
    assert FuseCascadedReductions()(unchanged)["main"].same_as(unchanged["main"])


@pytest.mark.parametrize("name", ["softmax_stats", "logsumexp", "layernorm_stats", "rmsnorm_gemv", "softmax_pv"])
def test_fused_rows_schedule_assembles_for_sm90a(name, assemble):
    from conftest import cuda_source

    from tvm_dsm.rules.fused_rows import schedule_fused_rows
    from tvm_dsm.workloads import cascades

    shape = (64, 1024, 64) if name == "softmax_pv" else (64, 1024)
    fused, _ = fuse_cascaded_reductions(getattr(cascades, name)(*shape), parts=128, vector=4)
    source = cuda_source(schedule_fused_rows(fused).mod)
    assert "__launch_bounds__(128)" in source and "__syncthreads" in source
    assert "*(float4*)(x_ptr" in source  # each thread loads 16 bytes of its row at a time
    assemble(source, f"cascade_{name}")


def test_part_starting_at_zero_stays_finite():
    """A part whose first element is 0 has a partial sum of squares of 0: an online rescale would
    evaluate x * w / sqrt(0) = 0/0 there. The fused RMSNorm applies 1/sqrt(ss) once at the end."""
    from tvm_dsm.workloads.cascades import rmsnorm_gemv

    f = rmsnorm_gemv(4, 64)
    fused, reports = fuse_cascaded_reductions(f, parts=8)
    assert "split" in " ".join(reports[0].details)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 64)).astype("float32")
    x[:, :8] = 0.0  # the first element of every part
    w = rng.standard_normal(64).astype("float32")
    results = []
    for g in (fused, f):
        ex = tvm.compile(tvm.IRModule({"main": g}), target=LLVM)
        ss, y = (tvm.runtime.tensor(np.full(4, np.nan, "float32")) for _ in range(2))
        ex["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w), ss, y)
        results.append(y.numpy())
    assert np.isfinite(results[0]).all()
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5)


@pytest.mark.parametrize("second_rows", [96, 128])
def test_two_products_of_one_input_are_no_cascade(second_rows):
    """Two products of one input (TOPI's dense twice) are matmuls, not reductions of rows: over
    128 and 96 columns one loop read w2 past its rows and wrote the 96-wide output with the
    128-wide one's indices; at equal widths it ran both GEMMs on CUDA cores. Each is a GEMM (one
    kernel of sibling products at equal widths)."""
    x = te.placeholder((64, 256), "float16", "x")
    w1, w2 = te.placeholder((128, 256), "float16", "w1"), te.placeholder((second_rows, 256), "float16", "w2")
    func = te.create_prim_func([x, w1, w2, topi.nn.dense(x, w1, out_dtype="float32"),
                                topi.nn.dense(x, w2, out_dtype="float32")])
    assert not find_cascades(func)
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    kernels = 1 if second_rows == 128 else 2  # a tensor-core GEMM per operator, or of both
    assert source.count("__global__") == 2 * kernels and ("mma_async" in source or "mma.sync" in source)


@pytest.mark.parametrize(("first", "second", "grouped"), [
    ((64,), (64,), True), ((64,), (64, 1), True),  # a kept unit axis after the rows
    ((64, 1), (64,), False),  # fewer axes than the first level's: left unfused
    ((64,), (1, 64), False), ((64, 1), (1, 64), False)])  # the same rows at another position
def test_siblings_pair_their_row_axes_by_position(first, second, grouped):
    """The fused loop pairs a sibling's axes with the first level's by position: a unit axis
    before the rows would have it write row i at [i, 0] of a [1, 64] buffer."""
    x = te.placeholder((64, 32), "float32", "x")

    def row_sum(shape, square):
        k = te.reduce_axis((0, 32), "k")
        row = shape.index(64)
        return te.compute(shape, lambda *ax: te.sum(x[ax[row], k] * (x[ax[row], k] if square else 1.0), axis=k))

    func = te.create_prim_func([x, row_sum(first, False), row_sum(second, True)])
    assert bool(find_cascades(func)) == grouped


@pytest.mark.parametrize(("shape", "fused"), [((64,), True), ((64, 1), True), ((1, 64), False)])
def test_a_statistic_of_the_rows_joins_only_with_its_rows_leading(shape, fused):
    """A variance over the mean's rows fuses where its leading axes are those rows; written
    ``[1, 64]`` after a ``[64]`` mean, the fused loop would store row i at [i, 0]."""
    x = te.placeholder((64, 32), "float32", "x")
    k, k2 = te.reduce_axis((0, 32), "k"), te.reduce_axis((0, 32), "k2")
    mean = te.compute((64,), lambda i: te.sum(x[i, k], axis=k), name="mean")
    row = shape.index(64)
    var = te.compute(shape, lambda *ax: te.sum((x[ax[row], k2] - mean[ax[row]]) * (x[ax[row], k2] - mean[ax[row]]),
                                                axis=k2), name="var")
    func = te.create_prim_func([x, mean, var])
    rewritten, _ = fuse_cascaded_reductions(func)
    assert (rewritten is not func) == fused
    data = np.random.default_rng().standard_normal((64, 32)).astype("float32")
    outs = []
    for f in (func, rewritten):
        args = [tvm.runtime.tensor(data), tvm.runtime.tensor(np.full(64, np.nan, "float32")),
                tvm.runtime.tensor(np.full(shape, np.nan, "float32"))]
        tvm.compile(f, target=LLVM)(*args)
        outs.append([a.numpy() for a in args[1:]])
    for got, want in zip(outs[1], outs[0]):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def _cross_entropy(rows: int, width: int, dtype: str = "float32"):
    """Cross-entropy against integer labels, as a training loop writes it: the row's log-sum-exp
    less the logit of its label (one element a row, gathered)."""
    logits = te.placeholder((rows, width), dtype, name="logits")
    labels = te.placeholder((rows,), "int64", name="labels")
    k1, k2 = te.reduce_axis((0, width), "k1"), te.reduce_axis((0, width), "k2")
    top = te.compute((rows,), lambda i: te.max(logits[i, k1].astype("float32"), axis=k1), name="top")
    total = te.compute((rows,), lambda i: te.sum(te.exp(logits[i, k2].astype("float32") - top[i]), axis=k2),
                       name="total")
    loss = te.compute((rows,), lambda i: te.log(total[i]) + top[i] - logits[i, labels[i]].astype("float32"),
                      name="loss")
    return te.create_prim_func([logits, labels, loss])


def test_a_cross_entropy_against_labels_is_one_fused_kernel(assemble):
    """The gather of each row's label logit is one element a row, not a second pass over the data:
    the fused rows take the function, and its rewrite computes what it does on llvm."""
    from conftest import cuda_source

    assert tvm_dsm.plan(_cross_entropy(4096, 32000)).family.name == "fused_cascade"
    assert assemble(cuda_source(tvm_dsm.driver.schedule(_cross_entropy(4096, 32000)).mod), "cross_entropy_labels")
    func = _cross_entropy(M, K)
    fused, _ = fuse_cascaded_reductions(func)
    assert not fused.same_as(func)
    rng = np.random.default_rng()
    x = rng.standard_normal((M, K)).astype("float32")
    labels = rng.integers(0, K, M).astype("int64")
    outs = []
    for f in (func, fused):
        out = tvm.runtime.tensor(np.zeros(M, "float32"))
        tvm.compile(f, target=LLVM)(tvm.runtime.tensor(x), tvm.runtime.tensor(labels), out)
        outs.append(out.numpy().astype(np.float64))
    want = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1) - x[np.arange(M), labels]
    for got in outs:
        assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()


def _soft_cross_entropy(rows, width: int, dtype: str = "float16"):
    """Cross-entropy against soft targets ``t``: the row's log-sum-exp times the targets' sum
    less their dot with the logits, three sums over the row, as a distillation loss writes it."""
    logits = te.placeholder((rows, width), dtype, name="logits")
    targets = te.placeholder((rows, width), dtype, name="targets")
    k1, k2, k3 = (te.reduce_axis((0, width), f"k{n}") for n in range(3))
    top = te.compute((rows,), lambda i: te.max(logits[i, k1].astype("float32"), axis=k1), name="top")
    total = te.compute((rows,), lambda i: te.sum(te.exp(logits[i, k2].astype("float32") - top[i]), axis=k2),
                       name="total")
    loss = te.compute((rows,), lambda i: te.sum(targets[i, k3].astype("float32") * (
        te.log(total[i]) + top[i] - logits[i, k3].astype("float32")), axis=k3), name="loss")
    return te.create_prim_func([logits, targets, loss])


def test_a_cascade_over_a_symbolic_row_count_takes_the_fused_rows_where_dlight_has_no_reduction_rule(assemble):
    """A training loop's batch of tokens is a variable. A soft-target cross-entropy (three sums,
    which only dlight's fallback takes: a thread walking each row alone) gets the fused rows in
    every range (one row a CTA or cluster); one against integer labels (a log-sum-exp, which
    dlight's reduction rules take) is left to them."""
    from conftest import cuda_source
    from tvm_dsm.families.row_ranges import range_kernels
    from tvm_dsm.hardware import load_hardware

    kernels, sch = tvm_dsm.driver.schedule_row_ranges(_soft_cross_entropy(te.var("m"), 32000), TARGET)
    assert {k.family.name for k in kernels} == {"fused_cascade"}
    assert all(k.config.rows_per_cta == 1 for k in kernels)
    assert assemble(cuda_source(sch.mod), "symbolic_cross_entropy")
    with pytest.raises(ClusterError, match="dlight's reduction rules take it"):
        range_kernels(_cross_entropy(te.var("m"), 32000, "float16"), TARGET, load_hardware())


@pytest.mark.gpu
def test_gpu_a_cross_entropy_against_labels_matches_float64():
    func = _cross_entropy(4096, 32000, "float16")
    rng = np.random.default_rng()
    x = (rng.standard_normal((4096, 32000)) * 3).astype("float16")
    labels = rng.integers(0, 32000, 4096).astype("int64")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(4096, np.nan, "float32"), dev)
    tvm_dsm.build(func, TARGET)(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(labels, dev), out)
    x64 = x.astype(np.float64)
    want = np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1)) + x64.max(-1) - x64[np.arange(4096), labels]
    assert np.linalg.norm(out.numpy() - want) / np.linalg.norm(want) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 17, 300])
def test_gpu_a_soft_cross_entropy_of_a_symbolic_row_count_matches_float64(rows):
    func = _soft_cross_entropy(te.var("m"), 32000)
    rng = np.random.default_rng()
    x = (rng.standard_normal((rows, 32000)) * 3).astype("float16")
    t = rng.random((rows, 32000)).astype("float16")
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(rows, np.nan, "float32"), dev)
    tvm_dsm.build(func, TARGET)(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(t, dev), out)
    x64, t64 = x.astype(np.float64), t.astype(np.float64)
    lse = np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1)) + x64.max(-1)
    want = (t64 * (lse[:, None] - x64)).sum(-1)
    assert np.linalg.norm(out.numpy() - want) / np.linalg.norm(want) < 1e-5


def _latent_decode(b=2, h=4, keys=40, latent=24, rope=8):
    """MLA's decode with absorbed weights: the scores over the cache's ``latent + rope`` columns,
    the values its first ``latent`` columns (one tensor read two ways)."""
    q = te.placeholder((b, h, latent + rope), "float16", name="q")
    cache = te.placeholder((b, keys, latent + rope), "float16", name="cache")
    d, j = te.reduce_axis((0, latent + rope), name="d"), te.reduce_axis((0, keys), name="j")
    scores = te.compute((b, h, keys), lambda n, i, t: te.sum(
        q[n, i, d].astype("float32") * cache[n, t, d].astype("float32"), axis=d), name="scores")
    p = topi.nn.softmax(scores, axis=-1)
    out = te.compute((b, h, latent), lambda n, i, c: te.sum(p[n, i, j] * cache[n, j, c].astype("float32"), axis=j),
                     name="out")
    return te.create_prim_func([q, cache, out])


def test_a_tensor_read_as_a_lanes_slice_and_another_way_is_refused_by_name():
    """The slice's registers would stand for the values' loads too (a wrong result, found on
    DeepSeek's absorbed MLA decode): the rewrite and the family refuse it, naming the tensor."""
    func = _latent_decode()
    fused, reports = fuse_cascaded_reductions(func)
    assert fused.same_as(func) and "cache is read as a lane's slice and another way" in reports[0].reason
    with pytest.raises(ClusterError, match="cache is read as a lane's slice and another way"):
        FusedCascade().recognize(func)
