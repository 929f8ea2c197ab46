"""Fuzzing FuseCascadedReductions: 100 seeded cases of the grammar in cascade_fuzz (levels of
sum / max / min / top-k over one axis, terms of exp, log, abs, sqrt, sin, powers, products,
quotients, sums, constants and casts, levels reading earlier levels, extra axes), each built
unfused and fused for llvm and compared on four input profiles, in two worker processes with a
per-case timeout.

The full run (>= 5,000 cases, the counts in bench/results/fuzz_cascades/latest.json)::

    python tests/cascade_fuzz.py --cases 5000 --seed 0 --out bench/results/fuzz_cascades/latest.json

One case in detail (its spec, the TVMScript, the reports, the outcome)::

    python tests/cascade_fuzz.py --seed 0 --show 199

Every case must fuse to the unfused result or be refused with a reason naming its levels.
cascade_fuzz.KNOWN_BUGS names the kinds of failure the fuzzer has found (crashes on abs / sin /
index terms, wrong results on split-form dependencies, vanishing rescale factors and epilogues
between levels), so a failing case says which one came back; each has a minimal reproducer
below.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import tvm
from tvm import te

import cascade_fuzz as fuzz
from tvm_dsm.transform import fuse_cascaded_reductions
from conftest import LLVM

CI_CASES, CI_SEED = 100, 0
pytestmark = pytest.mark.slow  # the 100 cases run in the first tests' module fixture


@pytest.fixture(scope="module")
def results():
    return fuzz.run_cases(CI_SEED, range(CI_CASES), workers=2, timeout=60.0)


def _unknown(results):
    failing = [r for r in results if r["status"] in ("wrong", "error", "crash", "hang")]
    return [(r["index"], r["status"], r["problems"][:2]) for r in failing if fuzz.known_bug(r) is None]


def test_ci_cases_no_hang_no_crash_no_new_failure(results):
    """Every case ends (no hang, no dead worker); every fused result equals the unfused one
    within tolerance and every error is a crash of the pass, except the known bugs."""
    assert len(results) == CI_CASES and sorted(r["index"] for r in results) == list(range(CI_CASES))
    summary = fuzz.summarize(results)
    assert summary["hangs"] == 0 and summary["crashes"] == 0, summary["failures"]
    assert not _unknown(results), _unknown(results)
    assert not [r for r in results if r["status"] == "error" and r.get("stage") in ("build", "compile unfused",
                                                                                     "run unfused")]
    assert summary["fused"] >= 30 and summary["refused_cases"] >= 30  # both paths exercised
    assert summary["rel_err_correct"] < 1e-3


def test_every_refusal_names_its_levels_and_a_reason(results):
    refusals = [x for r in results for x in r["reasons"]]
    assert len(refusals) >= 30
    for x in refusals:
        assert x["reason"].strip() and x["levels"] and all(x["levels"]), x
        assert not x["category"].startswith("other"), x  # every reason is one the pass documents
    # a function with nothing fused comes back as the same object (checked per case)
    assert not [r for r in results if any("not the input" in p for p in r["problems"])]


def test_ci_cases_all_correct(results):
    summary = fuzz.summarize(results)
    assert summary["wrong"] == 0 and summary["errors"] == 0, summary["failures_by_known_bug"]


def test_generator_is_deterministic_and_seeded():
    for index in (0, 7, 123):
        a, b = fuzz.generate(CI_SEED, index), fuzz.generate(CI_SEED, index)
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
        assert fuzz.build(a).func.script() == fuzz.build(b).func.script()
    specs = [json.dumps(fuzz.generate(seed, 5), sort_keys=True) for seed in range(4)]
    assert len(set(specs)) == 4


def test_ci_cases_cover_the_grammar(results):
    """Every operator, level kind, cast, shape feature and pass option of the grammar appears in
    the CI cases, and each level kind appears in a fused case."""
    seen = {f for r in results for f in r["features"]}
    assert set(fuzz.FEATURES) <= seen, set(fuzz.FEATURES) - seen
    fused = {f for r in results if r["status"] == "fused" for f in r["features"]}
    assert {"op:sum", "op:max", "op:min", "op:top_k", "softmax_shift", "extra_axis", "dtype:float64",
            "parts>1"} <= fused, fused
    statuses = {r["status"] for r in results}
    assert {"fused", "refused"} <= statuses


def test_a_hang_and_a_crash_are_recorded_not_waited_on():
    """A case that sleeps for an hour is a hang once the timeout passes, one that aborts its
    worker a crash; both come back as results."""
    (hang,) = fuzz.run_cases(fuzz.HANG_SEED, [0], workers=1, timeout=1.0)
    assert hang["status"] == "hang"
    (crash,) = fuzz.run_cases(fuzz.CRASH_SEED, [0], workers=1, timeout=30.0)
    assert crash["status"] == "crash"
    s = fuzz.summarize([hang, crash])
    assert s["errors"] == 2 and s["hangs"] == 1 and s["crashes"] == 1


def test_tolerance_accepts_rounding_and_rejects_a_wrong_value():
    want = np.array([1.0, -2.0, np.nan, np.inf], "float32")
    spread = np.zeros(4)
    eps = fuzz.EPS["float32"]
    assert fuzz.compare(want * (1 + 4 * eps), want, spread, eps)[0]
    assert not fuzz.compare(np.array([1.01, -2.0, np.nan, np.inf], "float32"), want, spread, eps)[0]
    assert not fuzz.compare(np.array([1.0, -2.0, 0.0, np.inf], "float32"), want, spread, eps)[0]
    # an ill-conditioned output (the unfused result itself moves by 0.1 under input rounding)
    assert fuzz.compare(np.array([1.5, -2.0, np.nan, np.inf], "float32"), want, np.full(4, 0.1), eps)[0]


# -- minimal reproducers of the bugs the fuzzer found: each now fuses correctly or is refused ---
M, K = 4, 16


def _red(op, f, name, rows=M):
    r = te.reduce_axis((0, K), name + "_k")
    return te.compute((rows,), lambda i: op(f(i, r), axis=r), name=name)


def _outputs(func, x):
    ex = tvm.compile(tvm.IRModule({"main": func}), target=LLVM)
    outs = [tvm.runtime.tensor(np.full((M,), np.nan, "float32")) for _ in func.params[1:]]
    ex["main"](tvm.runtime.tensor(x), *outs)
    return [o.numpy() for o in outs]


def _fused_equals_unfused(func, x):
    """Fused: equal to the unfused function on ``x``; refused: ``func`` back, the reason naming a
    level. Either is right; a wrong result or a crash is not."""
    fused, reports = fuse_cascaded_reductions(func)
    if not any(r.fusible for r in reports):
        assert fused.same_as(func)
        assert all(any(re.search(rf"\b{name}\b", r.reason) for name in r.levels) for r in reports), \
            [r.reason for r in reports]
        return
    for got, want in zip(_outputs(fused, x), _outputs(func, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _data(seed=0):
    return np.random.default_rng(seed).standard_normal((M, K)).astype("float32")


def test_abs_in_a_separable_term():
    """m = max x; y = sum |x| * m: proven separable (split), then the rewrite cannot emit Abs."""
    x = te.placeholder((M, K), name="x")
    m = _red(te.max, lambda i, k: x[i, k], "m")
    y = _red(te.sum, lambda i, k: te.abs(x[i, k]) * m[i], "y")
    _fused_equals_unfused(te.create_prim_func([x, m, y]), _data())


def test_sin_in_a_separable_term():
    """m = max x; y = sum sin(x) * m."""
    x = te.placeholder((M, K), name="x")
    m = _red(te.max, lambda i, k: x[i, k], "m")
    y = _red(te.sum, lambda i, k: te.sin(x[i, k]) * m[i], "y")
    _fused_equals_unfused(te.create_prim_func([x, m, y]), _data())


def test_reduction_index_in_a_level_is_refused():
    """m = max x; y = sum float(k) * m: the proof treats k as a constant, the rewrite has no symbol."""
    x = te.placeholder((M, K), name="x")
    m = _red(te.max, lambda i, k: x[i, k], "m")
    y = _red(te.sum, lambda i, k: k.var.astype("float32") * m[i], "y")
    _fused_equals_unfused(te.create_prim_func([x, m, y]), _data())


def test_separable_term_reading_a_reduction_outside_the_cascade():
    """c = sum over another extent of z; s = sum x; y = sum x * s * c: c is an operand of the
    split term's H, which the rewrite cannot emit."""
    x, z = te.placeholder((M, K), name="x"), te.placeholder((M, 8), name="z")
    r = te.reduce_axis((0, 8), "c_k")
    c = te.compute((M,), lambda i: te.sum(z[i, r], axis=r), name="c")
    s = _red(te.sum, lambda i, k: x[i, k], "s")
    y = _red(te.sum, lambda i, k: x[i, k] * s[i] * c[i], "y")
    func = te.create_prim_func([x, z, c, s, y])
    fused, reports = fuse_cascaded_reductions(func)
    assert fused.same_as(func) or any(r.fusible for r in reports)


