"""Linear layers over activations of rank 3 (``x[b, s, k] @ W^T``) taken as GEMMs of ``b * s``
rows (tvm_dsm.transform.rows_as_matrix): the merged function computes what the original does,
the families schedule it behind the original signature, and forms whose leading axes are not
only rows are left as they are."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax, te, topi, tirx
from tvm.script import tirx as T

import tvm_dsm
from conftest import LLVM, TARGET, cuda_source
from tvm_dsm.errors import ClusterError
from tvm_dsm.transform.rows_as_matrix import over_original_tensors, rows_as_matrix


def linear(batch, seq, k, n, dtype="float16", bias=False, position=False):
    """``o[b, s, n] = relu(sum_k x[b, s, k] w[n, k] (+ bias[n]) (+ pos[s, n]))``, accumulated in
    fp32 and cast to ``dtype``, written in TE as a user would."""
    x = te.placeholder((batch, seq, k), dtype, "x")
    w = te.placeholder((n, k), dtype, "w")
    r = te.reduce_axis((0, k), "r")
    y = te.compute((batch, seq, n), lambda b, s, j: te.sum(x[b, s, r].astype("float32") * w[j, r].astype("float32"),
                                                          axis=r), name="y")
    extra, params = [], [x, w]
    if bias:
        extra.append(te.placeholder((n,), "float32", "bias"))
        params.append(extra[-1])
    if position:
        extra.append(te.placeholder((seq, n), "float32", "pos"))
        params.append(extra[-1])

    def out(b, s, j):
        v = y[b, s, j]
        if bias:
            v = v + extra[0][j]
        if position:
            v = v + extra[-1][s, j]
        return te.max(v, tirx.const(0, "float32")).astype(dtype)

    o = te.compute((batch, seq, n), out, name="o")
    return te.create_prim_func([*params, o])


def _run_on_llvm(func, arrays: list, out_shape) -> np.ndarray:
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=LLVM)
    out = tvm.runtime.tensor(np.full(out_shape, np.nan, "float32"))
    lib["main"](*(tvm.runtime.tensor(a) for a in arrays), out)
    return out.numpy()


@pytest.mark.parametrize(("batch", "seq"), [(3, 5), (1, 7), (4, 1)])
def test_the_merged_function_computes_the_original(batch, seq):
    rng = np.random.default_rng(0)
    k, n = 16, 24
    func = linear(batch, seq, k, n, dtype="float32", bias=True)
    matrices = rows_as_matrix(func)
    assert [len(p.ty.shape) for p in matrices.func.params] == [2, 2, 1, 2] and matrices.rows is None
    x, w, b = rng.standard_normal((batch, seq, k)), rng.standard_normal((n, k)), rng.standard_normal(n)
    got = _run_on_llvm(over_original_tensors(func, matrices, matrices.func), [a.astype("float32") for a in (x, w, b)],
                       (batch, seq, n))
    ref = np.maximum(x @ w.T + b, 0)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


@pytest.mark.parametrize(("batch", "seq", "bound"), [("batch", 1, False), ("batch", "seq", True), (1, "seq", False),
                                                     (3, "seq", True)])
def test_symbolic_rows_merge_into_one_row_variable(batch, seq, bound):
    """A symbolic batch of one-token rows, a symbolic sequence, or rows a product (a batch and a
    sequence both symbolic, a constant batch of a symbolic sequence: the matrices then take a
    row variable of their own, bound to the product when called)."""
    rng = np.random.default_rng(1)
    func = linear(*(te.var(d) if isinstance(d, str) else d for d in (batch, seq)), 16, 8, dtype="float32")
    matrices = rows_as_matrix(func)
    assert isinstance(matrices.func.params[0].ty.shape[0], tirx.Var) and (matrices.rows is not None) == bound
    for b, s in ((1, 1), (3, 5)):
        b, s = (b if isinstance(batch, str) else batch), (s if isinstance(seq, str) else seq)
        x, w = rng.standard_normal((b, s, 16)), rng.standard_normal((8, 16))
        got = _run_on_llvm(over_original_tensors(func, matrices, matrices.func),
                           [x.astype("float32"), w.astype("float32")], (b, s, 8))
        ref = np.maximum(x @ w.T, 0)
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


def _rms_norm(batch, seq, width: int = 64, dtype: str = "float32"):
    x = te.placeholder((batch, seq, width), dtype, "x")
    w = te.placeholder((width,), dtype, "w")
    return te.create_prim_func([x, w, topi.nn.rms_norm(x, w, axis=[2], epsilon=1e-6)])


def test_a_norm_over_a_batch_and_a_sequence_merges_with_the_same_values():
    """The statistics hold one value a row (indexed by the rows alone); the weight's cast iterates
    no row and stays as it is."""
    func = _rms_norm(te.var("batch"), te.var("seq"))
    matrices = rows_as_matrix(func)
    assert matrices is not None and matrices.rows is not None
    rng = np.random.default_rng(5)
    for b, s in ((1, 1), (2, 7)):
        x, w = rng.standard_normal((b, s, 64)).astype("float32"), rng.standard_normal(64).astype("float32")
        got = _run_on_llvm(over_original_tensors(func, matrices, matrices.func), [x, w], (b, s, 64))
        ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


def test_a_norm_over_a_symbolic_batch_and_sequence_builds_the_row_norm(caplog):
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        tvm_dsm.build(_rms_norm(te.var("batch"), te.var("seq"), 2048, "float16"), TARGET)
    assert "row_norm" in caplog.text and "scheduled as matrices" in caplog.text


def _broadcast_weight_batch_matmul(batch: int, m: int, n: int, k: int, dtype: str = "float16"):
    """TOPI's ``batch_matmul`` of activations ``[batch, m, k]`` by one ``[1, n, k]`` weight (what a
    Linear over a transposed 3-D input imports as), fp32 accumulation cast to ``dtype``."""
    x = te.placeholder((batch, m, k), dtype, "x")
    w = te.placeholder((1, n, k), dtype, "w")
    return te.create_prim_func([x, w, topi.cast(topi.nn.batch_matmul(x, w, out_dtype="float32"), dtype)])


def test_a_weight_of_a_batch_of_one_is_the_matrix_it_holds():
    rng = np.random.default_rng()
    func = _broadcast_weight_batch_matmul(3, 5, 24, 16, "float32")
    matrices = rows_as_matrix(func)
    assert [[int(d) for d in p.ty.shape] for p in matrices.func.params] == [[15, 16], [24, 16], [15, 24]]
    x, w = rng.standard_normal((3, 5, 16)).astype("float32"), rng.standard_normal((1, 24, 16)).astype("float32")
    got = _run_on_llvm(over_original_tensors(func, matrices, matrices.func), [x, w], (3, 5, 24))
    ref = x.astype(np.float64) @ w[0].astype(np.float64).T
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


def test_a_batch_matmul_of_a_broadcast_weight_builds_as_a_split_k_gemm(caplog):
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        sch = tvm_dsm.driver.schedule(_broadcast_weight_batch_matmul(8, 197, 768, 768), TARGET)
    assert "scheduled as matrices" in caplog.text
    assert [len(p.ty.shape) for p in sch.mod["main"].params] == [3, 3, 3]  # called as written
    assert "tensormap" in cuda_source(sch.mod).lower()


def _mqa_scores(heads: int, seq: int, dim: int, dtype: str = "float16"):
    """Relax's ``matmul`` of ``q [1, H, S, D]`` by one broadcast KV head ``k_t [1, 1, D, S]``
    (MQA), legalized: the batch of one indexes the weight too (``k_t[b, 0, d, s]``)."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((1, heads, seq, dim), dtype))
    kt = relax.Var("k_t", relax.TensorType((1, 1, dim, seq), dtype))
    with bb.function("main", [q, kt]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(q, kt, out_dtype="float32"))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))


