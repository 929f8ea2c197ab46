"""Batches of products (``torch.bmm``, ``q @ k^T`` over batch and head axes, an expert einsum
with its tokens shared, TOPI's ``batch_matmul``, Relax's legalized ``matmul``) as the split-K
GEMM family's kernels: one grid over every product's tiles, each operand read through its own
batch index, or shared by all."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax, s_tir, te, tirx, topi

import tvm_dsm
from conftest import TARGET, cuda_source, relative_error_on_gpu
from tvm_dsm.driver import plan
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.planners.split_k_gemm import predict
from tvm_dsm.rules.split_k_gemm import SplitKGemmConfig, find_gemm, schedule_split_k_gemm
from tvm_dsm.workloads.dense import batched_matmul, dense


def topi_batch_matmul(b: int, m: int, n: int, k: int):
    x = te.placeholder((b, m, k), "float16", name="x")
    w = te.placeholder((b, n, k), "float16", name="w")
    return te.create_prim_func([x, w, topi.cast(topi.nn.batch_matmul(x, w, out_dtype="float32"), "float16")])


def relax_matmul(b: int, m: int, n: int, k: int):
    """``R.matmul`` of ``[B, M, K]`` by ``[B, K, N]`` accumulated in fp32, legalized and fused as
    Relax compiles it (int64 indices)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((b, m, k), "float16"))
    w = relax.Var("w", relax.TensorType((b, k, n), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.astype(relax.op.matmul(x, w, out_dtype="float32"), "float16"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    mod = relax.transform.FuseTIR()(relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(mod)))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    return func


#: name: (builder, batch, the operand without a batch axis, W stored [n, k])
FORMS = {
    "bmm": (lambda: batched_matmul((4,), 256, 512, 256), 4, None, True),
    "bmm_edges": (lambda: batched_matmul((3,), 197, 300, 200), 3, None, True),
    "bmm_kn_bf16": (lambda: batched_matmul((8,), 128, 192, 256, "bfloat16", "kn"), 8, None, False),
    "experts": (lambda: batched_matmul((8,), 96, 1408, 512, weight_layout="kn", shared_x=True), 8, "x", False),
    "scores_4d": (lambda: batched_matmul((2, 4), 128, 192, 64), 8, None, True),
    "topi": (lambda: topi_batch_matmul(5, 128, 128, 64), 5, None, True),
    "relax": (lambda: relax_matmul(4, 64, 256, 128), 4, None, False),
}


@pytest.mark.parametrize("form", FORMS)
def test_batched_products_are_one_split_k_gemm_over_the_batch(form):
    builder, batch, shared, weight_nk = FORMS[form]
    func = builder()
    ranking = plan(func)
    assert ranking.family.name == "split_k_gemm"
    shape = find_gemm(s_tir.Schedule(func), batched=True)[2]
    assert (shape.batch, shape.shared_operand, shape.weight_nk) == (batch, shared, weight_nk)
    assert f"over a batch of {batch} products" in ranking.explain()
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") == 2  # one kernel, declared and defined


def test_batch_axes_are_grid_axes_of_the_operand_copies(assemble):
    """Each product's tiles come from its own batch index: the operands' TMA copies are 3-D
    (column, row, batch), the batch coordinate derived from the CTA's index."""
    func = batched_matmul((4,), 256, 512, 512)
    config = SplitKGemmConfig(cluster_size=2, block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1,
                              stages=3, tma=True, wgmma=True)
    source = cuda_source(schedule_split_k_gemm(func, config, load_hardware()).mod)
    assert source.count("bulk_tensor_3d") >= 2
    assemble(source, "batched_gemm")


def test_other_families_and_unbatched_callers_still_refuse_batch_axes():
    func = batched_matmul((4,), 256, 512, 256)
    with pytest.raises(ClusterError, match=r"iterators \(i, j, k\), got"):
        find_gemm(s_tir.Schedule(func))


def test_an_operand_indexed_off_the_batch_axis_is_refused():
    """``X[i, b, k]``: the batch is not the operand's leading axis, so its rows are not [b, i]."""
    x = te.placeholder((64, 4, 128), "float16", name="x")
    w = te.placeholder((4, 128, 128), "float16", name="w")
    r = te.reduce_axis((0, 128), "r")
    y = te.compute((4, 64, 128), lambda b, i, j: te.sum(x[i, b, r].astype("float32") * w[b, j, r].astype("float32"),
                                                        axis=r), name="y")
    with pytest.raises(ClusterError, match="first operand must be indexed"):
        find_gemm(s_tir.Schedule(te.create_prim_func([x, w, y])), batched=True)


def test_a_weight_shared_by_the_batch_leaves_it_to_the_rows_of_one_gemm():
    """``x[b, s, k] @ W^T``: the batch axes are rows of one GEMM (tiles spanning them, W streamed
    once), which build takes through rows_as_matrix; not a batch of products."""
    x = te.placeholder((6, 64, 512), "float16", name="x")
    w = te.placeholder((256, 512), "float16", name="w")
    r = te.reduce_axis((0, 512), "r")
    y = te.compute((6, 64, 256), lambda b, i, j: te.sum(x[b, i, r].astype("float32") * w[j, r].astype("float32"),
                                                        axis=r), name="y")
    func = te.create_prim_func([x, w, topi.cast(y, "float16")])
    with pytest.raises(ClusterError, match="rows of one GEMM"):
        find_gemm(s_tir.Schedule(func), batched=True)
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert "wgmma" in source or "mma.sync" in source


def test_the_model_counts_every_product_and_shared_tokens_once():
    hw = load_hardware()
    config = SplitKGemmConfig(cluster_size=1, block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1,
                              stages=4, tma=True, wgmma=True)
    one, four, shared = (find_gemm(s_tir.Schedule(f), batched=True)[2] for f in (
        batched_matmul((1,), 512, 1024, 512), batched_matmul((4,), 512, 1024, 512),
        batched_matmul((4,), 512, 1024, 512, shared_x=True)))
    p1, p4, ps = (predict(s, config, hw) for s in (one, four, shared))
    assert p4.ctas == 4 * p1.ctas
    assert p4.bytes["hbm"] == 4 * p1.bytes["hbm"]
    tokens = 512 * 512 * 2
    assert p4.bytes["hbm"] - ps.bytes["hbm"] == 3 * tokens


@pytest.mark.gpu
@pytest.mark.parametrize("form", FORMS)
def test_gpu_batched_products_match_float64(form):
    builder, _, _, weight_nk = FORMS[form]
    func = builder()
    rng = np.random.default_rng(0)
    x_shape, w_shape, out_shape = ([int(d) for d in p.ty.shape] for p in func.params)
    inputs = [rng.standard_normal(x_shape), rng.standard_normal(w_shape)]

    def reference(x, w):
        return x @ (np.swapaxes(w, -1, -2) if weight_nk else w)

    dtype = str(func.params[0].ty.dtype)
    assert relative_error_on_gpu(func, inputs, reference, tuple(out_shape), dtype) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [1, 2])
def test_gpu_every_cluster_size_reduces_each_product_alone(cluster):
    func = batched_matmul((3,), 256, 256, 512)
    config = SplitKGemmConfig(cluster_size=cluster, block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1,
                              stages=3, tma=True, wgmma=True)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((3, 256, 512)) for _ in range(2)]
    sch = schedule_split_k_gemm(func, config, load_hardware())
    error = relative_error_on_gpu(sch, inputs, lambda x, w: x @ np.swapaxes(w, -1, -2), (3, 256, 256), "float16")
    assert error < 2e-3


