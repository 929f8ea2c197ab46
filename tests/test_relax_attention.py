"""Attention a relax.frontend.nn model spells out (``matmul(q, k^T) * scale``, ``softmax``,
``matmul(p, v)``: BERT's and ViT's self-attention) grouped into one TIR function
(tvm_dsm.relax_attention): the attention family takes it, at constant and symbolic sequence
lengths, the grouped module computes what the ungrouped one does, and a group no family takes
whole is scheduled operator by operator."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te, tirx, topi
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

import tvm_dsm
from conftest import LLVM, TARGET, cuda_source, relax_cuda_source
from tvm_dsm.errors import ClusterError
from tvm_dsm.model_report import relax_report
from tvm_dsm.relax_attention import FuseAttention
from tvm_dsm.relax_integration import lower_to_tir


class SelfAttention(nn.Module):
    """Multi-head self-attention as BERT writes it, without projections: q, k and v
    ``[batch, heads, seq, head_dim]``; ``upcast``: the softmax in fp32 and its probabilities
    cast back, as Hugging Face's Llama and Qwen2 write it (``softmax(s, dtype=float32).to(q.dtype)``)."""

    def __init__(self, head_dim: int, upcast: bool = False):
        self.scale, self.upcast = 1.0 / head_dim ** 0.5, upcast

    def forward(self, q, k, v):
        scores = op.matmul(q, op.permute_dims(k, (0, 1, 3, 2))) * self.scale
        if self.upcast:
            p = op.astype(op.softmax(op.astype(scores, "float32"), axis=-1), q.dtype)
        else:
            p = op.softmax(scores, axis=-1)
        return op.matmul(p, v)


class MaskedSelfAttention(nn.Module):
    """Self-attention with a mask: BERT's additive padding mask ``[batch, 1, 1, seq]``
    (``add``), or a bool mask ``[1, 1, seq, seq]`` selecting the scores over a tensor of -1e4,
    as GPT-2's ``masked_fill`` writes it (``where``)."""

    def __init__(self, head_dim: int, form: str):
        self.scale, self.form = 1.0 / head_dim ** 0.5, form

    def forward(self, q, k, v, mask):
        scores = op.matmul(q, op.permute_dims(k, (0, 1, 3, 2))) * self.scale
        if self.form == "add":
            scores = scores + mask
        else:
            scores = op.where(mask, scores, op.full(scores.shape, -1e4, scores.dtype))
        return op.matmul(op.softmax(scores, axis=-1), v)


class TokensFirstAttention(nn.Module):
    """Attention over q, k and v held ``[batch, seq, heads, head_dim]`` (a model's projections
    reshaped), moved to heads first inside: k's transpose as two permutes (BERT's
    ``permute(0, 2, 1, 3)`` then ``transpose(-1, -2)``) or one (GPT-2's ``permute(0, 2, 3,
    1)``)."""

    def __init__(self, head_dim: int, k_form: str, upcast: bool = False):
        self.scale, self.k_form, self.upcast = 1.0 / head_dim ** 0.5, k_form, upcast

    def forward(self, q, k, v):
        q, v = (op.permute_dims(x, (0, 2, 1, 3)) for x in (q, v))
        kt = (op.permute_dims(op.permute_dims(k, (0, 2, 1, 3)), (0, 1, 3, 2)) if self.k_form == "two_permutes"
              else op.permute_dims(k, (0, 2, 3, 1)))
        scores = op.matmul(q, kt) * self.scale
        if self.upcast:
            p = op.astype(op.softmax(op.astype(scores, "float32"), axis=-1), q.dtype)
        else:
            p = op.softmax(scores, axis=-1)
        return op.matmul(p, v)


def _exported_tokens_first(batch, heads, seq, head_dim, k_form, upcast=False):
    spec = {name: nn.spec.Tensor([batch, seq, heads, head_dim], "float16") for name in "qkv"}
    mod, _ = TokensFirstAttention(head_dim, k_form, upcast).export_tvm({"forward": spec})
    return mod


