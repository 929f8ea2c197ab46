"""Cluster split-K row reductions: CUDA for every cluster size assembles; bad configs are named."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import TARGET, cuda_source, kernels
from tvm import relax, te, topi

import tvm_dsm
from tvm_dsm import ClusterError
from tvm_dsm.families.split_k_reduction import SplitKReduction
from tvm_dsm.rules import SplitKReductionConfig, schedule_split_k_reduction
from tvm_dsm.workloads import gemv, row_sum


@pytest.mark.parametrize("cluster", [1, 2, 4, 8, 16])
def test_gemv_assembles_for_every_cluster_size(cluster, assemble):
    sch = schedule_split_k_reduction(gemv(512, 4096), SplitKReductionConfig(cluster, max(16, cluster)))
    source = cuda_source(sch.mod)
    assert "__shfl_down_sync" in source  # warp-level reduction of each row's K slice
    assemble(source, f"gemv_c{cluster}")


@pytest.mark.parametrize(
    ("m", "k", "config", "message"),
    [
        (256, 4096, SplitKReductionConfig(3, 48), "K=4096 is not divisible by the cluster size 3"),
        (256, 4096, SplitKReductionConfig(4, 18), "rows_per_cluster=18 is not divisible"),
        (250, 4096, SplitKReductionConfig(4, 16), "M=250 rows are not divisible"),
        (256, 4096, SplitKReductionConfig(32, 32), "cluster size 32 is out of range"),
    ],
)
def test_invalid_configs_are_named(m, k, config, message):
    with pytest.raises(ClusterError, match=message):
        schedule_split_k_reduction(row_sum(m, k), config)


def test_not_a_row_reduction():
    from tvm import te

    a = te.placeholder((64, 64), name="A")
    b = te.compute((64, 64), lambda i, j: a[i, j] * 2, name="B")
    with pytest.raises(ClusterError, match="expects iterators"):
        schedule_split_k_reduction(te.create_prim_func([a, b]), SplitKReductionConfig(2, 16))


def _sum_of_squares(m: int, k: int):
    """``sum(x * x)`` over rows as Relax fuses it: a multiply block, then the sum."""
    from tvm import te

    x = te.placeholder((m, k), name="x")
    square = te.compute((m, k), lambda i, j: x[i, j] * x[i, j], name="square")
    r = te.reduce_axis((0, k), "r")
    return te.create_prim_func([x, te.compute((m,), lambda i: te.sum(square[i, r], axis=r), name="total")])


def test_an_element_wise_producer_is_inlined_into_the_row_reduction(assemble):
    import tvm_dsm

    func = _sum_of_squares(64, 1000)
    assert tvm_dsm.plan(func).family.name == "split_k_reduction"
    source = cuda_source(schedule_split_k_reduction(func, SplitKReductionConfig(2, 16)).mod)
    assert len(kernels(source)) == 1 and assemble(source, "sum_of_squares")


def test_trace_records_the_cluster_decisions():
    sch = schedule_split_k_reduction(row_sum(256, 4096), SplitKReductionConfig(8, 32))
    text = str(sch.trace)
    assert 'ann_key="tvm_dsm.cluster_size", ann_val=8' in text
    assert 'storage_scope="shared::cluster"' in text


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [1, 2, 4, 8, 16])
@pytest.mark.parametrize(("m", "k"), [(256, 4096), (1024, 2048), (64, 16384)])
def test_gpu_matches_float64(cluster, m, k):
    import tvm

    sch = schedule_split_k_reduction(gemv(m, k), SplitKReductionConfig(cluster, max(16, cluster)))
    func = tvm.compile(sch.mod, target=TARGET)
    dev = tvm.cuda(0)
    rng = np.random.default_rng()
    a = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal(k, dtype=np.float32)
    y = tvm.runtime.tensor(np.full(m, np.nan, np.float32), dev)
    func(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(x, dev), y)
    ref = a.astype(np.float64) @ x.astype(np.float64)
    assert np.linalg.norm(y.numpy() - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.gpu
def test_gpu_a_sum_of_squares_matches_float64():
    import tvm
    import tvm_dsm

    lib, dev = tvm_dsm.build(_sum_of_squares(64, 1000), TARGET), tvm.cuda(0)
    x = np.random.default_rng().standard_normal((64, 1000), dtype=np.float32)
    y = tvm.runtime.tensor(np.full(64, np.nan, np.float32), dev)
    lib(tvm.runtime.tensor(x, dev), y)
    ref = (x.astype(np.float64) ** 2).sum(-1)
    assert np.linalg.norm(y.numpy() - ref) / np.linalg.norm(ref) < 1e-5



def _variance(m: int, k: int):
    """A variance from a mean computed elsewhere: the sum reads a per-row operand."""
    x = te.placeholder((m, k), "float16", name="x")
    mean = te.placeholder((m,), "float32", name="mean")
    r = te.reduce_axis((0, k), name="r")
    centred = te.compute((m, k), lambda i, j: x[i, j].astype("float32") - mean[i], name="centred")
    var = te.compute((m,), lambda i: te.sum(centred[i, r] * centred[i, r], axis=r), name="var")
    return te.create_prim_func([x, mean, var])


def test_a_per_row_operand_is_read_where_used_not_staged_with_the_row(assemble):
    """Staging each read of the row in registers, 16 bytes a lane, once vectorized a per-row
    operand's copy (it has no K axis to vectorize): no plan of a variance lowered."""
    func = _variance(2048, 768)
    assert tvm_dsm.plan(func).family.name == "split_k_reduction"
    source = cuda_source(schedule_split_k_reduction(func, SplitKReductionConfig(2, 16)).mod)
    assert len(kernels(source)) == 1 and assemble(source, "variance")


