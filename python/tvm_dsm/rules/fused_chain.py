"""FlashFuser's fused GEMM chain: ``Out = (act(A @ W1^T) @ W2^T)`` in one cluster kernel.

The intermediate ``H = act(A @ W1^T)`` (``M x N``) never reaches global memory. A cluster of S
CTAs owns a ``block_m``-row slab of the output and ``n_steps`` consecutive ``block_n``-wide column
tiles of ``H``; per tile step, all S CTAs:

1. compute a partial ``block_m x block_n`` tile of ``A @ W1^T`` over their own K slice (the
   split-K main loop: cp.async pipeline, ldmatrix, mma.sync) into their DSM slice;
2. **all-exchange**: after a cluster barrier every CTA sums the S partials (16-byte
   ``ld.shared::cluster.v4`` loads), applies the activation (SwiGLU: ``silu(gate) * up`` from two
   partial tiles) and keeps the fp16 tile of ``H`` in its own shared memory;
3. multiply the tile by its own ``L / S`` columns of ``W2``, accumulating its slice of the output
   in registers across the steps.

Clusters that own different column ranges of ``H`` hold partial sums of the output: each writes
its fp32 partial (the reduce over ``N`` across clusters), and a second kernel of the same function
adds them in column-group order and casts (the deterministic inter-cluster reduce). Or, in one
launch, the CTAs that wrote an output tile's partials do so for the tile (the order, not the
arrival, fixes the result; ``FusedChainConfig.reduce``).

With a cluster of one CTA the chain is fused the way SMEM-only compilers fuse it: each CTA
computes its tiles of ``H`` alone (no split of K, no exchange) and must hold all ``L`` output
columns of its rows in registers, which the capacity rule refuses once L is large (the
paper's ablation point; the planner's DSM space starts at 2).

The pattern is found in any PrimFunc of this shape (:func:`find_chain`), not only in
:mod:`tvm_dsm.workloads.chains`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV
from tvm.s_tir.schedule.schedule import ScheduleError

from ..errors import ClusterError
from ..hardware import Hardware
from ..annotations import TILE_REDUCE_KEY
from ..ir import is_reduction
from ..schedule import bind_cluster_nest, check_cluster_size
from ..transform.programmatic_launch import launch_programmatically
from .split_k_gemm import (
    GemmShape,
    SplitKGemmConfig,
    check_epilogue_reads_its_element,
    check_pipeline,
    check_tma,
    find_gemm_operands,
    split_k_main_loops,
    sum_partials,
)
from ..intrin.mma import PAD, TILE, VECTOR, accumulator_tile_bytes, mma
from .tensor_core import blockize_fragments, fragment_caches, stage_in_shared, tensorize_fragments, warp_tile

_MAX_ACCUMULATOR_REGISTERS = 128  # fp32 output registers per thread, next to the main loop's
#: loads of partials the inter-cluster reduce unrolls (its loop over column groups, and over its
#: rounds of 4 outputs a thread where all fit), so that they are in flight together
_UNROLLED_LOADS = 64


@dataclass(frozen=True)
class FusedChainConfig:
    """A point of the fused chain's design space (FlashFuser's CTA tile and cluster tile)."""

    cluster_size: int  # CTAs per cluster: split GEMM0's K and GEMM1's L columns
    block_m: int = 128
    block_n: int = 64  # width of one tile step of H
    n_steps: int = 1  # consecutive tile steps a cluster owns (temporal N)
    block_k: int = 32  # GEMM0's K step
    warps_m: int = 2
    warps_n: int = 4
    stages: int = 3
    tma: bool = False  # GEMM0's operand tiles by TMA tensor copies (tvm_dsm.transform.tma_pipeline)
    #: where the inter-cluster reduce runs: "kernel", a second kernel over the whole grid;
    #: "last_cta", the last CTA of the fused kernel to finish each output tile (one launch, but
    #: one CTA per tile reduces what the whole grid reduces in the second kernel); "gathered",
    #: every CTA of the tile its share once all have written their partials (one launch; only
    #: where the grid's CTAs are all resident at once). Both in-kernel forms measured slower
    #: than the second kernel (docs/chains.md), so the planner keeps the second kernel.
    reduce: str = "kernel"
    #: launch both kernels with programmatic dependent launch, so the inter-cluster reduce's
    #: launch overlaps the fused kernel: the planner sets it where the fused grid runs in one
    #: wave. Not part of the point's identity.
    programmatic_launch: bool = field(default=False, compare=False)

    @property
    def threads(self) -> int:
        return self.main_loop().threads

    def column_groups(self, shape: "ChainShape") -> int:
        """Clusters that share an output tile, each with the partial sum of its columns of H."""
        return shape.n // (self.block_n * self.n_steps)

    def tile_outputs(self, shape: "ChainShape") -> int:
        """Outputs of one CTA's tile: ``block_m`` rows of its rank's ``L / S`` columns."""
        return self.block_m * shape.l // self.cluster_size

    def ctas(self, shape: "ChainShape") -> int:
        """CTAs of the fused kernel's grid."""
        return shape.m // self.block_m * self.column_groups(shape) * self.cluster_size

    def main_loop(self) -> SplitKGemmConfig:
        """GEMM0's configuration: a split-K GEMM of one ``block_m x block_n`` tile."""
        return SplitKGemmConfig(self.cluster_size, self.block_m, self.block_n, self.block_k,
                                self.warps_m, self.warps_n, self.stages, self.tma)

    def shared_bytes(self, shape: "ChainShape") -> int:
        """Shared memory per CTA as the lowered kernel allocates it: GEMM0's operand pipeline
        (a gated chain's products sharing its K loop stream both W tiles a stage), its fp32
        partial tile(s) and the W2 tile of the cluster's output columns; a TMA kernel holds a
        second set of stage barriers. H's tile shares the partials' bytes. With one tile step a
        TMA kernel places the partials over the freed pipeline (what exceeds its largest operand
        buffer is added); a cp.async kernel of one step overlays part of both, depending on their
        sizes, so both are counted whole there. (Checked against the lowered kernels of the
        chains' plans: exact, or over where stated.)"""
        loop = self.main_loop()
        products = len(shape.gemm0)
        partials = products * accumulator_tile_bytes(self.block_m, self.block_n)
        columns = shape.l // self.cluster_size
        w2 = (columns * (self.block_n + PAD) if shape.w2_nk else self.block_n * (columns + PAD)) * 2
        operands = loop.pipeline_bytes(shape.dtype, products, shape.w1_nk) + loop.barrier_bytes + w2
        if self.n_steps > 1:
            return operands + partials
        if self.tma:
            largest = max(loop.slots(shape.dtype, self.block_m), loop.slots(shape.dtype, self.block_n, shape.w1_nk))
            return operands + max(0, partials - largest)
        return operands + partials + self.block_m * (self.block_n + PAD) * 2


