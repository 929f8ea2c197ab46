"""Lower cluster-bound kernels: real CTAs, DSM slices, remote accesses and cluster barriers.

Runs after ``LowerOpaqueBlock`` (block variables are gone, thread bindings are ``thread_extent``
attributes, indices are still multi-dimensional) and before ``LowerThreadAllreduce``. For each
kernel whose ``blockIdx.x`` (extent C) encloses a ``clusterCtaIdx.x`` binding (extent S):

* the kernel launches C*S CTAs: ``blockIdx.x`` is rebound so that the old cluster index is
  ``blockIdx.x // S`` and the rank is ``blockIdx.x % S`` (CUDA's ``%cluster_ctarank`` for 1-D
  clusters); the ``clusterCtaIdx`` binding is removed, which also keeps stock
  ``LowerThreadAllreduce`` (which rejects thread scopes of rank 2) working inside clusters, and
  an attribute records S for :mod:`tvm_dsm.transform.cluster_launch`;
* every ``shared::cluster`` buffer ``B[S, ...]`` becomes the CTA's own slice ``B[...]`` in
  ``shared``; an access ``B[r, i]`` stays local when ``r`` is provably the CTA's rank and otherwise
  becomes ``mapa`` + ``ld/st.shared::cluster`` (TVM's own ``T.ptx`` intrinsics);
* every stage (statement of the CTA-uniform sequence) that touches a peer's slice is fenced by
  ``barrier.cluster`` arrive/wait before (peers have written, and have started) and after (peers
  have finished reading before anyone overwrites or exits);
* a copy loop marked for bulk transfer becomes mbarrier-completed ``cp.async.bulk`` pushes
  (:mod:`tvm_dsm.transform.bulk_copy`), always preceded by ``fence.proxy.async`` and a barrier.
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Range
from tvm.script import tirx as T
from tvm.sym import Analyzer

from ..errors import ClusterError
from ..ir import find_all, is_barrier, replace_node, substitute, uses
from ..schedule.cluster import RANK_TAG
from ..annotations import BULK_COPY_KEY, ROTATE_PEERS_KEY
from ..schedule.dsm import DSM_SCOPE
from .bulk_copy import BulkCopy, fence_proxy_async
from ..annotations import BULK_DST, BULK_SRC
from ..annotations import ROOT_ONLY_KEY
from ..annotations import CLUSTER_LAUNCH_KEY, RELEASABLE_START_KEY

# Markers around the PTX of one remote access (node: the slice), read by barrier placement and
# removed before the pass returns.
_REMOTE_LOAD = "tvm_dsm.remote_load"
_REMOTE_STORE = "tvm_dsm.remote_store"
# Each marker's access kind in the barrier analysis.
_MARKER_KINDS = {_REMOTE_LOAD: "remote_load", _REMOTE_STORE: "remote_store",
                 BULK_SRC: "bulk_load", BULK_DST: "bulk_store"}
_ANY_SLICE = -1  # stands for every DSM slice in the barrier analysis

# PTX type of a remote ld/st per element dtype. 16-bit floats move as raw b16 bits.
_PTX_TYPES = {
    "float32": "f32",
    "float64": "f64",
    "int32": "s32",
    "uint32": "u32",
    "int64": "s64",
    "uint64": "u64",
    "int16": "s16",
    "uint16": "u16",
    "float16": "b16",
    "bfloat16": "b16",
}
_BITS16 = {"float16", "bfloat16"}


def _is_thread_extent(stmt, tag: str) -> bool:
    return (
        isinstance(stmt, tirx.AttrStmt)
        and stmt.attr_key == "thread_extent"
        and str(stmt.node.thread_tag) == tag
    )


#: CUDA's limit on static (``__shared__``) shared memory per CTA.
MAX_STATIC_SMEM = 48 * 1024
STATIC_SLICES_BUDGET = 40 * 1024


def shared_bytes(body, scope: str) -> int:
    """Bytes of the ``scope`` buffers allocated in ``body``."""
    return sum(buffer_bytes(a.buffer) for a in find_all(
        body, tirx.AllocBuffer, lambda a: str(a.buffer.ty.storage_scope) == scope))


def buffer_bytes(buffer) -> int:
    return math.prod(int(d) for d in buffer.ty.shape) * tvm.DataType(str(buffer.ty.dtype)).bits // 8


def buffers_used(stmt) -> list:
    """The buffers ``stmt`` loads or stores."""
    return ([ld.source for ld in find_all(stmt, tvm.ir.TensorLoad)]
            + [st.buffer for st in find_all(stmt, tirx.BufferStore)])


def _passed_to_calls(body, buffer) -> bool:
    """``buffer`` is an argument of an intrinsic (an access pointer of a tensor intrinsic)."""
    return bool(find_all(body, tvm.ir.Call, lambda c: any(a.same_as(buffer) for a in c.args)))


def _cluster_barrier() -> tirx.Evaluate:
    return tirx.Evaluate(T.cuda.cluster_sync())


class _DSMBuffer:
    """One DSM buffer of a kernel: the per-CTA slice and how to reach a peer's copy of it.

    Index r of the leading axis lives in the CTA of rank r. Buffer compaction may shorten the axis
    (a buffer only rank 0 writes) or shift it; it shifts every access alike, so each element still
    has one home CTA that writers and readers agree on.
    """

    def __init__(self, buffer: tirx.Var, cluster_size: int, scope: str = "shared.dyn"):
        shape = list(buffer.ty.shape)
        if not shape or not isinstance(shape[0], tirx.IntImm) or int(shape[0]) > cluster_size:
            raise ClusterError(
                f"DSM buffer {buffer.name} has shape {shape}: its leading axis indexes the owning "
                f"CTA, so its extent must be at most {cluster_size} (the cluster size)"
            )
        self.dtype = str(buffer.ty.dtype)
        if self.dtype not in _PTX_TYPES:
            raise ClusterError(f"DSM buffer {buffer.name}: dtype {self.dtype} is not supported")
        self.buffer = buffer
        self.slice = tirx.decl_buffer(shape[1:], self.dtype, f"{buffer.name}_slice", scope=scope)
        self.strides = []
        stride = 1
        for extent in reversed(shape[1:]):
            self.strides.insert(0, stride)
            stride = stride * extent

    def offset(self, indices) -> tvm.ir.PrimExpr:
        """The element offset of slice ``indices`` (without the rank) in the slice."""
        return sum((i * s for i, s in zip(indices, self.strides)), tirx.const(0, "int32"))

    def _peer_address(self, indices, rank, peer: tirx.Var, mask: str) -> tirx.Evaluate:
        # ``mask`` tells ThreadSync whether the CTA's own slice is read or written here (it is
        # neither; the peer's is), so loads do not get __syncthreads between iterations.
        offset = self.offset(indices)
        local = T.cuda.cvta_generic_to_shared(self.slice.access_ptr(mask, offset=offset))
        return tirx.Evaluate(
            T.ptx.mapa.shared__cluster.u32(peer[0], local, tirx.Cast("uint32", rank))
        )

    def _ptx(self, op, lanes: int = 1):
        """``op.shared::cluster[.vN].type`` moving ``lanes`` elements (16-bit ones as b32 pairs)."""
        space = getattr(op, "shared__cluster")
        if self.dtype in _BITS16 and lanes > 1:
            words = lanes // 2
            return getattr(getattr(space, f"v{words}"), "b32") if words > 1 else space.b32
        if lanes > 1:
            space = getattr(space, f"v{lanes}")
        return getattr(space, _PTX_TYPES[self.dtype])

    def registers(self, lanes: int) -> tuple[list, tirx.Var, list]:
        """Local registers for ``lanes`` elements: (allocations, element view, PTX operands)."""
        if self.dtype in _BITS16 and lanes > 1:
            words = tirx.decl_buffer((lanes // 2,), "uint32", "dsm_words", scope="local")
            view = tirx.decl_buffer((lanes,), self.dtype, "dsm_value", data=words.data, scope="local")
            decl = tirx.DeclBuffer(view, data=words.data)
            return [tirx.AllocBuffer(words), decl], view, [words[w] for w in range(lanes // 2)]
        raw = "uint16" if self.dtype in _BITS16 else self.dtype
        regs = tirx.decl_buffer((lanes,), raw, "dsm_value", scope="local")
        return [tirx.AllocBuffer(regs)], regs, [regs[v] for v in range(lanes)]

    def remote_load(self, indices, rank, lanes: int = 1) -> tuple[list, tirx.Var]:
        """Statements loading ``lanes`` elements of peer ``rank`` from ``indices`` into registers,
        and the registers (a ``lanes``-element local buffer of the element type)."""
        peer = tirx.decl_buffer((1,), "uint32", "dsm_peer_addr", scope="local")
        allocs, view, operands = self.registers(lanes)
        access = [self._peer_address(indices, rank, peer, "r"),
                  tirx.Evaluate(self._ptx(T.ptx.ld, lanes)(*operands, peer[0]))]
        marked = tirx.AttrStmt(self.slice, _REMOTE_LOAD, 0, tirx.SeqStmt(access))
        return [tirx.AllocBuffer(peer), *allocs, marked], view

    def remote_load_scalar(self, indices, rank) -> tuple[list, tvm.ir.PrimExpr]:
        stmts, regs = self.remote_load(indices, rank)
        value = regs[0]
        if str(regs.ty.dtype) != self.dtype:
            value = tirx.call_intrin(self.dtype, "tirx.reinterpret", value)
        return stmts, value

    def remote_store(self, indices, rank, operands: list, lanes: int = 1) -> list:
        """Statements storing ``lanes`` elements (PTX ``operands``) to peer ``rank``'s slice."""
        peer = tirx.decl_buffer((1,), "uint32", "dsm_peer_addr", scope="local")
        if lanes == 1 and self.dtype in _BITS16:
            operands = [tirx.call_intrin("uint16", "tirx.reinterpret", operands[0])]
        access = [self._peer_address(indices, rank, peer, "w"),
                  tirx.Evaluate(self._ptx(T.ptx.st, lanes)(peer[0], *operands))]
        marked = tirx.AttrStmt(self.slice, _REMOTE_STORE, 0, tirx.SeqStmt(access))
        return [tirx.AllocBuffer(peer), marked]

    def vector_lanes(self, extent: int) -> int | None:
        """Elements per remote vector access for a vectorized loop of ``extent``, if PTX has one."""
        nbytes = extent * tvm.DataType(self.dtype).bits // 8
        return extent if nbytes in (4, 8, 16) and extent > 1 else None


