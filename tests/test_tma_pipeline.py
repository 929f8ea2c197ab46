"""TMA operand pipeline (tvm_dsm.transform.tma_pipeline): generated CUDA, layout, errors, GPU."""

from __future__ import annotations

import itertools
import re

import pytest
import tvm
from tvm import tirx
from tvm.sym import Analyzer

from conftest import TARGET, cuda_source, dense_relu_error_on_gpu
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners.split_k_gemm import plan_split_k_gemm
from tvm_dsm.rules.quantized_gemm import schedule_quantized_gemm
from tvm_dsm.rules.split_k_gemm import GemmShape, SplitKGemmConfig, schedule_split_k_gemm
from tvm_dsm.transform.tma_pipeline import swizzled_offset
from tvm_dsm.workloads.dense import dense, quantized_dense, scaled_dense

TMA = SplitKGemmConfig(2, 64, 128, 64, 2, 4, stages=4, tma=True)
TMA_COPY = "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"


@pytest.mark.parametrize(("dtype", "ptx_type"), [("float16", "f16"), ("bfloat16", "bf16")])
def test_generated_cuda_streams_operand_tiles_with_tma(dtype, ptx_type, assemble):
    source = cuda_source(schedule_split_k_gemm(dense(128, 256, 1024, dtype=dtype), TMA, load_hardware()).mod)
    for needle in (TMA_COPY, "const __grid_constant__ CUtensorMap X_tensormap",
                   "const __grid_constant__ CUtensorMap W_tensormap", "mbarrier.try_wait.parity",
                   "mbarrier.arrive.expect_tx", f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_type}",
                   "ldmatrix", "mapa.shared::cluster"):
        assert needle in source, needle
    assert "cp.async.cg.shared.global" not in source  # no per-thread operand copies left
    assemble(source, f"gemm_tma_{dtype}")


def test_host_encodes_one_tensor_map_per_operand():
    from tvm.tirx.compilation_pipeline import get_tir_pipeline

    mod = schedule_split_k_gemm(dense(128, 256, 1024), TMA, load_hardware()).mod
    host = get_tir_pipeline("default")[0](tvm.tirx.transform.BindTarget(TARGET)(mod))["main"].script()
    encodes = [line for line in host.splitlines() if "cuTensorMapEncodeTiled" in line]
    # X [128, 1024] in 64 x 64 boxes, W [256, 1024] in 64 x 128 boxes; 128-byte swizzle (3).
    assert len(encodes) == 2
    assert re.search(r'"float16", 2, X\w*\.data, 1024, 128, 2048, 64, 64, 1, 1, 0, 3,', encodes[0])
    assert re.search(r'"float16", 2, W\w*\.data, 1024, 256, 2048, 64, 128, 1, 1, 0, 3,', encodes[1])


def _shared_ranges(source: str) -> dict[str, tuple[int, int]]:
    """Byte ranges of the mbarriers and of each operand's slots in the merged shared buffer, read
    off the generated CUDA (address of element i of a ``T*`` view of buf_dyn_shmem)."""
    sizes = {"uint64_t": 8, "half": 2}
    starts = {}
    for kind, index in re.findall(r"cvta_generic_to_shared\(\(&\(\(\((uint64_t|half)\*\)buf_dyn_shmem_ptr\)\[(\d+)\]",
                                  source):
        starts.setdefault(kind, set()).add(int(index) * sizes[kind])
    return starts


def test_barriers_and_slots_do_not_overlap():
    """The mbarriers are used all through the loop; a shared-memory merge that thought them
    dead after their initialisation would let a TMA tile overwrite them (seen in development)."""
    source = cuda_source(schedule_split_k_gemm(dense(128, 256, 1024), TMA, load_hardware()).mod)
    starts = _shared_ranges(source)
    (barriers,) = starts["uint64_t"]
    x, w = sorted(starts["half"])
    # 4 slots of 64 (X) or 128 (W) rows of 128 bytes, plus 1024 bytes of alignment each
    ranges = [(barriers, 4 * 8), (x, 4 * 64 * 128 + 1024), (w, 4 * 128 * 128 + 1024)]
    for (a, a_size), (b, b_size) in itertools.combinations(sorted(ranges), 2):
        assert a + a_size <= b


def test_slots_start_at_a_1024_byte_boundary_wherever_the_merge_puts_them(assemble):
    """The hardware swizzles on absolute addresses, and TVM's merge places buffers at any
    16-byte offset (here after the mbarriers; a fused chain put one at byte 2624): slot 0 is
    the next 1024-byte boundary, for the TMA copies and the ldmatrix reads alike."""
    source = cuda_source(schedule_split_k_gemm(dense(128, 256, 1024), TMA, load_hardware()).mod)
    assert any(s % 1024 for s in _shared_ranges(source)["half"])  # a misaligned buffer start
    aligned = "+ (uint)1023) & (~(uint)1023))"
    copies = [line for line in source.splitlines()
              if line.strip().startswith("tvm_builtin_ptx_cp_async_bulk_tensor_g2s")]
    assert copies and all(aligned in line for line in copies)
    reads = [line for line in source.splitlines() if "addr = __cvta_generic_to_shared" in line
             and "^" in line]  # the swizzled ldmatrix addresses
    assert reads and all(aligned in line for line in reads)
    assemble(source, "gemm_tma_aligned")


