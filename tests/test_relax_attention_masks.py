"""tvm_dsm.relax_attention_masks: attention masks computed from constants (as traced models build
them from ``arange``, ``triu`` and ``full``) read as the causal flag or as a windowed attention
function the attention family takes, with the same values as float64; any other mask stays a
bias."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from conftest import LLVM, TARGET
from tvm_dsm.model_report import relax_report
from tvm_dsm.relax_attention_masks import AttentionMasksFromConstants, alibi_slopes, causal_band
from tvm_dsm.relax_patterns import RewriteToRelaxOps


def _index_mask(bb: relax.BlockBuilder, tokens: int, window: int | None) -> relax.Var:
    """``where(key > query [| query - key >= window], finfo(float32).min, 0)`` over ``[1, 1,
    tokens, tokens]``, built from ``arange``."""
    query = bb.emit(relax.op.expand_dims(bb.emit(relax.op.arange(0, tokens, 1, "int64")), [-1]))
    key = bb.emit(relax.op.expand_dims(bb.emit(relax.op.arange(0, tokens, 1, "int64")), [-2]))
    masked = bb.emit(relax.op.greater(key, query))
    if window is not None:
        far = bb.emit(relax.op.greater_equal(bb.emit(relax.op.subtract(query, key)), relax.const(window, "int64")))
        masked = bb.emit(relax.op.bitwise_or(masked, far))
    fill = bb.emit(relax.op.full((tokens, tokens), relax.const(np.finfo(np.float32).min, "float32"), "float32"))
    mask = bb.emit(relax.op.where(masked, fill, relax.const(0.0, "float32")))
    return bb.emit(relax.op.reshape(mask, (1, 1, tokens, tokens)))


def _eager_attention(window: int | None = None, round_probabilities: bool = True, tokens: int = 16,
                     kv_heads: int = 4) -> tvm.IRModule:
    """Hugging Face's eager attention (Phi-2, GPT-NeoX) as tvm_dsm.relax_torch imports it over
    fp16 ``[1, 4, tokens, 64]`` (k and v ``kv_heads``, repeated as ``repeat_kv`` does): q and k
    widened to fp32, ``k.float().transpose(2, 3)``, the fp32 scores scaled and masked by an
    index-built mask (:func:`_index_mask`), the softmax in fp32 rounded back to fp16 for the
    product with v (``round_probabilities``; else v widened instead, as torch's decomposition of
    SDPA computes)."""
    bb = relax.BlockBuilder()
    shape = (1, 4, tokens, 64)
    q = relax.Var("q", relax.TensorType(shape, "float16"))
    k, v = (relax.Var(n, relax.TensorType((1, kv_heads, tokens, 64), "float16")) for n in "kv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            def batched(t, batched_shape):
                return bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(t, t.ty.shape)), batched_shape))

            def repeated(t):
                wide = bb.emit(relax.op.broadcast_to(bb.emit(relax.op.expand_dims(t, [2])), (1, kv_heads, 4 // kv_heads, tokens, 64)))
                return bb.emit(relax.op.reshape(wide, shape))

            wide_q = bb.emit(relax.op.astype(q, "float32"))
            kt = bb.emit(relax.op.permute_dims(bb.emit(relax.op.astype(repeated(k), "float32")), [0, 1, 3, 2]))
            s = bb.emit(relax.op.matmul(batched(wide_q, (4, tokens, 64)), batched(kt, (4, 64, tokens)), out_dtype="float32"))
            s = bb.emit(relax.op.divide(bb.emit(relax.op.reshape(s, (1, 4, tokens, tokens))), relax.const(8.0, "float32")))
            p = bb.emit(relax.op.nn.softmax(bb.emit(relax.op.add(s, _index_mask(bb, tokens, window))), axis=-1))
            if round_probabilities:
                p, values = bb.emit(relax.op.astype(p, "float16")), repeated(v)
            else:
                values = bb.emit(relax.op.astype(repeated(v), "float32"))
            out = bb.emit(relax.op.matmul(batched(p, (4, tokens, tokens)), batched(values, (4, tokens, 64)),
                                          out_dtype="float32"))
            out = bb.emit_output(bb.emit(relax.op.reshape(bb.emit(relax.op.astype(out, "float16")), shape)))
        bb.emit_func_output(out)
    return bb.get()


def _calls(mod: tvm.IRModule) -> list[relax.Call]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(e, relax.Call) else None)
    return found


def _ops(mod: tvm.IRModule) -> list[str]:
    return [c.op.name for c in _calls(mod) if isinstance(c.op, tvm.ir.Op)]


def _inputs(tokens: int, kv_heads: int, rng) -> list[np.ndarray]:
    return [rng.standard_normal((1, heads, tokens, 64)).astype("float16") for heads in (4, kv_heads, kv_heads)]


def _reference(q, k, v, window: int | None) -> np.ndarray:
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat(group, axis=1), v.repeat(group, axis=1)
    tokens = q.shape[2]
    keep = np.tri(tokens, tokens, 0, dtype=bool)
    if window is not None:
        keep &= ~np.tri(tokens, tokens, -window, dtype=bool)
    s = np.where(keep, q @ k.transpose(0, 1, 3, 2) / 8.0, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("window, kv_heads, form", [(None, 4, "causal"), (32, 4, "causal"), (5, 4, "windowed"),
                                                    (5, 2, "windowed")])
def test_an_index_built_mask_becomes_the_causal_flag_or_a_windowed_attention(window, kv_heads, form):
    """Eager attention becomes ``R.nn.attention`` (q and k widened, the probabilities rounded
    back: no value changes); its mask, computed from constants alone, becomes the causal flag
    where it keeps exactly the causal keys (a window at least the sequence), and a windowed
    attention function where it keeps the 5 newest of them; the attention family takes either;
    the same values on llvm as float64."""
    mod = _eager_attention(window, kv_heads=kv_heads)
    rewritten = AttentionMasksFromConstants(RewriteToRelaxOps(mod))
    ops = _ops(rewritten)
    assert not {"relax.nn.softmax", "relax.matmul", "relax.nn.attention_bias", "relax.arange"} & set(ops), rewritten.script()
    if form == "causal":
        (call,) = [c for c in _calls(rewritten) if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.attention"]
        assert call.attrs.causal_mask == "TopLeft"
    else:
        assert any(gv.name_hint.startswith("windowed_attention") for gv in rewritten.functions), rewritten.script()
    assert relax_report(rewritten).counts().get("attention", 0) == 1, relax_report(rewritten).format()
    q, k, v = _inputs(16, kv_heads, np.random.default_rng(7))
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v))).numpy().astype(np.float64)
    ref = _reference(q, k, v, window)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_a_causal_mask_held_as_a_constant_becomes_the_causal_flag():
    """``R.nn.attention`` given a constant ``[1, 1, 16, 16]`` causal bias (fp16's minimum above
    the diagonal): the causal flag, the bias gone."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((1, 16, 4, 64), "float16")) for n in "qkv")
    mask = np.where(np.tri(16, 16, dtype=bool), 0, np.finfo(np.float16).min).astype("float16")[None, None]
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.attention(q, k, v, bias=relax.const(mask))))
        bb.emit_func_output(out)
    (call,) = _calls(AttentionMasksFromConstants(bb.get()))
    assert call.op.name == "relax.nn.attention" and call.attrs.causal_mask == "TopLeft" and len(call.args) == 3