class _KernelLowering:
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
        self.dsm: list[_DSMBuffer] = []
        self.errors: list[str] = []  # raised after each map: exceptions do not cross FFI
        self.root_only = False  # rewriting a stage only rank 0 runs
        self.thread_attrs: list[tirx.AttrStmt] = []  # threadIdx.* bindings (set by lower)
        self.bulk_copies: list[BulkCopy] = []
        self.remote: list = []  # DSM buffers some peer touches (set by lower)
        self.written_by_own_cta_only: list = []  # DSM buffers no peer writes (set by lower)

    def _slices(self, body) -> list[_DSMBuffer]:
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
        return [_DSMBuffer(a.buffer, self.size, "shared" if static else "shared.dyn") for a in allocs]

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

    def dsm_of(self, buffer) -> _DSMBuffer | None:
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
            [(tirx.AttrStmt, lambda a: a.body if _is_thread_extent(a, RANK_TAG) else a)],
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
            body = self._place_barriers(body)
            body = tvm_ffi.structural_map(
                body,
                [(tirx.AttrStmt, lambda a: a.body if a.attr_key in _MARKER_KINDS else a)],
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
        touch of a slice no peer writes is marked: :func:`release_slice_starts` drops it
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

    def _vector_access(self, dsm: _DSMBuffer, indices, loop) -> tuple | None:
        """(lane-0 indices, lanes) if a vectorized ``loop`` can move ``indices`` (rank first) as one
        PTX vector access; None if the access must stay scalar."""
        lanes = dsm.vector_lanes(int(loop.extent))
        if lanes is None:
            return None
        self.analyzer.bind(loop.loop_var, Range(0, lanes))
        start = self.contiguous_run(indices, loop.loop_var, lanes)
        return None if start is None else (start, lanes)

    def contiguous_run(self, indices, var: tirx.Var, lanes: int) -> list | None:
        """The indices at ``var = 0`` if ``indices`` (rank first) hold the rank and the outer slice
        indices fixed while ``var`` (bound to [0, lanes)) runs, and walk the last one contiguously
        from a start aligned to ``lanes``; None otherwise."""

        def at_lane_0(expr):
            return substitute(expr, [(var, tirx.const(0, "int32"))])

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

    # -- barriers -------------------------------------------------------------------------------
    def _touches(self, stmt) -> dict[str, set[int]]:
        """Per access kind, the indices (into self.dsm) of the DSM buffers ``stmt`` touches."""
        slices = [d.slice for d in self.dsm]

        def which(buffer) -> set[int]:
            return {n for n, s in enumerate(slices) if buffer.same_as(s)}

        kinds = ("load", "store", *_MARKER_KINDS.values())
        touched: dict[str, set[int]] = {k: set() for k in kinds}
        # MergeSharedMemoryAllocations may place any shared buffer over a dead DSM slice: a
        # write to shared memory counts as a write to every slice (index -1) for WAR hazards.
        if find_all(stmt, tirx.BufferStore, lambda st: str(st.buffer.ty.storage_scope).startswith("shared")):
            touched["store"].add(_ANY_SLICE)
        for attr in find_all(stmt, tirx.AttrStmt, lambda a: a.attr_key in _MARKER_KINDS):
            touched[_MARKER_KINDS[attr.attr_key]] |= which(attr.node)
        for load in find_all(stmt, tvm.ir.TensorLoad):
            touched["load"] |= which(load.source)
        for store in find_all(stmt, tirx.BufferStore):
            touched["store"] |= which(store.buffer)
        return touched

    def _place_barriers(self, stmt, state: "_BarrierState | None" = None):
        """Insert ``barrier.cluster`` where the CTA-uniform stage sequence needs one.

        Stages are the children of the sequences reached through attributes only, so every
        thread of the CTA executes the barriers. A barrier goes before a stage that reads a peer's
        slice of a buffer written since the last barrier (RAW), writes a buffer whose slices peers
        read since then (WAR) or that was written remotely since then (WAW), before the first
        remote access (peers must have started), and at the end if any remote access followed the
        last one (no CTA exits while a peer reads its SMEM).
        """
        top = state is None
        state = state or _BarrierState()
        if isinstance(stmt, tirx.AttrStmt):
            body = self._place_barriers(stmt.body, state)
            out = [tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)]
        else:
            out = []
            for stage in list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else [stmt]:
                t = self._touches(stage)
                # A peer's slice read while the same buffer is written (or written while read) in
                # one stage: only barriers inside the stage could order the two.
                mixed = bool(t["remote_load"] & (t["store"] | t["remote_store"])) or bool(
                    t["remote_store"] & (t["load"] | t["store"])
                )
                if mixed and isinstance(stage, (tirx.AttrStmt, tirx.SeqStmt)):
                    out.append(self._place_barriers(stage, state))
                    continue
                if mixed and self._is_uniform_loop(stage):
                    out.append(self._place_loop_barriers(stage, state))
                    continue
                if mixed:
                    raise ClusterError(
                        "one stage both writes a DSM buffer and accesses a peer's slice of it "
                        "(e.g. a loop over rounds); it needs barriers inside the loop, which "
                        "tvm-dsm's DSM buffers do not place: split the stage or use a collective"
                    )
                if t["bulk_store"]:
                    out.extend([fence_proxy_async(), _cluster_barrier()])
                    state.reset()
                elif state.needs_barrier_before(t):
                    out.append(_cluster_barrier())
                    state.reset()
                out.append(stage)
                state.record(t)
        if top and state.remote_since_barrier:
            out.append(_cluster_barrier())
        return out[0] if len(out) == 1 else tirx.SeqStmt(out)

    def _is_uniform_loop(self, stmt) -> bool:
        """A sequential loop every thread of the CTA runs the same number of times."""
        return (
            isinstance(stmt, tirx.For)
            and stmt.kind in (tirx.ForKind.SERIAL, tirx.ForKind.UNROLLED)
            and not any(uses(e, a.node.var) for e in (stmt.min, stmt.extent) for a in self.thread_attrs)
        )

    def _place_loop_barriers(self, loop: tirx.For, state: "_BarrierState") -> tirx.For:
        """Barriers inside a loop whose body writes DSM slices and reads peers' (a fused
        kernel's steps). The body is placed from the state at loop entry, which covers the
        first iteration; a barrier closes the body whenever anything is pending, so every later
        iteration starts from a clean state, which needs no more barriers than the first."""
        body = self._place_barriers(loop.body, state)
        if state.pending():
            body = tirx.SeqStmt([body, _cluster_barrier()])
            state.reset()
        return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, body,
                        loop.thread_binding, loop.annotations)


