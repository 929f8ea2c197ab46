"""TIR expressions to SymPy and back, for the separability proofs of cascaded reductions.

Only the element-wise arithmetic that reductions apply to their operands is translated; anything
else raises :class:`Unsupported` with the construct's name, which becomes the reason a group is
left unfused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import sympy
import tvm
from sympy.core.function import AppliedUndef
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
_ROUNDED_PREFIX = "rounded_to_"


class ToSympy:
    """Translate a TIR expression; ``leaf`` names each buffer load (or returns None to reject it)
    and, through its ``opaque`` method, each select (a mask: one more operand as far as the proof
    is concerned, or Unsupported if it reads a level's result); ``variable``, where given, names
    each loop variable (a value that depends on the position, as a bias of ``j - i`` does).

    ``rounding_casts`` collects casts to a narrower float type: the fused form rounds at other
    points than the unfused one, so a group containing them is only approximately equal. With
    ``round_whole_terms``, such a cast of an operand that reads the data alone, or the levels'
    results alone, stays in the expression as :func:`rounded` of it: a fused form computes that
    operand whole (a G(x) or an H(y) term) and rounds it where the unfused function does,
    overflow to inf included. Otherwise the cast is dropped (where its operand overflows the
    narrower type, the fused form, computing it wider, stays finite).
    """

    def __init__(self, leaf: Callable[[tvm.ir.TensorLoad], sympy.Symbol], round_whole_terms: bool = False,
                 variable: Callable[[tirx.Var], sympy.Symbol] | None = None):
        self.leaf = leaf
        self.round_whole_terms = round_whole_terms
        self.variable = variable
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
            if self.variable is None:
                raise Unsupported(f"loop index {e.name} in the value")
            return self.variable(e)
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
            value = self(e.value)
            if _FLOAT_BITS.get(target, 64) < _FLOAT_BITS.get(source, 0) or target.startswith("float8"):
                self.rounding_casts.append(f"{source} -> {target}")
                if self.round_whole_terms and not _mixes_data_and_levels(value):
                    return rounded(target)(value)
            return value
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


def simplify(expr: sympy.Expr) -> sympy.Expr:
    """``sympy.simplify(expr)``, computed once per expression. A function's proofs run again each
    time it is matched (by each family that looks at it, by the pass form after the function
    form, by every build that plans it), and simplify is most of a proof's time. Keyed by
    ``srepr``, which tells apart what ``==`` may not (a Float from an equal Integer before SymPy
    1.13)."""
    return _simplify_once(sympy.srepr(expr), expr)


@functools.lru_cache(maxsize=4096)
def _simplify_once(key: str, expr: sympy.Expr) -> sympy.Expr:
    return sympy.simplify(expr)


def rounded(dtype: str) -> sympy.Function:
    """The rounding of a value to ``dtype`` (and back), as a SymPy function of it."""
    return sympy.Function(f"{_ROUNDED_PREFIX}{dtype}")


def rounding_of(e: sympy.Expr) -> str | None:
    """The dtype ``e`` rounds to, if it is a :func:`rounded` value."""
    name = getattr(e.func, "__name__", "")
    return name.removeprefix(_ROUNDED_PREFIX) if isinstance(e, AppliedUndef) and name.startswith(_ROUNDED_PREFIX) else None


def has_rounding(e: sympy.Expr) -> bool:
    """Whether ``e`` holds a :func:`rounded` value."""
    return any(rounding_of(f) for f in e.atoms(AppliedUndef))


def _mixes_data_and_levels(e: sympy.Expr) -> bool:
    """Whether ``e`` reads both reduced data (x<n>) and a level's result (y<n>)."""
    names = {s.name[0] for s in e.free_symbols}
    return {"x", "y"} <= names


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
        dtype = rounding_of(e)
        if dtype is not None:
            return tirx.Cast(self.dtype, tirx.Cast(dtype, self(e.args[0])))
        for function, emit in _EMIT_UNARY.items():
            if isinstance(e, function):
                return emit(self(e.args[0]))
        raise Unsupported(f"cannot emit {type(e).__name__} back to TIR")


def _fold(op, items: list):
    result = items[0]
    for item in items[1:]:
        result = op(result, item)
    return result