def test_a_weight_read_at_a_batch_of_one_is_the_matrix_it_holds():
    rng = np.random.default_rng()
    func = _mqa_scores(3, 9, 16, "float32")
    matrices = rows_as_matrix(func)
    assert [[int(d) for d in p.ty.shape] for p in matrices.func.params] == [[27, 16], [16, 9], [27, 9]]
    q, kt = rng.standard_normal((1, 3, 9, 16)).astype("float32"), rng.standard_normal((1, 1, 16, 9)).astype("float32")
    got = _run_on_llvm(over_original_tensors(func, matrices, matrices.func), [q, kt], (1, 3, 9, 9))
    ref = q.astype(np.float64) @ kt.astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5


def test_mqa_scores_over_one_broadcast_kv_head_build_as_a_gemm(caplog):
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        source = tvm_dsm.build(_mqa_scores(71, 2048, 64), TARGET).mod.imports[0].inspect_source()
    assert "scheduled as matrices" in caplog.text and "mma" in source


@pytest.mark.gpu
def test_mqa_scores_over_one_broadcast_kv_head_are_correct_on_the_gpu():
    rng = np.random.default_rng()
    q = rng.standard_normal((1, 7, 300, 64)).astype("float16")
    kt = (rng.standard_normal((1, 1, 64, 300)) / 8).astype("float16")
    lib = tvm_dsm.build(_mqa_scores(7, 300, 64), TARGET)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((1, 7, 300, 300), np.nan, "float32"), dev)
    lib(tvm.runtime.tensor(q, dev), tvm.runtime.tensor(kt, dev), out)
    got, ref = out.numpy().astype(np.float64), q.astype(np.float64) @ kt.astype(np.float64)
    assert not np.isnan(got).any() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def _batched_weights():
    a = te.placeholder((4, 32, 64), "float16", "a")
    b = te.placeholder((4, 48, 64), "float16", "b")
    return te.create_prim_func([a, b, topi.nn.batch_matmul(a, b, out_dtype="float32")])


