"""A seeded, grammar-based fuzzer of FuseCascadedReductions (RedFuser) on llvm.

Each case is drawn from ``(seed, index)`` alone: a function of 2-4 reduction levels (sum / max /
min / top-k) over one axis of ``x[rows..., K]``, later levels reading earlier levels' results,
whose element terms are built from a small grammar: loads of the data (``x``, ``b[rows..., k]``,
``w[k]``, the index ``k`` cast to float), constants, ``exp``, ``log``, ``abs``, ``sqrt``, ``sin``,
integer and fractional powers, products, quotients, sums, differences, negation, a select over
the data (a mask) or over a level's result, rounding casts through fp16 and widening casts of
fp16 / fp32 inputs. Shapes: one or two row axes (``batch``), a level with an extra output axis
``j`` reading ``v[k, j]`` (a GEMM-like level), an element-wise producer stage the pass inlines,
an element-wise epilogue on the levels' results, levels that are not outputs. The pass options
(``parts``, ``vector``, ``allow_approximate``) are drawn too. Functions are fp32 or fp64.

Terms are valid math on every input profile: each node carries a bound on its magnitude (inputs
are at most 1e3 in magnitude) and, for positive terms, a lower bound, so that ``log`` and ``sqrt``
read provably positive (non-negative) terms, quotients divide by terms bounded away from zero,
``exp`` reads a bounded argument or one shifted by the row max (``exp(a - max a)``), and no term
overflows its dtype.

A case builds the unfused and the fused function for llvm, runs both on four input profiles
(normal; mixed signs with zeros and values up to 1e3; log-uniform magnitudes 1e-3..1e3 with
zeros; positive) and compares every output: equal NaN / inf positions, and elsewhere
``|fused - unfused| <= 64 * spread + rtol * max|unfused|`` where ``spread`` is the unfused
result's own error where it can be measured (its distance to the same function in fp64, for
fp32 functions) and how far it moves when the inputs move by 8 units of rounding (the problem's
conditioning: a cancellation, a quotient by a small sum), and ``rtol`` is 256 units of rounding
of the function's dtype (fp16's when the pass reports an approximate rewrite), at least 2^-30
(fp64 functions have no wider twin). A fused function
is also checked statically: no block may read a buffer that only a later block writes. A refusal must come back as the
input function (the same object) with a report naming its levels and a non-empty reason. Each
case runs in a worker process with a timeout: a hang or a crash is recorded, not waited on.

Command line (documented in the test module)::

    python tests/cascade_fuzz.py --cases 5000 --seed 0 --out bench/results/fuzz_cascades/latest.json
    python tests/cascade_fuzz.py --show 17 --seed 0      # one case: spec, reports, outcome
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_conns

import numpy as np

DATA_BOUND = 1e3  # every input profile stays within |value| <= 1e3
CAP = {"float32": 1e14, "float64": 1e100}  # bound on any term's magnitude
TINY = {"float32": 1e-25, "float64": 1e-250}  # positive lower bounds below this count as 0
EXP_ARG = {"float32": 30.0, "float64": 200.0}  # bound on exp's argument
EPS = {"float16": 2.0 ** -11, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
NARROW = {"float32": "float16", "float64": "float32"}  # the widened input's storage type
PROFILES = ("normal", "mixed", "wide", "positive")
SPREAD_FACTOR, PERTURB_ULPS, RTOL_ULPS = 64.0, 8.0, 256.0
# fp64 functions have no wider twin to measure the unfused result's own error, and inputs stored
# narrower (fp32) are not perturbed: reassociation with cancellation is allowed up to 2^-30 there
RTOL_FLOOR = 2.0 ** -30
HANG_SEED, CRASH_SEED = -1, -2  # run_case sleeps / aborts: tests of the timeout and crash handling

FEATURES = (  # the grammar's features: each must appear in the CI's cases (test_fuzz_cascades)
    "op:sum", "op:max", "op:min", "op:top_k",
    "fn:exp", "fn:log", "fn:abs", "fn:sqrt", "fn:sin", "fn:pow", "fn:neg",
    "bin:add", "bin:sub", "bin:mul", "bin:div", "const",
    "cast:round16", "cast:widen", "cast:index", "select:data", "select:level",
    "leaf:b", "leaf:w", "deps", "deps:2", "independent_level", "extra_axis", "extra_reads_extra",
    "batch_rows", "stage", "epilogue", "hidden_level", "softmax_shift",
    "dtype:float32", "dtype:float64", "parts>1", "vector>1", "allow_approximate",
)


# ----------------------------------------------------------------------------------------------
# Terms: an AST of lists (JSON-able) with a magnitude bound, a positivity bound and what it reads
# ----------------------------------------------------------------------------------------------
@dataclass
class Term:
    node: list
    hi: float  # |value| <= hi
    lo: float | None  # value >= lo (> 0: positive, 0: non-negative), None: any sign
    k: bool = False  # reads the reduced axis
    deps: frozenset = frozenset()  # levels read
    nonpos: bool = False  # value <= 0 (a shift by the row max)


class Invalid(Exception):
    """The drawn term is not valid math on every input (or may overflow): draw another."""


class Grammar:
    def __init__(self, rng: np.random.Generator, dtype: str, extent: int, features: set):
        self.rng, self.dtype, self.extent, self.features = rng, dtype, extent, features
        self.leaves = ["x"]  # which data loads G(x) may use

    # -- node constructors with their bounds ---------------------------------------------------
    def check(self, t: Term) -> Term:
        if not (t.hi <= CAP[self.dtype]) or (t.lo is not None and t.lo < 0):
            raise Invalid(t.node[0])
        if t.lo is not None and 0 < t.lo < TINY[self.dtype]:
            t.lo = 0.0
        return t

    def const(self, value: float) -> Term:
        v = float(np.float32(value))
        return Term(["c", v], abs(v), v if v >= 0 else None)

    def un(self, op: str, a: Term, n: float | None = None) -> Term:
        both = dict(k=a.k, deps=a.deps)
        if op == "neg":
            t = Term(["neg", a.node], a.hi, 0.0 if a.nonpos else None, **both)
        elif op == "abs":
            t = Term(["abs", a.node], a.hi, a.lo if a.lo else 0.0, **both)
        elif op == "sin":  # of a bounded argument: sin(1e29) would only measure the rounding of 1e29
            if a.hi > 1e4:
                raise Invalid("sin")
            t = Term(["sin", a.node], min(1.0, a.hi), None, **both)
        elif op == "exp":
            if a.nonpos:
                t = Term(["exp", a.node], 1.0, 0.0, **both)
            elif a.hi <= EXP_ARG[self.dtype]:
                t = Term(["exp", a.node], math.exp(a.hi), math.exp(-a.hi), **both)
            else:
                raise Invalid("exp")
        elif op == "log":
            if not a.lo or a.lo <= 0:
                raise Invalid("log")
            hi = max(abs(math.log(a.lo)), abs(math.log(a.hi)))
            t = Term(["log", a.node], hi, math.log(a.lo) if a.lo >= 1 else None, **both)
        elif op == "sqrt":
            if a.lo is None:
                raise Invalid("sqrt")
            t = Term(["sqrt", a.node], math.sqrt(a.hi), math.sqrt(a.lo), **both)
        elif op == "pow":
            if n in (2, 3):
                lo = a.lo ** n if a.lo is not None else (0.0 if n == 2 else None)
                t = Term(["pow", a.node, n], a.hi ** n, lo, **both)
            elif n == 0.5:
                if a.lo is None:
                    raise Invalid("pow")
                t = Term(["pow", a.node, n], math.sqrt(a.hi), math.sqrt(a.lo), **both)
            elif n == -1:
                if not a.lo:
                    raise Invalid("pow")
                t = Term(["pow", a.node, n], 1.0 / a.lo, 1.0 / a.hi, **both)
            else:
                raise ValueError(n)
        elif op == "r16":  # a rounding cast through fp16 and back
            if a.hi > 6e4:
                raise Invalid("r16")
            lo = a.lo if a.lo is None or a.lo == 0 else (a.lo * 0.999 if a.lo > 1e-4 else 0.0)
            t = Term(["r16", a.node], a.hi * 1.001, lo, **both, nonpos=a.nonpos)
        else:
            raise ValueError(op)
        return self.check(t)

    def bin(self, op: str, a: Term, b: Term) -> Term:
        both = dict(k=a.k or b.k, deps=a.deps | b.deps)
        lo = None
        if op == "add":
            hi = a.hi + b.hi
            lo = a.lo + b.lo if a.lo is not None and b.lo is not None else None
        elif op == "sub":
            hi = a.hi + b.hi
        elif op == "mul":
            hi = a.hi * b.hi
            lo = a.lo * b.lo if a.lo is not None and b.lo is not None else None
        elif op == "div":
            if not b.lo:
                raise Invalid("div")
            hi = a.hi / b.lo
            lo = a.lo / b.hi if a.lo is not None else None
        else:
            raise ValueError(op)
        return self.check(Term([op, a.node, b.node], hi, lo, **both))

    # -- random terms ----------------------------------------------------------------------------
    def pick(self, options: dict):
        keys = list(options)
        p = np.array([options[k] for k in keys], float)
        return keys[int(self.rng.choice(len(keys), p=p / p.sum()))]

    def rconst(self, positive: bool = False) -> Term:
        c = float(self.rng.choice([0.5, 1.0, 2.0, 3.0, 0.25, 0.1, 448.0, 1.5]))
        if not positive and self.rng.random() < 0.3:
            c = -c
        return self.const(c)

    def leaf(self) -> Term:
        kind = self.pick({name: 6 if name == "x" else 2 for name in self.leaves} | {"idx": 1})
        if kind == "idx":
            return Term(["idx"], float(self.extent), 0.0, k=True)
        return Term([kind], DATA_BOUND, None, k=True)

    def level_leaf(self, levels: list, deps: list) -> Term:
        d = int(self.rng.choice(deps))
        lvl = levels[d]
        node = ["yj", d] if lvl["extra"] else ["y", d]
        return Term(node, lvl["hi"], lvl["lo"], deps=frozenset([d]))

    def expr(self, depth: int, leaf, tries: int = 12) -> Term:
        """A random term of ``leaf``s; terms that are not valid math are redrawn."""
        for _ in range(tries):
            try:
                return self._expr(depth, leaf)
            except Invalid:
                continue
        return leaf()

    def _expr(self, depth: int, leaf) -> Term:
        if depth <= 0 or self.rng.random() < 0.25:
            return leaf()
        op = self.pick({"neg": 1, "abs": 2, "sin": 2, "exp": 3, "log": 2, "sqrt": 2, "pow": 2,
                        "add": 3, "sub": 3, "mul": 3, "div": 2, "cadd": 2, "cmul": 3, "r16": 0.3})
        a = self._expr(depth - 1, leaf)
        if op in ("neg", "abs", "sin"):
            return self.un(op, a)
        if op == "exp":
            if a.hi > EXP_ARG[self.dtype]:  # scale the argument into range
                a = self.bin("mul", a, self.const(2.0 ** math.floor(math.log2(EXP_ARG[self.dtype] / 2 / a.hi))))
            return self.un("exp", a)
        if op in ("log", "sqrt"):
            return self.un(op, self.positive(a))
        if op == "pow":
            n = self.pick({2: 3, 3: 2, 0.5: 1, -1: 1})
            return self.un("pow", self.positive(a) if n in (0.5, -1) else a, n)
        if op == "r16":
            return self.un("r16", a)
        if op in ("cadd", "cmul"):
            return self.bin(op[1:], a, self.rconst())
        b = self._expr(depth - 1, leaf)
        if op == "div":
            return self.bin("div", a, self.positive(b))
        return self.bin(op, a, b)

    def positive(self, a: Term) -> Term:
        """``a`` made provably positive (bounded away from zero)."""
        if a.lo:
            return a
        how = self.pick({"abs+c": 3, "sq+c": 2, "exp": 1 if a.hi <= EXP_ARG[self.dtype] else 0})
        if how == "exp":
            return self.un("exp", a)
        c = self.rconst(positive=True)
        base = self.un("abs", a) if how == "abs+c" else self.un("pow", a, 2)
        return self.bin("add", base, c)


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------
def generate(seed: int, index: int) -> dict:
    """The case ``index`` of ``seed``: a JSON-able spec (deterministic in its arguments)."""
    rng = np.random.default_rng([seed, index, 0x5EED])
    dtype = "float64" if rng.random() < 0.3 else "float32"
    features: set = {f"dtype:{dtype}"}
    rows = [int(rng.integers(4, 17))] if rng.random() < 0.8 else [int(rng.integers(2, 5)), int(rng.integers(2, 5))]
    if len(rows) == 2:
        features.add("batch_rows")
    extent = int(rng.choice([8, 16, 24, 32, 48, 64]))
    cols = int(rng.integers(2, 9))
    g = Grammar(rng, dtype, extent, features)
    g.leaves = ["x"] + (["b"] if rng.random() < 0.3 else []) + (["w"] if rng.random() < 0.3 else [])
    widen = rng.random() < 0.15
    approx_case = rng.random() < 0.12  # rounding casts allowed in this case
    n_levels = int(rng.choice([2, 3, 4], p=[0.45, 0.35, 0.2]))
    levels: list[dict] = []
    data = lambda: g.expr(int(rng.integers(0, 3)), g.leaf)  # noqa: E731

    for j in range(n_levels):
        op = g.pick({"sum": 5, "max": 3, "min": 2, "top_k": 1 if j else 0.5})
        eligible = [d for d, lvl in enumerate(levels) if lvl["op"] != "top_k" and not lvl["extra"]]
        earlier_extra = [d for d, lvl in enumerate(levels) if lvl["extra"]]
        extra = op in ("sum", "max") and j > 0 and rng.random() < (0.4 if earlier_extra else 0.15)
        if extra and earlier_extra and rng.random() < 0.6:
            eligible = earlier_extra + eligible
        n_deps = 0 if j == 0 or not eligible else g.pick({0: 1, 1: 6, 2: 2 if len(eligible) > 1 else 0})
        if op == "top_k" and rng.random() < 0.8:
            n_deps = 0
        deps = sorted(rng.choice(eligible, size=n_deps, replace=False).tolist()) if n_deps else []
        value, template = _level_value(g, rng, levels, deps, op, data)
        if approx_case and rng.random() < 0.5:
            try:
                value = g.un("r16", value) if rng.random() < 0.5 else _round_inside(g, value)
            except Invalid:
                pass
        hi = value.hi * (extent if op == "sum" else 1)
        lo = value.lo * (extent if op == "sum" else 1) if value.lo is not None else None
        if template == "softmax" and op == "sum" and value.node[0] == "exp":
            lo = 1.0  # the row max's own term is exp(0)
        if extra:
            how = "mul" if op == "sum" or rng.random() < 0.5 else "add"
            try:
                value = g.bin(how, value, Term(["v"], DATA_BOUND, None, k=True))
            except Invalid:  # too large a term to multiply by the data: x * v instead
                value, template = g.bin(how, g.leaf(), Term(["v"], DATA_BOUND, None, k=True)), "plain"
            hi, lo = value.hi * (extent if op == "sum" else 1), None
        if hi > CAP[dtype]:
            value, template, deps = data(), "plain", []
            hi, lo = value.hi * (extent if op == "sum" else 1), None
        level = {"name": f"l{j}", "op": op, "extra": extra, "deps": sorted(value.deps), "template": template,
                 "expr": value.node, "hi": hi, "lo": lo, "output": True, "stage": False}
        if op == "top_k":
            level["k"] = int(rng.integers(1, 4))
        levels.append(level)

    epilogues = []
    readable = [d for d, lvl in enumerate(levels) if lvl["op"] != "top_k" and not lvl["extra"]]
    if rng.random() < 0.25 and readable:
        for _ in range(int(rng.integers(1, 3))):
            e = g.expr(int(rng.integers(1, 3)), lambda: g.level_leaf(levels, readable))
            if not e.deps:
                e = g.bin("add", e, g.level_leaf(levels, readable))
            epilogues.append({"name": f"e{len(epilogues)}", "expr": e.node, "deps": sorted(e.deps)})
    consumed = {d for lvl in levels for d in lvl["deps"]} | {d for e in epilogues for d in e["deps"]}
    for d in sorted(consumed):
        if rng.random() < 0.25:
            levels[d]["output"] = False
    stageable = [j for j, lvl in enumerate(levels) if not lvl["extra"] and _reads_k(lvl["expr"])]
    if stageable and rng.random() < 0.15:
        levels[int(rng.choice(stageable))]["stage"] = True

    parts = int(g.pick({1: 10, 2: 3, 4: 3, 8: 2, 3: 0.3}))
    vector = int(g.pick({1: 8, 2: 1.5, 4: 1.5}))
    spec = {"seed": seed, "index": index, "dtype": dtype, "rows": rows, "extent": extent, "cols": cols,
            "widen": widen, "levels": levels, "epilogues": epilogues,
            "options": {"parts": parts, "vector": vector,
                        "allow_approximate": bool(rng.random() < (0.6 if approx_case else 0.05))}}
    spec["features"] = features_of(spec)
    return spec


def _level_value(g: Grammar, rng, levels: list, deps: list, op: str, data) -> tuple[Term, str]:
    """F(x, Y) of one level from a template (separable forms and others), redrawn until valid."""
    if not deps:
        return data(), "plain"
    hy = lambda: g.expr(int(rng.integers(0, 3)), lambda: g.level_leaf(levels, deps))  # noqa: E731
    shifts = [d for d in deps if levels[d]["op"] in ("max", "min") and not levels[d]["deps"]
              and not levels[d]["extra"]]
    for _ in range(20):
        template = g.pick({"mul": 4, "div": 2, "add": 3, "softmax": 5 if shifts else 0, "power": 2,
                           "wrap": 2, "select": 0.6, "mask": 0.6})
        try:
            if template == "softmax":  # exp(c (a - max a)) [* G(x)] [/ H(Y)]
                d = int(rng.choice(shifts))
                a = Term(levels[d]["expr"], levels[d]["hi"], None, k=True)
                y = Term(["y", d], levels[d]["hi"], None, deps=frozenset([d]))
                arg = g.bin("sub", a, y) if levels[d]["op"] == "max" else g.bin("sub", y, a)
                arg.nonpos = True
                c = float(rng.choice([1.0, 1.0, 2.0, 0.5]))
                if c != 1.0:
                    arg = g.bin("mul", g.const(c), arg)
                    arg.nonpos = True
                value = g.un("exp", arg)
                if rng.random() < 0.4:
                    value = g.bin("mul", value, data())
                others = [e for e in deps if e != d]
                if others and rng.random() < 0.7:
                    value = g.bin("div", value, g.positive(
                        Term(["y", others[0]], levels[others[0]]["hi"], levels[others[0]]["lo"],
                             deps=frozenset([others[0]]))))
                value.deps = value.deps | frozenset(deps)
            elif template in ("mul", "div"):
                h = hy()
                value = g.bin("mul", data(), h) if template == "mul" else g.bin("div", data(), g.positive(h))
            elif template == "add":
                value = g.bin(str(rng.choice(["add", "sub"])), data(), hy())
                if rng.random() < 0.5:
                    value = Term(["sub", value.node[2], value.node[1]], value.hi, None, True, value.deps)
            elif template == "power":
                n = int(rng.choice([2, 3]))
                base = g.bin("sub", data(), hy())
                value = g.un("pow", base, n) if rng.random() < 0.5 else (
                    g.bin("mul", base, base) if n == 2 else g.bin("mul", g.bin("mul", base, base), base))
            elif template == "wrap":
                inner = g.bin(str(rng.choice(["sub", "mul", "add"])), data(), hy())
                f = str(rng.choice(["sin", "abs", "exp", "log", "sqrt"]))
                value = g.un(f, g.positive(inner) if f in ("log", "sqrt") else inner)
            elif template == "select":  # a select reading a level's result
                x, h = data(), hy()
                value = Term(["sel", x.node, h.node, x.node, ["c", 0.0]], x.hi, None, True, x.deps | h.deps)
            else:  # "mask": a select over the data only, times a separable term
                x, z = data(), data()
                masked = Term(["sel", x.node, ["c", 0.0], z.node, ["c", 0.0]], z.hi, None, True)
                value = g.bin("mul", masked, hy())
            if not value.deps or not value.k:
                continue
            return value, template
        except Invalid:
            continue
    return data(), "plain"


def _round_inside(g: Grammar, value: Term) -> Term:
    """Round the level's data part (the first operand) through fp16, as an FP8-style quantizer."""
    node = value.node
    if node[0] in ("mul", "div", "add", "sub") and isinstance(node[1], list):
        return Term([node[0], ["r16", node[1]], node[2]], value.hi * 1.001, value.lo and value.lo * 0.999,
                    value.k, value.deps)
    return g.un("r16", value)


