"""How one level of a fused cascade keeps its running state: one rule per incremental form.

A level's rule absorbs an element of the reduction axis into its state during the scan, merges
the partial states of several parts into one, and writes the level's output row. The forms are
the ones :func:`tvm_dsm.fusion.cascade.prove` decides:

* plain: state (op) F(x_k, deps); nothing to correct;
* rescale / shift: before it absorbs more, the state is multiplied by (rescale) or added to
  (shift) the proven correction for its dependencies' moves. A state still at its identity is
  left alone (0 * inf or -inf - -inf would otherwise produce NaN), and so is one whose
  dependencies did not move (the correction is exactly the identity then);
* split: one float64 accumulator per x-term G(x), combined with the dependencies' final values
  H(y) after the loop;
* top-k: k (value, index) pairs best first (:mod:`tvm_dsm.fusion.top_k_pairs`); 16-bit values
  scan as packed integer keys (:mod:`tvm_dsm.fusion.top_k_keys`).

A rule writes into the fused block under construction (:mod:`tvm_dsm.fusion.fused_block`), whose
``for_each``, ``operand``, ``symbols`` and ``bind`` place a level's expressions in the block's
loops and variables. States are keyed by the level's position in its group: ``state[j]`` the
running value, ``side`` the rule's side-state buffers (:meth:`LevelRule.side_state`).
"""

from __future__ import annotations

import functools

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Range
from tvm.tirx.script.builder import ir as T

from ..ir import loads
from . import top_k_keys, top_k_pairs
from .cascade import Level
from .symbolic import ToTIR

_COMBINE = {"sum": lambda a, b: a + b, "max": tirx.max, "min": tirx.min}
_SPLIT_ACCUMULATOR = "float64"  # power sums cancel badly in fp32, e.g. the 3rd moment
_EMPTY_INDEX = -1  # the index of a top-k slot that holds no element yet


def state_index(extra: list) -> list:
    """Index of a state buffer: the level's extra axes, or [0] for a scalar state."""
    return list(extra) if extra else [0]


def dep_symbols(level: Level, new: dict, old: dict) -> dict:
    """The correction's symbols for the dependencies' scalar states: y{d}_new, y{d}_old and
    y{d} (the old one) for each dependency d held in ``new`` / ``old`` (buffers of one)."""
    table = {}
    for d in level.deps:
        if d in new:
            table[f"y{d}_new"] = new[d][0]
        if d in old:
            table[f"y{d}_old"] = old[d][0]
            table[f"y{d}"] = old[d][0]
    return table



def quiet_nan(dtype: str) -> tirx.PrimExpr:
    """A quiet NaN of ``dtype``. bfloat16's by its bits: TVM's CUDA codegen prints a bfloat16
    NaN constant as ``__float2bfloat16_rn(nanf)``, which nvcc rejects."""
    if dtype == "bfloat16":
        return tirx.reinterpret("bfloat16", tirx.const(0x7FC0, "uint16"))
    return tirx.const(float("nan"), dtype)

class LevelRule:
    """What every form shares: the state's shape, its initial values and the output row."""

    #: Whether a row's lanes each keep a slice of the state's last axis.
    split_over_lanes = True

    def __init__(self, level: Level, position: int, axes: list[int]):
        self.level = level
        self.position = position  # in the group: the key of the level's state buffers
        self.axes = axes  # the state's axes besides the row

    @property
    def dtype(self) -> str:
        return str(self.level.output.ty.dtype)

    def side_state(self) -> list[tuple[str, int]]:
        """(dtype, initial value) of each state buffer the level keeps besides its running
        value."""
        return []

    def init(self, block, value, side: list) -> None:
        """Every state buffer of the level at its initial value."""
        block.for_each(self, lambda e: T.buffer_store(value, self.level.init, state_index(e)))
        for buf, (dtype, init) in zip(side, self.side_state()):
            block.for_each(self, lambda e, buf=buf, dtype=dtype, init=init: T.buffer_store(
                buf, tirx.const(init, dtype), state_index(e)))

    def packed_keys(self):
        """(key registers, the value they pack) where the level scans as packed keys; only a
        top-k of 16-bit values does."""
        return None

    def row_regions(self, rows: list) -> list:
        """The output regions of one row."""
        ranges = [Range.from_min_extent(r, 1) for r in rows] + [Range(0, e) for e in self.axes]
        return [tirx.BufferRegion(self.level.output, ranges)]

    def finish(self, block, rows: list, state: dict, side: list) -> None:
        """Write the level's output row from its state."""
        j = self.position
        block.for_each(self, lambda e: T.buffer_store(
            self.level.output, tirx.BufferLoad(state[j], state_index(e)), rows + e))

    def _for_each_updated(self, block, emit) -> None:
        """``emit`` over the state a scan step updates: a level other levels read is a scalar
        (its new value goes to a register of its own, committed after the step)."""
        if self.position in block.read_by_others:
            emit([])
        else:
            block.for_each(self, emit)


