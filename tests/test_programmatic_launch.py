"""Programmatic dependent launch: the unfused chain's kernels wait for the previous grid before
touching global memory and request the launch attribute; other schedules are left alone."""

from __future__ import annotations

import tvm
from tvm import s_tir

from conftest import TARGET, cuda_source, kernels
from tvm_dsm import pipeline
from tvm_dsm.rules.split_k_gemm import SplitKGemmConfig, schedule_split_k_gemm
from tvm_dsm.rules.unfused_chain import UnfusedChainConfig, schedule_unfused_chain
from tvm_dsm.transform.programmatic_launch import (PDL_LAUNCH_TAG, PROGRAMMATIC_LAUNCH_KEY,
                                                   launch_programmatically)
from tvm_dsm.workloads.chains import gemm_chain
from tvm_dsm.workloads.dense import dense

FIRST = SplitKGemmConfig(2, 64, 128, 64, 2, 4, 4, tma=True)
SECOND = SplitKGemmConfig(4, 64, 64, 64, 2, 2, 3, tma=True)
WAIT, LAUNCH = "tvm_builtin_ptx_griddepcontrol_wait();", "tvm_builtin_ptx_griddepcontrol_launch_dependents();"


def _launch_params(mod: tvm.IRModule) -> dict[str, list[str]]:
    """Each device kernel's launch parameters after the tvm-dsm pipeline's host/device split."""
    lower, _, _ = pipeline.dsm_pipeline()
    lowered = lower(tvm.tirx.transform.BindTarget(tvm.target.Target(TARGET))(mod))
    return {gv.name_hint: list(f.attrs["tirx.kernel_launch_params"]) for gv, f in lowered.functions.items()
            if f.attrs is not None and "tirx.kernel_launch_params" in f.attrs and gv.name_hint != "main"}


def test_unfused_chain_kernels_wait_for_the_previous_grid_first():
    sch = schedule_unfused_chain(gemm_chain(128, 1024, 768, 256), UnfusedChainConfig(FIRST, SECOND))
    assert any(PROGRAMMATIC_LAUNCH_KEY in line for line in sch.trace.as_python())  # replayable
    bodies = list(kernels(cuda_source(sch.mod)).values())
    assert len(bodies) == 2
    for body in bodies:
        statements = body[body.index("{") + 1:].split()
        assert statements[:2] == [WAIT, LAUNCH]  # before any load or store
        assert body.count(WAIT) == 1 and body.count(LAUNCH) == 1
    params = _launch_params(sch.mod)
    assert len(params) == 2 and all(PDL_LAUNCH_TAG in p for p in params.values())
    assert all(p[-1] == "tirx.use_dyn_shared_memory" for p in params.values())  # TVM: last


def test_other_schedules_launch_as_usual():
    sch = schedule_split_k_gemm(dense(128, 1024, 1024), FIRST)
    assert "griddepcontrol" not in cuda_source(sch.mod)
    assert all(PDL_LAUNCH_TAG not in p for p in _launch_params(sch.mod).values())
    chain = schedule_unfused_chain(gemm_chain(128, 1024, 768, 256), UnfusedChainConfig(FIRST, SECOND))
    launch_programmatically(chain, enable=False)
    assert "griddepcontrol" not in cuda_source(chain.mod)
    launch_programmatically(sch)
    assert cuda_source(s_tir.Schedule(sch.mod).mod).count(WAIT) == 1


def test_planner_launches_one_wave_gemms_programmatically():
    """One-wave grids gained 0.3-1.4 us on the H100, grids of several waves lost (4096^3:
    197 -> 229 us), so the planner sets the flag by its wave count; it is no part of the
    configuration's identity (sweeps and databases match the planner's points)."""
    import dataclasses

    from tvm_dsm.hardware import load_hardware
    from tvm_dsm.planners.split_k_gemm import plan_split_k_gemm
    from tvm_dsm.rules.split_k_gemm import GemmShape

    hw = load_hardware()
    one_wave = plan_split_k_gemm(GemmShape(128, 3072, 768, True), hw)[0]
    waves = plan_split_k_gemm(GemmShape(4096, 4096, 4096, True), hw)[0]
    assert one_wave.config.programmatic_launch and not waves.config.programmatic_launch
    assert dataclasses.replace(one_wave.config, programmatic_launch=False) == one_wave.config
    source = cuda_source(schedule_split_k_gemm(dense(128, 3072, 768), one_wave.config).mod)
    assert source.count(WAIT) == 1


def test_a_kernel_that_is_the_whole_function_waits_too():
    """A fused-rows kernel (decode attention) is the root block's whole body: the marker's body
    is the kernel launch itself, which must still get the prologue."""
    from tvm_dsm.rules.fused_rows import schedule_fused_rows
    from tvm_dsm.transform.cascaded_reductions import fuse_cascaded_reductions
    from tvm_dsm.workloads.cascades import decode_attention

    fused, _ = fuse_cascaded_reductions(decode_attention(64, 1024, 64), parts=16, vector=4, lanes=8,
                                        ranks=2, shuffle=True)
    sch = schedule_fused_rows(fused)
    launch_programmatically(sch)
    (body,) = kernels(cuda_source(sch.mod)).values()
    assert body[body.index("{") + 1:].split()[:2] == [WAIT, LAUNCH]
    assert all(PDL_LAUNCH_TAG in p for p in _launch_params(sch.mod).values())
