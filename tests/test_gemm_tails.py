"""The split-K GEMM at sizes off its tiles: tiles padded inside the kernel (zero-filled operand
copies, predicated stores), the limits it refuses, and the driver's use of it."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx
from tvm.s_tir import SBlockRealize

import tvm_dsm
from conftest import TARGET, cuda_source, kernels, relative_error_on_gpu
from tvm_dsm.errors import ClusterError
from tvm_dsm.families.split_k_gemm import SplitKGemm
from tvm_dsm.hardware import load_hardware
from tvm_dsm.ir import find_all
from tvm_dsm.rules.split_k_gemm import SplitKGemmConfig, find_gemm, schedule_split_k_gemm, tiled_shape
from tvm_dsm.transform.tma_pipeline import zero_filled_load
from tvm_dsm.workloads.chains import gemm_chain
from tvm_dsm.workloads.dense import dense, matmul

SHAPES = [(100, 3000, 1000), (7, 4096, 4096), (257, 2048, 1000)]
FORMS = [(dtype, layout) for dtype in ("bfloat16", "float16") for layout in ("nk", "kn")]
TMA_WGMMA = SplitKGemmConfig(2, 64, 128, 64, 4, 1, 4, tma=True, wgmma=True)


#: Rows off the 16-row tiles over [K, N] weights of whole tiles in N and K.
KN_ROW_TAILS = [(5, 4096, 4096), (7, 512, 14336), (37, 256, 512), (100, 2048, 1024)]
#: [K, N] weights off the tiles in N, K or both (and rows off them too).
KN_EDGES = [(100, 3000, 1000), (100, 3000, 1024), (5, 4096, 1000), (37, 264, 4104)]
#: Warpgroup MMAs over [K, N] weights, tiles of one, two and four 64-column panels: whole tiles,
#: N and K off them, rows off them.
MN_MAJOR = [SplitKGemmConfig(1, 128, 64, 64, 8, 1, 4, tma=True, wgmma=True),
            SplitKGemmConfig(1, 128, 128, 64, 8, 1, 4, tma=True, wgmma=True),
            SplitKGemmConfig(2, 64, 256, 64, 4, 1, 4, tma=True, wgmma=True)]
MN_MAJOR_SHAPES = [(128, 1024, 2048), (100, 3000, 1000), (37, 264, 4104)]
PTX_TYPES = {"float16": "f16", "bfloat16": "bf16"}
DTYPES = tuple(PTX_TYPES)


def _pairwise(*axes: list) -> list[tuple]:
    """Every combination of ``axes`` but the last, each with one of the last axis's values in
    turn: every value of the last axis meets every value of each other axis (pairwise, not the
    whole product: each case assembles a kernel with nvcc, a second of CI)."""
    combos = itertools.product(*axes[:-1])
    last = axes[-1]
    return [(*combo, last[(sum(a.index(v) for a, v in zip(axes, combo))) % len(last)]) for combo in combos]


@pytest.mark.parametrize(("shape", "dtype"), _pairwise(KN_EDGES, DTYPES))
def test_weights_stored_k_by_n_off_the_tiles_copy_their_edges_predicated(shape, dtype, assemble):
    """Off the tiles in N or K, W stored [K, N] reaches shared memory, in the configurations
    without TMA, by cp.async copies of 16-byte pieces (N a multiple of 8), those past N or K
    predicated off and zero-filled."""
    m, n, k = shape
    ranking = tvm_dsm.plan(dense(m, n, k, dtype, weight_layout="kn"))
    assert ranking.family.name == "split_k_gemm"
    rank = next(r for r, plan in enumerate(ranking.plans) if not plan.config.tma)
    tiles = tiled_shape(ranking.shape, ranking.plans[rank].config)
    assert (tiles.n, tiles.k) != (n, k)
    source = cuda_source(ranking.schedule(rank).mod)
    assert "@p cp.async.cg.shared.global" in source and "@!p st.shared.v4.u32" in source
    assemble(source, f"kn_edges_{m}x{n}x{k}_{dtype}")


@pytest.mark.parametrize(("shape", "dtype"), _pairwise(KN_ROW_TAILS, DTYPES))
def test_weights_stored_k_by_n_take_rows_off_the_tiles_transposed_by_ldmatrix(shape, dtype, assemble):
    """Rows past M are x's alone (zero-filled copies of x); in the configurations on mma.sync,
    W's tiles are whole and reach the fragments through ldmatrix.trans, in bf16 too (not TVM's
    8-bit gather loop, which an untyped ldmatrix call took, reading outside shared memory)."""
    m, n, k = shape
    ranking = tvm_dsm.plan(dense(m, n, k, dtype, weight_layout="kn"))
    assert ranking.family.name == "split_k_gemm"
    rank = next(r for r, plan in enumerate(ranking.plans) if not plan.config.wgmma)
    assert tiled_shape(ranking.shape, ranking.plans[rank].config).m != m
    source = cuda_source(ranking.schedule(rank).mod)
    assert "ldmatrix.sync.aligned.m8n8.x4.trans" in source and "for (int i = 0; i < 16; ++i)" not in source
    assemble(source, f"kn_rows_{m}x{n}x{k}_{dtype}")


@pytest.mark.parametrize(("config", "shape", "dtype"), _pairwise(MN_MAJOR, MN_MAJOR_SHAPES, DTYPES))
def test_weights_stored_k_by_n_take_tma_tiles_of_rows_of_n_that_wgmma_reads_mn_major(config, shape, dtype, assemble):
    """W stored [K, N] reaches shared memory as TMA tiles of 64 N-contiguous elements a K row,
    one box a 64-column panel (zero-filled past N and K), which the warpgroup MMA reads MN-major:
    no transposing copy."""
    m, n, k = shape
    source = cuda_source(_kn_schedule(m, n, k, dtype, config).mod)
    assert f"m64n{config.block_n}k16.f32.{PTX_TYPES[dtype]}" in source
    assert ", p, 1, 1, 0, 1;" in source  # B transposed (MN-major), A not
    copies = source.count("mbarrier__complete_tx__bytes((")
    assert copies == 2 * (1 + config.block_n // 64)  # prologue and loop: X's box and W's panels
    assemble(source, f"kn_mn_major_{m}x{n}x{k}_{dtype}_{config.block_n}")


#: Gated layers over [K, N] weights: two products a step, each W tile of one or two panels.
GATED_MN_MAJOR = [SplitKGemmConfig(1, 128, 64, 64, 8, 1, 4, tma=True, wgmma=True),
                  SplitKGemmConfig(1, 128, 128, 64, 8, 1, 4, tma=True, wgmma=True),
                  SplitKGemmConfig(2, 64, 128, 64, 4, 1, 3, tma=True, wgmma=True)]
GATED_MN_MAJOR_SHAPES = [(128, 512, 1024), (100, 3000, 1000), (37, 264, 4104)]


def _gated_kn(m, n, k):
    """``silu(X @ Wg) * (X @ Wu)`` with both weights stored [K, N]."""
    x = te.placeholder((m, k), "float16", name="X")
    wg, wu = (te.placeholder((k, n), "float16", name=name) for name in ("Wg", "Wu"))
    gate, up = matmul(x, wg, weight_layout="kn"), matmul(x, wu, weight_layout="kn")
    h = te.compute((m, n), lambda i, j: (gate[i, j] * te.sigmoid(gate[i, j]) * up[i, j]).astype("float16"),
                   name="H")
    return te.create_prim_func([x, wg, wu, h])


def _gated_kn_schedule(m, n, k, config):
    ranking = tvm_dsm.plan(_gated_kn(m, n, k))
    assert ranking.shape.products == 2
    return ranking.family.apply(ranking.func, config, ranking.hw)


@pytest.mark.parametrize("config", GATED_MN_MAJOR)
def test_a_gated_layer_over_weights_stored_k_by_n_copies_each_products_panels(config, assemble):
    """Each step copies X's box and, of each product, W's tile in boxes of one 64-column panel,
    which the two products' warpgroup MMAs read MN-major."""
    source = cuda_source(_gated_kn_schedule(128, 512, 1024, config).mod)
    assert f"m64n{config.block_n}k16.f32.f16" in source and ", p, 1, 1, 0, 1;" in source
    assert source.count("mbarrier__complete_tx__bytes((") == 2 * (1 + 2 * config.block_n // 64)
    assemble(source, f"gated_kn_mn_major_{config.block_n}_c{config.cluster_size}")


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), GATED_MN_MAJOR_SHAPES)
@pytest.mark.parametrize("config", GATED_MN_MAJOR)
def test_a_gated_layer_over_weights_stored_k_by_n_is_correct_on_the_gpu(m, n, k, config):
    rng = np.random.default_rng()
    x, wg, wu = rng.standard_normal((m, k)), *(rng.standard_normal((k, n)) / np.sqrt(k) for _ in range(2))

    def reference(x, wg, wu):
        gate = x @ wg
        return gate / (1 + np.exp(-gate)) * (x @ wu)

    sch = _gated_kn_schedule(m, n, k, config)
    assert relative_error_on_gpu(sch, [x, wg, wu], reference, (m, n), np.float16) < 2e-3