@pytest.mark.parametrize("k_form, upcast", [("two_permutes", False), ("one_permute", False), ("one_permute", True)])
def test_attention_over_tokens_first_tensors_is_one_function_the_attention_family_takes(k_form, upcast):
    """k's transpose stays (or becomes) a swap of its last two axes after a layout change, which
    the scores' product reads in place: not one ``[0, 2, 3, 1]`` copy and a plain product."""
    report = relax_report(_exported_tokens_first(2, 4, 200, 64, k_form, upcast))
    assert [row.where for row in report.rows if "softmax" in row.name] == ["attention"], report.format()
    assert not [row for row in report.rows if "matmul" in row.name and row.where != "attention"], report.format()


def _exported_masked(batch, heads, seq, head_dim, form="add", dtype="float16"):
    mask = nn.spec.Tensor([batch, 1, 1, seq], dtype) if form == "add" else nn.spec.Tensor([1, 1, seq, seq], "bool")
    spec = {**{name: nn.spec.Tensor([batch, heads, seq, head_dim], dtype) for name in "qkv"}, "mask": mask}
    mod, _ = MaskedSelfAttention(head_dim, form).export_tvm({"forward": spec})
    return mod


def _mask(form: str, batch: int, seq: int, rng) -> np.ndarray:
    """A padding mask (a quarter of the keys -1e4), or a causal bool mask."""
    if form == "add":
        return np.where(rng.random((batch, 1, 1, seq)) < 0.25, -1e4, 0).astype("float16")
    return np.tril(np.ones((seq, seq), bool))[None, None]


def _exported(batch, heads, seq, head_dim, dtype="float16", upcast=False):
    spec = {name: nn.spec.Tensor([batch, heads, seq, head_dim], dtype) for name in "qkv"}
    mod, _ = SelfAttention(head_dim, upcast).export_tvm({"forward": spec})
    return mod


@pytest.mark.parametrize(("batch", "seq", "upcast"), [(2, 128, False), (2, "seq", False), ("batch", "seq", False),
                                                      ("batch", "seq", True)])
def test_spelled_out_attention_is_one_function_the_attention_family_takes(batch, seq, upcast):
    report = relax_report(_exported(batch, 4, seq, 64, upcast=upcast))
    grouped = [row for row in report.rows if "softmax" in row.name]
    assert [row.where for row in grouped] == ["attention"], report.format()
    assert not [row for row in report.rows if "matmul" in row.name and row.where != "attention"], report.format()


def test_the_grouped_attention_computes_what_the_operators_do_on_llvm():
    mod = _exported(1, 2, 16, 8)
    grouped = lower_to_tir(mod)
    assert sum("softmax" in gv.name_hint and "matmul" in gv.name_hint for gv in grouped.functions) == 1
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 16, 8)).astype("float16") for _ in range(3))

    def run(executable):
        vm = relax.VirtualMachine(executable, tvm.cpu())
        return vm["forward"](*(tvm.runtime.tensor(a) for a in (q, k, v))).numpy().astype(np.float64)

    got = run(tvm.compile(grouped, target=LLVM, tir_pipeline="s_tir_stock"))
    operators = run(tvm.compile(mod, target=LLVM, tir_pipeline="s_tir_stock"))
    np.testing.assert_array_equal(got, operators)  # the same arithmetic, in one function
    s = q.astype(np.float64) @ k.astype(np.float64).transpose(0, 1, 3, 2) / np.sqrt(8)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 5e-3  # fp16 arithmetic throughout


