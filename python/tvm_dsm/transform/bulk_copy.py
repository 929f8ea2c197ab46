"""Lower DSM copies marked by ``tvm_dsm.schedule.collectives.bulk_copy`` to bulk (TMA) pushes.

The schedule states a copy in pull form: the CTA of rank r fills its slice of ``Y`` from a peer's
slice of ``X`` (``Y[r, d(i)] = X[q(r, i), s(r, i)]``). The copy engine only pushes between CTAs
(``cp.async.bulk.shared::cluster.shared::cta``), so the lowering inverts the pull:

* the copy loop is cut into C chunks of L elements contiguous in both slices;
* for every (receiver rr, chunk c) pair with q(rr, c) != rr, the CTA of rank q(rr, c) sends the
  chunk from its slice of X into rr's slice of Y, completing on rr's mbarrier
  (``mbarrier::complete_tx::bytes``); the pairs are spread over the sender's threads;
* a chunk a CTA holds itself (q(r, c) == r) is copied by its threads, 16 bytes at a time by
  ``ld/st.shared::cluster`` on its own addresses: a bulk copy through the cluster window onto
  the issuing CTA is correct on the hardware, but compute-sanitizer's memcheck reports it as an
  invalid remote write (``bench/sanitizer/bulk_self_copy.cu``), which would hide real errors;
* every CTA initialises its mbarrier at kernel start (``mbarrier.init``,
  ``fence.mbarrier_init.release.cluster``) and announces the bytes its peers will push
  (``mbarrier.arrive.expect_tx``); its threads wait on that mbarrier only (a thread may not wait on
  a peer's), then on a CTA barrier for the chunks copied locally;
* before the copy, ``fence.proxy.async`` makes the sender's ordinary stores visible to the copy
  engine and a cluster barrier orders them, the peers' mbarrier initialisation and the peers'
  earlier use of Y (placed by tvm_dsm.transform.lower_cluster, which also keeps every CTA alive
  until its peers have received).

Each marked copy owns one mbarrier used for one phase, so it may not sit inside a loop.
"""

from __future__ import annotations

from typing import Any, Protocol

import tvm
from tvm import tirx
from tvm.sym import Analyzer
from tvm.ir import Range
from tvm.script import tirx as T

from ..errors import ClusterError
from ..ir import substitute
from ..annotations import BULK_DST, BULK_SRC


class ClusterKernel(Protocol):
    """What a bulk copy needs of the cluster kernel it lowers in (the kernel lowering of
    :mod:`tvm_dsm.transform.kernel_lowering` passes itself in)."""

    analyzer: Analyzer
    block_var: tirx.Var
    rank: tirx.PrimExpr
    size: int
    thread_attrs: list

    def dsm_of(self, buffer: tirx.Buffer) -> Any:
        """The DSM slice layout of ``buffer`` (``offset(indices)``, ``dtype``), None if not in DSM."""

    def is_local(self, rank: tirx.PrimExpr) -> bool:
        """Whether ``rank`` is provably this CTA's own."""

    def contiguous_run(self, indices: list, var: tirx.Var, lanes: int) -> list | None:
        """The run's first indices as functions of ``var`` where ``lanes`` consecutive lanes
        address consecutive elements, else None."""


_ALIGN = 16  # cp.async.bulk moves multiples of 16 bytes between 16-byte aligned addresses


def _thread_extent(kernel: ClusterKernel) -> int:
    extents = {int(a.value) for a in kernel.thread_attrs if str(a.node.thread_tag) == "threadIdx.x"}
    return max(extents, default=1)


def _on_threads(kernel: ClusterKernel, make_body) -> tirx.AttrStmt:
    """``make_body(tx, extent)`` under a fresh ``threadIdx.x`` binding of the kernel's extent."""
    extent = _thread_extent(kernel)
    tx = tirx.Var("tx", "int32")
    node = tirx.IterVar(Range(0, extent), tx, tirx.IterVar.ThreadIndex, "threadIdx.x")
    return tirx.AttrStmt(node, "thread_extent", extent, make_body(tx, extent))


