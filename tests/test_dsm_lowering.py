"""DSM buffers: slices, remote mapa + ld/st.shared::cluster, barriers, and clear errors."""

from __future__ import annotations

import pytest
from conftest import cuda_source
from tvm import s_tir
from tvm.script import tirx as T

from tvm_dsm import ClusterError
from tvm_dsm.rules import SplitKReductionConfig, schedule_split_k_reduction
from tvm_dsm.schedule import bind_cluster
from tvm_dsm.workloads import row_sum


def split_k_source(cluster: int = 4) -> str:
    return cuda_source(schedule_split_k_reduction(row_sum(256, 4096), SplitKReductionConfig(cluster, 16)).mod)


def test_partials_live_in_a_per_cta_slice_read_through_dsm():
    source = split_k_source(4)
    assert "extern __shared__ __align__(64) float B_rf_shared__cluster_slice_ptr[]" in source
    assert "mapa_u32_shared__cluster" in source and "ld_shared__cluster_f32" in source
    # one barrier after the partials are written, one before any CTA exits
    assert source.count("tvm_builtin_cuda_cluster_sync();") == 2


def test_cluster_of_one_needs_no_barrier():
    source = split_k_source(1)
    assert "cluster_sync();" not in source.split("extern \"C\" __global__")[-1]


@T.prim_func(s_tir=True)
def pairwise(A: T.Buffer((64, 2, 128), "float32"), B: T.Buffer((64, 128), "float32")):
    X = T.sblock_alloc_buffer((2, 64, 128), scope="shared::cluster")
    for c, r, t in T.grid(64, 2, 128):
        with T.sblock("X"):
            vc, vr, vt = T.axis.remap("SSS", [c, r, t])
            X[vr, vc, vt] = A[vc, vr, vt]
    for c, r, t in T.grid(64, 2, 64):  # rank r finalizes columns [64 r, 64 r + 64)
        with T.sblock("B"):
            vc, vr, vt = T.axis.remap("SSS", [c, r, t])
            B[vc, vr * 64 + vt] = X[0, vc, vr * 64 + vt] + X[1, vc, vr * 64 + vt]


def schedule_pairwise(cluster: int = 2, producer_rank_tag: str = "clusterCtaIdx.x") -> s_tir.Schedule:
    sch = s_tir.Schedule(pairwise)
    blk = sch.get_sblock("B")
    c, r, t = sch.get_loops(blk)
    cta = sch.fuse(c, r)
    cl, _ = bind_cluster(sch, cta, cluster)
    sch.bind(t, "threadIdx.x")
    x = sch.get_sblock("X")
    sch.compute_at(x, cl, preserve_unit_loops=True)
    _, xr, xt = sch.get_loops(x)[1:]  # (unit loop over c, rank, t)
    sch.bind(xr, producer_rank_tag)
    _, xt = sch.split(xt, [None, 64])
    sch.bind(xt, "threadIdx.x")
    return sch


def test_hand_written_dsm_buffer_lowers(assemble):
    source = cuda_source(schedule_pairwise().mod)
    assert "ld_shared__cluster_f32" in source
    assemble(source, "pairwise")


def test_once_per_cluster_stage_runs_on_rank_0(assemble):
    """X computed at the cluster loop but not over the ranks: s_tir runs it once per cluster."""
    source = cuda_source(schedule_pairwise(cluster=4, producer_rank_tag="threadIdx.y").mod)
    assert "if ((((int)blockIdx.x) % 4) == 0)" in source
    assert "st_shared__cluster_f32" in source  # rank 0 fills rank 1's slice
    # before the first remote store, between the stores and the reads, before exit
    assert source.count("tvm_builtin_cuda_cluster_sync();") == 3
    assemble(source, "root_only")


def test_dsm_leading_axis_larger_than_cluster():
    with pytest.raises(ClusterError, match="extent must be at most 1"):
        cuda_source(schedule_pairwise(cluster=1, producer_rank_tag="threadIdx.y").mod)


