"""Fused GEMM chains (FlashFuser): pattern, generated CUDA, planner, errors."""

from __future__ import annotations

import dataclasses
import re
import time

import ml_dtypes
import numpy as np
import pytest
from tvm import s_tir

from conftest import LLVM, TARGET, chain_error_on_gpu, cuda_source
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners.fused_chain import candidate_configs, plan_chain, schedule_chain
from tvm_dsm.rules.fused_chain import FusedChainConfig, find_chain, schedule_fused_chain
from tvm_dsm.workloads.chains import gemm_chain, swiglu_ffn
from tvm_dsm.workloads.dense import dense

SMALL = FusedChainConfig(cluster_size=2, block_m=128, block_n=64, n_steps=2, block_k=32)
LAST_CTA, GATHERED = (dataclasses.replace(SMALL, reduce=r) for r in ("last_cta", "gathered"))


@pytest.mark.parametrize("reduce", ["kernel", "last_cta", "gathered"])
def test_fused_chain_cuda_has_both_gemms_the_all_exchange_and_the_reduce(assemble, reduce):
    config = dataclasses.replace(SMALL, reduce=reduce)
    source = cuda_source(schedule_fused_chain(gemm_chain(128, 512, 256, 256, "gelu"), config, load_hardware()).mod)
    # The fused kernel (declared and defined), and the inter-cluster reduce in a kernel of its
    # own, or in the fused kernel by the last of each output tile's 4 column groups' CTAs to
    # finish (512 / (64 x 2 steps)), or by all 4 once they have arrived, each its share; a
    # counter per tile (128 / 128 rows x 2 ranks).
    assert source.count("__global__") == (4 if reduce == "kernel" else 2)
    assert (len(re.findall(r"if \(tvm_dsm_last_main[0-9a-f]{8}r1_2\([^;]*, 4\)\) \{", source)) == 1) == (reduce == "last_cta")
    if reduce == "gathered":
        gathered = source[re.search(r"tvm_dsm_gather_main[0-9a-f]{8}r1_2\(\(\(\(int\)blockIdx.x\) & 1\), 4\);", source).start():]
        assert gathered.index("E_rf_ptr") < re.search(r"tvm_dsm_leave_main[0-9a-f]{8}r1_2\(", gathered).start()
    assert source.count("mma.sync.aligned.m16n8k16") >= 2  # GEMM0 and GEMM1 on tensor cores
    for needle in ("ldmatrix", "cp.async.cg.shared.global", "mapa.shared::cluster",
                   "ld.shared::cluster.v4.f32", "erff"):
        assert needle in source, needle
    # Both fp32 accumulators are per-lane registers (TVM alone lowers only the first one; the
    # second then reads uninitialized registers, measured wrong on the H100).
    accumulators = re.findall(r"float (\w+_rf_warp_ptr)\[(\d+)\]", source)
    assert len(accumulators) == 2 and all(int(n) <= 128 for _, n in accumulators), accumulators
    # Barriers inside the step loop: before the all-exchange and before the next step's writes.
    step_loop = source[source.index("for (int k_E_1_0"):]
    assert step_loop.count("cluster_sync()") >= 2
    assemble(source, "fused_chain")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_swiglu_runs_gate_and_up_and_combines_them(assemble, dtype):
    source = cuda_source(schedule_fused_chain(swiglu_ffn(128, 512, 256, 256, dtype), SMALL, load_hardware()).mod)
    assert "Wg_ptr, " in source and "Wu_ptr, " in source  # both cp.async main loops
    assert "expf" in source  # silu(gate)
    # GEMM0's and GEMM1's products both on operands of the function's type
    assert source.count(f"mma.sync.aligned.m16n8k16.row.col.f32.{'bf16' if dtype == 'bfloat16' else 'f16'}") >= 2
    assemble(source, f"fused_swiglu_{dtype}")


