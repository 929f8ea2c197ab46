"""Find cascaded reductions in an s_tir PrimFunc and prove that they fuse into one loop.

A cascade is a chain of reduction blocks over the same reduction extent in which later levels
read earlier levels' results (softmax: max, then sum of exp(x - max), then sum of exp(x - max)*v).
Level j reduces F_j(x_k, Y) with Y its dependencies' results. It fuses into an incremental loop
(RedFuser) when, as the dependencies move from Y_old to Y_new, the running value can be corrected
without revisiting x:

* sum:  F = sum_a G_a(x) H_a(Y) -> one accumulator per G_a, combined with H_a(Y_final) at the
        end ("split"; also for a single product: exact, and no H(partial Y) singularity);
        F = G(x) * H(Y) with an exp in G -> y = y * R + F(x_k, Y_new), R = H(Y_new) / H(Y_old)
        ("rescale", the online form: it keeps exp(x) from overflowing)
* max/min: F = G(x) + H(Y)   -> y = y + D (op) F(x_k, Y_new), D = H(Y_new) - H(Y_old) ("shift")
           F = G(x) * H(Y), H > 0 -> y = y * R (op) F(x_k, Y_new)                      ("rescale")
* top-k (:mod:`tvm_dsm.fusion.top_k`) of a value free of earlier levels ("plain")

Levels that read none of the group's results but reduce the same data over the same rows and
axis (the top-k beside a softmax's max and sum in MoE routing) join the group as independent
levels: one pass over the data serves them all.

R and D are derived symbolically as F(x, Y_new) / F(x, Y_old) and F(x, Y_new) - F(x, Y_old)
and must not depend on x: that is the separability test. A term the unfused function rounds
to a narrower float (:func:`tvm_dsm.fusion.symbolic.rounded`) may sit in a split form's G or H,
which the fused loop rounds where the unfused one does, but not in R or D, which would combine
rounded values the unfused function never forms (inf - inf where a rounded term overflows).
Everything else is reported, not fused.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import sympy
import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule.schedule import ScheduleError

from ..errors import ClusterError
from ..ir import loads, per_function, root_blocks, uses
from .symbolic import ToSympy, Unsupported, has_rounding, simplify
from .top_k import TopK, parse_top_k

_OPS = {tirx.Add: "sum", tirx.Max: "max", tirx.Min: "min"}
_MAX_SPLIT_TERMS = 8
#: The highest degree in the dependencies of an expanded term of a split form: (x - m)^4 (the
#: fourth moment) expands to terms of degree 4; a higher power of a dependency expands to terms
#: that overflow or cancel where the unexpanded value does not (y^12 for (x - y^4)^3).
_MAX_SPLIT_DEGREE = 4


@dataclass
class Level:
    """One reduction block of a cascade: ``output[spatial] = op_k value(spatial, k)``."""

    block: str
    op: str
    output: tirx.Var
    init: tvm.ir.PrimExpr
    spatial: list
    reduce_var: tirx.Var
    extent: int
    value: tvm.ir.PrimExpr
    rows: tuple = ()  # the spatial axes' extents
    deps: list[int] = field(default_factory=list)
    top_k: TopK | None = None  # op "top_k": its value and index outputs
    # filled by the proof
    form: str = ""  # plain | rescale | shift | split
    correction: sympy.Expr | None = None
    terms: list[tuple[sympy.Expr, sympy.Expr]] = field(default_factory=list)  # split: (G, H)

    @property
    def results(self) -> list:
        """The buffers the level writes: its output, or a top-k's values then indices."""
        return list(self.top_k.values) + list(self.top_k.indices) if self.top_k else [self.output]


@dataclass
class GroupReport:
    """What the pass found for one cascade and why it did or did not fuse it."""

    levels: list[str]
    fusible: bool
    reason: str
    approximate: bool = False
    details: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        state = "fusible" if self.fusible else "not fused"
        extra = " (approximate: rounding casts)" if self.approximate else ""
        lines = [f"cascade {' -> '.join(self.levels)}: {state}{extra}: {self.reason}"]
        return "\n".join(lines + [f"  {d}" for d in self.details])


