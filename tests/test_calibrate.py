"""tvm_dsm.bench.calibrate and the per-GPU constants: a fit finds the constant that orders a
pool as measured, the committed H200 fit is what this code computes, and a GPU's plans use its
own constants."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from tvm_dsm.bench import calibrate
from tvm_dsm.bench.results import L2_ROTATED
from tvm_dsm.hardware import description_for, load_hardware, refitted
from tvm_dsm.planners.split_k_gemm import plan_split_k_gemm, predict
from tvm_dsm.rules.split_k_gemm import GemmShape

RESULTS = Path(__file__).parent.parent / "bench" / "results" / "calibration" / "h200_sxm.json"


def _pool(name: str, shape: GemmShape, timed_by, top: int = 24) -> calibrate.Pool:
    """``shape``'s first ``top`` plans on the H100, each "measured" as ``timed_by`` predicts it."""
    configs = [p.config for p in plan_split_k_gemm(shape, load_hardware("h100_sxm"))[:top]]
    return calibrate.Pool(name, shape, tuple((c, predict(shape, c, timed_by).predicted_us) for c in configs))


def test_a_fit_recovers_the_constant_that_ordered_the_measurements():
    """Pools "measured" by the model with a quarter of the per-step overhead and three times the
    TMA latency: the unfitted model's picks are off, the fitted one picks their fastest."""
    hw = load_hardware("h100_sxm")
    truth = refitted(hw, **{"gemm.step_s": hw.fitted("gemm.step_s") * 0.25,
                            "gemm.tma_loaded_latency_s": hw.fitted("gemm.tma_loaded_latency_s") * 3})
    pools = [_pool(f"dense_{m}x{n}x{k}", GemmShape(m, n, k, True), truth)
             for m, n, k in ((16, 8192, 8192), (64, 10240, 8192), (128, 4608, 3584), (1024, 1152, 896))]
    assert calibrate.geomean_share(pools, hw) > 1.01
    fitted = calibrate.fit(pools, hw)
    assert calibrate.geomean_share(pools, fitted) == pytest.approx(1.0)
    assert all(calibrate.pick_share(p, fitted) == pytest.approx(1.0) for p in pools)


@pytest.mark.slow
def test_the_committed_h200_fit_is_what_this_code_computes():
    """``python -m tvm_dsm.bench.calibrate --write`` fitted the committed H200 constants and
    wrote these shares: a model changed since plans by constants fitted to another (refit it)."""
    results = json.loads(RESULTS.read_text())
    hw = load_hardware("h200_sxm")
    for key, values in results["constants"].items():
        assert hw.fitted(key) == pytest.approx(values["after"]), key
    rows = {(r["name"], r["source"]): r for r in results["rows"]}
    files = sorted({folder / source for _, source in rows if "+" not in source
                    for folder in (RESULTS.parents[1] / "search_quality", RESULTS.parent, RESULTS.parents[1] / "archive")})
    across = sorted({RESULTS.parents[1] / "archive" / run for _, source in rows if "+" in source
                     for run in source.split("+")})
    pools = {(p.workload, p.source): p for p in calibrate.pools([f for f in files if f.exists()], hw, across)}
    assert set(pools) == set(rows)
    for key in sorted(rows)[::7]:
        assert calibrate.pick_share(pools[key], hw) == pytest.approx(rows[key]["share_after"], abs=1e-3), key
    assert results["summary"]["share_after"] < results["summary"]["share_before"]


def test_each_gpu_plans_with_its_own_constants():
    h100, h200 = load_hardware("h100_sxm"), load_hardware("h200_sxm")
    assert description_for(h100.device) == "h100_sxm" and description_for(h200.device) == "h200_sxm"
    assert h200.fitted("gemm.step_s") != h100.fitted("gemm.step_s")
    shape = GemmShape(64, 10240, 8192, True)
    config = plan_split_k_gemm(shape, h100)[0].config
    assert predict(shape, config, h100).predicted_us != predict(shape, config, h200).predicted_us
    with pytest.raises(KeyError, match="no fitted constants"):
        refitted(h100, **{"gemm.no_such_constant": 1.0})


