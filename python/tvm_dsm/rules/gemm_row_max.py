"""A GEMM whose output is reduced by a max over groups of rows, in one kernel (Sparton's LM-head
max: ``Y[b, v] = max_s act(H[b, s] . W[v])``): the ``M x N`` matrix is never stored.

The matmul runs as the cluster split-K GEMM's main loop (tvm_dsm.rules.split_k_gemm) with
cluster size 1; its elementwise epilogue writes the CTA's ``block_m x block_n`` tile of
activations into shared memory instead of global memory, and the max block, computed at the
CTA's tile, reduces each column over the rows of each group (one thread per output, serial
over the group's rows, reading conflict-free rows of the tile). A tile must hold whole groups,
so the rows of one sequence never leave their CTA: ``block_m`` is a multiple of the group.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.schedule import SBlockRV

from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import reduced_values, uses
from .split_k_gemm import GemmShape, SplitKGemmConfig, apply_split_k_gemm, check_config, find_gemm_operands


def find_gemm_row_max(sch: s_tir.Schedule) -> tuple[SBlockRV, list[SBlockRV], SBlockRV, GemmShape, int]:
    """``(matmul, elementwise epilogue, max block, shape, group)``: ClusterError names what
    does not fit (one matmul block first, elementwise blocks, then a max over row groups
    ``Y[b, j] = max_s E[b * group + s, j]`` as the last block)."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]
    if len(blocks) < 3:
        raise ClusterError(f"a GEMM row max needs a matmul, an epilogue and a max block; got {names}")
    shape, _ = find_gemm_operands(sch.get(blocks[0]))
    last = sch.get(blocks[-1])
    for b in blocks[1:-1]:
        if any(int(iv.iter_type) != tirx.IterVar.DataPar for iv in sch.get(b).iter_vars):
            raise ClusterError(f"{sch.get(b).name_hint}: the blocks between the matmul and the max "
                               "must be elementwise")
    kinds = [int(iv.iter_type) for iv in last.iter_vars]
    body = last.body
    is_max = isinstance(body, tirx.BufferStore) and isinstance(body.value, tirx.Max)
    if kinds != [tirx.IterVar.DataPar, tirx.IterVar.DataPar, tirx.IterVar.CommReduce] or not is_max:
        raise ClusterError(f"{last.name_hint}: expected Y[b, j] = max over s of E[b * group + s, j]")
    groups, n, group = (int(iv.dom.extent) for iv in last.iter_vars)
    if groups * group != shape.m or n != shape.n:
        raise ClusterError(f"{last.name_hint} reduces {groups} groups of {group} rows x {n} columns "
                           f"of a {shape.m}x{shape.n} product")
    return blocks[0], list(blocks[1:-1]), blocks[-1], shape, group


def check_row_max_config(shape: GemmShape, group: int, config: SplitKGemmConfig, hw: Hardware) -> None:
    """The GEMM's constraints, plus: no K split (a tile's rows stay in one CTA), whole groups
    per tile, the activation tile beside the pipeline in shared memory."""
    check_config(shape, config, hw)
    if config.cluster_size != 1:
        raise ClusterError(f"cluster {config.cluster_size}: a row max keeps a tile's rows in one "
                           "CTA, so K is not split")
    if config.block_m % group:
        raise ClusterError(f"block_m {config.block_m} does not hold whole groups of {group} rows "
                           "(a sequence longer than the tile needs a cluster max: not built)")
    needed = config.shared_bytes() + config.block_m * config.block_n * 4
    if needed > hw.smem_per_cta:
        raise ClusterError(f"{needed} B of shared memory (pipeline, partial and activation "
                           f"tiles) exceeds the {hw.smem_per_cta} B a CTA of the GPU may use")


def schedule_gemm_row_max(func: tirx.PrimFunc, config: SplitKGemmConfig, hw: Hardware) -> s_tir.Schedule:
    """Schedule ``func`` (matmul, elementwise epilogue, max over row groups) as one kernel
    within ``hw``'s limits."""
    sch = s_tir.Schedule(func)
    matmul, epilogue, reduce, shape, group = find_gemm_row_max(sch)
    check_row_max_config(shape, group, config, hw)
    # Every thread works: with fewer outputs than threads, `share` threads per output each
    # reduce a slice of its rows (rfactor, while the max is still a nest of its own), and the
    # output takes the max of their maxima.
    share = max(1, config.threads * group // (config.block_m * config.block_n))
    partial = None
    if share > 1:
        part, _ = sch.split(sch.get_loops(reduce)[-1], [share, None])
        partial = sch.rfactor(part, factor_axis=0)
    apply_split_k_gemm(sch, [matmul], epilogue, shape, config)
    tile = sch.get_loops(matmul)[0]  # the CTA's (block_m, block_n) tile
    sch.set_scope(epilogue[-1], 0, "shared.dyn")
    if partial is not None:
        sch.reverse_compute_at(partial, tile, preserve_unit_loops=True)
        sch.set_scope(partial, 0, "shared")
        _max_on_threads(sch, partial, _spatial_loops(sch, partial), config)
        sch.reverse_compute_at(reduce, tile, preserve_unit_loops=True)
        # fewer outputs than threads: a predicated block, its max kept where it is stored
        _bind_threads(sch, _spatial_loops(sch, reduce), config)
    else:
        sch.reverse_compute_at(reduce, tile, preserve_unit_loops=True)
        _max_on_threads(sch, reduce, _spatial_loops(sch, reduce), config)
    return sch


def _spatial_loops(sch: s_tir.Schedule, block: SBlockRV) -> list:
    """The loops inside the tile that the block's reduction iterator does not use (loop order
    after reverse_compute_at follows the consumed region, not the block's iterators)."""
    loops = sch.get_loops(block)[1:]
    reduced = reduced_values(sch, block)
    return [loop for loop in loops if not any(uses(v, sch.get(loop).loop_var) for v in reduced)]


def _bind_threads(sch: s_tir.Schedule, loops: list, config: SplitKGemmConfig):
    """Fuse ``loops`` and spread them over the CTA's (warps, 32) threads (the main loop's
    thread shape: UnifyThreadBinding needs equal extents); the thread loop."""
    _, warp, thread = sch.split(sch.fuse(*loops), [None, config.warps, 32])
    sch.bind(warp, "threadIdx.y")
    sch.bind(thread, "threadIdx.x")
    return thread


def _max_on_threads(sch: s_tir.Schedule, block: SBlockRV, loops: list, config: SplitKGemmConfig) -> None:
    """One thread per output of ``block`` (as many outputs as a multiple of the threads, so no
    predicate: a cached block's write-back would not inherit one), its running max in a
    register, stored once."""
    thread = _bind_threads(sch, loops, config)
    sch.reverse_compute_at(sch.cache_write(block, 0, "local"), thread)