def test_tma_chain_streams_gemm0_by_tensor_copies_and_keeps_w2_staged(assemble):
    config = FusedChainConfig(2, 32, 32, 1, 64, 2, 2, 3, tma=True)
    source = cuda_source(schedule_fused_chain(swiglu_ffn(128, 3072, 768, 768), config, load_hardware()).mod)
    # A, Wg and Wu arrive as tensor maps, three tiles per stage on one mbarrier; W2 stays a
    # plain pointer staged once per step, and GEMM0 issues no cp.async.
    for name in ("A", "Wg", "Wu"):
        assert f"__grid_constant__ CUtensorMap {name}_tensormap" in source, name
    assert "half* __restrict__ W2_ptr" in source
    assert "cp.async.cg.shared.global" not in source
    assert source.count("cp_async_bulk_tensor_g2s") >= 6  # prologue and steady state, 3 tiles
    assemble(source, "fused_swiglu_tma")


def test_a_gathered_reduce_needs_every_cta_resident(assemble):
    """CTAs that wait for each other must all be resident at once (1,024 CTAs are not). A
    dependent grid launched programmatically cannot take their SMs: it launches once every CTA
    has started and triggered it."""
    with pytest.raises(ClusterError, match="1024 CTAs must all be resident at once"):
        schedule_fused_chain(gemm_chain(1024, 2048, 512, 512), FusedChainConfig(2, 64, 64, 1, 32, 2, 2, 3,
                                                                              reduce="gathered"), load_hardware())
    config = FusedChainConfig(2, 32, 32, 1, 16, 1, 2, 1, reduce="gathered", programmatic_launch=True)
    source = cuda_source(schedule_fused_chain(gemm_chain(128, 512, 32, 256), config, load_hardware()).mod)
    assert source.count("tvm_dsm_gather_") == 2 and source.count("tvm_dsm_leave_") == 2  # declared, called
    assert source.index("griddepcontrol_launch_dependents") < source.index("tvm_dsm_gather_main")
    assemble(source, "chain_gathered")


def test_an_in_kernel_reduce_gives_every_thread_whole_vectors():
    """The in-kernel reduce's output stage is not predicated on threads past the last vector of
    4 outputs, so every thread gets as many: G2 at M = 128 has 16-row tiles of 32 columns (128
    vectors, 2 per thread of 64 for the last CTA) in 8 column groups (16 per gathered share,
    fewer than the threads); 66 groups of a 64-vector tile leave some shares none."""
    func, config = gemm_chain(128, 256, 512, 64), FusedChainConfig(2, 16, 32, 1, 64, 1, 2, 3, tma=True)
    with pytest.raises(ClusterError, match="64 threads in each of 8 shares the same number of 4-output vectors: 128"):
        schedule_fused_chain(func, dataclasses.replace(config, reduce="gathered"), load_hardware())
    schedule_fused_chain(func, dataclasses.replace(config, reduce="last_cta"), load_hardware())
    with pytest.raises(ClusterError, match="in each of 66 shares"):
        schedule_fused_chain(gemm_chain(16, 2112, 512, 32), FusedChainConfig(2, 16, 32, 1, 64, 1, 1, 3, reduce="gathered"),
                             load_hardware())


def test_pattern_is_found_in_any_function_of_the_chain_shape():
    blocks, shape = find_chain(s_tir.Schedule(gemm_chain(64, 256, 128, 96, "silu")))
    assert (shape.m, shape.n, shape.k, shape.l, shape.gated) == (64, 256, 128, 96, False)
    assert len(blocks.gemm0) == 1 and len(blocks.epilogue) == 1
    _, shape = find_chain(s_tir.Schedule(swiglu_ffn(64, 256, 128, 96)))
    assert shape.gated and shape.gemm0 == ("G", "U")


def swiglu_ffn_x_times_w(m: int, n: int, k: int, l: int):
    """``(silu(x @ Wg) * (x @ Wu)) @ W2`` with weights stored ``[in, out]``."""
    from tvm import te

    x = te.placeholder((m, k), "float16", name="x")
    wg, wu = (te.placeholder((k, n), "float16", name=name) for name in ("wg", "wu"))
    w2 = te.placeholder((n, l), "float16", name="w2")
    r1, r2, r3 = (te.reduce_axis((0, e), name) for e, name in ((k, "r1"), (k, "r2"), (n, "r3")))
    g = te.compute((m, n), lambda i, j: te.sum(x[i, r1].astype("float32") * wg[r1, j].astype("float32"), axis=r1))
    u = te.compute((m, n), lambda i, j: te.sum(x[i, r2].astype("float32") * wu[r2, j].astype("float32"), axis=r2))
    h = te.compute((m, n), lambda i, j: (g[i, j] * te.sigmoid(g[i, j]) * u[i, j]).astype("float16"))
    e = te.compute((m, l), lambda i, j: te.sum(h[i, r3].astype("float32") * w2[r3, j].astype("float32"), axis=r3))
    return te.create_prim_func([x, wg, wu, w2, te.compute((m, l), lambda i, j: e[i, j].astype("float16"))])