def test_only_kernels_timed_from_hbm_are_fitted():
    """MetaSchedule's runner repeats a kernel on the same buffers: a layer whose operands fit
    the L2 is timed from it there, and is left out; one past twice the L2 is kept, as is every
    kernel of a run that rotated its inputs past L2."""
    hw = load_hardware("h200_sxm")
    folder = RESULTS.parents[1] / "search_quality"
    small = {p.workload for p in calibrate.pools([folder / "pools_dense_decode_m16.json"], hw)}
    large = {p.workload for p in calibrate.pools([folder / "pools_dense_m64_256.json"], hw)}
    rotated = calibrate.pools([RESULTS.parent / "dense_candidates_h200.json"], hw)
    assert not small and "dense_10240x8192_m64" in large and "dense_3072x2048_m256" not in large
    assert any(p.shape.m * p.shape.n * p.shape.k < 2 ** 30 for p in rotated)


def test_tvm_dsm_gpu_names_the_gpu_planned_for(monkeypatch):
    """A machine without the GPU plans for it by name (the default: the GPU present, else the
    H100)."""
    from tvm_dsm import hardware

    monkeypatch.setenv(hardware.GPU_VARIABLE, "h200_sxm")
    hardware.forget_planned_gpu()
    try:
        assert hardware.gpu_name() == "h200_sxm" and load_hardware().device == "NVIDIA H200"
        monkeypatch.setenv(hardware.GPU_VARIABLE, "no_such_gpu")
        hardware.forget_planned_gpu()
        with pytest.raises(FileNotFoundError, match="no hardware description"):
            load_hardware()
    finally:
        monkeypatch.undo()
        hardware.forget_planned_gpu()


def test_runs_of_one_plan_a_layer_pool_over_the_runs(tmp_path):
    """``--across``: each run of a suite holds one plan of a layer; pooled over the runs, a
    layer's distinct plans form one pool, a plan measured in two runs counts with its mean, and a
    layer every run planned alike forms none."""
    hw = load_hardware("h200_sxm")
    first, second = (p.config for p in plan_split_k_gemm(GemmShape(256, 4096, 4096, True), hw)[:2])

    def run(path: str, plans: list[tuple[int, object, float]]) -> Path:
        rows = [{"name": f"dense_4096x4096_m{m}", "ok": True, "ours_us": us, "m": m, "n": 4096, "k": 4096,
                 "plan": {"family": "split_k_gemm", **dataclasses.asdict(config)}} for m, config, us in plans]
        (tmp_path / path).write_text(json.dumps({"device": hw.device, "timing": L2_ROTATED, "rows": rows}))
        return tmp_path / path

    runs = [run("a.json", [(256, first, 30.0), (512, first, 50.0)]),
            run("b.json", [(256, second, 20.0), (512, first, 52.0)]),
            run("c.json", [(256, first, 34.0)])]
    assert calibrate.pools(runs, hw) == []  # one plan a layer in each run
    pooled = calibrate.pools([], hw, runs)
    assert [p.workload for p in pooled] == ["dense_4096x4096_m256"]
    assert sorted(pooled[0].measured, key=lambda m: m[1]) == [(second, 20.0), (first, 32.0)]
    assert pooled[0].source == "a.json+b.json+c.json"


def test_a_pool_says_whether_it_measured_the_models_first_plan():
    """A fit is judged among the plans a pool measured; where the model's first plan over the
    whole space is not among them, the pool cannot say how fast the pick runs."""
    hw = load_hardware("h200_sxm")
    shape = GemmShape(16, 8192, 28672, True)
    first, second, third = (p.config for p in plan_split_k_gemm(shape, hw, padded=True)[:3])
    assert calibrate.first_plan_measured(calibrate.Pool("w", shape, ((second, 2.0), (first, 1.0))), hw)
    assert not calibrate.first_plan_measured(calibrate.Pool("w", shape, ((second, 2.0), (third, 1.0))), hw)
