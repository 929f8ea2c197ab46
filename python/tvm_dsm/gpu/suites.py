"""Kernel suites the GPU workflow builds here and runs on the device machine."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import tvm
from tvm import s_tir, te, topi

from ..driver import H100, plan as plan_function, stock_schedule

from ..hardware import load_hardware
from ..planners.split_k_gemm import PIPELINE_DEPTHS, SHALLOW_PIPELINES, plan_split_k_gemm, predict
from ..rules import SplitKReductionConfig, schedule_split_k_reduction
from ..rules.split_k_gemm import GemmShape, SplitKGemmConfig, check_config, schedule_split_k_gemm
from ..workloads.dense import dense, gated_dense, quantized_dense, scaled_dense
from ..rules.quantized_gemm import schedule_quantize_then_gemm, schedule_quantized_gemm
from ..errors import ClusterError
from ..planners.cascade_split import cascade_config, plan_cascade_split, schedule_cascade
from ..planners.fused_chain import plan_chain, schedule_chain
from ..rules.unfused_chain import UnfusedChainConfig, schedule_unfused_chain
from ..planners.gemm_row_max import plan_gemm_row_max, row_max_shape
from ..rules.gemm_row_max import schedule_gemm_row_max
from ..workloads.lm_head import lm_head_max
from ..rules.fused_chain import find_chain
from ..workloads.chains import CONV_CHAINS, conv_chain, gemm_chain, swiglu_ffn
from ..rules.collective_kernel import BULK_KINDS, schedule_collective_kernel, schedule_split_sum
from ..workloads import gemv, row_sum
from ..rules.attention import CONFIGS as ATTENTION_CONFIGS
from ..rules.attention import default_config, find_attention, fuse_attention
from ..rules.fused_rows import schedule_fused_rows
from ..rules import softmax_gemm as softmax_gemm_rule
from ..rules import top_k_rows as top_k_rows_rule
from ..transform.cascaded_reductions import fuse_cascaded_reductions
from ..transform.programmatic_launch import launch_programmatically
from ..workloads import cascades as cascade_workloads
from ..workloads.collectives import KINDS, collective, split_sum


@dataclass
class Variant:
    """One kernel to build, check and time."""

    name: str
    workload: str  # key of tvm_dsm.gpu.references.REFERENCES
    mod: tvm.IRModule
    args: list[dict]  # {"name", "shape", "dtype", "output": bool} in call order
    bytes: int  # fewest HBM bytes one call must move (each input read once, output written)
    flops: int
    plan: dict = field(default_factory=dict)
    pipeline: str = "default"
    expect_correct: bool = True  # False for kernels built to show a stock-TVM trap
    peers: tuple[str, ...] = ("torch_eager", "torch_compile")
    extra: dict = field(default_factory=dict)  # copied into the result row
    reference_kwargs: dict = field(default_factory=dict)


def _args(func, n_out: int = 1) -> list[dict]:
    params = list(func.params)
    return [
        {
            "name": p.name,
            "shape": [int(d) for d in p.ty.shape],
            "dtype": str(p.ty.dtype),
            "output": i >= len(params) - n_out,
        }
        for i, p in enumerate(params)
    ]


def _nbytes(args: list[dict]) -> int:
    total = 0
    for a in args:
        n = 1
        for d in a["shape"]:
            n *= d
        total += n * tvm.DataType(a["dtype"]).bits // 8
    return total


SPLIT_K_SHAPES = [(1024, 4096), (4096, 4096), (256, 16384), (8192, 8192)]
CLUSTER_SIZES = [1, 2, 4, 8, 16]


def split_k() -> list[Variant]:
    """Row sum and GEMV with K split over clusters of 1-16 CTAs, plus the stock-bind trap."""
    variants = []
    for workload, make in (("row_sum", row_sum), ("gemv", gemv)):
        for m, k in SPLIT_K_SHAPES:
            func = make(m, k)
            args = _args(func)
            for s in CLUSTER_SIZES:
                config = SplitKReductionConfig(cluster_size=s, rows_per_cluster=max(16, s))
                sch = schedule_split_k_reduction(func, config)
                variants.append(
                    Variant(
                        name=f"{workload}_{m}x{k}_c{s}",
                        workload=workload,
                        mod=sch.mod,
                        args=args,
                        bytes=_nbytes(args),
                        flops=2 * m * k,
                        plan=vars(config),
                    )
                )
    variants.append(stock_cluster_bind_trap())
    return variants


def stock_cluster_bind_trap(m: int = 4096, k: int = 1024, cluster: int = 4) -> Variant:
    """A row sum bound the obvious way with stock TVM: ``bind(loop, "clusterCtaIdx.x")``.

    Built with TVM's stock pipeline it launches ``m / cluster`` CTAs instead of ``m``, so most
    rows stay unwritten; tvm-dsm's pipeline rejects it instead.
    """
    func = row_sum(m, k)
    sch = s_tir.Schedule(func)
    row, _ = sch.get_loops(sch.get_sblock("B"))
    grid, rank, tx = sch.split(row, [None, cluster, 128])  # one row per thread
    sch.bind(grid, "blockIdx.x")
    sch.bind(rank, "clusterCtaIdx.x")
    sch.bind(tx, "threadIdx.x")
    args = _args(func)
    return Variant(
        name=f"stock_bind_trap_{m}x{k}_c{cluster}",
        workload="row_sum",
        mod=sch.mod,
        args=args,
        bytes=_nbytes(args),
        flops=2 * m * k,
        plan={"cluster_size": cluster, "binding": "sch.bind(loop, 'clusterCtaIdx.x')"},
        pipeline="s_tir_stock",
        expect_correct=False,
    )


TILE = 16384  # elements per CTA of the collectives suite


def _collective_variant(kind, bulk, resident, clusters, size, n, dtype, elem) -> Variant:
    func = collective(kind, clusters, size, n, dtype, resident=resident)
    args = _args(func)
    # Tiles of n elements each CTA reads from peers; the all-gather of rs_ag reads fp32 partial
    # sums, counted in bytes of the input element.
    remote_tiles = {
        "copy": 0, "all_exchange": size - 1, "shuffle": size - 1,
        "broadcast": 2 * (1 - 1 / size), "reduce_scatter": 1 - 1 / size,
        "all_exchange_rs_ag": (1 - 1 / size) * (1 + 4 / elem), "gated": 2 * (size - 1) / size,
    }[kind]
    prefix = "resident_" if resident else ""
    label = f"{kind}_bulk" if bulk else kind
    suffix = "" if n == TILE else f"_n{n}"
    return Variant(
        name=f"{prefix}{label}_c{size}_{dtype}{suffix}",
        workload=f"collective_{prefix}{kind}",
        mod=schedule_collective_kernel(func, kind, size, bulk=bulk).mod,
        args=args,
        bytes=_nbytes(args),
        flops=0,
        plan={"collective": kind, "cluster_size": size, "tile_elements": n, "resident": resident,
              "transfer": "cp.async.bulk" if bulk else "ld.shared::cluster"},
        peers=("torch_eager",),
        reference_kwargs={"n": n} if resident else {},
        extra={
            "collective": label,
            "cluster_size": size,
            "resident": resident,
            "dsm_bytes": int(clusters * size * remote_tiles * n * elem),
            "baseline": f"{prefix}copy_c{size}_{dtype}{suffix}",
        },
    )


def collectives() -> list[Variant]:
    """Every collective x cluster size x dtype on tiles of TILE elements per CTA (64 KB fp32;
    with the fp32 result and partials up to 160 KB of dynamic SMEM), about two waves of
    clusters; ``copy`` (no exchange) is each configuration's baseline. Each runs twice: loading
    and storing whole tiles (the correctness table), and resident in SMEM with only a sum
    written (``resident_*``, the bandwidth table: DSM traffic alone). Smaller tiles (4096
    elements) at clusters 2 and 4 check other slice sizes."""
    hw = load_hardware()
    kinds = [(k, False) for k in KINDS] + [(k, True) for k in BULK_KINDS]
    dtypes = (("float32", 4), ("float16", 2))
    # (resident, tile elements, cluster size, dtype, element bytes)
    configs = [(resident, TILE, size, *d) for resident in (False, True) for d in dtypes
               for size in (2, 4, 8, 16)]
    configs += [(False, 4096, size, *d) for d in dtypes for size in (2, 4)]
    variants = []
    for resident, n, size, dtype, elem in configs:
        # Resident kernels (one 128 KB-SMEM CTA per SM) launch two whole waves of the clusters
        # that fit at once, so the last wave is not a partial one.
        clusters = 2 * hw.dsm_peak_clusters[size] if resident else 2 * hw.sm_count // size
        for kind, bulk in kinds:
            if kind == "gated" and size != 2:
                continue  # two halves: gate on rank 0, up on rank 1
            variants.append(_collective_variant(kind, bulk, resident, clusters, size, n, dtype, elem))
    per_group = 4
    for dtype in ("float32", "float16"):
        for size in (2, 4, 8, 16):
            func = split_sum(2 * hw.sm_count // size // per_group, per_group, size, TILE, dtype)
            args = _args(func)
            variants.append(
                Variant(
                    name=f"inter_cluster_reduce_c{size}_{dtype}",
                    workload="split_sum",
                    mod=schedule_split_sum(func, size).mod,
                    args=args,
                    bytes=_nbytes(args),
                    flops=0,
                    plan={"collective": "reduce_scatter + inter_cluster_reduce", "cluster_size": size},
                    peers=("torch_eager",),
                    reference_kwargs={"clusters_per_group": per_group},
                )
            )
    return variants


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
            for v in _cascade_variants(name, size, (128, 64, 32), (1,))]


def cascades_rows() -> list[Variant]:
    """Several rows per CTA (``rows_per_cta``) for the cascades whose rows merge inside one warp:
    MoE routing and the 1024-wide rows, 8-32 parts per row, 1-8 rows per CTA, and the planner's
    split."""
    return [v for name, size in [("moe_routing", (16384, 128, 8)), ("moe_routing", (16384, 256, 8)),
                                 ("moe_routing", (4096, 4096, 8)), ("softmax_stats", (16384, 1024)),
                                 ("layernorm_stats", (16384, 1024))]
            for v in _cascade_variants(name, size, (8, 16, 32), (1, 2, 4, 8))]


def _cascade_variants(name: str, size: tuple, parts: tuple, rows: tuple) -> list[Variant]:
    """The ``name`` workload of ``size`` fused with each of ``parts`` per row, single elements
    or 16-byte chunks, and ``rows`` per CTA (one CTA per row group, no cluster) where the row
    has a chunk for every part, then with the planner's split if it is not among them."""
    func = getattr(cascade_workloads, name)(*size)
    wide = 128 // tvm.DataType(str(func.params[0].ty.dtype)).bits  # 16-byte chunks
    splits = [(p, vector, 1, r) for p, vector, r in itertools.product(parts, (1, wide), rows)
              if size[1] % (p * vector) == 0]  # else the row has fewer chunks than parts
    plan = plan_cascade_split(func)
    planned = (plan.parts, plan.vector, plan.ranks, plan.rows_per_cta)
    splits += [] if planned in splits else [planned]
    chosen = cascade_config(func)
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
    args = _args(func, _CASCADE_OUTPUTS[name])
    return Variant(
        name=f"{name}_{'x'.join(map(str, size))}_p{parts}_v{vector}" + (f"_c{ranks}" if ranks > 1 else "")
        + (f"_r{rows}" if rows > 1 else "") + ("_plan" if planned else ""),
        workload=f"cascade_{name}",
        mod=schedule_fused_rows(fused).mod,
        args=args,
        bytes=_nbytes(args),
        flops=0,
        plan={"parts": parts, "vector": vector, "ranks": ranks, "rows_per_cta": rows, "planner": planned and pick,
              "levels": [r.levels for r in reports]},
        reference_kwargs={"k": size[2]} if name == "moe_routing" else {},
    )