@dataclass(frozen=True)
class ChainShape:
    """``M x K -> N -> L``; ``gemm0`` names GEMM0's blocks (two for a gated chain)."""

    m: int
    n: int
    k: int
    l: int
    gemm0: tuple[str, ...]
    dtype: str = "float16"  # every operand's and H's: float16 or bfloat16
    w1_nk: bool = True  # W1 (and a gated chain's both weights) stored [N, K]; else [K, N]
    w2_nk: bool = True  # W2 stored [L, N]; else [N, L]

    @property
    def gated(self) -> bool:
        return len(self.gemm0) == 2


@dataclass
class ChainBlocks:
    gemm0: list[SBlockRV]  # the first GEMM(s): A @ W^T
    combine: SBlockRV  # H = act(C) or silu(G) * U, rounded to the operands' type
    gemm1: SBlockRV  # E = H @ W2^T
    epilogue: list[SBlockRV]  # elementwise blocks after E; the last writes the output


def merge_elementwise_blocks(sch: s_tir.Schedule) -> None:
    """Inline each elementwise block of ``sch``'s function that feeds only elementwise blocks
    into them: a chain's activation and cast (TOPI writes them as two blocks) become the one
    block that writes its intermediate. A block writing a parameter, or one s_tir cannot
    inline, stays."""
    params = list(sch.mod["main"].params)
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        if is_reduction(block) or any(w.source.same_as(p) for w in block.writes for p in params):
            continue
        consumers = sch.get_consumers(rv)
        if consumers and not any(is_reduction(sch.get(c)) for c in consumers):
            try:
                sch.compute_inline(rv)
            except ScheduleError:
                continue


