"""A product operand computed inside the product (a weight-only int8 layer's dequantization,
W8A16) is computed into a tensor first: an element-wise operator and a GEMM, not dlight's
fallback for the whole function (10 ms on the H200 where torch takes 0.1 ms)."""

from __future__ import annotations

import re
import numpy as np
import pytest
import tvm
from tvm import te

import tvm_dsm
from tvm_dsm.transform.computed_operands import operands_apart

from conftest import TARGET


def _w8a16(m: int, k: int, n: int):
    """``x @ (w * scale)^T`` with the dequantization inside the product, as a user writes it."""
    x = te.placeholder((m, k), "float16", name="x")
    w = te.placeholder((n, k), "int8", name="w")
    s = te.placeholder((n,), "float16", name="scale")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((m, n), lambda i, j: te.sum(
        x[i, r].astype("float32") * (w[j, r].astype("float16") * s[j]).astype("float32"), axis=r), name="y")
    return te.create_prim_func([x, w, s, te.compute((m, n), lambda i, j: y[i, j].astype("float16"), name="o")])


def _inputs(rng, m, k, n):
    return [rng.uniform(-1, 1, (m, k)).astype(np.float16), rng.integers(-127, 128, (n, k)).astype(np.int8),
            (rng.uniform(0.5, 1.5, n) / 127 / np.sqrt(k)).astype(np.float16)]


def _reference(x, w, s):
    return x.astype(np.float64) @ (w.astype(np.float64) * s.astype(np.float64)[:, None]).T


def _run_llvm(func, arrays, out_shape):
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, np.float16), dev)
    tvm.compile(func, target="llvm")["main"](*(tvm.runtime.tensor(a, dev) for a in arrays), out)
    return out.numpy()


def _apart_with_the_same_numbers(func, arrays, out_shape):
    """``operands_apart(func)``, checked to exist and to compute ``func``'s output bit for bit
    on llvm over ``arrays``; with that output."""
    apart = operands_apart(func)
    assert apart is not None
    out = _run_llvm(apart, arrays, out_shape)
    np.testing.assert_array_equal(out, _run_llvm(func, arrays, out_shape))
    return apart, out


def test_the_operand_computed_first_gives_the_same_numbers():
    arrays = _inputs(np.random.default_rng(0), 33, 64, 48)
    _, out = _apart_with_the_same_numbers(_w8a16(33, 64, 48), arrays, (33, 48))
    assert np.linalg.norm(out - _reference(*arrays)) / np.linalg.norm(_reference(*arrays)) < 2e-3


def test_products_of_plain_loads_are_left_as_written():
    x, w = te.placeholder((8, 16), "float16", name="x"), te.placeholder((4, 16), "float16", name="w")
    r = te.reduce_axis((0, 16), name="r")
    y = te.compute((8, 4), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r))
    assert operands_apart(te.create_prim_func([x, w, y])) is None


def test_a_w8a16_layer_builds_a_dequantization_and_a_tensor_core_gemm():
    source = tvm_dsm.build(_w8a16(256, 3584, 18944), TARGET).mod.imports[0].inspect_source()
    assert "wgmma" in source


def _gpu_error(func, arrays, reference) -> float:
    """``func`` built by tvm-dsm and run on the GPU over ``arrays``: its fp16 output's relative
    error from ``reference`` (float64)."""
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full(reference.shape, np.nan, np.float16), dev)
    tvm_dsm.build(func, TARGET)(*(tvm.runtime.tensor(a, dev) for a in arrays), out)
    return np.linalg.norm(out.numpy() - reference) / np.linalg.norm(reference)


@pytest.mark.gpu
def test_gpu_a_w8a16_layer_matches_float64():
    arrays = _inputs(np.random.default_rng(1), 100, 512, 384)
    assert _gpu_error(_w8a16(100, 512, 384), arrays, _reference(*arrays)) < 2e-3


def _w8a8_kn(m: int, k: int, n: int):
    """SmoothQuant's W8A8 layer with its weight stored ``[K, N]`` (``x @ W``): an int32 product
    of int8 operands, scaled per token and per channel into fp16."""
    x, w = te.placeholder((m, k), "int8", name="x"), te.placeholder((k, n), "int8", name="w")
    sx, sw = te.placeholder((m, 1), "float32", name="sx"), te.placeholder((n,), "float32", name="sw")
    r = te.reduce_axis((0, k), name="r")
    acc = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("int32") * w[r, j].astype("int32"), axis=r), name="acc")
    return te.create_prim_func([x, w, sx, sw, te.compute(
        (m, n), lambda i, j: (acc[i, j].astype("float32") * sx[i, 0] * sw[j]).astype("float16"), name="o")])


def _w8a8_inputs(rng, m, k, n):
    return [rng.integers(-127, 128, (m, k)).astype(np.int8), rng.integers(-127, 128, (k, n)).astype(np.int8),
            rng.uniform(0.5, 1.5, (m, 1)).astype(np.float32) / 127, rng.uniform(0.5, 1.5, n).astype(np.float32) / 127]


def _w8a8_reference(x, w, sx, sw):
    return (x.astype(np.float64) @ w.astype(np.float64)) * sx * sw


