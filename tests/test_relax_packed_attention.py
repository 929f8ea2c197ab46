"""Attention whose q, k and v are cut from one packed projection (GPT-2's ``split``, ViT's
``reshape(B, S, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)``) or repeated for grouped-query heads
(``repeat_kv``) reads them in place (tvm_dsm.relax_packed_attention): no copy kernels, the
attention family's kernel copying each operand's tiles from heads ``offset ..`` of the tensor they
were cut from."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from conftest import LLVM, TARGET, relax_cuda_source
from tvm_dsm.kernels.attention_pattern import find_attention
from tvm_dsm.kernels.dense_decode import find_dense_decode
from tvm_dsm.relax_packed_attention import PackedAttentionOperands
from tvm_dsm.relax_pipeline import schedule_kernels


def _packed_attention(form: str, b: int, s: int, h: int, d: int, causal: bool = False,
                      dtype: str = "float16") -> tvm.IRModule:
    """``main(qkv)``: attention of q, k and v cut from ``qkv`` (``[B, S, 3 H D]``) the way
    the torch importer writes ``form``: ``"split"`` (GPT-2), ``"unbind"`` (ViT), or
    ``"columns"``: a split whose heads interleave in the columns (not heads in place: left as it is)."""
    bb = relax.BlockBuilder()
    x = relax.Var("qkv", relax.TensorType((b, s, 3 * h * d), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            operands = []
            if form == "unbind":
                y = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(x, (b, s, 3, h, d))), [2, 0, 3, 1, 4]))
                for i in range(3):
                    t = bb.emit(relax.op.squeeze(bb.emit(relax.op.strided_slice(y, [0], [i], [i + 1], [1])), [0]))
                    operands.append(bb.emit(relax.op.permute_dims(t, [0, 2, 1, 3])))
            else:
                shape = (b, s, 3 * h, d) if form == "split" else (b, s, 3 * h * d)
                parts = bb.emit(relax.op.split(bb.emit(relax.op.reshape(x, shape)), 3, axis=2))
                for i in range(3):
                    t = bb.emit(relax.TupleGetItem(parts, i))
                    if form == "columns":  # heads interleaved in the columns: [b, s, d, h]
                        t = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(t, (b, s, d, h))), [0, 1, 3, 2]))
                    operands.append(t)
            out = bb.emit_output(relax.op.nn.attention(*operands, causal_mask="TopLeft" if causal else None))
        bb.emit_func_output(out)
    return bb.get()


def _repeated_kv(b: int, s: int, h: int, kv: int, d: int, dtype: str = "float16", bias: bool = False,
                 queries: int | None = None) -> tvm.IRModule:
    """``main(q, k, v[, bias])``: grouped-query attention as Hugging Face's models write it, k and v
    (``[B, KV, S, D]``) repeated for each query head (``repeat_kv``: expand, reshape) and
    transposed to the attention's ``[B, S, H, D]``; causal, or with an additive mask ``[1, 1, 1,
    S]`` (``bias``: the keys a static cache holds, as tvm-dsm's torch importer adds its mask);
    ``queries`` query positions (``s`` by default; 1: a decode step)."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((b, queries or s, h, d), dtype))
    k, v = (relax.Var(n, relax.TensorType((b, kv, s, d), dtype)) for n in "kv")
    mask = [relax.Var("mask", relax.TensorType((1, 1, 1, s), dtype))] if bias else []
    with bb.function("main", [q, k, v, *mask]):
        with bb.dataflow():
            repeated = []
            for t in (k, v):
                t = bb.emit(relax.op.broadcast_to(bb.emit(relax.op.expand_dims(t, 2)), (b, kv, h // kv, s, d)))
                repeated.append(bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(t, (b, h, s, d))), [0, 2, 1, 3])))
            out = bb.emit_output(relax.op.nn.attention(q, *repeated, *mask, causal_mask=None if bias else "TopLeft"))
        bb.emit_func_output(out)
    return bb.get()


def _reference(qkv: np.ndarray, h: int, d: int, causal: bool) -> np.ndarray:
    b, s, _ = qkv.shape
    q, k, v = (a.transpose(0, 2, 1, 3) for a in np.split(qkv.astype(np.float64).reshape(b, s, 3 * h, d), 3, axis=2))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    if causal:
        scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3)