def _experts_over_shared_tokens(rows):
    """A mixture of experts' up projection as Relax legalizes a Mixtral block's prefill: the
    sequence's tokens ``x[1, S, K]`` (a unit batch axis in front) by each expert's weight
    ``w[E, N, K]``, accumulated in fp16 as written (the pipeline widens it)."""
    x = te.placeholder((1, rows, 256), "float16", name="x")
    w = te.placeholder((8, 384, 256), "float16", name="w")
    r = te.reduce_axis((0, 256), "r")
    y = te.compute((8, rows, 384), lambda e, i, j: te.sum(x[0, i, r] * w[e, j, r], axis=r), name="y")
    return te.create_prim_func([x, w, y])


SYMBOLIC_BATCHES = {
    "bmm": (lambda m: batched_matmul((4,), m, 512, 256), lambda rows: [(4, rows, 256), (4, 512, 256)], (4, 512)),
    "experts": (_experts_over_shared_tokens, lambda rows: [(1, rows, 256), (8, 384, 256)], (8, 384)),
}


@pytest.mark.parametrize("form", SYMBOLIC_BATCHES)
def test_a_batch_over_a_symbolic_row_count_is_a_tma_kernel_a_range(form, caplog):
    """Each range's kernel copies its tiles by TMA: the batch index of a CTA, ``bx // (ceil(S /
    16) * n)``, and the padded rows' bound are proven inside the tensors where the grid runs
    (it is empty at S = 0, so the divisor is positive); before, the copies did not lower and
    the function went to dlight."""
    builder = SYMBOLIC_BATCHES[form][0]
    with caplog.at_level(logging.INFO, logger="tvm_dsm"):
        source = tvm_dsm.build(builder(tirx.Var("m", "int32"))).mod.imports[0].inspect_source()
    assert "falls back" not in caplog.text and "bulk_tensor_3d" in source