@pytest.mark.parametrize(
    ("func", "config", "message"),
    [
        (dense(128, 256, 512), SMALL, "fused GEMM chain is one or two matmuls"),
        (gemm_chain(128, 512, 4096, 4096), FusedChainConfig(1), "registers per thread"),
        (gemm_chain(128, 512, 256, 256), FusedChainConfig(2, n_steps=3), "not a multiple of 3 steps"),
        (gemm_chain(128, 512, 256, 200), SMALL, "L=200 does not split"),
        (gemm_chain(128, 512, 96, 256), SMALL, "K=96 is not a multiple of 2 CTAs x 32"),
        (gemm_chain(128, 512, 128, 256), SMALL, "CTA's 2 K steps cannot fill a 3-stage pipeline"),
        (gemm_chain(128, 512, 128, 256), FusedChainConfig(2, 128, 64, 2, 32, stages=1),
         "stages=1 .no pipeline. is for a single cp.async K step per CTA; got 2"),
        (gemm_chain(128, 512, 4096, 4096), FusedChainConfig(2), "registers per thread"),
        (gemm_chain(128, 512, 256, 256, dtype="float32"), SMALL, r"one type among .*, got \[.float32.\]"),
        (gemm_chain(128, 512, 256, 256, dtype="float8_e4m3fn"), SMALL, "takes float16 or bfloat16 operands, got float8_e4m3fn"),
        (swiglu_ffn_x_times_w(128, 512, 512, 256), SMALL, r"gated chain over weights stored \[K, N\] is not fused"),
    ],
)
def test_unsupported_inputs_get_clear_errors(func, config, message):
    with pytest.raises(ClusterError, match=message):
        schedule_fused_chain(func, config, load_hardware())


def test_smem_only_fusion_fits_small_chains_only(assemble):
    """Clusters of one CTA (SMEM-only fusion, the ablation's baseline): G4 (L = 768) fits, its
    kernel has no cluster barrier or DSM access; G5 (L = 4096) does not fit any configuration."""
    hw = load_hardware()
    _, g4 = find_chain(s_tir.Schedule(gemm_chain(128, 3072, 768, 768)))
    plans = plan_chain(g4, hw, smem_only=True)
    assert plans and {p.config.cluster_size for p in plans} == {1}
    assert min(p.config.cluster_size for p in plan_chain(g4, hw)) == 2  # the DSM space
    source = cuda_source(schedule_fused_chain(gemm_chain(128, 3072, 768, 768), plans[0].config, load_hardware()).mod)
    assert "barrier.cluster" not in source and "mapa" not in source
    assemble(source, "chain_smem_only")
    _, g5 = find_chain(s_tir.Schedule(gemm_chain(128, 16384, 4096, 4096)))
    with pytest.raises(ClusterError, match="no SMEM-only fused chain .*'capacity': 0"):
        plan_chain(g5, hw, smem_only=True)


def test_a_k_of_one_step_per_cta_is_loaded_without_a_pipeline(assemble):
    """G1 (K = 32): each CTA of a cluster gets one 16-deep K step, which no pipeline overlaps;
    its tiles are copied, synchronized and multiplied. The fused kernel runs in one wave, so
    the inter-cluster reduce is launched programmatically behind it."""
    sch, plan = schedule_chain(gemm_chain(128, 512, 32, 256))
    assert plan.config.stages == 1 and plan.config.programmatic_launch
    assert "launched programmatically" in plan.summary()
    source = cuda_source(sch.mod)
    assert "cp.async" not in source
    assert source.count("griddepcontrol_wait();") == 2  # both kernels wait for the previous grid
    assemble(source, "chain_one_k_step")
    with pytest.raises(ClusterError, match="no fused chain configuration fits M=128 K=24"):
        schedule_chain(gemm_chain(128, 512, 24, 256))  # K not a whole 16-deep fragment


