"""Reductions started from another value than their identity (a T5 attention's scores from a
position bias, a GEMM from its bias, a max from 0): started from the identity and combined with
the value after, so the families take them, never computing them from the identity alone."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import tvm_dsm
from tvm_dsm import driver
from tvm_dsm.errors import ClusterError
from tvm_dsm.families import match_family
from tvm_dsm.transform.reduction_inits import inits_apart

from conftest import TARGET


def _attention_from_bias(h: int = 2, s: int = 64, d: int = 64):
    """Attention whose scores start from a bias tensor [H, S, S] (no scale), as a user wrote it."""
    @T.prim_func(s_tir=True)
    def main(q: T.Buffer((1, h, s, d), "float16"), k: T.Buffer((1, h, s, d), "float16"),
             v: T.Buffer((1, h, s, d), "float16"), bias: T.Buffer((h, s, s), "float32"),
             out: T.Buffer((1, h, s, d), "float16")):
        sc = T.alloc_buffer((1, h, s, s), "float32")
        mx = T.alloc_buffer((1, h, s), "float32")
        ex = T.alloc_buffer((1, h, s, s), "float32")
        sm = T.alloc_buffer((1, h, s), "float32")
        acc = T.alloc_buffer((1, h, s, d), "float32")
        for b, hh, i, j, c in T.grid(1, h, s, s, d):
            with T.sblock("qk"):
                vb, vh, vi, vj, vc = T.axis.remap("SSSSR", [b, hh, i, j, c])
                with T.init():
                    sc[vb, vh, vi, vj] = bias[vh, vi, vj]
                sc[vb, vh, vi, vj] = sc[vb, vh, vi, vj] + T.Cast("float32", q[vb, vh, vi, vc]) * T.Cast(
                    "float32", k[vb, vh, vj, vc])
        for b, hh, i, j in T.grid(1, h, s, s):
            with T.sblock("max"):
                vb, vh, vi, vj = T.axis.remap("SSSR", [b, hh, i, j])
                with T.init():
                    mx[vb, vh, vi] = T.float32(-3.4e38)
                mx[vb, vh, vi] = T.max(mx[vb, vh, vi], sc[vb, vh, vi, vj])
        for b, hh, i, j in T.grid(1, h, s, s):
            with T.sblock("exp"):
                vb, vh, vi, vj = T.axis.remap("SSSS", [b, hh, i, j])
                ex[vb, vh, vi, vj] = T.exp(sc[vb, vh, vi, vj] - mx[vb, vh, vi])
        for b, hh, i, j in T.grid(1, h, s, s):
            with T.sblock("sum"):
                vb, vh, vi, vj = T.axis.remap("SSSR", [b, hh, i, j])
                with T.init():
                    sm[vb, vh, vi] = T.float32(0)
                sm[vb, vh, vi] = sm[vb, vh, vi] + ex[vb, vh, vi, vj]
        for b, hh, i, c, j in T.grid(1, h, s, d, s):
            with T.sblock("pv"):
                vb, vh, vi, vc, vj = T.axis.remap("SSSSR", [b, hh, i, c, j])
                with T.init():
                    acc[vb, vh, vi, vc] = T.float32(0)
                acc[vb, vh, vi, vc] = acc[vb, vh, vi, vc] + ex[vb, vh, vi, vj] * T.Cast("float32", v[vb, vh, vj, vc])
        for b, hh, i, c in T.grid(1, h, s, d):
            with T.sblock("norm"):
                vb, vh, vi, vc = T.axis.remap("SSSS", [b, hh, i, c])
                out[vb, vh, vi, vc] = T.Cast("float16", acc[vb, vh, vi, vc] / sm[vb, vh, vi])
    return main


def _attention_reference(q, k, v, bias):
    s = q @ k.swapaxes(-1, -2) + bias[None]
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def _gemm_from_bias(m: int = 64, n: int = 128, k: int = 256):
    """``y = bias + x @ w^T`` with the bias as the sum's start, fp16 in, fp32 sums, fp16 out."""
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((m, k), "float16"), w: T.Buffer((n, k), "float16"), bias: T.Buffer((n,), "float16"),
             y: T.Buffer((m, n), "float16")):
        acc = T.alloc_buffer((m, n), "float32")
        for i, j, r in T.grid(m, n, k):
            with T.sblock("gemm"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    acc[vi, vj] = T.Cast("float32", bias[vj])
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vr]) * T.Cast("float32", w[vj, vr])
        for i, j in T.grid(m, n):
            with T.sblock("out"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("float16", acc[vi, vj])
    return main


@T.prim_func(s_tir=True)
def _max_from_zero(x: T.Buffer((8, 64), "float32"), m: T.Buffer((8,), "float32")):
    for i, j in T.grid(8, 64):
        with T.sblock("row_max"):
            vi, vj = T.axis.remap("SR", [i, j])
            with T.init():
                m[vi] = T.float32(0)
            m[vi] = T.max(m[vi], x[vi, vj])


def _run_llvm(func, arrays: list, out_shape: tuple, dtype: str) -> np.ndarray:
    lib = tvm.compile(func, target="llvm")
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.full(out_shape, np.nan).astype(dtype), dev)
    lib["main"](*(tvm.runtime.tensor(a, dev) for a in arrays), out)
    return out.numpy()