def parse_reduction(block) -> Level | None:
    """The block as a Level, or None if it is not a single-axis sum/max/min/top-k reduction over
    a constant extent (the fused kernels' loops are constant; a symbolic one is left to others)."""
    if block.init is None:
        return None
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    if kinds.count(tirx.IterVar.CommReduce) != 1 or kinds[-1] != tirx.IterVar.CommReduce:
        return None
    *spatial, reduce = block.iter_vars
    if not isinstance(reduce.dom.extent, tirx.IntImm):
        return None
    top_k = parse_top_k(block)
    if top_k is not None:
        return Level(block=str(block.name_hint), op="top_k", output=top_k.values[0],
                     init=tvm.te.min_value(str(top_k.value.ty.dtype)),
                     spatial=[iv.var for iv in spatial], reduce_var=reduce.var,
                     extent=int(reduce.dom.extent), value=top_k.value, rows=_extents(spatial), top_k=top_k)
    if not isinstance(block.body, tirx.BufferStore):
        return None
    store, value = block.body, block.body.value
    op = next((name for node, name in _OPS.items() if isinstance(value, node)), None)
    if op is None:
        return None

    def is_self(e) -> bool:
        return isinstance(e, tvm.ir.TensorLoad) and e.source.same_as(store.buffer) and all(
            a.same_as(b) for a, b in zip(e.indices, store.indices)
        )

    operand = value.b if is_self(value.a) else value.a if is_self(value.b) else None
    if operand is None or not isinstance(block.init, tirx.BufferStore):
        return None
    if not all(isinstance(iv.dom.min, tirx.IntImm) and iv.dom.min.value == 0 for iv in block.iter_vars):
        return None  # a level is over 0..extent-1 on every axis (the kernels index so)
    return Level(
        block=str(block.name_hint),
        op=op,
        output=store.buffer,
        init=block.init.value,
        spatial=[iv.var for iv in spatial],
        reduce_var=reduce.var,
        extent=int(reduce.dom.extent),
        value=operand,
        rows=_extents(spatial),
    )


def _extents(iter_vars) -> tuple:
    return tuple(iv.dom.extent for iv in iter_vars)


def _is_one(extent) -> bool:
    return isinstance(extent, tirx.IntImm) and int(extent) == 1


def _leads_with_rows(level: Level, first: Level) -> bool:
    """Whether ``level``'s leading axes are ``first``'s rows, position by position (the fused
    loop pairs them so), a unit axis of ``first`` (a kept dimension) standing for any."""
    return len(level.rows) >= len(first.rows) and all(
        _is_one(b) or tvm_ffi.structural_equal(a, b) for a, b in zip(level.rows, first.rows))


def _same_rows(level: Level, first: Level) -> bool:
    """Whether ``level`` runs over exactly ``first``'s rows: its leading axes of ``first``'s
    extents, in order, any after them of one."""
    lead, rest = level.rows[:len(first.rows)], level.rows[len(first.rows):]
    return (len(lead) == len(first.rows) and all(tvm_ffi.structural_equal(a, b) for a, b in zip(lead, first.rows))
            and all(_is_one(e) for e in rest))


def _is_product(level: Level) -> bool:
    """Whether ``level`` reads a tensor along some of its rows' axes but not all (``x[i, k]`` of
    outputs ``[i, j]``): a matmul, whose operands every output row shares, not a reduction of
    each row's own data (which reads along all of them, or none: a broadcast weight)."""
    rows = [v for v, e in zip(level.spatial, level.rows) if not _is_one(e)]
    for load in loads(level.value):
        used = [any(uses(i, v) for i in load.indices) for v in rows]
        if any(used) and not all(used):
            return True
    return False