@pytest.mark.parametrize(("form", "batch", "seq"), [("add", 2, 128), ("add", "batch", "seq"), ("where", 2, "seq")])
def test_attention_with_a_mask_is_one_function_the_attention_family_takes(form, batch, seq, assemble):
    mod = _exported_masked(batch, 4, seq, 64, form)
    report = relax_report(mod)
    assert [row.where for row in report.rows if "softmax" in row.name] == ["attention"], report.format()
    source = relax_cuda_source(tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm").mod)
    assert "mask" in source and assemble(source, f"relax_masked_attention_{form}_{batch}_{seq}")



@pytest.mark.parametrize("form", ["add", "where"])
def test_the_grouped_masked_attention_computes_what_the_operators_do_on_llvm(form):
    mod = _exported_masked(1, 2, 16, 8, form)
    grouped = lower_to_tir(mod)
    assert sum("softmax" in gv.name_hint and form in gv.name_hint for gv in grouped.functions) == 1
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((1, 2, 16, 8)).astype("float16") for _ in range(3))
    mask = _mask(form, 1, 16, rng)

    def run(executable):
        vm = relax.VirtualMachine(executable, tvm.cpu())
        return vm["forward"](*(tvm.runtime.tensor(a) for a in (q, k, v, mask))).numpy()

    np.testing.assert_array_equal(run(tvm.compile(grouped, target=LLVM, tir_pipeline="s_tir_stock")),
                                  run(tvm.compile(mod, target=LLVM, tir_pipeline="s_tir_stock")))


def test_a_softmax_between_two_weight_products_is_not_attention():
    """``softmax(x W1^T) W2^T`` has the calls of attention but multiplies by weights: the pattern
    check leaves it to FuseOps (no attention group)."""

    class SoftmaxMLP(nn.Module):
        def __init__(self):
            self.a = nn.Linear(64, 64, bias=False, dtype="float16")
            self.b = nn.Linear(64, 64, bias=False, dtype="float16")

        def forward(self, x):
            return self.b(op.softmax(self.a(x), axis=-1))

    mod, _ = SoftmaxMLP().export_tvm({"forward": {"x": nn.spec.Tensor([4, 8, 64], "float16")}})
    mod = relax.transform.LegalizeOps()(mod)
    grouped = FuseAttention(mod)
    assert not [gv for gv, f in grouped.functions.items()
                if isinstance(f, relax.Function) and f.attrs is not None and "Composite" in f.attrs]


def test_attention_the_family_cannot_take_stays_three_functions():
    """A head dim off the family's multiples of 8 is not grouped: its operators keep their own
    functions (the products dlight's)."""
    report = relax_report(_exported(2, 4, 128, 20))
    assert not [row for row in report.rows if "softmax" in row.name and "matmul" in row.name], report.format()


def _two_products():
    """Two fp32 GEMMs in one function: no family takes it whole, nor dlight."""
    x = te.placeholder((64, 128), "float32", "x")
    w1 = te.placeholder((256, 128), "float32", "w1")
    w2 = te.placeholder((128, 256), "float32", "w2")
    h = topi.nn.relu(topi.nn.dense(x, w1))
    return te.create_prim_func([x, w1, w2, topi.nn.dense(h, w2)])


def test_a_function_of_two_matmuls_is_scheduled_operator_by_operator():
    sch = tvm_dsm.driver.schedule_operators(_two_products(), TARGET)
    assert cuda_source(sch.mod).count("__global__") >= 2
    x = te.placeholder((64, 128), "float32", "x")
    w = te.placeholder((256, 128), "float32", "w")
    with pytest.raises(ClusterError, match="two or more matmuls"):
        tvm_dsm.driver.schedule_operators(te.create_prim_func([x, w, topi.nn.dense(x, w)]), TARGET)


def test_schedule_tir_schedules_two_matmuls_no_family_takes_operator_by_operator():
    from tvm_dsm.relax_integration import FAMILY_ATTR, PER_OPERATOR, ScheduleTIR

    mod = tvm.IRModule({"two_products": _two_products().with_attr("global_symbol", "two_products")})
    choices = {}
    func = ScheduleTIR(TARGET, choices=choices)(mod)["two_products"]
    assert func.attrs[FAMILY_ATTR] == PER_OPERATOR and func.attrs["tirx.is_scheduled"]
    assert choices["two_products"].reason == "its operators: simt_gemm, simt_gemm"  # fp32: CUDA cores


