"""Attention as one tensor-core kernel: the planner's configurations on the project's own form,
and attention as users write it (layouts, grouped-query, head dims, lengths off the tiles)
through ``tvm_dsm.build``'s path."""

from __future__ import annotations

import dataclasses
import itertools
from ...hardware import load_hardware
from ...kernels import dense_decode
from ...kernels.attention import CONFIGS as ATTENTION_CONFIGS
from ...kernels.attention import default_config, find_attention, fuse_attention
from ...driver import schedule
from ...errors import ClusterError
from ...workloads import cascades as cascade_workloads
from ...workloads.attention_forms import attention_with_terms, te_attention, topi_attention
from .base import Variant, args_of, nbytes_of


#: Attention shapes (heads x batch, query length, key length, head dim); the first is the
#: issue's [128, 16, 512, 64].
ATTENTION_SHAPES = [(2048, 512, 512, 64), (256, 1024, 1024, 64), (64, 4096, 4096, 64), (256, 1024, 1024, 128)]


def attention() -> list[Variant]:
    """Attention as one kernel (tvm_dsm.kernels.attention), plain and causal, in each
    configuration that fits; default_config's is the pick."""
    variants = []
    for (heads, q_len, kv_len, dim), causal in itertools.product(ATTENTION_SHAPES, (False, True)):
        func = cascade_workloads.attention(heads, q_len, kv_len, dim, causal)
        args = args_of(func)
        for config in ATTENTION_CONFIGS:
            variants.append(Variant(
                name=f"attention_{heads}x{q_len}x{kv_len}x{dim}{'_causal' if causal else ''}"
                f"_m{config.block_m}n{config.block_n}" + (f"_w{config.warpgroups}" if config.warpgroups > 1 else ""),
                workload="attention",
                mod=fuse_attention(func, config),
                args=args,
                bytes=nbytes_of(args),
                flops=4 * heads * q_len * kv_len * dim // (2 if causal else 1),  # the keys seen
                plan={**vars(config), "planner": config == default_config(find_attention(func))},
                peers=("torch_eager", "torch_compile", "torch_sdpa"),
                reference_kwargs={"causal": True} if causal else {},
                extra={"causal": causal},
            ))
    return variants


#: (batch, heads, kv heads, query and key length, head dim, layout, causal, dtype): the issue's
#: [128, 16, 512, 64]; Llama-3-8B's (32 / 8 heads, 128) and Llama-3.2-1B's (32 / 8, 64) prefill
#: in [B, S, H, D]; Phi-3-mini's head dim 96 and Phi-2's 80, at lengths off the tiles.
ATTENTION_FORMS = [
    (128, 16, 16, 512, 64, "bhsd", False, "float16"),
    (8, 16, 16, 1024, 128, "bhsd", True, "float16"),
    (1, 32, 8, 2048, 128, "bshd", True, "float16"),
    (4, 32, 8, 1024, 64, "bshd", True, "bfloat16"),
    (4, 32, 32, 1024, 96, "bhsd", True, "float16"),
    (4, 32, 32, 1000, 80, "bshd", True, "float16"),
]


#: Decode (one query a head): (batch, heads, kv heads, key length, head dim, layout, dtype): the
#: issue's grouped [8, 32 / 8, 4096, 128]; Llama-3.2-1B's heads at batch 1; a batch of 32 at 2048;
#: Qwen2-7B's 28 / 4 heads in bf16 at a length off the tiles; 32 heads without groups; Phi-3-mini's
#: head dim 96.
DECODE_FORMS = [
    (8, 32, 8, 4096, 128, "bhsd", "float16"),
    (1, 32, 8, 2048, 64, "bshd", "float16"),
    (32, 32, 8, 2048, 128, "bhsd", "float16"),
    (8, 28, 4, 1000, 128, "bshd", "bfloat16"),
    (4, 32, 32, 4096, 128, "bhsd", "float16"),
    (8, 32, 32, 2048, 96, "bhsd", "float16"),
]


def attention_forms() -> list[Variant]:
    """Attention written as users write it (tvm_dsm.workloads.attention_forms), prefill and
    decode, each through the driver's schedule, against torch eager, torch.compile and SDPA in
    the same layout."""
    cases = [(f"te_{layout}_b{b}h{h}kv{kv}s{s}d{d}{'_causal' if causal else ''}_{dtype}",
              te_attention(b, h, s, s, d, kv_heads=kv, layout=layout, causal=causal, dtype=dtype),
              b * h * s * s * d, layout, causal)
             for b, h, kv, s, d, layout, causal, dtype in ATTENTION_FORMS]
    for form in DECODE_FORMS:
        b, h, _, s, d, layout, _ = form
        cases.append((decode_form_name(form), decode_form_func(form), b * h * s * d, layout, False))
    cases.append(("topi_bshd_b8h16s512d64", topi_attention(8, 16, 512, 512, 64), 8 * 16 * 512 * 512 * 64,
                  "bshd", False))
    return [form_variant(name, func, schedule(func).mod, products, layout, causal)
            for name, func, products, layout, causal in cases]