def _attention_inputs(rng, h=2, s=64, d=64):
    return [(rng.standard_normal((1, h, s, d)) * 0.3).astype(np.float16) for _ in range(3)] + [
        rng.standard_normal((h, s, s)).astype(np.float32)]


def test_a_reduction_started_from_a_tensor_computes_the_same_values_started_from_its_identity():
    rng = np.random.default_rng(0)
    func = _attention_from_bias()
    apart = inits_apart(func)
    assert apart is not None
    arrays = _attention_inputs(rng)
    ref = _attention_reference(*(a.astype(np.float64) for a in arrays))
    for f in (func, apart):
        got = _run_llvm(f, arrays, (1, 2, 64, 64), "float16").astype(np.float64)
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_a_max_started_from_zero_is_combined_with_zero_after():
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32) - 3.0  # most rows all below 0
    apart = inits_apart(_max_from_zero)
    assert apart is not None
    np.testing.assert_array_equal(_run_llvm(apart, [x], (8,), "float32"), np.maximum(x.max(1), 0))


def test_reductions_started_from_their_identity_are_left_as_written():
    @T.prim_func(s_tir=True)
    def row_max(x: T.Buffer((8, 64), "float32"), m: T.Buffer((8,), "float32")):
        for i, j in T.grid(8, 64):
            with T.sblock("row_max"):
                vi, vj = T.axis.remap("SR", [i, j])
                with T.init():
                    m[vi] = T.float32(-3.4e38)
                m[vi] = T.max(m[vi], x[vi, vj])

    assert inits_apart(row_max) is None
    assert inits_apart(_gemm_from_bias().with_attr("global_symbol", "main")) is not None


def test_the_families_refuse_a_reduction_started_elsewhere_by_name():
    with pytest.raises(ClusterError, match="gemm: a reduction started from another value than its identity"):
        match_family(_gemm_from_bias())


def test_attention_from_a_bias_is_the_attention_kernel_with_the_bias_as_a_score_term():
    ranking = driver.plan(_attention_from_bias(8, 384, 96))
    assert ranking.family.name == "attention"
    terms = ranking.shape.terms
    assert terms is not None and "bias" in str(terms.value)


def test_a_gemm_from_its_bias_is_a_gemm_with_the_bias_in_its_epilogue():
    assert driver.plan(_gemm_from_bias()).family.name == "split_k_gemm"


def _error_on_gpu(func, arrays: list, reference, out_shape: tuple) -> float:
    """``func`` built by ``tvm_dsm.build``, run on ``arrays`` (in their own types) with a
    NaN-poisoned fp16 output, against ``reference`` of them in float64."""
    lib = tvm_dsm.build(func, TARGET)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(out_shape, np.nan).astype("float16"), dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in arrays), out)
    got = out.numpy().astype(np.float64)
    assert not np.isnan(got).any()
    ref = reference(*(a.astype(np.float64) for a in arrays))
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.mark.gpu
def test_gpu_reductions_started_from_a_value_match_float64():
    rng = np.random.default_rng(2)
    err = _error_on_gpu(_attention_from_bias(8, 384, 96), _attention_inputs(rng, 8, 384, 96), _attention_reference,
                        (1, 8, 384, 96))
    assert err < 2e-3
    x, w, b = (rng.standard_normal((64, 256)), rng.standard_normal((128, 256)) / 16, rng.standard_normal(128))
    err = _error_on_gpu(_gemm_from_bias(), [a.astype(np.float16) for a in (x, w, b)], lambda x, w, b: x @ w.T + b,
                        (64, 128))
    assert err < 2e-3