def test_planner_prunes_and_ranks_fast_and_explains():
    import tvm_dsm.planners.fused_chain as planner

    hw = load_hardware()
    _, shape = find_chain(s_tir.Schedule(gemm_chain(128, 16384, 4096, 4096)))  # G5
    planner._PRUNED.clear()  # timed as a first plan of the shape: pruning included
    start = time.perf_counter()
    plans = plan_chain(shape, hw)
    assert time.perf_counter() - start < 5.0
    configs, counts = candidate_configs(shape)
    assert list(counts) == ["space", "cluster", "divisible", "pipeline", "copy", "capacity"]
    assert sorted(counts.values(), reverse=True) == list(counts.values())  # each rule prunes
    assert counts["space"] > counts["capacity"] == len(configs) == len(plans) > 0
    assert [p.predicted_us for p in plans] == sorted(p.predicted_us for p in plans)
    text = plans[0].explain()
    assert "all-exchange" in text and "dsm" in text and "predicted" in text
    # The all-exchange's DSM bytes grow with the square of the cluster.
    by_cluster = {p.config.cluster_size: p.bytes["dsm"] / p.config.cluster_size ** 2 for p in plans}
    assert len(set(by_cluster.values())) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("config", [SMALL, FusedChainConfig(4, 64, 64, 1, 32, 2, 4, 3),
                                    FusedChainConfig(2, 32, 32, 1, 64, 2, 2, 3, tma=True),
                                    FusedChainConfig(2, 32, 32, 1, 16, 1, 2, 1,
                                                     programmatic_launch=True),
                                    LAST_CTA, GATHERED,
                                    FusedChainConfig(2, 32, 32, 1, 16, 1, 2, 1, reduce="gathered")])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_matches_float64(gated, config, dtype):
    m, n, l = 128, 512, 256
    k = 32 if config.stages == 1 else 512  # one K step per CTA: G1's K
    func = swiglu_ffn(m, n, k, l, dtype) if gated else gemm_chain(m, n, k, l, "relu", dtype)
    assert chain_error_on_gpu(func, schedule_fused_chain(func, config, load_hardware()).mod) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("m, n, config", [(128, 512, LAST_CTA), (128, 512, GATHERED),
                                          (1024, 2048, FusedChainConfig(2, 64, 64, 1, 32, 2, 2, 3,
                                                                        reduce="last_cta"))])
def test_gpu_one_launch_outputs_are_bit_identical_call_after_call(gated, m, n, config):
    """Ten calls on the same inputs (the last case: 1,024 CTAs, several waves, 32 column
    groups per output tile arriving in any order) give the same bits, and the float64 answer."""
    import tvm

    k, l = 512, 256
    func = swiglu_ffn(m, n, k, l) if gated else gemm_chain(m, n, k, l, "relu")
    mod = schedule_fused_chain(func, config, load_hardware()).mod
    assert chain_error_on_gpu(func, mod) < 2e-3
    lib, dev = tvm.compile(mod, target=TARGET), tvm.cuda(0)
    rng = np.random.default_rng()
    inputs = [tvm.runtime.tensor((rng.standard_normal(tuple(int(d) for d in p.ty.shape)) * 0.05)
                                 .astype(np.float16), dev) for p in func.params[:-1]]
    outputs = []
    for _ in range(10):
        out = tvm.runtime.tensor(np.full((m, l), np.nan, np.float16), dev)
        lib(*inputs, out)
        outputs.append(out.numpy().view(np.uint16))
    assert all(np.array_equal(outputs[0], o) for o in outputs[1:])


def test_fused_ffn_tutorial_shows_pruning_plan_and_assembled_cuda(capsys):
    from conftest import run_tutorial

    out = run_tutorial("fused_ffn", capsys)
    assert "candidates after each pruning rule" in out and "predicted:" in out
    assert "main_kernel(" in out  # the generated kernel is printed
    assert "nvcc sm_90a: assembles" in out or "skipped (no nvcc)" in out