def test_a_dependent_kernel_copies_every_panel_of_a_read_only_weight_before_it_waits():
    """Launched programmatically with W a model's weight (read-only), the first steps' tiles of
    each of W's panels are copied (and, small enough, all its tiles prefetched into L2) before
    ``griddepcontrol.wait``; X's after it."""
    from tvm_dsm.annotations import LAUNCH_EARLY_KEY, READ_ONLY_PARAMS_KEY

    func = _kn_schedule(128, 256, 1024, "float16", MN_MAJOR[1]).mod["main"]
    func = func.with_attr(READ_ONLY_PARAMS_KEY, ["W"]).with_attr(LAUNCH_EARLY_KEY, True)
    source = cuda_source(tvm.IRModule({"main": func}))
    before, after = source[source.index("__global__"):].split("griddepcontrol_wait();", 1)
    copies = before.split("complete_tx__bytes((")[1:]
    assert len(copies) == 2 and all("W_tensormap" in c for c in copies)  # two panels
    assert "* 128) + 64)" in copies[1]  # the second panel 64 columns on
    assert before.count("prefetch_tensor_2d_L2_global_tile(") == 2
    assert "X_tensormap" in after.split("for (int ax")[0]  # X's first tiles only after the wait


def _kn_schedule(m, n, k, dtype, config):
    ranking = tvm_dsm.plan(dense(m, n, k, dtype, weight_layout="kn"))
    return ranking.family.apply(ranking.func, config, ranking.hw)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), MN_MAJOR_SHAPES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("config", MN_MAJOR)