@pytest.mark.gpu
@pytest.mark.parametrize(("seq", "upcast"), [(128, False), (200, False), (200, True)])
def test_spelled_out_attention_is_correct_on_the_gpu(seq, upcast):
    mod = _exported(2, 4, seq, 64, upcast=upcast)
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, seq, 64)).astype("float16") for _ in range(3))
    executable = tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm")
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(executable, dev)
    got = vm["forward"](*(tvm.runtime.tensor(a, dev) for a in (q, k, v))).numpy().astype(np.float64)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s = q64 @ k64.transpose(0, 1, 3, 2) / 8
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v64
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("k_form, upcast", [("two_permutes", False), ("one_permute", True)])
def test_attention_over_tokens_first_tensors_is_correct_on_the_gpu(k_form, upcast):
    mod = _exported_tokens_first(2, 4, 200, 64, k_form, upcast)
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((2, 200, 4, 64)).astype("float16") for _ in range(3))
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm"), dev)
    got = vm["forward"](*(tvm.runtime.tensor(a, dev) for a in (q, k, v))).numpy().astype(np.float64)
    q64, k64, v64 = (a.astype(np.float64).transpose(0, 2, 1, 3) for a in (q, k, v))
    s = q64 @ k64.transpose(0, 1, 3, 2) / 8
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v64
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def _weighted_sum_into_the_output(normalized: bool):
    """Attention in TE whose weighted sum accumulates straight into the output (fp16), as a
    legalized ``matmul(softmax(..), v)`` writes it; ``normalized`` False: of the unnormalized
    exponentials (not attention: no division by the row sum anywhere)."""
    shape = (1, 2, 64, 64)
    q, k, v = (te.placeholder(shape, "float16", n) for n in "qkv")
    r = te.reduce_axis((0, 64), "r")
    s = te.compute((1, 2, 64, 64), lambda b, h, i, j: te.sum(q[b, h, i, r] * k[b, h, j, r], axis=r), name="s")
    p = topi.nn.softmax(s, axis=-1) if normalized else te.compute(s.shape, lambda *i: te.exp(s(*i)), name="e")
    t = te.reduce_axis((0, 64), "t")
    out = te.compute(shape, lambda b, h, i, d: te.sum(p[b, h, i, t] * v[b, h, t, d], axis=t), name="out")
    return te.create_prim_func([q, k, v, out])


def test_a_weighted_sum_accumulating_into_the_output_is_attention_where_normalized():
    from tvm_dsm.families import FAMILIES, match_family

    assert match_family(_weighted_sum_into_the_output(True))[0].name == "attention"
    attention = next(f for f in FAMILIES if f.name == "attention")
    with pytest.raises(ClusterError, match="exp-weighted sum|normalized probabilities|row sum"):
        attention.recognize(_weighted_sum_into_the_output(False))


@pytest.mark.gpu
@pytest.mark.parametrize(("form", "seq"), [("add", 200), ("add", "seq"), ("where", 200)])
def test_masked_attention_is_correct_on_the_gpu(form, seq):
    mod = _exported_masked(2, 4, seq, 64, form)
    rng = np.random.default_rng()
    q, k, v = (rng.standard_normal((2, 4, 200, 64)).astype("float16") for _ in range(3))
    mask = _mask(form, 2, 200, rng)
    executable = tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm")
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(executable, dev)
    got = vm["forward"](*(tvm.runtime.tensor(a, dev) for a in (q, k, v, mask))).numpy().astype(np.float64)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    s = q64 @ k64.transpose(0, 1, 3, 2) / 8
    s = s + mask.astype(np.float64) if form == "add" else np.where(mask, s, -1e4)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v64
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