def test_attention_whose_probabilities_stay_fp32_is_left_alone():
    """v widened and the probabilities not rounded (torch's decomposition of SDPA): the kernel
    would round them to 16 bits, a change of precision, so the graph stays as written."""
    assert "relax.nn.softmax" in _ops(RewriteToRelaxOps(_eager_attention(round_probabilities=False)))


@pytest.mark.parametrize("queries, keys, fill, window, want, dtype", [
    (6, 6, -np.inf, None, ("TopLeft", None), "float64"),
    (6, 6, np.finfo(np.float16).min, 3, ("TopLeft", 3), "float16"),
    (4, 9, np.finfo(np.float32).min, None, ("BottomRight", None), "float32"),
    (4, 9, -np.inf, 2, ("BottomRight", 2), "bfloat16"),  # ml_dtypes' type, not numpy's floating
    (6, 6, -1e4, None, None, "float64"),  # a fill a large score could outweigh
])
def test_a_constant_mask_reads_as_a_causal_band_only_where_it_is_one(queries, keys, fill, window, want, dtype):
    import ml_dtypes

    shift = keys - queries if want and want[0] == "BottomRight" else 0
    keep = np.tri(queries, keys, shift, dtype=bool)
    if window is not None:
        keep &= ~np.tri(queries, keys, shift - window, dtype=bool)
    mask = np.where(keep, 0.0, fill)[None, None].repeat(2, axis=1)
    mask = mask.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    assert causal_band(mask) == want
    off = mask.copy()
    off[0, 1, -1, queries - 1 + shift] = fill  # the last query's own key masked in one head
    assert causal_band(off) is None