def form_variant(name: str, func, mod, products: int, layout: str, causal: bool) -> Variant:
    """An attention form's kernel ``mod`` (of ``func``, ``products`` multiply-adds of each of its
    two products before the causal half) against torch eager, torch.compile and SDPA."""
    args = args_of(func)
    return Variant(
        name=name, workload="attention_layout", mod=mod, args=args, bytes=nbytes_of(args),
        flops=4 * products // (2 if causal else 1), peers=("torch_eager", "torch_compile", "torch_sdpa"),
        reference_kwargs={"layout": layout, "causal": causal}, extra={"class": "attention", "causal": causal},
    )


def decode_form_func(form: tuple):
    """One of :data:`DECODE_FORMS` as TE writes it."""
    b, h, kv, s, d, layout, dtype = form
    return te_attention(b, h, 1, s, d, kv_heads=kv, layout=layout, dtype=dtype)


def decode_form_name(form: tuple) -> str:
    """The results row name of one of :data:`DECODE_FORMS`."""
    b, h, kv, s, d, layout, dtype = form
    return f"decode_{layout}_b{b}h{h}kv{kv}s{s}d{d}_{dtype}"


def decode_form_variant(form: tuple, config, label: str) -> Variant | None:
    """The cluster decode kernel of one of :data:`DECODE_FORMS` in ``config``
    (``decode_..._LABEL``; ``tvm_dsm``: the planner's pick); None where it does not take it."""
    b, h, _, s, d, layout, _ = form
    func = decode_form_func(form)
    try:
        mod = dense_decode.TEMPLATE.fuse(func, config)
    except ClusterError:
        return None
    variant = form_variant(f"{decode_form_name(form)}_{label}", func, mod, b * h * s * d, layout, False)
    return dataclasses.replace(variant, plan={"planner": label == "tvm_dsm", **dataclasses.asdict(config)},
                               extra={"class": "decode_attention", "causal": False})


def decode_pick(form: tuple):
    """The planner's configuration of one of :data:`DECODE_FORMS`."""
    return dense_decode.TEMPLATE.default_config(dense_decode.TEMPLATE.find(decode_form_func(form)), load_hardware())


def decode_forms() -> list[Variant]:
    """Decode attention as users write it (:data:`DECODE_FORMS`): the planner's pick
    (``NAME_tvm_dsm``) and the same cluster on the other cores (``NAME_tensor_cores`` or
    ``NAME_cuda_cores``, where they take it), against torch eager, torch.compile and SDPA."""
    variants = []
    for form in DECODE_FORMS:
        pick = decode_pick(form)
        other = dataclasses.replace(pick, tensor_cores=not pick.tensor_cores)
        variants += [decode_form_variant(form, pick, "tvm_dsm"),
                     decode_form_variant(form, other, "tensor_cores" if other.tensor_cores else "cuda_cores")]
    return [v for v in variants if v is not None]


#: Forms of :func:`~tvm_dsm.workloads.attention_forms.attention_with_terms` timed, and whether
#: SDPA takes them (its ``attn_mask``; a soft cap it has no form for).
TERMS = {"bias": True, "alibi": True, "softcap": False, "window": True, "fp16_fill": False, "padding": True}


def attention_terms(shapes: tuple = ((16, 2048, 128), (32, 1024, 64))) -> list[Variant]:
    """Attention with score terms or a mask other than the causal one (heads, length, head
    dim of ``shapes``, batch 1), through the driver's schedule, against torch eager and SDPA
    given the same terms as its mask."""
    variants = []
    for (heads, length, dim), (terms, sdpa) in itertools.product(shapes, TERMS.items()):
        func = attention_with_terms(terms, heads, length, dim)
        args = args_of(func)
        causal = terms in ("alibi", "window", "fp16_fill")
        variants.append(Variant(
            name=f"attention_{terms}_h{heads}s{length}d{dim}", workload="attention_terms", mod=schedule(func).mod,
            args=args, bytes=nbytes_of(args), flops=4 * heads * length * length * dim // (2 if causal else 1),
            peers=("torch_eager", "torch_sdpa") if sdpa else ("torch_eager",), reference_kwargs={"terms": terms},
            extra={"class": "attention", "terms": terms}))
    return variants