@pytest.mark.gpu
@pytest.mark.parametrize("form", SYMBOLIC_BATCHES)
@pytest.mark.parametrize("rows", [1, 5, 64, 300])
def test_gpu_a_symbolic_row_count_is_correct_at_every_row_count(form, rows):
    builder, shapes, (batch, n) = SYMBOLIC_BATCHES[form]
    func = builder(tirx.Var("m", "int32"))
    rng = np.random.default_rng(rows)
    inputs = [rng.standard_normal(s) for s in shapes(rows)]
    error = relative_error_on_gpu(func, inputs, lambda x, w: x @ np.swapaxes(w, -1, -2), (batch, rows, n), "float16")
    assert error < 2e-3


def test_two_k_steps_take_a_three_stage_tma_pipeline_of_warpgroup_mmas():
    """K = 128 (attention scores, head dim 128): two 64-deep steps, one copied ahead of the other
    by TMA, rather than the cp.async pipeline of 32-deep mma.sync steps alone."""
    func = batched_matmul((16,), 1024, 1024, 128)
    best = plan(func).best.config
    assert (best.tma, best.wgmma, best.stages, best.block_k) == (True, True, 3, 64)
    source = cuda_source(schedule_split_k_gemm(func, best, load_hardware()).mod)
    assert "wgmma.mma_async" in source and "bulk_tensor_3d" in source


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [(), (6,)])
def test_gpu_two_k_steps_on_a_three_stage_tma_pipeline_match_float64(batch):
    func = batched_matmul(batch, 320, 384, 128) if batch else dense(320, 384, 128)
    config = SplitKGemmConfig(cluster_size=1, block_m=128, block_n=128, block_k=64, warps_m=8, warps_n=1,
                              stages=3, tma=True, wgmma=True)
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((*batch, 320, 128)), rng.standard_normal((*batch, 384, 128))]
    sch = schedule_split_k_gemm(func, config, load_hardware())
    error = relative_error_on_gpu(sch, inputs, lambda x, w: x @ np.swapaxes(w, -1, -2), (*batch, 320, 384), "float16")
    assert error < 2e-3


