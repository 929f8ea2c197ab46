"""Split-K row reductions and the DSM collectives."""

from __future__ import annotations

from tvm import s_tir
from ...hardware import load_hardware
from ...rules import SplitKReductionConfig, schedule_split_k_reduction
from ...rules.collective_kernel import BULK_KINDS, schedule_collective_kernel, schedule_split_sum
from ...workloads import gemv, row_sum
from ...workloads.collectives import KINDS, collective, split_sum
from .base import Variant, args_of, nbytes_of


SPLIT_K_SHAPES = [(1024, 4096), (4096, 4096), (256, 16384), (8192, 8192)]


CLUSTER_SIZES = [1, 2, 4, 8, 16]


def split_k() -> list[Variant]:
    """Row sum and GEMV with K split over clusters of 1-16 CTAs, plus the stock-bind trap."""
    variants = []
    for workload, make in (("row_sum", row_sum), ("gemv", gemv)):
        for m, k in SPLIT_K_SHAPES:
            func = make(m, k)
            args = args_of(func)
            for s in CLUSTER_SIZES:
                config = SplitKReductionConfig(cluster_size=s, rows_per_cluster=max(16, s))
                sch = schedule_split_k_reduction(func, config)
                variants.append(
                    Variant(
                        name=f"{workload}_{m}x{k}_c{s}",
                        workload=workload,
                        mod=sch.mod,
                        args=args,
                        bytes=nbytes_of(args),
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
    args = args_of(func)
    return Variant(
        name=f"stock_bind_trap_{m}x{k}_c{cluster}",
        workload="row_sum",
        mod=sch.mod,
        args=args,
        bytes=nbytes_of(args),
        flops=2 * m * k,
        plan={"cluster_size": cluster, "binding": "sch.bind(loop, 'clusterCtaIdx.x')"},
        pipeline="s_tir_stock",
        expect_correct=False,
    )


TILE = 16384  # elements per CTA of the collectives suite


def collective_variant(kind, bulk, resident, clusters, size, n, dtype, elem) -> Variant:
    func = collective(kind, clusters, size, n, dtype, resident=resident)
    args = args_of(func)
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
        bytes=nbytes_of(args),
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
            variants.append(collective_variant(kind, bulk, resident, clusters, size, n, dtype, elem))
    per_group = 4
    for dtype in ("float32", "float16"):
        for size in (2, 4, 8, 16):
            func = split_sum(2 * hw.sm_count // size // per_group, per_group, size, TILE, dtype)
            args = args_of(func)
            variants.append(
                Variant(
                    name=f"inter_cluster_reduce_c{size}_{dtype}",
                    workload="split_sum",
                    mod=schedule_split_sum(func, size).mod,
                    args=args,
                    bytes=nbytes_of(args),
                    flops=0,
                    plan={"collective": "reduce_scatter + inter_cluster_reduce", "cluster_size": size},
                    peers=("torch_eager",),
                    reference_kwargs={"clusters_per_group": per_group},
                )
            )
    return variants
