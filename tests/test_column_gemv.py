"""A few rows of a matmul over a [K, N] weight as a column GEMV (tvm_dsm.rules.column_gemv,
tvm_dsm.families.column_gemv): the forms users write it in (TE, TOPI, Relax, gated, epilogues),
what it refuses, its kernels' loads, and (GPU) its configurations against float64."""

import re

import numpy as np
import pytest
import tvm
from tvm import te, topi

import tvm_dsm
from tvm_dsm.driver import H100, plan
from tvm_dsm.errors import ClusterError
from tvm_dsm.hardware import load_hardware
from tvm_dsm.relax_integration import scheduling_form
from tvm_dsm.rules.column_gemv import (ColumnGemvConfig, candidate_configs, check_config, ctas, default_config,
                                       find_column_gemv, schedule_column_gemv)
from tvm_dsm.workloads import generated
from tvm_dsm.workloads.dense import dense


def _gated(rows: int, n: int, k: int, dtype: str = "float16"):
    """``silu(x @ Wg) * (x @ Wu)`` over [K, N] weights, TOPI's matmul and SiLU (a sigmoid block,
    then the products)."""
    x = te.placeholder((rows, k), dtype, name="x")
    wg, wu = (te.placeholder((k, n), dtype, name=name) for name in ("wg", "wu"))
    gate, up = (topi.nn.matmul(x, w, out_dtype="float32") for w in (wg, wu))
    return te.create_prim_func([x, wg, wu, topi.cast(topi.multiply(topi.multiply(gate, topi.sigmoid(gate)), up), dtype)])


def _int8(rows: int):
    """An int8 x int8 product over a [K, N] weight, summed in fp32 (a type no sweep measured)."""
    x = te.placeholder((rows, 1024), "int8", name="x")
    w = te.placeholder((1024, 2048), "int8", name="w")
    r = te.reduce_axis((0, 1024), "k")
    y = te.compute((rows, 2048), lambda i, j: te.sum(x[i, r].astype("float32") * w[r, j].astype("float32"), axis=r),
                   name="y")
    return te.create_prim_func([x, w, y])


