"""Programmatic dependent launch: the unfused chain's kernels wait for the previous grid before
touching global memory (a dependent kernel may first warm L2 with a small weight no earlier
kernel touches) and request the launch attribute; other schedules are left alone."""

from __future__ import annotations

import re

import pytest
import tvm
from tvm import s_tir
from tvm.script import tirx as T

from conftest import TARGET, cuda_source, kernels
from tvm_dsm import pipeline
from tvm_dsm.hardware import load_hardware
from tvm_dsm.rules.split_k_gemm import GemmShape, SplitKGemmConfig, schedule_split_k_gemm
from tvm_dsm.rules.unfused_chain import UnfusedChainConfig, schedule_unfused_chain
from tvm_dsm.transform.programmatic_launch import L2_PREFETCH_KEY, launch_programmatically, programmatic_launch
from tvm_dsm.annotations import LAUNCH_EARLY_KEY, PDL_LAUNCH_TAG, PROGRAMMATIC_LAUNCH_KEY, PROGRAMMATIC_WAIT_KEY
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
    sch = schedule_unfused_chain(gemm_chain(128, 1024, 768, 256), UnfusedChainConfig(FIRST, SECOND), load_hardware())
    assert any(PROGRAMMATIC_LAUNCH_KEY in line for line in sch.trace.as_python())  # replayable
    first, second = kernels(cuda_source(sch.mod)).values()
    assert first[first.index("{") + 1:].split()[:2] == [WAIT, LAUNCH]  # before any load or store
    # The second kernel first warms L2 with its tiles of W2 (a parameter the first kernel does
    # not touch), then waits before its first load of H (the first kernel's output).
    before, after = second.split(WAIT)
    assert after.split()[0] == LAUNCH
    assert "prefetch_tensor_2d_L2_global_tile(((void*)((unsigned long long)(&(W2_tensormap))))" in before
    signature, prologue = before.split("{", 1)
    pointers = re.findall(r"\b(\w+_ptr)\b", signature)
    assert pointers and not any(p in prologue for p in pointers)
    # H is named before the wait only to prefetch its tensor map (the kernel's parameter)
    h_map = "tvm_builtin_ptx_prefetch_tensormap(((void*)((unsigned long long)(&(H_tensormap)))));"
    assert prologue.count(h_map) == 1 and "H_tensormap" not in prologue.replace(h_map, "")
    assert "prefetch_tensor_2d" not in first + after  # L2 prefetches only before the wait
    assert "prefetch_tensormap(((void*)((unsigned long long)(&(W1_tensormap)))));" in first
    for body in (first, second):
        assert body.count(WAIT) == 1 and body.count(LAUNCH) == 1
    params = _launch_params(sch.mod)
    assert len(params) == 2 and all(PDL_LAUNCH_TAG in p for p in params.values())
    assert all(p[-1] == "tirx.use_dyn_shared_memory" for p in params.values())  # TVM: last


def test_other_schedules_launch_as_usual():
    sch = schedule_split_k_gemm(dense(128, 1024, 1024), FIRST, load_hardware())
    assert "griddepcontrol" not in cuda_source(sch.mod)
    assert all(PDL_LAUNCH_TAG not in p for p in _launch_params(sch.mod).values())
    chain = schedule_unfused_chain(gemm_chain(128, 1024, 768, 256), UnfusedChainConfig(FIRST, SECOND), load_hardware())
    launch_programmatically(chain, enable=False)
    assert "griddepcontrol" not in cuda_source(chain.mod)
    launch_programmatically(sch)
    assert cuda_source(s_tir.Schedule(sch.mod).mod).count(WAIT) == 1


def test_planner_launches_one_wave_gemms_programmatically():
    """One-wave grids gained 0.3-1.4 us on the H100, grids of several waves lost (4096^3:
    197 -> 229 us), so the planner sets the flag by its wave count; it is no part of the
    configuration's identity (sweeps and databases match the planner's points)."""
    import dataclasses

    from tvm_dsm.planners.split_k_gemm import plan_split_k_gemm
    from tvm_dsm.rules.split_k_gemm import GemmShape

    hw = load_hardware()
    one_wave = plan_split_k_gemm(GemmShape(128, 3072, 768, True), hw)[0]
    waves = plan_split_k_gemm(GemmShape(4096, 4096, 4096, True), hw)[0]
    assert one_wave.config.programmatic_launch and not waves.config.programmatic_launch
    assert dataclasses.replace(one_wave.config, programmatic_launch=False) == one_wave.config
    source = cuda_source(schedule_split_k_gemm(dense(128, 3072, 768), one_wave.config, load_hardware()).mod)
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


