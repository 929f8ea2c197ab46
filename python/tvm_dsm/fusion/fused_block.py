"""The fused loop nest of one cascade: one s_tir block per row holding the incremental loop.

For each row (the first level's spatial axes) the block keeps one running state per level (a
vector over its extra axes for leaf levels such as the output of softmax(QK^T)V), walks the
reduction axis once, and per element updates the levels in dependency order:

    new_d = state_d (op) F_d(x_k, new_deps)                  levels others depend on
    state_j = correct(state_j, new_deps, old_deps) (op) F_j(x_k, new_deps)
    commit state_d = new_d

How a level absorbs an element, merges partial states and writes its row depends on its form
(:mod:`tvm_dsm.fusion.level_rules`); this module builds the loops around those rules: the scan
over ``vector``-element chunks with their register staging, the strided parts of a row and their
merge (warp shuffles, then a tree of ``*_merge`` blocks, then ``*_final``), the lanes that share
a part's elements (slices of contiguous rows, :mod:`tvm_dsm.fusion.slice_ring`), and the element
producers computed inside the loop.
"""

from __future__ import annotations

import contextlib

import tvm
import tvm_ffi
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as T

from tvm.ir import Range

from ..ir import loads, substitute, uses
from .cascade import Level, LoadSymbols
from .level_rules import dep_symbols, level_rule, state_index
from .slice_ring import SliceRing, slice_piece
from .symbolic import ToSympy, Unsupported
from . import top_k_keys
from ..annotations import RANKS_ATTR, ROWS_PER_CTA_ATTR


def read_another_way(sliced: list, group: list[Level], producers: dict) -> str | None:
    """Which buffer a lane's slice reads (``sliced``: those loads) the cascade's levels
    (``group``) or element ``producers`` also read another way, if any: the slice's registers
    stand for every load of the buffer (an MLA cache whose first columns are also the values;
    the query and key rows of one tensor)."""
    values = [lvl.value for lvl in group] + [p.value for p in producers.values()]
    for load in sliced:
        for other in (ld for value in values for ld in loads(value) if ld.source.same_as(load.source)):
            if len(other.indices) != len(load.indices) or not all(
                    a.same_as(b) for a, b in zip(other.indices, load.indices)):
                return (f"{load.source.name} is read as a lane's slice and another way "
                        f"({list(load.indices)} and {list(other.indices)})")
    return None


def producer_slices(producers: dict) -> list:
    """The loads of the element producers along their inner axis (the query and key rows of a
    dot product): what a lane's slice reads of them."""
    return [load for prod in producers.values() for load in loads(prod.value)
            if load.indices[-1].same_as(prod.reduce_var)]


