"""Per-token FP8 quantization fused into the cluster split-K GEMM, the rounding honoured.

``amax[i] = max_k |X[i, k]|; Xq = e4m3(X * 448 / amax); Y = (Xq @ Wq^T) * amax/448 * sw[j]`` is a
cascaded reduction (the GEMM's K loop reads the row max over the same K). RedFuser fuses it into
one loop by quantizing each K tile with the running max and rescaling the accumulator, which
rounds differently from the function (early tiles use a smaller scale). This rule computes the
function exactly, in one kernel with two passes over each CTA's K slice:

1. the row max: CTA r of a cluster takes the max of its K slice of the tile's rows (lanes along
   K, coalesced, then over the lanes in shared memory), publishes it in its DSM slice, and every
   CTA combines the S slices after the cluster barrier: the exact per-token max;
2. the GEMM main loop of :mod:`tvm_dsm.rules.split_k_gemm`, where X's fp16 tiles arrive by
   cp.async and are quantized in shared memory one pipeline step before their fp8 fragments
   feed ``mma.sync.m16n8k32.e4m3``; the reduce-scatter's epilogue applies both scales.

The second read of the slice mostly hits L2 (X is M x K fp16, re-read by every column of tiles).

:func:`schedule_quantize_then_gemm` computes the same function in two kernels instead: one CTA
per row takes the row max and writes the quantized row (fp8) and its max to global memory, then
the fp8 GEMM reads Xq by TMA on warpgroup MMAs, launched programmatically behind the first.
The fused kernel repeats the row max and the quantization for every column of tiles and
cannot use TMA or wgmma (its X tiles are computed in shared memory); on the H100 the two
kernels ran 2.1-3.6x faster (best against best) on every shape of the fp8 suite
(bench/results/fp8/latest.json), so they are the pick.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import is_reduction
from ..schedule import bind_cluster_nest, bind_rank, place_in_dsm
from .split_k_gemm import (
    GemmShape,
    SplitKGemmConfig,
    apply_split_k_gemm,
    check_config,
    check_epilogue_in_shared,
    find_gemm_operands,
    split_k_main_loops,
    sum_partials,
)
from ..intrin.mma import FP8, VECTOR, accumulator_tile_bytes, pad
from .tensor_core import blockize_fragments


def find_quantized_gemm(sch: s_tir.Schedule) -> tuple[dict, GemmShape]:
    """The blocks (``row_max``, ``scales`` (per-row elementwise blocks on the row max),
    ``quantize``, ``gemm``, ``epilogue``) and the GEMM's shape; ClusterError names the part of
    the pattern that differs."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]
    gemms = [i for i, b in enumerate(blocks) if is_reduction(sch.get(b))]
    if len(gemms) != 2 or gemms[0] != 0 or gemms[1] + 1 >= len(blocks):
        raise ClusterError(f"a quantized GEMM is a row max, per-row scales, the quantization, the "
                           f"GEMM and its epilogue; got {names}")
    row_max, quantize, gemm = (sch.get(blocks[i]) for i in (0, gemms[1] - 1, gemms[1]))
    shape, (xq, _) = find_gemm_operands(gemm)
    if shape.dtype != FP8 or not xq.same_as(quantize.writes[0].source):
        raise ClusterError(f"{names[gemms[1]]} must multiply the fp8 output of "
                           f"{names[gemms[1] - 1]} by an fp8 weight")
    if not isinstance(row_max.body.value, tirx.Max) or len(row_max.iter_vars) != 2:
        raise ClusterError(f"{names[0]} must be a max over K per row")
    (source,) = {r.source for r in row_max.reads if not r.source.same_as(row_max.writes[0].source)}
    if str(source.ty.dtype) != "float16" or source not in {r.source for r in quantize.reads}:
        raise ClusterError(f"{names[gemms[1] - 1]} must quantize {names[0]}'s float16 input")
    scales = blocks[1:gemms[1] - 1]
    if any(len(sch.get(b).iter_vars) != 1 for b in scales):
        raise ClusterError(f"{[names[i] for i in range(1, gemms[1] - 1)]} must be per-row scales")
    return {"row_max": blocks[0], "scales": scales, "quantize": blocks[gemms[1] - 1],
            "gemm": blocks[gemms[1]], "epilogue": blocks[gemms[1] + 1:]}, shape


def shared_bytes(config: SplitKGemmConfig) -> int:
    """Dynamic shared memory per CTA: the fp16 X and fp8 W tiles of every stage, the fp8 X tile
    of two steps (quantized one step before use), or the fp32 partial tile; plus the CTA's
    rows of the summed tile (counted apart: the pool's reuse is not promised)."""
    c = config
    row = c.block_k + pad(FP8)  # bytes per fp8 row; an fp16 row is twice that
    operands = c.stages * (2 * c.block_m + c.block_n) * row + 2 * c.block_m * row
    return max(operands, accumulator_tile_bytes(c.block_m, c.block_n)) + c.block_m // c.cluster_size * c.block_n * 4