def _warmed_and_copied_early(func) -> tuple[list, list]:
    """Per kernel of ``func``'s unfused chain: the tensor maps it prefetches into L2, and those
    whose first tiles it copies, before it waits for the previous grid."""
    gemm = SplitKGemmConfig(2, 64, 64, 64, 2, 2, 3, tma=True)
    sch = schedule_unfused_chain(func, UnfusedChainConfig(gemm, SECOND), load_hardware())
    before = [body.split(WAIT)[0] for body in kernels(cuda_source(sch.mod)).values()]
    assert len(before) == 2
    warmed = [re.findall(r"prefetch_tensor_2d_L2_global_tile\(\(\(void\*\)\(\(unsigned long long\)\(&\((\w+)\)", b)
              for b in before]
    return warmed, [_copied(b) for b in before]


def test_a_dependent_kernel_prefetches_only_what_no_earlier_kernel_touches(monkeypatch):
    """With the prefetch budget lifted, the down kernel of a gated chain warms its weight W2 and
    copies its first tiles before the wait, but not H's (written by the kernel before it); the
    first kernel warms nothing. A parameter an earlier kernel names may be that kernel's output,
    so a chain whose GEMMs share one weight W leaves it to after the wait."""
    from tvm import te

    from tvm_dsm.transform import tma_pipeline
    from tvm_dsm.workloads.chains import swiglu_ffn

    monkeypatch.setattr(tma_pipeline, "PREFETCH_WINDOW_S", 1.0)
    assert _warmed_and_copied_early(swiglu_ffn(128, 768, 512, 256)) == ([[], ["W2_tensormap"]],
                                                                        [set(), {"W2_tensormap"}])
    a = te.placeholder((128, 1024), "float16", name="A")
    w = te.placeholder((1024, 1024), "float16", name="W")
    k0, k1 = te.reduce_axis((0, 1024)), te.reduce_axis((0, 1024))
    c = te.compute((128, 1024), lambda i, j: te.sum(a[i, k0].astype("float32") * w[j, k0].astype("float32"), axis=k0))
    h = te.compute((128, 1024), lambda i, j: te.max(c[i, j], 0.0).astype("float16"), name="H")
    e = te.compute((128, 1024), lambda i, j: te.sum(h[i, k1].astype("float32") * w[j, k1].astype("float32"), axis=k1))
    out = te.compute((128, 1024), lambda i, j: e[i, j].astype("float16"))
    assert _warmed_and_copied_early(te.create_prim_func([a, w, out])) == ([[], []], [set(), set()])


def _copied(code: str) -> set[str]:
    """The tensor maps that TMA tile copies in ``code`` read."""
    return set(re.findall(r"complete_tx__bytes\([^;]*?\(&\((\w+_tensormap)\)\)", code))


def test_weights_past_the_prefetch_window_are_not_prefetched():
    """The FP8 GEMM's 16 MB weight behind its quantization kernel: prefetched, it measured
    0.79-0.91x (bench/results/chains_l2_prefetch_ab.json)."""
    from tvm_dsm.planners.split_k_gemm import plan_split_k_gemm
    from tvm_dsm.rules.quantized_gemm import schedule_quantize_then_gemm
    from tvm_dsm.rules.split_k_gemm import GemmShape
    from tvm_dsm.workloads.dense import quantized_dense

    config = plan_split_k_gemm(GemmShape(128, 4096, 4096, True, "float8_e4m3fn"), load_hardware())[0].config
    source = cuda_source(schedule_quantize_then_gemm(quantized_dense(128, 4096, 4096), config, load_hardware()).mod)
    assert source.count(WAIT) == 2 and "prefetch_tensor_2d" not in source  # (descriptors only)
    # Its first pipeline steps' weight tiles still load into shared memory before the GEMM
    # waits for the quantization (all bytes announced first); the quantized X's after.
    _, gemm = kernels(source).values()
    before, after = gemm.split(WAIT)
    assert _copied(before) == {"Wq_tensormap"} and _copied(after) == {"Wq_tensormap", "Xq_tensormap"}
    assert before.index("expect_tx") < before.index("mbarrier__complete_tx__bytes(")  # the first copy


