"""A Llama decoder layer written as a torch user writes it (nn.Linear, SDPA, an RMSNorm
module), exported with ``torch.export`` and imported with tvm-dsm's importer
(:mod:`tvm_dsm.relax_torch`): the "tvm_dsm" pipeline's report names a family for its projections
(the gate and up one gated GEMM, the residuals in their epilogues), its attention and both RMSNorms (put back as ``R.nn.rms_norm`` by tvm_dsm.relax_patterns) and no
kernel crashes; the imported model computes what torch does, in torch's types; SDPA's arguments
(scale, masks, grouped heads) mean what they mean in torch (where torch is installed; the GPU
machine has it)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tvm_dsm.relax_torch import from_exported_program  # noqa: E402
from tvm_dsm.workloads.torch_layers import (BertLayer, DecoderLayer, GPT2Block, QwenLayer, ViTBlock,  # noqa: E402
                                            exported_decoder_layer)


def test_a_torch_exported_decoder_layer_gets_tvm_dsm_kernels_and_none_crashes():
    from tvm_dsm.model_report import relax_report

    layer = DecoderLayer().half().eval()
    mod, _ = exported_decoder_layer(layer, torch.randn(1, 128, 256, dtype=torch.float16), from_exported_program)
    report = relax_report(mod)
    assert not [row.name for row in report.rows if "crashed" in row.reason], report.format()
    assert report.counts().get("split_k_gemm", 0) >= 3  # the projections' distinct shapes
    assert report.counts().get("attention", 0) == 1, report.format()
    assert any(row.name.startswith("gated_projection") for row in report.rows), report.format()
    assert not [row.name for row in report.rows if row.where == "dlight" and "add" in row.name], report.format()
    norms = [row.name for row in report.rows if row.where == "row_norm"]
    assert norms and all("rms_norm" in name for name in norms), report.format()


def _run(mod, x, params):
    import tvm
    from tvm import relax

    params = [p.detach().numpy() if hasattr(p, "detach") else p for p in params]
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x.numpy()), *(tvm.runtime.tensor(p) for p in params))
    return out[0].numpy()


def test_the_rms_norm_rewrite_computes_what_torch_does_in_fp32():
    """The layer in fp32 on CPU, before and after tvm_dsm.relax_patterns, against torch."""
    import tvm
    from tvm import relax
    from tvm_dsm.relax_patterns import RewriteToRelaxOps

    torch.manual_seed(0)
    layer = DecoderLayer(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128).float().eval()
    with torch.no_grad():
        for norm in (layer.input_norm, layer.post_norm):
            norm.weight.normal_()
    x = torch.randn(2, 8, 64)
    mod, params = exported_decoder_layer(layer, x, from_exported_program)
    rewritten = RewriteToRelaxOps(mod)
    calls = []
    relax.analysis.post_order_visit(rewritten["main"], lambda e: calls.append(e.op.name) if isinstance(
        e, relax.Call) and isinstance(e.op, tvm.ir.Op) else None)
    assert calls.count("relax.nn.rms_norm") == 2 and "relax.power" not in calls, rewritten.script()
    with torch.no_grad():
        want = layer(x).numpy()
    for got in (_run(mod, x, params), _run(rewritten, x, params)):
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


def _relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_a_16_bit_layer_keeps_torchs_types_and_values():
    """TVM's importer widens every product to fp32 and returns fp32; tvm-dsm's returns fp16, as
    torch does, within fp16's bound of the layer in float64."""
    from tvm.relax.frontend.torch import from_exported_program as tvm_import

    torch.manual_seed(1)
    layer = DecoderLayer(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128).half().eval()
    x = torch.randn(2, 8, 64, dtype=torch.float16)
    with torch.no_grad():
        want = layer.double()(x.double()).numpy()
    layer.half()
    ours_mod, params = exported_decoder_layer(layer, x, from_exported_program)
    stock_mod, _ = exported_decoder_layer(layer, x, tvm_import)
    assert ours_mod["main"].body.ty.fields[0].dtype == "float16"
    assert stock_mod["main"].body.ty.fields[0].dtype == "float32"
    got = _run(ours_mod, x, params)
    assert got.dtype == np.float16 and _relative_error(got, want) < 2e-3


class _Attention(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, mask=None):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, **self.kwargs)