def _read_before_write(func) -> str | None:
    """A root block that reads an intermediate buffer written only by a later root block (in
    program order), or None."""
    from tvm import s_tir

    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    params = {str(p.name) for p in func.params}
    written: set = set()
    for n, block in enumerate(blocks):
        for region in block.reads:
            name = str(region.source.name)
            later = any(str(w.source.name) == name for b in blocks[n + 1:] for w in b.writes)
            if name not in written and later and not any(str(w.source.name) == name for w in block.writes):
                kind = "parameter" if name in params else "buffer"
                return f"block {block.name_hint} reads {kind} {name} before a later block writes it"
        written |= {str(w.source.name) for w in block.writes}
    return None


def _walk(node):
    yield node
    for child in node[1:]:
        if isinstance(child, list):
            yield from _walk(child)


def _reads_k(node) -> bool:
    return any(n[0] in ("x", "b", "w", "v", "idx") for n in _walk(node))


def features_of(spec: dict) -> list[str]:
    names = {f"dtype:{spec['dtype']}"}
    names |= {"batch_rows"} if len(spec["rows"]) > 1 else set()
    names |= {"cast:widen"} if spec["widen"] else set()
    opts = spec["options"]
    names |= {"parts>1"} if opts["parts"] > 1 else set()
    names |= {"vector>1"} if opts["vector"] > 1 else set()
    names |= {"allow_approximate"} if opts["allow_approximate"] else set()
    names.add(f"levels:{len(spec['levels'])}")
    node_feature = {"exp": "fn:exp", "log": "fn:log", "abs": "fn:abs", "sqrt": "fn:sqrt", "sin": "fn:sin",
                    "pow": "fn:pow", "neg": "fn:neg", "add": "bin:add", "sub": "bin:sub", "mul": "bin:mul",
                    "div": "bin:div", "c": "const", "r16": "cast:round16", "idx": "cast:index",
                    "b": "leaf:b", "w": "leaf:w"}
    exprs = [lvl["expr"] for lvl in spec["levels"]] + [e["expr"] for e in spec["epilogues"]]
    for j, lvl in enumerate(spec["levels"]):
        names.add(f"op:{lvl['op']}")
        names.add(f"template:{lvl['template']}")
        if j and not lvl["deps"]:
            names.add("independent_level")
        if lvl["deps"]:
            names.add("deps")
        if len(lvl["deps"]) > 1:
            names.add("deps:2")
        if lvl["extra"]:
            names.add("extra_axis")
            if any(spec["levels"][d]["extra"] for d in lvl["deps"]):
                names.add("extra_reads_extra")
        if lvl["stage"]:
            names.add("stage")
        if not lvl["output"]:
            names.add("hidden_level")
        if lvl["template"] == "softmax":
            names.add("softmax_shift")
    for expr in exprs:
        for n in _walk(expr):
            if n[0] in node_feature:
                names.add(node_feature[n[0]])
            if n[0] == "sel":
                reads_level = any(m[0] in ("y", "yj") for m in _walk(n))
                names.add("select:level" if reads_level else "select:data")
    if spec["epilogues"]:
        names.add("epilogue")
    return sorted(names)


