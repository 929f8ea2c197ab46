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
  have finished reading before anyone overwrites or exits).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import Range
from tvm.script import tirx as T
from tvm.sym import Analyzer

from ..errors import ClusterError
from ..schedule.cluster import RANK_TAG
from ..schedule.dsm import DSM_SCOPE

#: Attribute left around a cluster kernel's body; tvm_dsm.transform.cluster_launch turns it into
#: the ``clusterCtaIdx.x`` launch dimension after LowerThreadAllreduce.
CLUSTER_LAUNCH_KEY = "tvm_dsm.cluster_launch"

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


def _find_all(root, node_type, pred=lambda _n: True) -> list:
    found = []
    tvm_ffi.structural_walk(root, [(node_type, lambda n: found.append(n) if pred(n) else None)])
    return found


def _substitute(stmt, mapping: list[tuple[tirx.Var, tvm.ir.PrimExpr]]):
    def remap(var):
        for old, new in mapping:
            if var.same_as(old):
                return new
        return var

    return tvm_ffi.structural_map(stmt, [(tirx.Var, remap)])


def _cluster_barrier() -> tirx.Evaluate:
    return tirx.Evaluate(T.cuda.cluster_sync())


def _is_remote_call(call) -> bool:
    return (
        call.op.name in ("tirx.ptx.ld", "tirx.ptx.st")
        and any(isinstance(a, tvm.ir.StringImm) and a.value == DSM_SCOPE for a in call.args)
    )