class FusedBlock:
    """Builds the fused nest for one cascade (inside an IRBuilder context). The levels' rules
    (``rules``, one per level) and the slice ring build with its ``for_each``, ``bind``,
    ``operand``, ``symbols``, ``slice_sources`` and ``slice_start``."""

    def __init__(self, group: list[Level], parts: int = 1, vector: int = 1, lanes: int = 1,
                 ranks: int = 1, producers: dict | None = None, shuffle: bool = False,
                 copy_stages: int = 0, rows_per_cta: int = 1):
        self.group = group
        self.rows_per_cta = rows_per_cta
        self.vector = vector
        self.copy_stages = copy_stages
        self.lanes, self.ranks = lanes, ranks
        self.producers = producers or {}  # intermediate -> its per-element sum (a Level)
        self.staged: dict = {}  # buffer of a row read whole -> its chunk's register copy
        self.staged_at = 0  # the element of the chunk being applied
        self.slices: dict = {}  # buffer read by a lane's slice -> registers [vector * width]
        self.produced: dict = {}  # producer output -> its values for the chunk's elements
        self.lane = None  # inside a thread block: the lane variable
        self.part = None  # inside a thread block: the part variable
        self.slice_at = 0  # inside a lane's slice loop: the position in the slice
        first = group[0]
        self.rows = len(first.spatial)
        self.row_extents = [first.output.ty.shape[a] for a in range(self.rows)]  # symbolic: a variable row count
        self.rules = [level_rule(lvl, j, self.rows) for j, lvl in enumerate(group)]
        self.extent = first.extent
        self.parts = parts
        # Parts of one rank whose threads share a warp (thread of part p, lane l: (p // ranks)
        # * lanes + l, as tvm_dsm.rules.fused_rows binds them): with ``shuffle`` they merge in
        # registers before the shared-memory tree.
        self.warp_parts = min(parts // ranks, 32 // lanes) if shuffle else 1
        self.read_by_others = {d for lvl in group for d in lvl.deps}
        self.name = "fused_" + "_".join(lvl.block for lvl in group)
        self.keys: dict = {}  # during a scan: top-k level -> (its packed keys, the 16-bit value)
        self._check_slices()

    def _check_slices(self) -> None:
        """Unsupported where a buffer a lane's slice reads is also read another way
        (:func:`read_another_way`)."""
        problem = read_another_way([load for load, *_ in self._sliced_loads()], self.group, self.producers)
        if problem:
            raise Unsupported(problem)

    def build(self) -> tirx.Stmt:
        with IRBuilder() as ib:
            with T.prim_func(s_tir=True):
                self._nest([], 0)
        return ib.get().body.block.body  # the nest, out of the builder's root block

    def _nest(self, loop_vars: list, depth: int) -> None:
        if depth < self.rows:
            with T.serial(self.row_extents[depth]) as lv:
                self._nest(loop_vars + [lv], depth + 1)
            return
        with T.sblock(self.name):
            rows = [T.axis.spatial(e, lv) for e, lv in zip(self.row_extents, loop_vars)]
            T.reads(*self._read_regions())
            T.writes(*[r for rule in self.rules for r in rule.row_regions(rows)])
            if self.parts == 1 and self.lanes == 1:
                state, accumulators = self._scan(rows, lambda t, v: t * self.vector + v,
                                                 self.extent // self.vector)
                self._finish(rows, state, accumulators)
            else:
                self._split_and_merge(rows)

    def _read_regions(self) -> list:
        """Whole buffers the levels read (other than the levels' own outputs)."""
        outputs = [lvl.output for lvl in self.group] + list(self.producers)
        values = [lvl.value for lvl in self.group] + [p.value for p in self.producers.values()]
        seen: list = []
        for value in values:
            for load in loads(value):
                buf = load.source
                if not any(buf.same_as(o) for o in outputs + seen):
                    seen.append(buf)
        return [tirx.BufferRegion(b, [Range(0, d) for d in b.ty.shape]) for b in seen]

    def _scan(self, rows: list, element, steps: int, valid=None):
        """Running states after ``steps`` x ``vector`` elements ``element(t, v)`` of the
        reduction axis; each step first copies the ``vector`` elements of every row the levels
        read whole into registers with one vectorized load. With ``valid``, step t updates the
        states only where ``valid(t)`` holds."""
        state, accumulators = self._alloc_states([])
        new = {j: T.sblock_alloc_buffer([1], self.rules[j].dtype, scope="local") for j in self.read_by_others}
        for j, rule in enumerate(self.rules):
            rule.init(self, state[j], accumulators[j])
        # Top-k levels of 16-bit floats scan as packed keys (tvm_dsm.fusion.top_k_keys).
        self.keys = {}
        for j, rule in enumerate(self.rules):
            packed = rule.packed_keys()
            if packed is not None:
                self.keys[j] = packed
        # Registers of the chunk being applied; each step loads the next chunk's first (its
        # latency overlaps the step's work), the last step reloads its own. With copy stages the
        # lane's slices come through its ring in shared memory instead (SliceRing).
        self.slices = self._stage_slices(rows, None)
        self.staged = self._stage(rows, element(0, 0))
        ring = SliceRing(self, rows, element, steps) if self.copy_stages else None
        if ring is None:
            self.slices.update(self._stage_slices(rows, element(0, 0)))
        with T.serial(steps) as t:
            ahead = element(tirx.min(t + 1, steps - 1), 0)
            staged_next = self._stage(rows, ahead)
            slices_next = self._stage_slices(rows, ahead) if ring is None else {}
            if ring is not None:
                ring.take(t)
            self._produce(rows, element(t, 0))
            # Level by level over the chunk: a level's dependencies have their values after the
            # whole chunk before it starts, so its correction is applied once per chunk.
            with contextlib.ExitStack() as predicated:
                if valid is not None:
                    predicated.enter_context(T.If(valid(t)))
                    predicated.enter_context(T.Then())
                for j, rule in enumerate(self.rules):
                    for v in range(self.vector):
                        self.staged_at = v
                        rule.update(self, rows, element(t, v), state, new, accumulators[j], v == 0)
                for j in sorted(self.read_by_others):
                    T.buffer_store(state[j], new[j][0], [0])
            pending = [(self.staged[b], nxt) for b, nxt in staged_next.items()]
            pending += [(self.slices[b][0], nxt) for b, (nxt, _, _) in slices_next.items()]
            for current, nxt in pending:
                for e in range(int(nxt.shape[0])):
                    T.buffer_store(current, nxt[e], [e])
            if ring is not None:
                ring.refill(t)
        if ring is not None:
            T.evaluate(T.ptx.cp.async_.wait_all())
        if self.warp_parts > 1:
            state, accumulators = self._merge_in_warp(rows, state, accumulators)
        for j, (keys, raw) in self.keys.items():
            self.rules[j].unpack_keys(keys, raw, state[j], accumulators[j][0])
        self.staged, self.keys, self.slices, self.produced = {}, {}, {}, {}
        return state, accumulators

    def _sliced_loads(self) -> list[tuple]:
        """(load, owner level, width, per element) for every load that reads a lane's slice of
        a contiguous axis: a producer's loads along its inner axis (the query row and the key
        row of a dot product), and with ``lanes`` > 1 a leaf level's loads along its last extra
        axis (the value row). ``per element``: the load moves with the reduction variable."""
        found = []
        for prod in self.producers.values():
            key_var = prod.spatial[-1]
            width = prod.extent // self.lanes
            for load in loads(prod.value):
                *prefix, last = load.indices
                if last.same_as(prod.reduce_var) and not any(uses(i, prod.reduce_var) for i in prefix):
                    found.append((load, prod, width, any(uses(i, key_var) for i in prefix)))
        if self.lanes > 1:
            for rule in self.rules:
                lvl = rule.level
                if not rule.split_over_lanes or not rule.axes:
                    continue
                row = list(lvl.spatial[: self.rows]) + [lvl.reduce_var, lvl.spatial[-1]]
                for load in loads(lvl.value):
                    if len(load.indices) == len(row) and all(
                            isinstance(i, tirx.Var) and i.same_as(r) for i, r in zip(load.indices, row)):
                        found.append((load, lvl, rule.axes[-1] // self.lanes, True))
        return found

    def _lane_start(self, width: int):
        return self.lane * width if self.lanes > 1 else tirx.const(0, "int32")

    def slice_sources(self, moving: bool) -> list[tuple]:
        """(load, owner, width) of each buffer read by lane slices, once per buffer: those that
        move with the reduction variable (``moving``) or those that do not."""
        found: list = []
        for load, owner, width, per_element in self._sliced_loads():
            if per_element == moving and not any(load.source.same_as(f[0].source) for f in found):
                found.append((load, owner, width))
        return found

    def slice_start(self, load, owner: Level, rows: list, k, width: int) -> list:
        """Indices of the first element of this lane's slice of ``load`` at element ``k``."""
        mapping = (list(zip(owner.spatial, rows + [k])) if any(owner.output.same_as(b) for b in self.producers)
                   else self._mapping(owner, rows, k, []))
        return [substitute(i, mapping) for i in load.indices[:-1]] + [self._lane_start(width)]

    def _stage_slices(self, rows: list, first) -> dict:
        """Copy this lane's slice of every sliced load into new registers, 16 bytes per copy:
        before the scan (``first`` None) those that do not move with the reduction variable,
        per chunk the others (``vector`` slices each); {source: (registers, width, moves)}."""
        slices: dict = {}
        moving = first is not None
        for load, owner, width in self.slice_sources(moving):
            dtype = str(load.source.ty.dtype)
            copies = self.vector if moving else 1
            local = T.sblock_alloc_buffer([copies * width], dtype, scope="local")
            piece = slice_piece(width, dtype)
            for v in range(copies):
                *prefix, start = self.slice_start(load, owner, rows, first + v if moving else tirx.const(0, "int32"),
                                                  width)
                with T.serial(width // piece) as outer:
                    with T.vectorized(piece) as inner:
                        e = outer * piece + inner
                        T.buffer_store(local, tirx.BufferLoad(load.source, prefix + [start + e]), [v * width + e])
            slices[load.source] = local, width, moving
        return slices

    def _from_slices(self, expr, at):
        """``expr`` with sliced loads read from their registers at slice position ``at``."""

        def to_register(load):
            for buf, (local, width, per_element) in self.slices.items():
                if load.source.same_as(buf):
                    return tirx.BufferLoad(local, [self.staged_at * width + at if per_element else at])
            return load

        return tvm_ffi.structural_map(expr, [(tvm.ir.TensorLoad, to_register)]) if self.slices else expr

    def _produce(self, rows: list, first) -> None:
        """Each producer's value for the chunk's elements: this lane's partial sum over its
        slice of the inner axis, then summed over the lanes by warp shuffles (a butterfly, so
        every lane holds the element's value)."""
        self.produced = {}
        for buf, prod in self.producers.items():
            dtype = str(buf.ty.dtype)
            width = prod.extent // self.lanes
            values = T.sblock_alloc_buffer([self.vector], dtype, scope="local")
            for v in range(self.vector):
                self.staged_at = v
                T.buffer_store(values, prod.init, [v])
                with T.serial(width) as e:
                    term = self._from_slices(prod.value, e)
                    term = substitute(term, list(zip(prod.spatial, rows + [first + v]))
                                      + [(prod.reduce_var, self._lane_start(width) + e)])
                    T.buffer_store(values, values[v] + term, [v])
                offset = self.lanes // 2
                while offset:
                    T.buffer_store(values, values[v] + tirx.op.tvm_warp_shuffle_xor(
                        self._warp_mask(), values[v], offset, self.lanes, 32), [v])
                    offset //= 2
            self.produced[buf] = values

    def _stage(self, rows: list, first) -> dict:
        """Copy ``vector`` consecutive elements from ``first`` of each row read whole (a load
        indexed by the row, then the reduction variable) into new registers; {source:
        registers}."""
        staged: dict = {}
        if self.vector == 1:
            return staged
        for lvl in self.group:
            for load in loads(lvl.value):
                if not self._reads_row(load, lvl) or any(
                        load.source.same_as(b) for b in list(staged) + list(self.producers)):
                    continue
                local = T.sblock_alloc_buffer([self.vector], str(load.source.ty.dtype), scope="local")
                with T.vectorized(self.vector) as v:
                    T.buffer_store(local, tirx.BufferLoad(load.source, rows + [first + v]), [v])
                staged[load.source] = local
        return staged

    def _reads_row(self, load, lvl: Level) -> bool:
        """``load`` reads a whole row: indexed by the level's row variables, then its reduction
        variable."""
        row = list(lvl.spatial[: self.rows]) + [lvl.reduce_var]
        return len(load.indices) == len(row) and all(
            isinstance(i, tirx.Var) and i.same_as(r) for i, r in zip(load.indices, row))

    def _finish(self, rows: list, state: dict, accumulators: dict) -> None:
        """Write every level's output row from its states."""
        for j, rule in enumerate(self.rules):
            rule.finish(self, rows, state, accumulators[j])

    def _split_and_merge(self, rows: list) -> None:
        """Part p scans the ``vector``-element chunks p, p + P, ... (adjacent parts read adjacent
        chunks; where P does not divide the chunks, the last step of the parts past the row's
        last chunk leaves their states as they are) into partial states; the parts of a warp merge them by shuffles (with
        ``shuffle``), then the rest merge pairwise in a tree with the levels' corrections:
        while n > ``ranks`` partials remain, part p < n/2 absorbs part p + n/2 into
        a new buffer of n/2 partials (one ``*_merge`` block per round, a schedule binds it to
        threads; a new buffer per round keeps every block a complete block, as s_tir's bind
        requires). The last ``ranks`` partials (one per CTA of a cluster when part p runs on
        rank p % ranks) are merged by each of the first ``ranks`` parts in ``*_final``, which
        writes the outputs. Each part is ``lanes`` threads sharing every element's work."""
        parts = self.parts
        partial, partial_acc = self._alloc_states([parts])
        reads = self._read_regions()
        with self._thread_block("_part", lambda p: reads,
                                lambda p: [_slot_region(b, p) for b in _buffers(partial, partial_acc)]) as p:
            vec, chunks = self.vector, self.extent // self.vector
            if chunks % parts:  # the last step's chunk past the row for some parts: read the
                # row's last chunk instead (a load in bounds), and leave the states unchanged
                state, accumulators = self._scan(rows, lambda t, v: tirx.min(t * parts + p, chunks - 1) * vec + v,
                                                 -(-chunks // parts), valid=lambda t: t * parts + p < chunks)
            else:
                state, accumulators = self._scan(rows, lambda t, v: (t * parts + p) * vec + v, chunks // parts)
            self._copy_states((state, accumulators), (partial, partial_acc), [p])
        spread, ranks = self.warp_parts, self.ranks
        remaining = parts // spread
        while remaining > ranks:
            half = remaining // 2

            def at(i, spread=spread):
                """The slot of the tree's partial i: after the warp merge every ``spread``-th
                part of each rank holds one; the tree's own buffers hold them in order."""
                return i if spread == 1 else (i // ranks) * spread * ranks + i % ranks

            into, into_acc = self._alloc_states([half])
            sources = _buffers(partial, partial_acc)
            with self._thread_block(
                    f"_merge{remaining}",
                    lambda p, sources=sources, half=half, at=at: [
                        _slot_region(b, at(i)) for b in sources for i in (p, p + half)],
                    lambda p, into=into, into_acc=into_acc: [_slot_region(b, p) for b in _buffers(into, into_acc)],
                    active=half) as p:
                merged, merged_acc = self._alloc_states([])
                for j, rule in enumerate(self.rules):
                    rule.merge(self, rows, merged, merged_acc[j], partial, partial_acc[j], [at(p), at(p + half)])
                self._copy_states((merged, merged_acc), (into, into_acc), [p])
            partial, partial_acc, remaining, spread = into, into_acc, half, 1
        last = _buffers(partial, partial_acc)
        # One partial per row after the warp merge, the same in every part (the butterfly merges
        # commuted pairs): every part finishes from its own, so that a schedule may keep the
        # partials in registers (rows_per_cta), and a stage after the cascade reads what its own
        # thread wrote.
        own = remaining == 1 and spread > 1
        with self._thread_block(
                "_final", lambda p: [_slot_region(b, p) if own else
                                     tirx.BufferRegion(b, [Range(0, d) for d in b.ty.shape]) for b in last],
                lambda p: [r for rule in self.rules for r in rule.row_regions(rows)],
                active=None if own else self.ranks,
                attrs={RANKS_ATTR: self.ranks, ROWS_PER_CTA_ATTR: self.rows_per_cta}) as p:
            merged, merged_acc = self._alloc_states([])
            slots = [p] if own else [tirx.const(r, "int32") for r in range(self.ranks)]
            for j, rule in enumerate(self.rules):
                rule.merge(self, rows, merged, merged_acc[j], partial, partial_acc[j], slots)
            self._finish(rows, merged, merged_acc)

    @contextlib.contextmanager
    def _thread_block(self, suffix: str, reads, writes, active: int | None = None, attrs: dict | None = None):
        """A block over (part, lane) = the threads of a row (a schedule binds both loops),
        predicated to the first ``active`` parts, with annotations ``attrs``; yields the part
        variable."""
        with T.serial(self.parts) as part_loop:
            with T.serial(self.lanes) as lane_loop:
                with T.sblock(self.name + suffix):
                    p = self.part = T.axis.spatial(self.parts, part_loop)
                    self.lane = T.axis.spatial(self.lanes, lane_loop)
                    if active is not None:
                        T.where(part_loop < active)
                    if attrs:
                        T.sblock_attr(attrs)
                    T.reads(*reads(p))
                    T.writes(*writes(p))
                    yield p
                    self.lane = self.part = None

    def _alloc_states(self, leading: list) -> tuple[dict, dict]:
        """Per level, its running-value buffer and its side-state buffers, each shaped
        ``leading`` + the state's axes (``leading`` = [n]: n partial states)."""
        values, side = {}, {}
        for j, rule in enumerate(self.rules):
            shape = leading + (rule.axes or [1])  # indexed by state_index
            values[j] = T.sblock_alloc_buffer(shape, rule.dtype, scope="local")
            side[j] = [T.sblock_alloc_buffer(shape, dtype, scope="local") for dtype, _ in rule.side_state()]
        return values, side

    def _copy_states(self, source: tuple, into: tuple, at: list, through=None, skip=()) -> None:
        """Copy every level's states (``source`` = (values, side), as _alloc_states makes
        them) into ``into`` at leading indices ``at`` ([p]: partial state p; []: a state),
        each value passed ``through`` a function if given; levels in ``skip`` are left out."""
        (values, side), (into_values, into_side) = source, into
        for j, rule in enumerate(self.rules):
            if j in skip:
                continue
            for state, out in zip([values[j]] + side[j], [into_values[j]] + into_side[j]):
                self.for_each(rule, lambda e, state=state, out=out: T.buffer_store(
                    out, (through or (lambda v: v))(tirx.BufferLoad(state, state_index(e))), at + state_index(e)))

    def _warp_mask(self) -> tirx.PrimExpr:
        """The lanes of a warp that hold a row's threads (a CTA of fewer than 32 threads fills
        only part of its warp; a shuffle must not name the absent lanes)."""
        threads = min(32, self.parts // self.ranks * self.lanes * self.rows_per_cta)
        return tirx.const(0xFFFFFFFF if threads == 32 else (1 << threads) - 1, "uint32")

    def _merge_in_warp(self, rows: list, state: dict, accumulators: dict) -> tuple[dict, dict]:
        """Merge the states of the ``warp_parts`` parts of a warp by shuffles (a butterfly,
        nearest parts first: every thread ends with the merge of all of them). Packed top-k
        keys merge as keys; every other state goes through the levels' merge with the
        partner's copy as the second partial."""
        threads = self.warp_parts * self.lanes
        mask = self._warp_mask()
        offset = self.lanes
        while offset < threads:
            def partner(value, offset=offset):
                return tirx.op.tvm_warp_shuffle_xor(mask, value, offset, threads, 32)

            for j, (keys, _raw) in self.keys.items():
                top_k_keys.merge_sorted(keys, partner, self.group[j].top_k.k)
            pair, pair_acc = self._alloc_states([2])
            self._copy_states((state, accumulators), (pair, pair_acc), [0], skip=self.keys)
            self._copy_states((state, accumulators), (pair, pair_acc), [1], partner, skip=self.keys)
            merged, merged_acc = self._alloc_states([])
            for j, rule in enumerate(self.rules):
                if j not in self.keys:
                    rule.merge(self, rows, merged, merged_acc[j], pair, pair_acc[j], [0, 1])
            for j in self.keys:  # merged as keys: their value buffers are filled when unpacked
                merged[j], merged_acc[j] = state[j], accumulators[j]
            state, accumulators = merged, merged_acc
            offset *= 2
        return state, accumulators

    def for_each(self, rule, emit) -> None:
        """Call ``emit(extra_indices)`` inside loops over the axes of a level's state (its
        ``rule``'s); inside a thread block with ``lanes`` > 1, over this lane's slice of the last
        one where the level splits it over the lanes."""
        extents = rule.axes
        sliced = self.lane is not None and self.lanes > 1 and rule.split_over_lanes and extents

        def nest(indices):
            if len(indices) == len(extents):
                emit(indices)
                return
            if sliced and len(indices) == len(extents) - 1:
                width = extents[-1] // self.lanes
                with T.serial(width) as e:
                    self.slice_at = e
                    emit(indices + [self._lane_start(width) + e])
                return
            with T.serial(extents[len(indices)]) as e:
                nest(indices + [e])

        nest([])

    def _mapping(self, lvl: Level, rows: list, k, extra: list):
        mapping = list(zip(lvl.spatial[: self.rows], rows))
        mapping += list(zip(lvl.spatial[self.rows:], extra))
        mapping.append((lvl.reduce_var, k))
        return mapping

    def bind(self, expr, lvl: Level, rows, k, extra):
        """``expr`` in the fused block's variables, staged rows read from registers."""

        def from_registers(load):
            if self._reads_row(load, lvl):
                for buf, local in list(self.staged.items()) + list(self.produced.items()):
                    if load.source.same_as(buf):
                        return tirx.BufferLoad(local, [self.staged_at])
            return load

        if self.staged or self.produced:
            expr = tvm_ffi.structural_map(expr, [(tvm.ir.TensorLoad, from_registers)])
        expr = self._from_slices(expr, self.slice_at)
        return substitute(expr, self._mapping(lvl, rows, k, extra))

    def operand(self, lvl: Level, rows, k, extra, new):
        """F_j(x_k, new deps) in the fused block's variables."""

        def dep_to_new(load):
            for d in lvl.deps:
                if load.source.same_as(self.group[d].output):
                    return new[d][0]
            return load

        value = tvm_ffi.structural_map(lvl.value, [(tvm.ir.TensorLoad, dep_to_new)])
        return self.bind(value, lvl, rows, k, extra)

    def symbols(self, lvl: Level, rows, k, extra, state, new) -> dict:
        """The symbols of the level's proof (its x/c loads, its dependencies' states y{d} in
        ``state``, y{d}_new in ``new``) as expressions in the fused block's variables."""
        names = LoadSymbols(self.group, lvl)
        ToSympy(names)(lvl.value)  # registers the x/c loads under their symbol names
        table = {
            name: self.bind(load, lvl, rows, k, extra)
            for name, load in names.loads.items()
        }
        table.update(dep_symbols(lvl, new, state))
        return table


def _buffers(values: dict, side: dict) -> list:
    """Every buffer of a set of states."""
    return list(values.values()) + [b for bufs in side.values() for b in bufs]


def _slot_region(buf, p):
    """Partial state ``p`` of a buffer of partial states (leading axis: the part)."""
    return tirx.BufferRegion(buf, [Range.from_min_extent(p, 1)] + [Range(0, d) for d in buf.ty.shape[1:]])


