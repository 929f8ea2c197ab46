"""Rewrite a proven cascade into one s_tir block per row holding the incremental loop.

For each row (the first level's spatial axes) the fused block keeps one running state per level
(a vector over its extra axes for leaf levels such as the output of softmax(QK^T)V), walks the
reduction axis once, and per element updates the levels in dependency order:

    new_d = state_d (op) F_d(x_k, new_deps)                  levels others depend on
    state_j = correct(state_j, new_deps, old_deps) (op) F_j(x_k, new_deps)
    commit state_d = new_d

``correct`` is the rescale/shift proven by :mod:`tvm_dsm.fusion.cascade`; a state still at its
identity is left alone (0 * inf or -inf - -inf would otherwise produce NaN), and so is a state
whose dependencies did not move (the correction is exactly the identity then). Split levels keep
one accumulator per x-term and combine them with the dependencies' final values after the loop.
Top-k levels keep k (value, index) pairs best first; an element is inserted only when it beats
the last pair (16-bit values: as packed integer keys through a branch-free network,
tvm_dsm.fusion.top_k_keys), and two parts' sorted pairs merge bitonically (k a power of two;
else by insertion).
"""

from __future__ import annotations

import contextlib
import functools

import tvm
import tvm_ffi
from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.tirx.script.builder import ir as T

from tvm.ir import Range
from tvm.s_tir import SBlock

from ..ir import find_all, loads, replace_node, substitute, uses, with_block_body
from .cascade import Level, LoadSymbols
from .symbolic import ToSympy, ToTIR
from . import top_k_keys
from .top_k import beats
from ..annotations import RANKS_ATTR, ROWS_PER_CTA_ATTR


_COMBINE = {"sum": lambda a, b: a + b, "max": tirx.max, "min": tirx.min}
_ACC = "float64"  # accumulators of split levels