@pytest.mark.parametrize("kwargs, mask", [
    ({"scale": 0.3}, None),
    ({"is_causal": True}, None),
    ({"enable_gqa": True}, None),
    ({}, "bool"),
    ({"scale": 0.2}, "float"),
])
def test_scaled_dot_product_attention_means_what_it_means_in_torch(kwargs, mask):
    """TVM's own converter drops ``scale`` and ``enable_gqa``; tvm-dsm's keeps them (fp32, llvm)."""
    import tvm
    from tvm import relax

    torch.manual_seed(2)
    kv_heads = 2 if kwargs.get("enable_gqa") else 4
    q = torch.randn(2, 4, 6, 16)
    k, v = torch.randn(2, kv_heads, 9, 16), torch.randn(2, kv_heads, 9, 16)
    args = [q, k, v]
    if mask == "bool":
        args.append(torch.rand(6, 9) > 0.3)
        args[-1][:, 0] = True  # every query keeps a key
    elif mask == "float":
        args.append(torch.randn(2, 1, 6, 9))
    module = _Attention(**kwargs)
    mod = from_exported_program(torch.export.export(module, tuple(args)))
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](*(tvm.runtime.tensor(a.numpy()) for a in args))
    with torch.no_grad():
        want = module(*(a.double() if a.is_floating_point() else a for a in args)).numpy()
    assert _relative_error(got[0].numpy(), want) < 1e-5


def test_attention_with_dropout_is_refused_by_name():

    q = torch.randn(1, 2, 4, 8)
    program = torch.export.export(_Attention(dropout_p=0.1), (q, q, q))
    with pytest.raises(ValueError, match="dropout_p"):
        from_exported_program(program)


@pytest.mark.parametrize("model", ["gpt2", "bert"])
def test_biased_16_bit_layers_import_and_keep_their_values(model):
    """TVM's importer fails on a 16-bit linear layer with a bias (it adds the fp16 bias to its
    fp32 product); tvm-dsm's adds it in fp32 and rounds once. BERT's spelled-out attention with
    its mask reaches the attention family (values: tvm_dsm.gpu.torch_layer against float64)."""
    from tvm.relax.frontend.torch import from_exported_program as tvm_import
    from tvm_dsm.model_report import relax_report

    torch.manual_seed(3)
    layer = (GPT2Block(64, 4) if model == "gpt2" else BertLayer(64, 4)).half().eval()
    x = torch.randn(2, 8, 64, dtype=torch.float16)
    inputs = (x,) if model == "gpt2" else (x, torch.where(torch.rand(2, 1, 1, 8) < 0.25, -1e4, 0.0).half())
    with pytest.raises(Exception, match="same datatype"):
        exported_decoder_layer(layer, inputs, tvm_import)
    mod, _ = exported_decoder_layer(layer, inputs, from_exported_program)
    assert relax_report(mod).counts().get("attention", 0) == 1


def test_qwen2_and_vit_layers_as_their_modeling_code_writes_them_get_tvm_dsm_kernels():
    """Qwen2's RMSNorm widens its row twice (one norm once common subexpressions merge); timm's
    ViT unbinds its packed qkv after a transpose (sliced where it lies: no transpose kernel)."""
    from tvm_dsm.model_report import relax_report

    torch.manual_seed(4)
    qwen, _ = exported_decoder_layer(QwenLayer().half().eval(), torch.randn(2, 16, 256, dtype=torch.float16),
                                     from_exported_program)
    report = relax_report(qwen)
    norms = [row.name for row in report.rows if row.where == "row_norm"]
    assert norms and all("rms_norm" in name for name in norms), report.format()
    assert report.counts().get("attention", 0) == 1 and report.counts().get("split_k_gemm", 0) >= 4, report.format()
    vit, _ = exported_decoder_layer(ViTBlock(128, 4).half().eval(), torch.randn(2, 17, 128, dtype=torch.float16),
                                    from_exported_program)
    report = relax_report(vit)
    assert report.counts().get("attention", 0) == 1, report.format()
    assert not [row.name for row in report.rows if "transpose" in row.name], report.format()


@pytest.mark.parametrize("model, attention", [("phi2", "attention"), ("mistral", "attention"),
                                              ("mistral_window", "windowed_attention"), ("neox", "attention"),
                                              ("bloom", "alibi_attention"), ("opt", "attention")])