#: Decode attention (rows = batch x heads, cached keys, head dim): 32 heads of one sequence
#: with a long cache, 8 and 32 sequences with shorter ones, a 64-wide head.
DECODE_SHAPES = [(32, 16384, 128), (256, 4096, 128), (1024, 1024, 128), (64, 8192, 64)]


def decode() -> list[Variant]:
    """Decode attention fused by FuseCascadedReductions: scores computed per key inside the
    loop (an element producer), each part ``lanes`` = dim/8 threads (one 16-byte slice of each
    K and V row per thread) or dim/16 (two slices: half the shuffles per key), ``groups`` parts
    per CTA, the row's parts spread over a cluster of ``ranks`` CTAs whose last partials meet
    through DSM (split-KV, merged in fp32 by the cascade's rule); ``planner`` in the plan marks
    the split tvm_dsm's planner picks."""
    plans = _decode_plans()
    return [v for shape, ranks, groups, vector, key_slices in itertools.product(
                DECODE_SHAPES, (1, 2, 4, 8, 16), (8, 16, 32, 64), (2, 4, 8, 16), (1, 2))
            for v in _decode_variant(shape, ranks, groups, vector, _dim_lanes(shape) // key_slices, 0, plans)]


#: Copy stages measured by decode_staged: rings of 2-6 chunks, and 0 (registers) beside them.
_COPY_STAGES = (0, 2, 3, 4, 6)
#: A ring's shared memory per CTA, at most (static shared memory holds 48 KB, with the merge's
#: partial states).
_RING_BYTES = 32 * 1024


def decode_staged() -> list[Variant]:
    """Decode attention with the lanes' K/V slices brought through a ring of ``copy_stages``
    chunks in shared memory by cp.async (0: register double buffering, as in ``decode``), over
    clusters of 1-8 CTAs, 8-32 parts per CTA and 2 or 4 keys per chunk."""
    plans = _decode_plans()
    return [v for shape, ranks, groups, vector, stages in itertools.product(
                DECODE_SHAPES, (1, 2, 4, 8), (8, 16, 32), (2, 4), _COPY_STAGES)
            if groups * _dim_lanes(shape) * stages * vector * 32 <= _RING_BYTES
            for v in _decode_variant(shape, ranks, groups, vector, _dim_lanes(shape), stages, plans)]


def _dim_lanes(shape: tuple) -> int:
    """Lanes per key of a decode shape: one 16-byte slice of the fp16 head per lane."""
    return shape[2] // 8


def _decode_plans() -> dict:
    return {shape: plan_cascade_split(cascade_workloads.decode_attention(*shape)) for shape in DECODE_SHAPES}


def _decode_variant(shape: tuple, ranks: int, groups: int, vector: int, lanes: int, copy_stages: int,
                    plans: dict) -> list[Variant]:
    """The decode kernel of one split ([] where it does not divide or does not build)."""
    rows, keys, dim = shape
    if keys % (ranks * groups * vector) or groups * lanes < 32:
        return []
    func = cascade_workloads.decode_attention(rows, keys, dim)
    plan = plans[shape]
    fused, reports = fuse_cascaded_reductions(func, parts=groups * ranks, vector=vector, lanes=lanes,
                                              ranks=ranks, shuffle=True, copy_stages=copy_stages)
    if not all(r.fusible for r in reports):
        raise ValueError(f"decode {rows}x{keys}x{dim}: {[str(r) for r in reports]}")
    name = (f"decode_{rows}x{keys}x{dim}_c{ranks}_g{groups}_v{vector}"
            + (f"_l{lanes}" if lanes != _dim_lanes(shape) else "")
            + (f"_s{copy_stages}" if copy_stages else ""))
    try:
        mod = schedule_fused_rows(fused).mod
    except ClusterError as err:  # e.g. too many partial states for a cluster merge
        print(f"{name}: refused: {err}")
        return []
    args = _args(func)
    return [Variant(
        name=name,
        workload="decode_attention",
        mod=mod,
        args=args,
        bytes=_nbytes(args),
        flops=4 * rows * keys * dim,
        plan={"ranks": ranks, "groups": groups, "lanes": lanes, "vector": vector,
              "copy_stages": copy_stages,
              "planner": (plan.ranks, plan.parts, plan.vector, plan.lanes, plan.copy_stages)
              == (ranks, groups * ranks, vector, lanes, copy_stages)},
        peers=("torch_eager", "torch_compile", "torch_sdpa"),
    )]


#: Weight shapes (N, K) of the GEMM chains' and SwiGLU FFNs' layers (FlashFuser's G/S workloads).
GEMM_SHAPES = {
    "G5a": (16384, 4096), "G5b": (4096, 16384), "G8a": (8192, 2048), "G8b": (2048, 8192),
    "G4a": (3072, 768), "G4b": (768, 3072), "S3a": (22016, 4096), "S3b": (4096, 11008),
}
_SWEEP = [(128, 128, 64, 2, 4, 3), (128, 64, 64, 2, 2, 4), (64, 128, 64, 2, 4, 4), (64, 256, 64, 2, 4, 3)]


def _gemm_tag(c: SplitKGemmConfig) -> str:
    """A split-K GEMM configuration in a kernel name."""
    return (f"c{c.cluster_size}_{c.block_m}x{c.block_n}x{c.block_k}_s{c.stages}"
            + ("_tma" if c.tma else "") + ("_wg" if c.wgmma else ""))


def _gemm_variant(label: str, m: int, n: int, k: int, config, plan_rank: int | None,
                  predicted_us: float, epilogue: bool = False, dtype: str = "float16") -> Variant:
    func = dense(m, n, k, dtype=dtype, bias=epilogue, activation="silu" if epilogue else "identity")
    args = _args(func)
    c = config
    return Variant(
        name=f"{label}_m{m}_{_gemm_tag(c)}" + ("_bias_silu" if epilogue else ""),
        workload="dense_bias_silu" if epilogue else "dense",
        mod=schedule_split_k_gemm(func, config).mod,
        args=args,
        bytes=_nbytes(args),
        flops=2 * m * n * k,
        plan={**vars(config), "plan_rank": plan_rank, "predicted_us": predicted_us},
        extra={"shape": label, "m": m, "n": n, "k": k},
    )


def _gemm_configs(shape: GemmShape, top: int, hw) -> list:
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
                variants.append(dataclasses.replace(_dlight_variant(label, m, n, k),
                                                    peers=("torch_eager", "torch_compile")))
                continue
            variants.append(_gemm_variant(label, m, n, k, plan.config, 0, plan.predicted_us))
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
        func = gated_dense(128, n, k)
        args = _args(func)
        # Weights like torch.nn.Linear's: with unit ones, silu(g) * u of K = 4096 sums (std 64)
        # overflowed fp16 in about one element per million, also in the float64 reference's
        # place (S3g: 1 element inf, 2 of 229 kernels "wrong" in a run, a different 1 of 5 the
        # next).
        for a in args[1:3]:
            a["scale"] = k ** -0.5
        for config, (rank, predicted) in chosen.items():
            variants.append(Variant(
                name=f"{label}g_m128_{_gemm_tag(config)}", workload="gated_dense",
                mod=schedule_split_k_gemm(func, config).mod, args=args, bytes=_nbytes(args),
                flops=2 * 2 * 128 * n * k,
                plan={**vars(config), "plan_rank": rank, "predicted_us": predicted},
                extra={"shape": f"{label}g", "m": 128, "n": n, "k": k},
            ))
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
        variants.append(_gemm_variant(label, m, n, k, pick.config, 0, pick.predicted_us))
        for s, (bm, bn), stages in itertools.product((1, 2, 4, 8), ((64, 128), (128, 128), (128, 256), (64, 256)), (4,)):
            config = SplitKGemmConfig(s, bm, bn, 64, bm // 16, 1, stages, tma=True, wgmma=True)
            try:
                check_config(shape, config)
            except ClusterError:
                continue
            variants.append(_gemm_variant(label, m, n, k, config, None,
                                          predict(shape, config, hw).predicted_us))
    return variants


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
                try:
                    check_config(shape, config)
                except ClusterError:
                    continue
                chosen.setdefault(config, None)
                break
        variants += [_gemm_variant(label, m, n, k, config, rank, predict(shape, config, hw).predicted_us)
                     for config, rank in chosen.items()]
    return variants


def _dlight_variant(label: str, m: int, n: int, k: int) -> Variant:
    """TVM's stock dlight schedule for the same layer (tvm_dsm.driver.stock_schedule)."""
    func = dense(m, n, k)
    args = _args(func)
    mod = stock_schedule(func).mod
    return Variant(
        name=f"{label}_m{m}_dlight", workload="dense", mod=mod, args=args, bytes=_nbytes(args),
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
        configs = _gemm_configs(GemmShape(m, n, k, True), 4 if m == 128 else 2, hw)
        for config, (rank, predicted) in configs:
            variants.append(_gemm_variant(label, m, n, k, config, rank, predicted))
        variants.append(_dlight_variant(label, m, n, k))
        pick, (rank, predicted) = configs[0]
        if m in (128, 4096):  # the planner's pick in bf16 (its own row group: "<label>_bf16")
            variants.append(_gemm_variant(f"{label}_bf16", m, n, k, pick, rank, predicted,
                                          dtype="bfloat16"))
        if m == 128:  # the planner's pick again with a fused bias + SiLU epilogue
            variants.append(_gemm_variant(label, m, n, k, pick, rank, predicted, epilogue=True))
    return variants


#: FlashFuser's GEMM chains (n, k, l) and SwiGLU FFNs (n, k, l), evaluated at M = 128.
CHAINS = {
    "G1": (512, 32, 256), "G2": (256, 512, 64), "G3": (512, 416, 256), "G4": (3072, 768, 768),
    "G5": (16384, 4096, 4096), "G6": (4096, 1024, 1024), "G7": (768, 768, 768),
    "G8": (8192, 2048, 2048), "G9": (2048, 512, 512), "G10": (1536, 384, 384),
}
SWIGLUS = {
    "S1": (8192, 3072, 3072), "S2": (5632, 2048, 2048), "S3": (11008, 4096, 4096),
    "S4": (8192, 2048, 2048), "S5": (11008, 2048, 2048), "S6": (8960, 1536, 1536),
    "S7": (9728, 2560, 2560), "S8": (3072, 1024, 1024),
}
#: Workloads whose model check measures a random sample of the pruned space.
_MODEL_CHECK = {"G4": 30, "G7": 30, "G9": 30, "S8": 30}


def chains(m: int = 128) -> list[Variant]:
    """Fused GEMM chains and SwiGLU FFNs: the planner's top 3 per workload, and a random sample
    of valid configurations on four workloads (predicted vs measured rank)."""
    hw = load_hardware()
    return [v for label in {**CHAINS, **SWIGLUS} for v in _chain_variants(label, m, _MODEL_CHECK.get(label, 0), hw)]


#: The M sweep of the chain issue: other batch sizes on one FFN of each size class.
_M_SWEEP = {"labels": ("G4", "G8", "S3"), "m": (16, 64, 256, 1024)}


def chains_m() -> list[Variant]:
    """The planner's top 3 for G4, G8 and S3 at M = 16, 64, 256, 1024."""
    hw = load_hardware()
    return [v for m in _M_SWEEP["m"] for label in _M_SWEEP["labels"] for v in _chain_variants(label, m, 0, hw)]


def _chain_workload(label: str, m: int):
    """(the chain's PrimFunc, its shape, its argument specs) for a CHAINS/SWIGLUS label."""
    n, k, l = {**CHAINS, **SWIGLUS}[label]
    func = swiglu_ffn(m, n, k, l) if label.startswith("S") else gemm_chain(m, n, k, l, "relu")
    args = _args(func)
    for a in args[1:-1]:  # weights, initialized like torch.nn.Linear
        a["scale"] = a["shape"][1] ** -0.5
    return func, find_chain(s_tir.Schedule(func))[1], args


def _chain_variant(label: str, shape, func, args, plan, rank, hw, pick: bool = False) -> Variant:
    """One fused-chain kernel of ``shape``; ``rank``: the plan's place in the planner's order
    of fused plans, or "smem"; ``pick``: the chain family's choice (tvm_dsm.plan's best)."""
    c, m, n, k, l = plan.config, shape.m, shape.n, shape.k, shape.l
    smem = rank == "smem"
    return Variant(
        name=f"{label}_m{m}_{'smem' if smem else 'c'}{c.cluster_size}_{c.block_m}x{c.block_n}x{c.block_k}"
        f"_n{c.n_steps}_w{c.warps_m}x{c.warps_n}_s{c.stages}{'_tma' if c.tma else ''}",
        workload="swiglu" if shape.gated else "gemm_chain_relu",
        mod=schedule_chain(func, hw, c)[0].mod,
        args=args,
        bytes=_nbytes(args),
        flops=2 * m * n * (k * len(shape.gemm0) + l),
        plan={**vars(c), "plan_rank": None if smem else rank, "smem_only": smem,
              "predicted_us": plan.predicted_us, "pick": pick},
        extra={"shape": label, "m": m, "n": n, "k": k, "l": l},
    )


def _unfused_chain_variant(label: str, shape, func, args, plan, rank: int, pick: bool) -> Variant:
    """The chain as two split-K GEMM kernels (``_unfused_`` in the name); ``rank``: the plan's
    place among the unfused plans."""
    first, second = plan.config.gemm0, plan.config.gemm1
    m, n, k, l = shape.m, shape.n, shape.k, shape.l
    return Variant(
        name=f"{label}_m{m}_unfused_{_gemm_tag(first)}_then_{_gemm_tag(second)}",
        workload="swiglu" if shape.gated else "gemm_chain_relu",
        mod=schedule_unfused_chain(func, plan.config).mod,
        args=args,
        bytes=_nbytes(args),
        flops=2 * m * n * (k * len(shape.gemm0) + l),
        plan={"gemm0": vars(first), "gemm1": vars(second), "unfused": True, "unfused_rank": rank,
              "plan_rank": None, "smem_only": False, "predicted_us": plan.predicted_us,
              "pick": pick},
        extra={"shape": label, "m": m, "n": n, "k": k, "l": l},
    )


def _chain_variants(label: str, m: int, sample: int, hw) -> list[Variant]:
    """The planner's top 3 fused plans for one chain at batch ``m`` plus ``sample`` random valid
    fused configs, the best planned SMEM-only fusion (one-CTA clusters: ``_smem`` in the name)
    where one fits, and the top 2 unfused plans (split-K GEMMs). ``plan["pick"]`` marks the
    chain family's choice among all of them (:func:`tvm_dsm.plan`)."""
    func, shape, args = _chain_workload(label, m)
    try:
        ranking = plan_function(func, hw).plans  # fused and unfused, the family's order
    except ClusterError as err:
        print(f"{label}: {err}")
        return []
    pick = ranking[0].config
    # Within each kind the family's order is the kind's own planner's order (DSM fused plans
    # apart from the SMEM-only ones, which the family ranks too).
    plans = [p for p in ranking if not isinstance(p.config, UnfusedChainConfig) and p.config.cluster_size > 1]
    ranked = [p for p in ranking if isinstance(p.config, UnfusedChainConfig)]
    unfused = ranked[:2]
    picked = {rank: plans[rank] for rank in range(min(3, len(plans)))}
    rng = random.Random(label)
    for rank in rng.sample(range(len(plans)), min(sample, len(plans))):
        picked.setdefault(rank, plans[rank])
    try:
        picked["smem"] = plan_chain(shape, hw, smem_only=True)[0]
    except ClusterError:
        pass  # the intermediate does not fit one CTA: the case DSM fusion exists for
    return ([_chain_variant(label, shape, func, args, plan, rank, hw, plan.config == pick)
             for rank, plan in picked.items()]
            + [_unfused_chain_variant(label, shape, func, args, plan, rank, plan.config == pick)
               for rank, plan in enumerate(unfused)])


def chains_tma() -> list[Variant]:
    """The operand-copy ablation of the fused chains at M = 128: the planner's top 3 of each
    copy kind, each also built with the other kind, on every chain and SwiGLU FFN."""
    hw = load_hardware()
    variants = []
    for label in {**CHAINS, **SWIGLUS}:
        func, shape, args = _chain_workload(label, 128)
        try:
            plans = plan_chain(shape, hw)
        except ClusterError as err:
            print(f"{label}: {err}")
            continue
        ranked = {p.config: rank for rank, p in enumerate(plans)}
        top = [p.config for tma in (False, True) for p in [p for p in plans if p.config.tma == tma][:3]]
        for config in dict.fromkeys(dataclasses.replace(c, tma=t) for c in top for t in (False, True)):
            if config in ranked:  # valid with this copy kind
                variants.append(_chain_variant(label, shape, func, args, plans[ranked[config]],
                                               ranked[config], hw))
    return variants


#: (batch, sequence, hidden, vocabulary): SPLADE/Sparton documents and queries over BERT's
#: vocabulary padded to a multiple of 64 (30522 -> 30528), and a 32000-word vocabulary.
LM_HEAD_SHAPES = [(1, 128, 768, 30528), (4, 128, 768, 30528), (32, 32, 768, 30528), (4, 64, 1024, 32000)]


def lm_head() -> list[Variant]:
    """Sparton's LM-head max (tvm_dsm.rules.gemm_row_max): the planner's top 4 per shape."""
    variants = []
    for batch, seq, hidden, vocab in LM_HEAD_SHAPES:
        func = lm_head_max(batch, seq, hidden, vocab)
        args = _args(func)
        args[1]["scale"] = hidden ** -0.5  # W like nn.Linear: logits of unit scale
        for rank, plan in enumerate(plan_gemm_row_max(row_max_shape(func))[:4]):
            c = plan.config
            variants.append(Variant(
                name=f"lm_head_{batch}x{seq}x{hidden}x{vocab}_{c.block_m}x{c.block_n}x{c.block_k}_s{c.stages}"
                f"{'_tma' if c.tma else ''}{'_wgmma' if c.wgmma else ''}",
                workload="lm_head_max",
                mod=schedule_gemm_row_max(func, c).mod,
                args=args,
                bytes=_nbytes(args),
                flops=2 * batch * seq * hidden * vocab,
                plan={**vars(c), "planner": rank == 0, "predicted_us": plan.predicted_us},
                reference_kwargs={"seq": seq},
            ))
    return variants


#: Attention shapes (heads x batch, query length, key length, head dim); the first is the
#: issue's [128, 16, 512, 64].
ATTENTION_SHAPES = [(2048, 512, 512, 64), (256, 1024, 1024, 64), (64, 4096, 4096, 64), (256, 1024, 1024, 128)]


def attention() -> list[Variant]:
    """Attention as one kernel (tvm_dsm.rules.attention), plain and causal, in each
    configuration that fits; default_config's is the pick."""
    variants = []
    for (heads, q_len, kv_len, dim), causal in itertools.product(ATTENTION_SHAPES, (False, True)):
        func = cascade_workloads.attention(heads, q_len, kv_len, dim, causal)
        args = _args(func)
        for config in ATTENTION_CONFIGS:
            variants.append(Variant(
                name=f"attention_{heads}x{q_len}x{kv_len}x{dim}{'_causal' if causal else ''}"
                f"_m{config.block_m}n{config.block_n}" + (f"_w{config.warpgroups}" if config.warpgroups > 1 else ""),
                workload="attention",
                mod=fuse_attention(func, config),
                args=args,
                bytes=_nbytes(args),
                flops=4 * heads * q_len * kv_len * dim // (2 if causal else 1),  # the keys seen
                plan={**vars(config), "planner": config == default_config(find_attention(func)[0])},
                peers=("torch_eager", "torch_compile", "torch_sdpa"),
                reference_kwargs={"causal": True} if causal else {},
                extra={"causal": causal},
            ))
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
        for config, (rank, predicted) in _gemm_configs(shape, 3, hw):
            for tma in (False, True):
                c = dataclasses.replace(config, tma=tma)
                try:
                    check_config(shape, c)
                except ClusterError:
                    continue
                variants.append(_gemm_variant(label, m, n, k, c, rank, predicted))
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
        func = _fp8_workload(m, n, k, quantized)
        fp8_shape = GemmShape(m, n, k, True, "float8_e4m3fn")
        if quantized:
            candidates = [("two_kernels_", schedule_quantize_then_gemm, plan) for plan in _fitting(
                func, schedule_quantize_then_gemm, plan_split_k_gemm(fp8_shape, hw), 2)]
            candidates += [("", schedule_quantized_gemm, plan) for plan in plan_split_k_gemm(fp8_shape, hw, True)[:3]]
        else:
            candidates = [("", schedule_split_k_gemm, plan) for plan in plan_split_k_gemm(fp8_shape, hw)[:3]]
        variants += [_fp8_variant(func, (m, n, k), quantized, form, schedule, plan, rank)
                     for rank, (form, schedule, plan) in enumerate(candidates)]
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
        func = _fp8_workload(m, n, k, quantized)
        form, schedule = _fp8_two_kernels(quantized)
        for rank, plan in enumerate(plans):
            try:
                variants.append(_fp8_variant(func, (m, n, k), quantized, form, schedule, plan, rank))
            except ClusterError as err:  # the epilogue's tile does not fit beside the pipeline
                print(f"{form}c{plan.config.cluster_size}: refused: {err}")
    return variants


def fp8_depths() -> list[Variant]:
    """``fp8_sweep`` with the pipeline depths beyond 4 (measured while the planner offered fp8
    only 3 and 4: the evidence for offering more)."""
    return fp8_sweep(tuple(d for d in PIPELINE_DEPTHS if d not in SHALLOW_PIPELINES))


def _fp8_workload(m: int, n: int, k: int, quantized: bool):
    return quantized_dense(m, n, k) if quantized else scaled_dense(m, n, k)


def _fp8_two_kernels(quantized: bool) -> tuple[str, Callable]:
    """(name form, schedule) of the fp8 GEMM alone, or behind its quantization kernel."""
    return ("two_kernels_", schedule_quantize_then_gemm) if quantized else ("", schedule_split_k_gemm)


def _fp8_variant(func, mnk: tuple, quantized: bool, form: str, schedule, plan, rank: int) -> Variant:
    m, n, k = mnk
    args = _args(func)
    for a in args:  # scales: positive, around 1
        a["positive"] = a["dtype"] == "float32"
    c = plan.config
    return Variant(
        name=f"{'quant_' if quantized else ''}fp8_{m}x{n}x{k}_{form}c{c.cluster_size}_"
        f"{c.block_m}x{c.block_n}x{c.block_k}_s{c.stages}{'_tma' if c.tma else ''}",
        workload="quantized_dense" if quantized else "scaled_dense",
        mod=schedule(func, c).mod,
        args=args,
        bytes=_nbytes(args),
        flops=2 * m * n * k,
        plan={**vars(c), "plan_rank": rank, "planner": rank == 0, "predicted_us": plan.predicted_us,
              "form": form.rstrip("_") or "one_kernel"},
        extra={"m": m, "n": n, "k": k, "quantized": quantized},
    )


def _fitting(func, schedule, plans: list, count: int) -> list:
    """The first ``count`` of ``plans`` that ``schedule`` accepts (an epilogue of its own thread
    loops keeps the output tile in shared memory, which the largest tiles overflow)."""
    fitting = []
    for plan in plans:
        try:
            schedule(func, plan.config)
        except ClusterError:
            continue
        fitting.append(plan)
        if len(fitting) == count:
            break
    return fitting


def _launched(variant: Variant, programmatically: bool) -> Variant:
    """``variant`` with its kernels launched programmatically (``_pdl`` in the name) or not."""
    sch = s_tir.Schedule(variant.mod)
    launch_programmatically(sch, programmatically)
    return dataclasses.replace(variant, name=variant.name + ("_pdl" if programmatically else ""),
                               mod=sch.mod, plan={**variant.plan, "programmatic_launch": programmatically})


#: Decode (ranks, groups, vector) measured fastest on some shape (decode.json, decode_wide.json).
_DECODE_FASTEST = ((4, 8, 16), (2, 32, 8), (4, 16, 8), (4, 16, 4), (1, 32, 8), (2, 64, 4))


def decode_picks() -> list[Variant]:
    """Decode attention, per shape the planner's split and the splits in ``_DECODE_FASTEST``
    (the ``decode`` sweep's contenders worth re-measuring, without building the sweep)."""
    plans = _decode_plans()
    variants = []
    for shape in DECODE_SHAPES:
        plan = plans[shape]
        splits = {(plan.ranks, plan.parts // plan.ranks, plan.vector), *_DECODE_FASTEST}
        for ranks, groups, vector in sorted(splits):
            variants += _decode_variant(shape, ranks, groups, vector, _dim_lanes(shape), 0, plans)
    return variants


def decode_pdl() -> list[Variant]:
    """Decode attention launched programmatically and not: the ``decode_picks`` kernels. A
    decode step's attention follows the QKV projection on the same stream, as each replay
    follows the previous one here."""
    return [_launched(v, on) for v in decode_picks() for on in (False, True)]


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
        variants.append(_gemm_variant(label, m, n, k, plan.config, 0, plan.predicted_us))
    for label in ("G4", "G8", "S3", "S8"):
        variants += [v for v in _chain_variants(label, 128, 0, hw) if v.plan["pick"]]
    return [_launched(v, on) for v in variants for on in (False, True)]


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
                try:
                    check_config(shape, config)
                except ClusterError:
                    continue
                predicted = predict(shape, config, hw).predicted_us
                variants.append(_gemm_variant(label, 128, n, k, config, rank, predicted))
    # Plans that differ only in their warp layout share a name: keep the better-ranked one.
    return list({v.name: v for v in reversed(variants)}.values())[::-1]


def gemm_depths() -> list[Variant]:
    """Every G/S layer and batch of ``gemm_m``, and every fp8 shape alone and behind its
    quantization kernel, where the planner's pick changes when its space takes pipelines deeper
    than 4 stages: the pick from 3-4 stages and the pick from all."""
    hw = load_hardware()
    variants = []
    for (m, n, k), quantized in itertools.product(FP8_SHAPES, (False, True)):
        func, fp8_shape = _fp8_workload(m, n, k, quantized), GemmShape(m, n, k, True, "float8_e4m3fn")
        form, schedule = _fp8_two_kernels(quantized)
        picks = [_fitting(func, schedule, plan_split_k_gemm(fp8_shape, hw, pipelines=pipelines), 1)[0]
                 for pipelines in (SHALLOW_PIPELINES, None)]
        if picks[0].config != picks[1].config:
            variants += [_fp8_variant(func, (m, n, k), quantized, form, schedule, p, 0) for p in picks]
    for m in (16, 64, 128, 256, 1024, 4096):
        for label, (n, k) in layer_shapes().items():
            shape = GemmShape(m, n, k, True)
            try:
                shallow = plan_split_k_gemm(shape, hw, pipelines=SHALLOW_PIPELINES)[0]
            except ClusterError:
                continue
            deep = plan_split_k_gemm(shape, hw)[0]
            if deep.config != shallow.config:
                variants += [_gemm_variant(label, m, n, k, p.config, 0, p.predicted_us)
                             for p in (shallow, deep)]
    return variants


#: Chains whose torch time is mostly launches: where a fused kernel's second launch matters.
_SMALL_CHAINS = ("G1", "G2", "G3", "G7", "G9", "G10")


def chains_pdl() -> list[Variant]:
    """The fused plans of the small chains (the planner's top 3 and the SMEM-only one) launched
    programmatically and not: the inter-cluster reduce kernel's launch overlapping the fused
    kernel."""
    hw = load_hardware()
    variants = [v for label in _SMALL_CHAINS for v in _chain_variants(label, 128, 0, hw)
                if not v.plan.get("unfused")]
    return [_launched(v, on) for v in variants for on in (False, True)]


def conv_chains() -> list[Variant]:
    """FlashFuser's conv chains C1-C8 (tvm_dsm.rules.conv_chain) at batch 1 and 8: the top 3
    plans and the best of the other kind (fused or unfused) than the pick, each that lowers (a
    refused chain or plan is logged and left out)."""
    hw = load_hardware()
    variants = []
    for (label, (ic, size, oc1, oc2, k1, k2)), batch in itertools.product(CONV_CHAINS.items(), (1, 8)):
        func = conv_chain(ic, size, oc1, oc2, k1, k2, batch)
        args = _args(func)
        for a in args[1:-1]:  # weights, initialized like torch.nn.Conv2d
            a["scale"] = (a["shape"][1] * a["shape"][2] * a["shape"][3]) ** -0.5
        try:
            ranking = plan_function(func, hw)
        except ClusterError as err:
            print(f"{label} batch {batch}: refused: {err}")
            continue
        kind = type(ranking.best.config.chain)
        other = next((r for r, p in enumerate(ranking.plans) if type(p.config.chain) is not kind), None)
        for rank in sorted({r for r in (0, 1, 2, other) if r is not None and r < len(ranking.plans)}):
            plan = ranking.plans[rank]
            try:
                mod = ranking.schedule(rank).mod
                tvm.compile(mod, target=tvm.target.Target(H100))  # what does not lower is logged
            except Exception as err:  # noqa: BLE001 - recorded: what did not lower
                print(f"{label} batch {batch} plan {rank}: does not lower: {str(err).splitlines()[0][:200]}")
                continue
            pixels = batch * size * size
            variants.append(Variant(
                name=f"{label}_b{batch}_r{rank}", workload="conv_chain_relu", mod=mod, args=args,
                bytes=_nbytes(args), flops=2 * pixels * oc1 * (k1 * k1 * ic + oc2),
                plan={"plan_rank": rank, "predicted_us": plan.predicted_us, "summary": plan.summary(),
                      "fused": not isinstance(plan.config.chain, UnfusedChainConfig)},
                reference_kwargs={"k1": k1}))
    return variants


#: softmax·V shapes (rows, keys, columns): the cascades suite's two, a decode-like one with few
#: rows and long keys, and a 128-column one.
SOFTMAX_GEMM_SHAPES = [(2048, 512, 64), (512, 4096, 64), (64, 8192, 64), (4096, 1024, 128),
                       (2048, 512, 64, "float16")]


def softmax_gemm() -> list[Variant]:
    """softmax·V as one tiled kernel (tvm_dsm.rules.softmax_gemm) in every configuration of a
    small grid that fits each shape (64-256 threads, 64-1024 CTAs); ``planner`` marks
    default_config's. Beside them, the generic fused rows (FuseCascadedReductions with the
    cascade planner's split) that ran softmax·V before."""
    variants = []
    for size in SOFTMAX_GEMM_SHAPES:
        variants += _cascade_variants("softmax_pv", size, (), (1,))
        func = cascade_workloads.softmax_pv(*size)
        shape = softmax_gemm_rule.find_softmax_gemm(func).shape
        pick = softmax_gemm_rule.default_config(shape)
        for bm, bk, bj, tm, ranks, tn in itertools.product((16, 32), (32, 64), (32, 64), (2, 4),
                                                            (1, 2, 4, 8, 16), (4, 8)):
            config = softmax_gemm_rule.SoftmaxGemmConfig(bm, bk, bj, tm, ranks, tn)
            try:
                softmax_gemm_rule.check_config(shape, config)
            except ClusterError:
                continue
            ctas = size[0] // bm * (size[2] // bj) * ranks
            if 64 <= config.threads <= 256 and 64 <= ctas <= 1024 and config != pick:
                variants.append(_softmax_gemm_variant(func, size, config, False))
    return variants


def _softmax_gemm_variant(func, size: tuple, config, planner: bool, name: str = "softmax_pv") -> Variant:
    """The ``name`` workload (softmax_pv or softmax_v) of ``size`` as the tiled kernel in
    ``config`` (``planner``: default_config's)."""
    c = config
    args = _args(func, _CASCADE_OUTPUTS[name])
    return Variant(
        name=f"{name}_{'x'.join(map(str, size))}_m{c.block_m}k{c.block_k}j{c.block_j}"
        f"t{c.rows_per_thread}x{c.columns_per_thread}" + (f"_c{c.ranks}" if c.ranks > 1 else "")
        + ("_plan" if planner else ""),
        workload=f"cascade_{name}",
        mod=softmax_gemm_rule.fuse_softmax_gemm(func, config),
        args=args,
        bytes=_nbytes(args),
        flops=2 * size[0] * size[1] * size[2],
        plan={**dataclasses.asdict(config), "planner": planner},
    )


#: Row softmax shapes (rows, columns) of the ``softmax`` suite: a model's attention-sized rows,
#: short rows, and a vocabulary-wide one.
SOFTMAX_SHAPES = [(4096, 4096), (16384, 1024), (1024, 32000)]


def softmax() -> list[Variant]:
    """TOPI's softmax (what Relax legalizes ``R.nn.softmax`` to: max, exp, exp-sum, normalize)
    as the fused rows schedule it (``schedule_cascade``) beside TVM's stock dlight schedule, which
    ``tvm_dsm.build`` keeps for it (the fused-cascade family refuses a stage that reads the data
    again)."""
    variants = []
    for rows, cols in SOFTMAX_SHAPES:
        x = te.placeholder((rows, cols), "float32", name="x")
        func = te.create_prim_func([x, topi.nn.softmax(x)])
        args = _args(func)
        for label, mod in (("fused_rows", schedule_cascade(func)[0].mod), ("dlight", stock_schedule(func).mod)):
            variants.append(Variant(name=f"softmax_{rows}x{cols}_{label}", workload="softmax", mod=mod, args=args,
                                    bytes=_nbytes(args), flops=0, plan={"planner": label == "dlight"},
                                    extra={"schedule": label}))
    return variants


#: MoE routers (tokens, experts, k[, logits' dtype]): the cascades suite's three, DeepSeek-V2-Lite's
#: 64 experts at the top 6 and Mixtral's 8 at the top 2; fp32 logits (64-bit keys) too.
TOP_K_ROWS_SHAPES = [(4096, 4096, 8), (16384, 256, 8), (16384, 128, 8), (16384, 64, 6), (16384, 8, 2),
                     (4096, 4096, 8, "float32"), (16384, 64, 6, "float32")]


def top_k_rows() -> list[Variant]:
    """MoE routing as the top-k rows kernel (tvm_dsm.rules.top_k_rows: rows staged in shared
    memory, only elements above a threshold inserted) with 1-32 lanes a row and 32-256 threads a CTA
    (``planner``: default_config's), beside the generic fused rows of the cascade planner's
    split that ran it before."""
    variants = []
    for size in TOP_K_ROWS_SHAPES:
        func = cascade_workloads.moe_routing(*size)
        try:  # the fused rows refuse rows narrower than their smallest split (Mixtral's 8)
            plan = plan_cascade_split(func)
            variants.append(_cascade_variant("moe_routing", size, func,
                                             (plan.parts, plan.vector, plan.ranks, plan.rows_per_cta), True, False))
        except ClusterError:
            pass
        found = top_k_rows_rule.find_top_k_rows(func)
        pick = top_k_rows_rule.default_config(found)
        for lanes, rows in itertools.product((1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 32, 64, 128, 256)):
            config = top_k_rows_rule.TopKRowsConfig(lanes, rows)
            try:
                top_k_rows_rule.check_config(found, config)
            except ClusterError:
                continue
            if 32 <= config.threads <= 256 or config == pick:
                variants.append(_top_k_rows_variant(func, size, config, config == pick))
    return variants


def _top_k_rows_variant(func, size: tuple, config, planner: bool) -> Variant:
    """moe_routing of ``size`` as the top-k rows kernel in ``config``."""
    args = _args(func, _CASCADE_OUTPUTS["moe_routing"])
    return Variant(
        name=f"moe_routing_{'x'.join(map(str, size))}_rows_l{config.lanes}_r{config.rows_per_cta}"
        + ("_plan" if planner else ""),
        workload="cascade_moe_routing",
        mod=top_k_rows_rule.fuse_top_k_rows(func, config),
        args=args,
        bytes=_nbytes(args),
        flops=0,
        plan={**dataclasses.asdict(config), "planner": planner},
        reference_kwargs={"k": size[2]},
    )


SUITES = {
    "split_k": split_k, "collectives": collectives, "cascades": cascades, "gemm": gemm,
    "attention": attention, "chains": chains, "conv_chains": conv_chains, "chains_m": chains_m,
    "decode": decode, "decode_staged": decode_staged, "fp8_sweep": fp8_sweep, "lm_head": lm_head,
    "fp8": fp8, "gemm_tma": gemm_tma, "chains_tma": chains_tma, "gated": gated, "gemm_m": gemm_m,
    "gemm_wgmma": gemm_wgmma, "programmatic_launch": programmatic_launch, "decode_pdl": decode_pdl,
    "decode_picks": decode_picks, "cascades_rows": cascades_rows, "chains_pdl": chains_pdl,
    "gemm_stages": gemm_stages, "gemm_depths": gemm_depths, "fp8_depths": fp8_depths,
    "gemm_large_m": gemm_large_m, "softmax_gemm": softmax_gemm, "top_k_rows": top_k_rows, "softmax": softmax,
}