@pytest.mark.gpu
@pytest.mark.parametrize("window, kv_heads", [(None, 2), (64, 2), (64, 4)])
def test_masked_eager_attention_is_correct_on_the_gpu(window, kv_heads):
    """200 tokens (not a multiple of the tiles), causal or a window of 64 keys, grouped or not:
    the "tvm_dsm" pipeline's kernels against float64."""
    q, k, v = _inputs(200, kv_heads, np.random.default_rng())
    dev = tvm.cuda(0)
    mod = _eager_attention(window, tokens=200, kv_heads=kv_heads)
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm"), dev)
    got = vm["main"](*(tvm.runtime.tensor(a, dev) for a in (q, k, v))).numpy().astype(np.float64)
    ref = _reference(q, k, v, window)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def _baddbmm_attention(tokens: int = 16) -> tvm.IRModule:
    """GPT-NeoX's eager attention as tvm_dsm.relax_torch imports it over fp16 ``[1, 4, tokens,
    64]``: q and k viewed as ``[heads, tokens, 64]`` (k transposed after its view) and widened,
    ``baddbmm`` of a zero tensor (``zeros + 0.125 * q @ k^T``) rounded to fp16 and viewed back,
    ``where(causal, scores, -65504)`` with the causal condition built from ``arange``, the
    softmax in fp16."""
    bb = relax.BlockBuilder()
    shape = (1, 4, tokens, 64)
    q, k, v = (relax.Var(n, relax.TensorType(shape, "float16")) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            qv = bb.emit(relax.op.astype(bb.emit(relax.op.reshape(q, (4, tokens, 64))), "float32"))
            kt = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(k, (4, tokens, 64))), [0, 2, 1]))
            s = bb.emit(relax.op.matmul(qv, bb.emit(relax.op.astype(kt, "float32")), out_dtype="float32"))
            zeros = bb.emit(relax.op.astype(bb.emit(relax.op.zeros((4, tokens, tokens), "float16")), "float32"))
            s = bb.emit(relax.op.add(zeros, bb.emit(relax.op.multiply(s, relax.const(0.125, "float32")))))
            s = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(s, "float16")), (1, 4, tokens, tokens)))
            query = bb.emit(relax.op.expand_dims(bb.emit(relax.op.arange(0, tokens, 1, "int64")), [-1]))
            key = bb.emit(relax.op.expand_dims(bb.emit(relax.op.arange(0, tokens, 1, "int64")), [-2]))
            keep = bb.emit(relax.op.less_equal(key, query))
            s = bb.emit(relax.op.where(keep, s, bb.emit(relax.const(-65504.0, "float16"))))
            p = bb.emit(relax.op.nn.softmax(s, axis=-1))
            batched = [bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(t, t.ty.shape)), (4, tokens, d)))
                       for t, d in ((p, tokens), (v, 64))]
            out = bb.emit(relax.op.astype(bb.emit(relax.op.matmul(*batched, out_dtype="float32")), "float16"))
            out = bb.emit_output(bb.emit(relax.op.reshape(out, shape)))
        bb.emit_func_output(out)
    return bb.get()