# ----------------------------------------------------------------------------------------------
# TE functions
# ----------------------------------------------------------------------------------------------
@dataclass
class Built:
    func: object
    inputs: list  # (name, shape, dtype)
    outputs: list  # (name, shape, dtype, kind)   kind: value | topk_values | topk_indices
    topk_ranks: dict = field(default_factory=dict)  # index output position -> offset to its values


def build(spec: dict) -> Built:
    """The unfused PrimFunc of a spec."""
    import tvm
    from tvm import te, tirx

    from tvm_dsm.fusion.top_k import top_k

    dtype, rows, extent, cols = spec["dtype"], tuple(spec["rows"]), spec["extent"], spec["cols"]
    used = {n[0] for lvl in spec["levels"] for n in _walk(lvl["expr"])}
    x_dtype = NARROW[dtype] if spec["widen"] else dtype
    placeholders = {"x": te.placeholder(rows + (extent,), x_dtype, name="x")}
    if "b" in used:
        placeholders["b"] = te.placeholder(rows + (extent,), dtype, name="b")
    if "w" in used:
        placeholders["w"] = te.placeholder((extent,), dtype, name="w")
    if "v" in used:
        placeholders["v"] = te.placeholder((extent, cols), dtype, name="v")
    tensors: dict[int, object] = {}
    stages: dict[int, object] = {}

    def emit(node, row, k, j=None):
        op = node[0]
        if op == "x":
            load = placeholders["x"](*row, k)
            return load.astype(dtype) if spec["widen"] else load
        if op == "b":
            return placeholders["b"](*row, k)
        if op == "w":
            return placeholders["w"](k)
        if op == "v":
            return placeholders["v"](k, j)
        if op == "idx":
            var = k.var if isinstance(k, tirx.IterVar) else k
            return var.astype(dtype)
        if op == "y":
            return tensors[node[1]](*row)
        if op == "yj":
            return tensors[node[1]](*row, j)
        if op == "c":
            return tirx.const(node[1], dtype)
        a = emit(node[1], row, k, j)
        if op == "neg":
            return -a
        if op == "abs":
            return te.abs(a)
        if op in ("exp", "log", "sqrt", "sin"):
            return getattr(te, op)(a)
        if op == "pow":
            return te.power(a, tirx.const(float(node[2]), dtype))
        if op == "r16":
            return a.astype("float16").astype(dtype)
        if op == "sel":
            return te.if_then_else(a > emit(node[2], row, k, j), emit(node[3], row, k, j), emit(node[4], row, k, j))
        b = emit(node[2], row, k, j)
        return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "div": lambda: a / b}[op]()

    outputs, out_tensors, topk_ranks = [], [], {}
    for n, lvl in enumerate(spec["levels"]):
        name, expr = lvl["name"], lvl["expr"]
        if lvl["stage"]:
            stages[n] = te.compute(rows + (extent,), _bind(lambda rk, e: emit(e, rk[:-1], rk[-1]), expr),
                                   name=f"p{n}")
            expr = None

        def value(row, k, j=None, n=n, expr=expr):
            return stages[n](*row, k) if expr is None else emit(expr, row, k, j)

        if lvl["op"] == "top_k":
            best = top_k(lambda *rk: value(rk[:-1], rk[-1]), rows, extent, lvl["k"], name=name)
            tensors[n] = best[0]
            kind_dtype = str(best[0].dtype)
            for c, t in enumerate(best):
                kind = "topk_values" if c < lvl["k"] else "topk_indices"
                if kind == "topk_indices":
                    topk_ranks[len(outputs)] = lvl["k"]
                outputs.append((f"{name}[{c}]", rows, kind_dtype if kind == "topk_values" else "int32", kind))
                out_tensors.append(t)
            continue
        r = te.reduce_axis((0, extent), f"{name}_k")
        reducer = {"sum": te.sum, "max": te.max, "min": te.min}[lvl["op"]]
        if lvl["extra"]:
            t = te.compute(rows + (cols,), lambda *rj: reducer(value(rj[:-1], r, rj[-1]), axis=r), name=name)
        else:
            t = te.compute(rows, lambda *row: reducer(value(row, r), axis=r), name=name)
        tensors[n] = t
        if lvl["output"]:
            outputs.append((name, tuple(int(s) for s in t.shape), dtype, "value"))
            out_tensors.append(t)
    for e in spec["epilogues"]:
        t = te.compute(rows, _bind(lambda row, ex: emit(ex, row, None), e["expr"]), name=e["name"])
        outputs.append((e["name"], rows, dtype, "value"))
        out_tensors.append(t)
    inputs = [(p.name, tuple(int(s) for s in p.shape), str(p.dtype)) for p in placeholders.values()]
    func = te.create_prim_func(list(placeholders.values()) + out_tensors)
    return Built(func, inputs, outputs, topk_ranks)


