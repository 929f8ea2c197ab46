"""Attention recognized by meaning: ``out = softmax(scale * Q K^T [masked]) V`` however a
PrimFunc writes it.

What the kernel (:mod:`tvm_dsm.kernels.attention`) needs is read from the function's blocks, not
from how they are named or ordered. After element-wise blocks are inlined (transposes, reshapes,
casts, the scale, the mask), attention is five blocks:

- the scores, a sum over the head dim ``d`` of ``q * k`` (times constants),
- a row max over the keys ``t`` of the scores (masked, scaled or otherwise),
- a row sum of ``exp(f - max)``,
- a row sum of ``exp(f - max) * v`` (or with the probability normalized, ``/ sum``),
- the output, that sum divided by the row sum (or copied), cast to the output's type.

Each of these forms is checked exactly, symbolically (SymPy), so the scale may sit on q, on the
scores, in the max or inside the exponent (any shift of a row cancels in the division), and the
mask may be a select, ``if_then_else``, an added ``0 / -inf`` term or a bool tensor compared
with 0. Where ``f`` is a constant times the score and the mask is provably ``t <= i``
(PyTorch's ``is_causal``) with a fill that underflows, the kernel's own scale and causal tiles
take it; any other ``f`` -- a bias or mask tensor added, ALiBi's ``slope[h] * (t - i)``, a
tanh soft cap -- and any other mask (a sliding window, a padding mask read from a tensor) the
kernel computes per key as written (:class:`ScoreTerms`), a masked key getting the function's
own fill. A weighted sum iterating in the output's order (``[B, S, H, D]``) is read with
its variables in the statistics' order (:func:`~tvm_dsm.fusion.cascade.rows_in_level_order`).
Index expressions are read after substituting every block's variables by the row max's (the
query rows and the key ``t``) and simplifying within their ranges, so ``[H, S, D]``,
``[B, H, S, D]``, ``[B, S, H, D]`` and reshaped forms all read as "the head dim innermost, one
position axis, the other axes indexed by head variables": a key/value axis indexed ``h // g`` is
grouped-query attention, an axis of extent 1 indexed 0 multi-query.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import sympy
import tvm
import tvm_ffi
from tvm import tirx
from tvm.sym import Analyzer, detect_iter_map, inverse_affine_iter_map
from tvm.tirx.analysis import undefined_vars

from ..errors import ClusterError
from ..fusion.cascade import Level, find_cascades, inline_elementwise, parse_reduction, rows_in_level_order
from ..fusion.symbolic import ToSympy, ToTIR, Unsupported, simplify
from ..ir import loads, root_blocks, substitute, uses

#: A mask's fill below this is -inf for the softmax: exp of it underflows to 0 in fp32 for any
#: score of smaller magnitude, and a causal row always keeps its diagonal key.
_MASKED = -1.0e9
#: Elements of a 16-byte vector of a 16-bit type, a multiple of any type's count: where a row of
#: the output may start
_VECTOR_ELEMENTS = 8
#: The score q . k in the symbolic forms.
_SCORE = sympy.Symbol("S", real=True)


@dataclass(frozen=True)
class HeadAxis:
    """An operand axis indexed by a head variable: ``(var // divisor) % modulus + offset``
    (``var`` the position of the variable in the rows; ``modulus`` 0: none), or ``offset`` where
    ``var`` is None. A divisor > 1 on a key/value axis is grouped-query attention; a flattened
    ``B * H`` axis read as ``[B, H]`` is two axes of one variable, ``// H`` and ``% H``; an offset
    reads heads of a tensor that holds more (q, k and v of one packed projection,
    :mod:`tvm_dsm.relax_packed_attention`), whose ``extent`` along the axis is then recorded (0:
    the heads the variable reaches)."""

    axis: int
    var: int | None
    divisor: int = 1
    modulus: int = 0
    offset: int = 0
    extent: int = 0

    def reached(self, head_extents: tuple):
        """The heads along the axis that the head variable reaches (``head_extents``: the head
        variables' extents, constants or expressions)."""
        if self.var is None:
            return 1
        heads = -(-head_extents[self.var] // self.divisor)
        if not self.modulus:
            return heads
        return min(heads, self.modulus) if isinstance(heads, int) else tirx.min(heads, self.modulus)


@dataclass(frozen=True)
class OperandLayout:
    """Where one operand's axes sit. ``dim``: the head-dim axis (innermost, what TMA tiles are
    cut along); ``seq``: the query (q, out) or key (k, v) position axis; ``heads``: every other
    axis."""

    dim: int
    seq: int
    heads: tuple[HeadAxis, ...]


@dataclass(frozen=True)
class ScoreTerms:
    """A key's exponent where it is more than the scaled score: ``value`` (fp32) of the score
    ``score`` (q . k), the query position ``query``, the key ``key``, the head variables
    ``heads`` (in :class:`AttentionShape`'s order) and loads of the function's other inputs (a
    bias or mask tensor, ALiBi's slopes); a key ``mask`` rejects gets the exponent ``fill`` the
    function gives it (-inf where its weight is 0), so rows the mask empties come out as the
    function computes them. ``skip_past_diagonal``: the mask rejects every key past the query
    and keeps the query's own, with a fill that underflows beside it, so the kernel skips the
    key tiles past the diagonal as causal attention does."""

    value: tirx.PrimExpr
    score: tirx.Var
    query: tirx.Var
    key: tirx.Var
    heads: tuple
    mask: object = None
    fill: object = float("-inf")  # a float, or an fp32 expression (a fill tensor's load)
    skip_past_diagonal: bool = False

    def tensor_loads(self) -> list:
        """The loads of other inputs that the terms read at each key (a bias or mask tensor's
        element; not a slope read once a head), each once: what a kernel may issue before the
        scores are ready."""
        found: list = []
        parts = [self.value, *([] if self.mask is None else [self.mask]),
                 *([] if isinstance(self.fill, float) else [self.fill])]
        for load in (ld for part in parts for ld in loads(part)):
            if any(uses(i, self.key) for i in load.indices) and not any(
                    tvm_ffi.structural_equal(load, f) for f in found):
                found.append(load)
        return found

    def load_at(self, load, query, key, heads) -> tirx.PrimExpr:
        """One of :meth:`tensor_loads` at the key ``key`` of the query ``query`` in heads ``heads``."""
        return substitute(load, _positions([self.query, self.key, *self.heads], [query, key, *heads]))

    def at(self, score, query, key, heads, loaded: list | None = None) -> tirx.PrimExpr:
        """The exponent of the key at ``key`` of the query at ``query`` in heads ``heads``,
        ``score`` its q . k, as TIR; ``loaded``: the values of :meth:`tensor_loads` there (in
        its order), read in their place."""
        replaced = list(zip(self.tensor_loads(), loaded)) if loaded is not None else []

        def read(part):
            return tvm_ffi.structural_map(part, [(tvm.ir.TensorLoad, lambda ld: next(
                (v for f, v in replaced if tvm_ffi.structural_equal(ld, f)), ld))]) if replaced else part

        places = [(self.score, score), *_positions([self.query, self.key, *self.heads], [query, key, *heads])]
        value = substitute(read(self.value), places)
        if self.mask is None:
            return value
        fill = tirx.const(self.fill, "float32") if isinstance(self.fill, float) else substitute(read(self.fill), places)
        return tirx.Select(substitute(read(self.mask), places), value, fill)


def _positions(variables: list, values: list) -> list:
    """``(variable, value)`` pairs, each value cast to its variable's index type."""
    return [(var, value if value.ty.dtype == var.ty.dtype else tirx.Cast(var.ty.dtype, value))
            for var, value in zip(variables, values)]


@dataclass(frozen=True)
class RowOutput:
    """A second output of one value a query row, a function of the row's log-sum-exp of the
    exponents (``lse = log(sum) + max``, what a backward pass or a merge of partial attentions
    reads): ``buffer[indices] = value``, ``indices`` over the query position ``query`` and the
    head variables ``heads``, ``value`` over ``lse`` (a placeholder), fp32."""

    buffer: object
    indices: tuple
    value: tirx.PrimExpr
    lse: tirx.Var
    query: tirx.Var
    heads: tuple

    def indices_at(self, query, heads) -> list:
        """The output's indices of the row of ``query`` in heads ``heads``."""
        places = _positions([self.query, *self.heads], [query, *heads])
        return [substitute(i, places) for i in self.indices]

    def value_of(self, lse) -> tirx.PrimExpr:
        """The output's value for a row whose log-sum-exp is ``lse``."""
        return tirx.Cast(str(self.buffer.ty.dtype), substitute(self.value, [(self.lse, lse)]))


@dataclass(frozen=True)
class SinkLogit:
    """A logit of one value a row that joins the row's softmax without a value of its own
    (gpt-oss's learned attention sink, one a head): the output is ``sum exp(e_t) v_t / (sum
    exp(e_t) + exp(value))`` over the keys' exponents ``e_t``. ``value`` (fp32) reads the
    function's other inputs over the head variables ``heads`` alone; the kernel starts each
    row's running max at it and its sum at 1."""

    value: tirx.PrimExpr
    heads: tuple

    def at(self, heads) -> tirx.PrimExpr:
        """The row's sink logit in heads ``heads``."""
        return substitute(self.value, _positions(list(self.heads), list(heads)))


@dataclass(frozen=True)
class AttentionShape:
    """An attention's sizes and operand layouts. ``heads``: all query heads, the product of
    ``head_extents`` (the extents of the head variables: batch, heads, ... in the rows' order);
    ``layouts``: q, k, v and out; ``dim``: the head dim of q and k, ``value_dim`` that of v and
    the output where it differs (DeepSeek's latent attention scores 192 columns and weighs 128)."""

    heads: int
    q_len: int
    kv_len: int
    dim: int
    scale: float
    causal: bool = False
    dtype: str = "float16"
    head_extents: tuple[int, ...] = ()
    layouts: tuple[OperandLayout, ...] = ()
    #: The function's parameters, where its kernel must keep them (a symbolic length: the
    #: kernels of its ranges share one function's parameters; other inputs the score terms read).
    params: tuple = field(default=(), compare=False)
    #: Positions of q, k, v and out among ``params``.
    positions: tuple[int, ...] = (0, 1, 2, 3)
    #: What the kernel computes for a key's exponent where it is more than ``scale`` times the
    #: score (``scale`` is then 1).
    terms: ScoreTerms | None = field(default=None, compare=False)
    #: Outputs of one value a row besides ``out`` (a log-sum-exp).
    row_outputs: tuple = field(default=(), compare=False)
    value_dim: int | None = None
    sink: SinkLogit | None = field(default=None, compare=False)

    @property
    def v_dim(self) -> int:
        """The head dim of v and the output."""
        return self.dim if self.value_dim is None else self.value_dim


@dataclass(frozen=True)
class DecodeShape:
    """Attention of one query a head (decode): the operands q, k, v and out with their index
    expressions over the head variables ``heads`` (extents ``head_extents``), the key ``key`` and
    the head-dim column ``column`` (innermost in all four). ``group`` consecutive values of head
    variable ``group_var`` (a position in ``heads``) read the same K and V rows (grouped-query
    attention; 1: none)."""

    func: tirx.PrimFunc
    operands: tuple
    heads: tuple
    head_extents: tuple[int, ...]
    key: tirx.Var
    column: tirx.Var
    indices: tuple
    kv_len: int
    dim: int
    scale: float
    dtype: str
    group_var: int
    group: int
    #: the exponent where it is more than ``scale`` times the score (``scale`` is then 1): its
    #: query position, if any, is 0
    terms: "ScoreTerms | None" = field(default=None, compare=False)


@dataclass(frozen=True)
class _Forms:
    """What every attention's checked forms give: the operands q, k, v, out, their indices in
    the rows' variables, the head-dim variables of q/k and of v/out, the mask's condition, the
    scale and sizes."""

    operands: tuple
    indices: tuple
    dim_var: tirx.Var
    column_var: tirx.Var
    cond: object
    scale: float
    dim: int
    dtype: str
    exponent: "_Exponent"
    row_blocks: tuple = ()  # blocks writing an output of one value a row (a log-sum-exp)
    value_dim: int = 0  # v's and the output's head dim


@dataclass(frozen=True)
class _Exponent:
    """The sums' exponent, read: its part that varies with the key (``of_key``, SymPy over the
    score ``S``, position symbols and the inputs' loads), the masked keys' value of that part
    (``fill``; None without a mask) and whether it is ``scale`` times the score alone."""

    of_key: sympy.Expr
    fill: object  # a float, a SymPy expression of the inputs' loads (a fill tensor), or None
    plain: bool
    shift: sympy.Expr = sympy.Integer(0)  # of the row: the sums' exponent less ``of_key``
    sink: sympy.Expr | None = None  # a sink logit's exponent (:class:`SinkLogit`), of the row alone


def _within_level(level: Level, indices) -> list:
    """``indices`` simplified over ``level``'s variables' ranges: an index a legalization
    reshaped and reshaped back (``(k // 128 + i) // 128 + b) % 24`` over ``k < 128``, ``i <
    128``, ``b < 24``) is its variable again (a variable stays one, unit extents too)."""
    analyzer = Analyzer()
    extents = [*zip(level.spatial, level.rows), (level.reduce_var, level.extent)]
    for var, extent in extents:
        analyzer.bind(var, tvm.ir.Range(tirx.const(0, var.ty), tirx.const(int(extent), var.ty)))
    return [i if isinstance(i, tirx.Var) else analyzer.simplify(i) for i in indices]


def find_attention(func: tirx.PrimFunc) -> AttentionShape:
    """What attention ``func`` computes; ClusterError naming what does not match."""
    return _Match(func).shape()


def find_decode_attention(func: tirx.PrimFunc) -> DecodeShape:
    """What decode attention (one query a head, no mask) ``func`` computes; ClusterError naming
    what does not match."""
    return _Match(func).decode()


def _float_constant(e) -> float | None:
    """``e`` as a float if it is a finite number, else None."""
    e = simplify(e)
    return float(e) if e.is_number and e.is_finite else None


class _Match:
    def __init__(self, func: tirx.PrimFunc):
        self.func = func
        self.inlined = rows_in_level_order(inline_elementwise(func))
        groups = find_cascades(self.inlined)
        if len(groups) != 1:
            raise ClusterError(f"attention is one cascade (max, exp-sum, exp-weighted sum); found {len(groups)}")
        group = groups[0]
        maxes = [lvl for lvl in group if lvl.op == "max"]
        sums = [lvl for lvl in group if lvl.op == "sum"]
        if len(group) != 3 or len(maxes) != 1 or len(sums) != 2:
            raise ClusterError(f"attention needs a row max and two row sums; got {[lvl.op for lvl in group]}")
        self.m = maxes[0]
        rows = _rank(self.m)
        by_rank = {_rank(lvl): lvl for lvl in sums}
        if set(by_rank) != {rows, rows + 1}:
            raise ClusterError("attention's sums are one per row and one per row and head-dim column")
        self.l, self.o = by_rank[rows], by_rank[rows + 1]
        self.m, self.l, self.o = (dataclasses.replace(lvl, value=_scores_kept_first(lvl.value, func.params))
                                  for lvl in (self.m, self.l, self.o))
        self.blocks = self._root_blocks()
        self.analyzer = Analyzer()
        self.ranges = {}
        #: symbols of the other inputs' loads and of the positions the sums' exponent reads, by
        #: name: the load in the row max's variables, or the variable (see :meth:`_reader`)
        self.inputs: dict[str, tvm.ir.PrimExpr] = {}
        self.places: dict[str, tirx.Var] = {}
        for var, extent in zip(self.m.spatial, self.m.rows):
            self._bind(var, extent)
        self._bind(self.m.reduce_var, self.m.extent)

    def _bind(self, var, extent) -> None:
        self.ranges[var] = int(extent)
        self.analyzer.bind(var, tvm.ir.Range(tirx.const(0, var.ty), tirx.const(int(extent), var.ty)))

    def _root_blocks(self) -> list:
        return root_blocks(self.inlined)

    # --- the scores and the canonical variables -------------------------------------------

    def _scores_load(self, level: Level):
        """The one load of the scores in a level's value (the other loads are levels and v)."""
        outputs = (self.m.output, self.l.output, self.o.output)
        found = [ld for ld in loads(level.value) if not any(ld.source.same_as(b) for b in outputs)
                 and not any(ld.source.same_as(p) for p in self.func.params)]
        sources = {ld.source.name for ld in found}
        if len(sources) != 1:
            raise ClusterError(f"{level.block} must read one score matrix besides the row statistics; "
                               f"reads {sorted(sources) or 'none'}")
        return found[0]

    def _canonical(self, level: Level) -> list[tuple]:
        """``level``'s variables as the row max's: matched through their loads of the scores;
        an axis of extent 1 the scores are not read along (the query axis of a decode's
        ``[B, 1, H, D]`` weighted sum) is 0."""
        own = self._scores_load(self.m).indices
        other = _within_level(level, self._scores_load(level).indices)
        mapping = []
        for mine, theirs in zip(own, other):
            if _is_zero(theirs) and (_is_zero(mine) or self.ranges.get(mine) == 1):
                continue  # an axis of extent 1, which a reshape's indices simplified to 0
            if not isinstance(theirs, tirx.Var):
                raise ClusterError(f"{level.block} reads the scores at {list(other)}, not at its own variables")
            mapping.append((theirs, mine))
        return mapping + [(var, tirx.const(0, var.ty)) for var, extent in zip(level.spatial, level.rows)
                          if int(extent) == 1 and not any(var.same_as(theirs) for theirs, _ in mapping)]

    def _scores(self) -> tuple[Level, list]:
        """The scores' reduction and its variables as the row max's."""
        source = self._scores_load(self.m).source
        producer = next((b for b in self.blocks if any(w.source.same_as(source) for w in b.writes)), None)
        level = parse_reduction(producer) if producer is not None else None
        if level is None or level.op != "sum":
            raise ClusterError(f"the scores {source.name} must be a sum over the head dim (q . k)")
        store = producer.body
        if not all(isinstance(i, tirx.Var) for i in store.indices):
            raise ClusterError(f"{producer.name_hint} must write the scores at its own variables")
        mapping = list(zip(store.indices, self._scores_load(self.m).indices))
        return level, mapping

    # --- the forms, checked symbolically ------------------------------------------------

    def _forms(self) -> _Forms:
        """The operands, read after every form is checked."""
        scores, to_rows = self._scores()
        d = scores.reduce_var
        self._bind(d, scores.extent)
        q_load, k_load, score_scale = self._score_product(scores, to_rows)
        cond = self._max_form()
        scale, normalized, exponent = self._sum_forms(cond)
        c, v_load = self._output_level()
        out_block, row_blocks = self._output_block(normalized)
        operands = [q_load.source, k_load.source, v_load.source, out_block.body.buffer]
        dtypes = {str(b.ty.dtype) for b in operands}
        if len(dtypes) != 1 or not dtypes <= {"float16", "bfloat16"}:
            raise ClusterError(f"attention takes q, k, v and out of one type, float16 or bfloat16; got "
                               f"{[str(b.ty.dtype) for b in operands]}")
        indices = (self._indices(q_load, to_rows), self._indices(k_load, to_rows),
                   self._indices(v_load, self._canonical(self.o)), self._out_indices(out_block, c))
        # in the kernel's units: S the product q . k, which the scores are a constant times
        exponent = dataclasses.replace(exponent, of_key=exponent.of_key.subs(_SCORE, score_scale * _SCORE))
        return _Forms(tuple(operands), indices, d, c, cond, score_scale * scale, scores.extent, dtypes.pop(),
                      exponent, tuple(row_blocks), self.ranges[c])

    def shape(self) -> AttentionShape:
        f = self._forms()
        t = self.m.reduce_var
        q_idx, k_idx, v_idx, out_idx = f.indices
        i = self._query_position(q_idx, k_idx, f.cond)
        heads = [var for var in self.m.spatial if not var.same_as(i)]
        q, k, v, out = f.operands
        order = [next((n for n, p in enumerate(self.func.params) if p.same_as(op)), None) for op in f.operands]
        if None in order or order != sorted(order):
            raise ClusterError("the attention kernel takes its parameters as (q, k, v, out) in that order (other "
                               f"inputs may sit between them); the function has {[p.name for p in self.func.params]}")
        causal, terms = False, None
        if f.cond is not None or not f.exponent.plain:
            if f.exponent.plain and self._causal(f.cond, i, t) and _underflows(f.exponent.fill):
                causal = True
            else:
                terms = self._terms(f, i, t, heads)
                causal = terms.skip_past_diagonal
        layouts = (self._layout("q", q, q_idx, i, f.dim_var, heads),
                   self._layout("k", k, k_idx, t, f.dim_var, heads),
                   self._layout("v", v, v_idx, t, f.column_var, heads),
                   self._layout("out", out, out_idx, i, f.column_var, heads))
        extents = tuple(self.ranges[var] for var in heads)
        if len(f.row_blocks) > 1:
            raise ClusterError(f"attention writes at most one output of the row statistics; writes "
                               f"{[str(b.name_hint) for b in f.row_blocks]}")
        row_outputs = tuple(self._row_output(block, f.exponent, i, heads) for block in f.row_blocks)
        sink = self._sink_logit(f.exponent, heads) if f.exponent.sink is not None else None
        if sink is not None and row_outputs:
            raise ClusterError("attention with a sink logit writes no output of the row statistics (its log-sum-exp "
                               "would count the sink)")
        params = (tuple(self.func.params) if terms is not None or row_outputs or sink is not None
                  or order != [0, 1, 2, 3] else ())
        scale = f.scale if terms is None else 1.0  # the terms' exponent holds it
        return AttentionShape(math.prod(extents), self.ranges[i], self.m.extent, f.dim, scale, causal, f.dtype,
                              extents, layouts, params, tuple(order), terms, row_outputs,
                              None if f.value_dim == f.dim else f.value_dim, sink)

    def _input_symbols(self) -> dict:
        """The other inputs' loads the exponent reads, by their symbols' names, in fp32."""
        return {name: load if load.ty.dtype == "float32" else tirx.Cast("float32", load)
                for name, load in self.inputs.items()}

    def _sink_logit(self, exponent: _Exponent, heads: list) -> SinkLogit:
        """The sink's exponent as TIR over the head variables; ClusterError where it reads
        anything else (the query position): the kernel reads it once a row, before the keys."""
        if any(sym.name.startswith("place") for sym in exponent.sink.free_symbols):
            raise ClusterError(f"a sink logit must be of the heads alone (read once a row); got {exponent.sink}")
        try:
            value = ToTIR(self._input_symbols(), "float32")(exponent.sink)
        except Unsupported as err:
            raise ClusterError(f"attention's sink logit {exponent.sink}: {err}") from err
        free = [v for ld in loads(value) for i in ld.indices for v in undefined_vars(i)]
        if not all(any(v.same_as(h) for h in heads) for v in free):
            raise ClusterError(f"a sink logit must be of the heads alone (read once a row); got {exponent.sink}")
        return SinkLogit(value, tuple(heads))

    def _row_output(self, block, exponent: _Exponent, i, heads: list) -> RowOutput:
        """A block writing one value a row from the row max M and sum L, read as a function of
        the row's log-sum-exp: ``L = exp(lse + shift(M))`` (the sums' own exponent) must leave M
        out of the value (``log(L) + M`` is the log-sum-exp itself)."""
        M, L, lse = (_symbol(n) for n in ("M", "L", "lse"))
        store = block.body
        value = _sympy(store.value, self._leaf(_SCORE))
        of_lse = simplify(value.subs(L, sympy.exp(lse + exponent.shift)))
        if of_lse.has(M) or of_lse.has(L) or of_lse.has(_SCORE):
            raise ClusterError(f"{block.name_hint} must write a function of the row's log-sum-exp "
                               f"(log(sum) + max); writes {value}")
        # its indices in the row max's variables: it reads the statistics at its own variables
        stat = next(ld for ld in loads(store.value) if ld.source.same_as(self.m.output) or ld.source.same_as(
            self.l.output))
        if stat.source.same_as(self.m.output):
            mine = list(self.m.spatial)
        else:
            pairs = self._canonical(self.l)
            mine = [next(m for theirs, m in pairs if theirs.same_as(v)) for v in self.l.spatial]
        if not all(isinstance(i, tirx.Var) for i in stat.indices):
            raise ClusterError(f"{block.name_hint} must read the row statistics at its own variables")
        mapping = list(zip(stat.indices, mine))
        indices = tuple(self.analyzer.simplify(substitute(i, mapping)) for i in store.indices)
        lse_var = tirx.Var("lse", "float32")
        try:
            emitted = ToTIR({"lse": lse_var}, "float32")(of_lse)
        except Unsupported as err:
            raise ClusterError(f"{block.name_hint}: {err}") from err
        return RowOutput(store.buffer, indices, emitted, lse_var, i, tuple(heads))

    def _terms(self, f: _Forms, i, t, heads: list, skipping: bool = True) -> ScoreTerms:
        """The exponent the kernel computes for each key (:class:`ScoreTerms`), from the sums';
        ``skipping``: whether key tiles past the diagonal may be skipped."""
        score = tirx.Var("score", "float32")
        symbols = {_SCORE.name: score}
        symbols.update((name, tirx.Cast("float32", var)) for name, var in self.places.items())
        symbols.update(self._input_symbols())
        try:
            value = ToTIR(symbols, "float32")(f.exponent.of_key)
        except Unsupported as err:
            raise ClusterError(f"attention's exponent {f.exponent.of_key}: {err}") from err
        mask = _without_bool_casts(f.cond) if f.cond is not None else None
        fill = f.exponent.fill if mask is not None else float("-inf")
        if not isinstance(fill, float):
            fill = ToTIR(symbols, "float32")(fill)
        skip = (skipping and mask is not None and _underflows(fill) and self.ranges[i] <= self.ranges[t]
                and _implies(self.analyzer, mask, t <= i)
                and self.analyzer.can_prove(substitute(mask, [(t, i)])))
        return ScoreTerms(value, score, i, t, tuple(heads), mask, fill, skip)

    def decode(self) -> DecodeShape:
        """Without a mask every query row is independent: the rows' variables are all heads
        (one the keys do not index, multi-query attention's heads or a query position, reads
        the same K and V rows along it)."""
        f = self._forms()
        if f.value_dim != f.dim:
            raise ClusterError(f"decode attention takes one head dim; v has {f.value_dim} columns, q and k {f.dim}")
        if f.exponent.sink is not None:
            raise ClusterError("decode attention's kernel has no sink logit (a term of the row joining the softmax)")
        t = self.m.reduce_var
        heads = [var for var in self.m.spatial if self.ranges[var] > 1]
        d = f.dim_var
        # v and the output are indexed by their own column variable: read as q's
        indices = [tuple(self.analyzer.simplify(substitute(i, [(f.column_var, d)])) for i in idx) for idx in f.indices]
        q_idx, k_idx, v_idx, out_idx = indices
        terms = self._decode_terms(f, t, heads) if f.cond is not None or not f.exponent.plain else None
        if f.row_blocks:
            raise ClusterError("decode attention writes one output")
        self._check_inits()
        for name, idx, keyed in (("q", q_idx, False), ("k", k_idx, True), ("v", v_idx, True), ("out", out_idx, False)):
            inner = idx[-1]
            if not (isinstance(inner, tirx.Var) and inner.same_as(d) or name == "out" and self._merged_heads(inner, d)
                    ) or _uses(idx[:-1], d):
                raise ClusterError(f"decode attention: {name} must be indexed by the head dim in its innermost "
                                   f"axis alone (16-byte loads of a row; the output also at a multiple of "
                                   f"{_VECTOR_ELEMENTS} plus it, its heads merged); got {[str(i) for i in idx]}")
            if _uses(idx, t) != keyed:
                raise ClusterError(f"decode attention: {name} must {'' if keyed else 'not '}be indexed by the key")
        for n, buf in enumerate(f.operands):
            columns = int(buf.ty.shape[-1])
            if columns != f.dim and not (n == 3 and columns % f.dim == 0):  # the output's heads may be merged
                raise ClusterError(f"decode attention: {buf.name}'s rows must be the {f.dim} columns of the head dim "
                                   f"(16-byte loads of whole rows); they have {columns}")
        ranges = {var: tvm.ir.Range(0, self.ranges[var]) for var in [*heads, d]}
        out = f.operands[3]
        if (math.prod(int(x) for x in out.ty.shape) != math.prod(self.ranges[v] for v in heads) * f.dim
                or not detect_iter_map(list(out_idx), ranges, check_level="bijective").indices):
            raise ClusterError(f"decode attention: the output must hold each head's row once; it is written at "
                               f"{[str(i) for i in out_idx]}")
        group_var, group = self._kv_group(heads, (k_idx, v_idx))
        return DecodeShape(self.func, f.operands, tuple(heads), tuple(self.ranges[v] for v in heads), t, d,
                           tuple(indices), self.m.extent, f.dim, 1.0 if terms else f.scale, f.dtype, group_var, group,
                           terms)

    def _merged_heads(self, inner, d) -> bool:
        """Whether ``inner`` is ``row + d``, ``row`` a multiple of :data:`_VECTOR_ELEMENTS` that
        ``d`` does not index: the output's heads merged into its innermost axis (``[B, 1, H *
        D]``, a model's attention output before its projection), each row stored in whole
        vectors."""
        row = self.analyzer.simplify(inner - d)
        return not _uses([row], d) and self.analyzer.can_prove(tirx.floormod(row, _VECTOR_ELEMENTS) == 0)

    def _decode_terms(self, f: _Forms, t, heads: list) -> ScoreTerms:
        """The exponent of one query's keys (:class:`ScoreTerms`, its query position 0). A mask
        must provably keep the last key: a row it empties weighs its keys by the fill, which the
        decode kernel's running max does not start below. A fill that underflows is -inf."""
        units = [var for var in self.m.spatial if self.ranges[var] == 1]
        query = units[0] if units else tirx.Var("query", "int32")
        terms = self._terms(f, query, t, heads, skipping=False)
        # every unit axis (the query position, a batch of one) at 0: the kernel binds no other
        zeros = [(v, tirx.const(0, v.ty.dtype)) for v in units]
        at_zero = lambda e: e if e is None or isinstance(e, float) else substitute(e, zeros)  # noqa: E731
        terms = dataclasses.replace(terms, value=at_zero(terms.value), mask=at_zero(terms.mask),
                                    fill=at_zero(terms.fill))
        if terms.mask is not None:
            last = substitute(terms.mask, [(t, tirx.const(self.m.extent - 1, t.ty.dtype))])
            if not self.analyzer.can_prove(last):
                raise ClusterError(f"decode attention: a mask must provably keep the last key; got {terms.mask}")
        return dataclasses.replace(terms, fill=float("-inf") if _underflows(terms.fill) else terms.fill)

    def _check_inits(self) -> None:
        """The sums start at 0 and the max at its type's lowest value or -inf (the kernel's own
        starts)."""
        scores, _ = self._scores()
        for level in (scores, self.l, self.o):
            if _float_constant(_sympy(level.init, lambda load: sympy.nan)) != 0.0:
                raise ClusterError(f"decode attention: {level.block} must start at 0; starts at {level.init}")
        start = _float_constant(_sympy(self.m.init, lambda load: sympy.nan))
        lowest = float(tvm.te.min_value(str(self.m.output.ty.dtype)).value)
        if start is not None and start > lowest:
            raise ClusterError(f"decode attention: the row max must start below any score; starts at {self.m.init}")

    def _kv_group(self, heads: list, kv_indices: tuple) -> tuple[int, int]:
        """The head variable whose consecutive values read the same K and V rows, and how many:
        the largest ``g`` (dividing its extent) for which ``h`` and ``h // g * g`` index them
        alike, proven; ``(last head, 1)`` where none does."""
        found = []
        for n, var in enumerate(heads):
            extent = self.ranges[var]
            for g in sorted((g for g in range(2, extent + 1) if extent % g == 0), reverse=True):
                grouped = var // g * g
                if all(self.analyzer.can_prove(substitute(i, [(var, grouped)]) - i == 0)
                       for idx in kv_indices for i in idx):
                    found.append((n, g))
                    break
        if len(found) > 1:
            raise ClusterError(f"decode attention: the K/V rows are shared along one head axis at most; "
                               f"shared along {[str(heads[n]) for n, _ in found]}")
        return found[0] if found else (len(heads) - 1, 1)

    def _score_product(self, scores: Level, to_rows: list) -> tuple:
        params = [ld for ld in loads(scores.value)]
        if len(params) != 2 or not all(any(ld.source.same_as(p) for p in self.func.params) for ld in params):
            raise ClusterError(f"the scores must be a product of two inputs, q and k; got {scores.value}")
        def symbol(buffer):  # by identity: two inputs may share a name
            return sympy.Symbol(f"x{next(n for n, ld in enumerate(params) if ld.source.same_as(buffer))}", real=True)

        f = _sympy(scores.value, lambda load: symbol(load.source))
        a, b = (symbol(ld.source) for ld in params)
        constant = _float_constant(f / (a * b))
        if constant is None:
            raise ClusterError(f"the scores must be q . k times a constant; got {f}")
        t = self.m.reduce_var
        first = self._indices(params[0], to_rows)
        q_load, k_load = (params[1], params[0]) if _uses(first, t) else (params[0], params[1])
        return q_load, k_load, constant

    def _max_form(self):
        """The mask's condition (or None), checking that the row max reads the scores and a
        masked score is a constant. What the max is of only shifts the exponents of a row, which
        the division cancels: the kernel shifts by its own running max of the exponents."""
        value = self.m.value
        cond = _select_condition(value, self.func.params)
        kept = _sympy(_with_branch(value, True), *self._reader(self.m, _SCORE))
        if not kept.has(_SCORE):
            raise ClusterError(f"the row max must be over the scores; got {kept}")
        fill = _sympy(_with_branch(value, False), *self._reader(self.m, _SCORE)) if cond is not None else None
        if fill is not None and (fill.has(_SCORE) or not fill.free_symbols <= set(map(_symbol, self.inputs))):
            raise ClusterError(f"a masked score must be a constant or read the inputs alone; got {fill}")
        return cond

    def _leaf(self, s: sympy.Symbol, **named):
        """Symbols for a level's loads: the scores ``s``, the row statistics M and L, the
        weighted sum O, and ``named`` buffers."""
        levels = {"M": self.m.output, "L": self.l.output, "O": self.o.output}
        scores = self._scores_load(self.m).source

        def leaf(load):
            if load.source.same_as(scores):
                return s
            for name, buf in levels.items():
                if load.source.same_as(buf):
                    return sympy.Symbol(name, real=True)
            for name, buf in named.items():
                if load.source.same_as(buf):
                    return sympy.Symbol(name, real=True)
            raise Unsupported(f"load of {load.source.name}")

        return leaf

    def _reader(self, level: Level, s: sympy.Symbol, **named) -> tuple:
        """The leaf and the variable namer of a value of ``level`` that may read the function's
        other inputs (a bias or mask tensor, ALiBi's slopes) and the positions (``j - i``): an
        input's load and a variable are named by their form in the row max's variables, one
        symbol wherever a level reads them (:attr:`inputs`, :attr:`places`)."""
        mapping = [] if level is self.m else self._canonical(level)
        own = list(self.m.spatial) + [self.m.reduce_var]
        leaf = self._leaf(s, **named)

        def read(load):
            if load.source.same_as(self.m.output) or load.source.same_as(self.l.output):
                self._check_row_read(load, mapping, level.block)
            if any(load.source.same_as(p) for p in self.func.params) and not any(
                    load.source.same_as(b) for b in named.values()):
                at = substitute(load, mapping) if mapping else load
                key = str(at)  # the buffer by identity: two inputs may share a name (two Relax vars "lv2")
                name = next((n for n, seen in self.inputs.items()
                             if seen.source.same_as(at.source) and str(seen) == key), None)
                if name is None:
                    name = f"input{len(self.inputs)}"
                    self.inputs[name] = at
                return _symbol(name)
            return leaf(load)

        def variable(var):
            mine = next((m for theirs, m in mapping if theirs.same_as(var)), var)
            n = next((n for n, v in enumerate(own) if v.same_as(mine)), None)
            if n is None:
                raise Unsupported(f"variable {var.name}, not a position of the rows or the key")
            self.places[f"place{n}"] = mine
            return _symbol(f"place{n}")

        return read, variable

    def _check_row_read(self, load, mapping: list, where: str) -> None:
        """ClusterError unless ``load`` of a row statistic (the max or the sum) reads the row
        being computed: at the row max's own variables once ``mapping`` (a level's canonical
        variables, or the output block's in the rows') is applied."""
        at = [self.analyzer.simplify(substitute(i, mapping)) for i in load.indices]
        rows = [(var, extent) for var, extent in zip(self.m.spatial, self.m.rows)]
        if len(at) != len(rows) or not all(
                (isinstance(i, tirx.Var) and i.same_as(var)) or (extent == 1 and _is_zero(i))
                for i, (var, extent) in zip(at, rows)):
            raise ClusterError(f"{where} reads {load.source.name} at {[str(i) for i in load.indices]}, not at "
                               "its own row")

    def _of_key(self) -> set:
        """The symbols that vary with the key: the score, the key variable and the inputs' loads
        it indexes."""
        t = self.m.reduce_var
        keyed = {_SCORE, *(_symbol(n) for n, var in self.places.items() if var.same_as(t))}
        keyed.update(_symbol(n) for n, load in self.inputs.items() if uses(load, t))
        return keyed

    def _sum_forms(self, cond) -> tuple[float, bool, _Exponent]:
        """Check the exp-sum and the exp-weighted sum of v: terms ``exp(f)`` times a factor of
        the row alone (the max's shift, ``exp(-M)`` or ``exp(-c M)`` where the scale sits inside
        the exponent: the division cancels it, and the kernel shifts by its own running max),
        ``f`` the rest of the exponent: ``c * scores`` (``c > 0``), or any function of the
        score, the positions and the other inputs' loads (a bias, a soft cap); the scale ``c``
        (1 for the latter), whether the weighted sum divides by the exp-sum (the probabilities
        normalized before the product), and the exponent read."""
        s, M, L, V = _SCORE, *(_symbol(n) for n in ("M", "L", "V"))
        v = self._v_load().source
        for level in (self.l, self.o):
            own = _select_condition(level.value, self.func.params)
            if own is not None and not _same_condition(own, cond, self._canonical(level)):
                raise ClusterError(f"{level.block} is masked differently from the row max")
        l_kept = _sympy(_with_branch(self.l.value, True), *self._reader(self.l, s))
        exponent = sympy.expand(sympy.log(l_kept), force=True) if l_kept.func == sympy.exp else None
        if exponent is None:
            raise ClusterError(f"the row sum must be of exp(f(scores) - a shift of the row); got {l_kept}")
        keyed = self._of_key()
        shift = sympy.Add(*(term for term in sympy.Add.make_args(exponent) if term.free_symbols & {M, L}))
        of_key = sympy.simplify(exponent - shift)
        if not of_key.has(s) or of_key.free_symbols & {M, L} or shift.free_symbols & keyed:
            raise ClusterError(f"the row sum must be of exp(f(scores) - a shift of the row); got {l_kept}")
        scale = _float_constant(of_key / s)
        plain = scale is not None and scale > 0
        o_kept = _sympy(_with_branch(self.o.value, True), *self._reader(self.o, s, V=v))
        normalized = _zero(o_kept - l_kept * V / L)
        sink = None
        if not normalized and not _zero(o_kept - l_kept * V):
            sink = _sink_exponent(l_kept * V / o_kept - L, shift, keyed | {M, L, s, V})
            if sink is None:
                raise ClusterError(f"the weighted sum must be of exp(f(scores) - max) * v (or / the row sum, or / "
                                   f"the row sum and a sink's exp(logit - max)); got {o_kept}")
            normalized = True
        denominator = L if sink is None else L + sympy.exp(sink + shift)
        fill = None
        if cond is not None:
            # A masked key's term in either sum is 0, or the row's shift times exp(F) for one
            # constant F: the exponent the kernel gives it.
            fills = set()
            for level, weight in ((self.l, 1), (self.o, V / denominator if normalized else V)):
                masked = _sympy(_with_branch(level.value, False), *self._reader(level, s, V=v))
                fills.add(_masked_exponent(masked, sympy.exp(shift) * weight, set(map(_symbol, self.inputs))))
            if None in fills or len(fills) != 1:
                raise ClusterError(f"the sums must give a masked key one weight exp(F) (F a constant, or -inf: a "
                                   f"term of 0); {self.l.block} and {self.o.block} give it "
                                   f"{_sympy(_with_branch(self.l.value, False), *self._reader(self.l, s))} and "
                                   f"{_sympy(_with_branch(self.o.value, False), *self._reader(self.o, s, V=v))}")
            fill = fills.pop()
        return (scale if plain else 1.0), normalized, _Exponent(of_key, fill, plain, shift, sink)

    def _v_load(self):
        """The weighted sum's load of v: the one input it reads that the row sum does not (that
        one's other inputs are the exponent's)."""
        params = self.func.params
        exponent = [ld.source for ld in loads(self.l.value) if any(ld.source.same_as(p) for p in params)]
        found = [ld for ld in loads(self.o.value)  # by identity: two inputs may share a name (two Relax vars "lv2")
                 if any(ld.source.same_as(p) for p in params) and not any(ld.source.same_as(e) for e in exponent)]
        if not found or any(not ld.source.same_as(found[0].source) for ld in found[1:]):
            raise ClusterError(f"the weighted sum must read one input besides the exponent's, v; reads "
                               f"{sorted({ld.source.name for ld in found})}")
        return found[0]

    def _output_level(self) -> tuple:
        """The weighted sum's head-dim variable and its load of v."""
        seen = [theirs for theirs, _ in self._canonical(self.o)]
        c = [var for var in self.o.spatial if not any(var.same_as(x) for x in seen)]
        if len(c) != 1:
            raise ClusterError(f"{self.o.block} must have one axis more than the rows: the head dim")
        self._bind(c[0], self.o.rows[list(self.o.spatial).index(c[0])])
        return c[0], self._v_load()

    def _output_block(self, normalized: bool):
        """The block writing the output: the weighted sum divided by the row sum (or, with the
        probabilities normalized, copied), cast to the output's type; or, with the
        probabilities normalized, the weighted sum itself accumulating into the output (a
        Relax ``matmul`` of the softmax and v)."""
        writers = [b for b in self.blocks if any(w.source.same_as(p) for w in b.writes for p in self.func.params)]
        statistics = (self.m.output, self.l.output)
        row_blocks = [b for b in writers if b.name_hint not in (self.m.block, self.l.block, self.o.block)
                      and isinstance(b.body, tirx.BufferStore) and loads(b.body.value)
                      and all(any(ld.source.same_as(x) for x in statistics) for ld in loads(b.body.value))]
        writers = [b for b in writers if b not in row_blocks]
        if len(writers) != 1 or not isinstance(writers[0].body, tirx.BufferStore):
            raise ClusterError("attention writes one output, from one block (and outputs of the row statistics)")
        if writers[0].name_hint == self.o.block:  # the weighted sum accumulates into the output
            if not normalized:
                raise ClusterError("a weighted sum written as the output must be of the normalized probabilities")
        else:
            O, L = sympy.Symbol("O", real=True), sympy.Symbol("L", real=True)
            value = _sympy(writers[0].body.value, self._leaf(sympy.Symbol("S", real=True)))
            want = O if normalized else O / L
            if not _zero(value - want):
                raise ClusterError(f"the output must be the weighted sum "
                                   f"{'' if normalized else 'divided by the row sum'}; got {value}")
        taken = {writers[0].name_hint, self.m.block, self.l.block, self.o.block, *(b.name_hint for b in row_blocks)}
        extra = [b for b in self.blocks if b.name_hint not in taken and b.init is None]
        if extra:
            raise ClusterError(f"attention has no other stage; found {[str(b.name_hint) for b in extra]}")
        return writers[0], row_blocks

    def _out_indices(self, block, c) -> list:
        """The output's indices in the rows' variables: the output block reads the weighted
        sum at an affine map of its own variables (a reshape, a transpose), inverted."""
        store = block.body
        if block.name_hint == self.o.block:  # the weighted sum is the output
            return self._indices(store, self._canonical(self.o))
        o_load = next(ld for ld in loads(store.value) if ld.source.same_as(self.o.output))
        units = [(iv.var, tirx.const(0, iv.var.ty)) for iv in block.iter_vars if int(iv.dom.extent) == 1]
        ranges = {iv.var: iv.dom for iv in block.iter_vars if int(iv.dom.extent) > 1}
        found = detect_iter_map([substitute(i, units) for i in o_load.indices], ranges, check_level="bijective")
        if not found.indices:
            raise ClusterError(f"the output block must read each weighted-sum element once; reads "
                               f"{self.o.output.name}{list(o_load.indices)}")
        to_rows = self._canonical(self.o)
        (written,) = [b.body.indices for b in self.blocks if b.name_hint == self.o.block]
        in_rows = [substitute(i, to_rows) for i in written]  # the weighted sum's axes, in its buffer's order
        try:
            inverse = inverse_affine_iter_map(found.indices, in_rows)
        except tvm.error.InternalError as err:
            raise ClusterError(f"the output block's indices cannot be inverted: {err}") from err
        in_row_variables = [*units, *inverse.items()]
        for load in loads(store.value):
            if load.source.same_as(self.m.output) or load.source.same_as(self.l.output):
                self._check_row_read(load, in_row_variables, block.name_hint)
        return [self.analyzer.simplify(substitute(i, in_row_variables)) for i in store.indices]

    # --- indices and layouts -----------------------------------------------------------

    def _indices(self, load, mapping: list) -> list:
        return [self.analyzer.simplify(substitute(i, mapping)) for i in load.indices]

    def _layout(self, name: str, buf, indices: list, position, dim, heads: list) -> OperandLayout:
        shape = [int(x) for x in buf.ty.shape]
        where = f"{name} {buf.name}{shape} indexed {[str(i) for i in indices]}"
        axes = {n for n, i in enumerate(indices) if isinstance(i, tirx.Var) and i.same_as(dim)}
        if axes != {len(indices) - 1}:
            raise ClusterError(f"{where}: the head dim must be the innermost axis (TMA tiles run along it)")
        seq = [n for n, i in enumerate(indices) if isinstance(i, tirx.Var) and i.same_as(position)]
        if len(seq) != 1 or shape[seq[0]] != self.ranges[position]:
            raise ClusterError(f"{where}: one axis must be the whole {'key' if name in 'kv' else 'query'} position")
        if shape[-1] != self.ranges[dim]:
            raise ClusterError(f"{where}: the head dim is {self.ranges[dim]}")
        axes = []
        for n, index in enumerate(indices):
            if n in (seq[0], len(indices) - 1):
                continue
            axis = _head_axis(n, index, heads)
            if axis is None:
                raise ClusterError(f"{where}: axis {n} must be indexed by a head variable (h, h // g, h % g)")
            if not self.analyzer.can_prove(index < shape[n]):
                raise ClusterError(f"{where}: axis {n} has {shape[n]} heads, fewer than its index reaches")
            if shape[n] != axis.reached([self.ranges[var] for var in heads]):  # it holds more heads
                axis = dataclasses.replace(axis, extent=shape[n])
            axes.append(axis)
        return OperandLayout(len(indices) - 1, seq[0], tuple(axes))

    def _query_position(self, q_idx: list, k_idx: list, cond):
        """The row variable that is the query position: one q reads by and k does not (the one
        the mask compares with the key, if masked). Without a mask every such variable gives
        the same result (rows are independent); the longest is tiled along."""
        candidates = [var for var in self.m.spatial if _uses(q_idx, var) and not _uses(k_idx, var)]
        if cond is not None:  # the one the mask compares, where it compares one
            candidates = [var for var in candidates if uses(cond, var)] or candidates
        if not candidates:
            raise ClusterError("q must be indexed by a query position the keys are not (and the mask compares)")
        return max(candidates, key=lambda var: self.ranges[var])

    def _causal(self, cond, i, t) -> bool:
        """Whether ``cond`` is provably the causal mask: key ``t`` kept iff ``t <= i``."""
        cond = _without_bool_casts(cond)
        analyzer = self.analyzer
        return analyzer.can_prove(tirx.Or(tirx.Not(cond), t <= i)) and analyzer.can_prove(tirx.Or(cond, i < t))


def _sink_exponent(extra, shift, of_key: set):
    """σ where ``extra`` (the weighted sum's denominator less the row sum) is ``exp(σ + shift)``,
    σ free of ``of_key`` (the score, the key, v, the row statistics): a sink logit; else None."""
    extra = simplify(extra)
    if extra.func != sympy.exp:
        return None
    sigma = simplify(sympy.expand(sympy.log(extra), force=True) - shift)
    return None if sigma.free_symbols & of_key else sigma


def _is_zero(index) -> bool:
    return isinstance(index, tirx.IntImm) and int(index) == 0


def _underflows(fill) -> bool:
    """Whether a masked key's exponent ``fill`` is a number at or below :data:`_MASKED`: its
    weight is 0 beside any score of smaller magnitude, so tiles of masked keys may be skipped."""
    return isinstance(fill, float) and fill <= _MASKED


def _symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, real=True)


def _implies(analyzer: Analyzer, cond, goal) -> bool:
    """Whether ``cond`` provably implies ``goal`` (a conjunction: where one of its terms does)."""
    if isinstance(cond, tirx.And):
        return _implies(analyzer, cond.a, goal) or _implies(analyzer, cond.b, goal)
    return analyzer.can_prove(tirx.Or(tirx.Not(cond), goal))


def _masked_exponent(term, base, inputs: set):
    """``F`` where a masked key's ``term`` is ``exp(F) * base`` for a constant ``F`` (-inf: a
    term of 0; SymPy may have evaluated ``exp(-3.4e38 * c)`` as a tiny number), or for an
    expression of the ``inputs``' loads alone (a fill tensor); None where it is not of that
    form."""
    if _zero(term):
        return float("-inf")
    ratio = simplify(term / base)
    if ratio.is_number:
        if ratio.is_zero:
            return float("-inf")
        return float(sympy.log(ratio)) if ratio.is_positive else None
    if ratio.func == sympy.exp and ratio.args[0].is_number:
        exponent = ratio.args[0]
        return float("-inf") if exponent == -sympy.oo else float(exponent)
    if ratio.func == sympy.exp and ratio.args[0].free_symbols <= inputs:
        return ratio.args[0]
    return None


def _without_bool_casts(cond):
    """``cond`` with comparisons of a boolean cast to an integer written as the boolean: a mask
    tensor of ``t <= i`` read back as ``0 < int(t <= i)`` (``topi.where`` over a bool tensor)."""
    def boolean(e):
        return e.value if isinstance(e, tirx.Cast) and e.value.ty.dtype == "bool" else None

    def is_const(e, value) -> bool:
        return isinstance(e, tirx.IntImm) and int(e) == value

    def plain(node):
        a, b = boolean(node.a), boolean(node.b)
        if isinstance(node, tirx.LT) and b is not None and is_const(node.a, 0):
            return b
        if isinstance(node, (tirx.GT, tirx.NE)) and a is not None and is_const(node.b, 0):
            return a
        if isinstance(node, tirx.EQ) and a is not None and is_const(node.b, 1):
            return a
        return node

    return tvm_ffi.structural_map(cond, [(kind, plain) for kind in (tirx.LT, tirx.GT, tirx.NE, tirx.EQ)])


def _rank(level: Level) -> int:
    """A level's spatial axes, those of extent 1 left out (a kept dimension of a reduction)."""
    return sum(int(extent) > 1 for extent in level.rows)


def _sympy(expr, leaf, variable=None) -> sympy.Expr:
    try:
        return ToSympy(leaf, variable=variable)(expr)
    except Unsupported as err:
        raise ClusterError(f"attention: unsupported {err} in {expr}") from err


def _zero(e) -> bool:
    """Whether ``e`` is provably 0 (``0.0`` included)."""
    return bool(e.is_zero) or bool(simplify(e).is_zero)


def _uses(indices: list, var) -> bool:
    return any(uses(i, var) for i in indices)


def _head_axis(axis: int, index, heads: list) -> HeadAxis | None:
    """``axis`` as a :class:`HeadAxis` if ``index`` is a constant, ``h``, ``h // a``, ``h % b``,
    ``h // a % b`` or ``h % b // a`` (``a`` dividing ``b``) of a head variable ``h``, or one of
    those plus a constant."""
    if isinstance(index, tirx.IntImm):
        return HeadAxis(axis, None, offset=int(index.value)) if index.value >= 0 else None
    if isinstance(index, tirx.Add) and isinstance(index.b, tirx.IntImm) and index.b.value > 0:
        inner = _head_axis(axis, index.a, heads)
        return None if inner is None or inner.var is None else dataclasses.replace(inner, offset=int(index.b.value))
    divisor = modulus = None
    if isinstance(index, tirx.FloorDiv) and isinstance(index.b, tirx.IntImm):
        index, divisor = index.a, int(index.b.value)
        if isinstance(index, tirx.FloorMod) and isinstance(index.b, tirx.IntImm):
            if int(index.b.value) % divisor:
                return None
            index, modulus = index.a, int(index.b.value) // divisor
    elif isinstance(index, tirx.FloorMod) and isinstance(index.b, tirx.IntImm):
        index, modulus = index.a, int(index.b.value)
        if isinstance(index, tirx.FloorDiv) and isinstance(index.b, tirx.IntImm):
            index, divisor = index.a, int(index.b.value)
    pos = next((n for n, var in enumerate(heads) if isinstance(index, tirx.Var) and var.same_as(index)), None)
    return None if pos is None else HeadAxis(axis, pos, divisor or 1, modulus or 0)


def _is_mask(node) -> bool:
    """Whether ``node`` selects between two values (``Select`` or ``if_then_else``)."""
    return isinstance(node, tirx.Select) or (isinstance(node, tvm.ir.Call) and node.op.name.endswith("if_then_else"))


def _reads_only(expr, params) -> bool:
    """Whether every load in ``expr`` reads one of ``params``."""
    return all(any(ld.source.same_as(p) for p in params) for ld in loads(expr))


def _selects(expr) -> list:
    found = []

    def visit(node):
        if _is_mask(node):
            found.append(node)
        return node

    tvm_ffi.structural_map(expr, [(tirx.Select, visit), (tvm.ir.Call, visit)])
    return found


def _parts(node) -> tuple:
    if isinstance(node, tirx.Select):
        return node.condition, node.true_value, node.false_value
    return tuple(node.args)


def _scores_kept_first(expr, params):
    """``expr`` with each mask written masked-first (``where(masked, fill, scores)``, torch's
    ``masked_fill``) turned kept-first, its condition negated and its branches swapped: the true
    branch is the one that reads more than the function's inputs ``params`` (the scores), as
    :func:`_with_branch` reads it."""

    def flip(node):
        if not _is_mask(node):
            return node
        cond, yes, no = _parts(node)
        if not _reads_only(yes, params) or _reads_only(no, params):
            return node
        return tirx.Select(tirx.Not(cond), no, yes) if isinstance(node, tirx.Select) \
            else tirx.if_then_else(tirx.Not(cond), no, yes)

    return tvm_ffi.structural_map(expr, [(tirx.Select, flip), (tvm.ir.Call, flip)])


def _select_condition(expr, params):
    """The one condition of the masks in ``expr`` (None without a mask); ClusterError for
    several different ones or a mask reading memory other than the function's inputs
    ``params``."""
    conds = [_parts(node)[0] for node in _selects(expr)]
    if not conds:
        return None
    if not all(_reads_only(c, params) for c in conds) or not all(tvm_ffi.structural_equal(c, conds[0]) for c in conds):
        raise ClusterError(f"attention takes one mask computed from the positions and its inputs; got "
                           f"{[str(c) for c in conds]}")
    return conds[0]


def _same_condition(cond, other, mapping) -> bool:
    return other is not None and tvm_ffi.structural_equal(substitute(cond, mapping), other)


def _with_branch(expr, kept: bool):
    """``expr`` with every mask replaced by its kept (or masked) branch."""

    def choose(node):
        if _is_mask(node):
            _, yes, no = _parts(node)
            return yes if kept else no
        return node

    return tvm_ffi.structural_map(expr, [(tirx.Select, choose), (tvm.ir.Call, choose)])