def test_baddbmm_attention_with_a_where_mask_becomes_causal_attention():
    """GPT-NeoX's form (views of [heads, tokens, dim], a zero addend, the mask a ``where``):
    ``R.nn.attention`` with the causal flag, the same values on llvm as float64."""
    rewritten = AttentionMasksFromConstants(RewriteToRelaxOps(_baddbmm_attention()))
    ops = _ops(rewritten)
    assert not {"relax.nn.softmax", "relax.matmul", "relax.where", "relax.nn.attention_bias"} & set(ops), rewritten.script()
    (call,) = [c for c in _calls(rewritten) if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.attention"]
    assert call.attrs.causal_mask == "TopLeft"
    q, k, v = _inputs(16, 4, np.random.default_rng(9))
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v))).numpy().astype(np.float64)
    ref = _reference(q, k, v, None)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def _bloom_attention(tokens: int = 16, heads: int = 4) -> tuple[tvm.IRModule, np.ndarray]:
    """BLOOM's eager attention as tvm_dsm.relax_torch imports it, over fp16 q, k, v ``[1, tokens,
    heads, 64]``: q and v viewed as ``[heads, tokens, 64]``, k transposed to ``[1, heads, 64,
    tokens]`` before its view, ``baddbmm`` of the ALiBi bias (``slope[h] * key``, ``[heads, 1,
    tokens]``, built from constants) and ``0.125 * q @ k``, rounded to fp16 and viewed back,
    ``masked_fill(key > query, -65504)``, the softmax in fp32 rounded back; and the slopes."""
    slopes = 2.0 ** -np.arange(1, heads + 1, dtype=np.float32)
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((1, tokens, heads, 64), "float16")) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            def view(t, axes, shape):
                return bb.emit(relax.op.reshape(bb.emit(relax.op.permute_dims(t, axes)), shape))

            qv, vv = (view(t, [0, 2, 1, 3], (heads, tokens, 64)) for t in (q, v))
            kt = view(k, [0, 2, 3, 1], (heads, 64, tokens))
            keys = bb.emit(relax.op.reshape(bb.emit(relax.op.arange(0, tokens, 1, "float32")), (1, 1, tokens)))
            alibi = bb.emit(relax.op.multiply(relax.const(slopes.reshape(heads, 1, 1)), keys))
            s = bb.emit(relax.op.matmul(bb.emit(relax.op.astype(qv, "float32")), bb.emit(relax.op.astype(kt, "float32")),
                                        out_dtype="float32"))
            s = bb.emit(relax.op.add(alibi, bb.emit(relax.op.multiply(s, relax.const(0.125, "float32")))))
            s = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(s, "float16")), (1, heads, tokens, tokens)))
            query = bb.emit(relax.op.expand_dims(bb.emit(relax.op.arange(0, tokens, 1, "int64")), [-1]))
            key = bb.emit(relax.op.expand_dims(bb.emit(relax.op.arange(0, tokens, 1, "int64")), [-2]))
            fill = bb.emit(relax.const(-65504.0, "float16"))  # bound to a variable, as torch's importer binds it
            s = bb.emit(relax.op.where(bb.emit(relax.op.greater(key, query)), fill, s))
            p = bb.emit(relax.op.astype(bb.emit(relax.op.nn.softmax(bb.emit(relax.op.astype(s, "float32")), axis=-1)),
                                        "float16"))
            out = bb.emit(relax.op.matmul(bb.emit(relax.op.reshape(p, (heads, tokens, tokens))), vv, out_dtype="float32"))
            out = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(out, "float16")), (1, heads, tokens, 64)))
            out = bb.emit_output(bb.emit(relax.op.permute_dims(out, [0, 2, 1, 3])))
        bb.emit_func_output(out)
    return bb.get(), slopes