class _FusedBlock:
    """Builds the fused nest for one cascade (inside an IRBuilder context)."""

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
        self.row_extents = [int(_extent(first, a)) for a in range(self.rows)]
        self.extent = first.extent
        self.parts = parts
        # Parts of one rank whose threads share a warp (thread of part p, lane l: (p // ranks)
        # * lanes + l, as tvm_dsm.rules.fused_rows binds them): with ``shuffle`` they merge in
        # registers before the shared-memory tree.
        self.warp_parts = min(parts // ranks, 32 // lanes) if shuffle else 1
        self.read_by_others = {d for lvl in group for d in lvl.deps}
        self.name = "fused_" + "_".join(lvl.block for lvl in group)
        self.keys: dict = {}  # during a scan: top-k level -> (its packed keys, the 16-bit value)

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
            T.writes(*[r for lvl in self.group for r in self._row_regions(lvl, rows)])
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

    def _row_regions(self, lvl: Level, rows: list) -> list:
        ranges = [Range.from_min_extent(r, 1) for r in rows]
        if lvl.top_k:
            return [tirx.BufferRegion(b, ranges) for b in lvl.top_k.values + lvl.top_k.indices]
        ranges += [Range(0, e) for e in self._extra(lvl)]
        return [tirx.BufferRegion(lvl.output, ranges)]

    def _extra(self, level: Level) -> list[int]:
        """The state's axes besides the row: the level's extra output axes, or a top-k's k."""
        if level.top_k:
            return [level.top_k.k]
        return [int(_extent(level, a)) for a in range(self.rows, len(level.spatial))]

    @staticmethod
    def _side_state(level: Level) -> list[tuple[str, int]]:
        """(dtype, initial value) of each state buffer a level keeps besides its running value:
        a split level's per-term float64 sums (power sums cancel badly in fp32, e.g. the 3rd
        moment), a top-k's indices."""
        if level.form == "split":
            return [(_ACC, 0)] * len(level.terms)
        if level.top_k:
            return [("int32", -1)]
        return []

    def _alloc_side_state(self, level: Level, shape: list) -> list:
        return [T.sblock_alloc_buffer(shape, dtype, scope="local") for dtype, _ in self._side_state(level)]

    def _init_state(self, level: Level, value, side: list) -> None:
        self._for_each(level, lambda e: self._store(value, level.init, e))
        for buf, (dtype, init) in zip(side, self._side_state(level)):
            self._for_each(level, lambda e, buf=buf, dtype=dtype, init=init: self._store(buf, tirx.const(init, dtype), e))

    def _dtype(self, j: int) -> str:
        return str(self.group[j].output.ty.dtype)

    def _scan(self, rows: list, element, steps: int):
        """Running states after ``steps`` x ``vector`` elements ``element(t, v)`` of the
        reduction axis; each step first copies the ``vector`` elements of every row the levels
        read whole into registers with one vectorized load."""
        group = self.group
        state, accumulators = self._alloc_states([])
        new = {j: T.sblock_alloc_buffer([1], self._dtype(j), scope="local") for j in self.read_by_others}
        for j, lvl in enumerate(group):
            self._init_state(lvl, state[j], accumulators[j])
        # Top-k levels of 16-bit floats scan as packed keys (tvm_dsm.fusion.top_k_keys).
        self.keys = {}
        for j, lvl in enumerate(group):
            raw = top_k_keys.packable_value(lvl.value, lvl.extent) if lvl.top_k else None
            if raw is not None:
                keys = T.sblock_alloc_buffer([lvl.top_k.k], "uint32", scope="local")
                for c in range(lvl.top_k.k):
                    T.buffer_store(keys, tirx.const(0, "uint32"), [c])
                self.keys[j] = keys, raw
        # Registers of the chunk being applied; each step loads the next chunk's first (its
        # latency overlaps the step's work), the last step reloads its own. With copy stages the
        # lane's slices come through its ring in shared memory instead (_SliceRing).
        self.slices = self._stage_slices(rows, None)
        self.staged = self._stage(rows, element(0, 0))
        ring = _SliceRing(self, rows, element, steps) if self.copy_stages else None
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
            for j, lvl in enumerate(group):
                for v in range(self.vector):
                    self.staged_at = v
                    self._update(j, lvl, rows, element(t, v), state, new, accumulators[j], v == 0)
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
            lvl = group[j]
            (_, empty_index), = self._side_state(lvl)
            for c in range(lvl.top_k.k):
                value, index = top_k_keys.unpack_pair(keys[c], str(raw.ty.dtype), self._dtype(j),
                                                      lvl.init, empty_index)
                T.buffer_store(state[j], value, [c])
                T.buffer_store(accumulators[j][0], index, [c])
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
            for lvl in self.group:
                extra = self._extra(lvl)
                if lvl.top_k or not extra:
                    continue
                row = list(lvl.spatial[: self.rows]) + [lvl.reduce_var, lvl.spatial[-1]]
                for load in loads(lvl.value):
                    if len(load.indices) == len(row) and all(
                            isinstance(i, tirx.Var) and i.same_as(r) for i, r in zip(load.indices, row)):
                        found.append((load, lvl, extra[-1] // self.lanes, True))
        return found

    def _lane_start(self, width: int):
        return self.lane * width if self.lanes > 1 else tirx.const(0, "int32")

    def _slice_sources(self, moving: bool) -> list[tuple]:
        """(load, owner, width) of each buffer read by lane slices, once per buffer: those that
        move with the reduction variable (``moving``) or those that do not."""
        found: list = []
        for load, owner, width, per_element in self._sliced_loads():
            if per_element == moving and not any(load.source.same_as(f[0].source) for f in found):
                found.append((load, owner, width))
        return found

    def _slice_start(self, load, owner: Level, rows: list, k, width: int) -> list:
        """Indices of the first element of this lane's slice of ``load`` at element ``k``."""
        mapping = (list(zip(owner.spatial, rows + [k])) if any(owner.output.same_as(b) for b in self.producers)
                   else self._mapping(owner, rows, k, []))
        return [substitute(i, mapping) for i in load.indices[:-1]] + [self._lane_start(width)]

    @staticmethod
    def _piece(width: int, dtype: str) -> int:
        """Elements per copy of a slice: 16 bytes where the slice divides into them."""
        piece = max(1, min(width, 16 // tvm.DataType(dtype).itemsize))
        return piece if width % piece == 0 else 1

    def _stage_slices(self, rows: list, first) -> dict:
        """Copy this lane's slice of every sliced load into new registers, 16 bytes per copy:
        before the scan (``first`` None) those that do not move with the reduction variable,
        per chunk the others (``vector`` slices each); {source: (registers, width, moves)}."""
        slices: dict = {}
        moving = first is not None
        for load, owner, width in self._slice_sources(moving):
            dtype = str(load.source.ty.dtype)
            copies = self.vector if moving else 1
            local = T.sblock_alloc_buffer([copies * width], dtype, scope="local")
            piece = self._piece(width, dtype)
            for v in range(copies):
                *prefix, start = self._slice_start(load, owner, rows, first + v if moving else tirx.const(0, "int32"),
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
        """Combine split levels' accumulators and write every level's output row."""
        for j, lvl in enumerate(self.group):
            if lvl.top_k:
                for c in range(lvl.top_k.k):
                    T.buffer_store(lvl.top_k.values[c], state[j][c], rows)
                    T.buffer_store(lvl.top_k.indices[c], accumulators[j][0][c], rows)
                continue
            if lvl.form == "split":
                self._combine_split(j, lvl, rows, state, accumulators[j])
            self._for_each(
                lvl, lambda e, j=j, lvl=lvl: T.buffer_store(lvl.output, tirx.BufferLoad(state[j], _slot(e)), rows + e)
            )

    def _split_and_merge(self, rows: list) -> None:
        """Part p scans the ``vector``-element chunks p, p + P, ... (adjacent parts read adjacent
        chunks) into partial states; the parts of a warp merge them by shuffles (with
        ``shuffle``), then the rest merge pairwise in a tree with the levels' corrections:
        while n > ``ranks`` partials remain, part p < n/2 absorbs part p + n/2 into
        a new buffer of n/2 partials (one ``*_merge`` block per round, a schedule binds it to
        threads; a new buffer per round keeps every block a complete block, as s_tir's bind
        requires). The last ``ranks`` partials (one per CTA of a cluster when part p runs on
        rank p % ranks) are merged by each of the first ``ranks`` parts in ``*_final``, which
        writes the outputs. Each part is ``lanes`` threads sharing every element's work."""
        group, parts = self.group, self.parts
        partial, partial_acc = self._alloc_states([parts])
        reads = self._read_regions()
        with self._thread_block("_part", lambda p: reads,
                                lambda p: [_slot_region(b, p) for b in _buffers(partial, partial_acc)]) as p:
            vec = self.vector
            state, accumulators = self._scan(rows, lambda t, v: (t * parts + p) * vec + v,
                                             self.extent // (parts * vec))
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
                for j, lvl in enumerate(group):
                    self._merge(j, lvl, rows, merged, merged_acc[j], partial, partial_acc[j], [at(p), at(p + half)])
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
                lambda p: [r for lvl in group for r in self._row_regions(lvl, rows)],
                active=None if own else self.ranks,
                attrs={RANKS_ATTR: self.ranks, ROWS_PER_CTA_ATTR: self.rows_per_cta}) as p:
            merged, merged_acc = self._alloc_states([])
            slots = [p] if own else [tirx.const(r, "int32") for r in range(self.ranks)]
            for j, lvl in enumerate(group):
                self._merge(j, lvl, rows, merged, merged_acc[j], partial, partial_acc[j], slots)
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
        for j, lvl in enumerate(self.group):
            shape = leading + (self._extra(lvl) or [1])  # indexed by _slot
            values[j] = T.sblock_alloc_buffer(shape, self._dtype(j), scope="local")
            side[j] = self._alloc_side_state(lvl, shape)
        return values, side

    def _copy_states(self, source: tuple, into: tuple, at: list, through=None, skip=()) -> None:
        """Copy every level's states (``source`` = (values, side), as _alloc_states makes
        them) into ``into`` at leading indices ``at`` ([p]: partial state p; []: a state),
        each value passed ``through`` a function if given; levels in ``skip`` are left out."""
        (values, side), (into_values, into_side) = source, into
        for j, lvl in enumerate(self.group):
            if j in skip:
                continue
            for state, out in zip([values[j]] + side[j], [into_values[j]] + into_side[j]):
                self._for_each(lvl, lambda e, state=state, out=out: T.buffer_store(
                    out, (through or (lambda v: v))(tirx.BufferLoad(state, _slot(e))), at + _slot(e)))

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
            for j, lvl in enumerate(self.group):
                if j not in self.keys:
                    self._merge(j, lvl, rows, merged, merged_acc[j], pair, pair_acc[j], [0, 1])
            for j in self.keys:  # merged as keys: their value buffers are filled when unpacked
                merged[j], merged_acc[j] = state[j], accumulators[j]
            state, accumulators = merged, merged_acc
            offset *= 2
        return state, accumulators

    def _merge(self, j, lvl: Level, rows, merged, merged_acc, partial, partial_acc, sources) -> None:
        """merged_j = op over the parts ``sources`` of corrected(partial_j[p]); the dependencies
        are merged first, so the correction moves each part from its own dependencies (old) to
        the merged ones (new)."""
        if lvl.top_k:  # the first part's sorted pairs are the start; the others' merge in
            k = lvl.top_k.k
            first, *rest = sources
            for c in range(k):
                T.buffer_store(merged[j], tirx.BufferLoad(partial[j], [first, c]), [c])
                T.buffer_store(merged_acc[0], tirx.BufferLoad(partial_acc[0], [first, c]), [c])
            for p in rest:
                if k & (k - 1) == 0:
                    self._merge_sorted(merged[j], merged_acc[0], k, partial[j], partial_acc[0], p)
                    continue
                for c in range(k):
                    self._insert(merged[j], merged_acc[0], k,
                                 tirx.BufferLoad(partial[j], [p, c]), tirx.BufferLoad(partial_acc[0], [p, c]))
            return
        self._init_state(lvl, merged[j], merged_acc)
        dtype = self._dtype(j)
        combine = _COMBINE[lvl.op]
        for p in sources:
            # The part's values come through registers: remote (DSM) reads are not lowered
            # inside a select.
            olds, factor = {}, None
            if lvl.form in ("rescale", "shift"):
                for d in lvl.deps:
                    olds[d] = T.sblock_alloc_buffer([1], self._dtype(d), scope="local")
                    T.buffer_store(olds[d], tirx.BufferLoad(partial[d], [p, 0]), [0])
                factor = self._hoisted_correction(
                    lvl, {d: merged[d] for d in lvl.deps}, olds, dtype)

            def emit(extra, p=p, olds=olds, factor=factor):
                slot = _slot(extra)
                if lvl.form == "split":
                    for acc, part in zip(merged_acc, partial_acc):
                        T.buffer_store(acc, tirx.BufferLoad(acc, slot) + tirx.BufferLoad(part, [p] + slot), slot)
                    return
                value = tirx.BufferLoad(partial[j], [p] + slot)
                if lvl.form in ("rescale", "shift"):
                    held = T.sblock_alloc_buffer([1], dtype, scope="local")
                    T.buffer_store(held, value, [0])
                    value = held[0]
                    if factor is None:
                        table = self._symbols(lvl, rows, tirx.const(0, "int32"), extra, {}, {})
                        table.update(_dep_symbols(lvl, {d: merged[d] for d in lvl.deps}, olds))
                        fix = ToTIR(table, dtype)(lvl.correction)
                    else:
                        fix = factor
                    corrected = value * fix if lvl.form == "rescale" else value + fix
                    value = tirx.Select(value == lvl.init, value, corrected)
                T.buffer_store(merged[j], combine(tirx.BufferLoad(merged[j], slot), value), slot)

            self._for_each(lvl, emit)

    def _for_each(self, lvl: Level, emit) -> None:
        """Call ``emit(extra_indices)`` inside loops over the level's extra axes; inside a
        thread block with ``lanes`` > 1, over this lane's slice of the last one."""
        extents = self._extra(lvl)
        sliced = self.lane is not None and self.lanes > 1 and not lvl.top_k and extents

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

    @staticmethod
    def _store(buf, value, extra) -> None:
        T.buffer_store(buf, value, _slot(extra))

    def _mapping(self, lvl: Level, rows: list, k, extra: list):
        mapping = list(zip(lvl.spatial[: self.rows], rows))
        mapping += list(zip(lvl.spatial[self.rows:], extra))
        mapping.append((lvl.reduce_var, k))
        return mapping

    def _bind(self, expr, lvl: Level, rows, k, extra):
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

    def _operand(self, lvl: Level, rows, k, extra, new):
        """F_j(x_k, new deps) in the fused block's variables."""

        def dep_to_new(load):
            for d in lvl.deps:
                if load.source.same_as(self.group[d].output):
                    return new[d][0]
            return load

        value = tvm_ffi.structural_map(lvl.value, [(tvm.ir.TensorLoad, dep_to_new)])
        return self._bind(value, lvl, rows, k, extra)

    def _symbols(self, lvl: Level, rows, k, extra, state, new) -> dict:
        names = LoadSymbols(self.group, lvl)
        ToSympy(names)(lvl.value)  # registers the x/c loads under their symbol names
        table = {
            name: self._bind(load, lvl, rows, k, extra)
            for name, load in names.loads.items()
        }
        table.update(_dep_symbols(lvl, new, state))
        return table

    def _hoisted_correction(self, lvl: Level, new: dict, old: dict, dtype: str, moved=None):
        """The level's correction computed once into a register, when it depends only on its
        dependencies' scalar states (exp(m_old - m_new) for softmax's sums): every element of
        the state then takes one multiply (or add) instead of its own exp behind a branch.
        ``moved``: where it does not hold, the factor is exactly the identity (1 or 0), so an
        unmoved state keeps every bit. None where the correction reads the elements themselves."""
        allowed = {f"y{d}{suffix}" for d in lvl.deps for suffix in ("", "_new", "_old")}
        if not {str(s) for s in lvl.correction.free_symbols} <= allowed:
            return None
        if any(int(b.shape[0]) != 1 for b in list(new.values()) + list(old.values())):
            return None
        fix = ToTIR(_dep_symbols(lvl, new, old), dtype)(lvl.correction)
        if moved is not None:
            fix = tirx.Select(moved, fix, tirx.const(1.0 if lvl.form == "rescale" else 0.0, dtype))
        factor = T.sblock_alloc_buffer([1], dtype, scope="local")
        T.buffer_store(factor, fix, [0])
        return factor[0]

    @staticmethod
    def _insert(values, indices, k: int, value, index, later: bool = False) -> None:
        """Insert (value, index) into the sorted pairs if it beats the last. From the end, slot c
        takes its predecessor if the new pair beats that, else the new pair if it beat slot c
        (the previous step's test), else stays. ``later``: the index exceeds every index held (a
        part's own scan), so a tie never beats and one comparison decides. The pair is staged in
        registers (TVM's ThreadSync rejects shared-memory reads in a condition, and merged pairs
        come from shared memory)."""
        new_value = T.sblock_alloc_buffer([1], str(values.ty.dtype), scope="local")
        new_index = T.sblock_alloc_buffer([1], "int32", scope="local")
        won, moves = (T.sblock_alloc_buffer([1], "int32", scope="local") for _ in range(2))
        T.buffer_store(new_value, value, [0])
        T.buffer_store(new_index, index, [0])
        value, index = new_value[0], new_index[0]

        def wins(c):
            return value > values[c] if later else beats(value, index, values[c], indices[c])

        with T.If(wins(k - 1)):
            with T.Then():
                T.buffer_store(won, tirx.const(1, "int32"), [0])
                for c in reversed(range(k)):
                    T.buffer_store(moves, tirx.Cast("int32", wins(c - 1)) if c else tirx.const(0, "int32"), [0])
                    for buf, new in ((values, value), (indices, index)):
                        previous = buf[c - 1] if c else new
                        T.buffer_store(buf, tirx.Select(moves[0] == 1, previous, tirx.Select(
                            won[0] == 1, new, buf[c])), [c])
                    T.buffer_store(won, moves[0], [0])

    @staticmethod
    def _merge_sorted(values, indices, k: int, other_values, other_indices, p) -> None:
        """The best k of the sorted pairs held and part ``p``'s sorted pairs (k a power of two),
        by a bitonic merge: the better of held[c] and other[k-1-c] for each c is the best k as a
        bitonic sequence, which log2(k) rounds of compare-exchanges sort. 2k + (k/2) log2 k
        independent comparisons instead of k insertions of k dependent ones; the other part's
        pairs are first copied into registers (ThreadSync rejects shared reads in conditions)."""
        dtype = str(values.ty.dtype)
        theirs_v = T.sblock_alloc_buffer([k], dtype, scope="local")
        theirs_i = T.sblock_alloc_buffer([k], "int32", scope="local")
        held_v = T.sblock_alloc_buffer([1], dtype, scope="local")
        held_i = T.sblock_alloc_buffer([1], "int32", scope="local")
        swap = T.sblock_alloc_buffer([1], "int32", scope="local")
        for c in range(k):
            T.buffer_store(theirs_v, tirx.BufferLoad(other_values, [p, c]), [c])
            T.buffer_store(theirs_i, tirx.BufferLoad(other_indices, [p, c]), [c])

        def exchange(a: tuple, b: tuple, both: bool) -> None:
            """Slot a = (values, indices, position) takes the better pair of a and b; with
            ``both``, slot b takes the other."""
            (a_v, a_i, x), (b_v, b_i, y) = a, b
            T.buffer_store(swap, tirx.Cast("int32", beats(b_v[y], b_i[y], a_v[x], a_i[x])), [0])
            T.buffer_store(held_v, a_v[x], [0])
            T.buffer_store(held_i, a_i[x], [0])
            take = swap[0] == 1
            T.buffer_store(a_v, tirx.Select(take, b_v[y], held_v[0]), [x])
            T.buffer_store(a_i, tirx.Select(take, b_i[y], held_i[0]), [x])
            if both:
                T.buffer_store(b_v, tirx.Select(take, held_v[0], b_v[y]), [y])
                T.buffer_store(b_i, tirx.Select(take, held_i[0], b_i[y]), [y])

        for c in range(k):
            exchange((values, indices, c), (theirs_v, theirs_i, k - 1 - c), both=False)
        stride = k // 2
        while stride:
            for c in (c for c in range(k) if not c & stride):
                exchange((values, indices, c), (values, indices, c + stride), both=True)
            stride //= 2

    def _update(self, j, lvl: Level, rows, k, state, new, accumulators, first: bool) -> None:
        """Absorb element ``k`` into level j. ``first``: the chunk's first element, which
        corrects the state for the dependencies' moves over the chunk (the later ones add to
        the corrected state: the dependencies do not move within the chunk)."""
        if lvl.top_k and j in self.keys:
            keys, raw = self.keys[j]
            top_k_keys.insert(keys, self._bind(raw, lvl, rows, k, []), k, lvl.top_k.k, lvl.init)
            return
        if lvl.top_k:
            self._insert(state[j], accumulators[0], lvl.top_k.k, self._operand(lvl, rows, k, [], new), k,
                         later=True)
            return
        dtype = str(lvl.output.ty.dtype)
        combine = _COMBINE[lvl.op]

        target = new[j] if j in self.read_by_others else state[j]
        factor = moved = None
        if first and lvl.form in ("rescale", "shift"):
            # The correction is exactly the identity while no dependency moves (exp(0) = 1),
            # which after the first elements is nearly always.
            moved = functools.reduce(tirx.Or, [new[d][0] != state[d][0] for d in lvl.deps])
            factor = self._hoisted_correction(lvl, {d: new[d] for d in lvl.deps},
                                              {d: state[d] for d in lvl.deps}, dtype, moved)

        def emit(extra):
            slot = _slot(extra)
            current = tirx.BufferLoad(state[j] if first else target, slot)
            if lvl.form == "split":
                table = {n: tirx.Cast(_ACC, v) for n, v in self._symbols(lvl, rows, k, extra, state, new).items()}
                for acc, (g, _h) in zip(accumulators, lvl.terms):
                    T.buffer_store(acc, tirx.BufferLoad(acc, slot) + ToTIR(table, _ACC)(g), slot)
                return
            operand = self._operand(lvl, rows, k, extra, new)
            if first and lvl.form in ("rescale", "shift"):
                if factor is None:  # per element, its exp skipped while no dependency moves
                    fix = ToTIR(self._symbols(lvl, rows, k, extra, state, new), dtype)(lvl.correction)
                    corrected = current * fix if lvl.form == "rescale" else current + fix
                    current = tirx.Select(tirx.And(current != lvl.init, moved), corrected, current)
                else:
                    corrected = current * factor if lvl.form == "rescale" else current + factor
                    current = tirx.Select(current != lvl.init, corrected, current)
            T.buffer_store(target, combine(current, operand), slot)

        if j in self.read_by_others:
            emit([])
        else:
            self._for_each(lvl, emit)

    def _combine_split(self, j, lvl: Level, rows, state, accumulators) -> None:
        dtype = str(lvl.output.ty.dtype)

        def emit(extra):
            slot = _slot(extra)
            table = {f"y{d}": tirx.Cast(_ACC, state[d][0]) for d in lvl.deps}
            total = tirx.const(0, _ACC)
            for acc, (_g, h) in zip(accumulators, lvl.terms):
                total = total + ToTIR(table, _ACC)(h) * tirx.BufferLoad(acc, slot)
            T.buffer_store(state[j], tirx.Cast(dtype, total), slot)

        self._for_each(lvl, emit)


_PIECE_BYTES = 16  # one cp.async.cg copy; every piece of a ring is exactly this


class _SliceRing:
    """A lane's moving slices (the key and value rows of decode attention) through a ring of
    ``copy_stages`` chunks in shared memory, filled by ``cp.async`` (CUDA only).

    Register double buffering keeps one chunk in flight per thread and pays for it in registers,
    which caps the warps an SM holds and so the bytes in flight. The ring keeps ``stages`` - 1
    chunks in flight in shared memory: step t waits for chunk t (``wait_group(stages - 1)``;
    every step commits one group, whose copies read nothing past the end), copies it into the
    slice registers the step reads, and after the step's work, when those registers have been
    read, refills the same slot with chunk t + stages. Each thread reads only what it copied, so no CTA barrier is
    needed. Ring index: [part within the CTA, slot, 16-byte piece of the chunk, lane, element
    of the piece]: a warp's lanes read adjacent 16-byte words, without bank conflicts."""

    def __init__(self, block: _FusedBlock, rows: list, element, steps: int):
        self.block, self.rows, self.element, self.steps = block, rows, element, steps
        self.stages = block.copy_stages
        self.part = tirx.floordiv(block.part, block.ranks)
        # (load, owner, width, elements per 16-byte piece) of each moving slice
        self.sources = [(load, owner, width, block._piece(width, str(load.source.ty.dtype)))
                        for load, owner, width in block._slice_sources(True)]
        self.rings, self.registers = {}, {}
        for load, _owner, width, piece in self.sources:
            dtype = str(load.source.ty.dtype)
            size = tvm.DataType(dtype).itemsize
            if piece * size != _PIECE_BYTES:
                raise ValueError(f"copy stages need {_PIECE_BYTES}-byte slices; "
                                 f"{load.source.name}'s are {width * size} bytes")
            self.rings[load.source] = T.sblock_alloc_buffer(
                [block.parts // block.ranks, self.stages, block.vector * width // piece, block.lanes, piece],
                dtype, scope="shared")
            self.registers[load.source] = T.sblock_alloc_buffer([block.vector * width], dtype, scope="local")
            block.slices[load.source] = self.registers[load.source], width, True
        # The rings' shared addresses, taken once: TVM's barrier planner (ThreadSync) counts an
        # address_of as a shared-memory write, and taken inside the scan it asked for a barrier.
        self.base = T.sblock_alloc_buffer([len(self.sources)], "uint32", scope="local")
        for n, (load, *_rest) in enumerate(self.sources):
            T.buffer_store(self.base, T.cuda.cvta_generic_to_shared(
                T.address_of(self.rings[load.source][self.part, 0, 0, block.lane, 0])), [n])
        for s in range(self.stages):
            self._issue(tirx.const(s, "int32"), tirx.const(s, "int32"))

    def _issue(self, step, slot) -> None:
        """cp.async of chunk ``step``'s slices into ``slot``, committed as one group; past the
        last chunk the copies read nothing (``ignore-src``: the slot is zero-filled, never read),
        so every thread commits a group per step without a branch."""
        block = self.block
        past = step >= self.steps
        step = tirx.min(step, self.steps - 1)
        for n, (load, owner, width, piece) in enumerate(self.sources):
            pieces = block.vector * width // piece
            for v in range(block.vector):
                *prefix, start = block._slice_start(load, owner, self.rows, self.element(step, v), width)
                for c in range(width // piece):
                    offset = (slot * pieces + v * width // piece + c) * block.lanes * _PIECE_BYTES
                    dst = self.base[n] + tirx.Cast("uint32", offset)
                    src = T.address_of(tirx.BufferLoad(load.source, prefix + [start + c * piece]))
                    T.evaluate(T.ptx.cp.async_.cg.shared.global_(dst, src, _PIECE_BYTES, past))
        T.evaluate(T.ptx.cp.async_.commit_group())

    def take(self, t) -> None:
        """Wait for chunk ``t`` and copy it into the slice registers."""
        T.evaluate(T.ptx.cp.async_.wait_group(self.stages - 1))
        slot = tirx.floormod(t, self.stages)
        for load, _owner, width, piece in self.sources:
            registers, ring = self.registers[load.source], self.rings[load.source]
            with T.serial(self.block.vector * width // piece) as outer:
                with T.vectorized(piece) as inner:
                    T.buffer_store(registers, ring[self.part, slot, outer, self.block.lane, inner],
                                   [outer * piece + inner])

    def refill(self, t) -> None:
        """Chunk ``t + stages`` into the slot chunk ``t`` used."""
        self._issue(t + self.stages, tirx.floormod(t, self.stages))


def _dep_symbols(lvl: Level, new: dict, old: dict) -> dict:
    """The correction's symbols for the dependencies' scalar states: y{d}_new, y{d}_old and
    y{d} (the old one) for each dependency d held in ``new`` / ``old`` (buffers of one)."""
    table = {}
    for d in lvl.deps:
        if d in new:
            table[f"y{d}_new"] = new[d][0]
        if d in old:
            table[f"y{d}_old"] = old[d][0]
            table[f"y{d}"] = old[d][0]
    return table


def _buffers(values: dict, side: dict) -> list:
    """Every buffer of a set of states."""
    return list(values.values()) + [b for bufs in side.values() for b in bufs]


def _slot_region(buf, p):
    """Partial state ``p`` of a buffer of partial states (leading axis: the part)."""
    return tirx.BufferRegion(buf, [Range.from_min_extent(p, 1)] + [Range(0, d) for d in buf.ty.shape[1:]])


def _extent(level: Level, axis: int) -> int:
    return int(level.output.ty.shape[axis])


def _slot(extra: list) -> list:
    """Index of a state buffer: the level's extra axes, or [0] for a scalar state."""
    return list(extra) if extra else [0]


def splice(func: tirx.PrimFunc, group: list[Level], parts: int = 1, vector: int = 1, lanes: int = 1,
           ranks: int = 1, producers: dict | None = None, shuffle: bool = False,
           copy_stages: int = 0, rows_per_cta: int = 1) -> tirx.PrimFunc:
    """``func`` with the group's loop nests (and its element producers') replaced by the fused
    nest (where the last level was)."""
    root = func.body.block
    stages = list(root.body.seq) if isinstance(root.body, tirx.SeqStmt) else [root.body]
    names = {lvl.block for lvl in group} | {p.block for p in (producers or {}).values()}

    def blocks_in(stmt) -> set[str]:
        return {str(b.name_hint) for b in find_all(stmt, SBlock)}

    positions = [n for n, stage in enumerate(stages) if blocks_in(stage) & names]
    fused = _FusedBlock(group, parts, vector, lanes, ranks, producers, shuffle, copy_stages, rows_per_cta).build()
    kept = [s for n, s in enumerate(stages) if n not in positions[:-1]]
    kept[kept.index(stages[positions[-1]])] = fused
    body = kept[0] if len(kept) == 1 else tirx.SeqStmt(kept)
    gone = list(producers or {})  # computed inside the loop: no longer stored
    allocs = [b for b in root.alloc_buffers if not any(b.same_as(g) for g in gone)]
    return func.with_body(replace_node(func.body, root, with_block_body(root, body, allocs)))