class RepeatedKVDecode(nn.Module):
    """One query token of grouped-query attention as Hugging Face's eager Llama and Qwen2
    write it: K and V ``[b, kv_heads, seq, d]`` repeated for the query heads (``repeat_kv``:
    ``expand_dims``, ``broadcast_to``, ``reshape``), the fp32 softmax cast back, the heads
    merged into ``[b, 1, heads * d]`` (``merge``)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, upcast: bool = True, merge: bool = True):
        self.heads, self.kv_heads, self.head_dim, self.upcast, self.merge = heads, kv_heads, head_dim, upcast, merge

    def forward(self, q, k, v):
        batch, seq, group = k.shape[0], k.shape[2], self.heads // self.kv_heads

        def repeated(x):
            x = op.broadcast_to(op.unsqueeze(x, 2), (batch, self.kv_heads, group, seq, self.head_dim))
            return op.reshape(x, (batch, self.heads, seq, self.head_dim))

        scores = op.matmul(q, op.permute_dims(repeated(k), (0, 1, 3, 2))) * (1.0 / self.head_dim ** 0.5)
        if self.upcast:
            p = op.astype(op.softmax(op.astype(scores, "float32"), axis=-1), q.dtype)
        else:
            p = op.softmax(scores, axis=-1)
        out = op.matmul(p, repeated(v))
        if self.merge:
            out = op.reshape(op.permute_dims(out, (0, 2, 1, 3)), (batch, 1, self.heads * self.head_dim))
        return out


def _exported_repeated_kv(heads, kv_heads, seq, head_dim, upcast=True, merge=True):
    spec = {"q": nn.spec.Tensor([1, heads, 1, head_dim], "float16"),
            **{name: nn.spec.Tensor([1, kv_heads, seq, head_dim], "float16") for name in "kv"}}
    mod, _ = RepeatedKVDecode(heads, kv_heads, head_dim, upcast, merge).export_tvm({"forward": spec})
    return mod


@pytest.mark.parametrize(("upcast", "merge"), [(True, True), (False, True), (True, False), (False, False)])
def test_grouped_query_decode_with_its_kv_repeated_is_one_decode_kernel_reading_each_kv_head_once(upcast, merge):
    """Qwen2-7B's 28 query heads over 4 KV heads: the copies repeating K and V join the
    attention, which the decode kernel takes (heads merged in its output or not), reading
    each KV head's rows once for its 7 query heads; no kernel writes the 7 copies."""
    from tvm_dsm.kernels.dense_decode import find_dense_decode

    mod = _exported_repeated_kv(28, 4, 1000, 128, upcast, merge)
    report = relax_report(mod)
    assert [row.where for row in report.rows] == ["decode_attention"], report.format()
    (func,) = [f for f in lower_to_tir(mod).functions.values() if isinstance(f, tirx.PrimFunc)]
    form, _ = tvm_dsm.driver.family_form(func.with_attr("global_symbol", "main"))
    assert find_dense_decode(form).group == 7
    assert sorted([int(e) for e in p.ty.shape] for p in func.params[:3]) == [[1, 4, 1000, 128]] * 2 + [[1, 28, 1, 128]]


def test_copies_before_the_products_join_them_only_where_they_repeat_kv_heads_at_a_decode_step():
    """Copies that repeat nothing (a reshape, a transpose of k) are sources the group refuses,
    and so are a prefill's repeats (its kernel takes q before k and v): the pattern without
    them then takes the attention, over the copied tensors."""
    from tvm_dsm.relax_attention import _accept

    decode = ["one_row_product", "elementwise", "softmax", "one_row_product"]
    repeats = ["copy", "repeat", "copy", "copy", "repeat", "copy"]
    assert _accept([*repeats, *decode], ["copy", "copy", "one_row_product"])
    assert not _accept(["copy", "copy", *decode], ["copy", "copy", "one_row_product"])
    assert not _accept(["elementwise", "repeat", "repeat", *decode], ["elementwise", "repeat", "one_row_product"])
    prefill = ["product", "elementwise", "softmax", "product"]
    assert not _accept([*repeats, *prefill], ["copy", "copy", "product"])
    assert _accept(prefill, ["product"]) and _accept(decode, ["one_row_product"])


