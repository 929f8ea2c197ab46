"""fp32 GEMMs on the CUDA cores (tvm_dsm.rules.simt_gemm): exact to fp32 at any M, N and K, in
TE, TOPI and both weight layouts; split-K partials summed by a second kernel."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import te, topi

import tvm_dsm
from conftest import cuda_source, kernels, relative_error_on_gpu
from tvm_dsm.driver import H100
from tvm_dsm.errors import ClusterError
from tvm_dsm.families import match_family
from tvm_dsm.families.simt_gemm import SimtGemm
from tvm_dsm.hardware import load_hardware
from tvm_dsm.rules.simt_gemm import SimtGemmConfig, check_config, find_simt_gemm
from tvm_dsm.workloads.dense import dense, gated_dense

#: (m, n, k, layout): a short M and N over a long K (split-K), tiles off every extent, a
#: GEMV row, a large square.
SHAPES = [(13, 127, 3000, "nk"), (100, 3000, 1000, "kn"), (257, 1024, 1021, "nk"), (1, 5120, 4096, "kn"),
          (7, 1021, 14336, "nk"), (1024, 1024, 1024, "nk")]


def _topi_dense(m, n, k):
    x = te.placeholder((m, k), "float32", name="x")
    w = te.placeholder((n, k), "float32", name="w")
    return te.create_prim_func([x, w, topi.nn.relu(topi.nn.dense(x, w))])


@pytest.mark.parametrize(("m", "n", "k", "layout"), SHAPES)
def test_fp32_products_take_the_cuda_core_gemm(m, n, k, layout, assemble):
    ranking = tvm_dsm.plan(dense(m, n, k, "float32", weight_layout=layout, bias=True, activation="relu"))
    if m <= 8:  # decode rows: a GEMV streams W (fp32: up to 8 rows; [K, N] weights the column GEMV)
        assert ranking.family.name == ("row_gemv" if layout == "nk" else "column_gemv")
        return
    assert ranking.family.name == "simt_gemm"
    source = cuda_source(ranking.schedule().mod)
    assert len(kernels(source)) == (2 if ranking.best.config.split_k > 1 else 1)
    assert "mma" not in source  # exact fp32: no TF32 tensor cores
    assemble(source, f"simt_{m}x{n}x{k}_{layout}")


#: 16-bit products whose rows do not start 16 bytes apart (K, or [K, N]'s N, off 8 elements), small
#: enough to stay on the CUDA cores (larger ones: tests/test_aligned_rows.py).
ODD_ROWS = [(13, 1021, 512, "kn", "float16"), (37, 1024, 1021, "nk", "bfloat16"), (7, 1000, 127, "nk", "float16"),
            (257, 127, 2048, "kn", "bfloat16")]


@pytest.mark.parametrize(("m", "n", "k", "layout", "dtype"), ODD_ROWS)
def test_16_bit_rows_the_tensor_cores_cannot_copy_take_the_cuda_cores(m, n, k, layout, dtype, assemble):
    ranking = tvm_dsm.plan(dense(m, n, k, dtype, weight_layout=layout))
    assert ranking.family.name == "simt_gemm"
    assemble(cuda_source(ranking.schedule().mod), f"simt_{m}x{n}x{k}_{layout}_{dtype}")


def test_16_bit_products_the_tensor_cores_take_stay_theirs():
    assert tvm_dsm.plan(dense(64, 4096, 1024, "float16", weight_layout="kn")).family.name == "split_k_gemm"
    with pytest.raises(ClusterError, match="take the tensor-core GEMM"):
        find_simt_gemm(dense(64, 4096, 1024, "float16"))
    with pytest.raises(ClusterError, match="GEMV"):
        find_simt_gemm(dense(1, 4096, 1021, "float16"))


def test_one_fp32_row_over_k_off_16_bytes_is_left_to_tvms_gemv(caplog):
    """One fp32 row over W [N, K] with K = 127: the row GEMV takes whole 16-byte vectors only,
    and TVM's GEMV took the product of an FFN of one row in a fraction of the CUDA-core GEMM's
    32-row tile (the FFN 31.6 -> 3.8 us, H200 generality run). Two rows keep the CUDA-core GEMM."""
    with pytest.raises(ClusterError, match="one fp32 row over W \\[N, K\\] with K off 16 bytes"):
        find_simt_gemm(dense(1, 3000, 127, "float32"))
    assert find_simt_gemm(dense(2, 3000, 127, "float32")).m == 2
    with caplog.at_level("INFO", logger="tvm_dsm.driver"):
        assert tvm_dsm.build(dense(1, 3000, 127, "float32"), H100) is not None
    assert "falls back" in caplog.text and "failed to schedule" not in caplog.text


@pytest.mark.gpu
@pytest.mark.parametrize("k", [127, 381])
def test_gpu_one_fp32_row_over_k_off_16_bytes_matches_float64(k):
    rng = np.random.default_rng()
    x, w = rng.standard_normal((1, k)), rng.standard_normal((3000, k))
    assert relative_error_on_gpu(dense(1, 3000, k, "float32"), [x, w], lambda x, w: x @ w.T, (1, 3000),
                                 np.float32) < 1e-5


def test_topi_dense_plans_the_family():
    assert tvm_dsm.plan(_topi_dense(64, 1000, 512)).family.name == "simt_gemm"


def test_short_grids_split_k_and_large_ones_do_not():
    hw = load_hardware()
    assert tvm_dsm.plan(dense(13, 127, 3000, "float32")).best.config.split_k > 1
    assert tvm_dsm.plan(dense(1024, 4096, 4096, "float32")).best.config.split_k == 1
    plans = SimtGemm().rank(find_simt_gemm(dense(13, 127, 3000, "float32")), hw)
    assert all(p.seconds["main_loop"] > 0 for p in plans)


def _reduction(m, n, k, combine):
    x = te.placeholder((m, k), "float32", name="x")
    w = te.placeholder((n, k), "float32", name="w")
    r = te.reduce_axis((0, k), "r")
    return te.create_prim_func([x, w, te.compute((m, n), lambda i, j: combine(x[i, r], w[j, r], r), name="y")])


@pytest.mark.parametrize("combine", [lambda a, b, r: te.max(a + b, axis=r), lambda a, b, r: te.sum(te.exp(a * b), axis=r),
                                     lambda a, b, r: te.sum(a + b, axis=r)])
def test_reductions_that_are_no_sum_of_products_are_refused(combine):
    """Padded K reads zeros: a max or a sum of exponentials over them would change (a row of
    negative maxima would come out 0), so the rule takes sums of products only."""
    func = _reduction(64, 4096, 1000, combine)
    with pytest.raises(ClusterError, match="sum of products|zero"):
        find_simt_gemm(func)
    try:
        family, _ = match_family(func)
    except ClusterError:
        return
    assert family.name != "simt_gemm"


def test_plans_past_the_tie_keep_the_predicted_order():
    plans = SimtGemm().rank(find_simt_gemm(dense(13, 127, 3000, "float32")), load_hardware())
    best = plans[0].predicted_us
    outside = [p.predicted_us for p in plans if p.predicted_us > best * 1.05]
    assert outside == sorted(outside) and plans[len(plans) - len(outside):][0].predicted_us == min(outside)


def test_refusals_name_the_limit():
    with pytest.raises(ClusterError, match="one type among"):
        find_simt_gemm(dense(64, 128, 256, "float8_e4m3fn"))
    with pytest.raises(ClusterError, match="one product"):
        find_simt_gemm(gated_dense(64, 128, 256, "float32"))
    with pytest.raises(ClusterError, match="threads"):
        check_config(find_simt_gemm(dense(64, 128, 256, "float32")), SimtGemmConfig(16, 32, 8, 4, 4))


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k", "layout"), SHAPES)
@pytest.mark.parametrize("rows", ["constant", "symbolic"])
def test_fp32_gemm_is_correct_on_the_gpu(m, n, k, layout, rows):
    rng = np.random.default_rng()
    x = rng.standard_normal((m, k))
    w = rng.standard_normal((n, k) if layout == "nk" else (k, n))
    b = rng.standard_normal(n)
    func = dense(m if rows == "constant" else te.var("m"), n, k, "float32", weight_layout=layout,
                 bias=True, activation="relu")

    def reference(x, w, b):
        return np.maximum(x @ (w.T if layout == "nk" else w) + b, 0)

    assert relative_error_on_gpu(func, [x, w, b], reference, (m, n), np.float32) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k", "layout", "dtype"), ODD_ROWS)
def test_16_bit_rows_off_16_bytes_are_correct_on_the_gpu(m, n, k, layout, dtype):
    import ml_dtypes

    rng = np.random.default_rng()
    x = rng.standard_normal((m, k))
    w = rng.standard_normal((n, k) if layout == "nk" else (k, n)) / np.sqrt(k)
    func = dense(m, n, k, dtype, weight_layout=layout)
    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    error = relative_error_on_gpu(func, [x, w], lambda x, w: x @ (w.T if layout == "nk" else w), (m, n), np_dtype)
    assert error < (2 ** -8 if dtype == "bfloat16" else 2e-3)
