"""The unfused point of the chain family: gated split-K GEMMs, two kernels with H in global
memory, the ranking against fused plans, the database round trip, errors."""

from __future__ import annotations


import pytest
import tvm
from tvm import s_tir, te, topi
from tvm.s_tir import meta_schedule as ms

import tvm_dsm
import tvm_dsm.transform.cluster_launch as cluster_launch
from conftest import TARGET, chain_error_on_gpu, cuda_source, kernels
from tvm_dsm.driver import H100, schedule
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners.unfused_chain import UnfusedChainPlan, plan_unfused_chain
from tvm_dsm.rules.fused_chain import find_chain
from tvm_dsm.rules.split_k_gemm import SplitKGemmConfig, find_gemm, schedule_split_k_gemm
from tvm_dsm.rules.unfused_chain import UnfusedChainConfig, schedule_unfused_chain
from tvm_dsm.transform.buffers import shared_bytes
from tvm_dsm.workloads.chains import gemm_chain, swiglu_ffn
from tvm_dsm.workloads.dense import gated_dense, matmul

GATED = SplitKGemmConfig(2, 64, 128, 64, 2, 4, 4, tma=True)
SECOND = SplitKGemmConfig(4, 64, 64, 64, 2, 2, 3, tma=True)


def _kernels(source: str) -> list[str]:
    return list(kernels(source).values())


def test_gated_layer_runs_both_products_on_one_tile_in_one_kernel(assemble):
    sch = s_tir.Schedule(gated_dense(128, 1024, 1024))
    blocks, epilogue, shape = find_gemm(sch)
    assert len(blocks) == 2 and len(epilogue) == 1 and shape.products == 2
    source = cuda_source(schedule_split_k_gemm(gated_dense(128, 1024, 1024), GATED, load_hardware()).mod)
    (kernel,) = _kernels(source)
    for name in ("X", "Wg", "Wu"):
        assert f"CUtensorMap {name}_tensormap" in kernel, name
    # each product's partial tiles summed over the cluster's peers (unrolled) for each of a
    # thread's batch of 2 rows (2 products x 2 peers x 2 rows x 256 threads: 32 KB in flight)
    assert kernel.count("ld_vec_shared__cluster_v4_f32(") == 2 * GATED.cluster_size * 2
    assert "expf" in kernel  # silu(gate) * up in the reduce-scatter's epilogue
    assemble(source, "gated_dense")


def test_a_fused_gate_up_weight_is_read_as_its_two_row_ranges(assemble):
    """One weight ``W[2n, k]``, the gate's rows first (a model's single gate/up projection): the
    up product's tiles come from row n on, through one kernel like two weights'."""
    func = gated_dense(128, 1024, 1024, fused_weight=True)
    assert find_gemm(s_tir.Schedule(func))[2].products == 2
    (kernel,) = _kernels(cuda_source(schedule_split_k_gemm(func, GATED, load_hardware()).mod))
    up_tiles = [line for line in kernel.splitlines() if "W_tensormap_1" in line and "bulk_tensor" in line]
    assert up_tiles and all("+ 1024)" in line for line in up_tiles)
    assemble(cuda_source(tvm_dsm.plan(func).schedule().mod), "gated_fused_weight")


def test_a_weight_read_from_a_row_on_is_a_gated_layers_alone():
    """A single product reading W from a row on is not taken as a GEMM (its schedule assumes the
    weight's rows from 0)."""
    x = te.placeholder((128, 256), "float16", name="X")
    w = te.placeholder((512, 256), "float16", name="W")
    func = te.create_prim_func([x, w, te.compute((128, 256), lambda i, j: matmul(x, w, rows=(256, 256))[i, j]
                                                  .astype("float16"), name="Y")])
    with pytest.raises(ClusterError, match=r"indexed \[j, k\] or \[k, j\]"):
        find_gemm(s_tir.Schedule(func))


def _shared_memory_per_kernel(monkeypatch) -> list[int]:
    """The shared memory of each kernel built from now on (at the launch check), in order."""
    seen = []
    check = cluster_launch.check_shared_memory
    monkeypatch.setattr(cluster_launch, "check_shared_memory", lambda body, size, hw: (
        seen.append(shared_bytes(body, "shared.dyn") + shared_bytes(body, "shared")), check(body, size, hw)))
    return seen


