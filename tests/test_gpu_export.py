"""The export to the GPU machine (tvm_dsm.gpu.export) names the GPU its kernels were planned for,
and the device runner (tvm_dsm.gpu.run) refuses them on another."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tvm_dsm.gpu import export
from tvm_dsm.hardware import GPU_VARIABLE, check_planned_for, forget_planned_gpu, load_hardware

RUNNER = Path(export.__file__).with_name("run.py")


@pytest.fixture
def planned_gpu(monkeypatch):
    """The GPU planned for, reset around the test (``gpu_name`` and ``load_hardware`` cache it)."""
    monkeypatch.delenv(GPU_VARIABLE, raising=False)
    forget_planned_gpu()
    yield
    forget_planned_gpu()


def test_export_plans_for_the_gpu_named_and_says_so(tmp_path, monkeypatch, planned_gpu):
    seen = []
    monkeypatch.setitem(export.SUITES, "probe", lambda: seen.append(load_hardware().device) or [])
    for name, device in (("h200_sxm", "NVIDIA H200"), ("h100_sxm", "NVIDIA H100 80GB HBM3")):
        export.main(["probe", "--out", str(tmp_path / name), "--gpu", name])
        assert json.loads((tmp_path / name / "probe" / "manifest.json").read_text())["planned_for"] == name
        assert seen[-1] == device
    with pytest.raises(SystemExit):
        export.main(["probe", "--out", str(tmp_path), "--gpu", "h300"])  # no such description


def test_the_runner_refuses_kernels_planned_for_another_gpu():
    """An H200 user's build plans for the H200: kernels planned for the H100 do not time what
    they get. A manifest naming no GPU (older exports) passes."""
    h100 = {"suite": "s", "planned_for": "h100_sxm"}
    check_planned_for(h100, "NVIDIA H100 80GB HBM3")
    with pytest.raises(SystemExit, match="planned for h100_sxm, this GPU is NVIDIA H200 .h200_sxm.: export them "
                                         "with --gpu h200_sxm"):
        check_planned_for(h100, "NVIDIA H200")
    check_planned_for({**h100, "planned_for": None}, "NVIDIA H200")
    runner = ast.parse(RUNNER.read_text())
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "check_planned_for" for n in ast.walk(runner))


def test_the_runner_imports_nothing_that_needs_the_compiler():
    """The runner runs under runtime-only TVM (``../shared/gpu``): no module of its that imports
    the compiler (the suites and the export build kernels with tvm.relax and tvm.s_tir)."""
    imported = {n.module for n in ast.walk(ast.parse(RUNNER.read_text())) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"export", "suites", ".export", ".suites"}, imported