def _bind(f, extra):
    """``lambda *axes: f(axes, extra)`` (TE's fcompute takes no keyword arguments)."""
    return lambda *axes: f(axes, extra)


# ----------------------------------------------------------------------------------------------
# Inputs and comparison
# ----------------------------------------------------------------------------------------------
def make_input(rng, profile: str, shape, dtype: str) -> np.ndarray:
    if profile == "normal":
        a = rng.standard_normal(shape)
    elif profile == "mixed":
        a = rng.standard_normal(shape) * 10
        u = rng.random(shape)
        a = np.where(u < 0.15, 0.0, a)
        a = np.where(u > 0.9, rng.choice([-1, 1], shape) * rng.uniform(100, DATA_BOUND, shape), a)
    elif profile == "wide":
        a = rng.choice([-1, 1], shape) * 10 ** rng.uniform(-3, 3, shape)
        a = np.where(rng.random(shape) < 0.1, 0.0, a)
    else:
        a = rng.uniform(0.5, 1.5, shape)
    return np.clip(a, -DATA_BOUND, DATA_BOUND).astype(dtype)


def run_module(ex, built: Built, inputs: list) -> list[np.ndarray]:
    import tvm

    args = [tvm.runtime.tensor(a) for a in inputs]
    outs = []
    for _, shape, dtype, _ in built.outputs:
        fill = np.iinfo("int32").min if dtype == "int32" else np.nan
        outs.append(tvm.runtime.tensor(np.full(shape, fill, dtype)))
    ex["main"](*args, *outs)
    return [o.numpy() for o in outs]


