"""DSM collectives: every primitive lowers to vector ld.shared::cluster (or, with bulk=True, to
mbarrier-completed cp.async.bulk pushes) and assembles; misuse is named."""

from __future__ import annotations

import re

import pytest
from conftest import cuda_source
import tvm
from tvm import s_tir

from tvm_dsm import ClusterError
from tvm_dsm.rules.collective_kernel import BULK_KINDS, schedule_collective_kernel
from tvm_dsm.schedule import bind_cluster, collectives, place_in_dsm
from tvm_dsm.workloads.collectives import KINDS, collective

EXCHANGES = [k for k in KINDS if k not in ("copy", "gated")]


@pytest.mark.parametrize("kind", EXCHANGES)
@pytest.mark.parametrize(("dtype", "vector"), [("float32", "v4_f32"), ("float16", "_b32")])
@pytest.mark.parametrize("cluster", [2, 16])
def test_collective_assembles_with_vector_dsm_loads(kind, dtype, vector, cluster, assemble):
    sch = schedule_collective_kernel(collective(kind, 4, cluster, 16384, dtype), kind, cluster)
    source = cuda_source(sch.mod)
    assert "ld_vec_shared__cluster_v" in source and vector in source
    assert "tvm_builtin_ptx_ld_shared__cluster" not in source  # no scalar fallback
    if cluster == 16:  # the same instructions at any cluster size: assembled once
        assemble(source, f"{kind}_{dtype}_{cluster}")


def test_all_exchange_starts_each_cta_at_its_own_rank():
    """The unrolled peer walk of CTA r visits r, r+1, r+2, r+3 (mod 4): no peer is hot."""
    source = cuda_source(schedule_collective_kernel(collective("all_exchange", 4, 4, 4096), "all_exchange", 4).mod)
    assert "((uint)(((int)blockIdx.x) & 3))" in source
    for step in (1, 2, 3):
        assert f"((uint)(((((int)blockIdx.x) & 3) + {step}) & 3))" in source


def test_broadcast_root_serves_one_tile():
    """Scatter (each rank pulls 1/S of the root's tile) then all-gather: three barriers."""
    source = cuda_source(schedule_collective_kernel(collective("broadcast", 4, 8, 8192), "broadcast", 8).mod)
    assert source.count("tvm_builtin_cuda_cluster_sync();") == 3
    assert "if ((((int)blockIdx.x) % 8) == 0)" in source  # only the root loads the tile


def _unscheduled(kind: str, cluster: int, n: int, place: bool = True):
    sch = s_tir.Schedule(collective(kind, 4, cluster, n))
    out = sch.get_sblock("O")
    ct, r, _ = sch.get_loops(out)
    cl, _ = bind_cluster(sch, sch.fuse(ct, r), cluster)
    for name in ("Y", "X"):
        sch.compute_at(sch.get_sblock(name), cl, preserve_unit_loops=True)
    if place:
        place_in_dsm(sch, sch.get_sblock("X"), 0)
    return sch, sch.get_sblock("Y")


def test_inter_cluster_reduce_is_a_deterministic_second_kernel(assemble):
    from tvm_dsm.rules.collective_kernel import schedule_split_sum
    from tvm_dsm.workloads.collectives import split_sum

    source = cuda_source(schedule_split_sum(split_sum(4, 8, 4, 8192), 4).mod)
    assert "main_kernel_1(" in source and "main_kernel_2(" not in source  # two kernels
    second = source.split("main_kernel_1(")[-1]
    assert "for (int k = 0; k < 8; ++k)" in second and "atomic" not in second  # clusters in order
    assemble(source, "split_sum")


def test_inter_cluster_reduce_needs_global_partials():
    sch = s_tir.Schedule(collective("all_exchange", 4, 2, 1024))
    with pytest.raises(ClusterError, match="partials in global memory"):
        collectives.inter_cluster_reduce(sch, sch.get_sblock("X"))


