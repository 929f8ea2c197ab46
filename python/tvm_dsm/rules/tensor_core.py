"""mma.sync building blocks shared by the GEMM-family rules (split-K GEMM, fused GEMM chains).

Each helper is one step of scheduling a matmul block onto tensor cores with TVM's own intrinsics
(ldmatrix, mma.sync m16n8k16 issued as 16x16x16, fragment stores): cut the block into 16x16x16
fragments, spread them over warps, stage operand tiles in padded shared memory with 16-byte
copies (cp.async once the loop is pipelined), and tensorize the fragment loads, the multiply,
the accumulator fill and store. The rules compose them around their own data movement.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from ..intrin.mma import (ACCUMULATOR_PAD, MMA_STORE_F32_DSM, MMA_STORE_I32_DSM, TILE, VECTOR, element_bytes,
                          fill_intrinsic, fragment_map, k_tile, library, operand_intrinsics, operand_map, pad)
from ..schedule import place_in_dsm
from ..annotations import TMA_COPY_KEY


def operand_dtype(block: tirx.SBlock) -> str:
    """The element type of the first buffer ``block`` reads besides the one it writes."""
    written = block.writes[0].source
    return next(str(r.source.ty.dtype) for r in block.reads if not r.source.same_as(written))


def fragment_tile(sch: s_tir.Schedule, block: SBlockRV, cols_tile: int = TILE) -> LoopRV:
    """Tile the block's two innermost loops into 16 x ``cols_tile`` fragments; the row loop."""
    rows, cols = sch.get_loops(block)[-2:]
    rows, rows_in = sch.split(rows, [None, TILE])
    cols, cols_in = sch.split(cols, [None, cols_tile])
    sch.reorder(rows, cols, rows_in, cols_in)
    return rows_in


def blockize_fragments(sch: s_tir.Schedule, block: SBlockRV, outer: list[LoopRV],
                       i: LoopRV, j: LoopRV, k: LoopRV,
                       warpgroup: tuple[int, int] | None = None) -> tuple[SBlockRV, str]:
    """Cut the matmul loops ``i, j, k`` into 16x16x16 fragments (``outer`` loops stay outside),
    or into a warp's 16 x N x K share of a warpgroup MMA for ``warpgroup = (N, K)``. Returns
    the block over fragments and the name of the per-fragment block inside it."""
    cols, depth = warpgroup or (TILE, k_tile(operand_dtype(sch.get(block))))
    i, i_tc = sch.split(i, [None, TILE])
    j, j_tc = sch.split(j, [None, cols])
    k, k_tc = sch.split(k, [None, depth])
    sch.reorder(*outer, i, j, k, i_tc, j_tc, k_tc)
    name = sch.get(block).name_hint
    return sch.blockize(i_tc), name


def warp_tile(sch: s_tir.Schedule, i: LoopRV, j: LoopRV, k_loops: list[LoopRV],
              warps_m: int, warps_n: int, bind: bool = True) -> tuple[LoopRV, LoopRV, LoopRV]:
    """Spread fragment rows and columns over ``warps_m x warps_n`` warps (``threadIdx.y``,
    unless ``bind=False``: the caller binds the warp loop once it has merged it with another);
    each warp then walks ``k_loops`` outside its own fragments. Returns (warp, rows, cols)."""
    i_warp, i_frag = sch.split(i, [warps_m, None])
    j_warp, j_frag = sch.split(j, [warps_n, None])
    sch.reorder(i_warp, j_warp, *k_loops, i_frag, j_frag)
    warp = sch.fuse(i_warp, j_warp)
    if bind:
        sch.bind(warp, "threadIdx.y")
    return warp, i_frag, j_frag


