"""Lower one cluster kernel (a ``blockIdx.x`` attribute enclosing ``clusterCtaIdx.x`` bindings):
the steps :mod:`tvm_dsm.transform.lower_cluster` describes, for that kernel."""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Range
from tvm.sym import Analyzer

from ..annotations import (BULK_COPY_KEY, BULK_DST, CLUSTER_LAUNCH_KEY, RELEASABLE_START_KEY,
                           ROOT_ONLY_KEY, ROTATE_PEERS_KEY)
from ..errors import ClusterError
from ..ir import find_all, is_thread_extent, replace_node, substitute, uses
from ..schedule.cluster import RANK_TAG
from ..schedule.dsm import DSM_SCOPE
from .buffers import STATIC_SLICES_BUDGET, buffer_bytes, buffers_used, shared_bytes
from .bulk_copy import BulkCopy
from .cluster_barriers import MARKER_KINDS, ClusterBarriers
from .dsm_buffer import DSMBuffer


def _passed_to_calls(body, buffer) -> bool:
    """``buffer`` is an argument of an intrinsic (an access pointer of a tensor intrinsic)."""
    return bool(find_all(body, tvm.ir.Call, lambda c: any(a.same_as(buffer) for a in c.args)))


class ClusterKernelLowering:
    """Lowers one cluster kernel (a ``blockIdx.x`` attribute enclosing a rank binding)."""

    def __init__(self, kernel: tirx.AttrStmt, rank_attrs: list):
        sizes = {int(a.value) for a in rank_attrs}
        if len(sizes) != 1:
            raise ClusterError(f"one kernel binds the cluster rank with different sizes {sizes}")
        self.size = sizes.pop()
        self.kernel = kernel
        self.block_var = kernel.node.var
        self.rank = tirx.floormod(self.block_var, self.size)
        self.rank_vars = [a.node.var for a in rank_attrs]
        self.analyzer = Analyzer()
        self.dsm: list[DSMBuffer] = []
        self.errors: list[str] = []  # raised after each map: exceptions do not cross FFI
        self.root_only = False  # rewriting a stage only rank 0 runs
        self.thread_attrs: list[tirx.AttrStmt] = []  # threadIdx.* bindings (set by lower)
        self.bulk_copies: list[BulkCopy] = []
        self.remote: list = []  # DSM buffers some peer touches (set by lower)
        self.written_by_own_cta_only: list = []  # DSM buffers no peer writes (set by lower)

    def _slices(self, body) -> list[DSMBuffer]:
        """The kernel's DSM buffers, as ``shared.dyn`` slices, or static ``shared`` ones when
        slices no peer touches (a tree's intra-CTA partials) sit beside slices peers read (its
        last partials) and all fit in static shared memory: TVM's ThreadSync treats all
        ``shared.dyn`` buffers as one (they are merged), so a predicated merge round reading
        one and writing another would need a barrier inside its condition, which it refuses.
        (Mixing the two scopes in one kernel trips TVM's MergeSharedMemoryAllocations.) Later
        passes add static buffers of their own, so the slices keep 8 KB of the limit free."""
        allocs = find_all(body, tirx.AllocBuffer, lambda a: str(a.buffer.ty.storage_scope) == DSM_SCOPE)
        bulk = [b for loop in find_all(body, tirx.For, lambda f: BULK_COPY_KEY in f.annotations)
                for b in buffers_used(loop)]
        self.remote = [a.buffer for a in allocs if not self._only_own_slice(body, a.buffer, bulk)]
        self.written_by_own_cta_only = [a.buffer for a in allocs if self._stores_own_slice(body, a.buffer, bulk)]
        sizes = sum(buffer_bytes(a.buffer) // max(1, int(a.buffer.ty.shape[0])) for a in allocs)
        static = (0 < len(self.remote) < len(allocs)
                  and shared_bytes(body, "shared") + sizes <= STATIC_SLICES_BUDGET)
        return [DSMBuffer(a.buffer, self.size, "shared" if static else "shared.dyn") for a in allocs]

    def _stores_own_slice(self, body, buffer, bulk: list) -> bool:
        """Every write of ``buffer`` is provably to this CTA's slice (peers may read it; it is
        not among the ``bulk`` copies' buffers, no intrinsic takes its address)."""
        if any(buffer.same_as(b) for b in bulk) or _passed_to_calls(body, buffer):
            return False
        ranks = [st.indices[0] for st in find_all(body, tirx.BufferStore, lambda x: x.buffer.same_as(buffer))]
        return all(self.analyzer.can_prove_equal(r, self.rank) for r in ranks)

    def _only_own_slice(self, body, buffer, bulk: list) -> bool:
        """Every access of ``buffer`` is provably to this CTA's slice (it is not among the
        ``bulk`` copies' buffers, no intrinsic takes its address)."""
        if not self._stores_own_slice(body, buffer, bulk):
            return False
        ranks = [ld.indices[0] for ld in find_all(body, tvm.ir.TensorLoad, lambda x: x.source.same_as(buffer))]
        return all(self.analyzer.can_prove_equal(r, self.rank) for r in ranks)

    def dsm_of(self, buffer) -> DSMBuffer | None:
        return next((d for d in self.dsm if d.buffer.same_as(buffer)), None)

    def is_local(self, rank) -> bool:
        if self.analyzer.can_prove_equal(rank, self.rank):
            return True
        return self.root_only and self.analyzer.can_prove_equal(rank, 0)

    def _raise_errors(self) -> None:
        if self.errors:
            raise ClusterError(self.errors[0])

    def lower(self) -> tirx.AttrStmt:
        body = tvm_ffi.structural_map(
            self.kernel.body,
            [(tirx.AttrStmt, lambda a: a.body if is_thread_extent(a, RANK_TAG) else a)],
        )
        mapping = [(self.block_var, tirx.floordiv(self.block_var, self.size))]
        mapping += [(v, self.rank) for v in self.rank_vars]
        body = self._rotate_peers(substitute(body, mapping))
        # Thread index ranges let the analyzer prove alignment and lane invariance.
        self.analyzer.bind(self.block_var, Range(0, self.kernel.value * self.size))
        for attr in find_all(body, tirx.AttrStmt, lambda a: a.attr_key == "thread_extent"):
            self.analyzer.bind(attr.node.var, Range(0, attr.value))
            self.thread_attrs.append(attr)
        for loop in find_all(body, tirx.For):
            self.analyzer.bind(loop.loop_var, Range(loop.min, loop.min + loop.extent))
        self.dsm = self._slices(body)
        body = self._run_root_only_stages_on_rank_0(body)
        if self.dsm:
            body = self._rewrite_accesses(body)
            self._reject_bulk_copies_in_loops(body)
            body = ClusterBarriers([d.slice for d in self.dsm], self.thread_attrs).place(body)
            body = tvm_ffi.structural_map(
                body,
                [(tirx.AttrStmt, lambda a: a.body if a.attr_key in MARKER_KINDS else a)],
            )
            body = self._keep_slices_allocated(body)
            inits = [stmt for copy in self.bulk_copies for stmt in copy.init()]
            body = tirx.SeqStmt([*inits, body]) if inits else body
        grid = self.kernel.value * self.size
        node = tirx.IterVar(Range(0, grid), self.block_var, tirx.IterVar.ThreadIndex, "blockIdx.x")
        launch = tirx.AttrStmt(tvm.ir.StringImm("cluster"), CLUSTER_LAUNCH_KEY, self.size, body)
        return tirx.AttrStmt(node, "thread_extent", grid, launch)

    def _keep_slices_allocated(self, body):
        """Touch every slice right after its allocation and at the end of its scope, so it is
        live for the whole kernel. StorageRewrite would otherwise let a slice reuse the dead
        storage of a buffer of another dtype (a GEMM's operand tile), or let a later buffer (a
        fused kernel's next tile) reuse a slice, and leave the typed ``tvm_access_ptr`` of one
        on the other, which TVM rejects; peers also read a slice at times its own CTA's
        liveness cannot see. The touches are address expressions that survive as no-op
        statements in the CUDA (ThreadSync may add a ``__syncthreads`` after one). The first
        touch of a slice no peer writes is marked: :mod:`tvm_dsm.transform.release_slice_starts` drops it
        before TVM merges shared memory, so the slice may take the dead operand tiles' bytes."""
        # Static slices no peer touches keep TVM's own liveness.
        slices = [d.slice for d in self.dsm if str(d.slice.ty.storage_scope) == "shared.dyn"
                  or any(d.buffer.same_as(b) for b in self.remote)]
        own_writes = [d.slice for d in self.dsm
                      if any(d.buffer.same_as(b) for b in self.written_by_own_cta_only)]

        def on_seq(seq: tirx.SeqStmt) -> tirx.SeqStmt:
            stmts, touches = [], []
            for stmt in seq.seq:
                stmts.append(stmt)
                if isinstance(stmt, tirx.AllocBuffer) and any(stmt.buffer.same_as(b) for b in slices):
                    touches.append(tirx.Evaluate(stmt.buffer.access_ptr("r")))
                    start = tirx.Evaluate(stmt.buffer.access_ptr("r"))
                    if (str(stmt.buffer.ty.storage_scope) == "shared.dyn"
                            and any(stmt.buffer.same_as(b) for b in own_writes)):
                        start = tirx.AttrStmt(stmt.buffer, RELEASABLE_START_KEY, 0, start)
                    stmts.append(start)
            return tirx.SeqStmt(stmts + touches)

        return tvm_ffi.structural_map(body, [(tirx.SeqStmt, on_seq)])

    def _rotate_peers(self, body):
        """Loops marked ROTATE_PEERS_KEY start CTA r's walk over the peers at peer r."""

        def on_for(loop):
            if ROTATE_PEERS_KEY not in loop.annotations:
                return loop
            rotated = tirx.floormod(loop.loop_var + self.rank, loop.extent)
            annotations = {k: v for k, v in loop.annotations.items() if k != ROTATE_PEERS_KEY}
            return tirx.For(
                loop.loop_var, loop.min, loop.extent, loop.kind,
                substitute(loop.body, [(loop.loop_var, rotated)]),
                loop.thread_binding, annotations,
            )

        return tvm_ffi.structural_map(body, [(tirx.For, on_for)])

    def _run_root_only_stages_on_rank_0(self, body):
        """Guard once-per-cluster stages (marked by CheckClusterSchedule) with ``rank == 0``."""
        stages = find_all(body, tirx.AttrStmt, lambda a: a.attr_key == ROOT_ONLY_KEY)
        for stage in stages:
            self.root_only = True
            inner = self._rewrite_accesses(stage.body) if self.dsm else stage.body
            self.root_only = False
            body = replace_node(body, stage, tirx.IfThenElse(tirx.EQ(self.rank, 0), inner, None))
        return body

    # -- accesses -------------------------------------------------------------------------------
    def _remote_loads(self, expr) -> list:
        return find_all(
            expr,
            tvm.ir.TensorLoad,
            lambda ld: self.dsm_of(ld.source) is not None and not self.is_local(ld.indices[0]),
        )

    def _vector_access(self, dsm: DSMBuffer, indices, loop) -> tuple | None:
        """(lane-0 indices, lanes) if a vectorized ``loop`` can move ``indices`` (rank first) as one
        PTX vector access; None if the access must stay scalar."""
        lanes = dsm.vector_lanes(int(loop.extent))
        if lanes is None:
            return None
        dtype = str(loop.loop_var.ty)  # int64 in Relax-legalized functions
        self.analyzer.bind(loop.loop_var, Range.from_min_extent(tirx.const(0, dtype), tirx.const(lanes, dtype)))
        start = self.contiguous_run(indices, loop.loop_var, lanes)
        return None if start is None else (start, lanes)

    def contiguous_run(self, indices, var: tirx.Var, lanes: int) -> list | None:
        """The indices at ``var = 0`` if ``indices`` (rank first) hold the rank and the outer slice
        indices fixed while ``var`` (bound to [0, lanes)) runs, and walk the last one contiguously
        from a start aligned to ``lanes``; None otherwise."""

        def at_lane_0(expr):
            return substitute(expr, [(var, tirx.const(0, str(var.ty)))])

        def lane_invariant(div, zero) -> bool:
            """a // c is the same for every lane if the simplifier says so, or if a = a0 + lane
            with a0 a multiple of the lane count, which divides c."""
            if self.analyzer.can_prove_equal(div, zero):
                return True
            start = at_lane_0(div.a)
            return (
                isinstance(div.b, tirx.IntImm)
                and int(div.b) % lanes == 0
                and self.analyzer.can_prove_equal(div.a - start, var)
                and self.analyzer.can_prove_equal(tirx.floormod(start, lanes), 0)
            )

        def invariant_divisions(expr):
            """x % c as x - (x // c) * c, and every x // c that is constant across the lanes by
            its lane-0 value: what is left of the lane is then plain arithmetic."""
            expr = tvm_ffi.structural_map(
                expr, [(tirx.FloorMod, lambda m: m.a - tirx.floordiv(m.a, m.b) * m.b)]
            )

            def fix(div):
                zero = at_lane_0(div)
                return zero if uses(div, var) and lane_invariant(div, zero) else div

            return tvm_ffi.structural_map(expr, [(tirx.FloorDiv, fix)])

        *outer, last = indices
        for index in outer:
            if uses(index, var) and not self.analyzer.can_prove_equal(
                invariant_divisions(index), invariant_divisions(at_lane_0(index))
            ):
                return None
        start = at_lane_0(last)
        if not self.analyzer.can_prove_equal(
            invariant_divisions(last) - invariant_divisions(start), var
        ):
            return None
        if not self.analyzer.can_prove_equal(tirx.floormod(start, lanes), 0):
            return None
        return [self.analyzer.simplify(at_lane_0(i)) for i in indices]

    def _lower_vector_loop(self, loop):
        """One 4/8/16-byte ld/st.shared::cluster per vectorized loop and remote operand."""
        store = loop.body
        if not isinstance(store, tirx.BufferStore):
            return None
        pre, post, value = [], [], store.value
        for load in self._remote_loads(store.value):
            dsm = self.dsm_of(load.source)
            access = self._vector_access(dsm, list(load.indices), loop)
            if access is None:
                return None
            (rank, *indices), lanes = access
            stmts, regs = dsm.remote_load(indices, rank, lanes)
            pre.extend(stmts)
            value = replace_node(value, load, tirx.BufferLoad(regs, [loop.loop_var]))
        dsm = self.dsm_of(store.buffer)
        if dsm is not None and not self.is_local(store.indices[0]):
            access = self._vector_access(dsm, list(store.indices), loop)
            if access is None:
                return None
            (rank, *indices), lanes = access
            allocs, regs, operands = dsm.registers(lanes)
            pre.extend(allocs)
            post = dsm.remote_store(indices, rank, operands, lanes)
            store = tirx.BufferStore(regs, value, [loop.loop_var])
        else:
            store = tirx.BufferStore(store.buffer, value, store.indices)
        body = tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, store,
                        loop.thread_binding, loop.annotations)
        return tirx.SeqStmt([*pre, body, *post])

    def _rewrite_accesses(self, body):
        def on_alloc(alloc):
            dsm = self.dsm_of(alloc.buffer)
            return alloc if dsm is None else tirx.AllocBuffer(dsm.slice)

        def on_for(loop):
            if BULK_COPY_KEY in loop.annotations:
                return self._lower_bulk_copy(loop)
            if loop.kind != tirx.ForKind.VECTORIZED:
                return loop
            remote = self._remote_loads(loop.body) or any(
                self.dsm_of(s.buffer) is not None and not self.is_local(s.indices[0])
                for s in find_all(loop.body, tirx.BufferStore)
            )
            if not remote:
                return loop
            lowered = self._lower_vector_loop(loop)
            if lowered is not None:
                return lowered
            # Not a contiguous aligned vector: keep it correct with scalar remote accesses.
            return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body,
                            None, loop.annotations)

        def on_store(store):
            pre: list = []

            def on_load(load):
                dsm = self.dsm_of(load.source)
                if dsm is None:
                    return load
                rank, *indices = load.indices
                if self.is_local(rank):
                    return tirx.BufferLoad(dsm.slice, indices)
                stmts, value = dsm.remote_load_scalar(indices, rank)
                pre.extend(stmts)
                return value

            self._reject_guarded_remote_loads(store.value)
            value = tvm_ffi.structural_map(store.value, [(tvm.ir.TensorLoad, on_load)])
            dsm = self.dsm_of(store.buffer)
            if dsm is None:
                stmts = [tirx.BufferStore(store.buffer, value, store.indices)]
            else:
                rank, *indices = store.indices
                if self.is_local(rank):
                    stmts = [tirx.BufferStore(dsm.slice, value, indices)]
                else:
                    stmts = dsm.remote_store(indices, rank, [value])
            return stmts[0] if not pre and len(stmts) == 1 else tirx.SeqStmt(pre + stmts)

        body = tvm_ffi.structural_map(
            body,
            [(tirx.AllocBuffer, on_alloc), (tirx.For, on_for), (tirx.BufferStore, on_store)],
            order="pre",
        )
        leftover = find_all(body, tvm.ir.TensorLoad, lambda ld: self.dsm_of(ld.source))
        if leftover:
            self.errors.append(
                f"DSM buffer {leftover[0].source.name} is read outside a store's value (e.g. in a "
                "condition or loop bound); tvm-dsm lowers DSM reads only there"
            )
        self._raise_errors()
        return body

    def _lower_bulk_copy(self, loop):
        try:
            copy = BulkCopy(self, loop)
        except ClusterError as err:
            self.errors.append(str(err))
            return loop
        self.bulk_copies.append(copy)
        return copy.stage()

    def _reject_bulk_copies_in_loops(self, body) -> None:
        def is_bulk(a):
            return a.attr_key == BULK_DST

        if find_all(body, tirx.For, lambda loop: find_all(loop, tirx.AttrStmt, is_bulk)):
            raise ClusterError(
                "bulk_copy inside a loop: each bulk copy completes on one mbarrier phase per "
                "launch; compute the copy at the cluster loop"
            )

    def _reject_guarded_remote_loads(self, value) -> None:
        """A hoisted remote load would run even where a select/if_then_else guards it off."""

        def guarded(node):
            loads = self._remote_loads(node)
            if loads:
                self.errors.append(
                    f"a read of a peer's slice of DSM buffer {loads[0].source.name} is guarded by "
                    "a select/if_then_else; tvm-dsm does not lower conditional remote reads"
                )

        for node in find_all(value, tirx.Select) + find_all(
            value, tvm.ir.Call, lambda c: c.op.name.endswith("if_then_else")
        ):
            guarded(node)