def test_bloom_attention_with_alibi_reaches_the_attention_family_with_its_values():
    """BLOOM's form (k transposed before its view, the ALiBi bias added over the batched product,
    ``masked_fill``): its bias, computed from constants, read as causal attention with ALiBi's
    slopes (a function the attention family computes per key, no bias tensor), the slopes
    exact; the same values on llvm as float64."""
    mod, slopes = _bloom_attention()
    rewritten = AttentionMasksFromConstants(RewriteToRelaxOps(mod))
    ops = _ops(rewritten)
    assert not {"relax.nn.attention_bias", "relax.nn.softmax", "relax.matmul"} & set(ops), rewritten.script()
    (read,) = [c.args[1].fields[3].value.numpy() for c in _calls(rewritten) if c.op.name == "relax.call_tir"
               and c.args[0].name_hint.startswith("alibi_attention")]
    np.testing.assert_array_equal(read, slopes)
    assert relax_report(rewritten).counts().get("attention", 0) == 1, relax_report(rewritten).format()
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 16, 4, 64)).astype("float16") for _ in range(3))
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v))).numpy().astype(np.float64)
    ref = _bloom_reference(q, k, v, slopes)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def _bloom_reference(q, k, v, slopes) -> np.ndarray:
    """Causal attention over ``[1, tokens, heads, 64]`` with ALiBi (``slope[h] * key``), float64."""
    tokens, heads = q.shape[1:3]
    q64, k64, v64 = (t.astype(np.float64).transpose(0, 2, 1, 3) for t in (q, k, v))
    s = q64 @ k64.transpose(0, 1, 3, 2) * 0.125 + slopes.reshape(1, heads, 1, 1) * np.arange(tokens)
    s = np.where(np.tri(tokens, tokens, dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ v64).transpose(0, 2, 1, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["bloom", "opt", "padded"])
def test_hugging_face_attention_forms_are_correct_on_the_gpu(form):
    """BLOOM's (ALiBi a bias, the mask a ``masked_fill`` of a bound fill), OPT's (the masked sum
    clamped) and a padding mask's (an input that empties the first queries' rows: finite there)
    eager attention over 200 tokens: the "tvm_dsm" pipeline's kernels against float64."""
    rng = np.random.default_rng()
    dev = tvm.cuda(0)
    if form == "bloom":
        mod, slopes = _bloom_attention(tokens=200)
        inputs = [rng.standard_normal((1, 200, 4, 64)).astype("float16") for _ in range(3)]
        ref = _bloom_reference(*inputs, slopes)
    elif form == "opt":
        mod, (q, k, v) = _opt_attention(tokens=200), _inputs(200, 4, rng)
        inputs, ref = [q * np.float16(0.125), k, v], _reference(q, k, v, None)
    else:
        mod, inputs = _padded_attention(tokens=200), _inputs(200, 4, rng)
        keep = np.tri(200, 200, dtype=bool)
        keep[:, :3] = False
        inputs.append(keep.reshape(1, 1, 200, 200))
        ref = _kept_reference(*inputs, rows=slice(3, None))
    vm = relax.VirtualMachine(tvm.compile(mod, target=TARGET, relax_pipeline="tvm_dsm"), dev)
    got = vm["main"](*(tvm.runtime.tensor(a, dev) for a in inputs)).numpy().astype(np.float64)
    if form == "padded":
        assert np.isfinite(got).all()
        got = got[:, :, 3:]
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def _opt_attention(tokens: int = 16, empty_row: bool = False) -> tvm.IRModule:
    """OPT's eager attention as tvm_dsm.relax_torch imports it over fp16 ``[1, 4, tokens, 64]``
    (q already scaled by 1/8): ``bmm`` of ``[heads, tokens, 64]`` views, viewed back and an
    additive causal mask added (``full`` of fp16's minimum, 0 where ``key < query + 1``),
    ``clamp(min=finfo.min)``, viewed again, the softmax in fp32 rounded back, ``bmm`` with v.
    ``empty_row``: the mask also hides every key of the first query."""
    bb = relax.BlockBuilder()
    shape = (1, 4, tokens, 64)
    q, k, v = (relax.Var(n, relax.TensorType(shape, "float16")) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            qv, kv, vv = (bb.emit(relax.op.reshape(t, (4, tokens, 64))) for t in (q, k, v))
            kt = bb.emit(relax.op.permute_dims(kv, [0, 2, 1]))
            s = bb.emit(relax.op.astype(bb.emit(relax.op.matmul(qv, kt, out_dtype="float32")), "float16"))
            s = bb.emit(relax.op.reshape(s, shape[:2] + (tokens, tokens)))
            fill = bb.emit(relax.op.full((tokens, tokens), relax.const(-65504.0, "float16"), "float16"))
            keys = bb.emit(relax.op.arange(0, tokens, 1, "int64"))
            bound = bb.emit(relax.op.reshape(bb.emit(relax.op.add(keys, relax.const(1 - empty_row, "int64"))),
                                             (tokens, 1)))
            mask = bb.emit(relax.op.where(bb.emit(relax.op.less(keys, bound)), bb.emit(relax.const(0.0, "float16")),
                                          fill))
            s = bb.emit(relax.op.add(s, bb.emit(relax.op.reshape(mask, (1, 1, tokens, tokens)))))
            s = bb.emit(relax.op.reshape(bb.emit(relax.op.clip(s, -65504.0, float("inf"))), (4, tokens, tokens)))
            p = bb.emit(relax.op.astype(bb.emit(relax.op.nn.softmax(bb.emit(relax.op.astype(s, "float32")), axis=-1)),
                                        "float16"))
            out = bb.emit(relax.op.astype(bb.emit(relax.op.matmul(p, vv, out_dtype="float32")), "float16"))
            out = bb.emit_output(bb.emit(relax.op.reshape(out, shape)))
        bb.emit_func_output(out)
    return bb.get()


def test_opts_clamped_scores_become_causal_attention_with_their_values():
    """OPT's clamp of the masked scores at fp16's minimum changes only masked scores where the
    constant mask keeps a key in every row: ``R.nn.attention`` with the causal flag, the same
    values on llvm as float64 (q taken as already scaled)."""
    rewritten = AttentionMasksFromConstants(RewriteToRelaxOps(_opt_attention()))
    ops = _ops(rewritten)
    assert not {"relax.nn.softmax", "relax.clip", "relax.nn.attention_bias"} & set(ops), rewritten.script()
    (call,) = [c for c in _calls(rewritten) if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.attention"]
    assert call.attrs.causal_mask == "TopLeft" and float(call.attrs.scale) == 1.0
    q, k, v = _inputs(16, 4, np.random.default_rng(13))
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (q * np.float16(0.125), k, v))).numpy().astype(np.float64)
    ref = _reference(q, k, v, None)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 2e-3


def test_a_clamp_is_kept_where_the_mask_empties_a_row():
    """A query whose every key is masked: the clamp makes its scores equal (the function weighs
    them alike), which the attention kernel's -inf would not; the softmax stays spelled out."""
    ops = _ops(AttentionMasksFromConstants(RewriteToRelaxOps(_opt_attention(empty_row=True))))
    assert "relax.clip" in ops and "relax.nn.softmax" in ops and "relax.nn.attention" not in ops


def _padded_attention(tokens: int = 16) -> tvm.IRModule:
    """Eager attention over fp16 ``[1, 4, tokens, 64]`` masked by an input ``keep`` ``[1, 1,
    tokens, tokens]`` (a padding mask: not computed from constants) as Hugging Face fills it,
    ``where(keep, scores, finfo(float16).min)``, the softmax in fp32 rounded back."""
    bb = relax.BlockBuilder()
    shape = (1, 4, tokens, 64)
    q, k, v = (relax.Var(n, relax.TensorType(shape, "float16")) for n in "qkv")
    keep = relax.Var("keep", relax.TensorType((1, 1, tokens, tokens), "bool"))
    with bb.function("main", [q, k, v, keep]):
        with bb.dataflow():
            def batched(t, batched_shape):
                return bb.emit(relax.op.reshape(bb.emit(relax.op.broadcast_to(t, t.ty.shape)), batched_shape))

            kt = bb.emit(relax.op.permute_dims(k, [0, 1, 3, 2]))
            s = bb.emit(relax.op.matmul(batched(q, (4, tokens, 64)), batched(kt, (4, 64, tokens)), out_dtype="float32"))
            s = bb.emit(relax.op.reshape(bb.emit(relax.op.astype(s, "float16")), (1, 4, tokens, tokens)))
            s = bb.emit(relax.op.multiply(s, relax.const(0.125, "float16")))
            s = bb.emit(relax.op.where(keep, s, bb.emit(relax.const(-65504.0, "float16"))))
            p = bb.emit(relax.op.astype(bb.emit(relax.op.nn.softmax(bb.emit(relax.op.astype(s, "float32")), axis=-1)),
                                        "float16"))
            out = bb.emit(relax.op.matmul(batched(p, (4, tokens, tokens)), batched(v, (4, tokens, 64)), out_dtype="float32"))
            out = bb.emit_output(bb.emit(relax.op.reshape(bb.emit(relax.op.astype(out, "float16")), shape)))
        bb.emit_func_output(out)
    return bb.get()


def test_a_padding_mask_that_empties_a_row_keeps_the_row_finite():
    """A query whose every key a padding mask hides (Hugging Face's left padding under a causal
    mask): the function weighs its keys by a finite fill, so its output is finite; read as
    ``R.nn.attention`` with the fill as the bias (not -inf, whose empty row is 0 / 0), the other
    rows as float64 computes them."""
    rewritten = AttentionMasksFromConstants(RewriteToRelaxOps(_padded_attention()))
    assert "relax.nn.attention_bias" in _ops(rewritten), rewritten.script()
    q, k, v = _inputs(16, 4, np.random.default_rng(17))
    keep = np.tri(16, 16, dtype=bool)
    keep[:3, :] = False  # three padded queries see no key
    keep[:, :3] = False
    vm = relax.VirtualMachine(tvm.compile(rewritten, target=LLVM), tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (q, k, v, keep.reshape(1, 1, 16, 16)))).numpy().astype(np.float64)
    assert np.isfinite(got).all()
    ref = _kept_reference(q, k, v, keep, rows=slice(3, None))
    assert np.linalg.norm(got[:, :, 3:] - ref) / np.linalg.norm(ref) < 2e-3