def find_cascades(func: tirx.PrimFunc) -> list[list[Level]]:
    """Groups of reduction blocks (program order) over one reduction extent and row shape in
    which each level after the first reads an earlier level's output (a statistic of its row,
    not indexed by the level's own reduction variable) or, reading none, reduces data the group
    already reads. A level that reduces over an earlier level's output along its own reduction
    variable (the max over keys of per-key dot products) starts a group: the earlier level is
    its producer, whatever their extents (a head dim as long as the keys)."""
    levels = [lvl for lvl in map(parse_reduction, root_blocks(func)) if lvl is not None]
    groups: list[list[Level]] = []
    for level in levels:
        group = groups[-1] if groups else None
        deps, sibling = [], False
        # A level with fewer spatial axes reduces over an earlier level's other axis (the max
        # over keys of per-key dot products): it starts a group, the earlier one is its producer;
        # so does one whose leading axes are not the group's rows.
        if group and group[0].extent == level.extent and _leads_with_rows(level, group[0]):
            reads = loads(level.value)
            produced = any(ld.source.same_as(prev.output) and any(uses(i, level.reduce_var) for i in ld.indices)
                           for prev in group for ld in reads)
            deps = [] if produced else [n for n, prev in enumerate(group)
                                        if any(ld.source.same_as(prev.output) for ld in reads)]
            data = [ld.source for prev in group for ld in loads(prev.value)]
            # a level reading none of the group's results joins it only over the same rows, and
            # only as a reduction of its rows (a matmul beside another is the GEMM families')
            sibling = not produced and not deps and _same_rows(level, group[0]) and not _is_product(level) and any(
                ld.source.same_as(buf) for ld in reads for buf in data)
        if deps or sibling:
            level.deps = deps
            group.append(level)
        else:
            groups.append([level])
    return [g for g in groups if len(g) > 1]


class LoadSymbols:
    """Names the loads of a cascade: y<j> (level outputs), x<n> (reduced data), c<n> (other)."""

    def __init__(self, group: list[Level], level: Level):
        self.group, self.level = group, level
        self.x: dict[str, sympy.Symbol] = {}
        self.c: dict[str, sympy.Symbol] = {}
        self.loads: dict[str, tvm.ir.TensorLoad] = {}

    def __call__(self, load) -> sympy.Symbol:
        for n, lvl in enumerate(self.group):
            if load.source.same_as(lvl.output):
                return sympy.Symbol(f"y{n}", real=True)
        return self._operand(load)

    def opaque(self, expr) -> sympy.Symbol:
        """A select over the data (a causal mask, say) is one more operand, unless it reads a
        level's result: then the correction would have to see inside it."""
        for load in loads(expr):
            if any(load.source.same_as(lvl.output) for lvl in self.group):
                raise Unsupported(f"select reading the result of {load.source.name}")
        return self._operand(expr)

    def _operand(self, expr) -> sympy.Symbol:
        """x<n> if ``expr`` varies along the reduced axis, else c<n>; one symbol per distinct
        expression."""
        table = self.x if uses(expr, self.level.reduce_var) else self.c
        key = str(expr)
        if key not in table:
            prefix = "x" if table is self.x else "c"
            table[key] = sympy.Symbol(f"{prefix}{len(table)}", real=True)
            self.loads[table[key].name] = expr
        return table[key]


def _state(n: int, which: str, sign: str | None = None) -> sympy.Symbol:
    """Level n's running value before (old) or after (new) a step; ``sign``: "positive" for a
    sum of provably positive terms, which the proofs may divide by, "nonnegative" for a sum of
    terms provably >= 0 (a mean square: its running value, from 0 on, is never negative, so
    ``sqrt(y + eps)`` is positive)."""
    return sympy.Symbol(f"y{n}_{which}", real=True, positive=(sign == "positive") or None,
                        nonnegative=(sign in ("positive", "nonnegative")) or None)


def _sign(level: Level, f: sympy.Expr) -> str | None:
    """What the proofs may assume of a sum level's running value (see :func:`_state`): a sum
    starts at 0, so only the terms' sign matters; a max or min starts at an infinity."""
    if level.op != "sum":
        return None
    return "positive" if f.is_positive else "nonnegative" if f.is_nonnegative else None


