"""A TMA main loop with a producer warp: one extra warp issues every copy, the other warps only
consume, and slots are freed by per-slot "empty" mbarriers instead of a CTA barrier per step.

:mod:`tvm_dsm.transform.tma_pipeline` issues a step's copies from consumer thread 0 between its
MMAs, behind a CTA barrier, so a refill starts only when the slowest warp is done with the slot
and only when thread 0 gets to it. With ``TMA_PRODUCER_KEY`` on the loop, the kernel instead
gets one more warp, and::

    all threads:  mbarriers initialised (full: 1 arrival + the bytes; empty: one arrival per
                  consumer warp of every CTA the slot's tiles come from), then a CTA (or, with
                  multicast, a cluster) barrier
    producer warp, lane 0:
        for j: wait empty[j % S] (j >= S); expect the step's bytes on full[j % S]; issue its copies
    consumer warps (everything else the kernel does, CTA barriers become named barrier 1 over
    the consumer threads):
        for k: wait full[k % S]; the body; lane 0 of each warp arrives on empty[] of the slot
               the body is done with (k, or k - 1 for warpgroup MMAs still in flight)

``multicast = 2`` launches the kernel in clusters of two CTAs whose blockIdx differ in the
lowest bit: a copy whose tile is the same for both (W for two row tiles of one column tile) is
issued half by each CTA's producer and multicast to both, so L2 serves it once. A CTA's slot is
then written by both producers, so each consumer warp frees it in both CTAs (a remote arrive),
and both CTAs wait for each other before they exit (peers still arrive on their barriers).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize
from tvm.script import tirx as T
from tvm.sym import Analyzer

from ..errors import ClusterError
from ..ir import find_all, replace_node, substitute, with_block_body
from .lower_cluster import CLUSTER_LAUNCH_KEY
from .tma_pipeline import _seq, encode_tensor_map

#: Loop annotation (set by the schedule next to ``TMA_STAGES_KEY``): lower the TMA loop with a
#: producer warp; the value is the number of CTAs (1 or 2) a shared tile is multicast to.
TMA_PRODUCER_KEY = "tvm_dsm.tma_producer"
#: Attribute around the consumer warps' code: its CTA barriers become named barrier 1 over this
#: many threads (:func:`ConsumerBarriers`), so the producer warp never has to take part.
CONSUMER_THREADS_KEY = "tvm_dsm.consumer_threads"

_CONSUMER_SYNC = "tvm_dsm_consumer_sync"
_CONSUMER_SYNC_SOURCE = f"""
__forceinline__ __device__ void {_CONSUMER_SYNC}(int threads) {{
  asm volatile("bar.sync 1, %0;" :: "r"(threads) : "memory");
}}
"""
_REMOTE_ARRIVE = "tvm_dsm_remote_arrive"
_REMOTE_ARRIVE_SOURCE = f"""
__forceinline__ __device__ void {_REMOTE_ARRIVE}(unsigned int barrier, unsigned int rank) {{
  asm volatile("{{\\n.reg .b32 remote;\\nmapa.shared::cluster.u32 remote, %0, %1;\\n"
               "mbarrier.arrive.shared::cluster.b64 _, [remote];\\n}}"
               :: "r"(barrier), "r"(rank) : "memory");
}}
"""
_MULTICAST = "tvm_dsm_tma_multicast_2d"
_MULTICAST_SOURCE = f"""
__forceinline__ __device__ void {_MULTICAST}(unsigned int dst, unsigned long long map, int c0, int c1,
                                              unsigned int barrier, unsigned short mask) {{
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
               ".multicast::cluster [%0], [%1, {{%2, %3}}], [%4], %5;"
               :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(barrier), "h"(mask) : "memory");
}}
"""


def _call(name: str, source: str, *args):
    return tirx.Evaluate(T.cuda.func_call(name, *args, source_code=source))


class WarpSpecializedKernel:
    """The rewrite of one kernel around one ``TMA_PRODUCER_KEY`` loop (``lowering`` is its
    :class:`tvm_dsm.transform.tma_pipeline._TmaLoop`)."""

    def __init__(self, kernel: tirx.For, lowering, analyzer: Analyzer):
        self.kernel, self.t = kernel, lowering
        self.multicast = int(lowering.loop.annotations[TMA_PRODUCER_KEY])
        if self.multicast not in (1, 2):
            raise ClusterError(f"producer warp: multicast to {self.multicast} CTAs (1 or 2 supported)")
        chain, node = [], kernel.body
        while isinstance(node, tirx.For) and node.thread_binding is not None:
            chain.append(node)
            node = node.body
        tags = {str(lp.thread_binding.thread_tag): lp for lp in chain}
        ranks = tags.get("clusterCtaIdx.x")
        if ranks is not None and int(ranks.extent) != 1:
            raise ClusterError("producer warp: the kernel already runs in clusters (split-K); "
                               "only single-CTA main loops take one")
        x, y = tags.get("threadIdx.x"), tags.get("threadIdx.y")
        if "threadIdx.z" in tags or x is None:
            raise ClusterError("producer warp: needs threadIdx.x (and at most threadIdx.y)")
        if y is not None and int(x.extent) == 32:
            self.warp_loop, self.warps = y, int(y.extent)
            self.lane, self.warp = x.loop_var, y.loop_var
        elif y is None and int(x.extent) % 32 == 0:
            self.warp_loop, self.warps = x, int(x.extent) // 32
            self.lane, self.warp = tirx.floormod(x.loop_var, 32), tirx.floordiv(x.loop_var, 32)
        else:
            raise ClusterError("producer warp: threads must be whole warps along threadIdx")
        self.chain, self.inner = chain, node
        self.shared = self._shared_copies(analyzer) if self.multicast == 2 else []
        if self.multicast == 2 and not self.shared:
            raise ClusterError("producer warp: no copied tile is the same for CTAs 2i and 2i+1")
        if int(kernel.extent) % self.multicast:
            raise ClusterError(f"producer warp: {kernel.extent} CTAs do not pair into clusters of 2")
        self.empty = tirx.decl_buffer((lowering.stages,), "uint64", "tma_empty", scope="shared.dyn",
                                      data_alignment=8)

    # -- analysis -------------------------------------------------------------------------------
    def _shared_copies(self, analyzer: Analyzer) -> list:
        """Copies whose tile coordinates are equal for CTAs 2i and 2i + 1, with rows to halve."""
        b = self.kernel.loop_var
        even = tirx.floordiv(b, 2) * 2
        shared = []
        for c in self.t.copies:
            pair = [[substitute(o, [(b, even + r)]) for o in c.origin] for r in (0, 1)]
            if all(analyzer.can_prove_equal(p, q) for p, q in zip(*pair)) and c.rows % 16 == 0 and c.rank == 2:
                shared.append(c)
        return shared

    # -- barriers ---------------------------------------------------------------------------------
    def _empty(self, slot):
        return self.t._address(self.empty, slot * 8)

    def _rank(self):
        return tirx.Cast("uint32", tirx.floormod(self.kernel.loop_var, 2))

    # -- the two roles ----------------------------------------------------------------------------
    def _issue(self, step) -> tirx.Stmt:
        """The producer's copies of K step ``step``: own tiles whole, shared tiles half each."""
        t = self.t
        slot = tirx.floormod(step, t.stages)
        stmts = [t._expect(step)]
        for c in t.copies:
            dst = t._aligned(t.slots.get(c.tile)) + tirx.Cast("uint32", slot * c.bytes)
            coords = c.coordinates(t.loop.loop_var, step)
            if c in self.shared:
                half = c.rows // 2
                rank = tirx.floormod(self.kernel.loop_var, 2)
                coords = [coords[0], coords[1] + rank * half]
                stmts.append(_call(_MULTICAST, _MULTICAST_SOURCE,
                                   dst + tirx.Cast("uint32", rank * half * c.cols * c.elem_bytes),
                                   T.address_of(self.half_maps[c.name]), *coords, t._barrier(slot),
                                   tirx.const(3, "uint16")))
            else:
                stmts.append(t._copy(c, step))
        return tirx.SeqStmt(stmts)

    def producer(self) -> tirx.Stmt:
        t, n, s = self.t, int(self.t.loop.extent), self.t.stages
        j = tirx.Var("produce_step", "int32")
        wait = tirx.IfThenElse(j >= s, tirx.Evaluate(T.cuda.mbarrier_wait(
            self._empty(tirx.floormod(j, s)), tirx.floormod(tirx.floordiv(j, s) + 1, 2))), None)
        loop = tirx.For(j, 0, n, tirx.ForKind.SERIAL, tirx.SeqStmt([wait, self._issue(j)]))
        prefetch = [tirx.Evaluate(T.ptx.prefetch.tensormap(T.address_of(m)))
                    for m in [*t.maps, *self.half_maps.values()]]
        return tirx.IfThenElse(tirx.EQ(self.lane, 0), tirx.SeqStmt([*prefetch, loop]), None)

    def _release(self, step) -> tirx.Stmt:
        """Lane 0 of each consumer warp frees ``step``'s slot (in both CTAs when multicast)."""
        slot = tirx.floormod(step, self.t.stages)
        arrive = [tirx.Evaluate(T.ptx.mbarrier.arrive.shared__cta.b64(self._empty(slot)))]
        if self.multicast == 2:
            peer = tirx.bitwise_xor(self._rank(), tirx.const(1, "uint32"))
            arrive.append(_call(_REMOTE_ARRIVE, _REMOTE_ARRIVE_SOURCE, self._empty(slot), peer))
        return tirx.IfThenElse(tirx.EQ(self.lane, 0), _seq(arrive), None)

    def consumer_loop(self) -> tirx.Stmt:
        """The TMA loop as the consumers run it (in place of ``TmaLoop.lower``)."""
        t = self.t
        loop, k = t.loop, t.loop.loop_var
        inner, deferred = t.consumer_body()
        release = (tirx.IfThenElse(k >= 1, self._release(k - 1), None) if deferred else self._release(k))
        body = tirx.SeqStmt([
            tirx.Evaluate(T.cuda.mbarrier_wait(t._barrier(tirx.floormod(k, t.stages)),
                                               tirx.floormod(tirx.floordiv(k, t.stages), 2))),
            SBlockRealize([], True, inner),
            release,
        ])
        new_loop = tirx.For(k, loop.min, loop.extent, loop.kind, body, loop.thread_binding,
                            {key: v for key, v in loop.annotations.items()
                             if key not in (TMA_PRODUCER_KEY, "tvm_dsm.tma_stages")})
        after = [tirx.Evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))] if deferred else []
        wrapper = SBlock([], t.block.reads, t.block.writes, "tma_consumer", tirx.SeqStmt([new_loop, *after]))
        return SBlockRealize([], True, wrapper)

    # -- the kernel -------------------------------------------------------------------------------
    def _guarded(self, stmt) -> tirx.Stmt:
        """``stmt`` run by the consumer warps only. The condition is thread invariant to
        ThreadSync, which then places CTA barriers inside (it refuses to under a condition on
        thread indices); :func:`ConsumerBarriers` narrows them to the consumer threads."""
        marked = tirx.AttrStmt(tvm.ir.StringImm("consumers"), CONSUMER_THREADS_KEY, 32 * self.warps, stmt)
        return tirx.IfThenElse(T.tvm_thread_invariant(self.warp < self.warps), marked, None)

    def _around(self, node, target, replacement):
        """``node`` with ``target`` replaced and every statement beside the path to it guarded:
        the producer warp walks the same blocks (their allocations stay where they were, so
        the shared-memory merge still overlays the slots with what follows the loop) but runs
        only its branch of the loop."""
        if node.same_as(target):
            return replacement
        if isinstance(node, SBlockRealize):
            block = node.block
            return SBlockRealize(node.iter_values, node.predicate,
                                 with_block_body(block, self._around(block.body, target, replacement)))
        if isinstance(node, tirx.SeqStmt):
            return tirx.SeqStmt([self._around(item, target, replacement) if _holds(item, target)
                                 else self._guarded(item) for item in node.seq])
        if isinstance(node, tirx.For) and node.thread_binding is None:
            return tirx.For(node.loop_var, node.min, node.extent, node.kind,
                            self._around(node.body, target, replacement), None, node.annotations)
        raise ClusterError(f"producer warp: cannot route the producer warp through a {type(node).__name__}")

    def _loop(self) -> tirx.Stmt:
        """The TMA loop's replacement, run by every warp: barriers set up, then each role's loop."""
        t = self.t
        s = tirx.Var("tma_stage", "int32")
        leader = tirx.And(tirx.EQ(self.warp, self.warps), tirx.EQ(self.lane, 0))
        sync = (tirx.Evaluate(T.cuda.cluster_sync()) if self.multicast == 2
                else tirx.Evaluate(T.tvm_storage_sync("shared")))
        consumers = tirx.SeqStmt([
            self.consumer_loop(),
            tirx.Evaluate(T.tvm_storage_sync("shared")),  # every consumer is done with the slots
        ])
        # Invalidated before the merge reuses their bytes: by then the producer has passed its
        # last wait (the consumers waited for every step it issued) and, with multicast, the
        # cluster barrier has seen the peer's last arrival.
        inval = tirx.IfThenElse(tirx.And(tirx.EQ(self.warp, 0), tirx.EQ(self.lane, 0)), tirx.For(
            s, 0, t.stages, tirx.ForKind.SERIAL, tirx.SeqStmt([
                tirx.Evaluate(T.ptx.mbarrier.inval.shared__cta.b64(t._barrier(s))),
                tirx.Evaluate(T.ptx.mbarrier.inval.shared__cta.b64(self._empty(s))),
            ])), None)
        stmts = [
            tirx.IfThenElse(leader, tirx.SeqStmt([
                tirx.For(s, 0, t.stages, tirx.ForKind.SERIAL, tirx.SeqStmt([
                    tirx.Evaluate(T.ptx.mbarrier.init.shared__cta.b64(t._barrier(s), 1)),
                    tirx.Evaluate(T.ptx.mbarrier.init.shared__cta.b64(self._empty(s), self.warps * self.multicast)),
                ])),
                tirx.Evaluate(T.ptx.fence.mbarrier_init.release.cluster()),
            ]), None),
            sync,
            tirx.IfThenElse(T.tvm_thread_invariant(self.warp < self.warps),
                            tirx.AttrStmt(tvm.ir.StringImm("consumers"), CONSUMER_THREADS_KEY,
                                          32 * self.warps, consumers),
                            self.producer()),
        ]
        if self.multicast == 2:  # the peer's last arrivals on this CTA's barriers, before reuse
            stmts.append(sync)
        stmts.append(inval)
        block = SBlock([], t.block.reads, t.block.writes, "warp_specialized", tirx.SeqStmt(stmts),
                       alloc_buffers=[*t.slots.values(), t.barriers, self.empty])
        return SBlockRealize([], True, block)

    def lower(self, body):
        """``body`` (the function body holding the kernel) with the kernel rewritten."""
        self.half_maps = {c.name: tirx.Var(f"{c.source.name}_half_tensormap", T.handle("tensormap").ty)
                          for c in self.shared}
        new = self._around(self.inner, self.t.loop, self._loop())
        if self.multicast == 2:
            new = tirx.AttrStmt(tvm.ir.StringImm("cluster"), CLUSTER_LAUNCH_KEY, 2, new)
        for lp in reversed(self.chain):  # the thread loops again, one more warp on the warp loop
            extent = lp.extent
            if lp.same_as(self.warp_loop):
                extent = extent + (1 if self.warp.same_as(lp.loop_var) else 32)
            new = tirx.For(lp.loop_var, lp.min, extent, lp.kind, new, lp.thread_binding, lp.annotations)
        kernel = tirx.For(self.kernel.loop_var, self.kernel.min, self.kernel.extent, self.kernel.kind, new,
                          self.kernel.thread_binding, self.kernel.annotations)
        return replace_node(body, self.kernel, kernel)

    def host(self) -> list:
        stmts = []
        for c in self.shared:
            m = self.half_maps[c.name]
            stmts.append(tirx.Bind(m, T.tvm_stack_alloca("tensormap", 1)))
            stmts.append(encode_tensor_map(m, c.source, c.rows // 2, c.cols, c.row_axis))
        return stmts


def _holds(stmt, target) -> bool:
    return bool(find_all(stmt, tirx.For, lambda lp: lp.same_as(target)))


def _is_cta_sync(node) -> bool:
    return (isinstance(node, tirx.Evaluate) and isinstance(node.value, tvm.ir.Call)
            and node.value.op.name == "tirx.tvm_storage_sync" and node.value.args[0].value == "shared")


@tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.ConsumerBarriers")
def ConsumerBarriers(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
    """The CTA barriers ThreadSync placed in consumer code (``CONSUMER_THREADS_KEY``) as named
    barrier 1 over the consumer threads; runs after ThreadSync."""

    def on_attr(attr):
        if attr.attr_key != CONSUMER_THREADS_KEY:
            return attr
        sync = _call(_CONSUMER_SYNC, _CONSUMER_SYNC_SOURCE, attr.value)
        return tvm_ffi.structural_map(attr.body, [(tirx.Evaluate, lambda e: sync if _is_cta_sync(e) else e)])

    return func.with_body(tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, on_attr)], order="pre"))
