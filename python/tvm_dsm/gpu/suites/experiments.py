"""One-off sweeps and A/B ablations behind the design choices (results under bench/results/archive/)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

from tvm import te
from ...bench.results import RESULTS, latest_path
from ...hardware import load_hardware
from ...workloads.dense import dense
from ...relax_integration import scheduling_form
from ...kernels.row_norm import (candidate_configs as row_norm_candidates, default_config as row_norm_default,
                                 find_row_norm, fuse_row_norm)
from ...workloads.norms import topi_norm
from ...rules.row_gemv import candidate_configs as row_gemv_candidates, find_row_gemv, schedule_row_gemv
from ...planners.split_k_gemm import PIPELINE_DEPTHS, SHALLOW_PIPELINES, plan_split_k_gemm, predict
from ...rules.split_k_gemm import GemmShape, SplitKGemmConfig, check_config, check_padded_config, schedule_split_k_gemm
from ...errors import ClusterError, passes
from ...planners.fused_chain import plan_chain, planned
from .gemm import (FP8_SHAPES, GEMM_SHAPES, dlight_variant, fp8_two_kernels, fp8_variant, fp8_workload, gated_variant,
                   gemm_configs, gemm_tag, gemm_variant, layer_shapes)
from .decode import DECODE_SHAPES, decode_picks, decode_plans, decode_variant, dim_lanes
from .base import CHAINS, SWIGLUS, Variant, args_of, fitting, launched, nbytes_of
from .chains import chain_variant, chain_variants, chain_workload
from .cascades import cascade_variants
from .attention import DECODE_FORMS, decode_form_variant, decode_pick, form_variant
from ...annotations import LAUNCH_EARLY_KEY, READ_ONLY_PARAMS_KEY
from ...driver import schedule
from ...kernels.attention import TEMPLATE as ATTENTION, fuse_attention, prefetches_terms
from ...workloads.attention_forms import attention_with_terms, te_attention
from ...kernels.decode_attention import DecodeConfig


def cascades_rows() -> list[Variant]:
    """Several rows per CTA (``rows_per_cta``) for the cascades whose rows merge inside one warp:
    MoE routing and the 1024-wide rows, 8-32 parts per row, 1-8 rows per CTA, and the planner's
    split."""
    return [v for name, size in [("moe_routing", (16384, 128, 8)), ("moe_routing", (16384, 256, 8)),
                                 ("moe_routing", (4096, 4096, 8)), ("softmax_stats", (16384, 1024)),
                                 ("layernorm_stats", (16384, 1024))]
            for v in cascade_variants(name, size, (8, 16, 32), (1, 2, 4, 8))]


#: Copy stages measured by decode_staged: rings of 2-6 chunks, and 0 (registers) beside them.
_COPY_STAGES = (0, 2, 3, 4, 6)


#: A ring's shared memory per CTA, at most (static shared memory holds 48 KB, with the merge's
#: partial states).
_RING_BYTES = 32 * 1024


def decode_staged() -> list[Variant]:
    """Decode attention with the lanes' K/V slices brought through a ring of ``copy_stages``
    chunks in shared memory by cp.async (0: register double buffering, as in ``decode``), over
    clusters of 1-8 CTAs, 8-32 parts per CTA and 2 or 4 keys per chunk."""
    plans = decode_plans()
    return [v for shape, ranks, groups, vector, stages in itertools.product(
                DECODE_SHAPES, (1, 2, 4, 8), (8, 16, 32), (2, 4), _COPY_STAGES)
            if groups * dim_lanes(shape) * stages * vector * 32 <= _RING_BYTES
            for v in decode_variant(shape, ranks, groups, vector, dim_lanes(shape), stages, plans)]


def _tensor_core_variant(form: tuple, config: DecodeConfig) -> Variant | None:
    """The decode kernel of ``form`` in ``config`` on tensor cores, named by its cluster, warps
    and (past two) register files: ``..._tensor_cores_r2_w8``, ``..._tensor_cores_r2_w8_f3``."""
    files = f"_f{config.files}" if config.files != 2 else ""
    return decode_form_variant(form, config, f"tensor_cores_r{config.ranks}_w{config.warps}{files}")


def decode_form_clusters(forms: list[tuple] = DECODE_FORMS) -> list[Variant]:
    """Decode attention as users write it (``forms``: batch, heads, kv heads, keys, head dim,
    layout, dtype) on tensor cores in clusters of 1-8 CTAs of 4 or 8 warps, beside the planner's
    pick."""
    variants = []
    for form in forms:
        variants.append(decode_form_variant(form, decode_pick(form), "tvm_dsm"))
        variants += [_tensor_core_variant(form, DecodeConfig(r, True, warps)) for warps in (4, 8) for r in (1, 2, 4, 8)]
    return [v for v in variants if v is not None]


#: The 1B Llama's decode attention (32 query / 8 KV heads of 64) at the decode grid's batches of
#: 8-64 and contexts of 512-8192, where torch.compile's step beat tvm-dsm's (llm/latest.json).
LLAMA_DECODE_FORMS = [(b, 32, 8, s, 64, "bhsd", "float16") for b in (8, 32, 64) for s in (512, 2048, 8192)]


def llama_decode_clusters() -> list[Variant]:
    """:func:`decode_form_clusters` at :data:`LLAMA_DECODE_FORMS`, contiguous K/V where the model's
    cache is paged, and clusters of 1-2 CTAs with three register files (two steps' loads in
    flight): whether another cluster, warp count or depth streams the KV cache faster at batches
    past one CTA an SM, against SDPA on the same shapes."""
    deeper = [_tensor_core_variant(form, DecodeConfig(r, True, warps, files=3))
              for form in LLAMA_DECODE_FORMS for warps in (4, 8) for r in (1, 2)]
    return decode_form_clusters(LLAMA_DECODE_FORMS) + [v for v in deeper if v is not None]


#: The 1B Llama's decode attention at batches of 1-16, where the grid rule
#: (:func:`~tvm_dsm.kernels.decode_attention.wave_ctas`,
#: :func:`~tvm_dsm.kernels.decode_attention.with_depth`) puts clusters of 1-8 CTAs of 8 warps,
#: with three register files where the grid runs at once at one CTA an SM and two where it runs
#: at once at two.
LLAMA_SMALL_BATCH_FORMS = [(b, 32, 8, s, 64, "bhsd", "float16") for b in (1, 2, 3, 4, 6, 12, 16)
                           for s in (512, 2048, 8192)]


def llama_decode_small_batches() -> list[Variant]:
    """:data:`LLAMA_SMALL_BATCH_FORMS` in clusters of 1-8 CTAs of 8 warps with two and three
    register files, beside the planner's pick and SDPA: which split of the keys and which depth
    pay at each batch."""
    variants = [decode_form_variant(form, decode_pick(form), "tvm_dsm") for form in LLAMA_SMALL_BATCH_FORMS]
    variants += [_tensor_core_variant(form, DecodeConfig(r, True, 8, files))
                 for form in LLAMA_SMALL_BATCH_FORMS for r in (1, 2, 4, 8) for files in (2, 3)]
    return [v for v in variants if v is not None]


#: Prefill attention with heads wider than 128 (batch, heads, kv heads, length, head dim, layout,
#: causal, dtype): Gemma-2-9B's 16 / 8 heads of 256 in bf16, a grouped 256 in [B, H, S, D], 192
#: without groups, 160 at a length off the tiles.
WIDE_HEAD_FORMS = [
    (1, 16, 8, 2048, 256, "bshd", True, "bfloat16"),
    (4, 8, 4, 1024, 256, "bhsd", True, "float16"),
    (2, 16, 16, 1024, 192, "bhsd", False, "float16"),
    (4, 16, 16, 1000, 160, "bshd", True, "float16"),
]


def _attention_configs(forms: list[tuple], overlaps: tuple = (None,)) -> list[Variant]:
    """Each attention form (batch, heads, kv heads, length, head dim, layout, causal, dtype) in
    every configuration of the tensor-core kernel that fits, with each of ``overlaps`` (the
    softmax overlapped with the previous tile's P V or not; None: by default), beside the
    planner's pick."""
    variants = []
    for b, h, kv, s, d, layout, causal, dtype in forms:
        func = te_attention(b, h, s, s, d, kv_heads=kv, layout=layout, causal=causal, dtype=dtype)
        name = f"te_{layout}_b{b}h{h}kv{kv}s{s}d{d}{'_causal' if causal else ''}_{dtype}"
        variants.append(form_variant(f"{name}_tvm_dsm", func, schedule(func).mod, b * h * s * s * d, layout, causal))
        for c, overlap in itertools.product(ATTENTION.configs(ATTENTION.find(func)), overlaps):
            label = f"n{c.block_n}r{c.row_blocks}w{c.warpgroups}" + ("" if overlap is None else f"o{int(overlap)}")
            c = dataclasses.replace(c, overlap_softmax=overlap)
            variants.append(form_variant(f"{name}_{label}", func, fuse_attention(func, c), b * h * s * s * d,
                                         layout, causal))
    return variants


def wide_head_attention() -> list[Variant]:
    """The tensor-core attention kernel at head dims 160-256 (:data:`WIDE_HEAD_FORMS`)."""
    return _attention_configs(WIDE_HEAD_FORMS)


def attention_terms_prefetch(shapes: tuple = ((16, 2048, 128), (32, 1024, 64))) -> list[Variant]:
    """Attention with a bias or padding mask tensor (heads, length, head dim of ``shapes``) in
    every configuration of the kernel, its tensor elements loaded while the scores' MMA runs
    (where registers allow) and after it, beside the planner's pick."""
    variants = []
    for (heads, length, dim), terms in itertools.product(shapes, ("bias", "padding")):
        func = attention_with_terms(terms, heads, length, dim)
        args = args_of(func)
        name = f"attention_{terms}_h{heads}s{length}d{dim}"
        shape = ATTENTION.find(func)

        def variant(label: str, mod) -> Variant:
            return Variant(name=f"{name}_{label}", workload="attention_terms", mod=mod, args=args,
                           bytes=nbytes_of(args), flops=4 * heads * length * length * dim,
                           peers=("torch_sdpa",), reference_kwargs={"terms": terms},
                           extra={"class": "attention", "terms": terms})

        variants.append(variant("tvm_dsm", schedule(func).mod))
        for c in ATTENTION.configs(shape):
            label = f"n{c.block_n}r{c.row_blocks}w{c.warpgroups}"
            variants.append(variant(f"{label}_after", fuse_attention(func, dataclasses.replace(c, prefetch_terms=False))))
            if prefetches_terms(shape, c):
                variants.append(variant(f"{label}_prefetched", fuse_attention(func, c)))
    return variants


#: The real-shape attention cases furthest behind SDPA (bench/results/real_shapes/latest.json:
#: 0.76-0.85x), as that suite writes them.
BEHIND_SDPA_FORMS = [
    (1, 16, 16, 1024, 128, "bhsd", False, "float16"),
    (1, 16, 16, 4096, 128, "bhsd", True, "float16"),
    (2, 14, 2, 1024, 64, "bhsd", False, "float16"),
    (1, 28, 4, 4096, 128, "bhsd", False, "float16"),
    (1, 32, 8, 2048, 128, "bhsd", False, "float16"),
    (1, 32, 8, 2048, 128, "bhsd", True, "float16"),
]


def attention_configs() -> list[Variant]:
    """The attention kernel's configurations on the real-shape cases furthest behind SDPA
    (:data:`BEHIND_SDPA_FORMS`): whether the pick or the kernel holds them back."""
    return _attention_configs(BEHIND_SDPA_FORMS)


#: Real-model attention shapes (bench/results/real_shapes) at head dims 64, 96 and 128, causal
#: and not: attention_overlap.
OVERLAP_FORMS = [(b, h, kv, s, d, "bhsd", causal, "float16")
                 for b, h, kv, s, d in ((1, 32, 8, 4096, 128), (1, 28, 4, 4096, 128), (1, 32, 8, 1024, 128),
                                        (1, 64, 8, 2048, 128), (1, 16, 16, 4096, 128), (1, 32, 8, 512, 128),
                                        (1, 32, 8, 4096, 64), (2, 32, 8, 512, 64), (1, 14, 2, 4096, 64),
                                        (1, 32, 32, 4096, 96))
                 for causal in (False, True)]


def attention_overlap() -> list[Variant]:
    """Every configuration with the softmax overlapped with the previous tile's P V and not
    (:func:`tvm_dsm.kernels.attention.overlaps_softmax`) on :data:`OVERLAP_FORMS`."""
    return _attention_configs(OVERLAP_FORMS, overlaps=(True, False))


#: Sequence lengths a symbolic-length attention is called at (symbolic_attention).
SYMBOLIC_LENGTHS = (1, 16, 128, 1024, 4096)
#: (query, key) lengths an attention of two symbolic lengths is called at (symbolic_attention).
SYMBOLIC_LENGTH_PAIRS = ((1, 4096), (16, 1024), (128, 2048), (1024, 1024), (512, 4096))
#: Key lengths a decode attention over a symbolic past is called at (symbolic_attention): fewer
#: than a cluster's CTAs take a step (some CTAs empty), and longer.
SYMBOLIC_DECODE_KEYS = (5, 128, 1024, 4096)
#: (query, key) lengths the attention of one symbolic length, the queries' or the keys', is
#: called at (symbolic_attention): which of the two variables costs the two-length kernel its time.
ONE_VARIABLE_PAIRS = ((16, 1024), (128, 2048))


def symbolic_attention() -> list[Variant]:
    """Grouped causal attention of a symbolic sequence length (a Relax model of any prompt
    length: one module, a kernel per range of lengths) against the same attention built at each
    length, at head dims 64 and 128; grouped attention over a past (no mask) with a query length
    and a key length, two variables (and either alone); and decode attention (one query) over a
    past of any length; each against static builds."""
    variants = []

    def compare(name, symbolic_mod, func, flops, causal, **extra):
        for label, mod in (("symbolic", symbolic_mod), ("static", schedule(func).mod)):
            variant = form_variant(f"{name}_{label}", func, mod, flops, "bhsd", causal)
            variants.append(dataclasses.replace(variant, extra={**variant.extra, "path": label, **extra}))

    for d in (64, 128):
        length = te.var("S")
        any_length = schedule(te_attention(2, 32, length, length, d, kv_heads=8, causal=True)).mod
        for s in SYMBOLIC_LENGTHS:
            compare(f"causal_b2h32kv8d{d}_s{s}", any_length, te_attention(2, 32, s, s, d, kv_heads=8, causal=True),
                    2 * 32 * s * s * d, True, length=s)
    any_lengths = schedule(te_attention(2, 32, te.var("Q"), te.var("K"), 128, kv_heads=8)).mod
    for q, k in SYMBOLIC_LENGTH_PAIRS:
        compare(f"past_b2h32kv8d128_q{q}k{k}", any_lengths, te_attention(2, 32, q, k, 128, kv_heads=8),
                2 * 32 * q * k * 128, False, length=q, keys=k)
    for q, k in ONE_VARIABLE_PAIRS:
        static = te_attention(2, 32, q, k, 128, kv_heads=8)
        for label, func in (("qvar", te_attention(2, 32, te.var("Q"), k, 128, kv_heads=8)),
                            ("kvar", te_attention(2, 32, q, te.var("K"), 128, kv_heads=8))):
            compare(f"past_b2h32kv8d128_q{q}k{k}_{label}", schedule(func).mod, static, 2 * 32 * q * k * 128, False,
                    length=q, keys=k)
    any_past = schedule(te_attention(8, 32, 1, te.var("K"), 128, kv_heads=8)).mod
    for k in SYMBOLIC_DECODE_KEYS:
        compare(f"decode_b8h32kv8d128_k{k}", any_past, te_attention(8, 32, 1, k, 128, kv_heads=8),
                8 * 32 * k * 128, False, length=1, keys=k)
    return variants


def gemm_wgmma() -> list[Variant]:
    """Warpgroup-MMA main loops (tvm_dsm.intrin.wgmma) against the mma.sync planner pick on the
    G/S layer shapes at M = 128 and a 4096 x 4096 M sweep: clusters, tiles and depths."""
    hw = load_hardware()
    variants = []
    cases = [(label, 128, n, k) for label, (n, k) in GEMM_SHAPES.items()]
    cases += [("sq4096", m, 4096, 4096) for m in (256, 1024, 4096)]
    for label, m, n, k in cases:
        shape = GemmShape(m, n, k, True)
        pick = plan_split_k_gemm(shape, hw)[0]
        variants.append(gemm_variant(label, m, n, k, pick.config, 0, pick.predicted_us))
        for s, (bm, bn), stages in itertools.product((1, 2, 4, 8), ((64, 128), (128, 128), (128, 256), (64, 256)), (4,)):
            config = SplitKGemmConfig(s, bm, bn, 64, bm // 16, 1, stages, tma=True, wgmma=True)
            if not passes(check_config, shape, config, hw):
                continue
            variants.append(gemm_variant(label, m, n, k, config, None,
                                          predict(shape, config, hw).predicted_us))
    return variants


def chains_tma() -> list[Variant]:
    """The operand-copy ablation of the fused chains at M = 128: the planner's top 3 of each
    copy kind, each also built with the other kind, on every chain and SwiGLU FFN."""
    hw = load_hardware()
    variants = []
    for label in {**CHAINS, **SWIGLUS}:
        func, shape, args = chain_workload(label, 128)
        try:
            plans = plan_chain(shape, hw)
        except ClusterError as err:
            print(f"{label}: {err}")
            continue
        ranked = {p.config: rank for rank, p in enumerate(plans)}
        top = [p.config for tma in (False, True) for p in [p for p in plans if p.config.tma == tma][:3]]
        for config in dict.fromkeys(dataclasses.replace(c, tma=t) for c in top for t in (False, True)):
            if config in ranked:  # valid with this copy kind
                variants.append(chain_variant(label, shape, func, args, plans[ranked[config]],
                                               ranked[config], hw))
    return variants


def gemm_tma() -> list[Variant]:
    """The operand-copy ablation: each of the planner's top 3 cp.async configurations and the
    sweep's, again with TMA tensor copies (tvm_dsm.transform.tma_pipeline), on the G/S layers
    at M = 128 and 4096 x 4096 at M = 256 and 4096; fp16, and bf16 for the first pick."""
    variants = []
    hw = load_hardware()
    cases = [(label, 128, n, k) for label, (n, k) in GEMM_SHAPES.items()]
    cases += [("sq4096", m, 4096, 4096) for m in (256, 4096)]
    for label, m, n, k in cases:
        shape = GemmShape(m, n, k, True)
        for config, (rank, predicted) in gemm_configs(shape, 3, hw):
            for tma in (False, True):
                c = dataclasses.replace(config, tma=tma)
                if not passes(check_config, shape, c, hw):
                    continue
                variants.append(gemm_variant(label, m, n, k, c, rank, predicted))
    return variants


def fp8_sweep(pipelines: tuple[int, ...] = SHALLOW_PIPELINES) -> list[Variant]:
    """Every TMA + wgmma configuration of the fp8 GEMM at 128 x 4096 x 4096 (the planner's
    pruned space with ``pipelines`` stages, ranked by prediction), alone and after the per-token
    quantization kernel."""
    hw = load_hardware()
    m, n, k = FP8_SHAPES[0]
    plans = [p for p in plan_split_k_gemm(GemmShape(m, n, k, True, "float8_e4m3fn"), hw,
                                          pipelines=pipelines)
             if p.config.tma and p.config.wgmma]
    variants = []
    for quantized in (False, True):
        func = fp8_workload(m, n, k, quantized)
        form, schedule = fp8_two_kernels(quantized)
        for rank, plan in enumerate(plans):
            try:
                variants.append(fp8_variant(func, (m, n, k), quantized, form, schedule, plan, rank))
            except ClusterError as err:  # the epilogue's tile does not fit beside the pipeline
                print(f"{form}c{plan.config.cluster_size}: refused: {err}")
    return variants


def fp8_depths() -> list[Variant]:
    """``fp8_sweep`` with the pipeline depths beyond 4 (measured while the planner offered fp8
    only 3 and 4: the evidence for offering more)."""
    return fp8_sweep(tuple(d for d in PIPELINE_DEPTHS if d not in SHALLOW_PIPELINES))


def decode_pdl() -> list[Variant]:
    """Decode attention launched programmatically and not: the ``decode_picks`` kernels. A
    decode step's attention follows the QKV projection on the same stream, as each replay
    follows the previous one here."""
    return [launched(v, on) for v in decode_picks() for on in (False, True)]


def programmatic_launch() -> list[Variant]:
    """Programmatic dependent launch (tvm_dsm.transform.programmatic_launch) on and off: the
    GEMM planner's pick on the G/S layers at M = 128 and 4096 x 4096 at M = 32 and 4096, and the
    chain family's pick for G4, G8, S3 and S8 at M = 128."""
    hw = load_hardware()
    cases = [(label, 128, n, k) for label, (n, k) in GEMM_SHAPES.items()]
    cases += [("sq4096", m, 4096, 4096) for m in (32, 4096)]
    variants = []
    for label, m, n, k in cases:
        plan = plan_split_k_gemm(GemmShape(m, n, k, True), hw)[0]
        variants.append(gemm_variant(label, m, n, k, plan.config, 0, plan.predicted_us))
    for label in ("G4", "G8", "S3", "S8"):
        variants += [v for v in chain_variants(label, 128, 0, hw) if v.plan["pick"]]
    return [launched(v, on) for v in variants for on in (False, True)]


def _first_of_each_name(variants: list[Variant]) -> list[Variant]:
    """``variants`` without the later ones of a name: GEMM plans that differ only in their warp
    layout share one (:func:`~tvm_dsm.gpu.suites.gemm.gemm_variant`), the better-ranked is kept."""
    return list({v.name: v for v in reversed(variants)}.values())[::-1]


#: Dense layers at M = 128 where the planner's pick trailed cuBLAS most (gemm_m.json: 0.65-0.83x).
_TRAILING_LAYERS = ("G3a", "G6a", "G8a", "G10a", "S2b", "S6b", "S8a")


def gemm_stages() -> list[Variant]:
    """Pipeline depth on the dense layers that trail cuBLAS at M = 128: the planner's top 3
    with each of PIPELINE_DEPTHS, where they fit (measured while the planner offered 3 and 4:
    the evidence for offering more)."""
    hw = load_hardware()
    shapes = layer_shapes()
    variants = []
    for label in _TRAILING_LAYERS:
        n, k = shapes[label]
        shape = GemmShape(128, n, k, True)
        for rank, plan in enumerate(plan_split_k_gemm(shape, hw)[:3]):
            for stages in PIPELINE_DEPTHS:
                config = dataclasses.replace(plan.config, stages=stages)
                if not passes(check_config, shape, config, hw):
                    continue
                predicted = predict(shape, config, hw).predicted_us
                variants.append(gemm_variant(label, 128, n, k, config, rank, predicted))
    return _first_of_each_name(variants)


#: The 1B Llama's GEMMs (N, K): fused QKV, attention output, gate and up, down, LM head.
LLAMA_GEMM_SHAPES = {"qkv": (3072, 2048), "o_proj": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
                     "lm_head": (32000, 2048)}


def _gemm_configs(shapes: dict[str, tuple[int, int]], rows: int, top: int = 6, wide: int = 10) -> list[Variant]:
    """The GEMMs ``shapes`` ((N, K) by label) at ``rows`` rows, planned as the family plans
    them (tiles past the edges allowed): the planner's first ``top``, and the ``wide`` best
    predicted of those whose grid covers 90% of the SMs or more (whether W streams faster over
    more SMs than the model says)."""
    hw = load_hardware()
    variants = []
    for label, (n, k) in shapes.items():
        shape = GemmShape(rows, n, k, True)
        plans = plan_split_k_gemm(shape, hw, padded=True)
        filling = [p for p in plans
                   if -(-rows // p.config.block_m) * (n // p.config.block_n) * p.config.cluster_size >= 0.9 * hw.sm_count]
        chosen = {p.config: p for p in (*plans[:top], *sorted(filling, key=lambda p: p.predicted_us)[:wide])}
        for plan in chosen.values():
            variants.append(gemm_variant(label, rows, n, k, plan.config, plans.index(plan), plan.predicted_us))
    return _first_of_each_name(variants)


def _llama_gemm_configs(rows: int) -> list[Variant]:
    """The 1B Llama's GEMMs (``LLAMA_GEMM_SHAPES``) at ``rows`` rows (:func:`_gemm_configs`)."""
    return _gemm_configs(LLAMA_GEMM_SHAPES, rows)


def decode_gemm_configs() -> list[Variant]:
    """The decode-batch kernels of the 1B Llama's GEMMs at M = 16, the range a batch of 1-16 runs
    in (:func:`_llama_gemm_configs`)."""
    return _llama_gemm_configs(16)


def prefill_gemm_configs() -> list[Variant]:
    """The 1B Llama's GEMMs at 128 and 512 rows, the ranges short prefills run in
    (:func:`_llama_gemm_configs`): in the model its down projection ran 28 and 59 us a layer
    there, 290 TF/s at 512 rows (``archive/llama_1b_grid_ours_s53.json``)."""
    return [v for rows in (128, 512) for v in _llama_gemm_configs(rows)]


#: The GEMMs (N, K) of a 768-wide encoder or decoder layer (BERT-base, GPT-2 small, ViT-B):
#: fused QKV, attention output, MLP up and down.
WIDTH_768_GEMM_SHAPES = {"qkv": (2304, 768), "proj": (768, 768), "fc": (3072, 768), "out": (768, 3072)}


def width_768_gemm_configs() -> list[Variant]:
    """Those GEMMs at 1024 and 4096 rows (a batch of 8 x 512 tokens), the ranks the torch
    layers' models run at (:func:`_gemm_configs`): whether the planner's pick or its tiles hold
    them back (GPT-2 and BERT layers at 8 x 512, bench/results/torch_layer)."""
    return [v for rows in (1024, 4096) for v in _gemm_configs(WIDTH_768_GEMM_SHAPES, rows)]


#: Biased GEMMs (M, N, K) of the layers whose GEMMs ran slower in the model than alone: ViT-B/16
#: at 32 x 197 tokens (qkv, fc1, fc2, proj), BERT-base at 8 x 512 (qkv) and the 1B Llama's o_proj
#: at 32 x 512.
MODEL_GEMM_SHAPES = ((6304, 2304, 768), (6304, 3072, 768), (6304, 768, 3072), (6304, 768, 768),
                     (4096, 2304, 768), (16384, 2048, 2048))


def _as_model_function(func):
    """``func`` as the "tvm_dsm" pipeline gives it in a model: launched early, its weight and
    bias named read-only."""
    return func.with_attrs({LAUNCH_EARLY_KEY: True, READ_ONLY_PARAMS_KEY: ["W", "bias"]})


def launch_early_gemms() -> list[Variant]:
    """Each of :data:`MODEL_GEMM_SHAPES` (bias and SiLU epilogue) scheduled as the "tvm_dsm"
    pipeline schedules a model's function: as a function alone (``plain``), launched early
    (``early``: ``LAUNCH_EARLY_KEY``, no weights named) and launched early with its weight and
    bias named read-only (``early_weights``: their first tiles copied before the wait, all their
    tiles prefetched into L2 where they fit PREFETCH_WINDOW_S), what a Relax model's function gets."""
    variants = []
    for m, n, k in MODEL_GEMM_SHAPES:
        func = dense(m, n, k, bias=True, activation="silu")
        forms = {"plain": func, "early": func.with_attr(LAUNCH_EARLY_KEY, True),
                 "early_weights": _as_model_function(func)}
        for label, form in forms.items():
            args = args_of(form)
            variants.append(Variant(name=f"dense_bias_silu_{m}x{n}x{k}_{label}", workload="dense_bias_silu",
                                    mod=schedule(form).mod, args=args, bytes=nbytes_of(args), flops=2 * m * n * k,
                                    extra={"m": m, "n": n, "k": k, "form": label}))
    return variants


def vit_gemm_configs() -> list[Variant]:
    """Those GEMMs at a ViT-B/16's token counts (197 a image: batches of 8 and 32), rows off
    every tile height but 16 and 32: whether the picks over tiles past M hold
    (bench/results/torch_layer: the batch of 32 at 0.69x torch.compile)."""
    return [v for rows in (8 * 197, 32 * 197) for v in _gemm_configs(WIDTH_768_GEMM_SHAPES, rows)]


#: Row counts between the 16-row tile and the 64-row warpgroup tile, where the tile height is
#: the choice: a decode batch past 16, a short prefill chunk.
RAGGED_ROWS = (17, 24, 33, 48, 64)


def _best_of_each_tile(shapes: dict[str, tuple[int, int]], row_counts: tuple[int, ...],
                       weight_layout: str = "nk") -> list[Variant]:
    """The GEMMs ``shapes`` ((N, K) by label) at each of ``row_counts``: for each tile height
    and MMA of the space, its best predicted configuration."""
    hw = load_hardware()
    variants = []
    for label, (n, k) in shapes.items():
        for rows in row_counts:
            plans = plan_split_k_gemm(GemmShape(rows, n, k, weight_layout == "nk"), hw, padded=True)
            best = {}
            for rank, p in enumerate(plans):
                best.setdefault((p.config.block_m, p.config.wgmma), (rank, p))
            for rank, p in best.values():
                variants.append(gemm_variant(label, rows, n, k, p.config, rank, p.predicted_us,
                                             weight_layout=weight_layout))
    return _first_of_each_name(variants)


def tile_heights() -> list[Variant]:
    """The 1B Llama's GEMMs (:data:`LLAMA_GEMM_SHAPES`) at :data:`RAGGED_ROWS`: for each tile
    height of the space, its best predicted configuration (whether the planner's tie-break
    between 64- and 128-row warpgroup tiles, and between those and 16/32-row tiles, holds where
    most of a tall tile's rows are padding)."""
    return _best_of_each_tile(LLAMA_GEMM_SHAPES, RAGGED_ROWS)


#: Weights stored [K, N] (``x @ W``: GPT-2's Conv1D, JAX models) as (N, K) by label, at decode
#: batches: the shapes whose short tiles trailed torch in the generality run.
KN_GEMM_SHAPES = {"kn_up": (14336, 2048), "kn_down": (4096, 14336), "kn_wide": (16384, 2048)}
KN_ROWS = (1, 4, 13, 32)


def kn_tile_heights() -> list[Variant]:
    """GEMMs over [K, N] weights (:data:`KN_GEMM_SHAPES`) at :data:`KN_ROWS` rows, each tile
    height and MMA's best (whether the short tiles' rule, measured over [N, K] weights, holds
    where W reaches the tensor cores through ``ldmatrix.trans`` on mma.sync but through TMA on
    warpgroup tiles)."""
    return _best_of_each_tile(KN_GEMM_SHAPES, KN_ROWS, "kn")


#: Layers whose rows run one past the 256-row tiles (generality: 257 x 2048 x 1024 fp16 and
#: 257 x 4096 x 3000 bf16 at 0.59x and 0.46x of torch), and the row counts around it.
PAST_TILE_SHAPES = {"d2048x1024": (2048, 1024, "float16"), "d4096x3000": (4096, 3000, "bfloat16")}
PAST_TILE_ROWS = (256, 257, 320, 384)


def past_tile_rows() -> list[Variant]:
    """Dense layers of :data:`PAST_TILE_SHAPES` at :data:`PAST_TILE_ROWS` rows, each in the
    planner's picks at 256 and 257 rows: whether a layer one row past its tiles runs slower for
    the padded tile (257 against 320 and 384, whole tiles of the same count) or for its plan."""
    hw = load_hardware()
    variants = []
    for label, (n, k, dtype) in PAST_TILE_SHAPES.items():
        picks = [plan_split_k_gemm(GemmShape(m, n, k, True, dtype=dtype), hw, padded=True)[0] for m in (256, 257)]
        for m in PAST_TILE_ROWS:
            shape = GemmShape(m, n, k, True, dtype=dtype)
            for pick in dict.fromkeys(p.config for p in picks):
                if passes(check_padded_config, shape, pick, hw):
                    variants.append(gemm_variant(label, m, n, k, pick, None, predict(shape, pick, hw).predicted_us,
                                                 dtype=dtype))
    return variants


def short_tile_depths() -> list[Variant]:
    """GEMMs and gated GEMMs of three SwiGLU shapes at 4 rows, on 16-row tiles (12 past M) of
    64-256 columns, 3-6 stages and clusters of 1-4, the planner's pick marked: how deep a
    tile past M must pipeline (``MIN_SHORT_TILE_BYTES_AHEAD``)."""
    hw = load_hardware()
    variants = []
    for n, k in ((28672, 8192), (14336, 4096), (8192, 2048)):
        for products, make in ((1, gemm_variant), (2, gated_variant)):
            shape = GemmShape(4, n, k, True, products=products)
            pick = plan_split_k_gemm(shape, hw, padded=True)[0].config
            sweep = (SplitKGemmConfig(s, 16, bn, 64, 1, min(4, bn // 32), stages, True)
                     for s, bn, stages in itertools.product((1, 2, 4), (64, 128, 256), (3, 4, 6)))
            for config in dict.fromkeys([pick, *sweep]):
                if passes(check_padded_config, shape, config, hw):
                    variants.append(make(f"{'g' if products == 2 else 'd'}{n}x{k}", 4, n, k, config,
                                         0 if config == pick else None, predict(shape, config, hw).predicted_us))
    return variants


#: A search_quality pool of the 1B Llama's decode-batch GEMMs at 32 and 64 rows, timed by
#: MetaSchedule's runner, which repeats a kernel on operands that stay in L2.
DECODE_POOL = "search_quality/pools_dense_decode_m32_64.json"


def decode_gemm_pool_rotated(fastest: int = 6) -> list[Variant]:
    """Each dense workload of :data:`DECODE_POOL` in its ``fastest`` configurations there and its
    planner's pick, re-timed with inputs rotated past L2: what those kernels do on weights read
    from HBM, as in a model's decode step (pools for python -m tvm_dsm.bench.calibrate)."""
    rows = [r for r in json.loads((RESULTS / DECODE_POOL).read_text())["rows"]
            if r["ok"] and r["family"] == "split_k_gemm" and r["workload"].startswith("dense_")]
    variants = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        measured = sorted((r for r in rows if r["workload"] == workload), key=lambda r: r["ours_us"])
        chosen = [*(r for r in measured if r["rank"] == 0), *measured[:fastest]]  # the pick kept on a name clash
        n, k = (int(x) for x in workload.split("_")[1].split("x"))
        m = int(workload.rsplit("_m", 1)[1])
        variants += [gemm_variant(f"dense_{n}x{k}", m, n, k, SplitKGemmConfig(**r["config"]), r["rank"],
                                  r["predicted_us"]) for r in chosen]
    return _first_of_each_name(variants)


#: (M, N) of the K-scaling series: decode batches' and prefill chunks' rows over the 1B
#: Llama's hidden size; and the depths each is timed at.
_K_SCALING_ROWS = ((32, 2048), (128, 2048), (512, 2048))
_K_SCALING_DEPTHS = (512, 1024, 2048, 4096, 8192)


def gemm_k_scaling() -> list[Variant]:
    """Where a GEMM's time goes, by depth: for each (M, N) of :data:`_K_SCALING_ROWS`, the
    planner's pick at K = 2048 and the same tiles without a cluster (no DSM reduction), each at
    every K of :data:`_K_SCALING_DEPTHS` it fits, beside cuBLAS. A line through a series' times
    splits them into a fixed part (launch, pipeline fill, reduction, epilogue, tail) and a part
    per unit of K (the main loop's rate), for the kernel and cuBLAS alike: which of the two
    trails where no configuration keeps up with cuBLAS (``trailing_dense_configs``)."""
    hw = load_hardware()
    variants = []
    for m, n in _K_SCALING_ROWS:
        pick = plan_split_k_gemm(GemmShape(m, n, 2048, True), hw)[0].config
        for config in dict.fromkeys([pick, dataclasses.replace(pick, cluster_size=1)]):
            for k in _K_SCALING_DEPTHS:
                shape = GemmShape(m, n, k, True)
                if not passes(check_config, shape, config, hw):
                    continue
                variants.append(gemm_variant(f"dense_{n}x{k}", m, n, k, config, None,
                                             predict(shape, config, hw).predicted_us))
    return variants


def trailing_dense_configs(below: float = 0.85) -> list[Variant]:
    """The real-shape dense layers whose committed row (bench/results/real_shapes/latest.json)
    runs below ``below`` of the better torch peer, each at its rows: the planner's first 4 and the
    4 best predicted that fill the machine (:func:`_gemm_configs`). Whether a configuration of
    the space keeps up with cuBLAS there (then the model's order is wrong) or none does (then the
    kernel is)."""
    by_rows: dict[int, dict[str, tuple[int, int]]] = {}
    for row in json.loads(latest_path("real_shapes").read_text())["rows"]:
        peers = [t for t in row.get("peers", {}).values() if t]
        if row["class"] == "dense" and row.get("ours_us") and peers and min(peers) / row["ours_us"] < below:
            by_rows.setdefault(row["m"], {})[f"dense_{row['n']}x{row['k']}"] = (row["n"], row["k"])
    return [v for rows, shapes in sorted(by_rows.items()) for v in _gemm_configs(shapes, rows, 4, 4)]


def row_gemv_configs() -> list[Variant]:
    """The 1B Llama's decode GEMMs at one row (``LLAMA_GEMM_SHAPES``) on the row GEMV rule
    (:mod:`tvm_dsm.rules.row_gemv`) in every configuration of 32 or more lanes a row, at most 512
    threads and 2 or 4 unrolled loads (archive/row_gemv_configs_s51.json), beside dlight's."""
    variants = []
    for label, (n, k) in LLAMA_GEMM_SHAPES.items():
        func = scheduling_form(dense(1, n, k))
        args = args_of(func)
        found = find_row_gemv(func)
        for config in row_gemv_candidates(found):
            if config.threads_per_row < 32 or config.threads > 512 or config.unroll not in (2, 4):
                continue
            variants.append(Variant(
                name=f"{label}_m1_gemv_r{config.rows_per_cta}_t{config.threads_per_row}_u{config.unroll}",
                workload="dense", mod=schedule_row_gemv(found, config).mod, args=args, bytes=nbytes_of(args),
                flops=2 * n * k, plan=dataclasses.asdict(config), peers=("torch_eager",),
                extra={"shape": label, "m": 1, "n": n, "k": k}))
        variants.append(dlight_variant(label, 1, n, k))
    return variants


#: (width, rows) of RMSNorm: where the row norm's default trailed torch.compile (real_shapes:
#: 8192 wide at 32 and 64 rows, 0.60-0.64x), the rows beside them, and the other hidden sizes.
ROW_NORM_SWEEP = ([(8192, m) for m in (1, 16, 32, 64, 128)] + [(4096, m) for m in (32, 64, 128)]
                  + [(width, m) for width in (2048, 3072, 3584) for m in (1, 16, 64, 128)]
                  # where the H100's real shapes trail torch.compile at 512-1024 rows (0.83-0.90x)
                  + [(width, m) for width in (896, 2048, 4096, 8192) for m in (512, 1024)])


def row_norm_configs() -> list[Variant]:
    """RMSNorm (TOPI's, fp16) at :data:`ROW_NORM_SWEEP` in every configuration of the row norm
    kernel (:mod:`tvm_dsm.kernels.row_norm`) of a warp or more a row and portable clusters, beside
    torch eager and torch.compile (timed once a shape)."""
    hw = load_hardware()
    variants = []
    for width, rows in ROW_NORM_SWEEP:
        func = topi_norm("rms_norm", rows, width, "float16")
        args = args_of(func)
        form = scheduling_form(func)
        found = find_row_norm(form)
        default = row_norm_default(found, hw)
        for config in row_norm_candidates(found):
            if config.threads_per_row < 32 or config.ranks > 8:
                continue
            is_default = config == default
            variants.append(Variant(
                name=f"norm_{width}_m{rows}_t{config.threads_per_row}_r{config.rows_per_cta}_c{config.ranks}",
                workload="rms_norm", mod=fuse_row_norm(form, config), args=args,
                bytes=nbytes_of(args), flops=0, plan={**dataclasses.asdict(config), "default": is_default},
                peers=("torch_eager", "torch_compile"),
                extra={"width": width, "m": rows}))
    return variants


def gemm_depths() -> list[Variant]:
    """Every G/S layer and batch of ``gemm_m``, and every fp8 shape alone and behind its
    quantization kernel, where the planner's pick changes when its space takes pipelines deeper
    than 4 stages: the pick from 3-4 stages and the pick from all."""
    hw = load_hardware()
    variants = []
    for (m, n, k), quantized in itertools.product(FP8_SHAPES, (False, True)):
        func, fp8_shape = fp8_workload(m, n, k, quantized), GemmShape(m, n, k, True, "float8_e4m3fn")
        form, schedule = fp8_two_kernels(quantized)
        picks = [fitting(func, schedule, plan_split_k_gemm(fp8_shape, hw, pipelines=pipelines), 1)[0]
                 for pipelines in (SHALLOW_PIPELINES, None)]
        if picks[0].config != picks[1].config:
            variants += [fp8_variant(func, (m, n, k), quantized, form, schedule, p, 0) for p in picks]
    for m in (16, 64, 128, 256, 1024, 4096):
        for label, (n, k) in layer_shapes().items():
            shape = GemmShape(m, n, k, True)
            try:
                shallow = plan_split_k_gemm(shape, hw, pipelines=SHALLOW_PIPELINES)[0]
            except ClusterError:
                continue
            deep = plan_split_k_gemm(shape, hw)[0]
            if deep.config != shallow.config:
                variants += [gemm_variant(label, m, n, k, p.config, 0, p.predicted_us)
                             for p in (shallow, deep)]
    return variants


#: Chains whose torch time is mostly launches: where a fused kernel's second launch matters.
_SMALL_CHAINS = ("G1", "G2", "G3", "G7", "G9", "G10")


def chains_one_launch() -> list[Variant]:
    """Every chain at M = 128 fused with its inter-cluster reduce in a second kernel and in the
    fused kernel (by the last CTA to finish each output tile, and gathered where the grid's
    CTAs are all resident): the fused planner's first 2 plans reducing in a second kernel,
    each beside its twins (the same tiles, clusters and pipeline)."""
    hw = load_hardware()
    variants = []
    for label in {**CHAINS, **SWIGLUS}:
        func, shape, args = chain_workload(label, 128)
        plans = plan_chain(shape, hw)[:2]
        for rank, plan in enumerate(plans):
            for reduce in ("kernel", "last_cta", "gathered"):
                try:
                    twin = planned(shape, dataclasses.replace(plan.config, reduce=reduce), hw)
                except ClusterError:
                    continue  # a form the rules refuse (residency, whole vectors per thread)
                variants.append(chain_variant(label, shape, func, args, twin, rank, hw))
    return variants


def chains_picks() -> list[Variant]:
    """Every chain at M = 128: the family's pick, the fused planner's first plan, the SMEM-only
    one and the first unfused plan (the chains suite without its lower ranks and samples)."""
    hw = load_hardware()
    return [v for label in {**CHAINS, **SWIGLUS} for v in chain_variants(label, 128, 0, hw)
            if v.plan["pick"] or v.plan["plan_rank"] == 0 or v.plan["smem_only"] or v.plan.get("unfused_rank") == 0]


def chains_pdl() -> list[Variant]:
    """The fused plans of the small chains (the planner's top 3 and the SMEM-only one) launched
    programmatically and not: the inter-cluster reduce kernel's launch overlapping the fused
    kernel."""
    hw = load_hardware()
    variants = [v for label in _SMALL_CHAINS for v in chain_variants(label, 128, 0, hw)
                if not v.plan.get("unfused")]
    return [launched(v, on) for v in variants for on in (False, True)]


#: Row counts of the real-shape dense layers the GPU models' candidates are measured at.
_CANDIDATE_ROWS = (16, 64, 128, 512, 1024)


def dense_candidates(top: int = 2) -> list[Variant]:
    """The real-shape dense layers (tvm_dsm.gpu.suites.real_shapes) at :data:`_CANDIDATE_ROWS`
    where the H100's and this GPU's split-K GEMM models pick differently: the first ``top`` plans
    of this GPU's model and the H100's first, side by side (pools for python -m
    tvm_dsm.bench.calibrate: which model's order the measurements follow)."""
    from .real_shapes import cases

    return _candidates([case.shape for case in cases() if case.cls == "dense" and case.shape[0] in _CANDIDATE_ROWS], top)


def swiglu_candidates(top: int = 2) -> list[Variant]:
    """The same over the GEMMs a real-shape SwiGLU's operators run one by one where the chain is
    not fused (gate and up ``m x ffn x hidden``, down ``m x hidden x ffn``), at every row count
    past one the suite measures."""
    from .real_shapes import cases

    shapes = {shape for case in cases() if case.cls == "swiglu" and case.shape[0] > 1
              for m, n, k in [case.shape] for shape in ((m, n, k), (m, k, n))}
    return _candidates(sorted(shapes), top)


def _candidates(shapes: list[tuple[int, int, int]], top: int) -> list[Variant]:
    """Per (m, n, k) where the two models' first plans differ: this GPU's first ``top`` and the
    H100's first."""
    hw, h100 = load_hardware(), load_hardware("h100_sxm")
    variants = []
    for m, n, k in shapes:
        shape = GemmShape(m, n, k, True)
        try:
            ours, theirs = plan_split_k_gemm(shape, hw, padded=True), plan_split_k_gemm(shape, h100, padded=True)
        except ClusterError:
            continue
        if ours[0].config == theirs[0].config:
            continue
        chosen = {p.config: (rank, p.predicted_us) for rank, p in enumerate(ours[:top])}
        chosen.setdefault(theirs[0].config, (None, predict(shape, theirs[0].config, hw).predicted_us))
        variants += [gemm_variant(f"dense_{n}x{k}", m, n, k, config, rank, predicted)
                     for config, (rank, predicted) in chosen.items()]
    return variants


#: (m, n, k) of fp32 products: a long K over a short M (split-K), a short M and N, a middle one,
#: square ones; the configurations of SIMT_SWEEP_TILES with and without the split-K the model
#: picks.
SIMT_SWEEP_SHAPES = [(128, 1024, 14336), (128, 1024, 3000), (37, 3000, 1024), (13, 127, 3000),
                     (1024, 1024, 1024), (1024, 4096, 4096)]
#: (block_m, block_n, thread_m, thread_n) of the sweep: 64 to 256 threads, 4x4 to 8x8 a thread.
SIMT_SWEEP_TILES = [(32, 128, 8, 8), (64, 128, 8, 8), (128, 128, 8, 8), (64, 64, 4, 4), (32, 64, 4, 4),
                    (64, 128, 4, 8), (16, 128, 2, 8)]


def simt_gemm_configs() -> list[Variant]:
    """fp32 dense layers ([N, K] weights) at SIMT_SWEEP_SHAPES on the CUDA-core GEMM rule
    (:mod:`tvm_dsm.rules.simt_gemm`) in the sweep's configurations (16-deep K steps), each
    with torch eager as the peer: which the family's model should rank first."""
    from ...families.simt_gemm import SimtGemm
    from ...rules.simt_gemm import SimtGemmConfig, check_config as check_simt, find_simt_gemm, schedule_simt_gemm

    hw, family, variants = load_hardware(), SimtGemm(), []
    for m, n, k in SIMT_SWEEP_SHAPES:
        func = dense(m, n, k, "float32")
        shape = find_simt_gemm(func)
        picked = family.rank(shape, hw)[0].config
        args = args_of(func)
        for bm, bn, tm, tn in SIMT_SWEEP_TILES:
            for split in sorted({1, picked.split_k}):
                config = SimtGemmConfig(bm, bn, 16, tm, tn, split)
                if not passes(check_simt, shape, config):
                    continue
                variants.append(Variant(
                    name=f"simt_{m}x{n}x{k}_{bm}x{bn}_t{tm}x{tn}_s{split}", workload="dense",
                    mod=schedule_simt_gemm(func, config).mod, args=args, bytes=nbytes_of(args),
                    flops=2 * m * n * k, plan={**dataclasses.asdict(config), "picked": config == picked,
                                               "predicted_us": family.predict(shape, config, hw).predicted_us},
                    peers=("torch_eager",),
                    extra={"m": m, "n": n, "k": k}))
    return variants


#: fp32 dense layers at 2-8 rows: the row GEMV's and the CUDA-core GEMM's.
FP32_ROW_SHAPES = [(m, n, k) for m in (2, 4, 6, 8) for n, k in ((2048, 2048), (5120, 5120), (14336, 4096), (4096, 14336))]


def fp32_row_gemv() -> list[Variant]:
    """fp32 dense layers ([N, K] weights) at FP32_ROW_SHAPES on the row GEMV (its default
    configuration) and on the CUDA-core GEMM (the model's pick), torch eager beside: up to how
    many rows the row GEMV streams W faster (``row_gemv.MAX_ROWS``)."""
    from ...families.row_gemv import RowGemvFamily
    from ...families.simt_gemm import SimtGemm

    hw, variants = load_hardware(), []
    for m, n, k in FP32_ROW_SHAPES:
        func = dense(m, n, k, "float32")
        args = args_of(func)
        for family in (RowGemvFamily(), SimtGemm()):
            shape = family.recognize(func)
            best = family.rank(shape, hw)[0]
            variants.append(Variant(
                name=f"{family.name}_{m}x{n}x{k}", workload="dense", mod=family.apply(func, best.config, hw).mod,
                args=args, bytes=nbytes_of(args), flops=2 * m * n * k,
                plan={"family": family.name, **dataclasses.asdict(best.config), "predicted_us": best.predicted_us},
                peers=("torch_eager",), extra={"m": m, "n": n, "k": k}))
    return variants


#: A 70B-class SwiGLU's operators at decode rows (28672 x 8192 gate/up, 8192 x 28672 down) and a
#: narrower GEMM at the same rows, where the chain runs operator by operator (real_shapes: 0.70x
#: torch at 4 and 8 rows).
WIDE_DECODE_SHAPES = [(4, 28672, 8192), (4, 8192, 28672), (8, 28672, 8192), (4, 10240, 8192)]


def wide_decode_gemm_configs() -> list[Variant]:
    """The split-K GEMM at WIDE_DECODE_SHAPES in the model's best configuration of each cluster
    size and tile width, one of 3-stage pipelines and one of the other depths, torch eager
    beside it."""
    hw, variants = load_hardware(), []
    for m, n, k in WIDE_DECODE_SHAPES:
        shape = GemmShape(m, n, k, True)
        plans = plan_split_k_gemm(shape, hw, padded=True)
        best = {}
        for rank, p in enumerate(plans):
            c = p.config
            key = (c.cluster_size, c.block_n, c.stages == 3)
            best.setdefault(key, (c, rank, p.predicted_us))
        variants += [gemm_variant(f"dense_{n}x{k}", m, n, k, config, rank, predicted)
                     for config, rank, predicted in best.values()]
    return variants


#: GEMMs over [K, N] weights at decode batches, (rows, N, K, dtype): the 1B-8B Llamas' projections
#: and the generality run's fp32 ones that trailed torch on the CUDA-core or tensor-core GEMMs.
COLUMN_GEMV_SHAPES = [(1, 14336, 2048, "float16"), (4, 14336, 2048, "float16"), (8, 14336, 2048, "bfloat16"),
                      (1, 2048, 2048, "float16"), (8, 2048, 2048, "float16"), (2, 4096, 14336, "bfloat16"),
                      (1, 4096, 512, "float32"), (1, 5120, 1000, "float32"), (8, 14336, 1000, "float32"),
                      (16, 4096, 4096, "float32"), (4, 1021, 4096, "float16"), (4, 2048, 8192, "bfloat16")]
#: The configurations swept at each shape (besides the default): lanes x unroll x pipelined, each
#: at the slices closest to 256 and 512 threads.
COLUMN_GEMV_SWEEP = tuple(itertools.product((2, 4, 8), (4, 8), (False, True)))


#: [K, N] decode GEMMs (rows, N, K, dtype) whose columns leave few CTAs against their K (the
#: generality run's 1 x 512 x 4096 and 1 x 1000 x 14336 fp32 at 0.66x and 0.35x of torch), and
#: wide ones beside them.
COLUMN_GEMV_CLUSTER_SHAPES = [(1, 512, 4096, "float32"), (1, 1000, 14336, "float32"), (7, 1000, 14336, "float32"),
                              (2, 512, 14336, "float16"), (4, 2048, 8192, "bfloat16"), (2, 4096, 14336, "bfloat16"),
                              (1, 2048, 2048, "float16"), (4, 1024, 4096, "float16"), (1, 14336, 2048, "float16"),
                              (8, 14336, 1000, "float32"), (2, 1024, 14336, "float16"), (2, 3000, 2048, "bfloat16")]


def column_gemv_clusters() -> list[Variant]:
    """The column GEMV with K split over clusters of 1-8 CTAs (:data:`COLUMN_GEMV_CLUSTER_SHAPES`),
    2-8 lanes, 4 rows of W a step, pipelined, at the slices closest to 256 and 512 threads,
    beside its default and the family the planner picks without it: where a cluster beats
    narrower CTAs."""
    return _column_gemv_variants(COLUMN_GEMV_CLUSTER_SHAPES, [
        (lambda c, point=point: (c.lanes, c.cluster_size, c.unroll, c.pipelined) == (*point, 4, True))
        for point in itertools.product((2, 4, 8), (1, 2, 4, 8))])


def column_gemv_defaults() -> list[Variant]:
    """Every shape of the column GEMV sweeps (:data:`COLUMN_GEMV_SHAPES`,
    :data:`COLUMN_GEMV_CLUSTER_SHAPES`) in the rule's default alone, beside the family the planner
    picks without it: the default rule checked on shapes it was and was not chosen by."""
    return _column_gemv_variants(list(dict.fromkeys(COLUMN_GEMV_SHAPES + COLUMN_GEMV_CLUSTER_SHAPES)), [])


def column_gemv_configs() -> list[Variant]:
    """GEMMs over [K, N] weights (:data:`COLUMN_GEMV_SHAPES`) on the column GEMV rule
    (:mod:`tvm_dsm.rules.column_gemv`) in :data:`COLUMN_GEMV_SWEEP`'s valid configurations and its
    default, beside the family the planner picks without it (the tensor-core or CUDA-core GEMM):
    the default's rule and the rows up to which the rule wins. The shapes are read past the
    family's row limits (which this sweep set); one that no configuration fits (past K = 4096
    on too few CTAs) gets the other family's kernel alone."""
    return _column_gemv_variants(COLUMN_GEMV_SHAPES, [
        (lambda c, point=point: (c.lanes, c.unroll, c.pipelined, c.cluster_size) == (*point, 1))
        for point in COLUMN_GEMV_SWEEP])


def _column_gemv_variants(shapes: list[tuple], points: list) -> list[Variant]:
    """Each shape's column GEMVs: its default, and for each of ``points`` (a predicate on a
    configuration) the valid one whose threads are closest to 256 and to 512; then the family
    the planner picks without the column GEMV."""
    from ...families import FAMILIES, fastest_family, matching_families
    from ...rules.column_gemv import (candidate_configs, check_config as check_column, default_config,
                                      schedule_column_gemv)
    from ...rules.row_gemv import find_gemv

    hw, variants = load_hardware(), []
    others = [f for f in FAMILIES if f.name != "column_gemv"]
    for m, n, k, dtype in shapes:
        func = scheduling_form(dense(m, n, k, dtype, weight_layout="kn"))
        args = args_of(func)
        found = find_gemv(func, weight_nk=False)
        common = {"workload": "generated", "reference_kwargs": {"op": "dense", "layout": "kn"},
                  "peers": ("torch_eager",), "args": args, "bytes": nbytes_of(args), "flops": 2 * m * n * k,
                  "extra": {"m": m, "n": n, "k": k, "dtype": dtype}}
        label = f"kn_{m}x{n}x{k}_{dtype}"
        candidates = candidate_configs(found)
        default = default_config(found) if candidates else None
        swept = [min((c for c in candidates if point(c)), key=lambda c: abs(math.log2(c.threads / threads)),
                     default=None)
                 for point in points for threads in (256, 512)]
        for config in dict.fromkeys(c for c in [default, *swept] if c is not None):
            if passes(check_column, found, config):
                variants.append(Variant(name=f"{label}_l{config.lanes}_s{config.slices}_u{config.unroll}"
                                             + ("_p" if config.pipelined else "")
                                             + (f"_c{config.cluster_size}" if config.cluster_size > 1 else ""),
                                        mod=schedule_column_gemv(found, config).mod,
                                        plan={**dataclasses.asdict(config), "default": config == default}, **common))
        family, shape, plans = fastest_family(matching_families(func, families=others), hw)
        variants.append(Variant(name=f"{label}_{family.name}", mod=family.apply(func, plans[0].config, hw).mod,
                                plan={"family": family.name}, **common))
    return variants


#: Dense layers (M, N, K, dtype) where the split-K pick trailed torch by 10-30%: the real-shape
#: layers under 0.9x (bench/results/real_shapes/latest.json), a ViT-B/16's and BERT's at their
#: token counts, and generated ones of 257 rows.
TILE_WIDTH_SHAPES = (
    (128, 2048, 2048, "float16"), (128, 3072, 2048, "float16"), (128, 3072, 3072, "float16"),
    (128, 3584, 3584, "float16"), (128, 4608, 3584, "float16"), (128, 5120, 2048, "float16"),
    (128, 6144, 2048, "float16"), (128, 6144, 4096, "float16"), (128, 8192, 8192, "float16"),
    (128, 9216, 3072, "float16"), (256, 2048, 2048, "float16"), (256, 3072, 2048, "float16"),
    (512, 2048, 2048, "float16"), (512, 3072, 2048, "float16"), (512, 10240, 8192, "float16"),
    (1024, 896, 896, "float16"), (1024, 1152, 896, "float16"), (1024, 4608, 3584, "float16"),
    (1024, 5120, 2048, "float16"), (384, 4096, 3072, "float16"), (257, 4096, 3000, "bfloat16"),
    (257, 2048, 1024, "float16"), (6304, 2304, 768, "float16"), (6304, 768, 3072, "float16"),
    (4096, 2304, 768, "float16"), (1576, 3072, 768, "float16"))
#: The tile widths of the space before the widths between them (96-240 in steps of 16).
FORMER_WIDTHS = (64, 80, 128, 192, 256)


def _former_widths_first(plans: list) -> object:
    """The first of ``plans`` (a planner's order) whose tiles have one of :data:`FORMER_WIDTHS`."""
    return next(p for p in plans if p.config.block_n in FORMER_WIDTHS)


def _first_of_each_tile_shape(plans: list) -> dict[tuple[int, int], tuple[int, object]]:
    """(rank, plan) of the first of ``plans`` for each (block_m, block_n), in rank order."""
    first: dict[tuple[int, int], tuple[int, object]] = {}
    for rank, p in enumerate(plans):
        first.setdefault((p.config.block_m, p.config.block_n), (rank, p))
    return first


def tile_widths() -> list[Variant]:
    """Each of :data:`TILE_WIDTH_SHAPES` in the planner's first plan among the former widths
    (:data:`FORMER_WIDTHS`, marked ``former_pick``) and in the best predicted configuration of
    each of the eight best predicted tile shapes of the space (``pick``: the first): whether
    widths of 96-240 columns fill the machine with fewer idle SMs and padded columns, as
    cuBLAS's 96- and 144-wide tiles do."""
    hw = load_hardware()
    variants = []
    for m, n, k, dtype in TILE_WIDTH_SHAPES:
        shape = GemmShape(m, n, k, True, dtype=dtype)
        plans = plan_split_k_gemm(shape, hw, padded=True)
        former = _former_widths_first(plans)
        label = f"dense_{n}x{k}" + ("_bf16" if dtype == "bfloat16" else "")
        chosen = dict(list(_first_of_each_tile_shape(plans).values())[:8])
        chosen.setdefault(plans.index(former), former)
        for rank, p in chosen.items():
            variant = gemm_variant(label, m, n, k, p.config, rank, p.predicted_us, dtype=dtype)
            variants.append(dataclasses.replace(variant, extra={**variant.extra, "former_pick": p is former,
                                                                 "pick": rank == 0}))
    return variants


#: The 768-wide layers' GEMMs (M, N, K) whose picks changed with the tile widths: ViT-B/16 at 8 x
#: 197 tokens, BERT-base at 8 x 128 and 8 x 512.
WIDTH_768_MODEL_GEMMS = ((1576, 2304, 768), (1576, 768, 768), (1576, 3072, 768), (1576, 768, 3072),
                         (1024, 2304, 768), (1024, 768, 768), (4096, 2304, 768))
#: Tile shapes (rows, columns) measured beside the picks on each of them.
WIDTH_768_MODEL_TILES = ((64, 192), (128, 96), (128, 128), (128, 160), (128, 192), (128, 256),
                         (256, 144))


def model_gemm_widths() -> list[Variant]:
    """Each of :data:`WIDTH_768_MODEL_GEMMS` as a model's function gets it (bias and SiLU,
    launched early with its weight and bias read-only: ``launch_early_gemms``' ``early_weights``)
    in the planner's pick (role ``pick``), its first plan over the former widths
    (:data:`FORMER_WIDTHS`, ``former_widths_first``) and the best predicted configuration of
    each of :data:`WIDTH_768_MODEL_TILES`: which tiles a ViT's and a BERT's 1024-4096-row GEMMs
    of K = 768 want inside a model."""
    hw = load_hardware()
    variants = []
    for m, n, k in WIDTH_768_MODEL_GEMMS:
        form = _as_model_function(dense(m, n, k, bias=True, activation="silu"))
        args = args_of(form)
        plans = plan_split_k_gemm(GemmShape(m, n, k, True), hw, padded=True)
        chosen = {plans[0].config: "pick"}
        chosen.setdefault(_former_widths_first(plans).config, "former_widths_first")
        first = _first_of_each_tile_shape(plans)
        for tile in WIDTH_768_MODEL_TILES:
            if tile in first:
                chosen.setdefault(first[tile][1].config, "tile")
        for config, role in chosen.items():
            variants.append(Variant(name=f"dense_bias_silu_{m}x{n}x{k}_{gemm_tag(config)}", workload="dense_bias_silu",
                                    mod=schedule_split_k_gemm(form, config, hw).mod, args=args,
                                    bytes=nbytes_of(args), flops=2 * m * n * k, plan=dataclasses.asdict(config),
                                    extra={"m": m, "n": n, "k": k, "role": role}))
    return variants