FORMS = {
    "te": lambda: dense(4, 2048, 1024, weight_layout="kn"),
    "fp32_8_rows": lambda: dense(8, 2048, 1024, "float32", weight_layout="kn"),
    "te_bias_gelu": lambda: dense(2, 2048, 1024, "bfloat16", weight_layout="kn", bias=True, activation="gelu"),
    "topi": lambda: generated._dense("topi", 3, 4096, 512, "float32", "kn"),
    "relax_int64": lambda: generated._dense("relax", 4, 2048, 2048, "float16", "kn"),
    "gated": lambda: _gated(2, 2048, 2048),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_forms_users_write_are_column_gemvs_and_planned_so(form):
    func = FORMS[form]()
    found = find_column_gemv(scheduling_form(func))
    assert found.rows in (2, 3, 4, 8) and len(found.reductions) == (2 if form == "gated" else 1)
    assert plan(func).family.name == "column_gemv"


@pytest.mark.parametrize("func, reason", [
    (lambda: dense(5, 2048, 2048, weight_layout="kn"), "1 to 4 rows of 2-byte elements"),
    (lambda: dense(9, 2048, 2048, "float32", weight_layout="kn"), "1 to 8 rows of 4-byte elements"),
    (lambda: dense(2, 2048, 2048), r"as W\[k, j \+ c\], the column innermost"),  # the row GEMV's
    (lambda: _int8(1), "not 1-byte ones"),
    (lambda: dense(2, 1024, 14336, weight_layout="kn"), "2 rows of a 16-bit type takes 2048\\+ columns"),  # split-K's
])
def test_what_is_not_a_column_gemv_is_refused_by_name(func, reason):
    with pytest.raises(ClusterError, match=reason):
        find_column_gemv(scheduling_form(func()))


@pytest.mark.parametrize(("func", "family"), [
    (lambda: _gated(2, 4096, 14336, "bfloat16"), "split_k_gemm"),  # gated past K = 4096
    (lambda: dense(2, 128, 14336, weight_layout="kn"), "split_k_gemm"),  # 4 CTAs of 64 bytes a row: 32 in clusters
    (lambda: dense(1, 1000, 14336, "float32", weight_layout="kn"), "column_gemv"),  # 32 CTAs x clusters of 8
    (lambda: dense(4, 2048, 8192, "bfloat16", weight_layout="kn"), "column_gemv"),  # 64 CTAs x clusters of 4
    (lambda: dense(2, 4096, 14336, "bfloat16", weight_layout="kn"), "column_gemv"),
])
def test_past_k_4096_a_column_gemv_fills_half_the_sms_with_64_byte_rows(func, family):
    """Each CTA streams its columns of W over its share of K: past K = 4096 the GEMV needs half
    the SMs' CTAs (clusters splitting K count each of theirs) each reading 64 bytes of a row,
    and a gated pair is the split-K GEMM's: the generality run measured lone CTAs over all of K
    slower than the split-K or CUDA-core GEMM."""
    assert plan(func()).family.name == family


def test_past_a_decode_batch_the_tensor_core_gemm_is_planned():
    """At 8 rows of a 16-bit type W is reused enough for the tensor cores (the GEMV's multiply-adds
    on the CUDA cores bound it)."""
    for rows in (8, 64):
        assert plan(dense(rows, 4096, 2048, weight_layout="kn")).family.name == "split_k_gemm"


@pytest.mark.parametrize(("rows", "n", "k", "dtype", "expected"), [
    (1, 14336, 2048, "float16", ColumnGemvConfig(8, 32, 4, True, 2)),  # 224 CTAs: clusters of 2 (16.4 us, best 16.3)
    (4, 14336, 2048, "float16", ColumnGemvConfig(4, 64, 4, True)),  # 32 sums a thread: 4 lanes, 448 CTAs (19.8)
    (8, 14336, 1000, "float32", ColumnGemvConfig(4, 50, 4, True)),  # 50 slices: a divisor of K's steps
    (1, 1000, 127, "float32", ColumnGemvConfig(4, 127, 1, False)),  # one step a slice, no cluster divides K
    (1, 2048, 2048, "float16", ColumnGemvConfig(8, 32, 4, True, 4)),  # 32 CTAs x 4, 512 rows of K each (5.4 us)
    (1, 512, 4096, "float32", ColumnGemvConfig(8, 32, 4, True, 8)),  # 16 CTAs x 8 (5.7 us; lone CTAs 10.5)
    (4, 2048, 8192, "bfloat16", ColumnGemvConfig(4, 64, 4, True, 4)),  # 64 x 4 (16.2 us, split-K 17.6)
    (1, 4096, 512, "float32", ColumnGemvConfig(8, 64, 4, True)),  # K = 512: no cluster (4.7 us)
    (4, 1021, 4096, "float16", ColumnGemvConfig(8, 64, 8, True)),  # a column a load: lone CTAs (8.1 us)
])
def test_the_default_is_the_sweeps_best_form(rows, n, k, dtype, expected):
    found = find_column_gemv(dense(rows, n, k, dtype, weight_layout="kn"))
    assert default_config(found) == expected


def _kernel(func, config=None) -> str:
    found = find_column_gemv(scheduling_form(func))
    sch = schedule_column_gemv(found, config or default_config(found))
    return tvm.compile(sch.mod, target=tvm.target.Target(H100)).mod.imports[0].inspect_source()


@pytest.mark.parametrize("dtype, vector", [("float16", "uint4"), ("bfloat16", "uint4"), ("float32", "float4")])
def test_each_thread_loads_its_steps_rows_of_w_in_16_byte_vectors_then_multiplies(dtype, vector, assemble):
    """A step's rows of W (4 by default) load as 16-byte vectors before the step's multiply-adds;
    the rows of x as vectors of the step's elements; one barrier between the slices' sums and
    their total."""
    source = _kernel(dense(4, 2048, 1024, dtype, weight_layout="kn"), ColumnGemvConfig(8, 32, 4))  # lone CTAs
    body = source[source.index("__global__"):]
    loads = re.findall(rf"= \*\(({vector})\*\)\(W_ptr", body)  # 16-byte loads from global memory
    assert loads and body.count("__syncthreads()") == 1
    first_load, first_fma = body.index("W_local_ptr +"), body.index("acc_rf_shared_local_ptr[0] + (")
    assert first_load < first_fma
    assemble(source, f"column_gemv_{dtype}")


def test_columns_off_the_tiles_are_predicated_and_k_split_in_whole_steps(assemble):
    """N = 1021 (one column a load: no power of two above 1 divides it) over CTAs of 64 columns:
    the last CTA's columns are predicated off. K = 500 splits into 25 slices of 5 steps of 4
    rows (any divisor of its steps: a tail's predicate would be lost by TVM's compute_at)."""
    found = find_column_gemv(dense(3, 1021, 500, weight_layout="kn"))
    source = _kernel(dense(3, 1021, 500, weight_layout="kn"), ColumnGemvConfig(16, 25, 4))
    assert "< 1021)" in source and "threadIdx.y) * 20" in source
    assemble(source, "column_gemv_tails")
    with pytest.raises(ClusterError, match="K=500 is not a multiple of 16 slices x 4 rows"):
        check_config(found, ColumnGemvConfig(16, 16, 4))
    assert {c.slices for c in candidate_configs(found) if c.unroll == 4} == {5, 25, 125}  # the divisors of 125 steps


def test_pipelined_steps_load_the_next_step_before_this_ones_multiply_adds():
    """Pipelined, a slice's steps are unrolled with two register buffers of W indexed by
    constants (a buffer indexed by the loop would live in local memory)."""
    func = dense(2, 4096, 14336, "bfloat16", weight_layout="kn")
    source = _kernel(func, ColumnGemvConfig(4, 64, 8, pipelined=True))
    body = source[source.index("__global__"):]
    assert "& 1)" not in body and "W_local_ptr + ((ax0_2 * 8) + 64)" in body
    with pytest.raises(ClusterError, match="2 to 32"):
        check_config(find_column_gemv(func), ColumnGemvConfig(4, 16, 8, pipelined=True))


def test_a_cluster_splits_k_and_adds_its_peers_partials_through_dsm(assemble):
    """1 x 512 x 4096 fp32 on 8 CTAs of 32 columns and 4 ranks each: every CTA sums its quarter
    of K over 32 slices into its own slice of DSM (the slices' buffer is its tile alone, not
    one a rank), then after a cluster barrier reads its peers' partials of its 8 columns."""
    func = dense(1, 512, 4096, "float32", weight_layout="kn")
    found = find_column_gemv(func)
    config = ColumnGemvConfig(8, 32, 4, True, cluster_size=4)
    source = _kernel(func, config)
    assert "mapa.shared::cluster" in source and "ld.shared::cluster" in source
    body = source[source.index("__global__"):]
    assert body.count("tvm_builtin_cuda_cluster_sync()") == 2  # the peers wrote; the peers read
    (slices,) = {int(s) for s in re.findall(r"acc_rf_rf_shared__cluster_slice_ptr\[(\d+)\]", body)}
    assert slices == config.slices * config.lanes * 4  # slices x the CTA's 32 columns
    assert "W_local_ptr[32]" in body  # a step's 4 rows of 8 lanes' vectors, twice (pipelined)
    assemble(source, "column_gemv_cluster")
    with pytest.raises(ClusterError, match="16 columns do not split over its cluster's 32 CTAs|out of range"):
        check_config(found, ColumnGemvConfig(4, 32, 4, cluster_size=32))
    with pytest.raises(ClusterError, match="not a multiple of 8 CTAs x 128 slices"):
        check_config(found, ColumnGemvConfig(8, 128, 8, cluster_size=8))


def test_past_k_4096_narrow_outputs_take_clusters_to_fill_the_sms():
    """Past K = 4096 a column GEMV's CTAs must number half the SMs: a narrow output (N = 1000 over
    K = 14336) reaches them with K split over a cluster rather than by reading fewer columns of
    each row of W."""
    found = find_column_gemv(dense(1, 1000, 14336, "float32", weight_layout="kn"))
    config = default_config(found)
    assert config.cluster_size > 1 and config.lanes * 16 >= 64
    assert ctas(found, config) >= load_hardware().sm_count / 2


def _run(func, rows: int, n: int, k: int, dtype: str, gated: bool = False, lib=None) -> float:
    """Relative L2 error of ``func``'s build against float64 on fresh inputs, output NaN-poisoned."""
    import ml_dtypes

    host = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    lib = lib or tvm_dsm.build(func)
    dev, rng = tvm.cuda(), np.random.default_rng()
    x = rng.standard_normal((rows, k)).astype(host)
    ws = [(rng.standard_normal((k, n)) / np.sqrt(k)).astype(host) for _ in range(2 if gated else 1)]
    out = tvm.runtime.tensor(np.full((rows, n), np.nan, host), dev)
    lib(tvm.runtime.tensor(x, dev), *(tvm.runtime.tensor(w, dev) for w in ws), out)
    products = [x.astype("float64") @ w.astype("float64") for w in ws]
    ref = products[0] / (1 + np.exp(-products[0])) * products[1] if gated else products[0]
    return float(np.linalg.norm(out.numpy().astype("float64") - ref) / np.linalg.norm(ref))


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "n", "k", "dtype"), [
    (1, 4096, 512, "float32"), (8, 1024, 1000, "float32"), (4, 2048, 1024, "float16"), (4, 2048, 2048, "bfloat16"),
    (3, 1021, 500, "float16"), (1, 1000, 127, "float32")])