def test_gated_layer_shared_memory_is_what_the_config_predicts(monkeypatch):
    """The kernel's merged shared memory (at the launch check) is what the planner counts: in
    one K loop (TMA) three operands' slots, whose buffers the partial tiles take after the loop
    (128x128 tiles of 3 stages: each tile over two of them, 165,888 B, not the pipeline's
    150,552); in two loops (cp.async) the gate's partial tile beside the up product's pipeline."""
    seen = _shared_memory_per_kernel(monkeypatch)
    three_stages = SplitKGemmConfig(1, 128, 128, 64, 8, 1, 3, tma=True, wgmma=True)
    for config in (GATED, three_stages, SplitKGemmConfig(4, 128, 64, 64, 2, 2, 3)):
        seen.clear()
        cuda_source(schedule_split_k_gemm(gated_dense(128, 4096, 4096), config, load_hardware()).mod)
        assert seen == [config.shared_bytes("float16", products=2)]


@pytest.mark.parametrize(("label", "m"), [*((f"S{i}", 128) for i in range(1, 9)), ("S3", 64)])
def test_each_kernel_of_a_planned_swiglu_uses_the_shared_memory_the_planner_counts(label, m, monkeypatch):
    """The planner sizes CTAs per SM from its shared-memory estimate. The chain's intermediate
    reaches its second kernel through a tensor map, so TVM's StorageRewrite runs per kernel
    (tvm_dsm.transform.storage_rewrite); run on nothing, a gated kernel's gate and up pipelines
    stayed two allocations: S3 at M = 64 took 76,832 B where 67,632 were planned, two CTAs per
    SM where three were, and ran 121 us instead of 109."""
    from tvm_dsm.gpu.suites import SWIGLUS
    from tvm_dsm.rules.unfused_chain import gemm_shapes

    seen = _shared_memory_per_kernel(monkeypatch)
    func = swiglu_ffn(m, *SWIGLUS[label])
    config = tvm_dsm.plan(func).best.config
    assert isinstance(config, UnfusedChainConfig)
    cuda_source(schedule_unfused_chain(func, config, load_hardware()).mod)
    first, _ = gemm_shapes(find_chain(s_tir.Schedule(func))[1])
    planned = [config.gemm0.shared_bytes(first.dtype, first.products), config.gemm1.shared_bytes()]
    assert len(seen) == len(planned)
    assert all(used <= estimate + 16 for used, estimate in zip(seen, planned)), (seen, planned)


def test_gated_products_must_share_their_input():
    from tvm import te

    x, y = (te.placeholder((128, 256), "float16", name=n) for n in "XY")
    w = te.placeholder((256, 256), "float16", name="W")
    k0, k1 = te.reduce_axis((0, 256)), te.reduce_axis((0, 256))
    a = te.compute((128, 256), lambda i, j: te.sum(x[i, k0].astype("float32") * w[j, k0].astype("float32"), axis=k0))
    b = te.compute((128, 256), lambda i, j: te.sum(y[i, k1].astype("float32") * w[j, k1].astype("float32"), axis=k1))
    out = te.compute((128, 256), lambda i, j: (a[i, j] * b[i, j]).astype("float16"))
    with pytest.raises(ClusterError, match="must read the same input"):
        find_gemm(s_tir.Schedule(te.create_prim_func([x, y, w, out])))


@pytest.mark.parametrize("gated", [False, True])
def test_unfused_chain_is_two_split_k_kernels_with_h_through_global_memory(gated, assemble):
    func = swiglu_ffn(128, 1024, 768, 256) if gated else gemm_chain(128, 1024, 768, 256)
    source = cuda_source(schedule_unfused_chain(func, UnfusedChainConfig(GATED, SECOND), load_hardware()).mod)
    first, second = _kernels(source)
    weights = ("Wg", "Wu") if gated else ("W1",)
    for name in ("A", *weights):
        assert f"CUtensorMap {name}_tensormap" in first, name
    assert "H_ptr" in first and "Out_ptr" not in first  # kernel 1 writes H ...
    assert "CUtensorMap H_tensormap" in second and "CUtensorMap W2_tensormap" in second  # 2 reads it
    assert all("cluster_sync()" in k and "mma.sync.aligned" in k for k in (first, second))
    assemble(source, f"unfused_chain_{gated}")


