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