def find_chain(sch: s_tir.Schedule) -> tuple[ChainBlocks, ChainShape]:
    """The chain's blocks and shape (its elementwise blocks merged first,
    :func:`merge_elementwise_blocks`); ClusterError says which part of the pattern is missing.

    Expected: one or two matmul blocks ``A[i, k] * W[j, k]`` over the same ``A``, one elementwise
    block combining them into ``H``, a matmul ``H[i, j] * W2[l, j]``, then elementwise
    blocks. All operands and ``H`` of one type, float16 or bfloat16; accumulation float32.
    """
    merge_elementwise_blocks(sch)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    reductions = [b for b in blocks if is_reduction(sch.get(b))]
    if any(len(sch.get(b).iter_vars) > 3 for b in reductions):
        raise ClusterError(
            "convolutions (reductions over more than one axis, or over image rows and columns) are "
            "not fused: a 1x1 chain needs its pixel axes as one GEMM row axis, a kxk one an "
            "implicit GEMM (neither built)")
    if len(reductions) not in (2, 3) or reductions != blocks[: len(reductions) - 1] + [reductions[-1]]:
        raise ClusterError(
            "a fused GEMM chain is one or two matmuls, one elementwise block, one matmul, then "
            f"elementwise blocks; got {[sch.get(b).name_hint for b in blocks]}"
        )
    gemm0 = reductions[:-1]
    combine = blocks[len(gemm0)]
    gemm1 = reductions[-1]
    if blocks.index(gemm1) != len(gemm0) + 1:
        raise ClusterError("a fused GEMM chain has exactly one elementwise block between its GEMMs")
    found = [find_gemm_operands(sch.get(b)) for b in gemm0]
    shapes = [shape for shape, _ in found]
    if len({(s.m, s.n, s.k) for s in shapes}) != 1 or len({x for _, (x, _) in found}) != 1:
        raise ClusterError("the gate and up GEMMs of a gated chain must read the same input and "
                           "have one shape")
    if len({s.weight_nk for s in shapes}) != 1:
        raise ClusterError("the gate and up weights of a gated chain must be stored alike")
    second, (h_read, _) = find_gemm_operands(sch.get(gemm1))
    h = sch.get(combine).writes[0].source
    if not h_read.same_as(h):
        raise ClusterError("the second GEMM must read the elementwise block's output as its input")
    dtype = shapes[0].dtype
    if dtype not in CHAIN_TYPES:
        raise ClusterError(f"a fused GEMM chain takes {' or '.join(CHAIN_TYPES)} operands, got {dtype}")
    if {str(h.ty.dtype), second.dtype} != {dtype} or second.k != shapes[0].n:
        raise ClusterError(f"the intermediate must be {dtype} [M, N], as the operands")
    if len(blocks) == len(gemm0) + 2:
        raise ClusterError("a GEMM chain ends in an elementwise block writing the output (a cast, "
                           "say); here the second matmul writes it")
    check_epilogue_reads_its_element(sch, [gemm1], blocks[len(gemm0) + 2:])  # not a reshape of E
    shape = ChainShape(shapes[0].m, shapes[0].n, shapes[0].k, second.n,
                       tuple(sch.get(b).name_hint for b in gemm0), dtype, shapes[0].weight_nk, second.weight_nk)
    return ChainBlocks(gemm0, combine, gemm1, blocks[len(gemm0) + 2:]), shape


def first_gemm(shape: ChainShape) -> GemmShape:
    """GEMM0 (``M x N x K``; gated: two products over the same input) as a dense layer."""
    return GemmShape(shape.m, shape.n, shape.k, shape.w1_nk, shape.dtype, products=len(shape.gemm0))


REDUCES = ("kernel", "last_cta", "gathered")
#: The operand types of a fused chain: those of 16-bit tensor-core products with fp32 accumulation.
CHAIN_TYPES = ("float16", "bfloat16")