def _kept_reference(q, k, v, keep, rows: slice) -> np.ndarray:
    """Attention of the queries ``rows`` over the keys ``keep`` keeps (each row keeps one), in
    float64."""
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    s = np.where(keep, q64 @ k64.transpose(0, 1, 3, 2) / 8.0, -np.inf)[:, :, rows]
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v64


@pytest.mark.parametrize("form", ["keys_fp16", "distance_fp32", "keys_over_batch"])
def test_alibi_reads_as_slopes_from_the_smallest_keys(form):
    """``slope[h] * j`` built in fp16 over 2048 keys (rounded as BLOOM rounds it) or ``-slope[h]
    * (i - j)`` in fp32, under a causal mask of fp16's minimum, repeated over a batch: the
    slopes exactly."""
    slopes = 2.0 ** -np.arange(1, 5, dtype=np.float32)
    keys = 2048 if form == "keys_fp16" else 64
    i, j = np.arange(keys)[:, None], np.arange(keys)[None, :]
    dtype = np.float16 if form == "keys_fp16" else np.float32
    values = slopes[:, None, None] * (j - i if form == "distance_fp32" else j + 0 * i)
    bias = np.where(j <= i, values.astype(dtype), dtype(-65504))[None]
    if form == "keys_over_batch":
        bias = np.repeat(bias, 3, axis=0)
    np.testing.assert_array_equal(alibi_slopes(bias, 4), slopes)


def test_a_bias_that_is_not_alibi_has_no_slopes():
    i, j = np.arange(32)[:, None], np.arange(32)[None, :]
    square = np.where(j <= i, 0.01 * (j ** 2), -np.inf).astype(np.float32)[None, None]
    assert alibi_slopes(np.repeat(square, 2, axis=1), 2) is None
    per_batch = np.stack([np.where(j <= i, s * j, -np.inf) for s in (0.5, 0.25)]).astype(np.float32)[:, None]
    assert alibi_slopes(per_batch, 1) is None