class PlainRule(LevelRule):
    """state (op) F(x_k, deps); partial states combine by the op."""

    def update(self, block, rows: list, k, state: dict, new: dict, side: list, first: bool) -> None:
        """Absorb element ``k``. ``first``: the chunk's first element, which corrects the state
        for the dependencies' moves over the chunk (the later ones add to the corrected state:
        the dependencies do not move within the chunk)."""
        j, level = self.position, self.level
        target = new[j] if j in block.read_by_others else state[j]
        correct = self._correction_at_update(block, rows, k, state, new) if first else None

        def emit(extra):
            slot = state_index(extra)
            current = tirx.BufferLoad(state[j] if first else target, slot)
            operand = _running_quotients(block.operand(level, rows, k, extra, new), [new[d] for d in level.deps])
            if correct is not None:
                current = correct(current, extra)
            T.buffer_store(target, _COMBINE[level.op](current, operand), slot)

        self._for_each_updated(block, emit)

    def merge(self, block, rows: list, merged: dict, merged_side: list, partial: dict,
              partial_side: list, sources: list) -> None:
        """merged = op over the parts ``sources`` of corrected(partial[p]); the dependencies
        are merged first, so the correction moves each part from its own dependencies (old) to
        the merged ones (new)."""
        j, level = self.position, self.level
        self.init(block, merged[j], merged_side)
        for p in sources:
            correct = self._correction_at_merge(block, rows, merged, partial, p)

            def emit(extra, p=p, correct=correct):
                slot = state_index(extra)
                value = tirx.BufferLoad(partial[j], [p] + slot)
                if correct is not None:
                    value = correct(value, extra)
                T.buffer_store(merged[j], _COMBINE[level.op](tirx.BufferLoad(merged[j], slot), value), slot)

            block.for_each(self, emit)

    def _correction_at_update(self, block, rows, k, state, new):
        """``correct(current, extra)``: the state moved for the dependencies' moves over a
        chunk; None where nothing moves it."""
        return None

    def finish(self, block, rows: list, state: dict, side: list) -> None:
        """Write the output row; where the level's terms divide by a dependency whose final
        value is 0 (a row all masked), NaN: the unfused terms are 0 / 0 there, while the scan
        took each running 0 / 0 as 0 (see :func:`_running_quotients`)."""
        outputs = {block.group[d].output: state[d][0] for d in self.level.deps}
        finals = [_final(q.b, outputs) for q in _quotients(self.level.value, list(outputs))]
        finals = [f for f in finals if f is not None]
        if not finals:
            super().finish(block, rows, state, side)
            return
        empty = functools.reduce(tirx.Or, [f == tirx.const(0, str(f.ty.dtype)) for f in finals])
        nan = quiet_nan(self.dtype)
        block.for_each(self, lambda e: T.buffer_store(
            self.level.output, tirx.Select(empty, nan, tirx.BufferLoad(state[self.position], state_index(e))),
            rows + e))

    def _correction_at_merge(self, block, rows, merged, partial, p):
        """``correct(value, extra)``: part ``p``'s state moved to the merged dependencies; None
        where nothing moves it."""
        return None


def _quotients(expr, buffers: list) -> list:
    """The quotients in ``expr`` whose denominator reads one of ``buffers``."""
    found = []

    def visit(node):
        if any(ld.source.same_as(b) for ld in loads(node.b) for b in buffers):
            found.append(node)
        return node

    tvm_ffi.structural_map(expr, [(tirx.Div, visit)])
    return found


def _final(denominator, finals: dict):
    """``denominator`` at the dependencies' final values (``finals``: output buffer -> final
    state), or None where it reads anything else (an element of the data)."""
    rest = [ld for ld in loads(denominator) if not any(ld.source.same_as(b) for b in finals)]
    if rest:
        return None
    return tvm_ffi.structural_map(denominator, [(tvm.ir.TensorLoad, lambda ld: next(
        (v for b, v in finals.items() if ld.source.same_as(b)), ld))])


def _running_quotients(operand, states: list):
    """``operand`` with each quotient by a dependency's running state (``states``: their
    registers) 0 where it is 0 / 0. While a running sum is still 0 (a row's leading elements
    all masked: softmax(X) V's exp(x - m) / l at x = -inf) its terms are 0 / 0, which the
    unfused function divides by the final, nonzero sum: 0."""

    def guard(node):
        if any(ld.source.same_as(s) for ld in loads(node.b) for s in states):
            zero = tirx.const(0, str(node.ty.dtype))
            return tirx.Select(tirx.And(node.a == zero, node.b == zero), zero, node)
        return node

    return tvm_ffi.structural_map(operand, [(tirx.Div, guard)])