def test_family_ranks_fused_and_unfused_plans_by_one_model():
    """Large intermediates at M = 128 (G5, S3) plan unfused (measured: our two GEMMs took 131 vs
    687 us fused on G5); a small chain (G2, N = 256) keeps fusion, which the model predicts
    faster even after its measured optimism (FUSED_PICK_BIAS); G3 (K = 416) plans unfused,
    measured 7.0 us against 8.8 fused, once GEMM1's programmatic launch is not counted twice."""
    from tvm_dsm.families.gemm_chain import chain_rank_key

    for func, unfused in ((gemm_chain(128, 16384, 4096, 4096), True),
                          (swiglu_ffn(128, 11008, 4096, 4096), True),
                          (gemm_chain(128, 256, 512, 64), False),
                          (gemm_chain(128, 512, 416, 256), True)):
        ranking = tvm_dsm.plan(func)
        assert ranking.family.name == "gemm_chain"
        kinds = {type(p.config) for p in ranking.plans}
        assert UnfusedChainConfig in kinds and len(kinds) == 2
        assert isinstance(ranking.best.config, UnfusedChainConfig) == unfused
        keys = [chain_rank_key(p, ranking.hw) for p in ranking.family.rank(ranking.shape, ranking.hw)]  # before re-ranking
        assert keys == sorted(keys)
    ranking = tvm_dsm.plan(swiglu_ffn(128, 11008, 4096, 4096))
    text = "\n".join(p.explain() for p in ranking.plans[:40] if isinstance(p, UnfusedChainPlan))
    assert "unfused SwiGLU" in text and "2 gated products" in text and "2 kernels" in text


def test_unfused_plan_adds_its_gemms_level_by_level():
    """Each GEMM's prediction holds its own launch; launched while GEMM0 runs, GEMM1's is
    hidden (``chains.late_launch_s`` less; launched after it, see test_programmatic_launch)."""
    _, shape = find_chain(s_tir.Schedule(gemm_chain(128, 3072, 768, 768)))
    hw = load_hardware()
    plans = plan_unfused_chain(shape, hw)
    best = plans[0]
    assert isinstance(best, UnfusedChainPlan) and best.config.programmatic_launch
    first, second = best.gemms
    assert best.predicted_us == pytest.approx(first.predicted_us + second.predicted_us - hw.fitted("chains.late_launch_s") * 1e6)
    assert best.bytes["hbm"] == first.bytes["hbm"] + second.bytes["hbm"]
    # H's round trip is counted: written by GEMM0 (fp16 output), read again by GEMM1.
    assert first.bytes["hbm"] >= 128 * 3072 * 2 and second.bytes["hbm"] >= 128 * 3072 * 2


@pytest.mark.parametrize(("func", "config"), [
    (gemm_chain(128, 3072, 768, 768), UnfusedChainConfig(GATED, SECOND)),
    (swiglu_ffn(128, 1024, 768, 256), UnfusedChainConfig(GATED, SECOND)),
])
def test_unfused_trace_replays_from_the_database(tmp_path, func, config):
    """MetaSchedule's own query_schedule replays with s_tir's checks on, which this trace
    cannot pass; tvm_dsm.build replays it (tvm_dsm.driver.replay)."""
    sch = schedule_unfused_chain(func, config, load_hardware())
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    target = tvm.target.Target(H100)
    database = ms.database.JSONDatabase(work_dir=str(tmp_path))
    database.commit_tuning_record(ms.database.TuningRecord(
        sch.trace, database.commit_workload(mod), [1e-5], target,
        ms.arg_info.ArgInfo.from_prim_func(func)))
    chosen = schedule(func, database=database)
    tvm.ir.assert_structural_equal(chosen.mod, sch.mod)


