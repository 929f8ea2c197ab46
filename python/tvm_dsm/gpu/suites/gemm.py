"""Cluster split-K GEMMs: dense, gated, fp8, the LM head's row max."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable
from ...driver import stock_schedule
from ...hardware import load_hardware
from ...planners.split_k_gemm import plan_split_k_gemm, predict
from ...rules.split_k_gemm import GemmShape, SplitKGemmConfig, check_config, schedule_split_k_gemm
from ...workloads.dense import batched_matmul, dense, gated_dense, quantized_dense, scaled_dense
from ...rules.quantized_gemm import schedule_quantize_then_gemm, schedule_quantized_gemm
from ...errors import ClusterError, passes
from ...planners.gemm_row_max import plan_gemm_row_max, row_max_shape
from ...rules.gemm_row_max import schedule_gemm_row_max
from ...workloads.lm_head import lm_head_max
from .base import CHAINS, SWIGLUS, Variant, args_of, fitting, nbytes_of, ours_and_dlight


#: Weight shapes (N, K) of the GEMM chains' and SwiGLU FFNs' layers (FlashFuser's G/S workloads).
GEMM_SHAPES = {
    "G5a": (16384, 4096), "G5b": (4096, 16384), "G8a": (8192, 2048), "G8b": (2048, 8192),
    "G4a": (3072, 768), "G4b": (768, 3072), "S3a": (22016, 4096), "S3b": (4096, 11008),
}


_SWEEP = [(128, 128, 64, 2, 4, 3), (128, 64, 64, 2, 2, 4), (64, 128, 64, 2, 4, 4), (64, 256, 64, 2, 4, 3)]


def gemm_tag(c: SplitKGemmConfig) -> str:
    """A split-K GEMM configuration in a kernel name."""
    return (f"c{c.cluster_size}_{c.block_m}x{c.block_n}x{c.block_k}_s{c.stages}"
            + ("_tma" if c.tma else "") + ("_wg" if c.wgmma else ""))


def gemm_variant(label: str, m: int, n: int, k: int, config, plan_rank: int | None,
                  predicted_us: float, epilogue: bool = False, dtype: str = "float16",
                  weight_layout: str = "nk") -> Variant:
    """The split-K GEMM of ``m x n x k`` in ``config``; weights ``[K, N]`` (``weight_layout="kn"``,
    no epilogue) are checked and timed with the generated functions' references of ``x @ W``
    (the dense references take ``[N, K]``)."""
    func = dense(m, n, k, dtype=dtype, weight_layout=weight_layout, bias=epilogue,
                 activation="silu" if epilogue else "identity")
    args = args_of(func)
    c = config
    references = {"workload": "dense_bias_silu" if epilogue else "dense"}
    if weight_layout == "kn":
        if epilogue:
            raise ValueError("GEMMs over [K, N] weights are measured without an epilogue")
        references = {"workload": "generated", "reference_kwargs": {"op": "dense", "layout": "kn"},
                      "peers": ("torch_eager",)}
    return Variant(
        name=f"{label}_m{m}_{gemm_tag(c)}" + ("_bias_silu" if epilogue else ""),
        **references,
        mod=schedule_split_k_gemm(func, config, load_hardware()).mod,
        args=args,
        bytes=nbytes_of(args),
        flops=2 * m * n * k,
        plan={**vars(config), "plan_rank": plan_rank, "predicted_us": predicted_us},
        extra={"shape": label, "m": m, "n": n, "k": k},
    )


def gemm_configs(shape: GemmShape, top: int, hw) -> list:
    """The planner's top picks (its best first), then a fixed sweep over cluster sizes (model
    check, ablation)."""
    plans = plan_split_k_gemm(shape, hw)
    chosen = {p.config: (rank, p.predicted_us) for rank, p in enumerate(plans[:top])}
    by_config = {p.config: (rank, p.predicted_us) for rank, p in enumerate(plans)}
    for s in (1, 2, 4, 8, 16):
        for bm, bn, bk, wm, wn, stages in _SWEEP:
            config = SplitKGemmConfig(s, min(bm, shape.m), bn, bk, wm if shape.m >= 64 else 1, wn, stages)
            if config in by_config:
                chosen.setdefault(config, by_config[config])
    return list(chosen.items())


def layer_shapes() -> dict[str, tuple[int, int]]:
    """Every distinct weight shape (N, K) of the G1-G10 and S1-S8 layers: ``<chain>a`` the first
    layer (a SwiGLU's gate and up products as one layer of 2N columns), ``<chain>b`` the
    second; the names of :data:`GEMM_SHAPES` agree."""
    shapes: dict[str, tuple[int, int]] = {}
    for label, (n, k, l) in {**CHAINS, **SWIGLUS}.items():
        first = (2 * n if label.startswith("S") else n, k)
        for name, shape in ((f"{label}a", first), (f"{label}b", (l, n))):
            if shape not in shapes.values():
                shapes[name] = shape
    return shapes


def gemm_m() -> list[Variant]:
    """The planner's pick on every G/S layer shape at each batch the GEMM issue checks: 1, 16,
    64, 128, 256, 1024, 4096. Where no split-K configuration fits (M = 1: no tensor-core tile),
    what ``tvm_dsm.build`` falls back to (TVM's stock dlight schedule), against torch all the
    same."""
    hw = load_hardware()
    variants = []
    for m in (1, 16, 64, 128, 256, 1024, 4096):
        for label, (n, k) in layer_shapes().items():
            try:
                plan = plan_split_k_gemm(GemmShape(m, n, k, True), hw)[0]
            except ClusterError:
                variants.append(dataclasses.replace(dlight_variant(label, m, n, k),
                                                    peers=("torch_eager", "torch_compile")))
                continue
            variants.append(gemm_variant(label, m, n, k, plan.config, 0, plan.predicted_us))
    return variants


def gated() -> list[Variant]:
    """Gated layers (SwiGLU's first half, both products in one split-K kernel) on the S1-S8
    weight shapes at M = 128: the planner's top 6 and a sweep over clusters, tiles and depths
    (the model check of GemmShape.products)."""
    variants = []
    hw = load_hardware()
    for label, (n, k, _) in SWIGLUS.items():
        shape = GemmShape(128, n, k, True, products=2)
        plans = plan_split_k_gemm(shape, hw)
        ranked = {p.config: (rank, p.predicted_us) for rank, p in enumerate(plans)}
        chosen = {p.config: ranked[p.config] for p in plans[:6]}
        for s, (bm, bn, wm, wn), stages in itertools.product(
                (1, 2, 4), ((128, 128, 2, 4), (64, 128, 2, 4), (128, 64, 2, 2), (64, 256, 2, 4)), (3, 4)):
            config = SplitKGemmConfig(s, bm, bn, 64, wm, wn, stages, True)
            if config in ranked:
                chosen.setdefault(config, ranked[config])
        variants += [gated_variant(f"{label}g", 128, n, k, config, rank, predicted)
                     for config, (rank, predicted) in chosen.items()]
    return variants


def gated_variant(label: str, m: int, n: int, k: int, config, plan_rank: int | None,
                  predicted_us: float) -> Variant:
    """A gated layer (both products in one split-K kernel) of ``config``."""
    func = gated_dense(m, n, k)
    args = args_of(func)
    # Weights like torch.nn.Linear's: with unit ones, silu(g) * u of K = 4096 sums (std 64)
    # overflowed fp16 in about one element per million, also in the float64 reference's
    # place (S3g: 1 element inf, 2 of 229 kernels "wrong" in a run, a different 1 of 5 the
    # next).
    for a in args[1:3]:
        a["scale"] = k ** -0.5
    return Variant(
        name=f"{label}_m{m}_{gemm_tag(config)}", workload="gated_dense",
        mod=schedule_split_k_gemm(func, config, load_hardware()).mod, args=args, bytes=nbytes_of(args),
        flops=2 * 2 * m * n * k,
        plan={**vars(config), "plan_rank": plan_rank, "predicted_us": predicted_us},
        extra={"shape": label, "m": m, "n": n, "k": k},
    )


def gemm_large_m() -> list[Variant]:
    """The model check above M = 128, where two-warpgroup tiles of 256 rows read each W tile
    once for both halves: on the G/S layers at M = 256 and 1024 and on 4096^3, the planner's
    pick and a sweep over clusters and wgmma tiles (4 stages, else 3)."""
    hw = load_hardware()
    variants = []
    cases = [(label, m, n, k) for m in (256, 1024) for label, (n, k) in GEMM_SHAPES.items()]
    cases.append(("sq4096", 4096, 4096, 4096))
    for label, m, n, k in cases:
        shape = GemmShape(m, n, k, True)
        pick = plan_split_k_gemm(shape, hw)[0]
        chosen = {pick.config: 0}
        for s, (bm, bn) in itertools.product((1, 2, 4), ((128, 128), (128, 256), (256, 64), (256, 128))):
            for stages in (4, 3):
                config = SplitKGemmConfig(s, bm, bn, 64, bm // 16, 1, stages, tma=True, wgmma=True)
                if not passes(check_config, shape, config, hw):
                    continue
                chosen.setdefault(config, None)
                break
        variants += [gemm_variant(label, m, n, k, config, rank, predict(shape, config, hw).predicted_us)
                     for config, rank in chosen.items()]
    return variants


def dlight_variant(label: str, m: int, n: int, k: int) -> Variant:
    """TVM's stock dlight schedule for the same layer (tvm_dsm.driver.stock_schedule)."""
    func = dense(m, n, k)
    args = args_of(func)
    mod = stock_schedule(func).mod
    return Variant(
        name=f"{label}_m{m}_dlight", workload="dense", mod=mod, args=args, bytes=nbytes_of(args),
        flops=2 * m * n * k, plan={"schedule": "tvm.s_tir.dlight (stock)"},
        peers=(), extra={"shape": label, "m": m, "n": n, "k": k, "stock": "dlight"},
    )


def gemm() -> list[Variant]:
    """Cluster split-K GEMMs (fp16, fp32 accumulate) on the G/S layers at M = 128 (planner's top
    picks, a cluster-size sweep, the pick with a fused bias + SiLU epilogue, the pick in bf16),
    an M sweep on 4096 x 4096, and stock dlight for each."""
    variants = []
    hw = load_hardware()
    cases = [(label, 128, n, k) for label, (n, k) in GEMM_SHAPES.items()]
    cases += [("sq4096", m, 4096, 4096) for m in (32, 64, 256, 1024, 4096)]
    for label, m, n, k in cases:
        configs = gemm_configs(GemmShape(m, n, k, True), 4 if m == 128 else 2, hw)
        for config, (rank, predicted) in configs:
            variants.append(gemm_variant(label, m, n, k, config, rank, predicted))
        variants.append(dlight_variant(label, m, n, k))
        pick, (rank, predicted) = configs[0]
        if m in (128, 4096):  # the planner's pick in bf16 (its own row group: "<label>_bf16")
            variants.append(gemm_variant(f"{label}_bf16", m, n, k, pick, rank, predicted,
                                          dtype="bfloat16"))
        if m == 128:  # the planner's pick again with a fused bias + SiLU epilogue
            variants.append(gemm_variant(label, m, n, k, pick, rank, predicted, epilogue=True))
    return variants


#: (batch, sequence, hidden, vocabulary): SPLADE/Sparton documents and queries over BERT's
#: vocabulary padded to a multiple of 64 (30522 -> 30528), and a 32000-word vocabulary.
LM_HEAD_SHAPES = [(1, 128, 768, 30528), (4, 128, 768, 30528), (32, 32, 768, 30528), (4, 64, 1024, 32000)]


def lm_head() -> list[Variant]:
    """Sparton's LM-head max (tvm_dsm.rules.gemm_row_max): the planner's top 4 per shape."""
    variants = []
    for batch, seq, hidden, vocab in LM_HEAD_SHAPES:
        func = lm_head_max(batch, seq, hidden, vocab)
        args = args_of(func)
        args[1]["scale"] = hidden ** -0.5  # W like nn.Linear: logits of unit scale
        for rank, plan in enumerate(plan_gemm_row_max(row_max_shape(func))[:4]):
            c = plan.config
            variants.append(Variant(
                name=f"lm_head_{batch}x{seq}x{hidden}x{vocab}_{c.block_m}x{c.block_n}x{c.block_k}_s{c.stages}"
                f"{'_tma' if c.tma else ''}{'_wgmma' if c.wgmma else ''}",
                workload="lm_head_max",
                mod=schedule_gemm_row_max(func, c, load_hardware()).mod,
                args=args,
                bytes=nbytes_of(args),
                flops=2 * batch * seq * hidden * vocab,
                plan={**vars(c), "planner": rank == 0, "predicted_us": plan.predicted_us},
                reference_kwargs={"seq": seq},
            ))
    return variants


#: FP8 shapes (M, N, K): the issues' 4096 x 4096 layer at M = 128 and 4096, and two LLM layers.
FP8_SHAPES = [(128, 4096, 4096), (4096, 4096, 4096), (128, 14336, 4096), (128, 4096, 14336)]


def fp8() -> list[Variant]:
    """fp8 e4m3 GEMMs with per-token and per-channel scales (tvm_dsm.rules.split_k_gemm) and
    per-token FP8 quantization + GEMM (tvm_dsm.rules.quantized_gemm): two kernels (the pick:
    the fp8 planner's top configurations that fit beside the epilogue's tile) and the fused
    exact kernel (its planner's top 3)."""
    hw = load_hardware()
    variants = []
    for (m, n, k), quantized in itertools.product(FP8_SHAPES, (False, True)):
        if not quantized and (m, n, k) not in FP8_SHAPES[:2]:
            continue
        func = fp8_workload(m, n, k, quantized)
        fp8_shape = GemmShape(m, n, k, True, "float8_e4m3fn")
        if quantized:
            candidates = [("two_kernels_", schedule_quantize_then_gemm, plan) for plan in fitting(
                func, schedule_quantize_then_gemm, plan_split_k_gemm(fp8_shape, hw), 2)]
            candidates += [("", schedule_quantized_gemm, plan) for plan in plan_split_k_gemm(fp8_shape, hw, True)[:3]]
        else:
            candidates = [("", schedule_split_k_gemm, plan) for plan in plan_split_k_gemm(fp8_shape, hw)[:3]]
        variants += [fp8_variant(func, (m, n, k), quantized, form, schedule, plan, rank)
                     for rank, (form, schedule, plan) in enumerate(candidates)]
    return variants


def fp8_workload(m: int, n: int, k: int, quantized: bool):
    return quantized_dense(m, n, k) if quantized else scaled_dense(m, n, k)


def fp8_two_kernels(quantized: bool) -> tuple[str, Callable]:
    """(name form, schedule) of the fp8 GEMM alone, or behind its quantization kernel."""
    return ("two_kernels_", schedule_quantize_then_gemm) if quantized else ("", schedule_split_k_gemm)


def fp8_variant(func, mnk: tuple, quantized: bool, form: str, schedule, plan, rank: int) -> Variant:
    m, n, k = mnk
    args = args_of(func)
    for a in args:  # scales: positive, around 1
        a["positive"] = a["dtype"] == "float32"
    c = plan.config
    return Variant(
        name=f"{'quant_' if quantized else ''}fp8_{m}x{n}x{k}_{form}c{c.cluster_size}_"
        f"{c.block_m}x{c.block_n}x{c.block_k}_s{c.stages}{'_tma' if c.tma else ''}",
        workload="quantized_dense" if quantized else "scaled_dense",
        mod=schedule(func, c, load_hardware()).mod,
        args=args,
        bytes=nbytes_of(args),
        flops=2 * m * n * k,
        plan={**vars(c), "plan_rank": rank, "planner": rank == 0, "predicted_us": plan.predicted_us,
              "form": form.rstrip("_") or "one_kernel"},
        extra={"m": m, "n": n, "k": k, "quantized": quantized},
    )


#: Batched products users write: (batch axes, M, N, K, W layout, X shared by the batch). torch.bmm
#: shapes, attention scores written by hand ([B, H, S, D] @ [B, H, D, T]), a ViT's per-head
#: products at 197 tokens, and expert einsums (``nd,edf->enf``: 8 experts of Mixtral-like widths).
BATCHED_SHAPES = [
    ((8,), 512, 512, 512, "nk", False), ((64,), 128, 128, 64, "nk", False), ((16,), 1024, 1024, 128, "nk", False),
    ((4,), 2048, 2048, 2048, "nk", False), ((12,), 197, 197, 64, "nk", False), ((8, 16), 512, 512, 64, "nk", False),
    ((1, 32), 2048, 2048, 128, "nk", False), ((8,), 512, 1408, 2048, "kn", True), ((8,), 64, 14336, 4096, "kn", True),
    ((8,), 300, 768, 768, "kn", False),
]


def batched_gemm() -> list[Variant]:
    """Batches of products (tvm_dsm.rules.split_k_gemm over batch axes) through
    ``tvm_dsm.build``'s pick beside dlight's schedule, torch's matmul and torch.compile."""
    variants = []
    for batch, m, n, k, layout, shared_x in BATCHED_SHAPES:
        func = batched_matmul(batch, m, n, k, weight_layout=layout, shared_x=shared_x)
        name = f"batched_{'x'.join(map(str, batch))}x{m}x{n}x{k}_{layout}{'_shared_x' if shared_x else ''}"
        for variant in ours_and_dlight(name, "batched_matmul", func, ("torch_eager", "torch_compile"),
                                       {"class": "batched_gemm"}):
            variant.args[1]["scale"] = k ** -0.5
            variants.append(dataclasses.replace(variant, flops=2 * math.prod(batch) * m * n * k,
                                                reference_kwargs={"layout": layout}))
    return variants