class CorrectedRule(PlainRule):
    """A state corrected by ``apply(state, correction)`` for its dependencies' moves."""

    #: The correction that leaves a state as it is.
    identity: float

    @staticmethod
    def apply(value, fix):
        raise NotImplementedError

    def _correction_at_update(self, block, rows, k, state, new):
        level = self.level
        # The correction is exactly the identity while no dependency moves (exp(0) = 1),
        # which after the first elements is nearly always.
        moved = functools.reduce(tirx.Or, [new[d][0] != state[d][0] for d in level.deps])
        factor = self._hoisted({d: new[d] for d in level.deps}, {d: state[d] for d in level.deps}, moved)

        def correct(current, extra):
            if factor is None:  # per element, its exp skipped while no dependency moves
                fix = ToTIR(block.symbols(level, rows, k, extra, state, new), self.dtype)(level.correction)
                return tirx.Select(tirx.And(current != level.init, moved), self.apply(current, fix), current)
            return tirx.Select(current != level.init, self.apply(current, factor), current)

        return correct

    def _correction_at_merge(self, block, rows, merged, partial, p):
        # The part's values come through registers: remote (DSM) reads are not lowered inside
        # a select.
        level = self.level
        olds = {}
        for d in level.deps:
            olds[d] = T.sblock_alloc_buffer([1], block.rules[d].dtype, scope="local")
            T.buffer_store(olds[d], tirx.BufferLoad(partial[d], [p, 0]), [0])
        news = {d: merged[d] for d in level.deps}
        factor = self._hoisted(news, olds)

        def correct(value, extra):
            held = T.sblock_alloc_buffer([1], self.dtype, scope="local")
            T.buffer_store(held, value, [0])
            value = held[0]
            if factor is None:
                table = block.symbols(level, rows, tirx.const(0, "int32"), extra, {}, {})
                table.update(dep_symbols(level, news, olds))
                fix = ToTIR(table, self.dtype)(level.correction)
            else:
                fix = factor
            return tirx.Select(value == level.init, value, self.apply(value, fix))

        return correct

    def _hoisted(self, new: dict, old: dict, moved=None):
        """The correction computed once into a register, when it depends only on the
        dependencies' scalar states (exp(m_old - m_new) for softmax's sums): every element of
        the state then takes one multiply (or add) instead of its own exp behind a branch.
        ``moved``: where it does not hold, the factor is exactly the identity, so an unmoved
        state keeps every bit. None where the correction reads the elements themselves."""
        level = self.level
        allowed = {f"y{d}{suffix}" for d in level.deps for suffix in ("", "_new", "_old")}
        if not {str(s) for s in level.correction.free_symbols} <= allowed:
            return None
        if any(int(b.shape[0]) != 1 for b in list(new.values()) + list(old.values())):
            return None
        fix = ToTIR(dep_symbols(level, new, old), self.dtype)(level.correction)
        if moved is not None:
            fix = tirx.Select(moved, fix, tirx.const(self.identity, self.dtype))
        factor = T.sblock_alloc_buffer([1], self.dtype, scope="local")
        T.buffer_store(factor, fix, [0])
        return factor[0]


class RescaleRule(CorrectedRule):
    """The state multiplied by the correction (the online softmax's exp(m_old - m_new))."""

    identity = 1.0

    @staticmethod
    def apply(value, fix):
        return value * fix


class ShiftRule(CorrectedRule):
    """The correction added to the state."""

    identity = 0.0

    @staticmethod
    def apply(value, fix):
        return value + fix


class SplitRule(LevelRule):
    """F = sum of G(x) * H(y): one accumulator per term sums G, and the output is the sum of
    H(final deps) times each accumulator."""

    def side_state(self) -> list[tuple[str, int]]:
        return [(_SPLIT_ACCUMULATOR, 0)] * len(self.level.terms)

    def update(self, block, rows: list, k, state: dict, new: dict, side: list, first: bool) -> None:
        """Add element ``k``'s G terms to the accumulators."""
        level = self.level

        def emit(extra):
            slot = state_index(extra)
            table = {n: tirx.Cast(_SPLIT_ACCUMULATOR, v)
                     for n, v in block.symbols(level, rows, k, extra, state, new).items()}
            for acc, (g, _h) in zip(side, level.terms):
                T.buffer_store(acc, tirx.BufferLoad(acc, slot) + ToTIR(table, _SPLIT_ACCUMULATOR)(g), slot)

        self._for_each_updated(block, emit)

    def merge(self, block, rows: list, merged: dict, merged_side: list, partial: dict,
              partial_side: list, sources: list) -> None:
        """The accumulators of the parts ``sources`` summed."""
        self.init(block, merged[self.position], merged_side)
        for p in sources:

            def emit(extra, p=p):
                slot = state_index(extra)
                for acc, part in zip(merged_side, partial_side):
                    T.buffer_store(acc, tirx.BufferLoad(acc, slot) + tirx.BufferLoad(part, [p] + slot), slot)

            block.for_each(self, emit)

    def finish(self, block, rows: list, state: dict, side: list) -> None:
        """Combine the accumulators with the dependencies' final values, then write the row."""
        j, level = self.position, self.level

        def emit(extra):
            slot = state_index(extra)
            table = {f"y{d}": tirx.Cast(_SPLIT_ACCUMULATOR, state[d][0]) for d in level.deps}
            total = tirx.const(0, _SPLIT_ACCUMULATOR)
            for acc, (_g, h) in zip(side, level.terms):
                total = total + ToTIR(table, _SPLIT_ACCUMULATOR)(h) * tirx.BufferLoad(acc, slot)
            T.buffer_store(state[j], tirx.Cast(self.dtype, total), slot)

        block.for_each(self, emit)
        super().finish(block, rows, state, side)