def test_hugging_face_attention_with_its_own_mask_reaches_the_attention_kernel(model, attention):
    """Phi-2's eager attention (q, k widened to fp32, a ``triu`` causal mask of fp32's minimum, the
    probabilities rounded back), GPT-NeoX's (``baddbmm`` over ``[batch * heads, tokens, dim]``
    views, the mask a ``where``), BLOOM's (ALiBi by ``baddbmm``, k transposed before its view: the
    ALiBi read as its slopes), OPT's (an additive causal mask, the sum clamped at fp16's minimum) and Mistral's SDPA with a boolean sliding-window mask built from
    ``arange``: one attention kernel and no mask kernel, causal where the mask is causal, a windowed
    attention where the window is shorter than the sequence (the values:
    tests/test_relax_attention_masks.py on llvm, the layers against float64 on the GPU in
    ``tvm_dsm.gpu.torch_layer``)."""
    from tvm_dsm.model_report import relax_report
    from tvm_dsm.workloads.torch_layers import BloomLayer, GPTNeoXLayer, MistralLayer, OPTDecoderLayer, Phi2Layer

    torch.manual_seed(5)
    layer = {"phi2": lambda: Phi2Layer(160, 2, 320, 32), "mistral": lambda: MistralLayer(128, 2, 1, 256, window=64),
             "mistral_window": lambda: MistralLayer(128, 2, 1, 256, window=8),
             "neox": lambda: GPTNeoXLayer(128, 2, 256, 0.25), "bloom": lambda: BloomLayer(128, 2, 256),
             "opt": lambda: OPTDecoderLayer(128, 2, 256)}[model]().half().eval()
    x = torch.randn(1, 24, 160 if model == "phi2" else 128, dtype=torch.float16)
    report = relax_report(exported_decoder_layer(layer, x, from_exported_program)[0])
    assert [row.name for row in report.rows if row.where == "attention"] == [attention], report.format()
    assert not [row.name for row in report.rows if "where" in row.name or "greater" in row.name], report.format()


def test_a_mixtral_moe_block_builds_with_its_scatter_prescheduled():
    """The routing's ``scatter`` is TOPI's GPU kernel written with TVM's IR builder: prescheduled,
    not a family's crash; the experts' projections are tvm-dsm GEMMs."""
    from tvm_dsm.model_report import relax_report
    from tvm_dsm.workloads.torch_layers import MixtralMoEBlock

    torch.manual_seed(6)
    layer = MixtralMoEBlock(128, 256, 4, 2).half().eval()
    report = relax_report(exported_decoder_layer(layer, torch.randn(1, 32, 128, dtype=torch.float16),
                                                 from_exported_program)[0])
    assert not [row.name for row in report.rows if "crashed" in row.reason], report.format()
    assert report.counts().get("prescheduled", 0) >= 1 and report.counts().get("split_k_gemm", 0) >= 1, report.format()


def test_a_layer_is_held_to_torchs_own_error_where_the_model_rounds_more():
    from tvm_dsm.gpu.torch_layer import within_bound

    assert within_bound(4e-3, []) and not within_bound(6e-3, [])
    assert within_bound(1.05e-2, [1.0e-2, 1.3e-2]) and not within_bound(1.2e-2, [1.0e-2, 1.3e-2])


def test_attention_of_a_symbolic_length_imports_where_tvms_importer_does():
    """Mistral's layer exported with a symbolic token count: the rotary slices leave q's shape
    unknown to Relax, and TVM's attention operator cannot infer its result from it (it crashed
    the process); q is cast to the shape torch traced, the length the variable k's shape names."""
    import tvm
    from tvm import relax
    from tvm_dsm.workloads.torch_layers import MistralLayer

    layer = MistralLayer(128, 2, 1, 256, window=4096).half().eval()
    tokens = torch.export.Dim("tokens", min=2, max=1024)
    program = torch.export.export(layer, (torch.randn(1, 24, 128, dtype=torch.float16),),
                                  dynamic_shapes={"x": {1: tokens}})
    mod = from_exported_program(program)
    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(e, relax.Call) and isinstance(
        e.op, tvm.ir.Op) and e.op.name.startswith("relax.nn.attention") else None)
    (attention,) = calls
    q_shape = attention.args[0].ty.shape
    assert q_shape is not None and isinstance(q_shape.values[1], tvm.tirx.Var), mod.script()