def test_conv_chain_workload_matches_numpy():
    """FlashFuser's conv chains are defined as a user writes them (NHWC, "same" padding)."""
    import tvm
    from tvm_dsm.workloads.chains import CONV_CHAINS, conv_chain

    assert len(CONV_CHAINS) == 8 and CONV_CHAINS["C5"] == (64, 56, 64, 256, 3, 1)
    batch, ic, hw, oc1, oc2 = 2, 8, 6, 16, 8
    func = conv_chain(ic, hw, oc1, oc2, 3, 1, batch=batch)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, hw, hw, ic)).astype(np.float16)
    w1 = (rng.standard_normal((oc1, 3, 3, ic)) / np.sqrt(9 * ic)).astype(np.float16)
    w2 = (rng.standard_normal((oc2, 1, 1, oc1)) / np.sqrt(oc1)).astype(np.float16)
    out = tvm.runtime.tensor(np.full((batch, hw, hw, oc2), np.nan, np.float16))
    tvm.compile(func, target=LLVM)(*(tvm.runtime.tensor(a) for a in (x, w1, w2)), out)
    padded = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    c1 = sum(np.einsum("nhwc,oc->nhwo", padded[:, r:r + hw, s:s + hw], w1[:, r, s].astype(np.float64))
             for r in range(3) for s in range(3))
    h = np.maximum(c1, 0).astype(np.float16).astype(np.float64)
    ref = np.einsum("nhwc,oc->nhwo", h, w2[:, 0, 0].astype(np.float64))
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3


def test_the_family_ranks_smem_only_fusion_with_the_rest():
    """G1's intermediate fits one CTA: its best fused plan is the one-CTA (SMEM-only) kernel,
    measured 5.0 us against 5.7 for the best DSM cluster (bench/results/chains.json), ranked
    with the DSM clusters and the unfused plans. (The family's pick is now the unfused plan, 5.0
    us measured: bench/results/chains_tie_break_ab.json.)"""
    import tvm_dsm

    plans = tvm_dsm.plan(gemm_chain(128, 512, 32, 256)).plans
    fused = [p.config for p in plans if isinstance(p.config, FusedChainConfig)]
    assert fused[0].cluster_size == 1 and any(c.cluster_size > 1 for c in fused)
    assert len(fused) < len(plans)


def x_times_w_ffn(m: int, n: int, k: int, l: int, dtype: str = "bfloat16"):
    """An FFN written as ``gelu(x @ W1) @ W2`` with weights stored ``[in, out]`` (as a user of
    ``torch.matmul`` stores them), bias on the first product, the cast a block of its own."""
    from tvm import te

    x = te.placeholder((m, k), dtype, name="x")
    w1, b1 = te.placeholder((k, n), dtype, name="w1"), te.placeholder((n,), dtype, name="b1")
    w2 = te.placeholder((n, l), dtype, name="w2")
    r1, r2 = te.reduce_axis((0, k), "r1"), te.reduce_axis((0, n), "r2")
    h = te.compute((m, n), lambda i, j: te.sum(x[i, r1].astype("float32") * w1[r1, j].astype("float32"), axis=r1))
    biased = te.compute((m, n), lambda i, j: h[i, j] + b1[j].astype("float32"))
    act = te.compute((m, n), lambda i, j: (0.5 * biased[i, j] * (1 + te.erf(biased[i, j] * 0.7071067811865476))).astype(dtype))
    out = te.compute((m, l), lambda i, j: te.sum(act[i, r2].astype("float32") * w2[r2, j].astype("float32"), axis=r2))
    return te.create_prim_func([x, w1, b1, w2, te.compute((m, l), lambda i, j: out[i, j].astype(dtype))])