def prove(group: list[Level]) -> GroupReport:
    """Decide each level's incremental form (filling Level.form/correction/terms)."""
    names = [lvl.block for lvl in group]
    approximate = False
    details = []
    signs: dict[int, str] = {}  # sum levels of provably positive or nonnegative terms
    rows = len(group[0].spatial)
    for j, level in enumerate(group):
        if len(level.spatial) < rows:
            return GroupReport(names, False, f"level {level.block} has fewer spatial axes than {names[0]}")
        for dep in level.deps:
            if len(group[dep].spatial) > rows:
                return GroupReport(
                    names, False, f"level {group[dep].block} has extra spatial axes and is read by {level.block}"
                )
        if level.op == "top_k":
            if level.deps:
                return GroupReport(names, False, f"level {level.block} (top-k) reads earlier levels: "
                                   "only a top-k of the data itself is fused")
            level.form = "plain"
            details.append(f"{level.block} (top-{level.top_k.k}): plain")
            continue
        symbols = LoadSymbols(group, level)
        translate = ToSympy(symbols, round_whole_terms=True)
        try:
            f = translate(level.value)
        except Unsupported as err:
            return GroupReport(names, False, f"level {level.block}: unsupported {err}")
        if translate.rounding_casts and level.deps:
            approximate = True
        xs = set(symbols.x.values())
        ys = [sympy.Symbol(f"y{d}", real=True) for d in level.deps]
        new = f.subs({y: _state(int(y.name[1:]), "new", signs.get(int(y.name[1:]))) for y in ys})
        old = f.subs({y: _state(int(y.name[1:]), "old", signs.get(int(y.name[1:]))) for y in ys})
        if not ys:
            level.form = "plain"
        elif level.op == "sum":
            # Prefer H applied once at the end (split): exact, and no H(partial Y) singularity
            # (1/sqrt(0) when a part starts at x = 0). Keep the online rescale where G holds an
            # exp, whose running correction is what keeps it from overflowing (softmax).
            if _try_split(level, f, xs, set(ys)) and not any(g.has(sympy.exp) for g, _ in level.terms):
                pass
            elif not _try_rescale(level, new, old, xs):
                if not _try_split(level, f, xs, set(ys)):
                    what = (f"expands into terms of degree > {_MAX_SPLIT_DEGREE} in the earlier levels "
                            f"(they overflow or cancel where {f} does not)" if _expands_too_far(f, set(ys))
                            else f"{f} is neither G(x)*H(y) nor a sum of such terms")
                    return GroupReport(names, False, f"level {level.block} (sum): {what}")
                if any(g.has(sympy.exp) for g, _ in level.terms):  # exp(x) alone overflows
                    return GroupReport(
                        names, False,
                        f"level {level.block} (sum): {f} needs the online rescale to keep exp from "
                        "overflowing, and its correction is not provably free of division by zero",
                    )
        elif not _try_shift(level, new, old, xs) and not _try_rescale(level, new, old, xs, positive=True):
            return GroupReport(
                names, False,
                f"level {level.block} ({level.op}): {f} is neither G(x) + H(y) nor G(x) * H(y) "
                "with H provably positive (the correction would not commute with "
                f"{level.op})",
            )
        if (sign := _sign(level, f)) is not None:
            signs[j] = sign
        split_deps = [group[d].block for d in level.deps if group[d].form == "split"]
        if level.form in ("shift", "rescale") and split_deps:
            return GroupReport(names, False, f"level {level.block} ({level.form}) reads {split_deps}, fused in "
                               "split form: the fused loop keeps no running value of those to correct by")
        details.append(f"{level.block} ({level.op}) F = {f}: {level.form}"
                       + (f", correction {level.correction}" if level.correction is not None else ""))
    return GroupReport(names, True, "every level is separable", approximate, details)


def _free_of(expr: sympy.Expr, symbols: set) -> bool:
    return not (expr.free_symbols & symbols)