def _longer_tensor_than_its_rows():
    """``x[4, 256, 64]`` of which the rows ``s < 128`` are read: merged, row ``b * 128 + s`` is
    not where ``x[b, s]`` lies."""
    x = te.placeholder((4, 256, 64), "float16", "x")
    w = te.placeholder((32, 64), "float16", "w")
    r = te.reduce_axis((0, 64), "r")
    y = te.compute((4, 128, 32), lambda b, s, j: te.sum(x[b, s, r].astype("float32") * w[j, r].astype("float32"),
                                                       axis=r), name="y")
    return te.create_prim_func([x, w, y])


def _matrix():
    x = te.placeholder((8, 64), "float16", "x")
    w = te.placeholder((16, 64), "float16", "w")
    return te.create_prim_func([x, w, topi.nn.dense(x, w, out_dtype="float32")])


@pytest.mark.parametrize("func", [
    pytest.param(linear(2, 8, 64, 32, position=True), id="a row axis read as a position"),
    pytest.param(_batched_weights(), id="the batch axis indexes the weights too"),
    pytest.param(_matrix(), id="already a matrix"),
    pytest.param(_longer_tensor_than_its_rows(), id="a tensor longer than the rows read"),
])
def test_forms_whose_leading_axes_are_not_only_rows_are_left_alone(func):
    assert rows_as_matrix(func) is None


def test_plan_says_a_rank_3_linear_is_planned_as_matrices():
    func = linear(4, 128, 1024, 4096)
    with pytest.raises(ClusterError, match="take it as matrices"):
        tvm_dsm.plan(func)
    assert tvm_dsm.plan(rows_as_matrix(func).func).family.name == "split_k_gemm"