def _attention_calls(mod: tvm.IRModule) -> list[relax.Call]:
    calls = []
    relax.analysis.post_order_visit(mod["main"].body, lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
    return calls


def _on_llvm(mods, *inputs: np.ndarray) -> list[np.ndarray]:
    """Each of ``mods``' ``main`` run on the CPU on ``inputs``."""
    return [relax.VirtualMachine(tvm.compile(m, target=LLVM), tvm.cpu())["main"](
        *(tvm.runtime.tensor(a) for a in inputs)).numpy() for m in mods]


@pytest.mark.parametrize("form", ["split", "unbind"])
def test_cuts_of_one_projection_are_read_in_place(form):
    """The attention takes the projection itself (reshaped to ``[B, S, 3 H, D]``, a view) and
    computes what the cut operands gave it (fp32 on the CPU, exactly)."""
    b, s, h, d = 2, 37, 4, 16
    mod = _packed_attention(form, b, s, h, d, causal=True, dtype="float32")
    packed = relax.transform.DeadCodeElimination()(PackedAttentionOperands(mod))
    ops = {c.op.name for c in _attention_calls(packed) if isinstance(c.op, tvm.ir.Op)}
    assert "relax.split" not in ops and "relax.strided_slice" not in ops and "relax.permute_dims" not in ops, ops
    (call,) = [c for c in _attention_calls(packed)
               if isinstance(c.args[0], tvm.ir.GlobalVar) and c.args[0].name_hint == "attention"]
    q, k, v = call.args[1].fields  # one view of the projection
    assert q.same_as(k) and q.same_as(v) and [int(x) for x in q.ty.shape.values] == [b, s, 3 * h, d]
    qkv = np.random.default_rng(0).standard_normal((b, s, 3 * h * d)).astype("float32")
    outs = _on_llvm((mod, packed), qkv)
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.linalg.norm(outs[1] - _reference(qkv, h, d, True)) / np.linalg.norm(outs[1]) < 1e-5


def test_repeated_kv_heads_are_read_once_a_group():
    """``repeat_kv``'s copies are not made: the attention reads k and v as they are
    (``[B, KV, S, D]``), K/V head ``h // group`` for query head ``h``; exact on the CPU, and the
    attention family reads the keys as grouped-query heads."""
    b, s, h, kv, d = 2, 40, 8, 2, 16
    mod = _repeated_kv(b, s, h, kv, d, "float32")
    packed = relax.transform.DeadCodeElimination()(PackedAttentionOperands(mod))
    ops = {c.op.name for c in _attention_calls(packed) if isinstance(c.op, tvm.ir.Op)}
    assert not ops & {"relax.broadcast_to", "relax.expand_dims", "relax.permute_dims"}, ops
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(shape).astype("float32") for shape in ((b, s, h, d), (b, kv, s, d), (b, kv, s, d))]
    outs = _on_llvm((mod, packed), *inputs)
    np.testing.assert_array_equal(outs[0], outs[1])
    lowered = relax.transform.LegalizeOps()(relax.transform.DeadCodeElimination()(
        PackedAttentionOperands(_repeated_kv(8, 197, 14, 2, 64))))
    layouts = find_attention(lowered["attention"]).layouts
    # k and v as they are, [B, KV, S, D]: the head axis (1) reads h // 7, the batch (0) the row's // 14
    assert [(layout.seq, layout.heads[-1].axis, layout.heads[-1].divisor) for layout in layouts] == \
        [(1, 2, 1), (2, 1, 7), (2, 1, 7), (1, 2, 1)], layouts


def test_repeated_kv_heads_under_a_mask_are_read_once_a_group():
    """The same with an additive mask (``R.nn.attention_bias``, a static cache's decode as the
    torch importer writes it): no copies, the values exactly the repeated heads' (CPU)."""
    b, s, h, kv, d = 2, 40, 8, 2, 16
    mod = _repeated_kv(b, s, h, kv, d, "float32", bias=True)
    packed = relax.transform.DeadCodeElimination()(PackedAttentionOperands(mod))
    ops = {c.op.name for c in _attention_calls(packed) if isinstance(c.op, tvm.ir.Op)}
    assert not ops & {"relax.broadcast_to", "relax.expand_dims", "relax.permute_dims"}, ops
    rng = np.random.default_rng(0)
    mask = np.where(rng.random((1, 1, 1, s)) < 0.3, -1e4, 0.0).astype("float32")
    inputs = [rng.standard_normal(shape).astype("float32") for shape in ((b, s, h, d), (b, kv, s, d), (b, kv, s, d))]
    outs = _on_llvm((mod, packed), *inputs, mask)
    np.testing.assert_array_equal(outs[0], outs[1])
    decode = relax.transform.LegalizeOps()(relax.transform.DeadCodeElimination()(PackedAttentionOperands(
        _repeated_kv(1, 1024, 32, 8, 64, "bfloat16", bias=True, queries=1))))
    assert find_dense_decode(decode["attention"]).group == 4  # each cached KV head read once for its 4 heads