def _try_rescale(level: Level, new, old, xs: set, positive: bool = False) -> bool:
    ratio = simplify(new / old)
    if not _free_of(ratio, xs) or ratio.has(sympy.nan, sympy.zoo) or has_rounding(ratio):
        return False
    if positive and not ratio.is_positive:
        return False
    if _singular_at_zero(ratio):  # H(old) may be 0: what was summed would be lost
        return False
    level.form, level.correction = "rescale", ratio
    return True


def _singular_at_zero(ratio: sympy.Expr) -> bool:
    """Whether the correction divides by a previous state that may be 0 (a running sum or max
    not known to be positive): the state is 0, or passes through it, on real data."""
    for state in ratio.free_symbols:
        if state.name.endswith("_old") and not state.is_positive:
            at_zero = ratio.subs(state, 0)
            if at_zero.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo) or at_zero is sympy.nan:
                return True
    denominator = sympy.fraction(sympy.together(ratio))[1]
    return not (denominator.is_positive or denominator.is_negative or denominator.free_symbols == set())


def _try_shift(level: Level, new, old, xs: set) -> bool:
    delta = simplify(new - old)
    if not _free_of(delta, xs) or has_rounding(delta):
        return False
    level.form, level.correction = "shift", delta
    return True


def _try_split(level: Level, f, xs: set, ys: set) -> bool:
    terms = sympy.Add.make_args(sympy.expand(f, power_exp=True))
    if len(terms) > _MAX_SPLIT_TERMS:
        return False
    if _expands_too_far(f, ys):
        return False
    split = []
    for term in terms:
        h, g = term.as_independent(*xs, as_Add=False)
        if not _free_of(g, ys) or not _free_of(h, xs):
            return False
        split.append((g, h))
    # Merge terms with the same x part: one accumulator each.
    merged: dict[sympy.Expr, sympy.Expr] = {}
    for g, h in split:
        merged[g] = merged.get(g, 0) + h
    level.form, level.terms = "split", list(merged.items())
    return True


def _expands_too_far(f, ys: set) -> bool:
    """Whether ``f``'s expansion has terms past :data:`_MAX_SPLIT_DEGREE` in ``ys``."""
    terms = sympy.Add.make_args(sympy.expand(f, power_exp=True))
    return len(terms) > 1 and max(_degree(term, ys) for term in terms) > _MAX_SPLIT_DEGREE


def _degree(expr, ys: set) -> float:
    """How fast ``expr`` grows with the dependencies ``ys``: its total degree in them (|y| and
    y^p count p; another function of them counts 1)."""
    if expr in ys:
        return 1
    if not expr.free_symbols & ys:
        return 0
    if isinstance(expr, sympy.Pow) and expr.exp.is_number:
        return _degree(expr.base, ys) * abs(float(expr.exp))
    if isinstance(expr, sympy.Mul):
        return sum(_degree(a, ys) for a in expr.args)
    if isinstance(expr, (sympy.Add, sympy.Abs)):
        return max(_degree(a, ys) for a in expr.args)
    return 1


def element_producers(func: tirx.PrimFunc, group: list[Level]) -> dict:
    """Sum reductions over another axis whose result the group reads one element at a time
    (``s[row, k] = sum_d q[row, d] * key[row, k, d]``, the scores of decode attention): the
    fused loop computes each such element when it reaches it instead of reading it from
    memory. Returns {output buffer: the producer as a Level}; only producers of intermediates
    (not parameters) indexed exactly by the group's rows and reduction variable qualify."""
    blocks = root_blocks(func)
    names = {lvl.block for lvl in group}
    kept = list(func.params) + [  # parameters, and what blocks outside the group read, stay
        region.source for block in blocks if str(block.name_hint) not in names for region in block.reads]
    candidates = {}
    for level in map(parse_reduction, blocks):
        if (level is not None and level.op == "sum" and not level.top_k
                and not any(level.output.same_as(b) for b in kept)):
            candidates[level.output] = level
    rows = len(group[0].spatial)
    found = {}
    for lvl in group:
        row = list(lvl.spatial[:rows]) + [lvl.reduce_var]
        for load in loads(lvl.value):
            producer = next((p for b, p in candidates.items() if load.source.same_as(b)), None)
            if producer is None:
                continue
            if len(producer.spatial) != rows + 1 or not all(
                    isinstance(i, tirx.Var) and i.same_as(r) for i, r in zip(load.indices, row)):
                continue
            found[producer.output] = producer
    return found