class _PositionArithmetic(torch.nn.Module):
    """``x`` plus a float computed from integer positions, as position and bucket code writes it."""

    def __init__(self, spell):
        super().__init__()
        self.spell = spell

    def forward(self, x):
        return x + self.spell(torch.arange(x.shape[-1]))


@pytest.mark.parametrize("spell", [
    lambda i: i / 3,  # true division of an int64 tensor
    lambda i: i / (i + 1),
    lambda i: i * 0.5 + 0.25,  # float scalars: truncated to the integer type by TVM's converters
    lambda i: 0.25 - i,
    lambda i: torch.reciprocal(i + 1),
    lambda i: torch.log(i + 1) + torch.exp(-i) + torch.sigmoid(i),  # refused by TVM's converters
    lambda i: i ** 0.5,
    lambda i: (i > 3) + 0.5,  # bool
], ids=["div", "div_tensor", "scalars", "rsub", "reciprocal", "transcendental", "pow", "bool"])
def test_integer_operands_are_promoted_to_the_float_result_as_torch_does(spell):
    """Each spelling gives torch's values (fp32, llvm); TVM's importer computes the first five in
    the integer type (``arange(8) / 3`` as ``[0, 0, 0, 1, ...]``) and refuses the rest."""
    import tvm
    from tvm import relax

    module, x = _PositionArithmetic(spell), torch.randn(2, 8)
    mod = from_exported_program(torch.export.export(module, (x,)))
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    np.testing.assert_allclose(got[0].numpy(), module(x).numpy(), rtol=1e-6, atol=1e-6)


class _T5Guard(torch.nn.Module):
    """T5's fp16 guard (Hugging Face's T5 block): where any element overflowed, clamp to a bound
    held as an fp32 0-d tensor; then a reduction to bools along an axis, kept."""

    def forward(self, x):
        bound = torch.where(torch.isinf(x).any(), torch.finfo(x.dtype).max - 1000, torch.finfo(x.dtype).max)
        clamped = torch.clamp(x, min=-bound, max=bound)
        rows = (x > 1).all(dim=-1, keepdim=True) | (x < -2).any(dim=-1, keepdim=True)
        return torch.where(rows, clamped, clamped * 2)


@pytest.mark.parametrize("overflowed", [False, True])
def test_t5s_overflow_guard_imports_and_computes_what_torch_does(overflowed):
    """TVM's importer stops on ``any`` / ``all`` and on a clamp whose bounds are tensors of
    another type; these compute torch's values (fp16, llvm), the clamp active where an element
    is infinite."""
    import tvm
    from tvm import relax

    x = torch.randn(4, 16).half() * 3
    if overflowed:
        x[1, 3] = float("inf")
    mod = from_exported_program(torch.export.export(_T5Guard(), (x,)))
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    np.testing.assert_array_equal(got[0].numpy(), _T5Guard()(x).numpy())


class _Powers(torch.nn.Module):
    def forward(self, x):
        return x.pow(2).mean(-1, keepdim=True), x.pow(3), x.pow(0.5)


def test_a_bfloat16_power_imports_and_computes_what_torch_does():
    """TVM's legalization of ``R.power`` stops on bfloat16: a square is imported as ``x * x``,
    another power computed in fp32 and rounded back, torch's values either way (llvm)."""
    import tvm
    from tvm import relax

    x = torch.rand(2, 7, 64).to(torch.bfloat16) + 0.5
    mod = from_exported_program(torch.export.export(_Powers(), (x,)))
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(_bf16(x)))
    for ours, theirs in zip(got, _Powers()(x)):
        np.testing.assert_allclose(ours.numpy().astype(np.float32), theirs.float().numpy(), rtol=1e-2)


def _bf16(x):
    import ml_dtypes

    return x.float().numpy().astype(ml_dtypes.bfloat16)


class _RoutedMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.router, self.up, self.down = (torch.nn.Linear(64, 8), torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))

    def forward(self, x):
        chosen = torch.nn.functional.one_hot(self.router(x).argmax(-1), 8).to(x.dtype)
        return self.down(torch.nn.functional.gelu(self.up(x))), chosen


