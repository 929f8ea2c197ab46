"""Powers of a small integer exponent become products (tvm_dsm.transform.integer_powers): under
fast math CUDA's ``powf`` is NaN for a negative base, which turned the tanh GELU of T5 and GPT-J
(``x ** 3``) into NaN on the GPU."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import tvm
from tvm import te, tirx

import tvm_dsm
from conftest import TARGET
from tvm_dsm.ir import find_all
from tvm_dsm.transform.integer_powers import integer_powers


def _gelu_tanh(rows: int = 64, cols: int = 1024, dtype: str = "float16"):
    """``0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`` as T5 and GPT-J write it."""
    x = te.placeholder((rows, cols), dtype, name="x")
    c = math.sqrt(2 / math.pi)

    def gelu(i, j):
        v = x[i, j]
        cube = tirx.power(v, tirx.const(3.0, dtype))
        return tirx.const(0.5, dtype) * v * (tirx.const(1.0, dtype) + te.tanh(tirx.const(c, dtype) * (
            v + tirx.const(0.044715, dtype) * cube)))

    return te.create_prim_func([x, te.compute((rows, cols), gelu, name="gelu")])


def _pows(func) -> list:
    return find_all(func.body, tvm.ir.Call, lambda c: c.op.same_as(tvm.ir.Op.get("tirx.pow")))


def test_integer_exponents_become_products_and_others_stay():
    x = te.placeholder((8,), "float32", name="x")
    out = te.compute((8,), lambda i: tirx.power(x[i], 2.0) + tirx.power(x[i], -3.0) + tirx.power(x[i], 2.5)
                     + tirx.power(x[i], 9.0) + tirx.power(x[i], math.inf), name="out")
    func = integer_powers(te.create_prim_func([x, out]))
    assert [float(c.args[1].value) for c in _pows(func)] == [2.5, 9.0, math.inf]  # not integers, or past MOST
    assert not _pows(integer_powers(_gelu_tanh()))


def test_the_cuda_of_a_tanh_gelu_computes_no_pow():
    source = tvm_dsm.build(_gelu_tanh(), TARGET).mod.imports[0].inspect_source()
    assert "tanh" in source and not re.search(r"\b(hpow|powf?)\(", source)  # TVM's preamble defines hpow


@pytest.mark.gpu
def test_gpu_a_tanh_gelu_of_negative_inputs_is_finite_and_right():
    func = _gelu_tanh()
    lib = tvm_dsm.build(func, TARGET)
    dev = tvm.cuda(0)
    x = (np.random.default_rng().standard_normal((64, 1024)) * 3).astype("float16")
    out = tvm.runtime.tensor(np.full((64, 1024), np.nan, "float16"), dev)
    lib(tvm.runtime.tensor(x, dev), out)
    v = x.astype(np.float64)
    want = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    got = out.numpy().astype(np.float64)
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3