def test_max_reading_a_split_level():
    """s = sum x; q = sum x * s (split form); z = max(x - q) (shift form reading q's running
    value, which the split form does not keep)."""
    x = te.placeholder((M, K), name="x")
    s = _red(te.sum, lambda i, k: x[i, k], "s")
    q = _red(te.sum, lambda i, k: x[i, k] * s[i], "q")
    z = _red(te.max, lambda i, k: x[i, k] - q[i], "z")
    _fused_equals_unfused(te.create_prim_func([x, s, q, z]), _data())


def test_rescale_by_a_partial_sum_through_zero():
    """s = sum x; y = sum exp(x) * s: rescale form y * s_new / s_old, and a row whose first
    element is 0 has s_old = 0 after it (0 / 0: the first term is lost)."""
    x = te.placeholder((M, K), name="x")
    s = _red(te.sum, lambda i, k: x[i, k], "s")
    y = _red(te.sum, lambda i, k: te.exp(x[i, k]) * s[i], "y")
    data = _data()
    data[:, 0] = 0.0
    _fused_equals_unfused(te.create_prim_func([x, s, y]), data)


def test_epilogue_between_levels():
    """m = max x; e = m + 1; l = sum exp(x - m), with e before l in program order: the fused
    block replaces l, after e, so e reads m before anything writes it."""
    x = te.placeholder((M, K), name="x")
    m = _red(te.max, lambda i, k: x[i, k], "m")
    e = te.compute((M,), lambda i: m[i] + 1.0, name="e")
    l = _red(te.sum, lambda i, k: te.exp(x[i, k] - m[i]), "l")
    _fused_equals_unfused(te.create_prim_func([x, e, l]), _data())