def test_weights_stored_k_by_n_read_mn_major_are_correct_on_the_gpu(m, n, k, dtype, config):
    rng = np.random.default_rng()
    x, w = rng.standard_normal((m, k)), rng.standard_normal((k, n)) / np.sqrt(k)
    sch = _kn_schedule(m, n, k, dtype, config)
    assert relative_error_on_gpu(sch, [x, w], lambda x, w: x @ w, (m, n), _numpy_dtype(dtype)) < 2e-3


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize(("dtype", "layout"), [form for form in FORMS if form[1] == "nk"])
def test_the_family_takes_sizes_off_the_tiles_and_its_cuda_assembles(m, n, k, dtype, layout, assemble):
    ranking = tvm_dsm.plan(dense(m, n, k, dtype, weight_layout=layout))
    assert ranking.family.name == "split_k_gemm"
    config = ranking.best.config
    assert tiled_shape(ranking.shape, config) != ranking.shape  # every configuration pads
    assert config.tma == (layout == "nk")  # TMA where W rows are K-contiguous
    source = cuda_source(ranking.schedule().mod)
    assert source.count("__global__") == 2  # one kernel: no copy of X or Y around it
    assemble(source, f"tails_{m}x{n}x{k}_{dtype}_{layout}")


def _store_predicates(sch: s_tir.Schedule) -> list:
    """The predicates of the blocks writing the function's output (its last parameter)."""
    func = sch.mod["main"]
    out = func.params[-1]
    stores = find_all(func.body, SBlockRealize,
                      lambda r: any(w.source.same_as(out) for w in r.block.writes))
    return [r.predicate for r in stores]


