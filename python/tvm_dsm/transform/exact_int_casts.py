"""Small integers converted to fp32 by their bits instead of a conversion instruction.

A dequantizing kernel converts every unpacked weight (a 4-bit code, a zero point) to float.
The conversion instruction (``I2F``) issues at a quarter of the fp32 rate on Hopper, and a GEMV
over 4-bit weights converts 32 values for every 16 bytes it loads, which makes the kernel
arithmetic-bound well before HBM is. An integer ``v`` in ``[0, 2^23)`` is converted exactly by
placing its bits in the mantissa of ``2^23``: ``reinterpret_f32(v | 0x4B000000) - 2^23``, a
logical operation and a subtraction at full rate. A signed integer of fewer than ``2^23``
values (an int8 weight) is first shifted to start at 0, the shift subtracted with ``2^23``.

A constant added to or subtracted from the converted value (the ``- 7`` of a symmetric 4-bit
code) joins that subtraction where the sum subtracted stays an integer below ``2^24`` (every
value involved is then an integer fp32 holds exactly). The difference of two converted values
of one shift (a code less its zero point) is the difference of their bits as floats, exact
since both lie in ``[2^23, 2^24)``. :func:`int_casts_by_bits` rewrites each conversion whose
operand's range the analyzer bounds so, within its type's range (an expression that may wrap
around, ``(w & 15) - 1`` in uint32, is left as written).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.sym import Analyzer

#: 2^23: the fp32 whose mantissa an integer below it fills exactly
MANTISSA = 1 << 23
_EXPONENT_BITS = 0x4B000000  # the bits of 2^23 as an fp32


def _converted_bits(cast, analyzer: Analyzer):
    """(``reinterpret_f32((v + shift) | bits of 2^23)``, ``shift``) where ``cast`` converts an
    integer ``v`` to fp32 whose range the analyzer bounds to fewer than 2^23 values: ``shift``
    moves its least value to 0 (a signed int8 weight's -128), so the float is ``2^23 + v +
    shift``; else None."""
    if not (isinstance(cast, tirx.Cast) and str(cast.ty) == "float32"
            and str(cast.value.ty).startswith(("int", "uint"))):
        return None
    bound = analyzer.const_int_bound(cast.value)
    dtype = tvm.DataType(str(cast.value.ty))
    lowest = -(1 << (dtype.bits - 1)) if str(cast.value.ty).startswith("int") else 0
    if bound.min_value < lowest or bound.max_value >= lowest + (1 << dtype.bits):
        return None  # the analyzer's bound is of unbounded arithmetic: the type's own may wrap
    if bound.max_value - min(bound.min_value, 0) >= MANTISSA or bound.min_value <= -MANTISSA:
        return None
    shift = max(0, -bound.min_value)
    value = cast.value if shift == 0 else tirx.Cast("int32", cast.value) + tirx.const(shift, "int32")
    bits = tirx.Cast("uint32", value) | tirx.const(_EXPONENT_BITS, "uint32")
    return tirx.reinterpret("float32", bits), shift


def _integer_constant(expr) -> float | None:
    """The value of an fp32 constant that is an integer below 2^23 in magnitude, else None."""
    if isinstance(expr, tirx.FloatImm) and float(expr.value).is_integer() and abs(expr.value) < MANTISSA:
        return float(expr.value)
    return None


def int_casts_by_bits(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each fp32 conversion of a bounded integer made by its bits (see
    the module), a constant added or subtracted right after it folded into the subtraction, the
    difference of two such conversions the difference of their bits."""
    analyzer = Analyzer()

    def offset(expr):
        """(the conversion's bits, the constant to subtract) of ``cast``, ``cast + c`` or
        ``cast - c``; None for anything else."""
        if isinstance(expr, (tirx.Add, tirx.Sub)):
            constant = _integer_constant(expr.b)
            converted = _converted_bits(expr.a, analyzer)
            if constant is not None and converted is not None:
                bits, shift = converted
                subtracted = MANTISSA + shift + (constant if isinstance(expr, tirx.Sub) else -constant)
                if abs(subtracted) < 2 * MANTISSA:  # an integer fp32 holds exactly
                    return bits, subtracted
        converted = _converted_bits(expr, analyzer)
        return None if converted is None else (converted[0], MANTISSA + converted[1])

    def rewrite(expr):
        if isinstance(expr, tirx.Sub):
            first, second = (_converted_bits(e, analyzer) for e in (expr.a, expr.b))
            if first is not None and second is not None and first[1] == second[1]:
                return first[0] - second[0]
        found = offset(expr)
        if found is None:
            return expr
        bits, subtracted = found
        return bits - tirx.const(subtracted, "float32")

    mapped = tvm_ffi.structural_map(func.body, [(tirx.Add, rewrite), (tirx.Sub, rewrite), (tirx.Cast, rewrite)],
                                    order="pre")
    return func.with_body(mapped)