def _check_cluster(shape: ChainShape, c: FusedChainConfig, hw: Hardware) -> None:
    check_cluster_size(c.cluster_size)
    check_reduce(shape, c, hw)


def check_reduce(shape: ChainShape, c: FusedChainConfig, hw: Hardware) -> None:
    """Raise :class:`ClusterError` unless ``c``'s inter-cluster reduce can run where it says."""
    if c.reduce not in REDUCES:
        raise ClusterError(f"reduce={c.reduce!r}: one of {', '.join(REDUCES)}")
    if c.reduce == "kernel":
        return
    groups = c.column_groups(shape)
    vectors = c.tile_outputs(shape) // 4
    parts = c.threads * (groups if c.reduce == "gathered" else 1)
    if vectors % parts:
        # the reduce's output stage is not predicated on the threads past the last vector
        raise ClusterError(f"an in-kernel reduce gives each of its {c.threads} threads"
                           f"{f' in each of {groups} shares' if c.reduce == 'gathered' else ''} the same "
                           f"number of 4-output vectors: {vectors} per tile")
    if c.reduce == "gathered":
        ctas = c.ctas(shape)
        resident = hw.concurrent_ctas(c.cluster_size, 1)
        if ctas > resident:
            raise ClusterError(f"a gathered reduce waits for every CTA of a tile: the {ctas} CTAs "
                               f"must all be resident at once (at most {resident} in clusters of "
                               f"{c.cluster_size})")