@pytest.mark.parametrize(("m", "n", "k", "predicated"), [
    (128, 3072, 1024, False),  # whole tiles
    (128, 3072, 1000, False),  # K alone padded: zeros in the K sums, every row and column stored
    (100, 3072, 1024, True),
    (128, 3000, 1024, True),
    (100, 3000, 1000, True),
])
def test_the_stores_are_predicated_exactly_where_the_tile_overruns_m_or_n(m, n, k, predicated):
    sch = schedule_split_k_gemm(dense(m, n, k, "bfloat16", bias=True, activation="relu"), TMA_WGMMA, load_hardware())
    (predicate,) = _store_predicates(sch)
    assert (not (isinstance(predicate, tirx.IntImm) and predicate.value == 1)) == predicated


def test_a_matmul_writing_the_output_itself_stores_inside_it(assemble):
    x, w = te.placeholder((100, 1000), "float16", name="X"), te.placeholder((3000, 1000), "float16", name="W")
    sch = schedule_split_k_gemm(te.create_prim_func([x, w, matmul(x, w)]), TMA_WGMMA, load_hardware())
    (predicate,) = _store_predicates(sch)
    assert not isinstance(predicate, tirx.IntImm)
    assemble(cuda_source(sch.mod), "tails_fp32_output")


@pytest.mark.parametrize(("layout", "config"), [
    ("nk", TMA_WGMMA),
    ("nk", SplitKGemmConfig(2, 64, 64, 32, 2, 2, stages=3)),
])
def test_the_operand_copies_of_edge_tiles_are_zero_filled(layout, config):
    """TMA copies keep no predicate (the tensor maps describe X and W as they are, so a box past
    an edge lands zeros); cp.async copies past an edge are predicated and store zeros."""
    source = cuda_source(schedule_split_k_gemm(dense(100, 3000, 1000, "bfloat16", weight_layout=layout),
                                               config, load_hardware()).mod)
    if config.tma:
        assert "cp.async.bulk.tensor.2d" in source and "cp.async.cg" not in source
        # Each stage's mbarrier expects the whole boxes' bytes, zero-filled parts included.
        assert f"(uint){(config.block_m + config.block_n) * config.block_k * 2})" in source
    else:
        assert "@p cp.async.cg.shared.global" in source and "@!p st.shared.v4.u32" in source


def _copied_value(guard_extent: int, otherwise=0.0):
    """``if_then_else(b < guard_extent, G[a, k0 + b], otherwise)`` over a 16 x 64 tile of a
    ``G[16, 1000]`` at K step ``k0 = 64 * step`` (16 steps), with the loops around it."""
    g = tirx.decl_buffer((16, 1000), "float16", "G")
    a, b, step = (tirx.Var(name, "int32") for name in ("a", "b", "step"))
    loops = [tirx.For(var, 0, extent, tirx.ForKind.SERIAL, tirx.Evaluate(0))
             for var, extent in ((step, 16), (a, 16), (b, 64))]
    col = step * 64 + b
    value = tirx.if_then_else(col < guard_extent, tirx.BufferLoad(g, [a, col]),
                              tirx.const(otherwise, "float16"))
    return value, loops


def test_a_copy_predicate_is_dropped_only_where_it_says_inside_the_tensor():
    value, loops = _copied_value(1000)
    assert zero_filled_load(value, loops) is not None
    assert zero_filled_load(*_copied_value(500)) is None  # zeros inside the tensor: TMA would load them
    assert zero_filled_load(*_copied_value(1000, otherwise=1.0)) is None  # TMA fills zeros only


