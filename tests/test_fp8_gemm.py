"""fp8 e4m3 GEMMs with scales, and per-token FP8 quantization fused into them (CPU: IR
structure, generated CUDA that assembles, the planner and the errors)."""

from __future__ import annotations

import pytest

from conftest import cuda_source
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners.split_k_gemm import plan_split_k_gemm
from tvm_dsm.rules.quantized_gemm import schedule_quantize_then_gemm, schedule_quantized_gemm, shared_bytes
from tvm_dsm.rules.split_k_gemm import GemmShape, SplitKGemmConfig, schedule_split_k_gemm
from tvm_dsm.transform.cascaded_reductions import fuse_cascaded_reductions
from tvm_dsm.hardware import load_hardware
from tvm_dsm.workloads.dense import dense, quantized_dense, scaled_dense

FP8 = "float8_e4m3fn"
SMALL = SplitKGemmConfig(cluster_size=2, block_m=64, block_n=64, block_k=64, warps_m=2, warps_n=2, stages=3)
MMA_FP8 = "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32"


def test_scaled_fp8_gemm_runs_m16n8k32_on_fp8_tiles_and_applies_both_scales(assemble):
    source = cuda_source(schedule_split_k_gemm(scaled_dense(128, 256, 512), SMALL, load_hardware()).mod)
    for needle in (MMA_FP8, "ldmatrix", "cp.async.cg.shared.global", "ld.shared::cluster.v4.f32",
                   "sx_ptr[", "(sw_ptr + "):  # per-row scalar, per-column float4
        assert needle in source, needle
    assert "m16n8k16" not in source
    assert source.count("__global__") == 2  # one fused kernel
    assemble(source, "scaled_fp8")


def test_quantized_gemm_is_one_kernel_with_the_exact_row_max_through_dsm(assemble):
    source = cuda_source(schedule_quantized_gemm(quantized_dense(128, 256, 1024), SMALL, load_hardware()).mod)
    assert source.count("__global__") == 2
    # X arrives as fp16 by cp.async, is quantized in shared memory 4 at a time, multiplied in fp8.
    for needle in (MMA_FP8, "ptx_cp_async", "(__nv_fp8x4_e4m3)", "mapa.shared::cluster",
                   "barrier.cluster.arrive", "fabsf"):
        assert needle in source, needle
    # The row max runs once per CTA before the main loop, not per K step: one |x| max per loaded
    # element, all before the first mma.
    assert source.index("fabsf") < source.index(MMA_FP8)
    assert source.count("0x1.cp+8f") >= 2  # 448: the inverse scale and the dequantization scale
    assemble(source, "quantized_fp8")


def test_quantization_then_gemm_is_two_kernels_the_second_on_wgmma(assemble):
    """The pick for per-token quantization + GEMM: a row-max-and-quantize kernel (one CTA per
    row, fp8x4 stores), then the fp8 GEMM reading the quantized X by TMA on k32 warpgroup MMAs,
    launched programmatically behind it."""
    config = SplitKGemmConfig(2, 64, 128, 128, 4, 1, 4, tma=True, wgmma=True, programmatic_launch=True)
    source = cuda_source(schedule_quantize_then_gemm(quantized_dense(128, 512, 2048), config, load_hardware()).mod)
    assert source.count("__global__") == 4  # two kernels, each declared and defined
    quantize, gemm = source.split("extern \"C\" __global__")[3:5]
    assert "fabsf" in quantize and "__nv_fp8x4_e4m3" in quantize and "wgmma" not in quantize
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in source
    assert "Xq_tensormap" in gemm and "amax_global" in gemm  # TMA reads Xq; the scale's source
    assert "griddepcontrol.wait" in source
    assemble(source, "quantize_then_gemm")


@pytest.mark.parametrize(
    ("func", "schedule", "config", "message"),
    [
        (dense(128, 256, 512, dtype=FP8, weight_layout="kn"), schedule_split_k_gemm, SMALL,
         "weight stored"),
        (scaled_dense(128, 256, 576), schedule_split_k_gemm,
         SplitKGemmConfig(2, 64, 64, 48, 2, 2, 3), "16x16x32"),
        (quantized_dense(128, 256, 1024), schedule_quantized_gemm,
         SplitKGemmConfig(8, 64, 64, 32, 2, 2, 3), "fewer than 32 lanes"),
        (quantized_dense(128, 256, 1536), schedule_quantize_then_gemm,
         SplitKGemmConfig(2, 64, 128, 128, 4, 1, 4, tma=True, wgmma=True), "multiple of 1024"),
        (quantized_dense(128, 4096, 4096), schedule_quantize_then_gemm,
         SplitKGemmConfig(2, 128, 256, 128, 2, 4, 4, tma=True), "the GEMM kernel needs"),
        (quantized_dense(256, 256, 8192), schedule_quantized_gemm,
         SplitKGemmConfig(1, 128, 256, 128, 2, 4, 4), "fp16 and fp8 X tiles"),
        (dense(128, 256, 512), schedule_quantized_gemm, SMALL, "a quantized GEMM is"),
    ],
)
def test_unsupported_inputs_name_what_fails(func, schedule, config, message):
    with pytest.raises(ClusterError, match=message):
        schedule(func, config, load_hardware())


def test_planner_keeps_fp8_and_quantized_configs_within_shared_memory():
    shape = GemmShape(128, 4096, 4096, True, FP8)
    plain = plan_split_k_gemm(shape, load_hardware())
    quantized = plan_split_k_gemm(shape, load_hardware(), quantized=True)
    assert any(p.config.block_k == 128 for p in plain)  # 128-byte rows, as fp16's 64
    assert quantized and all(shared_bytes(p.config) <= load_hardware().smem_per_cta for p in quantized)
    # Reading X in fp16, twice, never makes the fused form cheaper than the plain fp8 GEMM.
    assert quantized[0].predicted_us >= plain[0].predicted_us


def test_cascade_pass_leaves_the_quantized_gemm_unfused_by_default():
    """RedFuser's running-max form would round differently from per-token quantization."""
    func = quantized_dense(128, 256, 512)
    fused, reports = fuse_cascaded_reductions(func)
    assert fused.same_as(func)
    assert any("rounding cast" in str(r) for r in reports)


def test_quantized_gemm_without_peers_unrolls_its_epilogue():
    """One CTA a tile (no peers to read): the epilogue's own loop over the tile is unrolled, as
    every split-K epilogue without peers is, so its loads of the scales are issued together:
    each of 128 threads stores its 64 x 128 / (4 x 128) = 16 vectors in straight-line code."""
    config = SplitKGemmConfig(1, 64, 128, 64, 2, 2, 3)
    sch = schedule_quantized_gemm(quantized_dense(64, 1024, 1024), config, load_hardware())
    assert cuda_source(sch.mod).count("(half4*)(Y_ptr") == 64 * 128 // (4 * config.threads)