@pytest.mark.gpu
def test_gpu_a_variance_from_a_mean_matches_float64():
    lib, dev = tvm_dsm.build(_variance(512, 768), TARGET), tvm.cuda(0)
    rng = np.random.default_rng()
    x = rng.standard_normal((512, 768)).astype(np.float16)
    mean = x.astype(np.float32).mean(-1)
    y = tvm.runtime.tensor(np.full(512, np.nan, np.float32), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(mean, dev), y)
    ref = ((x.astype(np.float64) - mean.astype(np.float64)[:, None]) ** 2).sum(-1)
    assert np.linalg.norm(y.numpy() - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize("dtype", ["int8", "bool"])
def test_partial_results_dsm_cannot_move_are_refused(dtype):
    """A row max of int8 flags or an ``any`` of bools has no PTX type for the exchange of its
    partial results through DSM: the family says so (it failed in lowering)."""
    x = te.placeholder((64, 4096), dtype, name="x")
    func = te.create_prim_func([x, topi.max(x, axis=1) if dtype == "int8" else topi.any(x, axis=1)])
    with pytest.raises(ClusterError, match="through DSM, which moves no such elements"):
        SplitKReduction().recognize(func)


def test_a_row_max_of_flags_compiles_through_the_relax_pipeline():
    """torch's ``any`` as tvm-dsm's importer writes it (T5's overflow guard): a row max of int8
    flags, compiled by ``relax.get_pipeline("tvm_dsm")`` (it failed in LowerCluster)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 4096), "int8"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.max(x, axis=[1])))
    assert tvm.compile(bb.get(), target=TARGET, relax_pipeline="tvm_dsm") is not None


def test_a_schedule_that_does_not_lower_is_left_to_dlight(monkeypatch, caplog):
    """The Relax pipeline lowers each tvm-dsm schedule before taking it: one that fails (here
    the family made to take int8 partial results, which the DSM lowering refuses) is left to
    dlight with a warning naming why, and the model compiles."""
    import tvm_dsm.families.split_k_reduction as family

    monkeypatch.setattr(family, "moves_through_dsm", lambda dtype: True)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 4096), "int8"))
    with bb.function("main", [x]):
        bb.emit_func_output(bb.emit(relax.op.max(x, axis=[1])))
    with caplog.at_level("WARNING", logger="tvm_dsm"):
        assert tvm.compile(bb.get(), target=TARGET, relax_pipeline="tvm_dsm") is not None
    assert "split_k_reduction schedule does not lower (DSM buffer" in caplog.text