def _wgmma(cluster: int, rows: int, cols: int, stages: int) -> SplitKGemmConfig:
    return SplitKGemmConfig(cluster, rows, cols, 64, rows // 16, 1, stages, tma=True, wgmma=True)


def test_a_grid_that_would_crowd_the_previous_kernels_idle_sms_is_launched_after_it():
    """S3 at M = 128: the gated kernel's 86 CTAs leave 46 SMs idle; launched programmatically,
    46 of the down projection's 64 CTAs (128x256 tiles) take them at once and the chain ran 126.5
    us against 115.1 launched after it; with 128 CTAs (128x64 tiles) 46 is less than half
    and the programmatic launch saves 0.8 us; a grid the idle SMs take whole is not crowded (bench/results/chains_programmatic_ab.json)."""
    import tvm_dsm
    from tvm_dsm.planners.split_k_gemm import predict
    from tvm_dsm.planners.unfused_chain import combine, crowded
    from tvm_dsm.rules.fused_chain import find_chain
    from tvm_dsm.rules.unfused_chain import gemm_shapes
    from tvm_dsm.workloads.chains import swiglu_ffn

    hw = load_hardware()
    func = swiglu_ffn(128, 11008, 4096, 4096)
    shape = find_chain(s_tir.Schedule(func))[1]
    first, second = gemm_shapes(shape)
    gated = predict(first, _wgmma(1, 128, 128, 4), hw)
    assert (gated.ctas, gated.resident) == (86, 1)
    wide, narrow = predict(second, _wgmma(4, 128, 256, 4), hw), predict(second, _wgmma(2, 128, 64, 6), hw)
    assert (wide.ctas, narrow.ctas) == (64, 128)
    assert crowded(gated, wide, hw) and not crowded(gated, narrow, hw)
    small = predict(GemmShape(128, 1024, 11008, True), _wgmma(4, 128, 128, 4), hw)  # 32 CTAs
    assert not crowded(gated, small, hw)
    late, early = combine(shape, gated, wide, hw), combine(shape, gated, narrow, hw)
    assert not late.config.programmatic_launch and early.config.programmatic_launch
    # Each kernel's prediction holds its own launch: launched late, the chain is their sum.
    assert late.predicted_us == pytest.approx(gated.predicted_us + wide.predicted_us)
    # the planner's pick: the down projection on 128 CTAs (128x64 tiles, clusters of 2),
    # launched programmatically (107.4 us against 114.4 for the 64-CTA one launched after,
    # bench/results/gemm_tile_l2_ab.json)
    config = tvm_dsm.plan(func).best.config
    assert isinstance(config, UnfusedChainConfig) and config.programmatic_launch
    assert (config.gemm1.cluster_size, config.gemm1.block_n) == (2, 64)
    source = cuda_source(schedule_unfused_chain(func, config, load_hardware()).mod)
    assert "griddepcontrol" in source


@pytest.mark.parametrize("read_only", [[], ["W"]], ids=["unmarked", "weight_read_only"])
def test_a_first_kernel_copies_early_only_parameters_no_kernel_writes(read_only):
    """A decode GEMV launched programmatically: where its function names W as read-only (a
    model's weight, tvm_dsm.relax_pipeline), its first pipeline steps' W tiles load before it
    waits for the previous grid; X (the previous kernel's output) only after it."""
    from tvm_dsm.annotations import READ_ONLY_PARAMS_KEY

    func = dense(16, 3072, 2048)
    if read_only:
        func = func.with_attr(READ_ONLY_PARAMS_KEY, read_only)
    config = SplitKGemmConfig(1, 16, 64, 64, 1, 2, 3, tma=True, programmatic_launch=True)
    (body,) = kernels(cuda_source(schedule_split_k_gemm(func, config, load_hardware()).mod)).values()
    before, after = body.split(WAIT)
    assert _copied(before) == ({"W_tensormap"} if read_only else set())
    assert "X_tensormap" in _copied(after)


def test_a_function_asked_to_launch_early_is_launched_programmatically_whatever_its_schedule():
    """``LAUNCH_EARLY_KEY`` on a function dlight or another family scheduled (a norm before a
    decode GEMV): each kernel waits for the previous grid before anything else, then lets the
    next launch, and requests the launch attribute."""
    from tvm_dsm.annotations import LAUNCH_EARLY_KEY
    from tvm_dsm.driver import schedule
    from tvm_dsm.workloads.norms import topi_norm

    func = schedule(topi_norm("rms_norm", 4, 2048, "float16")).mod["main"]
    plain = tvm.IRModule({"main": func})
    early = tvm.IRModule({"main": func.with_attr(LAUNCH_EARLY_KEY, True)})
    bodies = kernels(cuda_source(early)).values()
    assert len(bodies) == len(kernels(cuda_source(plain))) >= 1
    for body in bodies:
        assert body[body.index("{") + 1:].split()[:2] == [WAIT, LAUNCH]
    assert all(PDL_LAUNCH_TAG in p for p in _launch_params(early).values())
    assert not any(PDL_LAUNCH_TAG in p for p in _launch_params(plain).values())


def _biased_layer_source(m: int, n: int, k: int) -> str:
    """The CUDA of ``silu(x @ W.T + bias)`` as a model's function gets it: launched early, its
    weight and bias named read-only."""
    from tvm_dsm.annotations import LAUNCH_EARLY_KEY, READ_ONLY_PARAMS_KEY
    from tvm_dsm.driver import schedule

    func = dense(m, n, k, bias=True, activation="silu")
    func = func.with_attrs({LAUNCH_EARLY_KEY: True, READ_ONLY_PARAMS_KEY: ["W", "bias"]})
    return cuda_source(schedule(func).mod)


def test_a_grid_of_several_waves_does_not_prefetch_its_weight_again_and_again():
    """A 1.5 MB weight fits the prefetch window: at 128 rows (one wave) it is prefetched; at
    6304 rows (600 CTAs) each CTA of a later wave would prefetch its panel again (ViT-B/16's
    qkv: 15% slower, bench/results/archive/launch_early_gemms_before_s74.json), so it is not,
    and its first tiles still load before the wait."""
    assert "prefetch_tensor_2d_L2_global_tile" in _biased_layer_source(128, 1024, 768)
    many = _biased_layer_source(6304, 1024, 768)
    before = many.split("main_kernel(")[-1].split(WAIT)[0]
    assert "prefetch_tensor_2d" not in many and re.search(r"g2s\w*\(.*&\(W_tensormap\)", before)


def test_an_epilogue_reading_a_bias_is_unrolled():
    """The bias loads of a CTA without peers are issued together, not one L2 round trip per
    iteration of a loop (6304 x 2304 x 768 at 128 x 192 tiles: 24 a thread)."""
    (gemm,) = kernels(_biased_layer_source(6304, 2304, 768)).values()
    epilogue = gemm.split("griddepcontrol_wait")[-1]
    assert epilogue.count("bias_ptr +") >= 8


@T.prim_func
def _marked_wait(w: T.Buffer((1024,), "float16"), out: T.Buffer((1024,), "float16")):
    bx = T.launch_thread("blockIdx.x", 8)
    tx = T.launch_thread("threadIdx.x", 128)
    with T.attr(w, L2_PREFETCH_KEY, 0):
        T.evaluate(T.ptx["cp.async.bulk.prefetch.L2.global"](w.access_ptr("r"), T.uint32(2048)))
    with T.attr("k", PROGRAMMATIC_WAIT_KEY, 0):
        out[bx * 128 + tx] = w[bx * 128 + tx]


def test_a_kernel_that_marks_its_wait_waits_there_once_and_keeps_no_framework_prefetch():
    """Launched early, the wait (and the trigger) replace the mark, once; an L2 prefetch the
    framework marked is dropped (the kernel's own statements before its wait are its own
    guarantee); launched plainly, the mark goes and nothing waits."""
    early = programmatic_launch(_marked_wait.with_attr(LAUNCH_EARLY_KEY, True))
    script = early.script()
    assert script.count('griddepcontrol("wait"') == 1 and script.count('griddepcontrol("launch_dependents"') == 1
    assert "prefetch" not in script and PROGRAMMATIC_WAIT_KEY not in script and L2_PREFETCH_KEY not in script
    assert script.index('griddepcontrol("wait"') < script.index("out[")
    plain = programmatic_launch(_marked_wait).script()
    assert "griddepcontrol" not in plain and PROGRAMMATIC_WAIT_KEY not in plain