def _check_divisible(shape: ChainShape, c: FusedChainConfig, hw: Hardware) -> None:
    s = c.cluster_size
    if shape.m < TILE or shape.m % c.block_m:
        raise ClusterError(f"M={shape.m} is not a multiple of the {c.block_m} tile (or below 32)")
    if shape.n % (c.block_n * c.n_steps):
        raise ClusterError(f"N={shape.n} is not a multiple of {c.n_steps} steps of {c.block_n}")
    if shape.l % s or shape.l // s % (TILE * c.warps_n):
        raise ClusterError(f"L={shape.l} does not split over {s} CTAs into 16-column fragments "
                           f"of {c.warps_n} warps")
    if c.block_n % (TILE * c.warps_n) or c.block_m % (TILE * c.warps_m) or c.block_k % TILE:
        raise ClusterError(f"tiles {c.block_m}x{c.block_n}x{c.block_k} do not split into 16x16 "
                           f"fragments over {c.warps_m}x{c.warps_n} warps")
    if shape.k % (s * c.block_k):
        raise ClusterError(f"K={shape.k} is not a multiple of {s} CTAs x {c.block_k}")
    lanes, threads = VECTOR // 2, c.threads
    for what, elements, per in (("a tile of H", c.block_m * c.block_n, 4),
                                ("an A tile", c.block_m * c.block_k, lanes),
                                ("a W1 tile", c.block_n * c.block_k, lanes),
                                ("a W2 tile", shape.l // s * c.block_n, lanes)):
        if elements % (threads * per):
            raise ClusterError(f"{what} is not a whole number of 16-byte vectors for "
                               f"{threads} threads")


def _check_pipeline(shape: ChainShape, c: FusedChainConfig, hw: Hardware) -> None:
    check_pipeline(shape.k // (c.cluster_size * c.block_k), c.stages, c.tma)


def _check_copy(shape: ChainShape, c: FusedChainConfig, hw: Hardware) -> None:
    if shape.gated and not shape.w1_nk:
        # compiled, not yet run against a reference on a GPU: its chain runs as two GEMMs
        raise ClusterError("a gated chain over weights stored [K, N] is not fused; its GEMMs run apart")
    if c.tma:
        check_tma(first_gemm(shape), c.main_loop())


def _check_capacity(shape: ChainShape, c: FusedChainConfig, hw: Hardware) -> None:
    columns = shape.l // c.cluster_size
    registers = c.block_m // c.warps_m * columns // c.warps_n // 32
    if registers > _MAX_ACCUMULATOR_REGISTERS:
        raise ClusterError(f"the {c.block_m}x{columns} output slice needs {registers} fp32 "
                           f"registers per thread (at most {_MAX_ACCUMULATOR_REGISTERS})")
    if c.shared_bytes(shape) > hw.smem_per_cta:
        raise ClusterError(f"{c.shared_bytes(shape)} B of shared memory per CTA exceeds the "
                           f"{hw.smem_per_cta} B a CTA of the GPU may use")


#: The pruning rules in the order they apply (FlashFuser's: one cluster for both GEMMs of at
#: most 16 CTAs; divisible tiles; no tensor above its level's capacity; plus the pipeline's
#: depth). GEMM0's reduction innermost and L split only inside a cluster hold by construction.
#: Each takes the shape, the configuration and the GPU's description (for its capacities).
RULES = (("cluster", _check_cluster), ("divisible", _check_divisible),
         ("pipeline", _check_pipeline), ("copy", _check_copy), ("capacity", _check_capacity))


def check_chain_config(shape: ChainShape, config: FusedChainConfig, hw: Hardware) -> None:
    """Raise :class:`ClusterError` naming the first constraint ``config`` breaks for ``shape``
    on the GPU ``hw`` describes."""
    for _, rule in RULES:
        rule(shape, config, hw)


def schedule_fused_chain(func: tirx.PrimFunc, config: FusedChainConfig, hw: Hardware) -> s_tir.Schedule:
    """Schedule ``func`` (a GEMM chain, see :func:`find_chain`) as one fused cluster kernel plus
    the inter-cluster reduce, within ``hw``'s limits (:func:`tvm_dsm.planners.fused_chain.plan_chain`
    picks the config)."""
    sch = s_tir.Schedule(func)
    blocks, shape = find_chain(sch)
    check_chain_config(shape, config, hw)
    apply_fused_chain(sch, blocks, shape, config)
    return sch


def apply_fused_chain(sch: s_tir.Schedule, blocks: ChainBlocks, shape: ChainShape,
                      config: FusedChainConfig) -> None:
    """Schedule the chain's blocks of ``sch`` in place."""
    c, s = config, config.cluster_size
    groups = c.column_groups(shape)

    # GEMM0 splits K over the cluster: one partial tile per rank (per gate/up GEMM).
    partials = []
    for block in blocks.gemm0:
        _, _, k = sch.get_loops(block)
        k_rank, _ = sch.split(k, [s, None])
        partials.append(sch.rfactor(k_rank, factor_axis=0))

    # GEMM1 over N: clusters own column groups of H (rfactor: the inter-cluster partials).
    _, _, j = sch.get_loops(blocks.gemm1)
    j_group, _ = sch.split(j, [groups, None])
    gemm1 = sch.rfactor(j_group, factor_axis=0)
    i, p, j_group, j = sch.get_loops(gemm1)
    i_tile, i = sch.split(i, [None, c.block_m])
    p_rank, p = sch.split(p, [s, None])
    step, j = sch.split(j, [c.n_steps, c.block_n])
    sch.reorder(j_group, i_tile, p_rank, step, i, p, j)
    cluster = sch.fuse(j_group, i_tile)
    gemm1, fragment1 = blockize_fragments(sch, gemm1, [step], i, p, j)
    _, _, _, i, p, j = sch.get_loops(gemm1)
    warp_tile(sch, i, p, [j], c.warps_m, c.warps_n)  # j: GEMM1's 16-wide K steps in a step
    # W2's tile before the rank is bound: s_tir relaxes rank-bound loops like threadIdx and
    # would size (and copy) the tile for every rank's columns.
    stage_in_shared(sch, gemm1, 1, step, c.main_loop().warps, int(shape.w2_nk), c.block_n, rows=shape.l // s)
    bind_cluster_nest(sch, cluster, p_rank)

    # Per step: GEMM0's partials, the all-exchange into H, then GEMM1 on the H tile.
    sch.compute_at(blocks.combine, step, preserve_unit_loops=True)
    for block in blocks.gemm0:
        sch.compute_at(block, step, preserve_unit_loops=True)
    for partial in partials:
        sch.compute_at(partial, step, preserve_unit_loops=True)
    main_loops = []
    for partial in partials:
        rank, pi, pj, pk = sch.get_loops(partial)[-4:]
        partial, fragment0 = blockize_fragments(sch, partial, [rank], pi, pj, pk)
        main_loops.append((partial, fragment0, *sch.get_loops(partial)[-4:]))
    split_k_main_loops(sch, main_loops, first_gemm(shape), c.main_loop())
    _schedule_all_exchange(sch, blocks, c)

    caches = fragment_caches(sch, gemm1, j, sch.get_loops(gemm1)[1])
    rows, cols = sch.get_loops(caches[2])[-2:]
    warp_tile(sch, rows, cols, [], c.warps_m, c.warps_n)
    tensorize_fragments(sch, gemm1, fragment1, caches, step, shape.w2_nk,
                        mma.MMA_store_16x16_f32_global_INTRIN)
    _schedule_inter_cluster_reduce(sch, blocks, shape, c)
    if c.programmatic_launch:
        launch_programmatically(sch)


def _schedule_all_exchange(sch: s_tir.Schedule, blocks: ChainBlocks, c: FusedChainConfig) -> None:
    """Every CTA sums the cluster's partial tiles of GEMM0 and writes act(...) as 16-bit H into
    its own padded shared memory, where GEMM1's ldmatrix reads it."""
    loops = []
    for block in blocks.gemm0:
        peers, rows, cols = sch.get_loops(block)[-3:]
        loops.append((rows, cols, peers))
    sum_partials(sch, blocks.gemm0, [blocks.combine], loops, c.main_loop().warps)
    sch.set_scope(blocks.combine, 0, "shared.dyn")
    sch.storage_align(blocks.combine, 0, axis=-2, factor=32, offset=PAD)


def _schedule_inter_cluster_reduce(sch: s_tir.Schedule, blocks: ChainBlocks, shape: ChainShape,
                                   c: FusedChainConfig) -> None:
    """The inter-cluster reduce: each thread adds the column groups' fp32 partials of 4 outputs
    in group order, then runs the epilogue (cast) on them. In a second kernel over the whole
    grid (``reduce="kernel"``), or in the fused kernel (:mod:`tvm_dsm.transform.tile_reduce`)
    per output tile (``block_m`` rows of one rank's ``L / S`` columns): by the last CTA to
    finish the tile (``"last_cta"``), or by all the tile's CTAs, each its share, once all
    have written their partials (``"gathered"``)."""
    *inner, output = blocks.epilogue
    for stage in inner:
        sch.compute_inline(stage)
    sch.set_scope(blocks.gemm1, 0, "local")
    i, p, group = sch.get_loops(blocks.gemm1)
    p, vector = sch.split(p, [None, 4])
    groups = c.column_groups(shape)
    if c.reduce == "kernel":
        cta, thread = sch.split(sch.fuse(i, p), [None, c.threads])
        sch.reorder(cta, thread, group, vector)
        sch.bind(thread, "threadIdx.x")
    else:
        row_tile, i = sch.split(i, [None, c.block_m])
        rank, p = sch.split(p, [c.cluster_size, None])
        sch.reorder(row_tile, rank, i, p, group, vector)
        cta = sch.fuse(row_tile, rank)
        outputs = sch.fuse(i, p)
        if c.reduce == "gathered":
            share, outputs = sch.split(outputs, [groups, None])
            sch.bind(share, "blockIdx.y")
        rounds, warp, lane = sch.split(outputs, [None, c.warps_m * c.warps_n, 32])
        sch.bind(warp, "threadIdx.y")
        sch.bind(lane, "threadIdx.x")
        thread = lane
    sch.bind(cta, "blockIdx.x")
    sch.reverse_compute_at(output, thread)
    sch.vectorize(sch.get_loops(output)[-1])
    sch.vectorize(vector)
    sch.decompose_reduction(blocks.gemm1, group)
    if c.reduce != "kernel":
        if groups <= _UNROLLED_LOADS:
            sch.unroll(group)  # every group's load in flight at once
            if groups * sch.get(rounds).extent.value <= _UNROLLED_LOADS:
                sch.unroll(rounds)
        sch.annotate(cta, TILE_REDUCE_KEY, [shape.m // c.block_m, groups, int(c.reduce == "gathered")])