class TopKRule(LevelRule):
    """k (value, index) pairs best first: the values in the running state, the indices in the
    side state. An element is inserted only when it beats the last pair; parts' sorted pairs
    merge bitonically (k a power of two; else by insertion)."""

    split_over_lanes = False  # a top-k keeps whole pairs per thread

    def side_state(self) -> list[tuple[str, int]]:
        return [("int32", _EMPTY_INDEX)]

    def packed_keys(self):
        raw = top_k_keys.packable_value(self.level.value, self.level.extent)
        if raw is None:
            return None
        keys = T.sblock_alloc_buffer([self.level.top_k.k], "uint32", scope="local")
        for c in range(self.level.top_k.k):
            T.buffer_store(keys, tirx.const(0, "uint32"), [c])
        return keys, raw

    def unpack_keys(self, keys, raw, values, indices) -> None:
        """The pairs of packed ``keys`` (of ``raw``-typed values) into the state buffers."""
        level = self.level
        for c in range(level.top_k.k):
            value, index = top_k_keys.unpack_pair(keys[c], str(raw.ty.dtype), self.dtype, level.init,
                                                  _EMPTY_INDEX)
            T.buffer_store(values, value, [c])
            T.buffer_store(indices, index, [c])

    def row_regions(self, rows: list) -> list:
        ranges = [Range.from_min_extent(r, 1) for r in rows]
        return [tirx.BufferRegion(b, ranges) for b in self.level.top_k.values + self.level.top_k.indices]

    def update(self, block, rows: list, k, state: dict, new: dict, side: list, first: bool) -> None:
        """Insert element ``k`` (as a packed key where the level scans as keys)."""
        j, level = self.position, self.level
        if j in block.keys:
            keys, raw = block.keys[j]
            top_k_keys.insert(keys, block.bind(raw, level, rows, k, []), k, level.top_k.k, level.init)
            return
        top_k_pairs.insert(state[j], side[0], level.top_k.k, block.operand(level, rows, k, [], new), k,
                           later=True)

    def merge(self, block, rows: list, merged: dict, merged_side: list, partial: dict,
              partial_side: list, sources: list) -> None:
        """The first part's sorted pairs are the start; the others' merge in."""
        j, k = self.position, self.level.top_k.k
        first, *rest = sources
        for c in range(k):
            T.buffer_store(merged[j], tirx.BufferLoad(partial[j], [first, c]), [c])
            T.buffer_store(merged_side[0], tirx.BufferLoad(partial_side[0], [first, c]), [c])
        for p in rest:
            if k & (k - 1) == 0:
                top_k_pairs.merge_sorted(merged[j], merged_side[0], k, partial[j], partial_side[0], p)
                continue
            for c in range(k):
                top_k_pairs.insert(merged[j], merged_side[0], k,
                                   tirx.BufferLoad(partial[j], [p, c]), tirx.BufferLoad(partial_side[0], [p, c]))

    def finish(self, block, rows: list, state: dict, side: list) -> None:
        for c in range(self.level.top_k.k):
            T.buffer_store(self.level.top_k.values[c], state[self.position][c], rows)
            T.buffer_store(self.level.top_k.indices[c], side[0][c], rows)


_RULES = {"plain": PlainRule, "rescale": RescaleRule, "shift": ShiftRule, "split": SplitRule}


def level_rule(level: Level, position: int, rows: int) -> LevelRule:
    """The rule of ``level``, the ``position``-th of its group, whose rows have ``rows`` axes."""
    if level.top_k:
        return TopKRule(level, position, [level.top_k.k])
    axes = [int(level.output.ty.shape[a]) for a in range(rows, len(level.spatial))]
    return _RULES[level.form](level, position, axes)
