"""Functions of a symbolic row count: one kernel per range of rows (tvm_dsm.families.row_ranges),
through tvm_dsm.build, the Relax pipeline's matmul rewrite and the low-batch dispatch."""

import numpy as np
import pytest
import tvm
from tvm import te, tirx
from tvm.sym import Analyzer
from tvm.script import ir as I
from tvm.script import relax as R

import tvm_dsm
from tvm_dsm.driver import H100, schedule_row_ranges
from tvm_dsm.stock import stock_target
from tvm_dsm.errors import ClusterError
from tvm_dsm.families.row_ranges import ROW_RANGES, range_kernels
from tvm_dsm.ir import row_variable, substitute
from tvm_dsm.hardware import load_hardware
from tvm_dsm.relax_integration import lower_to_tir
from tvm_dsm.relax_pipeline import low_batch_dispatch
from tvm_dsm.workloads.dense import dense


def _kernels(source: str) -> int:
    return source.count("__global__") // 2  # each kernel is declared, then defined


def test_row_variable_finds_the_one_symbolic_extent():
    m = te.var("m")
    assert row_variable(dense(m, 256, 128)).same_as(m)
    assert row_variable(dense(64, 256, 128)) is None
    x = te.placeholder((te.var("a"), te.var("b")), "float16", name="X")
    y = te.compute(x.shape, lambda i, j: x[i, j], name="Y")
    with pytest.raises(ClusterError, match="one symbolic extent"):
        row_variable(te.create_prim_func([x, y]))


def test_each_range_gets_its_planned_configuration_and_equal_neighbours_merge():
    func = dense(te.var("m"), 2048, 2048)
    one, two, *kernels = range_kernels(func, H100, load_hardware())
    # a batch of one or two: a GEMV each (as constant rows get; fp32 up to 8: below)
    assert [(one.bound, one.family.name), (two.bound, two.family.name)] == [(1, "row_gemv"), (2, "row_gemv")]
    assert 1 < len(kernels) <= len(ROW_RANGES) + 1
    assert kernels[-1].bound is None
    bounds = [k.bound for k in kernels[:-1]]
    assert bounds == sorted(bounds) and set(bounds) <= set(ROW_RANGES)
    for first, second in zip(kernels, kernels[1:]):
        assert first.config != second.config
    # the smallest range is planned for 16 rows: a 16-row tile, not the 128-row tile of the last
    assert kernels[0].config.block_m < kernels[-1].config.block_m


def test_symbolic_dense_builds_one_kernel_per_range_and_the_cuda_compiles(assemble):
    func = dense(te.var("m"), 4096, 1024, "bfloat16")
    kernels, sch = schedule_row_ranges(func, H100)
    assert [k.family.name for k in kernels] == ["row_gemv"] * 2 + ["split_k_gemm"] * (len(kernels) - 2)
    assert [k.bound for k in kernels[:2]] == [1, 2]
    source = tvm.compile(sch.mod, target=tvm.target.Target(H100)).mod.imports[0].inspect_source()
    assert _kernels(source) == len(kernels)
    assert "int m)" in source  # the row count reaches each kernel (stores and tensor maps clip on it)
    assemble(source, "symbolic_dense")


def test_an_empty_batch_launches_nothing():
    """No kernel runs for 0 rows (cuLaunchKernel refuses a grid of no CTAs): the row count is
    tested on the host before every range's test."""
    m = te.var("m")
    _, sch = schedule_row_ranges(dense(m, 2048, 2048), H100)
    check, outer = sch.mod["main"].body.block.body  # the int32 extent check, then the ranges
    assert isinstance(check, tirx.AssertStmt)
    assert isinstance(outer, tirx.IfThenElse) and outer.else_case is None
    assert "0 < m" in str(outer.condition) or "m > 0" in str(outer.condition)
    assert tvm.compile(sch.mod, target=tvm.target.Target(H100)) is not None


def test_a_call_past_int32_indexing_is_refused_naming_the_limit():
    """The kernels index in int32: an output of 2^31 elements (262144 rows of 8192) would be
    addressed past its last int32 index, so the host refuses it before any launch."""
    m = te.var("m")
    _, sch = schedule_row_ranges(dense(m, 8192, 2048), H100)
    check = sch.mod["main"].body.block.body[0]
    assert isinstance(check, tirx.AssertStmt)
    assert "fewer than 2^31 elements" in str(check) and "split the call" in str(check)
    analyzer = Analyzer()
    holds = {rows: bool(analyzer.simplify(substitute(check.condition, [(m, tirx.const(rows, "int32"))])))
             for rows in (1, 262143, 262144, 2 ** 30)}
    assert holds == {1: True, 262143: True, 262144: False, 2 ** 30: False}