def test_an_int8_weight_stored_k_by_n_is_copied_transposed_with_the_same_numbers():
    arrays = _w8a8_inputs(np.random.default_rng(2), 9, 64, 24)
    apart, _ = _apart_with_the_same_numbers(_w8a8_kn(9, 64, 24), arrays, (9, 24))
    copy = [b for b in tvm_dsm.ir.find_all(apart.body, tvm.s_tir.SBlock) if b.name_hint.endswith("_operand")]
    assert [list(b.writes[0].source.ty.shape) for b in copy] == [[24, 64]]  # [N, K]


def test_an_int8_layer_over_a_k_by_n_weight_builds_a_transpose_and_a_tensor_core_gemm():
    source = tvm_dsm.build(_w8a8_kn(256, 1024, 512), TARGET).mod.imports[0].inspect_source()
    kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)", source))
    assert len(kernels) == 2 and "mma" in source and "w_shared" in source  # the copy tiled through shared memory


@pytest.mark.gpu
def test_gpu_an_int8_layer_over_a_k_by_n_weight_matches_float64():
    arrays = _w8a8_inputs(np.random.default_rng(3), 100, 512, 384)
    assert _gpu_error(_w8a8_kn(100, 512, 384), arrays, _w8a8_reference(*arrays)) < 2e-3


def _weight_gradient(m: int, n: int, k: int):
    """A linear layer's weight gradient ``dW = dy^T @ x``: both operands read along the tokens
    on their rows, the first one ``[M, N]`` where the tensor cores need it ``[N, M]``."""
    dy, x = te.placeholder((m, n), "float16", name="dy"), te.placeholder((m, k), "float16", name="x")
    t = te.reduce_axis((0, m), name="t")
    dw = te.compute((n, k), lambda i, j: te.sum(dy[t, i].astype("float32") * x[t, j].astype("float32"), axis=t),
                    name="dw")
    return te.create_prim_func([dy, x, te.compute((n, k), lambda i, j: dw[i, j].astype("float16"), name="o")])


def _gradient_inputs(rng, m, n, k):
    return [rng.uniform(-1, 1, (m, n)).astype(np.float16), rng.uniform(-1, 1, (m, k)).astype(np.float16)]


def test_the_output_rows_operand_read_k_by_m_is_copied_transposed_with_the_same_numbers():
    arrays = _gradient_inputs(np.random.default_rng(4), 40, 24, 32)
    apart, _ = _apart_with_the_same_numbers(_weight_gradient(40, 24, 32), arrays, (24, 32))
    copy = [b for b in tvm_dsm.ir.find_all(apart.body, tvm.s_tir.SBlock) if b.name_hint.endswith("_operand")]
    assert [list(b.writes[0].source.ty.shape) for b in copy] == [[24, 40]]  # dy^T, [N, M]: x stays [M, K]


def test_an_fp32_weight_gradient_is_left_as_written():
    """The copy is for the 16-bit warpgroup MMAs, which read only the second operand MN-major."""
    dy, x = te.placeholder((64, 32), "float32", name="dy"), te.placeholder((64, 48), "float32", name="x")
    t = te.reduce_axis((0, 64), name="t")
    assert operands_apart(te.create_prim_func([dy, x, te.compute(
        (32, 48), lambda i, j: te.sum(dy[t, i] * x[t, j], axis=t))])) is None


def test_a_weight_gradient_builds_a_transpose_and_a_warpgroup_gemm():
    source = tvm_dsm.build(_weight_gradient(2048, 512, 1024), TARGET).mod.imports[0].inspect_source()
    kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)", source))
    assert len(kernels) == 2 and "wgmma" in source


@pytest.mark.gpu
def test_gpu_a_weight_gradient_matches_float64():
    arrays = _gradient_inputs(np.random.default_rng(5), 1000, 384, 512)
    reference = arrays[0].astype(np.float64).T @ arrays[1].astype(np.float64)
    assert _gpu_error(_weight_gradient(1000, 384, 512), arrays, reference) < 2e-3


def _masked_operand(m: int, k: int, n: int):
    """The operand reads the row variable too (a mask): no [N, K] tensor holds it."""
    x = te.placeholder((m, k), "float16", name="x")
    w = te.placeholder((n, k), "int8", name="w")
    r = te.reduce_axis((0, k), name="r")
    y = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("float32") * te.if_then_else(
        r <= i, w[j, r].astype("float16"), te.const(0, "float16")).astype("float32"), axis=r), name="y")
    return te.create_prim_func([x, w, y])


def _from_four(m: int, k: int, n: int):
    x, w = te.placeholder((m, k), "float16", name="x"), te.placeholder((n, k), "int8", name="w")
    r = te.reduce_axis((4, k), name="r")
    y = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("float32") * (
        w[j, r].astype("float16") * te.const(2, "float16")).astype("float32"), axis=r), name="y")
    return te.create_prim_func([x, w, y])


@pytest.mark.parametrize("func", [_masked_operand(9, 12, 8), _from_four(16, 16, 12), _w8a16(1, 4096, 4096)],
                         ids=["reads_the_row", "axis_from_4", "one_row"])
def test_operands_it_cannot_hold_or_should_not_write_out_are_left_as_written(func):
    assert operands_apart(func) is None
    tvm_dsm.driver.schedule(func)  # and the function still schedules
