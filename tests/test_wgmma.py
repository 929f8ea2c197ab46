"""Warpgroup-MMA main loops (tvm_dsm.intrin.wgmma): generated CUDA, registers, errors, GPU."""

from __future__ import annotations

import collections
import re

import pytest

from conftest import cuda_source, dense_relu_error_on_gpu
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners.split_k_gemm import plan_split_k_gemm
from tvm_dsm.rules.split_k_gemm import GemmShape, SplitKGemmConfig, schedule_split_k_gemm
from tvm_dsm.workloads.dense import dense, gated_dense, scaled_dense


def wgmma_config(cluster: int, block_m: int = 128, block_n: int = 128, stages: int = 4) -> SplitKGemmConfig:
    return SplitKGemmConfig(cluster, block_m, block_n, 64, block_m // 16, 1, stages, tma=True, wgmma=True)


@pytest.mark.parametrize(("dtype", "ptx"), [("float16", "f16"), ("bfloat16", "bf16")])
def test_main_loop_issues_wgmma_on_the_tma_tiles(dtype, ptx):
    sch = schedule_split_k_gemm(dense(128, 512, 1024, dtype=dtype), wgmma_config(2), load_hardware())
    source = cuda_source(sch.mod)
    assert f"wgmma.mma_async.sync.aligned.m64n128k16.f32.{ptx}.{ptx}" in source
    assert "cp.async.bulk.tensor" in source
    assert "mma.sync" not in source  # every multiply is a warpgroup MMA
    assert "ldmatrix" not in source  # both operands by descriptor from the swizzled tiles


def test_fp8_main_loop_issues_k32_wgmma_on_128_deep_tiles(assemble):
    """fp8 e4m3: 128-byte TMA rows are 128 elements deep, read by four k32 steps of 32 bytes;
    fp8 wgmma has no transpose operands (both tiles K-major). Each tile's products go to
    fresh registers that are added to the accumulator in fp32 (Hopper's fp8 accumulation
    alone reached 1.9e-3 relative error at K = 14336). The planner picks it for the 4096 x
    4096 layer: 23.4 -> 14.2 us at M = 128 and 424 -> 188 us at M = 4096 against the mma.sync
    main loop (bench/results/fp8.json)."""
    config = SplitKGemmConfig(2, 64, 128, 128, 4, 1, 4, tma=True, wgmma=True)
    source = cuda_source(schedule_split_k_gemm(scaled_dense(128, 512, 1024), config, load_hardware()).mod)
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in source
    assert "p, 1, 1;" in source  # no transpose immediates
    assert "d[r] += t[r];" in source  # the fp32 promotion
    assert "mma.sync" not in source
    assemble(source, "fp8_wgmma")
    assert plan_split_k_gemm(GemmShape(128, 4096, 4096, True, "float8_e4m3fn"), load_hardware())[0].config.wgmma


def test_multiplies_stay_in_flight_into_the_next_step():
    """Each step returns with its wgmma group in flight (wait_group 1), so a slot is refilled
    two steps after it was read: 4 stages issue 2 tiles ahead, and every group is awaited
    (wait_group 0) after the loop, before the accumulators are stored."""
    source = cuda_source(schedule_split_k_gemm(dense(128, 512, 1024), wgmma_config(2), load_hardware()).mod)
    assert "wgmma.wait_group.sync.aligned 1;" in source
    assert re.search(r"for \(int tma_stage_\d+ = 0; tma_stage_\d+ < 2;", source)
    kernel = source[source.index("__global__ void __launch_bounds__"):]
    assert kernel.index("wait_group_sync_aligned_0()") < kernel.index("cluster_sync")


def test_accumulators_stay_in_registers(ptxas_report):
    """wgmma accumulates in registers: an accumulator left as a lane-indexed array would land
    on the stack (2 KB per thread, as X's fragments did in the first, register-operand form),
    and ptxas then fences every wgmma ("warpgroup.arrive is injected")."""
    sch = schedule_split_k_gemm(dense(256, 1024, 2048), wgmma_config(2, block_n=256), load_hardware())
    source = cuda_source(sch.mod)
    report = ptxas_report(source, "wgmma_registers")
    assert re.search(r"\b0 bytes stack frame", report), report
    assert "warpgroup.arrive is injected" not in report


def test_two_warpgroups_of_rows_share_each_w_tile(ptxas_report):
    """256-row tiles: 16 warps, four per 64-row warpgroup, each warpgroup's MMAs reading the same
    W tile (measured fastest on 5 of 17 layer x batch groups, bench/results/gemm_large_m.json);
    their accumulators fit the SM's registers without spilling."""
    sch = schedule_split_k_gemm(dense(256, 1024, 2048), wgmma_config(1, block_m=256), load_hardware())
    source = cuda_source(sch.mod)
    assert "__launch_bounds__(512)" in source and "m64n128k16" in source
    report = ptxas_report(source, "wgmma_256_rows")
    assert re.search(r"\b0 bytes stack frame, 0 bytes spill stores", report), report


def test_gated_products_share_one_k_loop(assemble):
    """Gate and up multiply the same X tile in one K loop: each step copies X once beside both
    W tiles (one pipeline to fill, not two; S1-S8's gated layers 1.01-1.28x faster,
    bench/results/gated_one_loop_ab.json)."""
    source = cuda_source(schedule_split_k_gemm(gated_dense(128, 512, 1024), wgmma_config(2), load_hardware()).mod)
    assert source.count("wgmma.mma_async") == 1  # one helper, called for both products
    assert len(re.findall(r"tvm_dsm_wgmma_m64n128k64_f16_g2\(\(", source)) == 2
    # each call returns with both products' groups in flight, not waiting for the other's
    # (gated_wgmma_in_flight_ab.json: 1.018x over 11 gated kernels, M = 1024 1.044x)
    assert "wgmma.wait_group.sync.aligned 2;" in source
    # the pipeline's prologue and its loop, each copying every operand's tile once (beside the
    # one prefetch of each tensor map's descriptor)
    copies = collections.Counter(re.findall(r"mbarrier__complete_tx__bytes\(.*?&\((\w+_tensormap\w*)\)", source))
    assert copies == {"X_tensormap": 2, "Wg_tensormap": 2, "Wu_tensormap": 2}, copies
    assert len(re.findall(r"prefetch_tensormap\(.*&\(\w+_tensormap\)", source)) == 3
    assemble(source, "gated_wgmma")


@pytest.mark.parametrize(
    ("func", "config", "message"),
    [
        (dense(128, 256, 1024), SplitKGemmConfig(2, 128, 128, 64, 8, 1, 4, tma=False, wgmma=True),
         "needs tma=True"),
        (dense(128, 256, 1024), SplitKGemmConfig(2, 32, 128, 64, 2, 1, 4, tma=True, wgmma=True),
         "block_m a multiple of 64"),
        (dense(128, 256, 1024), SplitKGemmConfig(2, 128, 128, 64, 2, 4, 4, tma=True, wgmma=True),
         "warps 8x1"),
        (dense(256, 256, 1024), wgmma_config(1, block_m=256, block_n=256), "65536"),
        # gate and up in one K loop hold both accumulators: 2 x 128 per thread
        (gated_dense(128, 512, 1024), wgmma_config(1, block_n=256, stages=3), "256 fp32 accumulators"),
        # one warpgroup of 64 rows fits the SM's registers, but not a thread's 255: it spilled
        # (swiglu_28672x8192_m64 ran 982 us where torch took 358, real_shapes)
        (gated_dense(64, 512, 1024), wgmma_config(1, block_m=64, block_n=256, stages=3), "the 255 a thread"),
    ],
)
def test_unsupported_wgmma_configurations_get_clear_errors(func, config, message):
    with pytest.raises(ClusterError, match=message):
        schedule_split_k_gemm(func, config, load_hardware())


def test_planner_picks_wgmma_where_a_warpgroup_tile_fits():
    """From M = 64 on, the planner's picks use wgmma (measured 1.1-1.5x faster than mma.sync
    on the same tiles, bench/results/gemm_wgmma.json); M = 16 keeps mma.sync's 16-row tiles."""
    hw = load_hardware()
    assert not plan_split_k_gemm(GemmShape(16, 4096, 4096, True), hw)[0].config.wgmma
    for m in (64, 128, 1024, 4096):
        assert plan_split_k_gemm(GemmShape(m, 4096, 4096, True), hw)[0].config.wgmma, m


@pytest.mark.parametrize("config", [wgmma_config(1, block_n=144, stages=5), wgmma_config(2, block_m=64, block_n=112),
                                    wgmma_config(1, block_m=256, block_n=160, stages=3)])
def test_widths_between_powers_of_two_keep_their_accumulators_in_registers(config, ptxas_report):
    """Tiles 96-224 columns wide (``TILE_WIDTHS``: N of m64nNk16 in steps of 16) fill the
    machine where powers of two do not; their MMAs, copies and epilogue build for any N the
    tiles do not divide (the last column of tiles past N), without spills."""
    sch = schedule_split_k_gemm(dense(256, 1000, 1024), config, load_hardware())
    source = cuda_source(sch.mod)
    assert f"m64n{config.block_n}k16" in source
    report = ptxas_report(source, f"wgmma_width_{config.block_n}")
    assert re.search(r"\b0 bytes stack frame, 0 bytes spill stores", report), report


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k", "config"), [
    (128, 1024, 4096, wgmma_config(1)), (128, 1024, 4096, wgmma_config(4, block_n=256)),
    (64, 768, 3072, wgmma_config(2, block_m=64)), (256, 512, 2048, wgmma_config(2, stages=3)),
    (256, 1024, 2048, wgmma_config(2, block_m=256)),
    (128, 1008, 2048, wgmma_config(1, block_n=144, stages=5)), (256, 896, 1024, wgmma_config(2, block_m=64, block_n=112)),
    (512, 1280, 2048, wgmma_config(1, block_m=256, block_n=160, stages=3)),
])
def test_gpu_matches_float64(m, n, k, config):
    assert dense_relu_error_on_gpu(m, n, k, config) < 2e-3


def test_every_planned_width_is_registered_for_replay():
    """A fresh process replaying a database trace (tvm_dsm.build) has scheduled nothing: the
    intrinsic of every width and in-flight count the planner may pick must exist after
    ``register_all``, which ``build`` calls before it queries a database."""
    import subprocess
    import sys

    from tvm_dsm.planners.split_k_gemm import BLOCK_N

    names = [f"tvm_dsm_wgmma_m64n{n}k64_f16{g}" for n in BLOCK_N for g in ("", "_g2")]
    check = ("import sys, tvm_dsm.intrin; tvm_dsm.intrin.register_all(); from tvm.s_tir import TensorIntrin; "
             "missing = [n for n in sys.argv[1:] if TensorIntrin.get(n, allow_missing=True) is None]; "
             "sys.exit(f'not registered: {missing}' if missing else 0)")
    proc = subprocess.run([sys.executable, "-c", check, *names], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
