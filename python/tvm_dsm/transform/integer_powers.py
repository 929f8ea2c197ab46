"""Powers with a small integer exponent as products (``pow(x, 3.0)`` as ``x * x * x``).

TVM lowers ``pow`` to CUDA's ``powf`` (16-bit types through fp32), and the CUDA compile takes
``--use_fast_math`` (TVM's NVRTC default), under which ``powf`` is ``exp2(y * log2(x))``: NaN for
every negative ``x``, whatever ``y``. A model's ``x ** 3`` (the tanh GELU of T5 and GPT-J,
``0.5 * x * (1 + tanh(c * (x + 0.044715 * x ** 3)))``) or ``x ** 2`` then returns NaN where
torch returns the cube. A product is exact in sign and as accurate (16-bit operands multiplied
in fp32 and rounded once, as ``powf`` on their fp32 values would be).
"""

from __future__ import annotations

import functools
import math

import tvm
import tvm_ffi
from tvm import tirx

#: The largest exponent magnitude written as a product (up to 7 multiplies).
MOST = 8
_POW = tvm.ir.Op.get("tirx.pow")


def _integer_exponent(expr) -> int | None:
    value = expr.value if isinstance(expr, (tirx.IntImm, tirx.FloatImm)) else None
    if value is None or not math.isfinite(value) or value != int(value) or not 0 < abs(int(value)) <= MOST:
        return None
    return int(value)


def _as_product(call):
    if not call.op.same_as(_POW):
        return call
    n = _integer_exponent(call.args[1])
    dtype = str(call.args[0].ty.dtype)
    if n is None or not dtype.startswith(("float", "bfloat")):  # pow of floats only (an integer's 1 / x^n is not)
        return call
    wide = "float32" if dtype in ("float16", "bfloat16") else dtype
    base = call.args[0] if wide == dtype else tirx.Cast(wide, call.args[0])
    product = functools.reduce(lambda a, b: a * b, [base] * abs(n))
    if n < 0:
        product = tirx.const(1, wide) / product
    return product if wide == dtype else tirx.Cast(dtype, product)


def integer_powers(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every ``pow(x, n)``, ``n`` a constant integer of magnitude 1 to
    :data:`MOST`, written as a product of ``x`` (its reciprocal for a negative ``n``)."""
    return func.with_body(tvm_ffi.structural_map(func.body, [(tvm.ir.Call, _as_product)]))


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.IntegerPowers")
def IntegerPowers(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:  # noqa: N802 - TVM pass style
    """Pass form of :func:`integer_powers`."""
    return integer_powers(func)
