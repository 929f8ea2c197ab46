"""Fused cascaded reductions: softmax statistics, norms, softmax·V, MoE routing, TOPI's softmax."""

from __future__ import annotations

import dataclasses
import itertools
import tvm
from tvm import te, topi
from ...driver import plan, stock_schedule
from ...errors import ClusterError, passes
from ...hardware import load_hardware
from ...planners.cascade_split import plan_cascade_split, schedule_cascade
from ...rules.fused_rows import schedule_fused_rows
from ...kernels import softmax_gemm as softmax_gemm_rule
from ...kernels import top_k_rows as top_k_rows_rule
from ...transform.cascaded_reductions import fuse_cascaded_reductions
from ...workloads import cascades as cascade_workloads
from .base import Variant, args_of, nbytes_of


#: Cascade workloads of the ``cascades`` suite: shapes, and outputs after the inputs.
_CASCADE_SHAPES = {
    "softmax_stats": [(4096, 4096), (16384, 1024), (2048, 16384)],
    "logsumexp": [(4096, 4096), (8192, 32768 // 4)],
    "layernorm_stats": [(4096, 4096), (16384, 1024)],
    "rmsnorm_gemv": [(4096, 4096), (16384, 1024)],
    "softmax_pv": [(2048, 512, 64), (512, 4096, 64)],
    "softmax_v": [(2048, 512, 64), (512, 4096, 64)],
    "moe_routing": [(4096, 4096, 8), (16384, 256, 8), (16384, 128, 8)],
}


_CASCADE_OUTPUTS = {"softmax_stats": 2, "logsumexp": 1, "layernorm_stats": 2, "rmsnorm_gemv": 2,
                    "softmax_pv": 3, "softmax_v": 1, "moe_routing": 2}


def cascades() -> list[Variant]:
    """Fused cascaded reductions (FuseCascadedReductions, split into parts per row and merged)
    on shapes of softmax statistics, MoE routing (softmax + top-k), cross-entropy,
    LayerNorm/RMSNorm and attention; 128, 64 and 32 parts per row (one CTA per row), each
    reading single elements or 16-byte chunks, and the split tvm_dsm's planner picks
    (``_plan`` in the name; the same kernel as a grid point where it is one)."""
    return [v for name, sizes in _CASCADE_SHAPES.items() for size in sizes
            for v in cascade_variants(name, size, (128, 64, 32), (1,))]


def cascade_variants(name: str, size: tuple, parts: tuple, rows: tuple) -> list[Variant]:
    """The ``name`` workload of ``size`` fused with each of ``parts`` per row, single elements
    or 16-byte chunks, and ``rows`` per CTA (one CTA per row group, no cluster) where the row
    has a chunk for every part, then with the planner's split if it is not among them."""
    func = getattr(cascade_workloads, name)(*size)
    wide = 128 // tvm.DataType(str(func.params[0].ty.dtype)).bits  # 16-byte chunks
    splits = [(p, vector, 1, r) for p, vector, r in itertools.product(parts, (1, wide), rows)
              if size[1] % (p * vector) == 0]  # else the row has fewer chunks than parts
    split = plan_cascade_split(func)
    planned = (split.parts, split.vector, split.ranks, split.rows_per_cta)
    splits += [] if planned in splits else [planned]
    chosen = plan(func).best.config  # the driver's pick: the fused rows or the cascade's own kernel
    own = (_softmax_gemm_variant(func, size, chosen, True, name)
           if isinstance(chosen, softmax_gemm_rule.SoftmaxGemmConfig)
           else _top_k_rows_variant(func, size, chosen, True)
           if isinstance(chosen, top_k_rows_rule.TopKRowsConfig) else None)  # the cascade's own kernel
    return ([_cascade_variant(name, size, func, split, split == planned, own is None) for split in splits]
            + ([own] if own else []))


def _cascade_variant(name: str, size: tuple, func, split: tuple, planned: bool, pick: bool = True) -> Variant:
    """``func`` (the ``name`` workload of ``size``) fused with ``split`` = (parts, vector, ranks,
    rows per CTA) and scheduled; ``planned``: the cascade planner's split (``_plan``), the
    suite's pick unless ``pick`` is False (a cascade with a kernel of its own picks that)."""
    parts, vector, ranks, rows = split
    fused, reports = fuse_cascaded_reductions(func, parts=parts, vector=vector, ranks=ranks, shuffle=True,
                                              rows_per_cta=rows)
    if not all(r.fusible for r in reports):
        raise ValueError(f"{name}: {[str(r) for r in reports]}")
    args = args_of(func, _CASCADE_OUTPUTS[name])
    return Variant(
        name=f"{name}_{'x'.join(map(str, size))}_p{parts}_v{vector}" + (f"_c{ranks}" if ranks > 1 else "")
        + (f"_r{rows}" if rows > 1 else "") + ("_plan" if planned else ""),
        workload=f"cascade_{name}",
        mod=schedule_fused_rows(fused).mod,
        args=args,
        bytes=nbytes_of(args),
        flops=0,
        plan={"parts": parts, "vector": vector, "ranks": ranks, "rows_per_cta": rows, "planner": planned and pick,
              "levels": [r.levels for r in reports]},
        reference_kwargs={"k": size[2]} if name == "moe_routing" else {},
    )


#: softmax·V shapes (rows, keys, columns): the cascades suite's two, a decode-like one with few
#: rows and long keys, and a 128-column one.
SOFTMAX_GEMM_SHAPES = [(2048, 512, 64), (512, 4096, 64), (64, 8192, 64), (4096, 1024, 128),
                       (2048, 512, 64, "float16")]


def softmax_gemm() -> list[Variant]:
    """softmax·V as one tiled kernel (tvm_dsm.kernels.softmax_gemm) in every configuration of a
    small grid that fits each shape (64-256 threads, 64-1024 CTAs); ``planner`` marks
    default_config's. Beside them, the generic fused rows (FuseCascadedReductions with the
    cascade planner's split) that ran softmax·V before."""
    variants = []
    for size in SOFTMAX_GEMM_SHAPES:
        variants += cascade_variants("softmax_pv", size, (), (1,))
        func = cascade_workloads.softmax_pv(*size)
        shape = softmax_gemm_rule.find_softmax_gemm(func).shape
        pick = softmax_gemm_rule.default_config(shape, load_hardware())
        for bm, bk, bj, tm, ranks, tn in itertools.product((16, 32), (32, 64), (32, 64), (2, 4),
                                                            (1, 2, 4, 8, 16), (4, 8)):
            config = softmax_gemm_rule.SoftmaxGemmConfig(bm, bk, bj, tm, ranks, tn)
            if not passes(softmax_gemm_rule.check_config, shape, config):
                continue
            ctas = size[0] // bm * (size[2] // bj) * ranks
            if 64 <= config.threads <= 256 and 64 <= ctas <= 1024 and config != pick:
                variants.append(_softmax_gemm_variant(func, size, config, False))
    return variants


def _softmax_gemm_variant(func, size: tuple, config, planner: bool, name: str = "softmax_pv") -> Variant:
    """The ``name`` workload (softmax_pv or softmax_v) of ``size`` as the tiled kernel in
    ``config`` (``planner``: default_config's)."""
    c = config
    args = args_of(func, _CASCADE_OUTPUTS[name])
    return Variant(
        name=f"{name}_{'x'.join(map(str, size))}_m{c.block_m}k{c.block_k}j{c.block_j}"
        f"t{c.rows_per_thread}x{c.columns_per_thread}" + (f"_c{c.ranks}" if c.ranks > 1 else "")
        + ("_plan" if planner else ""),
        workload=f"cascade_{name}",
        mod=softmax_gemm_rule.fuse_softmax_gemm(func, config),
        args=args,
        bytes=nbytes_of(args),
        flops=2 * size[0] * size[1] * size[2],
        plan={**dataclasses.asdict(config), "planner": planner},
    )


#: Row softmax shapes (rows, columns) of the ``softmax`` suite: a model's attention-sized rows,
#: short rows, and a vocabulary-wide one.
SOFTMAX_SHAPES = [(4096, 4096), (16384, 1024), (1024, 32000)]


def softmax() -> list[Variant]:
    """TOPI's softmax (what Relax legalizes ``R.nn.softmax`` to: max, exp, exp-sum, normalize)
    as ``tvm_dsm.build`` schedules it (the planner's family: the row norm family's one-read
    rows), beside the generic fused rows (``schedule_cascade``) and TVM's stock dlight schedule."""
    variants = []
    for rows, cols in SOFTMAX_SHAPES:
        x = te.placeholder((rows, cols), "float32", name="x")
        func = te.create_prim_func([x, topi.nn.softmax(x)])
        args = args_of(func)
        ranking = plan(func)
        for label, mod in ((ranking.family.name, ranking.schedule().mod), ("fused_rows", schedule_cascade(func)[0].mod),
                           ("dlight", stock_schedule(func).mod)):
            variants.append(Variant(name=f"softmax_{rows}x{cols}_{label}", workload="softmax", mod=mod, args=args,
                                    bytes=nbytes_of(args), flops=0, plan={"planner": label == ranking.family.name},
                                    extra={"schedule": label}))
    return variants


#: MoE routers (tokens, experts, k[, logits' dtype]): the cascades suite's three, DeepSeek-V2-Lite's
#: 64 experts at the top 6 and Mixtral's 8 at the top 2; fp32 logits (64-bit keys) too.
TOP_K_ROWS_SHAPES = [(4096, 4096, 8), (16384, 256, 8), (16384, 128, 8), (16384, 64, 6), (16384, 8, 2),
                     (4096, 4096, 8, "float32"), (16384, 64, 6, "float32")]


def top_k_rows() -> list[Variant]:
    """MoE routing as the top-k rows kernel (tvm_dsm.kernels.top_k_rows: rows staged in shared
    memory, only elements above a threshold inserted) with 1-32 lanes a row and 32-256 threads a CTA
    (``planner``: default_config's), beside the generic fused rows of the cascade planner's
    split that ran it before."""
    variants = []
    for size in TOP_K_ROWS_SHAPES:
        func = cascade_workloads.moe_routing(*size)
        try:  # the fused rows refuse rows narrower than their smallest split (Mixtral's 8)
            split = plan_cascade_split(func)
            variants.append(_cascade_variant("moe_routing", size, func,
                                             (split.parts, split.vector, split.ranks, split.rows_per_cta), True, False))
        except ClusterError:
            pass
        found = top_k_rows_rule.find_top_k_rows(func)
        pick = top_k_rows_rule.default_config(found)
        for lanes, rows in itertools.product((1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 32, 64, 128, 256)):
            config = top_k_rows_rule.TopKRowsConfig(lanes, rows)
            if not passes(top_k_rows_rule.check_config, found, config):
                continue
            if 32 <= config.threads <= 256 or config == pick:
                variants.append(_top_k_rows_variant(func, size, config, config == pick))
    return variants


def _top_k_rows_variant(func, size: tuple, config, planner: bool) -> Variant:
    """moe_routing of ``size`` as the top-k rows kernel in ``config``."""
    args = args_of(func, _CASCADE_OUTPUTS["moe_routing"])
    return Variant(
        name=f"moe_routing_{'x'.join(map(str, size))}_rows_l{config.lanes}_r{config.rows_per_cta}"
        + ("_plan" if planner else ""),
        workload="cascade_moe_routing",
        mod=top_k_rows_rule.fuse_top_k_rows(func, config),
        args=args,
        bytes=nbytes_of(args),
        flops=0,
        plan={**dataclasses.asdict(config), "planner": planner},
        reference_kwargs={"k": size[2]},
    )