def test_torch_bmm_and_an_expert_einsum_exported_from_torch_reach_the_family():
    """``torch.bmm`` of a weight per batch element and ``einsum("nd,edf->enf")`` over experts, as a
    torch user writes them, through ``torch.export`` and tvm-dsm's importer: the pipeline's report
    names the split-K GEMM for each product."""
    torch = pytest.importorskip("torch")
    from tvm_dsm.model_report import relax_report
    from tvm_dsm.relax_torch import from_exported_program

    class Products(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = torch.nn.Parameter(torch.randn(8, 256, 384, dtype=torch.float16))

        def forward(self, a, b, tokens):
            return torch.bmm(a, b.transpose(1, 2)), torch.einsum("nd,edf->enf", tokens, self.experts)

    inputs = (torch.randn(4, 128, 64, dtype=torch.float16), torch.randn(4, 192, 64, dtype=torch.float16),
              torch.randn(96, 256, dtype=torch.float16))
    mod = from_exported_program(torch.export.export(Products().eval(), inputs))
    report = relax_report(mod)
    products = [row for row in report.rows if "matmul" in row.name]
    assert len(products) == 2 and all(row.where == "split_k_gemm" for row in products), report.format()


def test_decode_scores_exported_from_torch_are_row_gemvs_over_the_batch():
    """A decode step's attention scores as a torch user writes them, one query row a head over
    the cached keys (``torch.bmm`` over batch x heads, and ``q @ k.transpose(-1, -2)`` over both
    axes), through ``torch.export`` and tvm-dsm's importer: the report names the row GEMV, and
    the module builds for Hopper."""
    torch = pytest.importorskip("torch")
    from tvm_dsm.model_report import relax_report
    from tvm_dsm.relax_torch import from_exported_program

    class Scores(torch.nn.Module):
        def forward(self, q, k, q4, k4):
            return torch.bmm(q, k.transpose(1, 2)), q4 @ k4.transpose(-1, -2)

    inputs = (torch.randn(32, 1, 128, dtype=torch.float16), torch.randn(32, 1024, 128, dtype=torch.float16),
              torch.randn(2, 16, 1, 64, dtype=torch.float16), torch.randn(2, 16, 512, 64, dtype=torch.float16))
    mod = from_exported_program(torch.export.export(Scores().eval(), inputs))
    report = relax_report(mod)
    products = [row for row in report.rows if "matmul" in row.name]
    assert len(products) == 2 and all(row.where == "row_gemv" for row in products), report.format()
    tvm.compile(mod, target=TARGET, relax_pipeline=relax.get_pipeline("tvm_dsm"))


def test_a_symbolic_batch_is_a_kernel_per_range_of_batches():
    """``torch.bmm`` exported with a dynamic batch: one module, a split-K GEMM kernel per range of
    the batch's values (chosen on the host each call), its grid the batch's products' tiles."""
    b = tirx.Var("b", "int32")
    func = batched_matmul((b,), 256, 512, 256)
    shape = find_gemm(s_tir.Schedule(func), batched=True)[2]
    assert shape.batch.same_as(b) and shape.m == 256
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert source.count("__global__") >= 2 and "wgmma.mma_async" in source and "bulk_tensor_3d" in source


def test_the_first_products_of_a_symbolic_batch_get_tiles_of_their_own():
    """At 1-4 products the first range's tiles (128x128 for up to 16 products of 512 x 512) leave
    at least half the SMs idle: each of those product counts gets the split-K GEMM's own plan
    (64x64 tiles) as a kernel of its own; where the range's tiles already fill the machine or
    are the same, none."""
    from tvm_dsm.families.row_ranges import range_kernels

    hw = load_hardware("h200_sxm")
    b = tirx.Var("b", "int32")
    kernels = range_kernels(batched_matmul((b,), 512, 512, 256), TARGET, hw)
    assert [k.bound for k in kernels] == [1, 2, 3, 4, None]
    assert all((k.config.block_m, k.config.block_n) == (64, 64) for k in kernels[:4])
    assert (kernels[-1].config.block_m, kernels[-1].config.block_n) == (128, 128)
    for m, n, k in ((2048, 2048, 128), (128, 384, 256)):
        assert range_kernels(batched_matmul((b,), m, n, k), TARGET, hw)[0].bound != 1, (m, n, k)


@pytest.mark.gpu
@pytest.mark.parametrize("m, n, k, batch", [(128, 384, 256, 1), (128, 384, 256, 3), (128, 384, 256, 40),
                                            (512, 512, 256, 1), (512, 512, 256, 2)])
def test_gpu_a_symbolic_batch_is_correct_at_every_batch(m, n, k, batch):
    """Every range's kernel, and the first products' of their own (512 x 512, above), against float64."""
    b = tirx.Var("b", "int32")
    func = batched_matmul((b,), m, n, k)
    rng = np.random.default_rng(batch)
    inputs = [rng.standard_normal((batch, m, k)), rng.standard_normal((batch, n, k))]
    error = relative_error_on_gpu(func, inputs, lambda x, w: x @ np.swapaxes(w, -1, -2), (batch, m, n), "float16")
    assert error < 2e-3


@pytest.mark.parametrize("b, n, k, rows, lanes", [(32, 4096, 128, 32, 8), (256, 2048, 64, 64, 4), (32, 1000, 128, 8, 8)])
def test_a_batch_of_gemvs_is_a_row_gemv_over_the_batch(b, n, k, rows, lanes):
    """One row in each product (a decode step's per-head scores as ``torch.bmm``): the row GEMV
    with the batch axes leading its grid, two vectors of K a lane and CTAs of 256 threads (fewer
    where N's rows do not divide into them); the split-K GEMM family takes it too, on tiles whose
    rows past the first are zero-filled, each weight streamed once, and predicts it slower."""
    from tvm_dsm.families.split_k_gemm import SplitKGemm
    from tvm_dsm.rules.split_k_gemm import GemmShape, check_edges

    func = topi_batch_matmul(b, 1, n, k)
    ranking = plan(func)
    assert ranking.family.name == "row_gemv"
    assert (ranking.best.config.rows_per_cta, ranking.best.config.threads_per_row) == (rows, lanes)
    family, hw = SplitKGemm(), load_hardware()
    tiles = family.rank(family.recognize(func), hw)[0]
    assert tiles.bytes["hbm"] < 1.1 * b * (n * k + k + n * 2) * 2
    assert tiles.predicted_us > ranking.best.predicted_us
    with pytest.raises(ClusterError, match="M=1 is a GEMV"):
        check_edges(GemmShape(1, 512, 128, True))


@pytest.mark.gpu
@pytest.mark.parametrize("b, n, k", [(32, 1000, 128), (256, 2048, 64), (8, 4096, 128)])
def test_gpu_a_batch_of_gemvs_matches_float64(b, n, k):
    """The row GEMV over the batch (tvm_dsm.build's pick) and the split-K family's tiles."""
    from tvm_dsm.families.split_k_gemm import SplitKGemm

    func = topi_batch_matmul(b, 1, n, k)
    family, hw = SplitKGemm(), load_hardware()
    tiles = family.apply(func, family.rank(family.recognize(func), hw)[0].config, hw)
    rng = np.random.default_rng()
    inputs = [rng.standard_normal((b, 1, k)), rng.standard_normal((b, n, k))]
    for form in (func, tiles):
        error = relative_error_on_gpu(form, inputs, lambda x, w: x @ np.swapaxes(w, -1, -2), (b, 1, n), "float16")
        assert error < 2e-3


def test_a_batched_product_is_tuned_in_the_familys_space_and_compiled_from_its_record(tmp_path):
    """``tune_relax`` over a model holding a ``torch.bmm``-style product: its task searches the
    split-K GEMM's planned configurations, and the pipeline schedules it from the tuned record."""
    from conftest import without_unnamed_meta_schedule_handlers
    from test_driver import InProcessBuilder, _ScriptedRunner
    from tvm.s_tir import meta_schedule as ms

    from tvm_dsm.meta_schedule import tune_relax
    from tvm_dsm.meta_schedule.planned_space import PlannedSpace
    from tvm_dsm.meta_schedule.relax_tuning import task_space, tuning_tasks
    from tvm_dsm.relax_pipeline import schedule_kernels

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 256, 128), "float16"))
    w = relax.Var("w", relax.TensorType((4, 128, 192), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, w)))
        bb.emit_func_output(out)
    mod, target = bb.get(), tvm.target.Target("nvidia/nvidia-h100")
    (task,) = [t for t in tuning_tasks(mod, target, load_hardware()) if "matmul" in t.task_name]
    assert isinstance(task_space(task.task_name, task.dispatched[0]["main"], target, 8, load_hardware()), PlannedSpace)
    without_unnamed_meta_schedule_handlers()
    database = tune_relax(mod, str(tmp_path), max_trials_global=8, num_trials_per_iter=4, top=8,
                          builder=InProcessBuilder(), runner=_ScriptedRunner())
    assert database.has_workload(task.dispatched[0])
    choices = {}
    schedule_kernels(mod, target, database=database, choices=choices)
    assert choices[task.task_name].tuned and choices[task.task_name].families == "split_k_gemm"
    assert isinstance(database, ms.Database)


def test_a_relax_bmm_of_a_symbolic_batch_reaches_the_family():
    """``x @ w^T`` over ``[b, M, K]`` tensors with ``b`` symbolic (a model exported with a dynamic
    batch), through the "tvm_dsm" pipeline: the split-K GEMM schedules it."""
    b = tirx.Var("b", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((b, 256, 128), "float16"))
    w = relax.Var("w", relax.TensorType((b, 192, 128), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.op.permute_dims(w, [0, 2, 1]))))
        bb.emit_func_output(out)
    coverage = {}
    with TARGET:
        relax.get_pipeline("tvm_dsm", coverage=coverage)(bb.get())
    assert list(coverage.values()) == ["split_k_gemm"], coverage