def test_a_static_tensor_of_2_31_elements_goes_to_dlight():
    """As Relax legalizes a linear (int64 extents), with an output of 2^31 elements: no family
    takes it (their kernels index in int32; this one's stores overflowed), and build falls back
    to dlight, whose indices TVM narrows only where their bounds allow."""
    def i64(v):
        return tirx.IntImm("int64", v)

    rows, n, k = 2 ** 31 // 8192, 8192, 64
    x = te.placeholder((i64(rows), i64(k)), "float16", name="x")
    w = te.placeholder((i64(n), i64(k)), "float16", name="w")
    r = te.reduce_axis((i64(0), i64(k)), "r")
    y = te.compute((i64(rows), i64(n)), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="y")
    func = te.create_prim_func([x, w, y])
    with pytest.raises(ClusterError, match=r"index in int32; y\[262144, 8192\] hold 2\^31"):
        tvm_dsm.plan(func)
    source = tvm_dsm.build(func).mod.imports[0].inspect_source()
    assert "__global__" in source and "CUtensorMap" not in source  # dlight's kernel, not a GEMM family's


@pytest.mark.gpu
def test_a_call_past_int32_indexing_raises_on_the_gpu():
    lib, dev = tvm_dsm.build(dense(te.var("m"), 8192, 2048)), tvm.cuda()
    rows = 2 ** 31 // 8192
    x, w = tvm.runtime.empty((rows, 2048), "float16", dev), tvm.runtime.empty((8192, 2048), "float16", dev)
    with pytest.raises(ValueError, match="fewer than 2"):
        lib(x, w, tvm.runtime.empty((rows, 8192), "float16", dev))


def test_a_family_without_symbolic_rows_is_refused_by_name():
    m = te.var("m")
    x = te.placeholder((m, 4096), "float16", name="x")
    r = te.reduce_axis((0, 4096), "r")
    s = te.compute((m,), lambda i: te.sum(x[i, r].astype("float32"), axis=r), name="s")
    with pytest.raises(ClusterError, match="symbolic"):
        schedule_row_ranges(te.create_prim_func([x, s]), H100)
    # tvm_dsm.build still returns a module: TVM's own schedule
    assert tvm_dsm.build(te.create_prim_func([x, s])) is not None


@I.ir_module
class _Linear:
    @R.function
    def main(x: R.Tensor(("b", 1, 512), "float16"), w: R.Tensor((1024, 512), "float16")):
        with R.dataflow():
            y = R.matmul(x, R.permute_dims(w))
            R.output(y)
        return y


def test_relax_linear_reaches_the_gemm_family_as_an_fp32_accumulated_matrix_product():
    mod = lower_to_tir(_Linear)
    matmuls = [f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc) and "matmul" in gv.name_hint]
    assert len(matmuls) == 1
    (func,) = matmuls
    assert [len(p.ty.shape) for p in func.params] == [2, 2, 2]
    kernels, _ = schedule_row_ranges(func, H100)
    assert [k.family.name for k in kernels[:3]] == ["row_gemv", "row_gemv", "split_k_gemm"]


def test_fp32_rows_up_to_8_get_a_row_gemv_each_as_constant_rows_do():
    """fp32 at 2-8 rows: the row GEMV 2-3x faster than the CUDA-core GEMM the first range takes
    (bench/results/archive/fp32_row_gemv_s64.json); a symbolic row count gets it too."""
    kernels = range_kernels(dense(te.var("m"), 1024, 1024, "float32"), H100, load_hardware())
    assert [(k.bound, k.family.name) for k in kernels[:8]] == [(r, "row_gemv") for r in range(1, 9)]
    assert {k.family.name for k in kernels[8:]} == {"simt_gemm"} and kernels[8].bound > 8


def test_low_batch_dispatch_branches_over_dlight_rules():
    func = dense(te.var("m"), 2048, 2048)
    with stock_target() as target:
        dispatched = low_batch_dispatch(func, target)
    assert dispatched is not None
    source = tvm.compile(tvm.IRModule({"main": dispatched}), target=stock_target()).mod.imports[0].inspect_source()
    assert _kernels(source) == 4  # three low-batch tiles and dlight's matmul
    assert low_batch_dispatch(dense(64, 2048, 2048), target) is None


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n, dtype", [(1, 1024, "float16"), (2, 1024, "float16"), (15, 1024, "float16"),
                                            (16, 1024, "float16"), (17, 1024, "float16"), (100, 1024, "float16"),
                                            (1025, 1024, "float16"), (4100, 1024, "float16"), (2500, 3000, "float16"),
                                            (4100, 3000, "float16"), (3, 1024, "float32"), (8, 1024, "float32"),
                                            (9, 1024, "float32")])