def test_a_copy_from_an_intermediate_compacted_to_its_kernels_rows_keeps_no_predicate():
    """Operators of a symbolic row count share an intermediate compacted to the rows their
    kernels touch: each range's padded rows and a few exact row counts', ``min(m, max(...,
    (m + 15) // 16 * 16 - 1, 3) + 1)`` rows. Its copies read inside it exactly where the rows are
    below ``m`` (the generality suite's FFN 7x1000x4096 [K, N] of a symbolic row count)."""
    m, tile, a, b = (tirx.Var(name, "int32") for name in ("m", "tile", "a", "b"))
    rows = tirx.Max(tirx.Max(tirx.Max(0, (m + 15) // 16 * 16 - 1), (m + 63) // 64 * 64 - 1), 3) + 1
    h = tirx.decl_buffer((tirx.Min(m, rows), 1000), "float16", "H")
    loops = [tirx.For(var, 0, extent, tirx.ForKind.SERIAL, tirx.Evaluate(0))
             for var, extent in ((tile, (m + 63) // 64), (a, 64), (b, 64))]
    row = tile * 64 + a

    def copied(bound):
        return tirx.if_then_else(tirx.And(row < bound, b < 1000), tirx.BufferLoad(h, [row, b]),
                                 tirx.const(0, "float16"))

    assert zero_filled_load(copied(m), loops) is not None
    assert zero_filled_load(copied(m - 1), loops) is None  # zeros inside the tensor


@pytest.mark.parametrize(("func", "limit"), [
    (dense(13, 512, 1001), "K a multiple of 8"),
    (dense(13, 512, 1004, "bfloat16"), "K a multiple of 8"),
    (dense(13, 1004, 512, weight_layout="kn"), "N a multiple of 8"),
])
def test_rows_off_16_bytes_are_refused_naming_the_limit_and_go_to_the_cuda_cores(func, limit):
    """(Large products take padded copies instead: tests/test_aligned_rows.py.)"""
    with pytest.raises(ClusterError, match=limit):
        SplitKGemm().recognize(func)
    assert tvm_dsm.plan(func).family.name == "simt_gemm"


#: Vocabularies whose rows of Y are not 16-byte aligned (GPT-2's; Llama 2's with a token added).
ODD_WIDTHS = [(8, 50257, 768), (100, 32001, 1024)]


@pytest.mark.parametrize(("m", "n", "k"), ODD_WIDTHS)
def test_widths_off_four_columns_store_one_column_at_a_time(m, n, k, assemble):
    ranking = tvm_dsm.plan(dense(m, n, k, bias=True))
    assert ranking.family.name == "split_k_gemm"
    source = cuda_source(ranking.schedule().mod)
    assert "Y_ptr[" in source and "(half4*)(Y_ptr" not in source  # scalar stores, no 8-byte vectors
    assemble(source, f"odd_width_{m}x{n}x{k}")


def test_the_gemm_family_leaves_one_row_of_weights_stored_n_by_k_to_the_row_gemv():
    from tvm_dsm.families.split_k_gemm import SplitKGemm

    family = SplitKGemm()
    with pytest.raises(ClusterError, match="M=1 is a GEMV"):
        family.rank(family.recognize(dense(1, 4096, 4096)), load_hardware())


def test_the_gemm_family_leaves_one_column_to_tvms_gemv():
    """A value head (``dense`` to one output): the tensor-core tile's other columns are waste."""
    from tvm_dsm.families.split_k_gemm import SplitKGemm

    family = SplitKGemm()
    with pytest.raises(ClusterError, match="N=1 is a matrix-vector product"):
        family.rank(family.recognize(dense(8192, 1, 4096)), load_hardware())
    assert family.rank(family.recognize(dense(8192, 8, 4096)), load_hardware())


def test_one_row_of_weights_stored_k_by_n_streams_w_on_a_tvm_dsm_family():
    """x @ W with W [K, N] at one row: the row GEMV reads rows of W [N, K], and TVM's GEMV of
    the columns ran 1x3000x2048 fp16 in 11.9 us against torch's 7.0 (H200, generality run); the
    column GEMV or the split-K GEMM (whose 16-row tile's tensor-core work is free beside reading
    W) takes it, whichever the models predict faster."""
    assert tvm_dsm.plan(dense(1, 3000, 2048, weight_layout="kn")).family.name in ("column_gemv", "split_k_gemm")


@pytest.mark.gpu
@pytest.mark.parametrize(("n", "k"), [(3000, 2048), (4096, 1000), (14336, 4096)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_one_row_of_weights_stored_k_by_n_is_correct_on_the_gpu(n, k, dtype):
    rng = np.random.default_rng()
    x, w = rng.standard_normal((1, k)), rng.standard_normal((k, n)) / np.sqrt(k)
    func = dense(1, n, k, dtype, weight_layout="kn")
    assert relative_error_on_gpu(func, [x, w], lambda x, w: x @ w, (1, n), _numpy_dtype(dtype)) < 2e-3


def test_shapes_that_fit_keep_whole_tiles_of_n_and_k():
    """Where N and K fit whole tiles no configuration pads them; tiles may run past M (TMA
    fills those rows with zeros): 6304 rows, a multiple of 32 only, run on taller warpgroup
    tiles rather than 32-row mma.sync ones."""
    for m in (128, 6304):
        ranking = tvm_dsm.plan(dense(m, 2304, 768))
        tiled = [tiled_shape(ranking.shape, p.config) for p in ranking.plans]
        assert all((t.n, t.k) == (2304, 768) for t in tiled)
    assert any(t.m > 6304 for t in tiled)
    assert ranking.plans[0].config.wgmma and ranking.plans[0].config.block_m >= 64


def test_the_padded_plan_counts_whole_tiles():
    shape = find_gemm(s_tir.Schedule(dense(100, 3000, 1000, "bfloat16")))[2]
    plan = tvm_dsm.planners.split_k_gemm.predict(shape, TMA_WGMMA, tvm_dsm.hardware.load_hardware())
    assert plan.ctas == 2 * 24 * 2  # 128 x 3072 in 64 x 128 tiles, clusters of 2


def _linear_with_a_widened_bias(m: int, n: int, k: int) -> tirx.PrimFunc:
    """``x @ w.T + b`` with the bias widened to fp32 in a block of its own, as Relax legalizes
    a torch Linear."""
    x = te.placeholder((m, k), "float16", name="x")
    w = te.placeholder((n, k), "float16", name="w")
    b = te.placeholder((n,), "float16", name="b")
    r = te.reduce_axis((0, k), "r")
    acc = te.compute((m, n), lambda i, j: te.sum(x[i, r].astype("float32") * w[j, r].astype("float32"), axis=r),
                     name="acc")
    wide = te.compute((n,), lambda j: b[j].astype("float32"), name="wide_bias")
    y = te.compute((m, n), lambda i, j: (acc[i, j] + wide[j]).astype("float16"), name="y")
    return te.create_prim_func([x, w, b, y])


def test_a_bias_widened_in_a_block_of_its_own_is_read_in_the_gemms_epilogue():
    """The widening reads no product: it is inlined into the epilogue, one TMA kernel."""
    source = tvm_dsm.build(_linear_with_a_widened_bias(6304, 2304, 768), TARGET).mod.imports[0].inspect_source()
    (gemm,) = kernels(source).values()
    assert "cp_async_bulk_tensor" in gemm and "b_ptr" in gemm


@pytest.mark.gpu
def test_a_bias_widened_in_a_block_of_its_own_on_the_gpu():
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((300, 256)), rng.standard_normal((768, 256)) / 16, rng.standard_normal(768)]
    error = relative_error_on_gpu(_linear_with_a_widened_bias(300, 768, 256), inputs, lambda x, w, b: x @ w.T + b,
                                  (300, 768), np.float16)
    assert error < 2e-3


def test_an_ffn_off_the_tiles_takes_the_family_per_operator():
    """Two GEMMs in one function: dlight takes neither, and each operator gets a split-K GEMM
    kernel of its own, padded inside (no kernel copies rows)."""
    source = tvm_dsm.build(gemm_chain(100, 3000, 1000, 1000), TARGET).mod.imports[0].inspect_source()
    gemms = kernels(source).values()
    assert len(gemms) == 2 and all("cp_async_bulk_tensor" in body for body in gemms)


def _numpy_dtype(dtype: str):
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
@pytest.mark.parametrize(("dtype", "layout"), FORMS)
def test_dense_off_the_tiles_is_correct_on_the_gpu(m, n, k, dtype, layout):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k))
    w = rng.standard_normal((n, k) if layout == "nk" else (k, n)) / np.sqrt(k)
    b = rng.standard_normal(n)
    func = dense(m, n, k, dtype, weight_layout=layout, bias=True, activation="relu")

    def reference(x, w, b):
        return np.maximum(x @ (w.T if layout == "nk" else w) + b, 0)

    assert relative_error_on_gpu(func, [x, w, b], reference, (m, n), _numpy_dtype(dtype)) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), KN_ROW_TAILS + KN_EDGES)
@pytest.mark.parametrize("rows", ["constant", "symbolic"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_weights_stored_k_by_n_at_rows_off_the_tiles_are_correct_on_the_gpu(m, n, k, rows, dtype):
    rng = np.random.default_rng()
    x, w = rng.standard_normal((m, k)), rng.standard_normal((k, n)) / np.sqrt(k)
    func = dense(m if rows == "constant" else te.var("m"), n, k, dtype, weight_layout="kn")
    assert relative_error_on_gpu(func, [x, w], lambda x, w: x @ w, (m, n), _numpy_dtype(dtype)) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), ODD_WIDTHS)
@pytest.mark.parametrize("rows", ["constant", "symbolic"])
def test_widths_off_four_columns_are_correct_on_the_gpu(m, n, k, rows):
    rng = np.random.default_rng()
    x, w, b = rng.standard_normal((m, k)), rng.standard_normal((n, k)) / np.sqrt(k), rng.standard_normal(n)
    func = dense(m if rows == "constant" else te.var("m"), n, k, "float16", bias=True, activation="relu")
    error = relative_error_on_gpu(func, [x, w, b], lambda x, w, b: np.maximum(x @ w.T + b, 0), (m, n), np.float16)
    assert error < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_an_ffn_of_weights_stored_k_by_n_at_37_rows_is_correct_on_the_gpu(dtype):
    """The FFN that once faulted: W1 and W2 stored [K, N], 37 rows."""
    m, n, k, l = 37, 512, 1024, 256
    rng = np.random.default_rng()
    a, w1, w2 = rng.standard_normal((m, k)), rng.standard_normal((k, n)) / np.sqrt(k), rng.standard_normal((n, l)) / np.sqrt(n)
    np_dtype = _numpy_dtype(dtype)

    def reference(a, w1, w2):
        return np.maximum(a @ w1, 0).astype(np_dtype).astype(np.float64) @ w2

    a_, w1_, w2_ = (te.placeholder(shape, dtype, name) for shape, name in (((m, k), "A"), ((k, n), "W1"), ((n, l), "W2")))
    h = te.compute((m, n), lambda i, j: te.max(matmul(a_, w1_, "kn")[i, j], 0).astype(dtype), name="H")
    func = te.create_prim_func([a_, w1_, w2_, te.compute((m, l), lambda i, j: matmul(h, w2_, "kn")[i, j].astype(dtype))])
    assert relative_error_on_gpu(func, [a, w1, w2], reference, (m, l), np_dtype) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 48, 300])
def test_a_16_bit_product_written_in_fp32_is_correct_on_the_gpu(m):
    """An LM head whose logits are cast to fp32 (Relax fuses the cast into the GEMM's epilogue):
    16-bit operands, an fp32 output, rows a variable."""
    rng = np.random.default_rng(0)
    n, k = 1000, 512
    x, w = rng.standard_normal((m, k)), rng.standard_normal((n, k)) / np.sqrt(k)
    lib = tvm_dsm.build(dense(te.var("m"), n, k, "float16", out_dtype="float32"), TARGET)
    dev = tvm.cuda(0)
    rounded = [a.astype("float16") for a in (x, w)]
    out = tvm.runtime.tensor(np.full((m, n), np.nan, "float32"), dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in rounded), out)
    ref = rounded[0].astype(np.float64) @ rounded[1].astype(np.float64).T
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_an_ffn_off_the_tiles_is_correct_on_the_gpu(dtype):
    m, n, k, l = 100, 3000, 1000, 1000
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k))
    w1 = rng.standard_normal((n, k)) / np.sqrt(k)
    w2 = rng.standard_normal((l, n)) / np.sqrt(n)
    np_dtype = _numpy_dtype(dtype)

    def reference(a, w1, w2):  # H is rounded to the input type between the GEMMs
        h = np.maximum(a @ w1.T, 0).astype(np_dtype).astype(np.float64)
        return h @ w2.T

    func = gemm_chain(m, n, k, l, dtype=dtype)
    assert relative_error_on_gpu(func, [a, w1, w2], reference, (m, l), np_dtype) < 2e-3