def test_one_hot_keeps_the_model_pure_and_fused():
    """Decomposed, ``one_hot`` checks its indices with assertions, which make the whole function
    impure: nothing fuses (every cast, add and activation its own kernel). Kept whole, the
    GEMMs take their epilogues, and the values are torch's (llvm)."""
    import tvm
    from tvm import relax

    from tvm_dsm.model_report import relax_report

    model, x = _RoutedMlp().eval(), torch.randn(10, 64)
    mod = from_exported_program(torch.export.export(model, (x,)))
    assert "assert_op" not in mod["main"].script()
    half = copy.deepcopy(model).half()
    report = relax_report(from_exported_program(torch.export.export(half, (x.half(),))))
    assert report.counts().get("split_k_gemm", 0) >= 2 and len(report.kernels) <= 6, report.format()
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy()))
    out, chosen = model(x)
    np.testing.assert_allclose(got[0].numpy(), out.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got[1].numpy(), chosen.numpy())


class _CacheWrite(torch.nn.Module):
    """A static KV cache ``[B, H, S, D]`` written at the step's positions along the sequence."""

    def __init__(self, spell: str):
        super().__init__()
        self.spell = spell

    def forward(self, cache, k, positions):
        cache = cache.clone()
        if self.spell == "index_copy_":
            cache.index_copy_(2, positions, k)
        elif self.spell == "setitem":
            cache[:, :, positions] = k
        else:  # accumulated, along the heads (an axis between whole ones)
            cache = torch.ops.aten.index_put(cache, [None, positions], k.transpose(1, 2), True)
        return cache * 2


@pytest.mark.parametrize("spell", ["index_copy_", "setitem", "accumulate"])
def test_a_write_along_one_indexed_axis_imports_and_computes_what_torch_does(spell):
    """TVM's converter of ``index_put`` wants an index tensor per axis (the export gives None for
    the whole ones, the trailing ones left out): a scatter along the indexed axis (llvm)."""
    import tvm
    from tvm import relax

    cache, k = torch.randn(2, 4, 16, 8), torch.randn(2, 4, 3, 8)
    positions = torch.tensor([5, 0, 11]) if spell != "accumulate" else torch.tensor([1, 3, 1])
    if spell == "accumulate":
        k = torch.randn(2, 16, 3, 8)  # written at heads 1, 3, 1 of each position
    args = (cache, k, positions)
    mod = from_exported_program(torch.export.export(_CacheWrite(spell), args))
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    got = relax.VirtualMachine(executable, tvm.cpu())["main"](*(tvm.runtime.tensor(a.numpy()) for a in args))
    np.testing.assert_allclose(got[0].numpy(), _CacheWrite(spell)(*args).numpy(), rtol=1e-6)


class _UnsortedTopK(torch.nn.Module):
    def forward(self, scores):
        return torch.topk(scores, 6, dim=-1, sorted=False)


def test_an_unsorted_top_k_imports_as_the_sorted_one():
    """TVM's converter refuses ``sorted=False`` (DeepSeek's router); torch leaves that order
    unspecified, and the sorted one is what its CPU kernel gives (llvm)."""
    import tvm
    from tvm import relax

    scores = torch.randn(5, 64).softmax(-1)
    mod = from_exported_program(torch.export.export(_UnsortedTopK(), (scores,)))
    executable = tvm.compile(mod, target=tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    values, indices = relax.VirtualMachine(executable, tvm.cpu())["main"](tvm.runtime.tensor(scores.numpy()))
    want_values, want_indices = torch.topk(scores, 6, dim=-1)
    np.testing.assert_array_equal(indices.numpy(), want_indices.numpy())
    np.testing.assert_array_equal(values.numpy(), want_values.numpy())


class _MaskedWrite(torch.nn.Module):
    def forward(self, x, keep):
        x = x.clone()
        x[:, keep] = 0.0
        return x


def test_a_write_through_a_bool_mask_is_not_read_as_positions():
    """``x[:, mask] = v`` exports as ``index_put`` with a bool index: it is TVM's converter's to
    take (which refuses it), never a scatter at positions 0 and 1."""
    args = (torch.randn(3, 6), torch.tensor([False, False, True, False, True, True]))
    with pytest.raises(TypeError, match="integer dtype"):
        from_exported_program(torch.export.export(_MaskedWrite(), args))