def compare(got: np.ndarray, want: np.ndarray, spread: np.ndarray, eps: float) -> tuple[bool, float, str]:
    """Whether ``got`` matches ``want``: the same NaN and inf positions, and elsewhere within
    64 * spread + rtol * max|want|. Returns (ok, normwise relative error, why not)."""
    got, want = got.astype("float64"), want.astype("float64")
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    inf_ok = np.array_equal(np.isinf(got) & ~nan_g, np.isinf(want) & ~nan_w) and np.array_equal(
        got[np.isinf(got)], want[np.isinf(want)]) if np.isinf(got).any() or np.isinf(want).any() else True
    if not np.array_equal(nan_g, nan_w) or not inf_ok:
        where = np.argwhere((nan_g != nan_w) | (np.isinf(got) != np.isinf(want)))[:3].tolist()
        return False, math.inf, f"non-finite positions differ at {where}"
    finite = np.isfinite(want)
    if not finite.any():
        return True, 0.0, ""
    g, w, s = got[finite], want[finite], spread[finite]
    scale = max(np.abs(w).max(), 1e-300)
    err = np.abs(g - w)
    rel = float(err.max() / scale) if scale > 1e-300 else float(err.max())
    allowed = SPREAD_FACTOR * s + max(RTOL_ULPS * eps, RTOL_FLOOR) * scale
    bad = err > allowed
    if bad.any():
        i = int(np.argmax(err - allowed))
        return False, rel, (f"|fused - unfused| = {err[i]:.3g} > allowed {allowed[i]:.3g} "
                            f"(fused {g[i]:.9g}, unfused {w[i]:.9g}, spread {s[i]:.3g}, max|unfused| {scale:.3g})")
    return True, rel, ""


def compare_outputs(built: Built, got: list, want: list, spreads: list, eps: float) -> tuple[bool, float, str]:
    """Every output of the fused run against the unfused one: values within tolerance; top-k
    indices equal, except at a rank whose values differ by rounding (a near tie reordered)."""
    ok_all, worst, why = True, 0.0, ""
    for n, (name, _, _, kind) in enumerate(built.outputs):
        if kind == "topk_indices":
            continue
        ok, rel, msg = compare(got[n], want[n], spreads[n], eps)
        worst = max(worst, rel)
        if not ok and ok_all:
            ok_all, why = False, f"{name}: {msg}"
    for n, (name, _, _, kind) in enumerate(built.outputs):
        if kind != "topk_indices" or np.array_equal(got[n], want[n]):
            continue
        rank = n - built.topk_ranks[n]  # the values output of the same rank
        differs = got[n] != want[n]
        exact = got[rank] == want[rank]
        if (differs & exact).any() and ok_all:
            ok_all, why = False, (f"{name}: top-k indices differ where the values are equal: fused "
                                  f"{got[n][differs][:4].tolist()}, unfused {want[n][differs][:4].tolist()}")
    return ok_all, worst, why