@T.prim_func(s_tir=True)
def _batched_fp16_sum_from_bias(x: T.Buffer((3, 33, 70), "float16"), w: T.Buffer((3, 50, 70), "float16"),
                                bias: T.Buffer((50,), "float16"), y: T.Buffer((3, 33, 50), "float16")):
    for bb, i, j, r in T.grid(3, 33, 50, 70):
        with T.sblock("gemm"):
            vb, vi, vj, vr = T.axis.remap("SSSR", [bb, i, j, r])
            with T.init():
                y[vb, vi, vj] = bias[vj]
            y[vb, vi, vj] = y[vb, vi, vj] + x[vb, vi, vr] * w[vb, vj, vr]


def test_a_16_bit_sum_from_a_bias_keeps_the_bias_on_every_path():
    """The fallback widens 16-bit sums to fp32; it starts them from 0 only once the start is apart."""
    from tvm_dsm.transform.widen_accumulation import widen_accumulation

    assert widen_accumulation(_batched_fp16_sum_from_bias) is None
    assert "bias" in tvm_dsm.build(_batched_fp16_sum_from_bias, TARGET).mod.imports[0].inspect_source()


@T.prim_func(s_tir=True)
def _max_from_the_first_element(x: T.Buffer((8, 64), "float32"), m: T.Buffer((8,), "float32")):
    for i, j in T.grid(8, 64):
        with T.sblock("row_max"):
            vi, vj = T.axis.remap("SR", [i, j])
            with T.init():
                m[vi] = x[vi, vj]
            m[vi] = T.max(m[vi], x[vi, vj])


@T.prim_func(s_tir=True)
def _bool_any(x: T.Buffer((8, 64), "float32"), y: T.Buffer((8,), "bool")):
    for i, j in T.grid(8, 64):
        with T.sblock("any"):
            vi, vj = T.axis.remap("SR", [i, j])
            with T.init():
                y[vi] = False
            y[vi] = T.max(y[vi], x[vi, vj] > T.float32(0))


@T.prim_func(s_tir=True)
def _masked_sum_from_bias(x: T.Buffer((16, 16), "float32"), b: T.Buffer((16,), "float32"),
                          y: T.Buffer((16, 16), "float32")):
    for i, j, r in T.grid(16, 16, 8):
        with T.sblock("sum"):
            T.where(j <= i)
            vi, vj, vr = T.axis.remap("SSR", [i, j, r])
            with T.init():
                y[vi, vj] = b[vj]
            y[vi, vj] = y[vi, vj] + x[vi, vr]


@pytest.mark.parametrize("func", [_max_from_the_first_element, _masked_sum_from_bias],
                         ids=["start_reads_the_reduction_variable", "predicated"])
def test_starts_it_cannot_move_are_left_and_refused_by_name(func):
    assert inits_apart(func) is None
    with pytest.raises(ClusterError, match="started from another value than its identity"):
        match_family(func)


def test_a_boolean_reduction_is_no_started_sum():
    assert inits_apart(_bool_any) is None
    with pytest.raises(ClusterError):
        driver.plan(_bool_any)


@T.prim_func(s_tir=True)
def _scaled_accumulate(x: T.Buffer((8, 32), "float32"), w: T.Buffer((16, 32), "float32"),
                       y: T.Buffer((8, 16), "float32")):
    for i, j, r in T.grid(8, 16, 32):
        with T.sblock("gemm"):
            vi, vj, vr = T.axis.remap("SSR", [i, j, r])
            with T.init():
                y[vi, vj] = y[vi, vj] * T.float32(0.5)
            y[vi, vj] = y[vi, vj] + x[vi, vr] * w[vj, vr]


def test_a_start_reading_the_output_is_left_to_the_schedules_that_read_it_first():
    """BLAS's ``y = 0.5 y + x w^T``: a block combining it after would read and write ``y``, which
    s_tir's schedules refuse; dlight's schedule of the function as written applies it first."""
    assert inits_apart(_scaled_accumulate) is None
    with pytest.raises(ClusterError, match="started from another value than its identity"):
        match_family(_scaled_accumulate)
    assert "__global__" in tvm_dsm.build(_scaled_accumulate, TARGET).mod.imports[0].inspect_source()


def test_a_function_no_schedule_puts_on_the_gpu_is_refused_by_name():
    """dlight leaves a reduction over an axis from 1 unscheduled; TVM compiles it for the host."""
    from tvm import te

    x = te.placeholder((256, 1024), "float32", name="x")
    r = te.reduce_axis((1, 1024), name="r")
    func = te.create_prim_func([x, te.compute((256,), lambda i: te.sum(x[i, r], axis=r), name="s")])
    with pytest.raises(ClusterError, match="put this function on the GPU"):
        tvm_dsm.build(func, TARGET)