class BulkCopy:
    """One marked copy loop of a cluster kernel, lowered to mbarrier-completed bulk pushes."""

    def __init__(self, kernel: ClusterKernel, loop: tirx.For):
        self.kernel = kernel
        store = loop.body
        load = store.value if isinstance(store, tirx.BufferStore) else None
        dst = kernel.dsm_of(store.buffer) if load is not None else None
        src = kernel.dsm_of(load.source) if isinstance(load, tvm.ir.TensorLoad) else None
        if dst is None or src is None or src.dtype != dst.dtype:
            raise ClusterError(
                "bulk_copy: the block must copy one DSM buffer into another of the same dtype "
                "(Y[r, ...] = X[q, ...]); casts or arithmetic need the register path"
            )
        if not kernel.is_local(store.indices[0]):
            raise ClusterError(
                f"bulk_copy: each CTA must fill its own slice of {store.buffer.name} (pull form)"
            )
        self.dst, self.src = dst, src
        self.elem_bytes = tvm.DataType(dst.dtype).bits // 8
        self.chunk, self.chunks, self.chunk_var, starts = self._chunks(loop, list(store.indices), list(load.indices))
        nbytes = self.chunk * self.elem_bytes
        if nbytes % _ALIGN:
            raise ClusterError(
                f"bulk_copy: {store.buffer.name} <- {load.source.name} moves contiguous runs of "
                f"{nbytes} B, not a multiple of {_ALIGN} B as cp.async.bulk requires; use the "
                "register path (all_gather/broadcast without bulk=True)"
            )
        (_, *dst_idx), (src_rank, *src_idx) = starts
        self.dst_offset = dst.offset(dst_idx) * self.elem_bytes
        self.src_offset = src.offset(src_idx) * self.elem_bytes
        self.src_rank = src_rank
        for name, offset in (("destination", self.dst_offset), ("source", self.src_offset)):
            if not kernel.analyzer.can_prove_equal(tirx.floormod(offset, _ALIGN), 0):
                raise ClusterError(
                    f"bulk_copy: a chunk's {name} offset is not provably a multiple of {_ALIGN} B"
                )
        self.barrier = tirx.decl_buffer((1,), "uint64", "bulk_mbarrier", scope="shared")

    def _held_locally(self, chunk) -> tirx.PrimExpr:
        """Whether this CTA's chunk ``chunk`` of Y comes from its own slice of X."""
        return tirx.EQ(substitute(self.src_rank, [(self.chunk_var, chunk)]), self.kernel.rank)

    def bytes_pushed_here(self) -> tirx.PrimExpr:
        """The bytes this CTA's peers push into its slice of Y (it copies its own chunks).

        Counted per rank at compile time where the chunks' sources are constants (every
        collective's are), so the mbarrier is armed with a constant or a few rank tests."""
        kernel, chunk_bytes = self.kernel, self.chunk * self.elem_bytes
        base = tirx.floordiv(kernel.block_var, kernel.size) * kernel.size
        own = []
        for rank in range(kernel.size):
            held = [kernel.analyzer.simplify(substitute(self._held_locally(c), [(kernel.block_var, base + rank)]))
                    for c in range(self.chunks)]
            if not all(isinstance(h, tirx.IntImm) for h in held):
                local = sum((tirx.Select(self._held_locally(c), 1, 0) for c in range(self.chunks)),
                            tirx.const(0, "int32"))
                return kernel.analyzer.simplify((self.chunks - local) * chunk_bytes)
            own.append(sum(int(h) for h in held))
        usual = max(set(own), key=own.count)
        pushed = tirx.const((self.chunks - usual) * chunk_bytes, "int32")
        for rank, count in enumerate(own):
            if count != usual:
                pushed = pushed - tirx.Select(tirx.EQ(kernel.rank, rank), (count - usual) * chunk_bytes, 0)
        return pushed

    def _chunks(self, loop: tirx.For, dst_indices: list, src_indices: list):
        """(L, C, chunk variable, lane-0 indices of both accesses as functions of it) for the
        longest run length L dividing the loop that is contiguous in both slices."""
        extent = int(loop.extent)
        analyzer = self.kernel.analyzer
        for length in sorted((d for d in range(1, extent + 1) if extent % d == 0), reverse=True):
            chunk, lane = tirx.Var("bulk_chunk", "int32"), tirx.Var("bulk_lane", "int32")
            analyzer.bind(chunk, Range(0, extent // length))
            analyzer.bind(lane, Range(0, length))
            split = [(loop.loop_var, chunk * length + lane)]
            starts = [
                self.kernel.contiguous_run([substitute(i, split) for i in indices], lane, length)
                for indices in (dst_indices, src_indices)
            ]
            if all(s is not None for s in starts):
                return length, extent // length, chunk, starts
        raise ClusterError("bulk_copy: the copy has no contiguous run")  # length 1 always is

    # -- statements ---------------------------------------------------------------------------
    def init(self) -> list:
        """Kernel-start statements: allocate, initialise and arm this copy's mbarrier."""

        def body(tx, _extent):
            addr = tirx.decl_buffer((1,), "uint32", "bulk_mbarrier_addr", scope="local")
            arm = tirx.SeqStmt([
                tirx.Evaluate(T.ptx.mbarrier.init.shared__cta.b64(addr[0], 1)),
                tirx.Evaluate(T.ptx.fence.mbarrier_init.release.cluster()),
                tirx.Evaluate(T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(
                    addr[0], tirx.Cast("uint32", self.bytes_pushed_here()))),
            ])
            return tirx.SeqStmt([
                tirx.AllocBuffer(addr),
                tirx.BufferStore(addr, T.cuda.cvta_generic_to_shared(self.barrier.access_ptr("rw")), [0]),
                tirx.IfThenElse(tirx.EQ(tx, 0), arm, None),
            ])

        return [tirx.AllocBuffer(self.barrier), _on_threads(self.kernel, body)]

    def _copy_own_chunks(self, tx, extent: int, src_base, dst_base) -> list:
        """The chunks this CTA holds itself, copied by its threads 16 bytes at a time.

        The copy goes through PTX ``ld/st.shared::cluster`` on the CTA's own addresses, which
        TVM's ThreadSync does not analyse: it would otherwise see every dynamic shared buffer as
        one and ask for a barrier inside the copy loop's rank test. The explicit CTA barriers
        around the copy order it."""
        words = tirx.decl_buffer((4,), "uint32", "own_words", scope="local")
        chunk, step = tirx.Var("own_chunk", "int32"), tirx.Var("own_step", "int32")
        vectors = self.chunk * self.elem_bytes // _ALIGN
        vector = step * extent + tx
        at = [(self.chunk_var, chunk)]

        def address(base, offset):
            return base + tirx.Cast("uint32", substitute(offset, at) + vector * _ALIGN)

        move = tirx.SeqStmt([
            tirx.Evaluate(T.ptx.ld.shared__cluster.v4.b32(
                *(words[w] for w in range(4)), address(src_base, self.src_offset))),
            tirx.Evaluate(T.ptx.st.shared__cluster.v4.b32(
                address(dst_base, self.dst_offset), *(words[w] for w in range(4)))),
        ])
        if vectors % extent:
            move = tirx.IfThenElse(vector < vectors, move, None)
        copy = tirx.For(step, 0, -(-vectors // extent), tirx.ForKind.SERIAL, move)
        return [tirx.AllocBuffer(words),
                tirx.For(chunk, 0, self.chunks, tirx.ForKind.SERIAL,
                         tirx.IfThenElse(self._held_locally(chunk), copy, None))]

    def stage(self) -> tirx.Stmt:
        """The copy: every thread issues its share of the (receiver, chunk) pushes this CTA
        sends to its peers and copies its share of the chunks it holds itself, then waits until
        the peers' pushes have arrived and its threads' copies are done."""
        kernel, size = self.kernel, self.kernel.size
        receiver = tirx.Var("bulk_receiver", "int32")
        cluster_base = tirx.floordiv(kernel.block_var, size) * size

        def as_receiver(expr):
            """``expr`` (of this CTA's rank and chunk c) evaluated for receiver rank ``receiver``."""
            return kernel.analyzer.simplify(
                substitute(expr, [(kernel.block_var, cluster_base + receiver)])
            )

        def body(tx, extent):
            addr = tirx.decl_buffer((5,), "uint32", "bulk_addr", scope="local")
            src_base, dst_base, bar, remote_dst, remote_bar = (addr[k] for k in range(5))
            pairs = size * self.chunks
            rounds = -(-pairs // extent)
            step = tirx.Var("bulk_round", "int32")
            pair = step * extent + tx
            chunk = tirx.floormod(pair, self.chunks)
            to_chunk = [(self.chunk_var, chunk), (receiver, tirx.floordiv(pair, self.chunks))]

            def at(expr):
                return substitute(as_receiver(expr), to_chunk)

            push = tirx.SeqStmt([
                tirx.Evaluate(T.ptx.mapa.shared__cluster.u32(
                    remote_dst, dst_base + tirx.Cast("uint32", at(self.dst_offset)),
                    tirx.Cast("uint32", tirx.floordiv(pair, self.chunks)))),
                tirx.Evaluate(T.ptx.mapa.shared__cluster.u32(
                    remote_bar, bar, tirx.Cast("uint32", tirx.floordiv(pair, self.chunks)))),
                tirx.Evaluate(
                    T.ptx.cp.async_.bulk.shared__cluster.shared__cta.mbarrier__complete_tx__bytes(
                        remote_dst, src_base + tirx.Cast("uint32", at(self.src_offset)),
                        tirx.const(self.chunk * self.elem_bytes, "uint32"), remote_bar,
                    )
                ),
            ])
            to_peer = tirx.NE(tirx.floordiv(pair, self.chunks), kernel.rank)
            mine = tirx.And(tirx.EQ(at(self.src_rank), kernel.rank), to_peer)
            if pairs % extent:
                mine = tirx.And(pair < pairs, mine)
            issue = tirx.For(step, 0, rounds, tirx.ForKind.SERIAL, tirx.IfThenElse(mine, push, None))
            ptr = T.cuda.cvta_generic_to_shared
            return tirx.SeqStmt([
                tirx.AllocBuffer(addr),
                tirx.BufferStore(addr, ptr(self.src.slice.access_ptr("r")), [0]),
                tirx.BufferStore(addr, ptr(self.dst.slice.access_ptr("w")), [1]),
                tirx.BufferStore(addr, ptr(self.barrier.access_ptr("rw")), [2]),
                issue,
                # TVM's ThreadSync sees neither the cluster barrier before this stage nor the
                # copy's PTX: these order the copy after the threads' writes of X and before
                # their reads of Y.
                _sync_threads(),
                *self._copy_own_chunks(tx, extent, src_base, dst_base),
                tirx.Evaluate(T.cuda.mbarrier_wait(bar, 0)),
                _sync_threads(),
            ])

        kernel.analyzer.bind(receiver, Range(0, size))
        stage = _on_threads(kernel, body)
        stage = tirx.AttrStmt(self.src.slice, BULK_SRC, 0, stage)
        return tirx.AttrStmt(self.dst.slice, BULK_DST, 0, stage)


def _sync_threads() -> tirx.Evaluate:
    return tirx.Evaluate(T.tvm_storage_sync("shared"))


def fence_proxy_async() -> tirx.Evaluate:
    """Make this thread's ordinary shared-memory stores visible to the bulk-copy engine."""
    return tirx.Evaluate(T.ptx.fence.proxy.async_.shared__cta())
