"""How close to a float64 reference a result must be to count as correct.

The bound is that of the least precise dtype the result passes through: its inputs' (fp16 inputs
with fp32 accumulation: 2e-3; fp32: 1e-5) or an output stored narrower than them. An output
rounded to fp8 e4m3 from fp32 arithmetic cannot match float64 to fp32's bound: where the fp32
value lies within its own roundoff of an fp8 rounding boundary, it rounds to the other neighbour
(one fp8 step, 2^-3 relative), a few elements in a million.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Relative L2 error bounds against float64 per dtype: bf16 carries 8 mantissa bits (unit
#: roundoff 2^-8), so its bound is that roundoff, not fp16's; fp8 inputs have exact products and
#: fp32 sums, fp8 outputs the rare one-step rounding flips described above.
TOLERANCE = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2 ** -8, "float8_e4m3fn": 2e-3}


def tolerance(dtypes: Iterable[str]) -> float:
    """The relative error bound of a result whose inputs and floating-point outputs have
    ``dtypes`` (integer ones, such as expert indices, must match exactly and add none);
    ValueError where none of them has a bound."""
    dtypes = list(dtypes)
    bounds = [TOLERANCE[d] for d in dtypes if d in TOLERANCE]
    if not bounds:
        raise ValueError(f"no tolerance for a result of {sorted(set(dtypes))}: one of {sorted(TOLERANCE)} expected")
    return max(bounds)