def check_quantized_config(shape: GemmShape, config: SplitKGemmConfig, hw: Hardware) -> None:
    """:func:`check_config` plus what the quantization adds; ClusterError names what fails."""
    check_config(shape, config, hw)
    c = config
    if c.tma:
        raise ClusterError("the fused quantization computes X's tiles in shared memory from "
                           "cp.async copies of the fp16 input; TMA operand copies are not supported")
    if (VECTOR // 2) * 32 * c.cluster_size > shape.k:
        raise ClusterError(f"K={shape.k} gives a CTA fewer than 32 lanes x 8 elements of each row")
    if c.block_m % c.warps:
        raise ClusterError(f"the row max spreads {c.block_m} rows over {c.warps} warps")
    if shared_bytes(c) > hw.smem_per_cta:
        raise ClusterError(f"{shared_bytes(c)} B of shared memory per CTA (fp16 and fp8 X tiles) "
                           f"exceeds the {hw.smem_per_cta} B a CTA of the GPU may use")


def schedule_quantized_gemm(func: tirx.PrimFunc, config: SplitKGemmConfig, hw: Hardware) -> s_tir.Schedule:
    """Schedule ``func`` (row max, scale, quantize, fp8 GEMM, epilogue) as one cluster kernel
    within ``hw``'s limits."""
    sch = s_tir.Schedule(func)
    blocks, shape = find_quantized_gemm(sch)
    row_max, quantize, gemm = blocks["row_max"], blocks["quantize"], blocks["gemm"]
    check_quantized_config(shape, config, hw)
    c, s = config, config.cluster_size
    *inner_epilogue, output = blocks["epilogue"]
    for stage in inner_epilogue:
        sch.compute_inline(stage)
    k_rank, _ = sch.split(sch.get_loops(gemm)[-1], [s, None])
    partial = sch.rfactor(k_rank, factor_axis=0)
    # Anchored at the output (the row max reaches it directly and through the GEMM, and s_tir
    # moves a block only next to its already placed consumers): CTA r of a cluster writes rows
    # r*block_m/S.. of the tile, everything else is computed at the cluster loop before.
    i, j = sch.get_loops(output)
    i_tile, i_in = sch.split(i, [None, c.block_m])
    j_tile, j_in = sch.split(j, [None, c.block_n])
    i_rank, i_row = sch.split(i_in, [s, None])
    sch.reorder(i_tile, j_tile, i_rank, i_row, j_in)
    cluster = sch.fuse(i_tile, j_tile)
    sch.compute_at(gemm, i_rank, preserve_unit_loops=True)
    row_maxes = _split_row_max(sch, row_max, shape, c)
    for block in (partial, quantize, *blocks["scales"], *reversed(row_maxes)):
        sch.compute_at(block, cluster, preserve_unit_loops=True)
    for scale in blocks["scales"]:  # once per row, in shared memory
        sch.set_scope(scale, 0, "shared")
        _row_per_thread(sch, sch.get_loops(scale)[-1], c.warps)
    bind_cluster_nest(sch, cluster, i_rank)
    rank, p_i, p_j, p_k = sch.get_loops(partial)[-4:]
    partial, fragment = blockize_fragments(sch, partial, [rank], p_i, p_j, p_k)
    split_k_main_loops(sch, [(partial, fragment, *sch.get_loops(partial)[-4:])], shape, c, quantize)
    peers, rows, cols = sch.get_loops(gemm)[-3:]
    sum_partials(sch, [gemm], [output], [(rows, cols, peers)], c.warps, in_registers=False)
    # The sums' tile in shared memory holds the CTA's own rows only (s_tir sizes it for all).
    sch.transform_layout(gemm, ("write", 0), lambda i, j: (i % (c.block_m // s), j % c.block_n),
                         assume_injective_transform=True)
    _schedule_row_max(sch, row_maxes, c)
    return sch


#: Threads of the quantization kernel (one CTA per row) and the elements each handles at once.
QUANTIZE_THREADS = 256
QUANTIZE_VECTOR = 4  # CUDA has float4 and fp8x4 types


def schedule_quantize_then_gemm(func: tirx.PrimFunc, config: SplitKGemmConfig, hw: Hardware) -> s_tir.Schedule:
    """Schedule ``func`` (row max, scale, quantize, fp8 GEMM, epilogue) as two kernels (see the
    module docstring); ``config``: the fp8 GEMM's, e.g. :func:`~tvm_dsm.planners.split_k_gemm.
    plan_split_k_gemm`'s pick for the fp8 shape."""
    sch = s_tir.Schedule(func)
    blocks, shape = find_quantized_gemm(sch)
    row_max, quantize = blocks["row_max"], blocks["quantize"]
    if shape.k % (QUANTIZE_THREADS * QUANTIZE_VECTOR):
        raise ClusterError(f"K={shape.k}: the quantization kernel takes rows of a multiple of "
                           f"{QUANTIZE_THREADS * QUANTIZE_VECTOR} elements")
    check_config(shape, config, hw)
    check_epilogue_in_shared(shape, config, "the GEMM kernel", hw)
    # The GEMM's epilogue reads what the first kernel computes: its own thread loops.
    apply_split_k_gemm(sch, [blocks["gemm"]], blocks["epilogue"], shape, config, in_registers=False)
    # ... including the row max, which the first kernel keeps in shared memory: a global copy.
    output = blocks["epilogue"][-1]
    amax = sch.get(row_max).writes[0].source
    index = [r.source.same_as(amax) for r in sch.get(output).reads].index(True)
    copy = sch.cache_read(output, index, "global", consumer_blocks=[output])
    row, k = sch.get_loops(row_max)
    sch.bind(row, "blockIdx.x")
    _, lanes, _ = sch.split(k, [None, QUANTIZE_THREADS, QUANTIZE_VECTOR])
    sch.bind(lanes, "threadIdx.x")  # each thread's max, then over the CTA (TVM's allreduce)
    sch.set_scope(row_max, 0, "shared")
    for block in (*blocks["scales"], copy, quantize):
        sch.reverse_compute_at(block, row)
    for scale in blocks["scales"]:
        sch.set_scope(scale, 0, "shared")
    _, lanes, vector = sch.split(sch.get_loops(quantize)[-1], [None, QUANTIZE_THREADS, QUANTIZE_VECTOR])
    sch.bind(lanes, "threadIdx.x")
    sch.vectorize(vector)
    return sch


def _split_row_max(sch: s_tir.Schedule, row_max: SBlockRV, shape: GemmShape,
                   c: SplitKGemmConfig) -> list[SBlockRV]:
    """Factor the row max (before any block moves: rfactor copies the loops above the block)
    into ``[per lane, per CTA, over peers]``: lane l of CTA r takes the max of columns
    ``(t*32 + l)*chunk + v`` of r's K slice, the CTA's partial goes to its DSM slice."""
    _, k = sch.get_loops(row_max)
    rank, k = sch.split(k, [c.cluster_size, None])
    per_cta = sch.rfactor(rank, factor_axis=0)  # [rank, row]
    # Loads in flight: a lane loads up to 4 vectors of a row before it takes their max (one at
    # a time, each load waits out L2's latency: measured 3x the whole GEMM's time).
    chunk = math.gcd(shape.k // c.cluster_size // (32 * VECTOR // 2), 4) * VECTOR // 2
    lane = sch.split(sch.get_loops(per_cta)[-1], [None, 32, chunk])[1]
    per_lane = sch.rfactor(lane, factor_axis=0)  # [lane, rank, row]
    return [per_lane, per_cta, row_max]


def _schedule_row_max(sch: s_tir.Schedule, blocks: list[SBlockRV], c: SplitKGemmConfig) -> None:
    """Threads of the three row-max stages (placed at the cluster loop): no cross-thread
    reduction (TVM's allreduce lowering fails inside a cluster binding); each thread takes the
    max of a few values in a register and stores it once."""
    per_lane, per_cta, row_max = blocks
    # Per lane: lanes along K (coalesced 16-byte loads), rows over warps; one CTA's rank only.
    lane, rank, rows, k_out, chunk = sch.get_loops(per_lane)[-5:]
    warp, rows = sch.split(rows, [c.warps, None])
    sch.reorder(rank, warp, lane, rows, k_out, chunk)
    bind_rank(sch, rank)
    sch.bind(warp, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    loaded = sch.cache_read(per_lane, 0, "local", consumer_blocks=[per_lane])
    sch.compute_at(loaded, k_out)
    vectors, vector = sch.split(sch.get_loops(loaded)[-1], [None, VECTOR // 2])
    sch.vectorize(vector)
    sch.unroll(vectors)
    sch.unroll(chunk)
    sch.set_scope(per_lane, 0, "shared")
    sch.transform_layout(per_lane, ("write", 0), lambda lane, rank, row: (lane, row % c.block_m),
                         assume_injective_transform=True)
    _in_register(sch, per_lane, rows)
    # Per CTA (over its lanes, into its DSM slice), then over the peers' slices: a row a thread.
    lanes, rank, rows = sch.get_loops(per_cta)[-3:]
    sch.reorder(rank, rows, lanes)
    bind_rank(sch, rank)
    peers, rows = sch.get_loops(row_max)[-2:]
    sch.reorder(rows, peers)
    place_in_dsm(sch, per_cta, 0)
    sch.set_scope(row_max, 0, "shared")
    for block in (per_cta, row_max):
        _in_register(sch, block, _row_per_thread(sch, sch.get_loops(block)[-2], c.warps))


def _row_per_thread(sch: s_tir.Schedule, rows: LoopRV, warps: int) -> LoopRV:
    """One row a thread over the main loop's (32, warps) thread shape; the lane loop."""
    _, warp, lane = sch.split(rows, [None, warps, 32])
    sch.bind(warp, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    return lane


def _in_register(sch: s_tir.Schedule, block: SBlockRV, at) -> None:
    """Accumulate ``block``'s max in a register within ``at``'s body, then store it once (a
    max accumulated in shared memory would need barriers inside the predicated row loops)."""
    store = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(store, at)