@pytest.mark.parametrize("upcast", [True, False])
def test_a_grouped_query_prefill_with_its_kv_repeated_keeps_the_attention_kernel(upcast):
    """At 128 queries the copies repeating K and V stay a kernel of their own before the
    attention family's kernel (grouped with it, k and v would come before q)."""
    spec = {"q": nn.spec.Tensor([1, 8, 128, 64], "float16"),
            **{name: nn.spec.Tensor([1, 2, 128, 64], "float16") for name in "kv"}}
    mod, _ = RepeatedKVDecode(8, 2, 64, upcast, merge=False).export_tvm({"forward": spec})
    report = relax_report(mod)
    assert [row.where for row in report.rows if "softmax" in row.name] == ["attention"], report.format()


def test_the_grouped_repeated_kv_decode_computes_what_the_operators_do_on_llvm():
    mod = _exported_repeated_kv(8, 2, 16, 8)
    grouped = lower_to_tir(mod)
    assert sum(isinstance(f, tirx.PrimFunc) for f in grouped.functions.values()) == 1
    rng = np.random.default_rng()
    q = rng.standard_normal((1, 8, 1, 8)).astype("float16")
    k, v = (rng.standard_normal((1, 2, 16, 8)).astype("float16") for _ in range(2))

    def run(executable):
        vm = relax.VirtualMachine(executable, tvm.cpu())
        return vm["forward"](*(tvm.runtime.tensor(a) for a in (q, k, v))).numpy()

    np.testing.assert_array_equal(run(tvm.compile(grouped, target=LLVM, tir_pipeline="s_tir_stock")),
                                  run(tvm.compile(mod, target=LLVM, tir_pipeline="s_tir_stock")))


@pytest.mark.gpu
@pytest.mark.parametrize(("seq", "upcast", "merge"), [(1000, True, True), (4096, False, True), (333, True, False)])
def test_grouped_query_decode_with_its_kv_repeated_is_correct_on_the_gpu(seq, upcast, merge):
    mod = _exported_repeated_kv(28, 4, seq, 128, upcast, merge)
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 28, 1, 128)).astype("float16")
    k, v = (rng.standard_normal((1, 4, seq, 128)).astype("float16") for _ in range(2))
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm"), dev)
    out = vm["forward"](*(tvm.runtime.tensor(a, dev) for a in (q, k, v))).numpy().astype(np.float64)
    k64, v64 = (np.repeat(a.astype(np.float64), 7, axis=1) for a in (k, v))
    s = q.astype(np.float64) @ k64.transpose(0, 1, 3, 2) / np.sqrt(128)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v64
    ref = ref.transpose(0, 2, 1, 3).reshape(1, 1, 28 * 128) if merge else ref
    assert out.shape == ref.shape and np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


def test_torch_exported_eager_grouped_query_decode_is_one_decode_kernel():
    """Hugging Face's eager attention (``repeat_kv`` by ``x[:, :, None].expand().reshape()``,
    ``softmax(dtype=float32).to(q.dtype)``, heads merged by ``transpose(1, 2).reshape``),
    exported by torch at one query token."""
    torch = pytest.importorskip("torch")
    from tvm_dsm.relax_torch import from_exported_program

    class EagerDecode(torch.nn.Module):
        def repeated(self, x):
            b, kv, t, d = x.shape
            return x[:, :, None, :, :].expand(b, kv, 7, t, d).reshape(b, kv * 7, t, d)

        def forward(self, q, k, v):
            w = torch.matmul(q, self.repeated(k).transpose(2, 3)) * 128 ** -0.5
            w = torch.nn.functional.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            return torch.matmul(w, self.repeated(v)).transpose(1, 2).contiguous().reshape(q.shape[0], 1, -1)

    q = torch.randn(1, 28, 1, 128, dtype=torch.float16)
    k = torch.randn(1, 4, 1000, 128, dtype=torch.float16)
    report = relax_report(from_exported_program(torch.export.export(EagerDecode(), (q, k, torch.randn_like(k)))))
    assert [row.where for row in report.rows if "matmul" in row.name] == ["decode_attention"], report.format()