def stage_in_shared(sch: s_tir.Schedule, block: SBlockRV, index: int, at: LoopRV, warps: int,
                    k_axis: int, block_k: int, rows: int | None = None,
                    tma: bool = False, consumers: list[SBlockRV] | None = None) -> SBlockRV:
    """Copy the tile of operand ``index`` that ``at``'s body reads into shared memory. The
    layout keeps only ``k % block_k`` of axis ``k_axis`` of the last two (and ``% rows`` of the
    other one if given), so the buffer holds one tile whichever step or cluster rank reads it
    (s_tir sizes buffers over all ranks otherwise).

    By default the threads copy 16-byte vectors (cp.async once pipelined) into rows padded
    against bank conflicts. ``tma``: the copy stays one unpadded tile, marked for
    :mod:`tvm_dsm.transform.tma_pipeline`, which issues it as TMA tensor copies (one a 128-byte
    panel) into a 128-byte-swizzled layout (bank-conflict free without padding). ``consumers``: the blocks
    reading the tile (default: ``block`` alone), e.g. two products of one X in one loop."""
    cache = sch.cache_read(block, index, "shared.dyn", consumer_blocks=consumers or [block])
    sch.compute_at(cache, at)
    dtype = str(sch.get(cache).writes[0].source.ty.dtype)
    if tma:
        sch.annotate(cache, TMA_COPY_KEY, 1)
    else:
        fused = sch.fuse(*sch.get_loops(cache)[-2:])
        _, ty, tx, vector = sch.split(fused, [None, warps, 32, VECTOR // element_bytes(dtype)])
        sch.bind(tx, "threadIdx.x")
        sch.bind(ty, "threadIdx.y")
        sch.vectorize(vector)

    def tile_local(*index):  # leading axes (a head) are fixed within one tile
        a, b = (index[-2], index[-1]) if k_axis == 1 else (index[-1], index[-2])
        a, b = (a if rows is None else a % rows), b % block_k
        return (a, b) if k_axis == 1 else (b, a)

    sch.transform_layout(cache, ("write", 0), tile_local, assume_injective_transform=True)
    if not tma:
        sch.storage_align(cache, 0, axis=-2, factor=32, offset=pad(dtype))
    return cache


def fragment_caches(sch: s_tir.Schedule, block: SBlockRV, k_frag: LoopRV,
                    accumulate_at: LoopRV, operands_in_registers: bool = True,
                    ) -> tuple[SBlockRV | None, SBlockRV | None, SBlockRV]:
    """Register fragments: both operands loaded per K step (unless a warpgroup MMA reads them
    from shared memory: ``operands_in_registers=False``), the accumulator held until it is
    stored after ``accumulate_at``'s body. Returns (x, w, accumulator) cache blocks (None for
    an operand left in shared memory)."""
    x_frag = w_frag = None
    if operands_in_registers:
        x_frag = sch.cache_read(block, 0, "warp", consumer_blocks=[block])
        w_frag = sch.cache_read(block, 1, "warp", consumer_blocks=[block])
        for cache in (x_frag, w_frag):
            sch.compute_at(cache, k_frag)
    accumulator = sch.cache_write(block, 0, "warp")
    sch.reverse_compute_at(accumulator, accumulate_at)
    return x_frag, w_frag, accumulator


def tensorize_fragments(sch: s_tir.Schedule, block: SBlockRV, fragment_name: str,
                        caches: tuple[SBlockRV | None, SBlockRV | None, SBlockRV], init_at: LoopRV,
                        weight_nk: bool, store_intrin: str,
                        wgmma: str | None = None) -> None:
    """ldmatrix, mma.sync, the accumulator fill (before ``init_at``) and ``store_intrin`` for the
    fragment caches; an accumulator stored to DSM is placed there, its rows padded
    (:data:`~tvm_dsm.intrin.mma.ACCUMULATOR_PAD`). ``wgmma``: the multiply is
    this warpgroup MMA intrinsic over N/16 fragments (:func:`tvm_dsm.intrin.wgmma.wgmma_intrin`),
    both operands read from shared memory."""
    library()  # registers tvm-dsm's intrinsics, the DSM store among them
    x_frag, w_frag, accumulator = caches
    dtype = operand_dtype(sch.get(block))
    accumulator_loop = fragment_tile(sch, accumulator)
    sch.decompose_reduction(block, init_at)
    init = sch.get_sblock(f"{fragment_name}_init")
    if wgmma is None:
        x_loop = fragment_tile(sch, x_frag, k_tile(dtype))
        w_loop = fragment_tile(sch, w_frag, k_tile(dtype) if weight_nk else TILE)
        sch.transform_layout(x_frag, ("write", 0), operand_map(dtype))
        sch.transform_layout(w_frag, ("write", 0), operand_map(dtype))
    sch.transform_layout(accumulator, ("read", 0), lambda *idx: (*idx[:-2], *fragment_map(*idx[-2:])))
    if wgmma is None:
        load_x, load_w, multiply = operand_intrinsics(dtype, weight_nk)
        sch.tensorize(x_loop, load_x)
        sch.tensorize(w_loop, load_w)
    else:
        multiply = wgmma
        fragment_tile(sch, init)  # the fill goes 16x16 fragment by fragment
    sch.tensorize(sch.get_loops(sch.get_sblock(fragment_name))[-3], multiply)
    sch.tensorize(sch.get_loops(init)[-2], fill_intrinsic(dtype))
    if store_intrin not in (MMA_STORE_F32_DSM, MMA_STORE_I32_DSM):
        sch.tensorize(accumulator_loop, store_intrin)
        return
    place_in_dsm(sch, accumulator, 0)
    tile = sch.get(accumulator).writes[0].source
    around = _loop_around(sch, accumulator, accumulator_loop)
    sch.tensorize(accumulator_loop, store_intrin)
    # rows ACCUMULATOR_PAD floats apart, set on the block tensorize made (it keeps no annotation)
    stored = next(b for b in sch.get_child_blocks(around) if sch.get(b).writes[0].source.same_as(tile))
    sch.storage_align(stored, 0, axis=-2, factor=2 * ACCUMULATOR_PAD, offset=ACCUMULATOR_PAD)


def _loop_around(sch: s_tir.Schedule, block: SBlockRV, loop: LoopRV) -> LoopRV:
    """The loop directly around ``loop``, one of ``block``'s loops below the outermost."""
    loops = sch.get_loops(block)
    index = next(i for i, x in enumerate(loops) if sch.get(x).same_as(sch.get(loop)))
    return loops[index - 1]

