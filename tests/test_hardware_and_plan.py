"""The measured hardware description loads, and the planner ranks split-K configurations."""

from __future__ import annotations

from pathlib import Path

import pytest

from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners import plan_split_k_reduction


def test_h100_description_is_measured():
    hw = load_hardware()
    assert hw.device.startswith("NVIDIA H100") and hw.sm_count == 132
    assert 2.0e12 < hw.hbm_bw < 3.5e12  # bytes read + written by a device copy
    assert hw.smem_per_cta == 232448
    assert set(hw.dsm_bw_by_cluster) == {2, 4, 8, 16}
    assert hw.latency_ns["smem"] < hw.latency_ns["dsm"] < hw.latency_ns["hbm"]


def test_dsm_peak_is_the_copy_engine_ceiling():
    """The peak probe (bulk copies) is above the register-load probe at every cluster size, and
    records how many 128 KB-SMEM clusters were resident (the resident bandwidth kernels launch
    two such waves)."""
    hw = load_hardware()
    for size in (2, 4, 8, 16):
        assert hw.dsm_peak_bw(size) > hw.dsm_bw(size)
        assert 0 < hw.dsm_peak_clusters[size] * size <= hw.sm_count


def test_clusters_of_three_or_more_strand_sms():
    """Measured residency: a cluster's CTAs share a GPC, so 128 CTAs in clusters of 4 at one
    CTA per SM do not all fit at once (the split-K planner then counts two waves)."""
    from tvm_dsm.planners.split_k_gemm import predict
    from tvm_dsm.rules.split_k_gemm import GemmShape, SplitKGemmConfig

    hw = load_hardware()
    assert hw.concurrent_ctas(1, 1) == hw.sm_count
    assert hw.concurrent_ctas(2, 1) == hw.sm_count  # pairs fit every GPC
    assert hw.concurrent_ctas(4, 1) < 128 < hw.concurrent_ctas(4, 2)
    assert hw.concurrent_ctas(16, 1) < hw.concurrent_ctas(8, 1) <= 120
    shape = GemmShape(128, 4096, 16384, True)
    one_wave = predict(shape, SplitKGemmConfig(2, 128, 128, 64, 2, 4, 4), hw)  # 64 CTAs
    two_waves = predict(shape, SplitKGemmConfig(4, 128, 128, 64, 2, 4, 4), hw)  # 128, 1 per SM
    assert two_waves.resident == 1 and two_waves.seconds["pipeline"] == one_wave.seconds["pipeline"]


def test_planner_prefers_more_ctas_for_a_few_long_rows():
    hw = load_hardware()
    best = plan_split_k_reduction(256, 16384, hw)[0]
    assert best.config.cluster_size >= 8  # 256 rows alone cannot fill 132 SMs
    assert best.bytes["hbm"] >= 256 * 16384 * 4
    assert "predicted" in best.explain()


def test_planner_reports_unfittable_shapes():
    from tvm_dsm import ClusterError

    with pytest.raises(ClusterError, match="no cluster split-K configuration"):
        plan_split_k_reduction(250, 4095, load_hardware())


def test_demo_shows_plan_cuda_and_fusion_reports(capsys):
    """`make demo`'s script: the plan, the generated CUDA and the RedFuser reports (MoE routing's
    top-k included); without a GPU it says how to run the kernels on one."""
    from conftest import run_tutorial

    out = run_tutorial("split_k_reduction", capsys)
    assert "predicted:" in out and "main_kernel(" in out
    assert "nvcc sm_90a: assembles" in out or "skipped (no nvcc)" in out
    assert "cascade topk -> m -> l: fusible" in out and "topk (top-8): plain" in out


@pytest.mark.parametrize("name", ["hwbench", "operand_stream", "stream_read", "decode_read"])
def test_microbenchmarks_assemble_for_sm_90a(assemble, name):
    """The CUDA microbenchmarks behind the hardware description, the GEMM main-loop diagnosis
    (bench/results/operand_stream.json), the plain-read ceiling (read_ceiling_cuda.json) and
    decode's loads without arithmetic (decode_read_cuda.json) still compile: their kernels are rerun on the device."""
    folder = Path(__file__).parent.parent / "src" / "hwbench"
    assert assemble((folder / f"{name}.cu").read_text(), name, include_dirs=(folder,))


def test_every_fitted_constant_says_what_it_is_and_where_it_came_from():
    from tvm_dsm.calibration import calibration

    constants = calibration()
    assert len(constants) >= 15
    for key, entry in constants.items():
        assert isinstance(entry["value"], float) and entry["value"] > 0, key
        assert entry["what"] and entry["source"], key