BULK_PTX = (
    "cp_async_bulk_s2c_async_bulk_shared__cluster_shared__cta_mbarrier__complete_tx__bytes",
    "mbarrier_init_init_shared__cta_b64",
    "fence_mbarrier_init_mbarrier_init_release_cluster",
    "mbarrier_arrive_expect_tx",
    "tvm_builtin_cuda_mbarrier_wait",
    "fence_proxy_proxy_async_shared__cta",
)


@pytest.mark.parametrize("kind", BULK_KINDS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("cluster", [2, 16])
def test_bulk_collective_assembles_with_mbarrier_completed_pushes(kind, dtype, cluster, assemble):
    sch = schedule_collective_kernel(collective(kind, 4, cluster, 16384, dtype), kind, cluster, bulk=True)
    source = cuda_source(sch.mod)
    for ptx in BULK_PTX:
        assert ptx in source, ptx
    if cluster == 16:  # the same instructions at any cluster size: assembled once
        assemble(source, f"{kind}_bulk_{dtype}_{cluster}")


def test_bulk_copy_is_fenced_then_waited_on_its_own_mbarrier():
    """The generic stores to the source are fenced for the copy engine before the cluster
    barrier that precedes the pushes; after the wait on the CTA's own mbarrier the result is read
    locally without another cluster barrier."""
    source = cuda_source(schedule_collective_kernel(
        collective("broadcast", 4, 4, 16384), "broadcast", 4, bulk=True).mod)
    body = source[source.index("extern \"C\" __global__"):]
    fence = "tvm_builtin_ptx_fence_proxy_proxy_async_shared__cta();"
    barrier = "tvm_builtin_cuda_cluster_sync();"
    push = "tvm_builtin_ptx_cp_async_bulk_s2c"
    wait = "tvm_builtin_cuda_mbarrier_wait_raw_u32("
    first = body.index(push)
    assert body.rindex(fence, 0, first) < body.rindex(barrier, 0, first)
    last_wait = body.rindex(wait)
    store = body.index("O_ptr", last_wait)
    assert barrier not in body[last_wait:store]
    assert body.count("mbarrier_init_init_shared__cta_b64(") == 2  # scatter and all-gather


def _expected_tx(source: str) -> list[str]:
    """The byte counts the mbarriers are armed with, as C expressions."""
    return [
        re.search(r"bulk_mbarrier_addr_ptr(?:_\d)?\[0\], (.*)\);$", line.strip()).group(1)
        for line in source.splitlines()
        if "mbarrier_arrive_expect_tx_arrive_expect_tx_shared__cta_b64(" in line and "__device__" not in line
    ]


def test_bulk_receivers_expect_exactly_the_bytes_their_peers_push():
    """Reduce-scatter (S=4, n=16384 fp32): CTA r receives part r (4096 floats) from its 3 peers
    and copies its own. Broadcast (S=8, fp16): the root scatters a 1/8 part to each of the other
    CTAs (the root keeps its own, expecting nothing), then each CTA receives the 7 parts it lacks."""
    rs = cuda_source(schedule_collective_kernel(
        collective("reduce_scatter", 4, 4, 16384), "reduce_scatter", 4, bulk=True).mod)
    assert _expected_tx(rs) == [f"(uint){3 * 4096 * 4}"]
    assert rs.count("(uint)16384, bulk_addr_ptr[4]") == 1  # one 16 KB push per (receiver, peer)
    bc = cuda_source(schedule_collective_kernel(
        collective("broadcast", 4, 8, 16384, "float16"), "broadcast", 8, bulk=True).mod)
    part = 16384 * 2 // 8
    assert _expected_tx(bc) == [f"((uint)({part} - (((((int)blockIdx.x) % 8) == 0) ? {part} : 0)))",
                                f"(uint){7 * part}"]


@pytest.mark.parametrize("kind", BULK_KINDS)
def test_a_ctas_own_chunks_are_copied_by_its_threads_not_pushed_to_itself(kind):
    """compute-sanitizer's memcheck reports a bulk copy whose cluster-window destination is the
    issuing CTA as an invalid remote write; each pushed pair's receiver differs from the sender
    and the own chunks move as 16-byte shared-memory loads and stores between CTA barriers."""
    source = cuda_source(schedule_collective_kernel(collective(kind, 4, 4, 16384), kind, 4, bulk=True).mod)
    body = source[source.index("extern \"C\" __global__"):]
    assert "ld.shared::cluster.v4.b32" in source and "st.shared::cluster.v4.b32" in source
    pushes = [line for line in body.splitlines() if "!= (((int)blockIdx.x) % 4)" in line
              or "!= (((int)blockIdx.x) & 3)" in line]
    assert pushes, "every push is guarded by receiver != own rank"
    copy = body.index("tvm_builtin_ptx_ld_vec_shared__cluster_v4_b32(")
    assert body.rindex("__syncthreads();", 0, copy) > body.rindex("cluster_sync", 0, copy)
    wait = body.index("mbarrier_wait", copy)
    assert "__syncthreads();" in body[wait:body.index("\n", body.index("\n", wait) + 1) + 200]


def test_bulk_chunks_must_be_whole_16_byte_units():
    sch, y = _unscheduled("copy", 2, 6)
    place_in_dsm(sch, y, 0)
    collectives.bulk_copy(sch, y)
    with pytest.raises(ClusterError, match="24 B, not a multiple of 16 B"):
        cuda_source(sch.mod)


# (workload, cluster, tile, buffers placed in DSM, primitive, error): misuse gets a named error.
MISUSE = [
    ("all_exchange", 4, 4096, "", "all_exchange", "reads no DSM buffer"),
    ("all_exchange", 1, 4096, "X", "all_exchange", "at least 2 CTAs"),
    ("all_exchange", 2, 4098, "X", "all_exchange", "not a multiple of the 4-element vector"),
    ("all_exchange", 4, 4096, "XY", "bulk_copy", "only copies move in bulk"),
    ("broadcast", 4, 4096, "X", "bulk_copy", "into a DSM buffer"),
    # 16 parts of a 2048-element tile are 128 elements: too few for 128 threads x 4 lanes.
    ("broadcast", 16, 2048, "XY", "broadcast", "must fill 128 threads x 4-element vectors"),
]


@pytest.mark.parametrize(("kind", "cluster", "n", "placed", "primitive", "error"), MISUSE)
def test_misuse_is_named(kind, cluster, n, placed, primitive, error):
    sch, y = _unscheduled(kind, cluster, n, place="X" in placed)
    if "Y" in placed:
        place_in_dsm(sch, y, 0)
    with pytest.raises(ClusterError, match=error):
        getattr(collectives, primitive)(sch, y)


@pytest.mark.parametrize(("kind", "bulk"), [(k, False) for k in EXCHANGES] + [(k, True) for k in BULK_KINDS])
def test_collective_schedule_replays_from_its_trace(kind, bulk):
    """Every primitive is made of recorded instructions: the JSON trace rebuilds the schedule
    (what MetaSchedule stores in its database and replays)."""
    func = collective(kind, 4, 4, 4096)
    sch = schedule_collective_kernel(func, kind, 4, bulk=bulk)
    replay = s_tir.Schedule(func)
    s_tir.schedule.Trace.apply_json_to_schedule(sch.trace.as_json(), replay)
    tvm.ir.assert_structural_equal(replay.mod, sch.mod)


def test_gated_all_exchange_combines_two_peers_elementwise(assemble):
    """Cluster of 2: every CTA computes silu(rank 0's tile) * rank 1's tile, reading the peer's
    half through DSM with 16-byte vectors (the exchange of a SwiGLU split over two CTAs)."""
    sch = schedule_collective_kernel(collective("gated", 4, 2, 16384), "gated", 2)
    source = cuda_source(sch.mod)
    assert "ld_vec_shared__cluster_v4_f32" in source and "expf" in source
    assemble(source, "gated_float32_2")