def _k_loop(source: str) -> str:
    start = source.index("for (int ax3_0")
    depth = 0
    for end in range(source.index("{", start), len(source)):
        depth += {"{": 1, "}": -1}.get(source[end], 0)
        if depth == 0:
            return source[start:end]
    raise AssertionError("unterminated loop")


def test_k_loop_issues_ahead_then_waits_on_its_slot_once_per_step():
    """Per step: one CTA barrier (every warp is done with the slot refilled), one thread issues
    the tile stages-1 ahead, all wait for this step's tile on its mbarrier."""
    loop = _k_loop(cuda_source(schedule_split_k_gemm(dense(128, 256, 4096), TMA, load_hardware()).mod))
    assert loop.count("__syncthreads()") == 1
    assert loop.index("__syncthreads()") < loop.index("cp_async_bulk_tensor") < loop.index(
        "mbarrier_wait") < loop.index("ldmatrix")


@pytest.mark.parametrize("elem_bytes", [1, 2])
def test_swizzle_is_cuda_128_byte_swizzle(elem_bytes):
    """Element offsets map to CU_TENSOR_MAP_SWIZZLE_128B: 16-byte chunk c of 128-byte row r
    lands at chunk c ^ (r % 8)."""
    analyzer = Analyzer()
    row_elems = 128 // elem_bytes
    for offset in range(0, 16 * row_elems, 3):
        row, col_bytes = divmod(offset * elem_bytes, 128)
        expected = row * 128 + ((col_bytes // 16) ^ (row % 8)) * 16 + col_bytes % 16
        got = analyzer.simplify(swizzled_offset(tirx.const(offset, "int32"), elem_bytes))
        assert int(got) * elem_bytes == expected


@pytest.mark.parametrize(("func", "config", "message"), [
    (dense(128, 256, 1024, weight_layout="kn"), TMA, "W stored \\[k, n\\] are for warpgroup MMAs"),
    (dense(128, 256, 1024), SplitKGemmConfig(2, 64, 128, 32, 2, 4, 4, tma=True), "block_k"),
    (dense(128, 512, 1024), SplitKGemmConfig(1, 64, 512, 64, 2, 4, 3, tma=True), "at most 256 rows"),
    (dense(128, 240, 1024, weight_layout="kn"), SplitKGemmConfig(1, 128, 80, 64, 8, 1, 4, tma=True, wgmma=True),
     "rows of N in 128-byte panels"),
])
def test_unsupported_tiles_get_clear_errors(func, config, message):
    with pytest.raises(ClusterError, match=message):
        schedule_split_k_gemm(func, config, load_hardware())


def test_fused_quantization_refuses_tma():
    config = SplitKGemmConfig(2, 64, 128, 128, 2, 4, 3, tma=True)
    with pytest.raises(ClusterError, match="TMA operand copies are not supported"):
        schedule_quantized_gemm(quantized_dense(128, 256, 1024), config, load_hardware())


def test_fp8_tiles_of_128_bytes_stream_with_tma(assemble):
    config = SplitKGemmConfig(2, 64, 128, 128, 2, 4, 4, tma=True)
    source = cuda_source(schedule_split_k_gemm(scaled_dense(128, 256, 2048), config, load_hardware()).mod)
    assert TMA_COPY in source and "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3" in source
    assemble(source, "fp8_tma")


def test_planner_prefers_tma_where_it_applies():
    """Measured on the H100 (bench/results/gemm_tma.json): TMA beat cp.async on 9 of the 10
    shapes' best configurations; the planner's pick for a K-contiguous weight uses it, and for
    a weight stored [K, N] TMA tiles of rows of N for warpgroup MMAs reading them MN-major."""
    assert plan_split_k_gemm(GemmShape(128, 4096, 4096, True), _hw())[0].config.tma
    kn = plan_split_k_gemm(GemmShape(128, 4096, 4096, False), _hw())[0].config
    assert kn.tma and kn.wgmma and kn.block_n % 64 == 0


def _hw():
    return load_hardware()


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k", "config"), [
    (128, 1024, 4096, SplitKGemmConfig(1, 128, 128, 64, 2, 4, 4, tma=True)),
    (128, 1024, 4096, SplitKGemmConfig(4, 64, 128, 64, 2, 4, 3, tma=True)),
    (256, 512, 2048, SplitKGemmConfig(2, 128, 256, 64, 2, 4, 3, tma=True)),
    (64, 768, 3072, SplitKGemmConfig(2, 64, 64, 64, 2, 2, 4, tma=True)),
])
def test_gpu_tma_gemm_matches_float64(m, n, k, config):
    assert dense_relu_error_on_gpu(m, n, k, config) < 2e-3