def _decode_gemv():
    """A symbolic batch over a weight decoded in the function (MLC's batched decode GEMV over
    4-bit codes), the decode stage's buffer allocated by a statement."""
    @T.prim_func(s_tir=True)
    def decode_gemv(packed: T.Buffer((40, 16), "uint32"), scale: T.Buffer((40, 4), "float16"), p_x: T.handle,
                    p_y: T.handle):
        b = T.int32()
        x = T.match_buffer(p_x, (b, 1, 128), "float16")
        y = T.match_buffer(p_y, (b, 1, 40), "float16")
        w = T.alloc_buffer((40, 128), "float16")
        for i, j in T.grid(40, 128):
            with T.sblock("decode"):
                vi, vj = T.axis.remap("SS", [i, j])
                w[vi, vj] = (T.Cast("float16", T.bitwise_and(T.shift_right(packed[vi, vj // 8], T.Cast(
                    "uint32", vj % 8) * T.uint32(4)), T.uint32(15))) - T.float16(7)) * scale[vi, vj // 32]
        for i0, i1, i2, k in T.grid(b, 1, 40, 128):
            with T.sblock("NT_matmul"):
                v0, v1, v2, vk = T.axis.remap("SSSR", [i0, i1, i2, k])
                with T.init():
                    y[v0, v1, v2] = T.float16(0)
                y[v0, v1, v2] = y[v0, v1, v2] + x[v0, v1, vk] * w[v2, vk]
    return decode_gemv


def test_plan_gives_the_advice_only_where_it_holds_for_the_function_given():
    """The function as written is no matrix form: the advice would raise."""
    assert rows_as_matrix(_decode_gemv()) is None
    with pytest.raises(ClusterError) as refused:
        tvm_dsm.plan(_decode_gemv())
    assert "take it as matrices" not in str(refused.value)


def test_a_symbolic_batch_over_a_decode_stage_builds_its_ranges_on_tma(caplog):
    """One operator at a time, the product's rows are a view of x declared after the decode
    kernel: its TMA copies read that view (the tensor maps encoded after it)."""
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        lib = tvm_dsm.build(_decode_gemv(), TARGET)
    assert not [r for r in caplog.records if "does not lower" in r.getMessage()]
    assert "cp.async.bulk.tensor" in lib.mod.imports[0].inspect_source()
    # up to 8 rows the packed GEMV over the codes, not the decoded weight written out first
    assert "at 1 row(s), packed_gemv takes it whole" in caplog.text
    assert "at 8 row(s), packed_gemv takes it whole" in caplog.text and "at 9 row(s)" not in caplog.text


def _decode_gemv_2d():
    """The same in TE over ``x[b, K]``: its product's blocks are not rewritten as matrices, so
    the packed GEMV at one row keeps the function's own block variables."""
    b = tirx.Var("b", "int32")
    x = te.placeholder((b, 1024), "float16", name="x")
    packed = te.placeholder((512, 128), "uint32", name="w_packed")
    scale = te.placeholder((512, 32), "float16", name="w_scale")
    w = te.compute((512, 1024), lambda j, c: (((packed[j, c // 8] >> (c % 8 * 4).astype("uint32")) & te.const(
        15, "uint32")).astype("float16") - te.const(7, "float16")) * scale[j, c // 32], name="decode")
    r = te.reduce_axis((0, 1024), name="k")
    return te.create_prim_func([x, packed, scale, te.compute((b, 512), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r))])


def test_a_two_dimensional_symbolic_batch_over_a_decode_stage_takes_the_packed_gemv_at_one_row(caplog):
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        sch = tvm_dsm.driver.schedule(_decode_gemv_2d(), TARGET)
        tvm.compile(sch.mod, target=TARGET)
    assert "at 1 row(s), packed_gemv takes it whole" in caplog.text


def test_a_rank_3_linear_builds_as_a_split_k_gemm(caplog):
    func = linear(4, 128, 1024, 4096)
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        sch = tvm_dsm.driver.schedule(func, TARGET)
    assert "scheduled as matrices" in caplog.text
    assert [len(p.ty.shape) for p in sch.mod["main"].params] == [3, 2, 3]  # called as written
    source = cuda_source(sch.mod)
    assert "mma" in source and "tensormap" in source.lower()


@pytest.mark.parametrize(("batch", "seq"), [("batch", 1), ("batch", "seq"), (2, "seq")])
def test_symbolic_rows_build_a_kernel_per_range_of_rows(caplog, batch, seq):
    dims = [te.var(d) if isinstance(d, str) else d for d in (batch, seq)]
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        lib = tvm_dsm.build(linear(*dims, 2048, 2048), TARGET)
    assert "scheduled as matrices" in caplog.text
    assert lib.mod.imports[0].inspect_source().count("__global__") > 2


def _legalized_linear(batch, seq, layout: str = "nk", n: int = 768):
    """``x @ W^T`` (``x @ W`` with ``layout`` "kn") of ``x[batch, seq, 1024]``, ``n`` wide, as
    Relax legalizes a matmul (int64 extents)."""
    from tvm import relax
    from tvm_dsm.workloads.generated import relax_prim_func

    def body(bb, x, w):
        weight = bb.emit(relax.op.permute_dims(w)) if layout == "nk" else w
        return relax.op.astype(bb.emit(relax.op.matmul(x, weight, out_dtype="float32")), "float16")

    w_shape = (n, 1024) if layout == "nk" else (1024, n)
    return relax_prim_func([("x", (batch, seq, 1024), "float16"), ("w", w_shape, "float16")], body)


@pytest.mark.parametrize(("seq", "layout", "n", "by"), [(64, "nk", 768, "a family"), ("seq", "nk", 768, "a family"),
                                                        ("seq", "kn", 768, "a family"), ("seq", "kn", 758, "a family")])
def test_a_relax_legalized_linear_of_rank_3_builds_as_matrices(caplog, seq, layout, n, by):
    """Relax's int64 form, a constant batch of 2: at a symbolic sequence TVM's own schedules
    cannot build it (dlight's matmul rule fails on the tensors); as matrices it takes a kernel
    per range of rows (the CUDA-core GEMM's where [K, N] rows are off 16 bytes)."""
    func = _legalized_linear(2, tirx.Var("seq", "int64") if seq == "seq" else seq, layout, n)
    with caplog.at_level(logging.INFO, logger="tvm_dsm.driver"):
        lib = tvm_dsm.build(func.with_attr("global_symbol", "main"), TARGET)
    assert f"scheduled as matrices (its tensors' leading axes merged into rows) by {by}" in caplog.text
    assert lib.mod.imports[0].inspect_source().count("__global__") >= (2 if by == "a family" and seq == "seq" else 1)


def _decoded_product(packed: np.ndarray, scale: np.ndarray, x: np.ndarray) -> np.ndarray:
    """:func:`_decode_gemv` in float64: 8 codes a word, low bits first, ``(q - 7) * s``."""
    codes = (packed[:, :, None].astype(np.uint64) >> (4 * np.arange(8, dtype=np.uint64))) & 15
    w = (codes.reshape(packed.shape[0], -1).astype(np.float64) - 7) * np.repeat(scale.astype(np.float64), 32, axis=1)
    return x.astype(np.float64) @ w.T


@pytest.mark.gpu
def test_a_symbolic_batch_over_a_decode_stage_is_correct_on_the_gpu():
    rng = np.random.default_rng(5)
    packed = rng.integers(0, 2 ** 32, (40, 16), dtype=np.uint64).astype(np.uint32)
    scale = rng.uniform(0.02, 0.05, (40, 4)).astype("float16")
    lib = tvm_dsm.build(_decode_gemv(), TARGET)
    dev = tvm.cuda(0)
    for batch in (1, 3, 8, 9, 70):  # the packed GEMV at 1, 3 and 8 rows; the operators apart past 8
        x = rng.uniform(-1, 1, (batch, 1, 128)).astype("float16")
        out = tvm.runtime.tensor(np.full((batch, 1, 40), np.nan, "float16"), dev)
        lib(*(tvm.runtime.tensor(a, dev) for a in (packed, scale, x)), out)
        got = out.numpy().astype(np.float64)
        ref = _decoded_product(packed, scale, x)
        assert not np.isnan(got).any() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3, batch


@pytest.mark.gpu
def test_a_linear_of_a_symbolic_batch_and_sequence_is_correct_on_the_gpu():
    rng = np.random.default_rng(3)
    k, n = 512, 384
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype("float16")
    lib = tvm_dsm.build(linear(te.var("batch"), te.var("seq"), k, n), TARGET)
    dev = tvm.cuda(0)
    for batch, seq in ((1, 1), (2, 37), (5, 300)):
        x = rng.standard_normal((batch, seq, k)).astype("float16")
        out = tvm.runtime.tensor(np.full((batch, seq, n), np.nan, "float16"), dev)
        lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
        got = out.numpy().astype(np.float64)
        ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T, 0)
        assert not np.isnan(got).any() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3, (batch, seq)


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "seq", "dtype"), [(4, 128, "float16"), (3, 37, "bfloat16"), (7, 1, "float16")])
def test_a_rank_3_linear_is_correct_on_the_gpu(batch, seq, dtype):
    import ml_dtypes

    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    rng = np.random.default_rng(2)
    k, n = 1024, 768
    x = rng.standard_normal((batch, seq, k)).astype(np_dtype)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np_dtype)
    b = rng.standard_normal(n).astype("float32")
    lib = tvm_dsm.build(linear(batch, seq, k, n, dtype=dtype, bias=True), TARGET)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((batch, seq, n), np.nan).astype(np_dtype), dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in (x, w, b)), out)
    got = out.numpy().astype(np.float64)
    assert not np.isnan(got).any()
    ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + b, 0)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "m", "n", "k"), [(8, 197, 768, 768), (3, 50, 96, 200)])
