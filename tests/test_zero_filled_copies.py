"""Zero-filled tile copies as predicated cp.async (tvm_dsm.transform.zero_filled_copies): what
TVM 0.27's own pass leaves as a copy nvcc rejects (int8 tiles, fp8 tiles outside a pipeline's
asynchronous stages) compiles, offsets count elements of the copied type, and copies that are
not global-to-shared stay plain copies."""

from __future__ import annotations

import pytest
import tvm
from tvm.script import tirx as T

import tvm_dsm
from conftest import TARGET, cuda_source
from tvm_dsm.workloads.dense import dense


def _copy(dtype: str, lanes: int, source_scope: str = "global"):
    """Each of 64 threads copies ``lanes`` elements of A (in ``source_scope``) into shared memory,
    zeros past thread 50, then reads back another thread's."""

    @T.prim_func(s_tir=True)
    def copy(A: T.Buffer((256,), dtype), B: T.Buffer((256,), dtype)):
        for bx in T.thread_binding(1, thread="blockIdx.x"):
            for t in T.thread_binding(64, thread="threadIdx.x"):
                with T.sblock("copy"):
                    S = T.sblock_alloc_buffer((256,), dtype, scope="shared")
                    L = T.sblock_alloc_buffer((256,), dtype, scope=source_scope)
                    if source_scope != "global":
                        for v in range(lanes):
                            L[t * lanes + v] = A[t * lanes + v]
                    for v in T.vectorized(lanes):
                        S[t * lanes + v] = T.if_then_else(
                            t < 50, (A if source_scope == "global" else L)[t * lanes + v], T.Cast(dtype, 0))
                    for v in range(lanes):
                        B[t * lanes + v] = S[(63 - t) * lanes + v]

    return copy


def test_a_copy_of_4_byte_integers_offsets_by_elements(assemble):
    source = cuda_source(tvm.IRModule({"main": _copy("int32", 4)}))
    assert "ptx_cp_async_legacy_pred_cg_16_4_4(" in source  # 16 bytes, offsets of 4-byte elements
    assemble(source, "copy_int32")


def test_a_copy_from_shared_memory_stays_a_plain_copy():
    source = cuda_source(tvm.IRModule({"main": _copy("int8", 16, "shared")}))
    assert "cp_async" not in source


@pytest.mark.parametrize(("m", "n", "k"), [(13, 24, 48), (5, 8, 64)])
def test_an_unpipelined_fp8_gemm_off_the_tiles_compiles(m, n, k, assemble, caplog):
    """K of one step: no pipeline, so no asynchronous stage in which TVM would issue cp.async;
    the plain copy's 16 fp8 zeros used to stop TVM's code generator."""
    caplog.set_level("WARNING", logger="tvm_dsm")
    source = tvm_dsm.build(dense(m, n, k, dtype="float8_e4m3fn"), TARGET).mod.imports[0].inspect_source()
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # the family's kernel, no fallback
    assert "e4m3.e4m3" in source and "cp_async" in source
    assemble(source, f"fp8_{m}x{n}x{k}")
