"""A decode GEMV over a packed (4-bit) weight as the packed GEMV rule schedules it
(tvm_dsm.rules.packed_gemv, tvm_dsm.families.packed_gemv): the forms users write (MLC's TE
decode stages, TVMScript with zero points, fp32 or fp16 sums), what it refuses, the exact
conversions by bits, its CUDA, and (GPU) its outputs against float64."""

import re

import numpy as np
import pytest
import tvm
from tvm import te, topi
from tvm.script import tirx as T

import tvm_dsm
from conftest import LLVM, TARGET
from tvm_dsm.driver import plan
from tvm_dsm.errors import ClusterError
from tvm_dsm.relax_integration import scheduling_form
from tvm_dsm.rules.packed_gemv import (PackedGemvConfig, candidate_configs, check_config, default_config,
                                       find_packed_gemv, schedule_packed_gemv)
from tvm_dsm.transform.exact_int_casts import int_casts_by_bits
from tvm_dsm.transform.widen_accumulation import widen_accumulation


def _mlc(n: int, k: int, rows: int = 1, group: int = 32, accumulate: str = "float16", bias: bool = False):
    """MLC-LLM's q4f16 form: 8 codes a uint32 ``[N, K / 8]``, an fp16 scale per ``group``,
    unpacked in two TE stages before the product, ``(q - 7) * s``; a bias added after it."""
    x = te.placeholder((1, rows, k), "float16", name="x")
    wq = te.placeholder((n, k // 8), "uint32", name="w_packed")
    sc = te.placeholder((n, k // group), "float16", name="w_scale")
    codes = te.compute((n, k), lambda j, c: ((wq[j, c // 8] >> (c % 8 * 4).astype("uint32")) & te.const(15, "uint32"))
                       .astype("float16") - te.const(7, "float16"), name="decode_q")
    w = te.compute((n, k), lambda j, c: codes[j, c] * sc[j, c // group], name="decode")
    r = te.reduce_axis((0, k), name="k")
    if accumulate == "float16":
        y = te.compute((1, rows, n), lambda b, s, j: te.sum(x[b, s, r] * w[j, r], axis=r), name="NT_matmul")
    else:
        acc = te.compute((1, rows, n), lambda b, s, j: te.sum(x[b, s, r].astype("float32") * w[j, r].astype("float32"),
                                                               axis=r), name="acc")
        y = te.compute((1, rows, n), lambda b, s, j: acc[b, s, j].astype("float16"), name="y")
    if bias:
        b = te.placeholder((n,), "float16", name="bias")
        return te.create_prim_func([x, wq, sc, b, te.compute((1, rows, n), lambda i, s, j: y[i, s, j] + b[j], name="add")])
    return te.create_prim_func([x, wq, sc, y])


def _nibbles(n: int, k: int, group: int = 128):
    """Two codes a uint8 ``[N, K / 2]`` (low nibble first), an fp16 scale and a uint8 zero point
    per ``group``, dequantized inside an fp32 sum written in TVMScript."""
    @T.prim_func(s_tir=True)
    def main(x: T.Buffer((1, k), "float16"), qw: T.Buffer((n, k // 2), "uint8"),
             scales: T.Buffer((n, k // group), "float16"), zeros: T.Buffer((n, k // group), "uint8"),
             y: T.Buffer((1, n), "float16")):
        acc = T.alloc_buffer((1, n), "float32")
        for i, j, c in T.grid(1, n, k):
            with T.sblock("gemv"):
                vi, vj, vc = T.axis.remap("SSR", [i, j, c])
                with T.init():
                    acc[vi, vj] = T.float32(0)
                acc[vi, vj] = acc[vi, vj] + T.Cast("float32", x[vi, vc]) * (
                    T.Cast("float32", T.bitwise_and(T.shift_right(qw[vj, vc // 2], T.Cast("uint8", vc % 2 * 4)),
                                                    T.uint8(15)))
                    - T.Cast("float32", zeros[vj, vc // group])) * T.Cast("float32", scales[vj, vc // group])
        for i, j in T.grid(1, n):
            with T.sblock("cast"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = T.Cast("float16", acc[vi, vj])
    return main


def _int8_per_channel(n: int, k: int):
    """W8A16 as TOPI writes it: an int8 ``[N, K]`` weight cast to fp16 and scaled per output
    channel, then ``dense`` with fp32 accumulation and a cast."""
    x = te.placeholder((1, k), "float16", name="x")
    w = te.placeholder((n, k), "int8", name="w_int8")
    scale = te.placeholder((n,), "float16", name="w_scale")
    deq = te.compute((n, k), lambda j, c: w[j, c].astype("float16") * scale[j], name="dequantize")
    return te.create_prim_func([x, w, scale, topi.cast(topi.nn.dense(x, deq, out_dtype="float32"), "float16")])


def _packed_zero_points(n: int, k: int, group: int = 128):
    """AWQ's zero points in GPTQ's ``[N, K / d]`` orientation: 8 codes and 8 zero points a
    uint32, the zero points' word read at ``k // group // 8``."""
    x = te.placeholder((1, k), "float16", name="x")
    wq = te.placeholder((n, k // 8), "uint32", name="qweight")
    zq = te.placeholder((n, k // group // 8), "uint32", name="qzeros")
    sc = te.placeholder((n, k // group), "float16", name="scales")
    r = te.reduce_axis((0, k), name="k")

    def weight(j, c):
        q = (wq[j, c // 8] >> (c % 8 * 4).astype("uint32")) & te.const(15, "uint32")
        z = (zq[j, c // group // 8] >> (c // group % 8 * 4).astype("uint32")) & te.const(15, "uint32")
        return (q.astype("float32") - z.astype("float32")) * sc[j, c // group].astype("float32")
    acc = te.compute((1, n), lambda i, j: te.sum(x[i, r].astype("float32") * weight(j, r), axis=r), name="acc")
    return te.create_prim_func([x, wq, zq, sc, te.compute((1, n), lambda i, j: acc[i, j].astype("float16"), name="y")])


def _sub_byte(n: int, k: int):
    """An int4 tensor (TVM's sub-byte type) with a scale per column."""
    x = te.placeholder((1, k), "float16", name="x")
    w = te.placeholder((n, k), "int4", name="w_int4")
    s = te.placeholder((n, 1), "float16", name="w_scale")
    r = te.reduce_axis((0, k), name="k")
    return te.create_prim_func([x, w, s, te.compute((1, n), lambda i, j: te.sum(
        x[i, r].astype("float32") * w[j, r].astype("float32") * s[j, 0].astype("float32"), axis=r), name="y")])


def _transposed(n: int, k: int):
    """GPTQ's layout: 8 codes a uint32 packed along K, ``[K / 8, N]``."""
    x = te.placeholder((1, k), "float16", name="x")
    wq = te.placeholder((k // 8, n), "uint32", name="qweight")
    r = te.reduce_axis((0, k), name="k")
    y = te.compute((1, n), lambda i, j: te.sum(
        x[i, r].astype("float32") * ((wq[r // 8, j] >> (r % 8 * 4).astype("uint32")) & te.const(15, "uint32"))
        .astype("float32"), axis=r), name="y")
    return te.create_prim_func([x, wq, y])


FORMS = {
    "mlc_fp16_sum": lambda: _mlc(2048, 1024),
    "mlc_fp32_sum": lambda: _mlc(4096, 4096, accumulate="float32"),
    "mlc_fp16_sum_bias": lambda: _mlc(2048, 1024, bias=True),
    "nibbles_zero_points": lambda: _nibbles(512, 2048),
    "int8_per_channel": lambda: _int8_per_channel(1024, 2048),
    "mlc_fp16_sum_56_lanes": lambda: _mlc(512, 3584),  # Qwen2-7B's K: 112 vectors
    "nibbles_37_lanes": lambda: _nibbles(256, 1184, group=32),  # 37 vectors, a prime
    "mlc_fp16_sum_74_lanes": lambda: _mlc(256, 18944),  # Qwen2-7B's intermediate K: 592 vectors
    "mlc_fp16_sum_4_rows": lambda: _mlc(2048, 1024, rows=4),  # a decode step of 4 sequences
    "mlc_fp16_sum_bias_8_rows": lambda: _mlc(1024, 2048, rows=8, bias=True),
}


def _found(func):
    form = scheduling_form(func)
    return find_packed_gemv(widen_accumulation(form) or form)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_forms_users_write_are_packed_gemvs_and_planned_so(form):
    found = _found(FORMS[form]())
    assert found.span == (16 if form.startswith("int8") else 32) and found.epilogue is not None
    assert plan(FORMS[form]()).family.name == "packed_gemv"


@pytest.mark.parametrize("func, reason", [
    (lambda: _mlc(2048, 1024, rows=9), "at most 8 rows"),
    (lambda: _transposed(1024, 1024), r"reads its weights as W\[j, k // d\] or W\[j\]"),
    (lambda: _mlc(256, 1040, group=16), "K=1040 is not a multiple of the 32 values"),
    (lambda: _nibbles(64, 256, group=48), "neither divide nor are divided"),
    (lambda: _sub_byte(256, 1024), "not sub-byte tensors"),
    (lambda: _mlc(256, 32), "two of them at the least"),
])
def test_what_it_refuses_is_named(func, reason):
    with pytest.raises(ClusterError, match=reason):
        _found(func())


def test_plan_names_the_limit_the_widened_form_meets():
    """MLC's sum is written in fp16: as written, the packed GEMV refuses it for that; widened,
    for K. The error says both."""
    with pytest.raises(ClusterError) as refused:
        plan(_mlc(256, 1040))
    message = str(refused.value)
    assert "packed_gemv: a packed GEMV accumulates in fp32" in message
    assert "accumulating in fp32, rounded once:\n" in message and "packed_gemv: K=1040 is not a multiple" in message


def test_configurations_are_checked_against_the_extents():
    found = _found(_mlc(2048, 1024))
    assert default_config(found) == PackedGemvConfig(2, 4, 32, 1)  # 1024 / 32 = 32 vectors: one a lane
    with pytest.raises(ClusterError, match="K=1024 is not a multiple of a step's 2048"):
        check_config(found, PackedGemvConfig(4, 4, 32, 2))
    with pytest.raises(ClusterError, match="N=80 is not a multiple of 8 x 4 columns a CTA"):
        check_config(_found(_mlc(80, 1024)), PackedGemvConfig(8, 4, 32, 1))
    configs = candidate_configs(found)
    assert configs[0] == default_config(found) and len(set(configs)) == len(configs) > 10


@pytest.mark.parametrize(("k", "lanes"), [(3584, 56), (18944, 74), (11008, 86), (14336, 64), (4096, 64), (3072, 32),
                                          (5120, 32), (96, 3)])
def test_lanes_split_the_rows_loads_evenly(k, lanes):
    """Powers of two from 32 up where they divide K's count of 16-byte loads; otherwise (Qwen2's
    3584 and 18944, Llama-2's 11008) other counts: every lane takes the same loads, no
    predicate; above 64 where the most up to 64 are fewer than 48."""
    assert default_config(_found(_mlc(256, k, accumulate="float32"))).lanes == lanes


def test_a_prime_count_of_loads_over_128_is_refused_by_name():
    with pytest.raises(ClusterError, match="splits K's 131 16-byte loads evenly over 2 to 128 lanes"):
        default_config(_found(_mlc(256, 131 * 32, group=131 * 32, accumulate="float32")))


def test_every_candidate_configuration_schedules():
    found = _found(_packed_zero_points(512, 2048))
    for config in candidate_configs(found):
        schedule_packed_gemv(found, config)


def test_a_sum_started_elsewhere_is_refused():
    @T.prim_func(s_tir=True)
    def biased(x: T.Buffer((1, 256), "float16"), w: T.Buffer((64, 128), "uint8"), b: T.Buffer((64,), "float32"),
               y: T.Buffer((1, 64), "float32")):
        for i, j, c in T.grid(1, 64, 256):
            with T.sblock("y"):
                vi, vj, vc = T.axis.remap("SSR", [i, j, c])
                with T.init():
                    y[vi, vj] = b[vj]
                y[vi, vj] = y[vi, vj] + T.Cast("float32", x[vi, vc]) * T.Cast(
                    "float32", T.bitwise_and(T.shift_right(w[vj, vc // 2], T.Cast("uint8", vc % 2 * 4)), T.uint8(15)))
    with pytest.raises(ClusterError, match="starts from 0"):
        find_packed_gemv(biased)


def _run_llvm(func, inputs):
    lib = tvm.compile(tvm.IRModule({"main": func}), target=LLVM)
    out = tvm.runtime.tensor(np.zeros((64,), "float32"))
    lib["main"](*(tvm.runtime.tensor(a) for a in inputs), out)
    return out.numpy()


def test_conversions_by_bits_are_exact():
    @T.prim_func(s_tir=True)
    def convert(w: T.Buffer((64,), "uint32"), z: T.Buffer((64,), "uint8"), q: T.Buffer((64,), "int8"),
                y: T.Buffer((64,), "float32")):
        for i in range(64):
            with T.sblock("y"):
                vi = T.axis.spatial(64, i)
                y[vi] = ((T.Cast("float32", T.bitwise_and(T.shift_right(w[vi], T.uint32(4)), T.uint32(15)))
                          - T.float32(7)) * T.Cast("float32", T.bitwise_and(w[vi], T.uint32(1023)))
                         + (T.Cast("float32", T.bitwise_and(w[vi], T.uint32(255))) - T.Cast("float32", z[vi]))
                         + (T.Cast("float32", q[vi]) + T.float32(3)) * T.float32(0.5))
    rewritten = int_casts_by_bits(convert)
    assert "reinterpret" in rewritten.script() and "Cast(\"float32\"" not in rewritten.script()
    rng = np.random.default_rng(0)
    inputs = [rng.integers(0, 2 ** 32, 64, dtype=np.uint64).astype(np.uint32),
              rng.integers(0, 256, 64).astype(np.uint8), np.concatenate([[-128, 127], rng.integers(-128, 128, 62)]).astype(np.int8)]
    np.testing.assert_array_equal(_run_llvm(rewritten, inputs), _run_llvm(convert, inputs))


def test_an_unbounded_or_wrapping_conversion_stays():
    @T.prim_func(s_tir=True)
    def convert(w: T.Buffer((64,), "int32"), u: T.Buffer((64,), "uint32"), b: T.Buffer((64,), "int8"),
                y: T.Buffer((64,), "float32")):
        for i in range(64):
            with T.sblock("y"):
                vi = T.axis.spatial(64, i)
                y[vi] = (T.Cast("float32", w[vi]) + T.Cast("float32", T.bitwise_and(w[vi], 15))
                         + T.Cast("float32", T.bitwise_and(u[vi], T.uint32(15)) - T.uint32(1))
                         + T.Cast("float32", T.bitwise_and(b[vi], T.int8(127)) + T.int8(10)))
    script = int_casts_by_bits(convert).script()
    assert script.count("reinterpret") == 1 and 'T.Cast("float32", w[vi])' in script


@pytest.mark.parametrize("form", sorted(FORMS))
def test_its_kernels_load_16_byte_vectors_and_assemble(form, assemble):
    found = _found(FORMS[form]())
    sch = schedule_packed_gemv(found, default_config(found))
    source = tvm.compile(sch.mod, target=TARGET).mod.imports[0].inspect_source()
    assert re.search(r"\*\(u?int4\*\)\((w_packed|qw|w_int8)_ptr", source)  # 16-byte vectors
    assert "= *(uint4*)(x_ptr" in source
    assert "(float)((" not in source  # no unpacked code converted by the conversion instruction
    assemble(source, f"packed_{form}")


def _inputs(func, rng):
    """Random inputs for the parameters of ``func`` but its last: codes of every bit pattern,
    scales keeping the sums near 1, zero points near the codes' middle."""
    arrays = []
    for param in list(func.params)[:-1]:
        shape, dtype = [int(e) for e in param.ty.shape], str(param.ty.dtype)
        if dtype.startswith("uint") and "zero" not in param.name:
            bits = np.iinfo(dtype).bits
            arrays.append(rng.integers(0, 2 ** bits, shape, dtype=np.uint64).astype(dtype))
        elif dtype.startswith("uint"):
            arrays.append(rng.integers(6, 10, shape).astype(dtype))
        elif dtype == "int8":
            arrays.append(rng.integers(-128, 128, shape).astype(dtype))
        elif param.name == "bias":
            arrays.append(rng.uniform(-1, 1, shape).astype(dtype))
        elif "scale" in param.name:
            arrays.append((rng.uniform(0.5, 1.5, shape) / 64).astype(dtype))
        else:
            arrays.append(rng.uniform(-1, 1, shape).astype(dtype))
    return arrays


def _codes(words: np.ndarray, per_word: int) -> np.ndarray:
    """The codes packed in ``words``, low bits first, a row's in order."""
    bits = 32 // per_word if words.dtype == np.uint32 else 8 // per_word
    shifts = np.arange(per_word, dtype=np.uint64) * bits
    codes = (words[..., None].astype(np.uint64) >> shifts) & (2 ** bits - 1)
    return codes.reshape(words.shape[0], -1).astype(np.float64)


def _reference(form: str, inputs: list) -> np.ndarray:
    """The product in float64 from the inputs, dequantized as each form defines it."""
    if form.startswith("int8"):
        x, w, scale = inputs
        w = w.astype(np.float64) * scale.astype(np.float64)[:, None]
    elif form.startswith("mlc"):
        x, wq, sc, *bias = inputs
        w = (_codes(wq, 8) - 7) * np.repeat(sc.astype(np.float64), wq.shape[1] * 8 // sc.shape[1], axis=1)
        return x.astype(np.float64).reshape(-1, x.shape[-1]) @ w.T + sum(b.astype(np.float64) for b in bias)
    else:
        x, qw, sc, z = inputs
        group = qw.shape[1] * 2 // sc.shape[1]
        w = (_codes(qw, 2) - np.repeat(z.astype(np.float64), group, 1)) * np.repeat(sc.astype(np.float64), group, 1)
    return x.astype(np.float64).reshape(-1, x.shape[-1]) @ w.T


@pytest.mark.gpu
@pytest.mark.parametrize("form", sorted(FORMS))
def test_outputs_match_the_function_on_the_gpu(form):
    func = FORMS[form]()
    rng = np.random.default_rng(7)
    inputs = _inputs(func, rng)
    lib = tvm_dsm.build(func, TARGET)
    dev = tvm.cuda(0)
    shape = [int(e) for e in func.params[-1].ty.shape]
    out = tvm.runtime.tensor(np.full(shape, np.nan, "float16"), dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in inputs), out)
    got = out.numpy().astype(np.float64)
    assert not np.isnan(got).any()
    ref = _reference(form, inputs).reshape(got.shape)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