def test_a_chain_whose_epilogue_reshapes_its_output_is_refused_naming_it():
    """A Relax model's last MLP fused with the reshape back to ``[batch, seq, width]`` (the
    model's output, which Relax copies rather than views): the chain's reduce writes ``[M, L]``
    tiles, so the family refuses it (a kernel per operator follows), rather than failing inside
    the schedule."""
    from tvm import te

    m, n, k, l = 128, 512, 256, 256
    x = te.placeholder((m, k), "float16", name="x")
    w1, w2 = te.placeholder((n, k), "float16", name="w1"), te.placeholder((l, n), "float16", name="w2")
    r1, r2 = te.reduce_axis((0, k), "r1"), te.reduce_axis((0, n), "r2")
    h = te.compute((m, n), lambda i, j: te.sum(x[i, r1].astype("float32") * w1[j, r1].astype("float32"), axis=r1))
    act = te.compute((m, n), lambda i, j: te.max(h[i, j], 0.0).astype("float16"))
    e = te.compute((m, l), lambda i, j: te.sum(act[i, r2].astype("float32") * w2[j, r2].astype("float32"), axis=r2),
                   name="E")
    out = te.compute((1, m, l), lambda b, i, j: e[(j // l + i) % m, j % l].astype("float16"), name="T_reshape")
    with pytest.raises(ClusterError, match=r"the epilogue T_reshape reads E\[.*not the element it writes"):
        find_chain(s_tir.Schedule(te.create_prim_func([x, w1, w2, out])))


def test_weights_stored_in_by_out_are_fused_with_transposing_loads(assemble):
    _, shape = find_chain(s_tir.Schedule(x_times_w_ffn(128, 512, 256, 256)))
    assert (shape.w1_nk, shape.w2_nk, shape.dtype) == (False, False, "bfloat16")
    source = cuda_source(schedule_fused_chain(x_times_w_ffn(128, 512, 256, 256), SMALL, load_hardware()).mod)
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in source  # W tiles read [k, n]
    assemble(source, "fused_chain_kn")


@pytest.mark.gpu
@pytest.mark.parametrize("config", [SMALL, FusedChainConfig(4, 64, 64, 1, 32, 2, 4, 3)])
def test_gpu_in_by_out_weights_match_float64(config):
    import math

    from conftest import relative_error_on_gpu

    erf = np.vectorize(math.erf)

    m, n, k, l = 128, 512, 512, 256
    rng = np.random.default_rng()
    x, w1, b1, w2 = (rng.standard_normal(s) / np.sqrt(d) for s, d in
                     (((m, k), 1), ((k, n), k), ((n,), 1), ((n, l), n)))

    def reference(x, w1, b1, w2):
        h = x @ w1 + b1
        return (0.5 * h * (1 + erf(h / np.sqrt(2)))).astype(ml_dtypes.bfloat16).astype(np.float64) @ w2

    sch = schedule_fused_chain(x_times_w_ffn(m, n, k, l), config, load_hardware())
    assert relative_error_on_gpu(sch, [x, w1, b1, w2], reference, (m, l), ml_dtypes.bfloat16) < 2e-3


@pytest.mark.parametrize("form", ["ffn", "swiglu", "x_times_w"])
def test_the_planned_shared_memory_is_what_the_lowered_kernel_allocates(form):
    """The planner's shared-memory count of a fused chain against its lowered kernel: never
    below (a plan the lowering would refuse), and exact for TMA pipelines of several tile
    steps (a gated chain's stage streams both W tiles)."""
    import tvm

    from tvm_dsm.meta_schedule.verify_kernels import lowered_kernels
    from tvm_dsm.transform.buffers import shared_bytes

    hw = load_hardware()
    func = {"ffn": lambda: gemm_chain(128, 4096, 1024, 1024, "relu"), "swiglu": lambda: swiglu_ffn(128, 4096, 1024, 1024),
            "x_times_w": lambda: x_times_w_ffn(128, 4096, 1024, 1024)}[form]()
    _, shape = find_chain(s_tir.Schedule(func))
    configs = [c for c in candidate_configs(shape, hw=hw)[0] if c.cluster_size == 2 and c.block_m == 32]
    picked = {(c.tma, c.n_steps > 1, c.stages, c.block_n): c for c in configs}
    # TMA main loops, with one tile step and several, but for [K, N] weights (no TMA copy of those)
    assert len({(tma, steps) for tma, steps, *_ in picked}) == (2 if form == "x_times_w" else 4)
    for (tma, steps, *_), config in sorted(picked.items()):
        (kernel, *_) = lowered_kernels(schedule_fused_chain(func, config, hw).mod,
                                       tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}), hw)
        allocated = shared_bytes(kernel.body, "shared") + shared_bytes(kernel.body, "shared.dyn")
        assert config.shared_bytes(shape) >= allocated, config
        if tma and steps:
            assert config.shared_bytes(shape) == allocated, config