def test_gpu_configurations_match_float64(rows, n, k, dtype):
    """The default and a spread of the space (slices, lanes, rows a step, pipelined or not), fp32
    to 1e-5 and 16-bit to 2e-3, with columns off the tiles and K split over divisors."""
    func = dense(rows, n, k, dtype, weight_layout="kn")
    found = find_column_gemv(func)
    configs = candidate_configs(found)
    chosen = [default_config(found), *configs[::max(1, len(configs) // 3)]]
    for config in dict.fromkeys(chosen):
        lib = tvm.compile(schedule_column_gemv(found, config).mod, target=tvm.target.Target(H100))
        assert _run(func, rows, n, k, dtype, lib=lib) < (1e-5 if dtype == "float32" else 2e-3), config


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "n", "k", "dtype"), [
    (1, 512, 4096, "float32"), (7, 1000, 14336, "float32"), (1, 512, 14336, "float16"), (3, 1021, 2048, "bfloat16")])
def test_gpu_clusters_splitting_k_match_float64(rows, n, k, dtype):
    """Each cluster size's configurations (a spread of them), the partials added through DSM."""
    func = dense(rows, n, k, dtype, weight_layout="kn")
    found = find_column_gemv(func)
    for size in (2, 4, 8):
        configs = [c for c in candidate_configs(found) if c.cluster_size == size]
        for config in configs[::max(1, len(configs) // 2)]:
            lib = tvm.compile(schedule_column_gemv(found, config).mod, target=tvm.target.Target(H100))
            assert _run(func, rows, n, k, dtype, lib=lib) < (1e-5 if dtype == "float32" else 2e-3), config


@pytest.mark.gpu
@pytest.mark.parametrize("size", [1, 2, 4])
def test_gpu_a_gated_layer_on_clusters_matches_float64(size):
    func = _gated(2, 2048, 2048)
    found = find_column_gemv(func)
    config = next(c for c in candidate_configs(found) if c.cluster_size == size and c.pipelined)
    lib = tvm.compile(schedule_column_gemv(found, config).mod, target=tvm.target.Target(H100))
    assert _run(func, 2, 2048, 2048, "float16", gated=True, lib=lib) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_gpu_a_gated_layer_matches_float64(rows):
    assert _run(_gated(rows, 2048, 2048), rows, 2048, 2048, "float16", gated=True) < 2e-3


@pytest.mark.gpu
def test_gpu_a_relax_legalized_matmul_matches_float64():
    assert _run(FORMS["relax_int64"](), 4, 2048, 2048, "float16") < 2e-3


@pytest.mark.parametrize("rows", [1, 2])
def test_one_column_a_lane_and_one_row_keep_the_slices_buffer_the_ctas_tile(rows):
    """N = 375 (odd: one column a load) at 1-2 rows: the write-back of each thread's sums is its
    lane's loop alone, and the slices' buffer is the CTA's tile (slices x rows x columns), not
    widened by the thread rows left idle in the final sum."""
    func = dense(rows, 375, 4096, "float32", weight_layout="kn")
    for config in (ColumnGemvConfig(8, 64, 4, True), default_config(find_column_gemv(func))):
        source = _kernel(func, config)
        # the slices' buffer: shared, or in a cluster the CTA's slice of one in DSM
        slices = "acc_rf_rf_shared__cluster_slice_ptr" if config.cluster_size > 1 else "acc_rf_shared_ptr"
        (size,) = {int(s) for s in re.findall(rf"{slices}\[(\d+)\]", source)}
        assert size == config.slices * rows * config.lanes
        assert not re.search(rf"\*\(float[24]\*\)\({slices}", source)  # one sum a store


def test_a_family_that_fails_to_schedule_leaves_the_function_to_dlight(monkeypatch, caplog):
    """A family's schedule raising (a bug) is logged as a warning and TVM's stock schedule taken,
    for the function alone (an operator of a split function keeps the others' kernels)."""
    from tvm.s_tir.schedule.schedule import ScheduleError

    from tvm_dsm.families.column_gemv import ColumnGemvFamily
    from tvm_dsm.driver import schedule

    def fail(*args):
        raise ScheduleError("injected")

    monkeypatch.setattr(ColumnGemvFamily, "apply", lambda self, *a: fail())
    with caplog.at_level("WARNING", logger="tvm_dsm.driver"):
        sch = schedule(dense(2, 2048, 1024, weight_layout="kn"))
    assert "failed to schedule" in caplog.text and "injected" in caplog.text
    assert "rf_shared" not in sch.mod.script()


def _per_row_weight(weight_nk: bool):
    """``y[i, j] = sum_k x[i, k] W[i * 512 + j, k]`` (or ``W[k, i * 512 + j]``): a weight per row,
    which no GEMV's "each vector of W multiplies every row" holds."""
    x = te.placeholder((2, 256), "float16", name="x")
    w = te.placeholder((1024, 256) if weight_nk else (256, 1024), "float16", name="w")
    r = te.reduce_axis((0, 256), "k")
    at = (lambda i, j: w[i * 512 + j, r]) if weight_nk else (lambda i, j: w[r, i * 512 + j])
    y = te.compute((2, 512), lambda i, j: te.sum(x[i, r].astype("float32") * at(i, j).astype("float32"), axis=r),
                   name="y")
    return te.create_prim_func([x, w, y])


@pytest.mark.parametrize("weight_nk", [True, False])
def test_a_weight_per_row_is_no_gemv(weight_nk):
    from tvm_dsm.rules.row_gemv import find_row_gemv

    with pytest.raises(ClusterError, match="W is the same for every row"):
        (find_row_gemv if weight_nk else find_column_gemv)(_per_row_weight(weight_nk))


def test_columns_read_at_an_offset_off_16_bytes_load_one_at_a_time():
    """``W[k, j + 3]`` of a [K, 1027] weight: rows of W start 1027 elements apart and the columns
    read 3 in, so no vector of more than one element is aligned; N = 1024 alone would allow 8."""
    x = te.placeholder((2, 512), "float16", name="x")
    w = te.placeholder((512, 1027), "float16", name="w")
    r = te.reduce_axis((0, 512), "k")
    y = te.compute((2, 1024), lambda i, j: te.sum(x[i, r].astype("float32") * w[r, j + 3].astype("float32"), axis=r),
                   name="y")
    from tvm_dsm.rules.column_gemv import vector_columns

    assert vector_columns(find_column_gemv(te.create_prim_func([x, w, y]))) == 1
    assert vector_columns(find_column_gemv(dense(1, 1024, 512, weight_layout="kn"))) == 8