@T.prim_func(s_tir=True)
def no_cluster(A: T.Buffer((2, 128), "float32"), B: T.Buffer((128,), "float32")):
    X = T.sblock_alloc_buffer((2, 128), scope="shared::cluster")
    for r, t in T.grid(2, 128):
        with T.sblock("X"):
            vr, vt = T.axis.remap("SS", [r, t])
            X[vr, vt] = A[vr, vt]
    for t in range(128):
        with T.sblock("B"):
            vt = T.axis.remap("S", [t])
            B[vt] = X[0, vt] + X[1, vt]


def test_dsm_buffer_without_cluster_is_rejected():
    sch = s_tir.Schedule(no_cluster)
    (t,) = sch.get_loops(sch.get_sblock("B"))
    bx, tx = sch.split(t, [1, 128])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.compute_at(sch.get_sblock("X"), bx)
    with pytest.raises(ClusterError, match="kernel has no cluster"):
        cuda_source(sch.mod)


@pytest.mark.parametrize("scope", ["shared.cluster", "shared::cta"])
def test_unknown_shared_scope_is_rejected(scope):
    """Stock TVM silently lowers these scopes to a per-thread array."""
    sch = s_tir.Schedule(row_sum(128, 256))
    blk = sch.get_sblock("B")
    i, k = sch.get_loops(blk)
    sch.bind(i, "blockIdx.x")
    sch.cache_read(blk, 0, scope)
    with pytest.raises(ClusterError, match=f"storage scope '{scope}'"):
        cuda_source(sch.mod)


@T.prim_func(s_tir=True)
def accumulate_per_cluster(A: T.Buffer((8, 64), "float32"), B: T.Buffer((8,), "float32"), C: T.Buffer((16,), "float32")):
    for c in T.thread_binding(8, thread="blockIdx.x", annotations={"tvm_dsm.cluster_size": 2}):
        for k in range(64):  # once per cluster in s_tir: a read-modify-write of global B
            with T.sblock("B"):
                vc, vk = T.axis.remap("SR", [c, k])
                with T.init():
                    B[vc] = T.float32(0)
                B[vc] = B[vc] + A[vc, vk]
        for r in T.thread_binding(2, thread="clusterCtaIdx.x"):
            with T.sblock("C"):
                vc, vr = T.axis.remap("SS", [c, r])
                C[vc * 2 + vr] = T.float32(1)


def test_once_per_cluster_global_accumulation_runs_on_rank_0():
    import tvm

    source = cuda_source(tvm.IRModule({"main": accumulate_per_cluster}))
    body = source.split("accumulate_per_cluster_kernel(")[-1]
    guard = body.index("if ((((int)blockIdx.x) % 2) == 0)")
    assert guard < body.index("B_ptr[")  # every B update sits under the rank-0 guard


@T.prim_func(s_tir=True)
def guarded_peer_read(A: T.Buffer((64, 2, 128), "float32"), B: T.Buffer((64, 2, 128), "float32")):
    X = T.sblock_alloc_buffer((2, 64, 128), scope="shared::cluster")
    for c in T.thread_binding(64, thread="blockIdx.x", annotations={"tvm_dsm.cluster_size": 2}):
        for r in T.thread_binding(2, thread="clusterCtaIdx.x"):
            for t in T.thread_binding(128, thread="threadIdx.x"):
                with T.sblock("X"):
                    X[r, c, t] = A[c, r, t]
            for t in T.thread_binding(128, thread="threadIdx.x"):
                with T.sblock("B"):
                    B[c, r, t] = T.if_then_else(t > 0, X[1 - r, c, t], T.float32(0))


def test_guarded_peer_read_is_rejected():
    """Hoisting the remote load out of the guard would read where the program says not to."""
    import tvm

    with pytest.raises(ClusterError, match="guarded by a select/if_then_else"):
        cuda_source(tvm.IRModule({"main": guarded_peer_read}))