def test_symbolic_dense_on_the_gpu_at_every_range(rows, n, dtype):
    """Every range's kernel (and the row GEMV's of 1-2 rows, fp32 1-8); past 256 rows the
    clusters walk groups of rows of tiles, the last group shorter
    (tvm_dsm.transform.raster_clusters)."""
    func = dense(te.var("m"), n, 512, dtype)
    lib = tvm_dsm.build(func)
    dev = tvm.cuda()
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 512)).astype(dtype)
    w = (rng.standard_normal((n, 512)) / np.sqrt(512)).astype(dtype)
    out = tvm.runtime.tensor(np.full((rows, n), np.nan, dtype), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    ref = x.astype("float64") @ w.astype("float64").T
    err = np.linalg.norm(out.numpy().astype("float64") - ref) / np.linalg.norm(ref)
    assert err < (2e-3 if dtype == "float16" else 1e-5)


@pytest.mark.gpu
def test_symbolic_dense_on_the_gpu_with_no_rows():
    lib = tvm_dsm.build(dense(te.var("m"), 1024, 512))
    dev = tvm.cuda()
    x, w = np.zeros((0, 512), "float16"), np.zeros((1024, 512), "float16")
    out = tvm.runtime.tensor(np.zeros((0, 1024), "float16"), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    dev.sync()


def _symbolic_rms_norm(width: int = 2048):
    from tvm import topi

    x = te.placeholder((te.var("m"), 1, width), "float16", name="x")
    w = te.placeholder((width,), "float16", name="w")
    return te.create_prim_func([x, w, topi.nn.rms_norm(x, w, axis=[-1], epsilon=1e-5)])


def test_a_symbolic_rms_norm_takes_one_row_a_cta_in_every_range(assemble):
    func = _symbolic_rms_norm()
    kernels = range_kernels(func, H100, load_hardware())
    assert {k.family.name for k in kernels} == {"row_norm"}
    assert all(k.config.rows_per_cta == 1 for k in kernels)
    source = tvm.compile(schedule_row_ranges(func, H100)[1].mod,
                         target=tvm.target.Target(H100)).mod.imports[0].inspect_source()
    assert _kernels(source) == len(kernels)
    assemble(source, "symbolic_rms_norm")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 16, 17, 300])
def test_a_symbolic_rms_norm_on_the_gpu(rows):
    lib, dev = tvm_dsm.build(_symbolic_rms_norm()), tvm.cuda()
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, 1, 2048)).astype("float16")
    w = rng.standard_normal(2048).astype("float16")
    out = tvm.runtime.tensor(np.full(x.shape, np.nan, "float16"), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5) * w
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 2e-3


def test_a_private_function_of_a_symbolic_row_count_builds():
    """Relax's legalized functions are private (no global symbol): built alone, the dispatch over
    ranges of rows is the module's packed ``main`` (without one TVM's codegen meets the buffers
    themselves and fails)."""
    from tvm import relax

    rows = tvm.tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x, w = relax.Var("x", R.Tensor((rows, 4096), "float16")), relax.Var("w", R.Tensor((4096,), "float16"))
    with bb.function("main", [x, w]):
        bb.emit_func_output(bb.emit(relax.op.nn.rms_norm(x, w, axes=[-1])))
    func = next(f for f in relax.transform.LegalizeOps()(bb.get()).functions.values()
                if isinstance(f, tvm.tirx.PrimFunc))
    assert "global_symbol" not in func.attrs
    source = tvm_dsm.build(func, H100).mod.imports[0].inspect_source()
    assert source.count("__global__") >= 2  # a kernel per range of rows


def test_branches_of_the_same_loops_get_loops_of_their_own():
    """Two ranges' schedules of one function side by side: each branch defines its own block,
    loop and let variables (s_tir refuses a variable defined twice)."""
    from tvm_dsm.ir import find_all, fresh_definitions

    body = dense(24, 64, 32).body
    copy = fresh_definitions(body)
    loop_vars = [loop.loop_var for loop in find_all(body, tirx.For)]
    copied = [loop.loop_var for loop in find_all(copy, tirx.For)]
    assert len(copied) == len(loop_vars) > 0
    assert not any(a.same_as(b) for a in copied for b in loop_vars)