# ----------------------------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------------------------
REASON_CATEGORIES = [
    (r"is neither G\(x\)\*H\(y\) nor a sum", "sum not separable"),
    (r"expands into terms of degree", "split expansion of too high a degree"),
    (r"neither G\(x\) \+ H\(y\) nor G\(x\) \* H\(y\)", "max/min not separable"),
    (r"select reading the result", "select reads a level"),
    (r"unsupported call to", "unsupported call"),
    (r"unsupported", "unsupported expression"),
    (r"\(top-k\) reads earlier levels", "top-k reads levels"),
    (r"approximate: a rounding cast", "rounding cast (approximate)"),
    (r"has extra spatial axes and is read by", "extra-axis level read by a level"),
    (r"fewer spatial axes", "fewer spatial axes"),
    (r"fused in split form", "reads a split-form level"),
    (r"loop index \w+ in the value", "loop index in a level"),
    (r"needs the online rescale", "exp without a safe rescale"),
    (r"the rewrite cannot express", "rewrite cannot express"),
    (r"reads a level's result between the levels", "block between the levels"),
    (r"parts=\d+: the parts merge in a tree", "parts not a power of two"),
    (r"do not divide the reduction extent", "parts x vector do not divide the extent"),
]
GROUP_REASONS = ("parts not a power of two", "parts x vector do not divide the extent")


def reason_category(reason: str) -> str:
    for pattern, name in REASON_CATEGORIES:
        if re.search(pattern, reason):
            return name
    return "other: " + reason[:60]


def run_case(seed: int, index: int) -> dict:
    """Generate, fuse, build, run and compare one case (in the current process)."""
    if seed == HANG_SEED:  # the harness's own checks: a case that hangs, one that kills its worker
        time.sleep(3600)
    if seed == CRASH_SEED:
        os.abort()
    import tvm
    import tvm_ffi

    from tvm_dsm.transform import FuseCascadedReductions, fuse_cascaded_reductions

    t0 = time.time()
    spec = generate(seed, index)
    out = {"index": index, "features": spec["features"], "status": None, "reasons": [], "problems": [],
           "rel_err": None, "approximate": False}
    stage = "build"
    try:
        built = build(spec)
        stage = "fuse"
        opts = spec["options"]
        fused, reports = fuse_cascaded_reductions(built.func, **opts)
        stage = "pass form"
        via_pass = FuseCascadedReductions(**opts)(tvm.IRModule({"main": built.func}))["main"]
        if not tvm_ffi.structural_equal(via_pass, fused):
            out["problems"].append("the pass form's result differs from fuse_cascaded_reductions'")
        stage = "reports"
        n_fused = sum(r.fusible for r in reports)
        for r in reports:
            if r.fusible:
                out["approximate"] |= bool(r.approximate)
                out["details"] = out.get("details", []) + list(r.details)
                continue
            cat = reason_category(r.reason or "")
            out["reasons"].append({"category": cat, "reason": r.reason, "levels": list(r.levels)})
            if not r.reason or not r.reason.strip():
                out["problems"].append(f"refusal of {r.levels} without a reason")
            if not r.levels or not all(isinstance(n, str) and n for n in r.levels):
                out["problems"].append(f"refusal naming no levels: {r}")
            names_level = any(re.search(rf"\b{re.escape(n)}\b", r.reason or "") for n in r.levels)
            if not names_level and cat not in GROUP_REASONS:
                out["problems"].append(f"refusal reason names no level: {r.reason!r} ({'/'.join(r.levels)})")
        if not reports:
            out["status"] = "no cascade"
        elif n_fused == 0:
            out["status"] = "refused"
        else:
            out["status"] = "fused"
        if n_fused == 0 and not fused.same_as(built.func):
            out["problems"].append("refused, but the function returned is not the input")
        if n_fused and "fused_" not in fused.script():
            out["problems"].append("reported fused, but no fused block in the result")
        order = _read_before_write(fused) if n_fused else None
        if order:
            out["problems"].append(f"order: {order}")
        stage = "compile unfused"
        ex_ref = tvm.compile(tvm.IRModule({"main": built.func}), target="llvm")
        twin = ex_twin = None
        if n_fused and spec["dtype"] == "float32":  # the same function in fp64: the fp32 result's own error
            twin = build(dict(spec, dtype="float64"))
            ex_twin = tvm.compile(tvm.IRModule({"main": twin.func}), target="llvm")
        ex_fused = None
        if n_fused:
            stage = "compile fused"
            ex_fused = tvm.compile(tvm.IRModule({"main": fused}), target="llvm")
        worst = 0.0
        eps = EPS["float16"] if out["approximate"] else EPS[spec["dtype"]]
        for p_i, profile in enumerate(PROFILES):
            rng = np.random.default_rng([seed, index, p_i])
            inputs = [make_input(rng, profile, shape, dt) for _, shape, dt in built.inputs]
            stage = "run unfused"
            want = run_module(ex_ref, built, inputs)
            if ex_fused is None:
                continue
            spreads = [np.zeros(w.shape) for w in want]
            for _ in range(2):
                pert = [a if a.dtype != np.dtype(spec["dtype"]) else
                        (a * (1 + PERTURB_ULPS * EPS[spec["dtype"]] * rng.uniform(-1, 1, a.shape))).astype(a.dtype)
                        for a in inputs]
                other = run_module(ex_ref, built, pert)
                for n, (w, o) in enumerate(zip(want, other)):
                    if w.dtype.kind != "f":
                        continue
                    d = np.abs(o.astype("float64") - w.astype("float64"))
                    d = np.where(np.isfinite(w) & ~np.isfinite(o), np.inf, d)
                    spreads[n] = np.maximum(spreads[n], np.nan_to_num(d, nan=0.0))
            if ex_twin is not None:
                wide = run_module(ex_twin, twin, [a.astype(dt) for a, (_, _, dt) in zip(inputs, twin.inputs)])
                for n, (w, o) in enumerate(zip(want, wide)):
                    if w.dtype.kind == "f":
                        d = np.abs(o - w.astype("float64"))
                        d = np.where(np.isfinite(w) & ~np.isfinite(o), np.inf, d)
                        spreads[n] = np.maximum(spreads[n], np.nan_to_num(d, nan=0.0))
            stage = "run fused"
            got = run_module(ex_fused, built, inputs)
            ok, rel, why = compare_outputs(built, got, want, spreads, eps)
            worst = max(worst, rel)
            if not ok:
                out["status"] = "wrong"
                out["problems"].append(f"profile {profile}: {why}")
                break
        if n_fused:
            out["rel_err"] = worst
        if out["status"] != "wrong" and out["problems"]:
            out["status"] = "error"
            out["stage"] = "checks"
    except Exception as err:  # noqa: BLE001 - every exception is a finding
        out["status"] = "error"
        out["stage"] = stage
        out["problems"].append(f"{stage}: {type(err).__name__}: {str(err).strip().splitlines()[-1][:300] if str(err).strip() else ''}")
        out["traceback"] = traceback.format_exc()[-2000:]
    out["seconds"] = round(time.time() - t0, 3)
    return out


