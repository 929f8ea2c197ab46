"""DSM collectives: every primitive lowers to vector ld.shared::cluster and assembles; misuse is named."""

from __future__ import annotations

import pytest
from conftest import cuda_source
from tvm import s_tir

from tvm_dsm import ClusterError
from tvm_dsm.rules.collective_kernel import schedule_collective_kernel
from tvm_dsm.schedule import bind_cluster, collectives
from tvm_dsm.workloads.collectives import KINDS, collective

EXCHANGES = [k for k in KINDS if k != "copy"]


@pytest.mark.parametrize("kind", EXCHANGES)
@pytest.mark.parametrize(("dtype", "vector"), [("float32", "v4_f32"), ("float16", "_b32")])
@pytest.mark.parametrize("cluster", [2, 16])
def test_collective_assembles_with_vector_dsm_loads(kind, dtype, vector, cluster, assemble):
    sch = schedule_collective_kernel(collective(kind, 4, cluster, 16384, dtype), kind, cluster)
    source = cuda_source(sch.mod)
    assert "ld_vec_shared__cluster_v" in source and vector in source
    assert "tvm_builtin_ptx_ld_shared__cluster" not in source  # no scalar fallback
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
    from tvm_dsm.schedule import place_in_dsm

    sch = s_tir.Schedule(collective(kind, 4, cluster, n))
    out = sch.get_sblock("O")
    ct, r, _ = sch.get_loops(out)
    cl, _ = bind_cluster(sch, sch.fuse(ct, r), cluster)
    for name in ("Y", "X"):
        sch.compute_at(sch.get_sblock(name), cl, preserve_unit_loops=True)
    if place:
        place_in_dsm(sch, sch.get_sblock("X"), 0)
    return sch, sch.get_sblock("Y")


def test_collective_needs_a_dsm_tile():
    sch, y = _unscheduled("all_exchange", 4, 4096, place=False)
    with pytest.raises(ClusterError, match="reads no DSM buffer"):
        collectives.all_exchange(sch, y)


def test_collective_needs_a_real_cluster():
    sch, y = _unscheduled("all_exchange", 1, 4096)
    with pytest.raises(ClusterError, match="at least 2 CTAs"):
        collectives.all_exchange(sch, y)


def test_slice_must_move_in_whole_16_byte_vectors():
    sch, y = _unscheduled("all_exchange", 2, 4098)
    with pytest.raises(ClusterError, match="not a multiple of the 4-element vector"):
        collectives.all_exchange(sch, y)


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
