"""The tvm-dsm pipeline is TVM's default, changes nothing without clusters, and checks SMEM."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tvm
from conftest import cuda_source
from tvm import s_tir
from tvm.script import tirx as T
from tvm.tirx.compilation_pipeline import PIPELINE_MAP

from tvm_dsm import ClusterError
from tvm_dsm.pipeline import dsm_pipeline


def test_registered_as_default_s_tir_pipeline():
    assert PIPELINE_MAP["s_tir"] is dsm_pipeline
    assert PIPELINE_MAP["tvm_dsm"] is dsm_pipeline
    assert "s_tir_stock" in PIPELINE_MAP


def test_import_tvm_autoloads_tvm_dsm():
    code = "import tvm; from tvm.tirx.compilation_pipeline import PIPELINE_MAP as M; print(M['s_tir'].__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "tvm_dsm.pipeline"
    assert "Failed to autoload" not in out.stderr


def test_non_cluster_kernels_compile_exactly_as_stock():
    from tvm_dsm.workloads import row_sum

    sch = s_tir.Schedule(row_sum(256, 1024))
    i, k = sch.get_loops(sch.get_sblock("B"))
    sch.bind(i, "blockIdx.x")
    _, tx = sch.split(k, [None, 128])
    sch.bind(tx, "threadIdx.x")
    assert cuda_source(sch.mod) == cuda_source(sch.mod, "s_tir_stock")


@T.prim_func(s_tir=True)
def big_smem(A: T.Buffer((64, 16384), "float32"), B: T.Buffer((64, 16384), "float32")):
    for c in T.thread_binding(32, thread="blockIdx.x", annotations={"tvm_dsm.cluster_size": 2}):
        for r in T.thread_binding(2, thread="clusterCtaIdx.x"):
            for t in T.thread_binding(128, thread="threadIdx.x"):
                with T.sblock("copy"):
                    S = T.sblock_alloc_buffer((16384,), scope="shared")  # 64 KiB static
                    for j in range(128):
                        S[j * 128 + t] = A[c * 2 + r, j * 128 + t]
                    for j in range(128):
                        B[c * 2 + r, j * 128 + t] = S[j * 128 + t]


def test_static_smem_limit_is_named():
    with pytest.raises(ClusterError, match="65536 B of static shared memory"):
        cuda_source(tvm.IRModule({"main": big_smem}))


@T.prim_func(check_well_formed=False)
def _two_kernels(a: T.Buffer((64,), "float32")):
    with T.launch_thread("blockIdx.x", 1) as bx:
        tx = T.launch_thread("threadIdx.x", 32)
        a[tx] = T.float32(1)
    with T.launch_thread("blockIdx.x", 1) as bx:
        with T.launch_thread("threadIdx.x", 32) as tx:
            w = T.alloc_buffer((64,), scope="warp")
            w[tx] = a[tx]
            a[tx + 32] = w[tx]


def test_warp_buffers_are_hoisted_in_every_kernel_not_only_the_first():
    from tvm import tirx

    from tvm_dsm.ir import find_all
    from tvm_dsm.transform.hoist_warp_buffers import hoist_warp_buffers

    def lane_launches(func):
        return find_all(func.body, tirx.AttrStmt,
                        lambda a: a.attr_key == "thread_extent" and a.node.thread_tag == "threadIdx.x")

    def warp_buffers_inside(launch):
        return find_all(launch.body, tirx.AllocBuffer, lambda a: str(a.buffer.ty.storage_scope) == "warp")

    assert warp_buffers_inside(lane_launches(_two_kernels)[1])
    hoisted = hoist_warp_buffers(_two_kernels)
    assert not any(warp_buffers_inside(launch) for launch in lane_launches(hoisted))
    assert len(find_all(hoisted.body, tirx.AllocBuffer)) == 1


@T.prim_func(check_well_formed=False)
def _workspace_views(x: T.Buffer((64,), "float16")):
    plain = T.alloc_buffer((64,), "float16")
    viewed = T.alloc_buffer((64,), "float16")
    mapped = T.alloc_buffer((64,), "float16")
    view = T.decl_buffer((64,), "float16", data=viewed.data)
    tensor_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
    T.call_packed("runtime.cuTensorMapEncodeTiled", tensor_map, "float16", 1, mapped.data,
                  64, 2, 64, 1, 0, 3, 3, 0)
    T.call_packed("runtime.cuTensorMapEncodeTiled", tensor_map, "float16", 1, x.data,
                  64, 2, 64, 1, 0, 3, 3, 0)
    plain[0] = x[0]
    view[0] = plain[0]


def test_storage_rewrite_is_skipped_where_an_allocation_is_reached_by_a_view_or_a_tensor_map():
    from tvm_dsm.transform.storage_rewrite import aliased_allocations

    names = {b.name for b in aliased_allocations(_workspace_views)}
    assert names == {"viewed", "mapped"}  # not the parameter x, not the plain allocation