def test_a_batch_matmul_of_a_broadcast_weight_is_correct_on_the_gpu(batch, m, n, k):
    rng = np.random.default_rng()
    x = rng.standard_normal((batch, m, k)).astype("float16")
    w = (rng.standard_normal((1, n, k)) / np.sqrt(k)).astype("float16")
    lib = tvm_dsm.build(_broadcast_weight_batch_matmul(batch, m, n, k), TARGET)
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((batch, m, n), np.nan, "float16"), dev)
    lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
    got = out.numpy().astype(np.float64)
    ref = x.astype(np.float64) @ w[0].astype(np.float64).T
    assert not np.isnan(got).any() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
def test_a_relax_legalized_linear_of_a_symbolic_sequence_is_correct_on_the_gpu():
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((768, 1024)) / 32).astype("float16")
    lib = tvm_dsm.build(_legalized_linear(2, tirx.Var("seq", "int64")).with_attr("global_symbol", "main"), TARGET)
    dev = tvm.cuda(0)
    for seq in (1, 37, 300):
        x = rng.standard_normal((2, seq, 1024)).astype("float16")
        out = tvm.runtime.tensor(np.full((2, seq, 768), np.nan, "float16"), dev)
        lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
        got = out.numpy().astype(np.float64)
        ref = x.astype(np.float64) @ w.astype(np.float64).T
        assert not np.isnan(got).any() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3, seq


@pytest.mark.gpu
def test_a_norm_over_a_symbolic_batch_and_sequence_is_correct_on_the_gpu():
    rng = np.random.default_rng(6)
    lib = tvm_dsm.build(_rms_norm(te.var("batch"), te.var("seq"), 2048, "float16"), TARGET)
    w = rng.standard_normal(2048).astype("float16")
    dev = tvm.cuda(0)
    for batch, seq in ((1, 1), (3, 37), (4, 300)):
        x = rng.standard_normal((batch, seq, 2048)).astype("float16")
        out = tvm.runtime.tensor(np.full(x.shape, np.nan, "float16"), dev)
        lib(tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev), out)
        x64 = x.astype(np.float64)
        ref = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * w.astype(np.float64)
        got = out.numpy().astype(np.float64)
        assert not np.isnan(got).any() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3, (batch, seq)
