"""The elementwise family: 16-byte vectors where every access moves contiguously along the
innermost loop, one element where any does not; a symbolic row count built as a kernel per range
of rows; on a GPU, the results against numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import s_tir, te, tirx, topi

import tvm_dsm
from tvm_dsm.families import match_family
from tvm_dsm.rules.elementwise import block_lanes, output_blocks, staged_lanes, staged_loads
from tvm_dsm.workloads.elementwise import cast, split_silu_mul
from conftest import LLVM, TARGET


def _rotate_half(m: int, d: int = 64, choose=te.if_then_else):
    x = te.placeholder((m, d), "float16", name="x")
    half = d // 2
    return te.create_prim_func([x, te.compute((m, d), lambda i, j: choose(
        j < half, -x[i, j + half], x[i, j - half]), name="r")])


def _padded(m: int, d: int, kept: int, out: int = 64):
    """``x[:, :kept]`` of a ``[m, d]`` input zero-filled to ``out`` columns (``nn.pad``'s form)."""
    x = te.placeholder((m, d), "float16", name="x")
    return te.create_prim_func([x, te.compute((m, out), lambda i, j: te.if_then_else(
        j < kept, x[i, j], tirx.const(0, "float16")), name="padded")])


def _slice_assigned(m: int):
    """``torch.slice_scatter`` of 64 columns into 96 (DeepSeek-V2's rotary half written into q)
    as Relax legalizes it: a select whose condition is a cast comparison of the column (uniform
    over 8 columns, yet TVM's vectorizer keeps it a vector of bools, which its CUDA code cannot
    declare)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((m, 96), "float16"))
    b = relax.Var("b", relax.TensorType((m, 64), "float16"))
    with bb.function("main", [a, b]):
        bb.emit_func_output(bb.emit(relax.op.slice_scatter(a, b, 0, 64, 1, axis=1)))
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)).with_attr("global_symbol", "main")


def _rotated_by_angles(m: int, d: int = 64):
    """Rotate-half times a cosine of the column: a condition uniform over vectors, and math
    per-thread math computes once per thread."""
    x = te.placeholder((m, d), "float16", name="x")
    half = d // 2
    return te.create_prim_func([x, te.compute((m, d), lambda i, j: te.if_then_else(
        j < half, -x[i, j + half], x[i, j - half]) * te.cos(j.astype("float16")), name="r")])


def _offset_rows(m: int):
    """Reads a ``[m, 1004]`` input into a ``[m, 1000]`` output: rows of another length."""
    x = te.placeholder((m, 1004), "float16", name="x")
    return te.create_prim_func([x, te.compute((m, 1000), lambda i, j: x[i, j + 4], name="y")])


def _transpose(m: int, n: int):
    x = te.placeholder((m, n), "float16", name="x")
    return te.create_prim_func([x, topi.transpose(x)])


def _packed_split(rows: int = 128, width: int = 128):
    """A fused QKV projection's output ``[rows, 3 * width]`` reshaped to ``[2, rows / 2, 3 *
    width]`` and split in three, as Relax legalizes a torch model's ``qkv.split(width, dim=2)``:
    the reshape reads ``x[(b * rows / 2 + j // (3 * width) + i) % rows, j % (3 * width)]``."""
    x = te.placeholder((rows, 3 * width), "float16", name="x")
    parts = topi.split(topi.reshape(x, (2, rows // 2, 3 * width)), [width, 2 * width], axis=2)
    return te.create_prim_func([x, *parts])


def _repeated_heads(rows: int = 64, kv_heads: int = 2, group: int = 7, dim: int = 64):
    """Grouped-query attention's keys repeated for every query head, as Hugging Face's
    ``repeat_kv`` writes it (``expand`` then ``reshape``) over a projection ``[rows, kv_heads *
    dim]``: ``out[r, h, d] = k[r, h // group * dim + d]``, a column offset of the other iterators."""
    k = te.placeholder((rows, kv_heads * dim), "float16", name="k")
    out = te.compute((rows, kv_heads * group, dim), lambda r, h, d: k[r, h // group * dim + d], name="repeated")
    return te.create_prim_func([k, out])


def _positions_compared(rows: int = 128):
    """Gemma-2's sliding-window mask: ``keys[j] <= queries[i]`` over int64 positions, a bool
    ``[rows, rows]`` result."""
    q = te.placeholder((rows,), "int64", name="q")
    k = te.placeholder((rows,), "int64", name="k")
    return te.create_prim_func([q, k, te.compute((rows, rows), lambda i, j: k[j] <= q[i], name="keep")])


def _lanes(func) -> int:
    sch = s_tir.Schedule(func)
    return min(block_lanes(sch.get(b)) for b in output_blocks(sch))


@pytest.mark.parametrize("func, lanes", [
    (split_silu_mul(64, 1024), 8),  # both halves move along j
    (cast(64, 1000), 4),  # the widest element (fp32) sets the lanes
    (_rotate_half(64), 8),  # a condition on j alike for every vector of 8 columns
    (_rotate_half(64, choose=tirx.Select), 8),  # the same as a Select (scheduled as a branch)
    (_padded(64, 40, 40), 8),  # a pad of rows of 40 to 64: j < 40 at 8 lanes
    (_padded(64, 40, 36), 1),  # j < 36 splits a vector
    (_slice_assigned(64), 1),  # a select's condition: a vector of bools in TVM's CUDA code
    (_rotated_by_angles(64), 1),  # a cosine: per-thread math's, which computes it once a thread
    (_transpose(64, 128), 1),  # j indexes the input's rows
    (_offset_rows(64), 1),  # vectors of odd rows would start off 16-byte alignment
    (_packed_split(), 8),  # the reshape's row and column, simplified within the ranges, move along j
    (_repeated_heads(), 8),  # a column offset h // g * D, a multiple of the lanes
    (_repeated_heads(dim=36), 1),  # h // g * 36 is not
    (_positions_compared(), 1),  # TVM stores two bools as a ushort2 (misaligned on the GPU)
])
def test_vector_lanes(func, lanes):
    assert _lanes(func) == lanes


def _swiglu_by_sigmoid(rows, width: int = 14336):
    """``g * sigmoid(g) * u`` of bf16 halves computed in fp32, as a user writes SwiGLU with
    ``te.sigmoid`` (user function 149)."""
    g, u = (te.placeholder((rows, width), "bfloat16", name=name) for name in ("gate", "up"))
    y = te.compute((rows, width), lambda i, j: (g[i, j].astype("float32") * te.sigmoid(g[i, j].astype("float32"))
                                                * u[i, j].astype("float32")).astype("bfloat16"), name="swiglu")
    return te.create_prim_func([g, u, y])


@pytest.mark.parametrize("symbolic", [False, True])
def test_a_sigmoid_in_fp32_bounds_the_lanes_as_its_constants_do(symbolic, assemble):
    """TVM writes sigmoid as 1 / (1 + exp(-x)) after vectorizing: its fp32 ones, 8 lanes wide,
    would be an invalid make_ulonglong4 of 8 floats."""
    func = _swiglu_by_sigmoid(te.var("n") if symbolic else 64)
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert "make_ulonglong4" not in source
    assemble(source, "swiglu_by_sigmoid")


@pytest.mark.parametrize("condition", [lambda j: j >= 32, lambda j: tirx.LE(tirx.const(32, "int32"), j),
                                       lambda j: j < 32, lambda j: j > 31])
def test_a_branch_on_a_bound_of_the_vector_axis_builds_in_vectors_in_any_spelling(condition):
    """``j >= 32`` (TVM's canonical ``32 <= j``) is a vector of bools to TVM's vectorizer, which
    leaves the loop scalar; written as ``j < 32`` with the branches swapped it is one condition a
    vector, as the other spellings are."""
    x = te.placeholder((64, 64), "float16", name="x")
    func = te.create_prim_func([x, te.compute((64, 64), lambda i, j: te.if_then_else(
        condition(j), x[i, j - 32], -x[i, j + 32]), name="r")])
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert "*(uint4*)(r_ptr + " in source


def test_a_select_on_bounds_of_the_vector_axis_builds_in_vectors():
    """Rotate-half written with a Select: vectorized as written, its condition would be a vector
    of bools, which TVM's CUDA code cannot declare; scheduled as a branch it is one condition a
    vector, and the kernel moves 16 bytes an access."""
    source = tvm_dsm.build(_rotate_half(64, choose=tirx.Select)).mod.imports[0].inspect_source()
    assert "uint4" in source


def test_reductions_are_not_elementwise():
    x = te.placeholder((64, 128), "float32", name="x")
    k = te.reduce_axis((0, 128))
    func = te.create_prim_func([x, te.compute((64,), lambda i: te.sum(x[i, k], axis=k))])
    family, _ = match_family(func)
    assert family.name != "elementwise"


def test_a_symbolic_row_count_builds_a_vectorized_kernel_per_range():
    """Ranges planned with different vectors per thread sit in one function side by side (their
    blocks' variables renewed), and every kernel moves 16-byte vectors."""
    m = tirx.Var("m", "int32")
    func = split_silu_mul(m, 1024)
    family, _ = match_family(split_silu_mul(4096, 1024))
    assert family.name == "elementwise"
    kernels, _ = tvm_dsm.driver.schedule_row_ranges(func)
    assert len({k.config for k in kernels}) > 1
    source = tvm_dsm.build(func).mod.imports[0].inspect_source()
    names = set(re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", source))
    assert len(names) == len(kernels) and "uint4" in source


def _residual(batch, seq):
    """A residual add over ``[batch, seq, 512]`` (a model's of a symbolic batch and length)."""
    a, b = (te.placeholder((batch, seq, 512), "float16", name=n) for n in "ab")
    return te.create_prim_func([a, b, te.compute(a.shape, lambda i, j, k: a[i, j, k] + b[i, j, k], name="out")])


def test_two_symbolic_extents_build_one_vectorized_kernel():
    """A batch and a sequence length both symbolic: one kernel over any element count (the grid
    and its tail follow both), not dlight's."""
    func = _residual(tirx.Var("batch", "int32"), tirx.Var("seq", "int32"))
    kernels, _ = tvm_dsm.driver.schedule_row_ranges(func)
    assert {k.family.name for k in kernels} == {"elementwise"}
    source = tvm_dsm.build(func).mod.imports[0].inspect_source()
    assert "uint4" in source


def test_a_slice_assignment_compiles_through_the_relax_pipeline():
    """A slice assignment (DeepSeek-V2's rotary half written into q) compiles for CUDA through
    ``relax.get_pipeline("tvm_dsm")``: vectorized, it stopped in TVM's codegen ("Cannot convert
    type T.boolx8 to CUDA type")."""
    from tvm import relax

    from conftest import TARGET

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType((128, 96), "float16"))
    b = relax.Var("b", relax.TensorType((128, 64), "float16"))
    with bb.function("main", [a, b]):
        bb.emit_func_output(bb.emit(relax.op.slice_scatter(a, b, 0, 64, 1, axis=1)))
    assert tvm.compile(bb.get(), target=TARGET, relax_pipeline="tvm_dsm") is not None


def _leaky_relu(m: int, width: int = 4096):
    """``Select(x > 0, x, 0.01 x)``: a condition on the values, different for each lane."""
    x = te.placeholder((m, width), "float16", name="x")
    return te.create_prim_func([x, te.compute(x.shape, lambda i, j: tirx.Select(
        x[i, j] > tirx.const(0, "float16"), x[i, j], x[i, j] * tirx.const(0.01, "float16")), name="y")])


def _masked_fill(m: int, width: int = 4096):
    """``torch.masked_fill(x, mask, 0)`` with a bool mask tensor."""
    x = te.placeholder((m, width), "float16", name="x")
    mask = te.placeholder((m, width), "bool", name="mask")
    return te.create_prim_func([x, mask, te.compute(x.shape, lambda i, j: te.if_then_else(
        mask[i, j], tirx.const(0, "float16"), x[i, j]), name="y")])


@pytest.mark.parametrize("func, staged", [
    (_leaky_relu(64), ["x"]),
    (_masked_fill(64), ["x"]),  # the bool mask read an element at a time
    (_padded(64, 40, 36), []),  # rows of 40 under 64 columns: a vector of x could run past its row
    (_slice_assigned(64), ["a"]),  # b has 64 columns of the 96
])
def test_lanes_that_differ_in_a_condition_move_vectors_through_registers(assemble, func, staged):
    """Conditions that differ between the lanes of a vector: the store, and the loads of
    operands whose rows the vectors cannot overrun, move 16 bytes through registers; each lane's
    value computed alone between them (no vector of bools for TVM's CUDA code to declare)."""
    sch = s_tir.Schedule(func)
    (block,) = [sch.get(b) for b in output_blocks(sch)]
    assert block_lanes(block) == 1 and staged_lanes(block) == 8 and staged_loads(block) == staged
    family, _ = match_family(func)
    assert family.name == "elementwise"
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    stores = re.findall(r"\*\(uint4\*\)\(\w+_ptr \+ [^=]*\) = \*\(uint4\*\)\(\w+_local_ptr", source)
    loads = re.findall(r"\*\(uint4\*\)\(\w+_local_ptr[^=]*\) = \*\(uint4\*\)\((\w+)_ptr", source)
    assert stores and sorted(set(loads)) == staged
    assemble(source, "staged_elementwise")


@pytest.mark.gpu
@pytest.mark.parametrize("make", [_leaky_relu, _masked_fill, lambda m: _padded(m, 40, 36)])
def test_staged_lanes_on_the_gpu(make):
    rng = np.random.default_rng()
    func = make(100)
    args = [rng.standard_normal([int(d) for d in p.ty.shape]) > 0 if p.ty.dtype == "bool"
            else rng.standard_normal([int(d) for d in p.ty.shape]).astype(str(p.ty.dtype)) for p in func.params]
    args[-1][...] = np.nan
    cpu = [tvm.runtime.tensor(a) for a in args]
    tvm.compile(func, target=LLVM, tir_pipeline="s_tir_stock")(*cpu)
    gpu = [tvm.runtime.tensor(a, tvm.cuda()) for a in args]
    tvm_dsm.build(func)(*gpu)
    np.testing.assert_array_equal(gpu[-1].numpy(), cpu[-1].numpy())


def test_what_cannot_move_in_vectors_is_left_to_dlight():
    for func in (_transpose(64, 128), _offset_rows(64)):
        with pytest.raises(tvm_dsm.ClusterError, match="elementwise: an access does not move contiguously"):
            match_family(func)


@pytest.mark.gpu
@pytest.mark.parametrize("make, rows", [(lambda m: split_silu_mul(m, 1024), (1, 100, 4096)),
                                        (lambda m: cast(m, 1000), (7, 2048)),
                                        (lambda m: _padded(m, 40, 40), (1, 100, 4096)),
                                        (_rotate_half, (3, 2048)),
                                        (lambda m: _residual(m, tirx.Var("seq", "int32") if isinstance(m, tirx.Var)
                                                             else 77), (1, 5))])
def test_on_the_gpu_against_numpy(make, rows):
    """Built once over a symbolic row count, run at each count with fresh inputs and the output
    poisoned with NaN, against TVM's stock llvm build of the same function (its own types:
    these functions compute in their 16-bit inputs' type)."""
    rng = np.random.default_rng(0)
    symbolic = tvm_dsm.build(make(tirx.Var("m", "int32")))
    for count in rows:
        func = make(count)
        params = [p.ty for p in func.params]
        args = [rng.standard_normal([int(d) for d in b.shape]).astype(str(b.dtype)) for b in params]
        args[-1][...] = np.nan
        cpu = [tvm.runtime.tensor(a) for a in args]
        tvm.compile(func, target=LLVM, tir_pipeline="s_tir_stock")(*cpu)
        want = cpu[-1].numpy().astype(np.float64)
        gpu = [tvm.runtime.tensor(a, tvm.cuda()) for a in args]
        symbolic(*gpu)
        got = gpu[-1].numpy().astype(np.float64)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3, (make, count)


def test_a_packed_projections_split_is_one_vectorized_kernel_a_part():
    family, _ = match_family(_packed_split())
    assert family.name == "elementwise"
    source = tvm_dsm.build(_packed_split()).mod.imports[0].inspect_source()
    names = set(re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", source))
    assert len(names) == 3 and source.count("*(uint4*)") >= 6


def test_repeated_kv_heads_move_in_vectors():
    source = tvm_dsm.build(_repeated_heads()).mod.imports[0].inspect_source()
    assert "*(uint4*)(k_ptr" in source and "*(uint4*)(repeated_ptr" in source


@pytest.mark.gpu
def test_repeated_kv_heads_on_the_gpu():
    k = np.random.default_rng(2).standard_normal((64, 128)).astype("float16")
    out = np.full((64, 14, 64), np.nan, "float16")
    gpu = [tvm.runtime.tensor(a, tvm.cuda()) for a in (k, out)]
    tvm_dsm.build(_repeated_heads())(*gpu)
    np.testing.assert_array_equal(gpu[1].numpy(), np.repeat(k.reshape(64, 2, 64), 7, axis=1))


@pytest.mark.gpu
def test_a_packed_projections_split_on_the_gpu():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((128, 384)).astype("float16")
    outs = [np.full((2, 64, 128), np.nan, "float16") for _ in range(3)]
    gpu = [tvm.runtime.tensor(a, tvm.cuda()) for a in (x, *outs)]
    tvm_dsm.build(_packed_split())(*gpu)
    want = np.split(x.reshape(2, 64, 384), 3, axis=2)
    for got, part in zip(gpu[1:], want):
        np.testing.assert_array_equal(got.numpy(), part)


def test_a_gather_moves_its_rows_in_vectors():
    """An embedding lookup: the index is read once for all lanes, the table's row in vectors."""
    table = te.placeholder((32000, 2048), "float16", name="table")
    ids = te.placeholder((128,), "int32", name="ids")
    assert _lanes(te.create_prim_func([table, ids, topi.take(table, ids, axis=0)])) == 8


def test_a_reshape_is_left_to_relax():
    """A squeeze moves contiguously, but Relax turns a reshape into a view of its input: no
    kernel of ours (and no tuning task) for it."""
    x = te.placeholder((1, 512, 2048), "float16", name="x")
    func = te.create_prim_func([x, te.compute((512, 2048), lambda i, j: x[0, i, j], name="squeeze")])
    with pytest.raises(tvm_dsm.ClusterError, match="elementwise: a reshape"):
        match_family(func)


def _hf_rotary(batch: int = 2, seq: int = 128, heads: int = 16, dim: int = 64, tokens: bool = False):
    """Rotary embedding as a torch Llama writes it (Hugging Face's ``apply_rotary_pos_emb``):
    the projection ``[b, s, h * d]`` viewed ``[b, s, h, d]`` and transposed to ``[b, h, s, d]``,
    ``rotate_half`` by two slices, a negation and a concatenation, then ``q * cos + rot * sin``;
    legalized and fused as Relax compiles it (int64 indices). ``tokens``: the projection
    ``[b * s, h * d]``, as tvm-dsm's pipeline leaves a model's projections (matrices)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch * seq, heads * dim) if tokens else (batch, seq, heads * dim), "float16"))
    cos, sin = (relax.Var(n, relax.TensorType((1, 1, seq, dim), "float16")) for n in ("cos", "sin"))
    with bb.function("main", [x, cos, sin]):
        with bb.dataflow():
            q = bb.emit(relax.op.permute_dims(relax.op.reshape(x, (batch, seq, heads, dim)), [0, 2, 1, 3]))
            first = bb.emit(relax.op.strided_slice(q, axes=[3], begin=[0], end=[dim // 2]))
            second = bb.emit(relax.op.strided_slice(q, axes=[3], begin=[dim // 2], end=[dim]))
            rotated = bb.emit(relax.op.concat([relax.op.negative(second), first], axis=3))
            out = bb.emit_output(relax.op.add(relax.op.multiply(q, cos), relax.op.multiply(rotated, sin)))
        bb.emit_func_output(out)
    mod = relax.transform.FuseTIR()(relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(
        relax.transform.LegalizeOps()(bb.get()))))
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def test_a_rotary_embedding_written_as_torch_does_moves_in_vectors():
    """Its loads index the projection through a reshape's and a transpose's modular arithmetic,
    and ``rotate_half``'s halves through the concatenation's branch: simplified within the
    ranges and the branch conditions, they read ``q[b * s + t, h * d + j +- d / 2]``, which move
    along ``j`` in 16-byte vectors under a branch alike for each vector (dlight's one element a
    thread before)."""
    func = _hf_rotary()
    assert match_family(func)[0].name == "elementwise"
    source = tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    assert "*(uint4*)(x_ptr + " in source and "*(uint4*)(T_add_intermediate_ptr + " in source


@pytest.mark.parametrize("tokens", [False, True])
def test_a_rotary_embedding_merged_as_the_relax_pipeline_does_moves_in_vectors(tokens):
    """The pipeline merges the blocks before the families see them (``scheduling_form``): the
    second half's index, read under the concatenation's ``d < D / 2`` branch, still carries the
    reshape's ``(h * 64 + d + 32) % 1024``, which reduces only under the branch's condition."""
    from tvm_dsm.relax_integration import scheduling_form

    form = scheduling_form(_hf_rotary(tokens=tokens))
    family, shape = match_family(form)
    assert family.name == "elementwise" and shape.lanes == 8


@pytest.mark.gpu
def test_gpu_a_rotary_embedding_written_as_torch_does():
    """Against float64 of the rounded inputs, the output poisoned with NaN."""
    batch, seq, heads, dim = 2, 128, 16, 64
    rng = np.random.default_rng()
    func = _hf_rotary(batch, seq, heads, dim)
    x, cos, sin = (rng.standard_normal(s).astype("float16") for s in ((batch, seq, heads * dim), (1, 1, seq, dim),
                                                                       (1, 1, seq, dim)))
    out = tvm.runtime.tensor(np.full((batch, heads, seq, dim), np.nan, "float16"), tvm.cuda())
    tvm_dsm.build(func)(*(tvm.runtime.tensor(a, tvm.cuda()) for a in (x, cos, sin)), out)
    q = x.astype(np.float64).reshape(batch, seq, heads, dim).transpose(0, 2, 1, 3)
    rotated = np.concatenate([-q[..., dim // 2:], q[..., : dim // 2]], axis=-1)
    want = q * cos.astype(np.float64) + rotated * sin.astype(np.float64)
    got = out.numpy().astype(np.float64)
    assert not np.isnan(got).any() and np.linalg.norm(got - want) / np.linalg.norm(want) < 2e-3


def test_a_gather_is_predicted_from_the_rows_it_reads_not_the_table():
    """An embedding lookup of 4 tokens from a 32000 x 768 table moves 4 rows each way (and the
    ids), not the table: the family's roofline counts an input at most at its loads a written
    element."""
    table = te.placeholder((32000, 768), "float16", name="table")
    ids = te.placeholder((4,), "int32", name="ids")
    family, shape = match_family(te.create_prim_func([table, ids, topi.take(table, ids, axis=0)]))
    assert family.name == "elementwise" and shape.bytes == 2 * 4 * 768 * 2 + 4 * 4
