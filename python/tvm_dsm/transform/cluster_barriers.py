"""Place ``barrier.cluster`` between the stages of a cluster kernel that touch peers' DSM slices.

A stage is a statement of the CTA-uniform sequence (children of the sequences reached through
attributes only, so every thread of the CTA executes the barriers). The accesses a stage makes
are read from the markers the kernel lowering leaves around each remote access and bulk copy
(:mod:`tvm_dsm.transform.dsm_buffer`, :mod:`tvm_dsm.transform.bulk_copy`) and from the plain
loads and stores of the CTA's own slices.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.script import tirx as T

from ..annotations import BULK_DST, BULK_SRC
from ..errors import ClusterError
from ..ir import find_all, items, uses
from .bulk_copy import fence_proxy_async
from .dsm_buffer import REMOTE_LOAD, REMOTE_STORE

#: Each access marker's kind in the barrier analysis.
MARKER_KINDS = {REMOTE_LOAD: "remote_load", REMOTE_STORE: "remote_store",
                BULK_SRC: "bulk_load", BULK_DST: "bulk_store"}
_ANY_SLICE = -1  # stands for every DSM slice in the barrier analysis


def cluster_barrier() -> tirx.Evaluate:
    return tirx.Evaluate(T.cuda.cluster_sync())


class BarrierState:
    """What happened to each DSM buffer since the last cluster barrier."""

    def __init__(self):
        self.started = False  # a barrier has run: every CTA of the cluster has started
        self._clear()

    def reset(self) -> None:
        """A barrier was placed."""
        self.started = True
        self._clear()

    def _clear(self) -> None:
        self.written: set[int] = set()
        self.written_remotely: set[int] = set()
        self.read_remotely: set[int] = set()
        self.remote_since_barrier = False

    def needs_barrier_before(self, t: dict[str, set[int]]) -> bool:
        remote = bool(t["remote_load"] or t["remote_store"])
        writes = t["store"] | t["remote_store"]
        return bool(
            (remote and not self.started)
            or t["remote_load"] & (self.written | self.written_remotely)
            or writes & self.read_remotely
            or (_ANY_SLICE in writes and self.read_remotely)
            or writes & self.written_remotely
            or t["remote_store"] & self.written
        )

    def pending(self) -> bool:
        """Some access since the last barrier could conflict with a later stage."""
        return bool(self.written or self.written_remotely or self.read_remotely)

    def record(self, t: dict[str, set[int]]) -> None:
        # A bulk copy's destination is complete once the receiver's mbarrier wait returns, as if
        # written locally; its source is read by the sender's copy engine until every receiver
        # has waited, as if read remotely.
        self.written |= t["store"] | t["bulk_store"]
        self.written_remotely |= t["remote_store"]
        self.read_remotely |= t["remote_load"] | t["bulk_load"]
        self.remote_since_barrier |= bool(t["remote_load"] or t["remote_store"] or t["bulk_store"])


class ClusterBarriers:
    """The barrier placement of one cluster kernel: its DSM ``slices`` (the CTA's own buffers)
    and its ``thread_attrs`` (``threadIdx.*`` bindings, which tell CTA-uniform loops)."""

    def __init__(self, slices: list, thread_attrs: list):
        self.slices = slices
        self.thread_attrs = thread_attrs

    def _touches(self, stmt) -> dict[str, set[int]]:
        """Per access kind, the indices (into self.slices) of the DSM slices ``stmt`` touches."""

        def which(buffer) -> set[int]:
            return {n for n, s in enumerate(self.slices) if buffer.same_as(s)}

        kinds = ("load", "store", *MARKER_KINDS.values())
        touched: dict[str, set[int]] = {k: set() for k in kinds}
        # MergeSharedMemoryAllocations may place any shared buffer over a dead DSM slice: a
        # write to shared memory counts as a write to every slice (index -1) for WAR hazards.
        if find_all(stmt, tirx.BufferStore, lambda st: str(st.buffer.ty.storage_scope).startswith("shared")):
            touched["store"].add(_ANY_SLICE)
        for attr in find_all(stmt, tirx.AttrStmt, lambda a: a.attr_key in MARKER_KINDS):
            touched[MARKER_KINDS[attr.attr_key]] |= which(attr.node)
        for load in find_all(stmt, tvm.ir.TensorLoad):
            touched["load"] |= which(load.source)
        for store in find_all(stmt, tirx.BufferStore):
            touched["store"] |= which(store.buffer)
        return touched

    def place(self, stmt, state: BarrierState | None = None):
        """Insert ``barrier.cluster`` where the CTA-uniform stage sequence needs one.

        A barrier goes before a stage that reads a peer's slice of a buffer written since the
        last barrier (RAW), writes a buffer whose slices peers read since then (WAR) or that was
        written remotely since then (WAW), before the first remote access (peers must have
        started), and at the end if any remote access followed the last one (no CTA exits while
        a peer reads its SMEM).
        """
        top = state is None
        state = state or BarrierState()
        if isinstance(stmt, tirx.AttrStmt):
            body = self.place(stmt.body, state)
            out = [tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)]
        else:
            out = []
            for stage in items(stmt):
                t = self._touches(stage)
                # A peer's slice read while the same buffer is written (or written while read) in
                # one stage: only barriers inside the stage could order the two.
                mixed = bool(t["remote_load"] & (t["store"] | t["remote_store"])) or bool(
                    t["remote_store"] & (t["load"] | t["store"])
                )
                if mixed and isinstance(stage, (tirx.AttrStmt, tirx.SeqStmt)):
                    out.append(self.place(stage, state))
                    continue
                if mixed and self._is_uniform_loop(stage):
                    out.append(self._place_in_loop(stage, state))
                    continue
                if mixed:
                    raise ClusterError(
                        "one stage both writes a DSM buffer and accesses a peer's slice of it "
                        "(e.g. a loop over rounds); it needs barriers inside the loop, which "
                        "tvm-dsm's DSM buffers do not place: split the stage or use a collective"
                    )
                if t["bulk_store"]:
                    out.extend([fence_proxy_async(), cluster_barrier()])
                    state.reset()
                elif state.needs_barrier_before(t):
                    out.append(cluster_barrier())
                    state.reset()
                out.append(stage)
                state.record(t)
        if top and state.remote_since_barrier:
            out.append(cluster_barrier())
        return out[0] if len(out) == 1 else tirx.SeqStmt(out)

    def _is_uniform_loop(self, stmt) -> bool:
        """A sequential loop every thread of the CTA runs the same number of times."""
        return (
            isinstance(stmt, tirx.For)
            and stmt.kind in (tirx.ForKind.SERIAL, tirx.ForKind.UNROLLED)
            and not any(uses(e, a.node.var) for e in (stmt.min, stmt.extent) for a in self.thread_attrs)
        )

    def _place_in_loop(self, loop: tirx.For, state: BarrierState) -> tirx.For:
        """Barriers inside a loop whose body writes DSM slices and reads peers' (a fused
        kernel's steps). The body is placed from the state at loop entry, which covers the
        first iteration; a barrier closes the body whenever anything is pending, so every later
        iteration starts from a clean state, which needs no more barriers than the first."""
        body = self.place(loop.body, state)
        if state.pending():
            body = tirx.SeqStmt([body, cluster_barrier()])
            state.reset()
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body,
                        loop.thread_binding, loop.annotations)