# ----------------------------------------------------------------------------------------------
# Workers with a per-case timeout
# ----------------------------------------------------------------------------------------------
def _worker(conn) -> None:
    import logging

    logging.getLogger("tvm_dsm.fusion").setLevel(logging.WARNING)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        conn.send(run_case(*job))


@dataclass
class _Slot:
    proc: object
    conn: object
    job: tuple | None = None
    started: float = 0.0


def run_cases(seed: int, indices, workers: int = 2, timeout: float = 60.0, on_result=None) -> list[dict]:
    """Run the cases in ``workers`` processes; a case past ``timeout`` seconds is a hang (its
    worker is killed and replaced), a worker that dies is a crash."""
    ctx = mp.get_context("spawn")
    pending = list(indices)[::-1]
    results: list[dict] = []

    def start() -> _Slot:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(child,), daemon=True)
        proc.start()
        child.close()
        return _Slot(proc, parent)

    def give(slot: _Slot) -> None:
        if pending:
            slot.job = (seed, pending.pop())
            slot.started = time.time()
            slot.conn.send(slot.job)
        else:
            slot.job = None

    def record(result: dict) -> None:
        results.append(result)
        if on_result:
            on_result(result)

    def failed(slot: _Slot, status: str, why: str) -> dict:
        try:
            features = generate(*slot.job)["features"] if slot.job[0] >= 0 else []
        except Exception as err:  # noqa: BLE001
            features, why = [], f"{why}; generate: {type(err).__name__}: {err}"
        return {"index": slot.job[1], "features": features, "status": status, "stage": status,
                "reasons": [], "problems": [why], "rel_err": None, "approximate": False,
                "seconds": round(time.time() - slot.started, 3)}

    crashes = [0]
    slots = [start() for _ in range(max(1, workers))]
    for slot in slots:
        give(slot)
    try:
        while any(s.job for s in slots):
            busy = [s for s in slots if s.job]
            next_deadline = min(s.started + timeout for s in busy)
            ready = wait_conns([s.conn for s in busy], timeout=max(0.01, next_deadline - time.time()))
            for n, slot in enumerate(slots):
                if not slot.job:
                    continue
                if slot.conn in ready:
                    try:
                        record(slot.conn.recv())
                    except (EOFError, OSError):
                        slot.proc.join(1)
                        crashes[0] += 1
                        if crashes[0] > 20 and crashes[0] > len(results):
                            raise RuntimeError("the workers keep dying: see their stderr")
                        record(failed(slot, "crash", f"worker died (exit code {slot.proc.exitcode})"))
                        slots[n] = slot = _replace(slot, start)
                    give(slot)
                elif time.time() > slot.started + timeout:
                    record(failed(slot, "hang", f"no result after {timeout:.0f} s"))
                    slots[n] = slot = _replace(slot, start)
                    give(slot)
    finally:
        for slot in slots:
            try:
                slot.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for slot in slots:
            slot.proc.join(5)
            if slot.proc.is_alive():
                slot.proc.kill()
    return sorted(results, key=lambda r: r["index"])


def _replace(slot: _Slot, start) -> _Slot:
    if slot.proc.is_alive():
        slot.proc.kill()  # this worker is ours (started by run_cases)
    slot.proc.join(5)
    slot.conn.close()
    return start()


# ----------------------------------------------------------------------------------------------
# Summary and command line
# ----------------------------------------------------------------------------------------------
KNOWN_BUGS = {
    "emit": "a proven level whose G or H holds abs / sin (any function ToTIR has no emitter for) "
            "crashes the rewrite: Unsupported('cannot emit Abs back to TIR')",
    "index": "a level reading the reduction index (k cast to float) crashes the rewrite: KeyError "
             "'idx_<k>' (the proof treats the index as a constant, the emitter has no symbol for it); "
             "once also a wrong result (seed 0 case 3488: max of y0 + log(|k| + 0.1), 8 parts of 1)",
    "external": "a level whose separable term reads a reduction result outside the cascade (another "
                "extent) crashes the rewrite: KeyError 'c0' (no emitter symbol for the operand)",
    "split-dep": "a max/min (shift or rescale) level reading a level fused in split form uses that level's "
                 "running value, which the split form does not keep: wrong results",
    "rescale-zero": "a sum in rescale form y * H(Y_new) / H(Y_old) with an H that vanishes on a partial "
                    "state (a partial sum that passes through 0) loses the sum: wrong results",
    "order": "the fused block takes the place of the cascade's last level, after a block that reads an "
             "earlier level's result (an epilogue between the levels): that block reads it unwritten",
    "approx-level": "the refusal of a rounding cast does not name the level holding the cast",
}


def known_bug(result: dict) -> str | None:
    """The known bug (KNOWN_BUGS) a failing case shows, or None for a new failure."""
    problems = " ".join(result.get("problems", []))
    if "order: block" in problems:
        return "order"
    if re.search(r"cannot emit \w+ back to TIR", problems):
        return "emit"
    if "KeyError: 'idx_" in problems or (result["status"] == "wrong" and any(
            "idx_" in d for d in result.get("details", []))):
        return "index"
    if re.search(r"KeyError: 'c\d+'", problems):
        return "external"
    if result["status"] == "error" and result.get("stage") == "checks" and all(
            "approximate: a rounding cast" in p for p in result["problems"]):
        return "approx-level"
    if result["status"] != "wrong":
        return None
    details = result.get("details", [])
    split = {m.group(1) for d in details for m in [re.match(r"(\w+) \(\w+\) F = .*: split", d)] if m}
    names = [m.group(1) for d in details for m in [re.match(r"(\w+) \(", d)] if m]
    split_y = {f"y{names.index(n)}" for n in split if n in names}
    for d in details:
        m = re.match(r"\w+ \((max|min)\) F = (.*): (shift|rescale)", d)
        if m and any(re.search(rf"\b{y}\b", m.group(2)) for y in split_y):
            return "split-dep"
    for d in details:
        m = re.search(r": rescale, correction (.*)$", d)
        if m and "/" in m.group(1) and not re.fullmatch(r"exp\([^/]*\)", m.group(1)):
            return "rescale-zero"
    return None