def _grouped_query(b, s: int, h: int, kv: int, d: int, causal: bool, bias: bool = False,
                   dtype: str = "float32") -> tvm.IRModule:
    """``main(q, k, v[, bias])``: ``R.nn.attention`` of k and v with fewer heads than q
    (``[B, S, KV, D]``; what ``nn.op.scaled_dot_product_attention`` documents as grouped-query
    attention); ``b`` an int or a name (a symbolic batch)."""
    batch = tvm.tirx.Var(b, "int64") if isinstance(b, str) else b
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((batch, s, h, d), dtype))
    k, v = (relax.Var(n, relax.TensorType((batch, s, kv, d), dtype)) for n in "kv")
    params = [q, k, v] + ([relax.Var("bias", relax.TensorType((batch, h, s, s), dtype))] if bias else [])
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.attention(*params, causal_mask="TopLeft" if causal else None))
        bb.emit_func_output(out)
    return bb.get()


def _grouped_reference(q, k, v, causal: bool, bias=None) -> np.ndarray:
    """Grouped-query attention in float64, query head ``h`` reading K/V head ``h // (H / KV)``
    (torch's ``scaled_dot_product_attention(..., enable_gqa=True)``), ``[B, S, H, D]``."""
    group = q.shape[2] // k.shape[2]
    q, k, v = (a.astype(np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))
    k, v = (np.repeat(t, group, axis=1) for t in (k, v))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1]) + (0 if bias is None else bias)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3)


@pytest.mark.parametrize(("batch", "causal", "bias"), [(2, True, False), (3, False, True), ("b", False, False)])
def test_grouped_query_attention_reads_each_kv_head_for_its_query_heads(batch, causal, bias):
    """K/V head ``h // group`` for query head ``h``, as the operator documents; TVM's own
    legalization reshapes k and v as if they held every query head, which reads the next batch's
    heads (checked here too: the rewrite is what makes it right)."""
    b, s, h, kv, d = 3 if batch == "b" else batch, 24, 8, 2, 16
    mod = _grouped_query(batch, s, h, kv, d, causal, bias)
    rewritten = PackedAttentionOperands(mod)
    rng = np.random.default_rng()
    shapes = [(b, s, h, d), (b, s, kv, d), (b, s, kv, d)] + ([(b, h, s, s)] if bias else [])
    inputs = [rng.standard_normal(shape).astype("float32") for shape in shapes]
    stock, got = _on_llvm((mod, rewritten), *inputs)
    ref = _grouped_reference(*inputs[:3], causal, inputs[3] if bias else None)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
    assert np.linalg.norm(stock - ref) / np.linalg.norm(ref) > 1e-2


def test_grouped_query_attention_of_a_symbolic_batch_takes_the_attention_family():
    from tvm_dsm.model_report import relax_report

    report = relax_report(_grouped_query("b", 128, 32, 8, 64, True, dtype="float16"))
    assert [row.where for row in report.rows] == ["attention"], report.format()