def test_rounding_cast_refusal_names_the_levels():
    """The refusal of a rounding cast (pass allow_approximate=True) names the cascade's levels
    in the report but not, in its reason, the level holding the cast."""
    x = te.placeholder((M, K), name="x")
    a = _red(te.max, lambda i, k: te.abs(x[i, k]), "amax")
    y = _red(te.sum, lambda i, k: (x[i, k] / a[i]).astype("float16").astype("float32"), "y")
    _, (report,) = fuse_cascaded_reductions(te.create_prim_func([x, a, y]))
    assert not report.fusible
    assert re.search(r"\by\b", report.reason), report.reason


def test_split_expansion_of_a_high_power_is_refused():
    """m = max x; y = sum x * (x - m^4)^3: split form would expand it into terms up to m^12,
    which overflow or cancel where the unexpanded value does not (fuzz case 2837): refused,
    naming the degree."""
    x = te.placeholder((M, K), name="x")
    m = _red(te.max, lambda i, k: x[i, k], "m")

    def cube(i, k):
        d = x[i, k] - m[i] * m[i] * m[i] * m[i]
        return d * d * d

    y = _red(te.sum, lambda i, k: x[i, k] * cube(i, k), "y")
    func = te.create_prim_func([x, m, y])
    _, reports = fuse_cascaded_reductions(func)
    assert not any(r.fusible for r in reports)
    assert any("degree > 4" in r.reason and "y" in r.reason for r in reports), [r.reason for r in reports]
    data = _data() * 30
    _fused_equals_unfused(func, data)


def test_fourth_moment_still_splits():
    """sum (x - mean)^4 expands to terms of degree 4 in the mean: kept in split form."""
    x = te.placeholder((M, K), name="x")
    s = _red(te.sum, lambda i, k: x[i, k], "s")

    def fourth(i, k):
        d = x[i, k] - s[i] / K
        return d * d * d * d

    y = _red(te.sum, fourth, "y")
    func = te.create_prim_func([x, s, y])
    _, reports = fuse_cascaded_reductions(func)
    assert all(r.fusible for r in reports), [r.reason for r in reports]
    _fused_equals_unfused(func, _data())


def _fp16(value):
    return value.astype("float16").astype("float32")


def _overflowing_rows():
    """Rows whose max exceeds 11.1, where exp(max) overflows fp16, beside rows where it does not."""
    data = _data()
    data[:2, 3] = 12.0
    return data


def test_a_rounded_term_of_a_level_is_rounded_in_split_form():
    """m = max x; y = sum (fp16(exp(m)) - x): the unfused function rounds exp(m) through fp16 on
    every element (inf on rows where it overflows); the split form applies that term once and
    must round it the same way (fuzz case 4900, under allow_approximate)."""
    x = te.placeholder((M, K), name="x")
    m = _red(te.max, lambda i, k: x[i, k], "m")
    y = _red(te.sum, lambda i, k: _fp16(te.exp(m[i])) - x[i, k], "y")
    func = te.create_prim_func([x, m, y])
    fused, (report,) = fuse_cascaded_reductions(func, allow_approximate=True)
    assert report.fusible, report.reason
    got, want = _outputs(fused, _overflowing_rows())[1], _outputs(func, _overflowing_rows())[1]
    assert np.isinf(want[:2]).all() and np.isfinite(want[2:]).all()
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_a_rounded_term_of_a_level_in_a_running_correction_is_refused():
    """m = max x; z = max(x + fp16(exp(m))): the shift form would subtract rounded values the
    unfused function never forms (inf - inf on rows where exp(m) overflows fp16)."""
    x = te.placeholder((M, K), name="x")
    m = _red(te.max, lambda i, k: x[i, k], "m")
    z = _red(te.max, lambda i, k: x[i, k] + _fp16(te.exp(m[i])), "z")
    func = te.create_prim_func([x, m, z])
    _, (report,) = fuse_cascaded_reductions(func, allow_approximate=True)
    assert not report.fusible
    _fused_equals_unfused(func, _overflowing_rows())