def summarize(results: list[dict]) -> dict:
    counts = Counter(r["status"] for r in results)
    refused = Counter(x["category"] for r in results for x in r["reasons"])
    by_feature: dict = defaultdict(Counter)
    for r in results:
        for f in r["features"]:
            by_feature[f]["cases"] += 1
            by_feature[f][r["status"]] += 1
    rel = [r["rel_err"] for r in results if r.get("rel_err") is not None]
    rel_ok = [r["rel_err"] for r in results if r.get("rel_err") is not None and r["status"] == "fused"]
    bugs = Counter(known_bug(r) or "unknown" for r in results if r["status"] in ("wrong", "error", "crash", "hang"))
    errors = [r for r in results if r["status"] in ("error", "crash", "hang")]
    return {
        "cases": len(results),
        "fused": counts["fused"],
        "refused_cases": counts["refused"],
        "no_cascade": counts["no cascade"],
        "refused": dict(sorted(refused.items(), key=lambda kv: -kv[1])),
        "wrong": counts["wrong"],
        "errors": len(errors),
        "hangs": counts["hang"],
        "crashes": counts["crash"],
        "approximate_fused": sum(1 for r in results if r["status"] == "fused" and r["approximate"]),
        "rel_err": max(rel) if rel else 0.0,
        "rel_err_correct": max(rel_ok) if rel_ok else 0.0,
        "failures_by_known_bug": dict(bugs),
        "by_feature": {f: dict(c) for f, c in sorted(by_feature.items())},
        "failures": [{k: r[k] for k in ("index", "status", "problems") if k in r}
                     | {"stage": r.get("stage"), "known_bug": known_bug(r)}
                     for r in results if r["status"] in ("wrong", "error", "crash", "hang")][:60],
    }


def _versions() -> dict:
    import subprocess

    import tvm

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=root).stdout.strip() or "unknown"
    except OSError:
        sha = "unknown"
    return {"tvm": tvm.__version__, "tvm_dsm": sha}


def report_json(seed: int, summary: dict, wall: float, command: str, complete: bool) -> dict:
    import datetime

    row = {"name": f"fuzz seed {seed}", "ok": summary["wrong"] == 0 and summary["errors"] == 0,
           "rel_err": summary["rel_err"], "rel_err_correct": summary["rel_err_correct"],
           "cases": summary["cases"], "fused": summary["fused"],
           "refused": summary["refused"], "refused_cases": summary["refused_cases"],
           "no_cascade": summary["no_cascade"], "approximate_fused": summary["approximate_fused"],
           "wrong": summary["wrong"], "errors": summary["errors"], "hangs": summary["hangs"],
           "crashes": summary["crashes"], "failures_by_known_bug": summary["failures_by_known_bug"],
           "known_bugs": KNOWN_BUGS, "by_feature": summary["by_feature"], "failures": summary["failures"],
           "wall_s": round(wall, 1), "complete": complete}
    return {"suite": "fuzz_cascades", "device": "CPU (llvm)", "date": datetime.date.today().isoformat(),
            "versions": _versions(), "timing": "not timed", "command": command,
            "oracle": (f"unfused vs fused on llvm, 4 input profiles ({', '.join(PROFILES)}); equal NaN/inf "
                       f"positions, else |d| <= {SPREAD_FACTOR:g} * spread + {RTOL_ULPS:g} ulp * max|unfused| "
                       f"(spread: the unfused result's change under {PERTURB_ULPS:g}-ulp input perturbations; "
                       "fp16 ulp for approximate rewrites)"),
            "rows": [row]}



def show(seed: int, index: int) -> None:
    spec = generate(seed, index)
    print(json.dumps(spec, indent=1))
    built = build(spec)
    print(built.func.script())
    from tvm_dsm.transform import fuse_cascaded_reductions

    _, reports = fuse_cascaded_reductions(built.func, **spec["options"])
    for r in reports:
        print(r)
    print(json.dumps(run_case(seed, index), indent=1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first case index")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--budget", type=float, default=0.0, help="stop starting cases after this many seconds (0: none)")
    ap.add_argument("--out", default="")
    ap.add_argument("--show", type=int, default=None, help="print one case (spec, function, reports, outcome)")
    args = ap.parse_args(argv)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run_cases' cleanup ends the workers
    if args.show is not None:
        show(args.seed, args.show)
        return 0
    t0 = time.time()
    done: list[dict] = []
    command = "python tests/cascade_fuzz.py " + " ".join(argv if argv is not None else sys.argv[1:])
    indices = range(args.start, args.start + args.cases)
    last_write = [time.time()]

    def write(complete: bool) -> None:
        if args.out:
            data = report_json(args.seed, summarize(done), time.time() - t0, command, complete)
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out + ".tmp", "w") as f:
                f.write(json.dumps(data, indent=1) + "\n")
            os.replace(args.out + ".tmp", args.out)

    def progress(result: dict) -> None:
        done.append(result)
        if result["status"] in ("wrong", "error", "crash", "hang"):
            print(f"case {result['index']}: {result['status']}: {result['problems'][:2]}", flush=True)
        if len(done) % 100 == 0:
            s = summarize(done)
            print(f"{len(done)} cases, {time.time() - t0:.0f} s: fused {s['fused']}, refused {s['refused_cases']}, "
                  f"wrong {s['wrong']}, errors {s['errors']}, hangs {s['hangs']}", flush=True)
        if time.time() - last_write[0] > 60:
            write(False)
            last_write[0] = time.time()

    if args.budget:
        # in chunks, so that no case starts after the budget
        chunk, start = 200, args.start
        while start < args.start + args.cases and time.time() - t0 < args.budget:
            stop = min(start + chunk, args.start + args.cases)
            run_cases(args.seed, range(start, stop), args.workers, args.timeout, progress)
            start = stop
    else:
        run_cases(args.seed, indices, args.workers, args.timeout, progress)
    done.sort(key=lambda r: r["index"])
    complete = len(done) == args.cases
    write(complete)
    s = summarize(done)
    print(json.dumps({k: s[k] for k in ("cases", "fused", "refused_cases", "no_cascade", "refused", "wrong",
                                         "errors", "hangs", "crashes", "rel_err", "rel_err_correct",
                                         "failures_by_known_bug")}, indent=1))
    print(f"wall {time.time() - t0:.0f} s")
    return 0 if s["wrong"] == 0 and s["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