def _cut_forms(form: str) -> tvm.IRModule:
    """``main(x)`` (``x``: ``[1, 4, 10, 8]``, fp32) with attention over cuts that must be read as
    they are or left alone: ``"uneven"``, a split into 3 (heads 4-7, the second of parts 4, 4, 2);
    ``"strided"``, every other head (not heads in place); ``"negative_axis"``, heads 5-9 by a
    slice along axis -2; ``"after_block"``, the cuts in a dataflow block and the attention after it;
    ``"symbolic"``, a sequence length that is a variable."""
    bb = relax.BlockBuilder()
    seq = tvm.tirx.Var("n", "int64") if form == "symbolic" else 4
    x = relax.Var("x", relax.TensorType((1, seq, 10, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            if form in ("uneven", "symbolic"):
                t = bb.emit(relax.TupleGetItem(bb.emit(relax.op.split(x, 3, axis=2)), 1))
            elif form == "strided":
                t = bb.emit(relax.op.strided_slice(x, [2], [0], [10], [2]))
            else:
                t = bb.emit(relax.op.strided_slice(x, [-2], [5], [10], [1]))
            t = bb.emit_output(t) if form == "after_block" else t
            if form != "after_block":
                out = bb.emit_output(relax.op.nn.attention(t, t, t))
        if form == "after_block":
            out = bb.emit(relax.op.nn.attention(t, t, t))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(("form", "rewritten"), [("uneven", True), ("strided", False), ("negative_axis", True),
                                                 ("after_block", True), ("symbolic", False)])
def test_every_cut_is_read_where_it_is_or_left_alone(form, rewritten):
    mod = _cut_forms(form)
    packed = PackedAttentionOperands(mod)
    relax.analysis.well_formed(packed)  # raises on a variable out of its scope
    attentions = [c for c in _attention_calls(packed) if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.attention"]
    assert len(attentions) == (0 if rewritten else 1)
    if form == "symbolic":
        return
    outs = _on_llvm((mod, packed), np.random.default_rng(0).standard_normal((1, 4, 10, 8)).astype("float32"))
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_long_prompt_is_rewritten():
    """16 x 4096 tokens of 32 heads of 128 (an 800-million-element projection) is read in place."""
    packed = PackedAttentionOperands(_packed_attention("split", 16, 4096, 32, 128))
    (call,) = [c for c in _attention_calls(packed) if isinstance(c.args[0], tvm.ir.GlobalVar)]
    assert [int(x) for x in call.args[1].fields[0].ty.shape.values] == [16, 4096, 96, 128]


def test_other_cuts_are_left_as_they_are():
    """Heads interleaved in the columns are not heads of the projection: the attention keeps
    its three cut operands."""
    calls = _attention_calls(PackedAttentionOperands(_packed_attention("columns", 2, 16, 4, 48)))
    assert [len(c.args) for c in calls if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.attention"] == [3]


@pytest.mark.parametrize("form", ["split", "unbind"])
def test_the_attention_family_copies_tiles_from_heads_of_the_projection(form):
    """The pipeline's attention function reads one ``[B, S, 3 H, D]`` tensor for q, k and v,
    k at heads H .., v at 2 H ..; the attention family schedules it, and no copy kernel is
    left (the reshape is a view)."""
    b, s, h, d = 8, 197, 12, 64
    _, taken = schedule_kernels(_packed_attention(form, b, s, h, d), tvm.target.Target(TARGET))
    assert taken["attention"] == "attention", taken
    assert set(taken) == {"attention", "reshape"}, taken
    lowered = tvm.IRModule({"attention": relax.transform.LegalizeOps()(
        relax.transform.DeadCodeElimination()(PackedAttentionOperands(_packed_attention(form, b, s, h, d))))["attention"]})
    shape = find_attention(lowered["attention"])
    offsets = [{a.offset for a in layout.heads if a.extent} for layout in shape.layouts[:3]]
    assert offsets == [{0}, {h}, {2 * h}], shape.layouts
    executable = tvm.compile(_packed_attention(form, b, s, h, d), target=TARGET, relax_pipeline="tvm_dsm")
    assert "cp.async.bulk.tensor.4d" in relax_cuda_source(executable.mod)


@pytest.mark.gpu
def test_repeated_kv_attention_is_correct_on_the_gpu():
    b, s, h, kv, d = 2, 197, 14, 2, 64
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal(shape).astype("float16") for shape in ((b, s, h, d), (b, kv, s, d), (b, kv, s, d)))
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.compile(_repeated_kv(b, s, h, kv, d), target=TARGET, relax_pipeline="tvm_dsm"), dev)
    got = vm["main"](*(tvm.runtime.tensor(a, dev) for a in (q, k, v))).numpy().astype(np.float64)
    packed = np.concatenate([q.reshape(b, s, h * d), *(np.repeat(t, h // kv, axis=1).transpose(0, 2, 1, 3).reshape(b, s, h * d)
                                                           for t in (k, v))], axis=2)
    ref = _reference(packed, h, d, True)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "causal"), [(2, True), ("b", False)])
def test_grouped_query_attention_is_correct_on_the_gpu(batch, causal):
    b, s, h, kv, d = 2, 333, 32, 8, 128
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal(shape).astype("float16") for shape in ((b, s, h, d), (b, s, kv, d), (b, s, kv, d)))
    dev = tvm.cuda(0)
    mod = _grouped_query(batch, s, h, kv, d, causal, dtype="float16")
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm"), dev)
    got = vm["main"](*(tvm.runtime.tensor(a, dev) for a in (q, k, v))).numpy().astype(np.float64)
    ref = _grouped_reference(q, k, v, causal)
    assert np.isfinite(got).all() and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize(("form", "causal"), [("split", True), ("unbind", False), ("split", False)])
def test_packed_attention_is_correct_on_the_gpu(form, causal):
    b, s, h, d = 2, 197, 12, 64
    mod = _packed_attention(form, b, s, h, d, causal)
    qkv = np.random.default_rng().standard_normal((b, s, 3 * h * d)).astype("float16")
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm"), dev)
    got = vm["main"](tvm.runtime.tensor(qkv, dev)).numpy().astype(np.float64)
    ref = _reference(qkv, h, d, causal)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def _heads_first_query(b: int, s: int, h: int, d: int, dtype: str, scale: float | None) -> tvm.IRModule:
    """``main(q, k, v)``: q held ``[B, H, S, D]`` (a model's ``transpose(1, 2)``), moved to the
    attention's ``[B, S, H, D]``, with an explicit ``scale`` (``scores * d ** -0.5`` rounded to
    fp16, as torch's importer passes it)."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((b, h, s, d), dtype))
    k, v = (relax.Var(n, relax.TensorType((b, s, h, d), dtype)) for n in "kv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            moved = bb.emit(relax.op.permute_dims(q, [0, 2, 1, 3]))
            out = bb.emit_output(relax.op.nn.attention(moved, k, v, scale=scale, causal_mask="TopLeft"))
        bb.emit_func_output(out)
    return bb.get()


def test_a_scaled_query_is_read_in_place_its_scale_inside_the_attention():
    """The scale AttentionScaleOnQuery moves onto the query (``q * c``) is computed inside the
    attention, which reads q where it is: no kernel transposing and scaling q; exact on the CPU."""
    from tvm_dsm.relax_precision import AttentionScaleOnQuery

    b, s, h, d = 2, 24, 4, 16
    mod = AttentionScaleOnQuery(_heads_first_query(b, s, h, d, "float16", 0.2))
    assert "relax.multiply" in {c.op.name for c in _attention_calls(mod) if isinstance(c.op, tvm.ir.Op)}
    packed = relax.transform.DeadCodeElimination()(PackedAttentionOperands(mod))
    ops = {c.op.name for c in _attention_calls(packed) if isinstance(c.op, tvm.ir.Op)}
    assert not ops & {"relax.multiply", "relax.permute_dims"}, ops
    rng = np.random.default_rng()
    inputs = [rng.standard_normal(shape).astype("float16") for shape in ((b, h, s, d), (b, s, h, d), (b, s, h, d))]
    outs = _on_llvm((mod, packed), *inputs)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.gpu
def test_a_scaled_heads_first_query_is_correct_on_the_gpu():
    b, s, h, d, scale = 2, 333, 8, 128, 0.08837890625
    rng = np.random.default_rng()
    q = rng.standard_normal((b, h, s, d)).astype("float16")
    k, v = (rng.standard_normal((b, s, h, d)).astype("float16") for _ in range(2))
    dev = tvm.cuda(0)
    mod = _heads_first_query(b, s, h, d, "float16", scale)
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm"), dev)
    got = vm["main"](*(tvm.runtime.tensor(a, dev) for a in (q, k, v))).numpy().astype(np.float64)
    q64, k64, v64 = q.astype(np.float64), *(a.astype(np.float64).transpose(0, 2, 1, 3) for a in (k, v))
    scores = np.where(np.tril(np.ones((s, s), bool)), q64 @ k64.transpose(0, 1, 3, 2) * scale, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    ref = ((p / p.sum(-1, keepdims=True)) @ v64).transpose(0, 2, 1, 3)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3