def test_meta_schedule_design_spaces_leave_the_unfused_plans_out():
    from tvm_dsm.meta_schedule import PlannedSpace

    func = gemm_chain(128, 3072, 768, 768)  # G4: the unfused plans are the best predicted
    ranking = tvm_dsm.plan(func)
    assert isinstance(ranking.best.config, UnfusedChainConfig)
    space = PlannedSpace(top=2)
    (design,) = space.generate_design_space(tvm.IRModule({"main": func}))
    fused = [p.predicted_us for p in ranking.plans if not isinstance(p.config, UnfusedChainConfig)]
    assert [p.predicted_us for p in space.plans.ranking.plans] == fused[:2]
    (sample,) = [i for i in design.trace.insts if i.kind.name == "SampleCategorical"]
    assert len(sample.attrs[0]) == 2


def test_batches_off_the_tensor_core_tile_are_refused_by_both_gemms():
    with pytest.raises(ClusterError, match="M=24: the tensor-core GEMM needs a multiple of 16"):
        schedule_unfused_chain(gemm_chain(24, 3072, 768, 768), UnfusedChainConfig(GATED, SECOND), load_hardware())
    _, shape = find_chain(s_tir.Schedule(gemm_chain(24, 3072, 768, 768)))
    with pytest.raises(ClusterError, match="no cluster split-K GEMM configuration fits 24x3072x768"):
        plan_unfused_chain(shape, load_hardware())


def test_one_fragment_of_rows_plans_and_assembles(assemble):
    """M = 16 (one 16-row fragment): the unfused chain's GEMMs plan and build."""
    _, shape = find_chain(s_tir.Schedule(swiglu_ffn(16, 1024, 768, 256)))
    best = plan_unfused_chain(shape, load_hardware())[0]
    assert best.config.gemm0.block_m == best.config.gemm1.block_m == 16
    source = cuda_source(schedule_unfused_chain(swiglu_ffn(16, 1024, 768, 256), best.config, load_hardware()).mod)
    assert len(_kernels(source)) == 2
    assemble(source, "unfused_chain_m16")


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("configs", [(GATED, SECOND),
                                     (SplitKGemmConfig(1, 128, 64, 64, 2, 2, 4),
                                      SplitKGemmConfig(2, 64, 64, 64, 2, 2, 3))])
def test_gpu_unfused_chain_matches_float64(gated, configs):
    m, n, k, l = 128, 1024, 768, 256
    func = swiglu_ffn(m, n, k, l) if gated else gemm_chain(m, n, k, l, "relu")
    sch = schedule_unfused_chain(func, UnfusedChainConfig(*configs), load_hardware())
    assert chain_error_on_gpu(func, sch.mod) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 128])
def test_gpu_planned_chain_matches_float64(m):
    func = swiglu_ffn(m, 3072, 1024, 1024)  # S8
    assert chain_error_on_gpu(func, tvm_dsm.plan(func).schedule().mod) < 2e-3


def _topi_ffn(m: int, n: int, k: int, l: int):
    """An FFN written with TOPI: ``dense``, ``relu`` and ``cast`` apart (two elementwise blocks
    between the GEMMs), then ``dense`` and ``cast``."""
    x = te.placeholder((m, k), "float16", name="x")
    w1, w2 = te.placeholder((n, k), "float16", name="w1"), te.placeholder((l, n), "float16", name="w2")
    h = topi.cast(topi.nn.relu(topi.nn.dense(x, w1, out_dtype="float32")), "float16")
    return te.create_prim_func([x, w1, w2, topi.cast(topi.nn.dense(h, w2, out_dtype="float32"), "float16")])


def test_a_topi_ffn_with_its_activation_and_cast_apart_is_a_chain(assemble):
    ranking = tvm_dsm.plan(_topi_ffn(128, 1024, 768, 256))
    assert ranking.family.name == "gemm_chain"
    assemble(cuda_source(ranking.schedule().mod), "topi_ffn")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [16, 256])