class _DSMBuffer:
    """One DSM buffer of a kernel: the per-CTA slice and how to reach a peer's copy of it."""

    def __init__(self, buffer: tirx.Var, cluster_size: int):
        shape = list(buffer.ty.shape)
        if not shape or not isinstance(shape[0], tirx.IntImm) or int(shape[0]) != cluster_size:
            raise ClusterError(
                f"DSM buffer {buffer.name} has shape {shape}: its leading axis indexes the owning "
                f"CTA and must have extent {cluster_size} (the cluster size)"
            )
        self.dtype = str(buffer.ty.dtype)
        if self.dtype not in _PTX_TYPES:
            raise ClusterError(f"DSM buffer {buffer.name}: dtype {self.dtype} is not supported")
        self.buffer = buffer
        self.slice = tirx.decl_buffer(shape[1:], self.dtype, f"{buffer.name}_slice", scope="shared")
        self.strides = []
        stride = 1
        for extent in reversed(shape[1:]):
            self.strides.insert(0, stride)
            stride = stride * extent

    def _peer_address(self, indices, rank, peer: tirx.Var) -> tirx.Evaluate:
        offset = sum((i * s for i, s in zip(indices, self.strides)), tirx.const(0, "int32"))
        local = T.cuda.cvta_generic_to_shared(self.slice.access_ptr("rw", offset=offset))
        return tirx.Evaluate(
            T.ptx.mapa.shared__cluster.u32(peer[0], local, tirx.Cast("uint32", rank))
        )

    def _ptx(self, op):
        return getattr(getattr(op, "shared__cluster"), _PTX_TYPES[self.dtype])

    def remote_load(self, indices, rank) -> tuple[list, tvm.ir.PrimExpr]:
        """Statements that load peer ``rank``'s element into a register, and that register."""
        peer = tirx.decl_buffer((1,), "uint32", "dsm_peer_addr", scope="local")
        raw = "uint16" if self.dtype in _BITS16 else self.dtype
        value = tirx.decl_buffer((1,), raw, "dsm_value", scope="local")
        stmts = [
            tirx.AllocBuffer(peer),
            tirx.AllocBuffer(value),
            self._peer_address(indices, rank, peer),
            tirx.Evaluate(self._ptx(T.ptx.ld)(value[0], peer[0])),
        ]
        loaded = value[0]
        if raw != self.dtype:
            loaded = tirx.call_intrin(self.dtype, "tirx.reinterpret", loaded)
        return stmts, loaded

    def remote_store(self, indices, rank, value) -> list:
        """Statements that store ``value`` into peer ``rank``'s element."""
        peer = tirx.decl_buffer((1,), "uint32", "dsm_peer_addr", scope="local")
        if self.dtype in _BITS16:
            value = tirx.call_intrin("uint16", "tirx.reinterpret", value)
        return [
            tirx.AllocBuffer(peer),
            self._peer_address(indices, rank, peer),
            tirx.Evaluate(self._ptx(T.ptx.st)(peer[0], value)),
        ]


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

    def _dsm_of(self, buffer) -> _DSMBuffer | None:
        return next((d for d in self.dsm if d.buffer.same_as(buffer)), None)

    def _is_local(self, rank) -> bool:
        return self.analyzer.can_prove_equal(rank, self.rank)

    def lower(self) -> tirx.AttrStmt:
        body = tvm_ffi.structural_map(
            self.kernel.body,
            [(tirx.AttrStmt, lambda a: a.body if _is_thread_extent(a, RANK_TAG) else a)],
        )
        mapping = [(self.block_var, tirx.floordiv(self.block_var, self.size))]
        mapping += [(v, self.rank) for v in self.rank_vars]
        body = _substitute(body, mapping)
        self.dsm = [
            _DSMBuffer(a.buffer, self.size)
            for a in _find_all(
                body, tirx.AllocBuffer, lambda a: str(a.buffer.ty.storage_scope) == DSM_SCOPE
            )
        ]
        if self.dsm:
            body = self._rewrite_accesses(body)
            body = self._place_barriers(body)
        grid = self.kernel.value * self.size
        node = tirx.IterVar(Range(0, grid), self.block_var, tirx.IterVar.ThreadIndex, "blockIdx.x")
        launch = tirx.AttrStmt(tvm.ir.StringImm("cluster"), CLUSTER_LAUNCH_KEY, self.size, body)
        return tirx.AttrStmt(node, "thread_extent", grid, launch)

    # -- accesses -------------------------------------------------------------------------------
    def _rewrite_accesses(self, body):
        errors: list[str] = []

        def on_alloc(alloc):
            dsm = self._dsm_of(alloc.buffer)
            return alloc if dsm is None else tirx.AllocBuffer(dsm.slice)

        def on_store(store):
            pre: list = []

            def on_load(load):
                dsm = self._dsm_of(load.source)
                if dsm is None:
                    return load
                rank, *indices = load.indices
                if self._is_local(rank):
                    return tirx.BufferLoad(dsm.slice, indices)
                stmts, value = dsm.remote_load(indices, rank)
                pre.extend(stmts)
                return value

            self._reject_guarded_remote_loads(store.value, errors)
            value = tvm_ffi.structural_map(store.value, [(tvm.ir.TensorLoad, on_load)])
            dsm = self._dsm_of(store.buffer)
            if dsm is None:
                stmts = [tirx.BufferStore(store.buffer, value, store.indices)]
            else:
                rank, *indices = store.indices
                if self._is_local(rank):
                    stmts = [tirx.BufferStore(dsm.slice, value, indices)]
                else:
                    stmts = dsm.remote_store(indices, rank, value)
            return stmts[0] if not pre and len(stmts) == 1 else tirx.SeqStmt(pre + stmts)

        body = tvm_ffi.structural_map(
            body, [(tirx.AllocBuffer, on_alloc), (tirx.BufferStore, on_store)], order="pre"
        )
        leftover = _find_all(body, tvm.ir.TensorLoad, lambda ld: self._dsm_of(ld.source))
        if leftover:
            errors.append(
                f"DSM buffer {leftover[0].source.name} is read outside a store's value (e.g. in a "
                "condition or loop bound); tvm-dsm lowers DSM reads only there"
            )
        if errors:
            raise ClusterError(errors[0])
        return body

    def _reject_guarded_remote_loads(self, value, errors: list[str]) -> None:
        """A hoisted remote load would run even where a select/if_then_else guards it off."""

        def guarded(node):
            loads = _find_all(node, tvm.ir.TensorLoad, lambda ld: self._dsm_of(ld.source))
            if any(not self._is_local(ld.indices[0]) for ld in loads):
                errors.append(
                    f"a read of a peer's slice of DSM buffer {loads[0].source.name} is guarded by "
                    "a select/if_then_else; tvm-dsm does not lower conditional remote reads"
                )

        tvm_ffi.structural_walk(value, [(tirx.Select, guarded)])
        for call in _find_all(value, tvm.ir.Call, lambda c: c.op.name == "tirx.if_then_else"):
            guarded(call)

    # -- barriers -------------------------------------------------------------------------------
    def _touches(self, stmt) -> dict[str, bool]:
        slices = [d.slice for d in self.dsm]
        remote = _find_all(stmt, tvm.ir.Call, _is_remote_call)
        return {
            "remote_load": any(c.op.name == "tirx.ptx.ld" for c in remote),
            "remote_store": any(c.op.name == "tirx.ptx.st" for c in remote),
            "local_load": bool(
                _find_all(stmt, tvm.ir.TensorLoad, lambda ld: any(ld.source.same_as(s) for s in slices))
            ),
            "local_store": bool(
                _find_all(stmt, tirx.BufferStore, lambda st: any(st.buffer.same_as(s) for s in slices))
            ),
        }

    def _place_barriers(self, stmt):
        """Fence each stage that touches a peer's slice; stages are the children of the sequences
        reached through attributes only, so every thread of the CTA executes the barriers."""
        if isinstance(stmt, tirx.AttrStmt):
            return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, self._place_barriers(stmt.body))
        stages = list(stmt.seq) if isinstance(stmt, tirx.SeqStmt) else [stmt]
        out: list = []
        for stage in stages:
            t = self._touches(stage)
            remote = t["remote_load"] or t["remote_store"]
            mixed = (t["remote_load"] and (t["local_store"] or t["remote_store"])) or (
                t["remote_store"] and (t["local_load"] or t["local_store"])
            )
            if mixed and isinstance(stage, (tirx.AttrStmt, tirx.SeqStmt)):
                stage, remote = self._place_barriers(stage), False
            elif mixed:
                raise ClusterError(
                    "one stage both writes a DSM buffer and accesses a peer's slice (e.g. a loop "
                    "over rounds); it needs barriers inside the loop, which tvm-dsm's DSM buffers "
                    "do not place: split the stage or use a collective primitive"
                )
            if remote and not (out and _is_barrier(out[-1])):
                out.append(_cluster_barrier())
            out.append(stage)
            if remote:
                out.append(_cluster_barrier())
        return out[0] if len(out) == 1 else tirx.SeqStmt(out)


def _is_barrier(stmt) -> bool:
    return (
        isinstance(stmt, tirx.Evaluate)
        and isinstance(stmt.value, tvm.ir.Call)
        and stmt.value.op.name == "tirx.cuda.cluster_sync"
    )


def lower_cluster_function(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """Apply the lowering described in the module docstring to every cluster kernel of ``func``."""

    lowered = []  # lowered outside the map callback: exceptions do not cross the FFI boundary
    for kernel in _find_all(func.body, tirx.AttrStmt, lambda a: _is_thread_extent(a, "blockIdx.x")):
        ranks = _find_all(kernel.body, tirx.AttrStmt, lambda a: _is_thread_extent(a, RANK_TAG))
        if ranks:
            lowered.append((kernel, _KernelLowering(kernel, ranks).lower()))

    def on_attr(attr):
        return next((new for old, new in lowered if old.same_as(attr)), attr)

    body = tvm_ffi.structural_map(func.body, [(tirx.AttrStmt, on_attr)], order="pre")
    stray = _find_all(
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
