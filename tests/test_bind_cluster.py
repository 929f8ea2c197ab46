"""bind_cluster: real CTAs, cluster launch dims, trace replay, and the documented errors."""

from __future__ import annotations

import re

import pytest
import tvm
from conftest import cuda_source, host_launch
from tvm import s_tir
from tvm.script import tirx as T

from tvm_dsm import ClusterError
from tvm_dsm.schedule import bind_cluster
from tvm_dsm.annotations import CLUSTER_SIZE_KEY


@T.prim_func(s_tir=True)
def scale(A: T.Buffer((4096,), "float32"), B: T.Buffer((4096,), "float32")):
    for i in range(4096):
        with T.sblock("B"):
            vi = T.axis.spatial(4096, i)
            B[vi] = A[vi] * T.float32(2)


def clustered(cluster: int) -> s_tir.Schedule:
    sch = s_tir.Schedule(scale)
    (i,) = sch.get_loops(sch.get_sblock("B"))
    cta, tx = sch.split(i, [None, 128])
    bind_cluster(sch, cta, cluster)
    sch.bind(tx, "threadIdx.x")
    return sch


def launch_dims(calls: list[str]) -> tuple[int, ...]:
    (call,) = calls
    return tuple(int(v) for v in re.search(r"B_1?\.data, ([\d, ]+), launch", call).group(1).split(", "))


@pytest.mark.parametrize("cluster", [1, 2, 4, 8, 16])
def test_launches_every_cta_with_cluster_dims(cluster):
    call = host_launch(clustered(cluster).mod)
    assert "clusterCtaIdx.x" in call[0]
    grid, cluster_dim, threads = launch_dims(call)
    assert (grid, cluster_dim, threads) == (32, cluster, 128)  # 32 CTAs cover 4096 / 128


def test_stock_bind_launches_too_few_ctas():
    """The trap this primitive exists for: stock TVM launches grid = blockIdx extent only."""
    sch = s_tir.Schedule(scale)
    (i,) = sch.get_loops(sch.get_sblock("B"))
    bo, c, t = sch.split(i, [None, 4, 128])
    sch.bind(bo, "blockIdx.x")
    sch.bind(c, "clusterCtaIdx.x")
    sch.bind(t, "threadIdx.x")
    grid, cluster, threads = launch_dims(host_launch(sch.mod, "s_tir_stock"))
    assert grid * threads < 4096  # 8 CTAs of 128 threads: 3/4 of B is never written
    with pytest.raises(ClusterError, match="without tvm_dsm.schedule.bind_cluster"):
        host_launch(sch.mod)


def test_each_cta_covers_its_own_elements():
    """cluster * size + rank folds back to blockIdx.x: CTA b owns elements [128 b, 128 b + 128)."""
    source = cuda_source(clustered(4).mod)
    assert "B_ptr[((((int)blockIdx.x) * 128) + ((int)threadIdx.x))]" in source


def test_trace_replays_through_json():
    sch = clustered(4)
    trace_json = sch.trace.as_json()
    replay = s_tir.Schedule(scale)
    s_tir.schedule.Trace.apply_json_to_schedule(trace_json, replay)
    tvm.ir.assert_structural_equal(replay.mod, sch.mod)
    assert CLUSTER_SIZE_KEY in str(trace_json)


@pytest.mark.parametrize("size", [0, 17, 32])
def test_invalid_cluster_size(size):
    sch = s_tir.Schedule(scale)
    (i,) = sch.get_loops(sch.get_sblock("B"))
    with pytest.raises(ClusterError, match="cluster size .* out of range"):
        bind_cluster(sch, i, size)


def test_grid_not_divisible_by_cluster():
    sch = s_tir.Schedule(scale)
    (i,) = sch.get_loops(sch.get_sblock("B"))
    cta, _ = sch.split(i, [None, 512])  # 8 CTAs
    with pytest.raises(ClusterError, match="grid of 8 CTAs is not divisible by cluster size 3"):
        bind_cluster(sch, cta, 3)


def test_generated_cluster_kernel_assembles(assemble):
    assemble(cuda_source(clustered(16).mod), "scale16")