def test_gpu_a_fused_gate_up_weight_matches_float64(m):
    """The planner's pick for a fused gate/up weight against float64: silu(x Wg^T) * (x Wu^T)
    with ``Wg = W[:n]``, ``Wu = W[n:]``; fresh inputs, NaN-poisoned output."""
    import numpy as np

    func = gated_dense(m, 1024, 2048, fused_weight=True)
    lib = tvm.compile(tvm_dsm.plan(func).schedule().mod, target=TARGET)
    dev, rng = tvm.cuda(0), np.random.default_rng()
    x = rng.standard_normal((m, 2048)).astype(np.float16)
    w = (rng.standard_normal((2048, 2048)) / np.sqrt(2048)).astype(np.float16)
    out = tvm.runtime.tensor(np.full((m, 1024), np.nan, np.float16), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    g, u = (x.astype(np.float64) @ half.astype(np.float64).T for half in (w[:1024], w[1024:]))
    ref = g / (1 + np.exp(-g)) * u
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
def test_gpu_topi_ffn_matches_float64():
    func = _topi_ffn(128, 1024, 768, 256)
    assert chain_error_on_gpu(func, tvm_dsm.plan(func).schedule().mod) < 2e-3


@pytest.mark.parametrize("func", [gemm_chain(2048, 18176, 4544, 4544, activation="gelu"), swiglu_ffn(512, 4864, 896, 896),
                                  swiglu_ffn(128, 18944, 3584, 3584)],
                         ids=["falcon_mlp_2048", "qwen2_0.5b_mlp_512", "qwen2_7b_mlp_128"])
def test_a_chain_whose_gemms_run_faster_apart_is_declined(func):
    """Falcon-7B's MLP (4544 = 71 x 64 columns), Qwen2-0.5B's at 512 rows and Qwen2-7B's at 128:
    the GEMMs alone, each on tiles past N where those pay, are predicted at least APART_GAIN
    faster than the chain's kernels on whole tiles; the chain family declines, and build
    schedules a kernel per operator, each the split-K GEMM's (H200: 1325 -> 1105, 36.9 -> 29.0
    and 149.8 -> 127.0 us, torch eager 1084, 42.8 and 131.0; bench/results/archive/chain_apart_s89.json,
    chain_apart_sweep_s89.json)."""
    from tvm_dsm.driver import operator_families

    hw = load_hardware("h200_sxm")
    with pytest.raises(ClusterError, match="a kernel per operator is faster"):
        tvm_dsm.plan(func, hw)
    assert operator_families(func, hw=hw) == ["split_k_gemm", "split_k_gemm"]


def test_the_seed_chains_stay_chains_at_128_rows():
    """G1-G10 and S1-S8 at M = 128: their GEMMs apart are not predicted APART_GAIN faster, so
    the chain family keeps them (fused or unfused, as measured in bench/results/chains)."""
    from tvm_dsm.gpu.suites.base import CHAINS, SWIGLUS

    hw = load_hardware("h200_sxm")
    for n, k, l in CHAINS.values():
        assert tvm_dsm.plan(gemm_chain(128, n, k, l), hw).family.name == "gemm_chain", (n, k, l)
    for n, k, l in SWIGLUS.values():
        assert tvm_dsm.plan(swiglu_ffn(128, n, k, l), hw).family.name == "gemm_chain", (n, k, l)


@pytest.mark.gpu
def test_gpu_a_declined_chain_matches_float64():
    """The Falcon MLP at 256 rows built a kernel per operator, against float64 (H rounded to
    fp16 as the function computes it)."""
    import numpy as np

    from conftest import relative_error_on_gpu
    from scipy.special import erf

    m, n, k, l = 256, 18176, 4544, 4544
    rng = np.random.default_rng()
    x, w1, w2 = rng.standard_normal((m, k)), rng.standard_normal((n, k)) / np.sqrt(k), rng.standard_normal((l, n)) / np.sqrt(n)

    def ffn(x, w1, w2):
        c = x @ w1.T
        return (c * 0.5 * (1 + erf(c / np.sqrt(2)))).astype(np.float16).astype(np.float64) @ w2.T

    assert relative_error_on_gpu(gemm_chain(m, n, k, l, activation="gelu"), [x, w1, w2], ffn, (m, l), "float16") < 2e-3