class _BarrierState:
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


def lower_cluster_function(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Apply the lowering described in the module docstring to every cluster kernel of ``func``."""

    body = func.body  # lowered outside map callbacks: exceptions do not cross the FFI boundary
    for kernel in find_all(func.body, tirx.AttrStmt, lambda a: _is_thread_extent(a, "blockIdx.x")):
        ranks = find_all(kernel.body, tirx.AttrStmt, lambda a: _is_thread_extent(a, RANK_TAG))
        if ranks:
            body = replace_node(body, kernel, _KernelLowering(kernel, ranks).lower())
    stray = find_all(
        body, tirx.AllocBuffer, lambda a: str(a.buffer.ty.storage_scope) == DSM_SCOPE
    )
    if stray:
        raise ClusterError(
            f"buffer {stray[0].buffer.name} is placed in DSM but its kernel has no cluster; bind "
            "one with tvm_dsm.schedule.bind_cluster"
        )
    return func.with_body(body)


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.LowerCluster")
def LowerCluster(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
    """Pass form of :func:`lower_cluster_function`."""
    return lower_cluster_function(func)


def _touched_buffer(touch: tirx.Evaluate):
    """The buffer a slice touch (``tvm_access_ptr``) names, as the IR has it now."""
    return touch.value.args[1]


def release_slice_starts(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Drop the marked first touch of each slice no peer writes, and put a CTA barrier before
    the slice's first real access, so MergeSharedMemoryAllocations may overlay the slice on
    buffers dead by then (a GEMM's operand pipeline: the partial tile then costs no SMEM of its
    own, and two CTAs fit per SM). Safe after ThreadSync: peers only read the slice after the
    cluster barrier that follows this CTA's own writes, the end touch keeps it live until the
    kernel ends, and the barrier keeps a warp's first write after every warp's last read of
    what the slice overlays. Runs right before MergeSharedMemoryAllocations."""

    def on_seq(seq: tirx.SeqStmt):
        items = list(seq.seq)
        marked = [i for i, s in enumerate(items)
                  if isinstance(s, tirx.AttrStmt) and s.attr_key == RELEASABLE_START_KEY]
        if not marked:
            return seq
        out = []
        pending = []  # buffers whose first access is still ahead in this sequence
        for i, stmt in enumerate(items):
            if i in marked:
                pending.append(_touched_buffer(stmt.body))
                continue
            first = [b for b in pending if uses(stmt, b)]
            if first:
                if not (out and is_barrier(out[-1])):
                    out.append(tirx.Evaluate(T.tvm_storage_sync("shared")))
                pending = [b for b in pending if not any(b.same_as(f) for f in first)]
            out.append(stmt)
        return tirx.SeqStmt(out)

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.SeqStmt, on_seq)]))


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.ReleaseSliceStarts")
def ReleaseSliceStarts(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
    """Pass form of :func:`release_slice_starts`."""
    return release_slice_starts(func)
