"""TIR expressions to SymPy and back, for the separability proofs of cascaded reductions.

Only the element-wise arithmetic that reductions apply to their operands is translated; anything
else raises :class:`Unsupported` with the construct's name, which becomes the reason a group is
left unfused.
"""

from __future__ import annotations

from collections.abc import Callable

import sympy
import tvm
from tvm import tirx


class Unsupported(Exception):
    """An expression outside the translatable subset (the message names the construct)."""


_UNARY = {
    "tirx.exp": sympy.exp,
    "tirx.log": sympy.log,
    "tirx.sqrt": sympy.sqrt,
    "tirx.rsqrt": lambda a: 1 / sympy.sqrt(a),
    "tirx.tanh": sympy.tanh,
    "tirx.sin": sympy.sin,
    "tirx.cos": sympy.cos,
    "tirx.fabs": sympy.Abs,
    "tirx.sigmoid": lambda a: 1 / (1 + sympy.exp(-a)),
}
#: SymPy functions of one argument and their TIR form (the inverse of part of _UNARY).
_EMIT_UNARY = {sympy.Abs: tirx.abs, sympy.sin: tirx.sin, sympy.cos: tirx.cos, sympy.tanh: tirx.tanh}
_FLOAT_BITS = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}


class ToSympy:
    """Translate a TIR expression; ``leaf`` names each buffer load (or returns None to reject it)
    and, through its ``opaque`` method, each select (a mask: one more operand as far as the proof
    is concerned, or Unsupported if it reads a level's result).

    ``rounding_casts`` collects casts to a narrower float type: the fused form rounds at other
    points than the unfused one, so a group containing them is only approximately equal.
    """

    def __init__(self, leaf: Callable[[tvm.ir.TensorLoad], sympy.Symbol]):
        self.leaf = leaf
        self.rounding_casts: list[str] = []

    def __call__(self, e) -> sympy.Expr:  # noqa: C901 - one case per node type
        if isinstance(e, tvm.ir.TensorLoad):
            return self.leaf(e)
        if isinstance(e, (tirx.IntImm, tirx.FloatImm)):
            value = e.value
            if isinstance(e, tirx.FloatImm) and abs(value) == float("inf"):
                return sympy.oo if value > 0 else -sympy.oo
            return sympy.Integer(value) if isinstance(e, tirx.IntImm) else sympy.Float(value)
        if isinstance(e, tirx.Var):  # the value would move with the loop: no separable form
            raise Unsupported(f"loop index {e.name} in the value")
        binary = {
            tirx.Add: lambda a, b: a + b,
            tirx.Sub: lambda a, b: a - b,
            tirx.Mul: lambda a, b: a * b,
            tirx.Div: lambda a, b: a / b,
            tirx.Max: sympy.Max,
            tirx.Min: sympy.Min,
        }
        for node, op in binary.items():
            if isinstance(e, node):
                return op(self(e.a), self(e.b))
        if isinstance(e, tirx.Cast):
            source = str(e.value.ty.dtype) if hasattr(e.value, "ty") else ""
            target = str(e.ty.dtype) if hasattr(e, "ty") else ""
            if _FLOAT_BITS.get(target, 64) < _FLOAT_BITS.get(source, 0) or target.startswith("float8"):
                self.rounding_casts.append(f"{source} -> {target}")
            return self(e.value)
        if isinstance(e, tirx.Select):
            return self.leaf.opaque(e)
        if isinstance(e, tvm.ir.Call):
            name = e.op.name
            if name.endswith("if_then_else"):  # prim.if_then_else in TVM 0.27
                return self.leaf.opaque(e)
            if name in _UNARY and len(e.args) == 1:
                return _UNARY[name](self(e.args[0]))
            if name == "tirx.pow":
                return self(e.args[0]) ** self(e.args[1])
            raise Unsupported(f"call to {name}")
        raise Unsupported(f"{type(e).__name__} expression")


class ToTIR:
    """Translate a SymPy expression back to TIR of ``dtype``; ``symbols`` maps names to TIR."""

    def __init__(self, symbols: dict[str, tvm.ir.PrimExpr], dtype: str):
        self.symbols = symbols
        self.dtype = dtype

    def __call__(self, e: sympy.Expr):  # noqa: C901 - one case per node type
        if e.is_Symbol:
            return self.symbols[e.name]
        if e.is_Number:
            if e is sympy.oo or e is -sympy.oo:
                return tirx.const(float("inf") if e is sympy.oo else float("-inf"), self.dtype)
            return tirx.const(float(e), self.dtype)
        if e.is_Add:
            terms = [self(a) for a in e.args]
            return _fold(lambda a, b: a + b, terms)
        if e.is_Mul:
            return _fold(lambda a, b: a * b, [self(a) for a in e.args])
        if e.is_Pow:
            base, exponent = e.args
            if exponent.is_Integer:
                n = int(exponent)
                power = _fold(lambda a, b: a * b, [self(base)] * abs(n)) if n else tirx.const(1.0, self.dtype)
                return power if n >= 0 else tirx.const(1.0, self.dtype) / power
            if exponent == sympy.Rational(1, 2):
                return tirx.sqrt(self(base))
            if exponent == sympy.Rational(-1, 2):
                return tirx.rsqrt(self(base))
            return tirx.pow(self(base), self(exponent))
        if isinstance(e, sympy.exp):
            return tirx.exp(self(e.args[0]))
        if isinstance(e, sympy.log):
            return tirx.log(self(e.args[0]))
        if isinstance(e, (sympy.Max, sympy.Min)):
            op = tirx.max if isinstance(e, sympy.Max) else tirx.min
            return _fold(op, [self(a) for a in e.args])
        for function, emit in _EMIT_UNARY.items():
            if isinstance(e, function):
                return emit(self(e.args[0]))
        raise Unsupported(f"cannot emit {type(e).__name__} back to TIR")


def _fold(op, items: list):
    result = items[0]
    for item in items[1:]:
        result = op(result, item)
    return result