def refuse_approximate(report: GroupReport) -> GroupReport:
    """``report`` refused where its fusion is approximate: a rounding cast inside a level makes
    the fused loop compute other values than the cascade as written, which the rewrite only does
    when allowed to approximate."""
    if report.fusible and report.approximate:
        report.fusible = False
        report.reason = (f"approximate: a rounding cast inside it, in level(s) {', '.join(report.levels)} "
                         "(pass allow_approximate=True)")
    return report


def analyze(func: tirx.PrimFunc) -> list[tuple[list[Level], GroupReport]]:
    """Every cascade of ``func`` (after inlining element-wise producers) with its report."""
    return [(group, prove(group)) for group in find_cascades(inline_elementwise(func))]


def single_fusible_cascade(func: tirx.PrimFunc, what: str) -> tuple[list[Level], GroupReport]:
    """``func``'s one cascade, proven fusible, for a kernel built around it (``what`` it is);
    ClusterError saying which of the two does not hold."""
    groups = analyze(func)
    if len(groups) != 1:
        raise ClusterError(f"{what} is one cascade; found {len(groups)}")
    group, report = groups[0]
    if not report.fusible:
        raise ClusterError(f"the cascade does not fuse: {report.reason}")
    return group, report


def only_load(expr, what: str):
    """The one buffer load of ``expr`` (``what`` it is, for the error); ClusterError otherwise."""
    found = loads(expr)
    if len(found) != 1:
        raise ClusterError(f"{what} must read one matrix element; got {expr}")
    return found[0]


def indexed_by(load, *variables) -> bool:
    """Whether ``load``'s leading indices are exactly ``variables``."""
    return all(isinstance(i, tirx.Var) and i.same_as(v) for i, v in zip(load.indices, variables))


@per_function
def rows_in_level_order(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with each reduction block that reads an earlier reduction's result at its own
    variables iterating those first, in the order the result is indexed: an output written
    ``[B, S, H, D]`` from statistics of rows ``[B, H, S]`` (attention's weighted sum of V) then
    leads with the statistics' rows, which :func:`find_cascades` pairs by position. The buffers
    and what each block computes are unchanged."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    outputs = [sch.get(rv).writes[0].source for rv in blocks if sch.get(rv).init is not None]
    for rv in blocks:
        block = sch.get(rv)
        if block.init is None:
            continue
        spatial = [n for n, iv in enumerate(block.iter_vars) if iv.iter_type == tirx.IterVar.DataPar]
        for load in loads(block.body):
            if load.source.same_as(block.writes[0].source) or not any(load.source.same_as(o) for o in outputs):
                continue
            lead = [next((n for n in spatial if block.iter_vars[n].var.same_as(i)), None) for i in load.indices]
            if None in lead or len(set(lead)) != len(lead) or not all(isinstance(i, tirx.Var) for i in load.indices):
                continue
            order = lead + [n for n in spatial if n not in lead]
            order += [n for n in range(len(block.iter_vars)) if n not in order]
            if order != list(range(len(block.iter_vars))):
                sch.reorder_block_iter_var(rv, order)
            break
    return sch.mod["main"]


@per_function
def inline_elementwise(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Inline every element-wise block that writes an intermediate buffer (not a parameter)."""
    sch = s_tir.Schedule(func)
    params = list(func.params)
    for _ in itertools.count():
        changed = False
        for rv in reversed(sch.get_child_blocks(sch.get_sblock("root"))):
            block = sch.get(rv)
            if block.init is not None or any(w.source.same_as(p) for w in block.writes for p in params):
                continue
            try:
                sch.compute_inline(rv)
                changed = True
            except ScheduleError:  # a block s_tir cannot inline stays
                continue
        if not changed:
            break
    return sch.mod["main"]
