"""Cluster split-K GEMM on tensor cores: the main loop of every fused kernel.

``Y = epilogue(X @ W)``, fp16 inputs, fp32 accumulation (int8 inputs: int32). Each cluster owns a ``block_m x block_n``
tile of ``Y``; its ``S`` CTAs split K in S contiguous slices. A CTA streams its slices of ``X``
and ``W`` through a ``stages``-deep ``cp.async`` pipeline into swizzle-free padded shared memory,
loads fragments with ``ldmatrix`` and multiplies with ``mma.sync.m16n8k16`` (TVM's own tensor
intrinsics), then stores its fp32 partial tile into its slice of a DSM buffer. After the cluster
barrier, CTA r owns rows ``[r*block_m/S, (r+1)*block_m/S)`` of the tile (reduce-scatter): it adds
the S partials with 16-byte ``ld.shared::cluster.v4`` loads, starting at its own rank, applies
the epilogue (bias, activation, cast: the function's elementwise consumers) and writes ``Y``.
One kernel, no atomics, deterministic. M, N and K need not be multiples of the tiles: the kernel
computes whole tiles, zeros past the operands' edges, and stores only inside Y
(:func:`apply_padded_split_k_gemm`).

Why split K inside a cluster: at small M a GEMM has few output tiles (128 x 4096 in 128 x 128
tiles is 32 CTAs for 132 SMs); splitting K over S CTAs fills the machine while the partial
tiles stay on chip.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from dataclasses import dataclass, field

import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.schedule import LoopRV, SBlockRV

from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import computed_from, is_reduction, largest_power_of_two, loads, product_outputs, writes_parameter
from ..annotations import ASYNC_STAGES_KEY, COPIED_OPERANDS_KEY, RASTER_GROUP_KEY
from ..transform.buffers import element_offset
from ..transform.programmatic_launch import launch_programmatically
from ..transform.tma_pipeline import MAX_BOX as TMA_MAX_BOX
from ..transform.tma_pipeline import ROW_BYTES as TMA_ROW_BYTES
from ..transform.tma_pipeline import SLOT_ALIGN as TMA_SLOT_ALIGN
from ..annotations import TMA_STAGES_KEY
from ..schedule import bind_cluster_nest, bind_rank, check_cluster_size
from ..annotations import ROTATE_PEERS_KEY
from ..intrin.mma import (ACCUMULATOR_TYPES, FP8, INT8, OPERAND_TYPES, TILE, VECTOR, accumulator_tile_bytes,
                          dsm_store_intrinsic, element_bytes, k_tile, pad)
from ..intrin.wgmma import MAX_N as WGMMA_MAX_N
from ..intrin.wgmma import WARPGROUP_ROWS, wgmma_intrin
from .padded_gated_tiles import outputs_through_copies, pad_gated_to_tiles
from .tensor_core import blockize_fragments, fragment_caches, stage_in_shared, tensorize_fragments, warp_tile


@dataclass(frozen=True)
class SplitKGemmConfig:
    """A point of the schedule family's design space."""

    cluster_size: int  # CTAs that split K (1: no split)
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    warps_m: int = 2
    warps_n: int = 4
    stages: int = 3
    tma: bool = False  # operand tiles by TMA tensor copies (tvm_dsm.transform.tma_pipeline)
    #: warpgroup MMA (tvm_dsm.intrin.wgmma) instead of mma.sync: each warp multiplies 16 rows by
    #: the whole block_n, both operands read from TMA's swizzled tiles (warps_m = block_m / 16,
    #: warps_n = 1)
    wgmma: bool = False
    #: launch with programmatic dependent launch (tvm_dsm.transform.programmatic_launch): the
    #: planner sets it where the grid runs in one wave. Not part of the point's identity.
    programmatic_launch: bool = field(default=False, compare=False)

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def warpgroup(self) -> tuple[int, int] | None:
        """The (N, K) of each warp's share of a warpgroup MMA step, or None for mma.sync."""
        return (self.block_n, self.block_k) if self.wgmma else None

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def shared_bytes(self, dtype: str = "float16", products: int = 1, weight_nk: bool = True) -> int:
        """Dynamic shared memory per CTA: the operand pipeline, whose bytes the fp32 partial
        tiles take once the main loop is done (release_slice_starts). Gated products in one K
        loop (:func:`shared_k_loop`) stream every W tile beside X's, and their partial tiles are
        placed over the pipeline's buffers as TVM's allocator places them; in loops one after
        the other, each earlier partial tile is held next to the later pipelines."""
        tile = accumulator_tile_bytes(self.block_m, self.block_n)
        if shared_k_loop(self, products):
            freed = [self.slots(dtype, self.block_m)] + [self.slots(dtype, self.block_n, weight_nk)] * products
            return reused_shared_bytes([*freed, self.barrier_bytes], [tile] * products)
        later = self.pipeline_bytes(dtype, weight_nk=weight_nk) + (products - 1) * tile
        return max(later + (products - 1) * self.barrier_bytes, products * tile)

    def pipeline_bytes(self, dtype: str = "float16", products: int = 1, weight_nk: bool = True) -> int:
        """The operand tiles of every stage (X's, and W's of each of ``products`` streamed in one
        K loop, :func:`shared_k_loop`) and, for TMA, the stages' mbarriers."""
        streamed = products if shared_k_loop(self, products) else 1
        return (self.slots(dtype, self.block_m) + streamed * self.slots(dtype, self.block_n, weight_nk)
                + self.barrier_bytes)

    @property
    def barrier_bytes(self) -> int:
        """A TMA main loop's mbarriers: 8 bytes per stage, in 16-byte units."""
        return -(-8 * self.stages // 16) * 16 if self.tma else 0

    def slots(self, dtype: str, rows: int, k_last: bool = True) -> int:
        """One operand's ``rows x block_k`` tiles of every stage: for cp.async with the last
        axis (K, or ``rows`` for a ``[k, n]`` weight: ``k_last`` False) padded; unpadded
        (swizzled) for TMA, after up to 1024 bytes that align its first slot."""
        if self.tma:
            return self.stages * rows * self.block_k * element_bytes(dtype) + TMA_SLOT_ALIGN
        padded = rows * (self.block_k + pad(dtype)) if k_last else self.block_k * (rows + pad(dtype))
        return self.stages * padded * element_bytes(dtype)


def reused_shared_bytes(freed: list[int], allocated: list[int]) -> int:
    """Shared memory of a kernel whose buffers ``freed`` (bytes, in allocation order) are dead
    when buffers ``allocated`` are allocated, as TVM's shared-memory merge lays them out
    (MergeSharedMemoryAllocations' FindAlloc): a new buffer takes the smallest free one at
    least its size (up to 16 times it), else gathers free ones from the largest smaller one
    down until they hold it; what it takes becomes one block of the larger size."""
    free = sorted(freed)
    blocks = []
    for size in allocated:
        fitting = [b for b in free if size <= b <= 16 * size]
        if fitting:
            free.remove(fitting[0])
            blocks.append(fitting[0])
            continue
        taken = []
        for b in sorted((b for b in free if b < size), reverse=True):
            taken.append(b)
            if sum(taken) >= size:
                break
        for b in taken:
            free.remove(b)
        blocks.append(max(size, sum(taken)))
    return sum(blocks) + sum(free)


@dataclass(frozen=True)
class GemmShape:
    """What the rule found in the function: ``m x n x k``, ``W`` stored ``[n, k]`` or ``[k, n]``,
    both operands of type ``dtype``; ``products``: matmuls of that shape over the same ``X``
    computed side by side on each output tile; ``outputs``: 1 where one epilogue combines them
    (2 products: a gated layer, ``silu(X @ Wg^T) * (X @ Wu^T)``), else ``products``: sibling
    projections, each product's epilogue writing an output of its own (a layer's q, k and v);
    ``operands_copied``: the operands are zero-filled copies the function makes
    (:mod:`tvm_dsm.rules.aligned_rows`); ``batch``: independent products of that shape, one per
    index of leading batch axes (``torch.bmm``); ``shared_operand``: "x" where X has no batch
    axes, read by every product (an expert einsum's tokens)."""

    m: int | tirx.PrimExpr  # symbolic: rows known when the kernel runs (symbolic_rows)
    n: int
    k: int
    weight_nk: bool
    dtype: str = "float16"
    products: int = 1
    operands_copied: bool = False
    outputs: int = 1
    batch: int | tirx.PrimExpr = 1  # symbolic: the batch known when the kernel runs
    shared_operand: str | None = None

    @property
    def symbolic_rows(self) -> bool:
        """Whether M is an expression of the function's parameters (a batch or sequence length):
        the kernel computes whole tiles over it, as over an M off the tiles."""
        return not isinstance(self.m, int)


def _index_vars(region, offset_rows: bool = False) -> list:
    """The block variables indexing each dimension of ``region`` (None where not a plain var);
    ``offset_rows``: the first dimension's may also be a variable plus a constant (a fused
    weight's row range)."""
    found = [r.min if isinstance(r.min, tirx.Var) and int(r.extent) == 1 else None for r in region.region]
    first = region.region[0]
    if offset_rows and found[0] is None and int(first.extent) == 1 and isinstance(first.min, tirx.Add):
        var, offset = first.min.a, first.min.b
        if isinstance(var, tirx.Var) and isinstance(offset, tirx.IntImm) and offset.value >= 0:
            found[0] = var
    return found


def _indexed_by(found: list, expected) -> bool:
    """Whether the block variables ``found`` (:func:`_index_vars`) are ``expected``, in order."""
    return len(found) == len(expected) and all(a is not None and a.same_as(b) for a, b in zip(found, expected))


#: The operand types the split-K GEMM multiplies: the tensor cores' floating types (fp32 sums)
#: and int8 (exact int32 sums; mma.sync on cp.async tiles).
SPLIT_K_TYPES = (*OPERAND_TYPES, INT8)

#: The most sibling products (:class:`GemmShape`) one kernel computes side by side: a layer's
#: q, k and v.
MAX_SIBLINGS = 3


def find_gemm(sch: s_tir.Schedule, operand_types: Collection[str] = OPERAND_TYPES.keys(),
              batched: bool = False) -> tuple[list[SBlockRV], list[SBlockRV], GemmShape]:
    """The function's matmul block(s), their elementwise consumers (epilogue) and the shape
    (operands of one of ``operand_types``: by default the tensor cores').

    ClusterError names what does not fit: the rule needs one (i, j, k) reduction block reading
    ``X[i, k]`` and ``W[j, k]`` or ``W[k, j]`` (or several such blocks over the same ``X``: a
    gated layer's gate and up products, which the epilogue combines, or up to
    :data:`MAX_SIBLINGS` sibling products, each with an epilogue and output of its own), followed
    only by elementwise blocks (none: the matmul writes the output).
    """
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    reductions = [b for b in blocks if is_reduction(sch.get(b))]
    epilogue = list(blocks[len(reductions):])
    combined = len(reductions) == 2 and _combines(sch, reductions, epilogue)
    if (not 1 <= len(reductions) <= MAX_SIBLINGS or reductions != blocks[: len(reductions)]
            or (len(reductions) > 1 and not combined and not _separate_outputs(sch, reductions, epilogue))):
        raise ClusterError(
            "split-K GEMM expects one matmul block (or a gated layer's two over the same input, "
            f"then the epilogue combining them, or up to {MAX_SIBLINGS} over the same input, each "
            "with an epilogue and output of its own) first, then elementwise epilogue blocks; got "
            f"{[sch.get(b).name_hint for b in blocks]}"
        )
    outputs = [b for b in epilogue if not sch.get_consumers(b)]
    if len(reductions) == 1 and len(outputs) > 1:
        raise ClusterError(f"split-K GEMM writes one output from its product's epilogue; this product reaches "
                           f"{len(outputs)} ({[sch.get(b).name_hint for b in outputs]})")
    check_epilogue_reads_its_element(sch, reductions, epilogue)
    shape = gemm_products(sch, reductions, operand_types, batched and len(reductions) == 1)
    return reductions, epilogue, dataclasses.replace(shape, outputs=1 if combined else shape.products)


def _separate_outputs(sch: s_tir.Schedule, products: list[SBlockRV], epilogue: list[SBlockRV]) -> bool:
    """Whether each of ``products`` reaches an output of its own: each output written from one
    product (directly, or through ``epilogue`` blocks that each read at most one), and one
    output per product."""
    written = [sch.get(p).writes[0].source for p in products]
    found = computed_from(written, [sch.get(b) for b in epilogue])
    if any(len(of) > 1 for _, of in found):
        return False
    outputs = [b for b in [*products, *epilogue] if writes_parameter(sch.mod["main"], sch.get(b))]
    reached = [next(of for buffer, of in found if buffer.same_as(sch.get(b).writes[0].source)) for b in outputs]
    return sorted(i for of in reached for i in of) == list(range(len(products)))


def check_epilogue_reads_its_element(sch: s_tir.Schedule, products: list[SBlockRV], epilogue: list[SBlockRV]) -> None:
    """ClusterError where an epilogue block reads a product (or an earlier epilogue block's
    result) other than at the element it writes (``silu(c[i, j]) * c[i, j + n]``, gate and up
    columns of one product): a CTA's tile holds its own outputs only. A block that reads no
    product (a bias widened to fp32 before it is added, as Relax legalizes a torch Linear) is
    inlined into its readers with the rest of the epilogue, so its result is read anywhere."""
    computed = [sch.get(b).writes[0].source for b in products]
    for rv in epilogue:
        block = sch.get(rv)
        store = block.body
        if not isinstance(store, tirx.BufferStore):
            continue
        read = [load for load in loads(store.value) if any(load.source.same_as(b) for b in computed)]
        for load in read:
            if not (len(load.indices) == len(store.indices)
                    and all(tvm_ffi.structural_equal(a, b) for a, b in zip(load.indices, store.indices))):
                raise ClusterError(f"the epilogue {block.name_hint} reads {load.source.name}{list(load.indices)}, not the "
                                   f"element it writes ({list(store.indices)}): a CTA's tile holds its own outputs only")
        if read:
            computed.append(block.writes[0].source)


def _combines(sch: s_tir.Schedule, products: list[SBlockRV], epilogue: list[SBlockRV]) -> bool:
    """Whether an ``epilogue`` block computes from every one of ``products`` (through the
    epilogue blocks before it)."""
    written = [sch.get(p).writes[0].source for p in products]
    return any(len(of) == len(products) for _, of in computed_from(written, [sch.get(b) for b in epilogue]))


def gemm_products(sch: s_tir.Schedule, blocks: list[SBlockRV],
                  operand_types: Collection[str] = OPERAND_TYPES.keys(), batched: bool = False) -> GemmShape:
    """The shape of matmul ``blocks`` computed side by side on one output tile: one, or a gated
    layer's gate and up products, which must read the same ``X`` and have one shape."""
    found = [find_gemm_operands(sch.get(b), len(blocks) > 1, operand_types, batched) for b in blocks]
    shapes = {shape for shape, _ in found}
    if len(shapes) != 1 or any(not x.same_as(found[0][1][0]) for _, (x, _) in found):
        raise ClusterError(f"the gated products {[sch.get(b).name_hint for b in blocks]} must "
                           "read the same input and have one shape")
    return dataclasses.replace(shapes.pop(), products=len(blocks))


def find_gemm_operands(block: tirx.SBlock, fused_weight: bool = False,
                       operand_types: Collection[str] = OPERAND_TYPES.keys(),
                       batched: bool = False) -> tuple[GemmShape, tuple]:
    """Shape and operand buffers ``(X, W)`` of a matmul block ``Y[i, j] += X[i, k] * W[j|k, k|j]``
    with float32 accumulation, operands of one of ``operand_types`` (by default the tensor
    cores': float16, bfloat16, float8_e4m3fn); ClusterError names what
    differs. ``fused_weight``: W stored ``[n, k]`` may be read from a row on, ``W[c + j, k]``
    (a gated layer's gate and up products of one fused weight). ``batched``: the block may
    also be ``Y[b..., i, j] += X[b..., i, k] * W[b..., j|k, k|j]`` over batch axes ``b...``, or X
    without them (shared by every product)."""
    kinds = [int(iv.iter_type) for iv in block.iter_vars]
    spatial = len(kinds) - 1 if batched else 2
    if kinds != [tirx.IterVar.DataPar] * spatial + [tirx.IterVar.CommReduce] or spatial < 2:
        expected = " or (b..., i, j, k)" if batched else ""
        raise ClusterError(f"split-K GEMM expects iterators (i, j, k){expected}, got {kinds} in {block.name_hint}")
    *batch_vars, i, j, k = (iv.var for iv in block.iter_vars)
    *batch, m, n, depth = (iv.dom.extent for iv in block.iter_vars)
    # a symbolic batch (a model's batch size) is planned per range of its values, as a symbolic M
    batch = math.prod(int(b) if isinstance(b, tirx.IntImm) else b for b in batch)
    if not isinstance(n, tirx.IntImm) or not isinstance(depth, tirx.IntImm):
        raise ClusterError(f"{block.name_hint}: split-K GEMM takes a symbolic M or batch only; N={n} and "
                           f"K={depth} must be constants")
    m = int(m) if isinstance(m, tirx.IntImm) else m
    n, depth = int(n), int(depth)
    operands = [r for r in block.reads if not r.source.same_as(block.writes[0].source)]
    if len(operands) != 2:
        raise ClusterError(f"{block.name_hint} is not a product of two operands")
    x, w = operands
    dtypes = {str(x.source.ty.dtype), str(w.source.ty.dtype)}
    operand = next(iter(dtypes))
    accumulator = str(block.writes[0].source.ty.dtype)
    wanted = ACCUMULATOR_TYPES.get(operand, "float32" if "float" in operand else None)  # fp32: the CUDA cores'
    if len(dtypes) == 1 and wanted is not None and accumulator != wanted:
        raise ClusterError(f"{block.name_hint} sums its {operand} products in {accumulator}; "
                           f"the GEMM families sum them in {wanted}")
    x_vars, w_nk_vars, w_vars = _index_vars(x), _index_vars(w, offset_rows=fused_weight), _index_vars(w)
    shared = None
    if batch_vars:  # each operand indexed [b..., ...] by the batch axes, or one by none (shared)
        axes = len(batch_vars)
        by_batch = [len(v) == axes + 2 and _indexed_by(v[:axes], batch_vars) for v in (x_vars, w_vars)]
        if not any(by_batch):
            raise ClusterError(f"{block.name_hint}: neither operand is indexed [b..., ...] by the batch axes")
        if by_batch == [True, False]:
            raise ClusterError(f"{block.name_hint}: the batch axes index X and the output alone: they are rows of "
                               "one GEMM (tvm_dsm.transform.rows_as_matrix), not a batch")
        x_vars = x_vars[axes * by_batch[0]:]
        w_nk_vars, w_vars = w_nk_vars[axes * by_batch[1]:], w_vars[axes * by_batch[1]:]
        shared = None if all(by_batch) else "x"
        if shared:  # the shared tokens may keep unit axes in front ([1, S, K] read at [0, s, k])
            x_vars = x_vars[_leading_unit_axes(x):]
    if not _indexed_by(x_vars, (i, k)):
        raise ClusterError(f"{block.name_hint}: the first operand must be indexed [i, k]")
    weight_nk = _indexed_by(w_nk_vars, (j, k))
    if not weight_nk and not _indexed_by(w_vars, (k, j)):
        raise ClusterError(f"{block.name_hint}: the second operand must be indexed [j, k] or [k, j]")
    offset = [f"{r.source.name} (elem_offset {element_offset(r.source)})" for r in (x, w)
              if element_offset(r.source) is not None]
    if offset:
        raise ClusterError(f"{block.name_hint}: {', '.join(offset)}: the GEMM families' tensor-core operands are "
                           "addressed in shared memory as if their tensor started at its first element")
    strided = [r.source.name for r in (x, w) if list(getattr(r.source.ty, "strides", None) or ())]
    if strided:
        raise ClusterError(f"{block.name_hint}: {', '.join(strided)} declares strides; the GEMM families' tiles "
                           "are copied from tensors laid out by their shape (TMA tensor maps, 16-byte cp.async)")
    if len(dtypes) != 1 or not dtypes <= set(operand_types):
        raise ClusterError(f"the GEMM multiplies two operands of one type among "
                           f"{sorted(operand_types)}, got {sorted(dtypes)}")
    dtype = dtypes.pop()
    if element_bytes(dtype) == 1 and not weight_nk:
        raise ClusterError(f"{block.name_hint}: {dtype} GEMMs need the weight stored [n, k] (ldmatrix "
                           "cannot transpose 8-bit elements); got [k, n]")
    copied = bool(block.annotations.get(COPIED_OPERANDS_KEY, False))
    return GemmShape(m, n, depth, weight_nk, dtype, operands_copied=copied, batch=batch,
                     shared_operand=shared), (x.source, w.source)


def _leading_unit_axes(region) -> int:
    """How many leading axes of ``region``'s tensor have extent 1 and are read at 0."""
    count = 0
    for dim, r in zip(region.source.ty.shape[:-2], region.region[:-2]):
        if not (isinstance(dim, tirx.IntImm) and int(dim) == 1 and isinstance(r.min, tirx.IntImm) and int(r.min) == 0):
            break
        count += 1
    return count


def batch_axes(block: tirx.SBlock) -> int:
    """The batch axes of a matmul block (:func:`find_gemm_operands`): those before (i, j, k)."""
    return len(block.iter_vars) - 3


def check_config(shape: GemmShape, config: SplitKGemmConfig, hw: Hardware) -> None:
    """Raise :class:`ClusterError` naming the first constraint ``config`` breaks for ``shape`` on
    the GPU ``hw`` describes."""
    c, s = config, config.cluster_size
    check_cluster_size(s)
    if shape.dtype == INT8 and c.tma:
        raise ClusterError("int8 GEMMs copy their tiles by cp.async for mma.sync (they have no TMA or wgmma form)")
    if not shape.symbolic_rows and shape.m % TILE:  # symbolic: whole tiles (tiled_shape)
        raise ClusterError(f"M={shape.m}: the tensor-core GEMM needs a multiple of {TILE} rows; "
                           "pad the batch, or use the split-K GEMV "
                           "(tvm_dsm.rules.split_k_reduction) for M=1")
    for what, extent, tile in (("M", shape.m, c.block_m), ("N", shape.n, c.block_n)):
        if isinstance(extent, int) and extent % tile:
            raise ClusterError(f"{what}={extent} is not a multiple of the {tile} tile")
    if shape.k % (s * c.block_k):
        raise ClusterError(f"K={shape.k} is not a multiple of cluster {s} x block_k {c.block_k}")
    depth = k_tile(shape.dtype)
    if c.block_m % (TILE * c.warps_m) or c.block_n % (TILE * c.warps_n) or c.block_k % depth:
        raise ClusterError(f"tiles {c.block_m}x{c.block_n}x{c.block_k} do not split into 16x16x"
                           f"{depth} fragments over {c.warps_m}x{c.warps_n} warps")
    if c.block_m % s or (c.block_m // s * c.block_n) % (c.threads * 4):
        raise ClusterError(f"the {c.block_m}x{c.block_n} tile does not scatter over {s} CTAs "
                           f"in 16-byte vectors of {c.threads} threads")
    if not c.tma:  # cp.async: each thread copies 16-byte pieces (a TMA copy moves a tile whole)
        if shape.operands_copied and not shape.weight_nk:
            raise ClusterError("a [K, N] weight copied within the function reaches its tiles by TMA only: "
                               "TVM's InjectPTXAsyncCopy fails on cp.async reading it")
        lanes = VECTOR // element_bytes(shape.dtype)
        for rows in (c.block_m, c.block_n):
            if (rows * c.block_k) % (c.threads * lanes):
                raise ClusterError(f"a {rows}x{c.block_k} operand tile is not a whole number of "
                                   f"16-byte copies for {c.threads} threads")
    k_steps = shape.k // (s * c.block_k)
    # A K of two steps in one CTA (K = 128: attention scores, short projections) fills a 3-stage
    # TMA pipeline of warpgroup MMAs, which refills a slot two steps after reading it: one step
    # copied ahead. (Split over a cluster, the model was fitted on full pipelines only.)
    if not (c.tma and c.wgmma and s == 1 and k_steps == 2 and c.stages == 3):
        check_pipeline(k_steps, c.stages, c.tma)
    if c.tma:
        check_tma(shape, c)
    if c.wgmma:
        check_wgmma(shape, c, hw)
    needed = c.shared_bytes(shape.dtype, shape.products, shape.weight_nk)
    if needed > hw.smem_per_cta:
        raise ClusterError(f"{needed} B of shared memory per CTA exceeds the {hw.smem_per_cta} B "
                           "a CTA of the GPU may use")


def whole(extent, tile: int):
    """``extent`` rounded up to whole tiles (an expression where it is symbolic)."""
    if isinstance(extent, int):
        return -(-extent // tile) * tile
    return tirx.floordiv(extent + (tile - 1), tile) * tile


def tiled_shape(shape: GemmShape, config: SplitKGemmConfig) -> GemmShape:
    """``shape`` with M and N rounded up to whole output tiles and K to whole K steps of every
    rank: the extents the kernel computes (:func:`apply_padded_split_k_gemm`)."""
    return dataclasses.replace(shape, m=whole(shape.m, config.block_m), n=whole(shape.n, config.block_n),
                               k=whole(shape.k, config.cluster_size * config.block_k))


def check_edges(shape: GemmShape) -> None:
    """What tiles running past M, N or K (:func:`apply_padded_split_k_gemm`) need of ``shape``
    under any configuration; ClusterError names the limit it breaks. A batch of one-row
    products (decode's per-head ``q @ k^T`` as ``torch.bmm``) is taken: its tiles' rows past the
    first are zero-filled in shared memory, and each product's weight is still read once."""
    if not shape.symbolic_rows and shape.m == 1 and shape.weight_nk and isinstance(shape.batch, int) and shape.batch == 1:
        raise ClusterError("M=1 is a GEMV: the row GEMV streams W [N, K] at the HBM floor, a "
                           "16-row tensor-core tile would compute 15 rows for nothing")
    if not shape.symbolic_rows and shape.n == 1 and isinstance(shape.batch, int) and shape.batch == 1:
        # H200 (bench/results/archive/user_functions_h200_s98.json, 193): 8192 x 1 x 4096 bf16
        # 35.6 us on 64-column tiles, 27.8 on dlight's GEMV
        raise ClusterError("N=1 is a matrix-vector product: a tensor-core tile of 8 or more columns would compute "
                           "all but one for nothing, where TVM's GEMV streams X once")
    check_rows_aligned(shape)


def check_rows_aligned(shape: GemmShape) -> None:
    """Operand rows start 16 bytes apart: TMA tensor maps take 16-byte multiples as strides, and
    cp.async copies 16-byte pieces; ClusterError names the extent that breaks it."""
    elem = element_bytes(shape.dtype)
    for what, extent, row in (("K", shape.k, True), ("N", shape.n, not shape.weight_nk)):
        if row and extent * elem % VECTOR:
            raise ClusterError(f"{what}={extent}: operand rows of {extent} x {elem} B must be a "
                               f"multiple of {VECTOR} B (TMA strides, 16-byte copies): {what} a "
                               f"multiple of {VECTOR // elem}")


def check_padded_config(shape: GemmShape, config: SplitKGemmConfig, hw: Hardware) -> None:
    """:func:`check_edges`, then :func:`check_config` for the tiles
    :func:`apply_padded_split_k_gemm` computes over (:func:`tiled_shape`); ClusterError names
    the first limit ``shape`` or ``config`` breaks."""
    check_edges(shape)
    tiles = tiled_shape(shape, config)
    if config.tma and tiles.k != shape.k and isinstance(shape.k, int) and shape.k % config.block_k == 0:
        # The zero fill of X's steps past K is then a condition on whole steps, which TVM
        # simplifies out of the copy's element indices: the TMA pass cannot prove it says only
        # "inside the tensor" (37 x 896 x 4864 in clusters of 8 did not lower).
        raise ClusterError(f"K={shape.k} is whole in {config.block_k}-deep steps but not in a cluster of "
                           f"{config.cluster_size}'s: TMA copies take no whole step past K")
    # A weight stored [K, N] takes TMA boxes, which land zeros past N and K, or predicated
    # cp.async copies of its edges (16-byte pieces: N a multiple of 8, check_edges), which
    # zero-fill there; gated products are rewritten to whole tiles first (padded_gated_tiles),
    # their fills inlined into the same copies.
    check_config(tiles, config, hw)


def check_pipeline(k_steps: int, stages: int, tma: bool) -> None:
    """A CTA's ``k_steps`` K steps fill a pipeline of at least 3 stages, or are a single step
    loaded without one (``stages=1``, cp.async copies only): a K as short as 32 has nothing to
    overlap."""
    if stages == 1:
        if k_steps != 1 or tma:
            raise ClusterError(f"stages=1 (no pipeline) is for a single cp.async K step per CTA; "
                               f"got {k_steps} step(s){' by TMA' if tma else ''}")
        return
    if stages < 3:
        # Two stages would need the fragment prologue and the copy in one stage; measured wrong.
        raise ClusterError(f"stages={stages}: the pipeline needs at least 3")
    if k_steps < stages:
        raise ClusterError(f"a CTA's {k_steps} K steps cannot fill a {stages}-stage pipeline")


def check_tma(shape: GemmShape, config: SplitKGemmConfig) -> None:
    """TMA copies land tiles of 128-byte swizzled rows, at most 256 of them: X's and an ``[n,
    k]`` W's K-contiguous, a ``[k, n]`` W's N-contiguous (panels of 128-byte rows, one after
    the other, for warpgroup MMAs)."""
    elem = element_bytes(shape.dtype)
    if config.block_k * elem != TMA_ROW_BYTES:
        raise ClusterError(f"TMA operand tiles need block_k * element size = {TMA_ROW_BYTES} B, "
                           f"got {config.block_k} x {elem}")
    if not shape.weight_nk:
        if config.block_n * elem % TMA_ROW_BYTES:
            raise ClusterError(f"TMA tiles of W stored [k, n] are rows of N in {TMA_ROW_BYTES}-byte panels: "
                               f"block_n * element size a multiple of it, got {config.block_n} x {elem}")
        if not config.wgmma:
            # measured 1.6-2.0x slower than cp.async tiles (archive/generality_kn_mn_major_s65.json)
            raise ClusterError("TMA tiles of W stored [k, n] are for warpgroup MMAs (read MN-major); "
                               "mma.sync's ldmatrix.trans takes them by cp.async")
    if max(config.block_m, config.block_n) > TMA_MAX_BOX:
        raise ClusterError(f"TMA copies at most {TMA_MAX_BOX} rows per tile")


def check_epilogue_in_shared(shape: GemmShape, config: SplitKGemmConfig, kernel: str, hw: Hardware) -> None:
    """An epilogue with thread loops of its own (``apply_split_k_gemm(..., in_registers=False)``,
    for one that reads what another kernel computes) reads the fp32 sums from shared memory
    beside the pipeline; ClusterError if ``kernel`` would need more than a CTA has."""
    needed = config.shared_bytes(shape.dtype, shape.products, shape.weight_nk) + config.block_m * config.block_n * 4
    if needed > hw.smem_per_cta:
        raise ClusterError(f"{kernel} needs {needed} B of shared memory per CTA (pipeline and the "
                           f"sums its epilogue reads), more than {hw.smem_per_cta} B")


#: What a wgmma main loop's thread holds besides its block_n / 2 fp32
#: accumulators (addresses, descriptors, loop state; ptxas: 90 in all for 256x128 tiles).
_WGMMA_OTHER_REGISTERS = 40
#: A thread addresses at most 255 registers (every CUDA architecture); past that ptxas spills
#: the accumulators to local memory.
MAX_REGISTERS_PER_THREAD = 255


def check_wgmma(shape: GemmShape, config: SplitKGemmConfig, hw: Hardware) -> None:
    """A warpgroup MMA reads its operands from TMA's swizzled tiles (fp16, bf16 or fp8 e4m3;
    a W stored ``[k, n]``: 16-bit, tiles of 64-column panels, :func:`check_tma`), with each of 4
    consecutive warps holding 16 rows of a 64-row warpgroup tile and all its columns."""
    c = config
    if shape.dtype not in ("float16", "bfloat16", FP8):
        raise ClusterError(f"wgmma main loops take fp16, bf16 or fp8 e4m3 operands, got {shape.dtype}")
    if not c.tma:
        raise ClusterError("wgmma reads the swizzled tiles TMA copies land: needs tma=True")
    if c.block_m % WARPGROUP_ROWS or c.block_n > WGMMA_MAX_N:
        raise ClusterError(f"wgmma tiles: block_m a multiple of {WARPGROUP_ROWS} and block_n at "
                           f"most {WGMMA_MAX_N}, got {c.block_m}x{c.block_n}")
    if (c.warps_m, c.warps_n) != (c.block_m // TILE, 1):
        raise ClusterError(f"wgmma: each warp holds 16 rows and every column: warps "
                           f"{c.block_m // TILE}x1, got {c.warps_m}x{c.warps_n}")
    # fp8 tiles accumulate into a second set of registers first (tvm_dsm.intrin.wgmma); products
    # in one K loop hold their accumulators together
    accumulators = c.block_n // 2 * (2 if shape.dtype == FP8 else 1)
    if shared_k_loop(c, shape.products):
        accumulators *= shape.products
    if accumulators + _WGMMA_OTHER_REGISTERS > MAX_REGISTERS_PER_THREAD:
        raise ClusterError(f"wgmma {c.block_m}x{c.block_n} tiles: {accumulators} fp32 accumulators "
                           f"per thread and about {_WGMMA_OTHER_REGISTERS} other registers exceed "
                           f"the {MAX_REGISTERS_PER_THREAD} a thread may hold (they would spill)")
    registers = c.threads * (accumulators + _WGMMA_OTHER_REGISTERS)
    if registers > hw.regs_per_sm:
        raise ClusterError(f"wgmma {c.block_m}x{c.block_n} tiles: {c.threads} threads holding "
                           f"{accumulators} fp32 accumulators each need about {registers} "
                           f"registers, an SM has {hw.regs_per_sm}")


#: Rows of tiles a column of tiles visits before the grid moves to the next column (grouped
#: rasterization). Row by row, a wave of CTAs covers about one row of tiles and streams all of
#: W, so a W larger than L2 would come from HBM once per row of tiles (docs/gemm.md).
RASTER_GROUP = 8


def raster_group(tiles_m: int) -> int:
    """The largest power of two up to RASTER_GROUP dividing the rows of tiles."""
    return largest_power_of_two(tiles_m, RASTER_GROUP)


def schedule_split_k_gemm(func: tirx.PrimFunc, config: SplitKGemmConfig, hw: Hardware) -> s_tir.Schedule:
    """Schedule ``func`` (a matmul block plus elementwise epilogue, any M, N and K within
    :func:`check_padded_config`'s limits on ``hw``) as a cluster split-K GEMM with the given
    configuration (:func:`tvm_dsm.planners.split_k_gemm.schedule_dense` plans one). A gated
    layer whose M, N or K overrun the tiles is scheduled as its rewrite to whole tiles
    (:mod:`tvm_dsm.rules.padded_gated_tiles`)."""
    sch = s_tir.Schedule(func)
    blocks, epilogue, shape = find_gemm(sch, SPLIT_K_TYPES, batched=True)
    check_padded_config(shape, config, hw)
    tiles = tiled_shape(shape, config)
    if shape.products > 1 and (shape.symbolic_rows or tiles != shape):
        sch = s_tir.Schedule(pad_gated_to_tiles(func, [config.block_m, config.block_n, config.cluster_size * config.block_k],
                                                separate_outputs=shape.outputs > 1))
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        # each output's copy of its real rows and columns
        unpads = [b for b in blocks if writes_parameter(sch.mod["main"], sch.get(b))]
        outputs = [sch.get_producers(u)[0] for u in unpads]
        products = [b for b in blocks if is_reduction(sch.get(b))]
        # the zero-filled X the products read, and each one's padded weight
        fills = list({sch.get(f).name_hint: f for p in products for f in sch.get_producers(p)}.values())
        apply_split_k_gemm(sch, products, outputs, tiles, config)
        for fill in fills:  # after the tile copies exist (as apply_padded_split_k_gemm's)
            sch.compute_inline(fill)
        for unpad in unpads:
            sch.reverse_compute_inline(unpad)
        return sch
    apply_padded_split_k_gemm(sch, blocks, epilogue, shape, config)
    return sch


def apply_padded_split_k_gemm(sch: s_tir.Schedule, blocks: list[SBlockRV], epilogue: list[SBlockRV],
                              shape: GemmShape, config: SplitKGemmConfig) -> None:
    """:func:`apply_split_k_gemm` over whole tiles (:func:`tiled_shape`) of a GEMM whose M, N or
    K they overrun, with no copy of an operand: s_tir's ``pad_einsum`` pads the matmul, and
    each padded operand's zero fill is inlined into its shared-memory tile copy (cp.async
    copies of a predicate, which zero-fill; TMA copies, which the pass issues unpredicated:
    a tensor map clips the box at the tensor's edge and fills zeros). Zeros add nothing to the
    K sums; rows and columns past M and N are computed, reduced over the cluster and not
    stored: the epilogue is moved into the padded tile's store (``reverse_compute_inline``),
    whose predicate keeps each store inside Y. Tiles that fit are scheduled unchanged."""
    c = config
    tiles = tiled_shape(shape, c)
    if not shape.symbolic_rows and tiles == shape:
        apply_split_k_gemm(sch, blocks, epilogue, shape, c)
        return
    (matmul,) = blocks  # check_padded_config: one product
    zero_fills, stages = pad_product(sch, matmul, epilogue,
                                     [1] * batch_axes(sch.get(matmul)) + [c.block_m, c.block_n, c.cluster_size * c.block_k])
    output = None  # where the output tile overruns Y: the block moved into its store
    if len(stages) > len(epilogue):
        # The padded product's copy into the real output, then the function's epilogue: one
        # block over M x N, moved into the padded tile's store once the kernel is scheduled
        # (the store's predicate, there earlier, fails s_tir's region-cover check once the
        # partial products are blockized, and no tile copy could be placed).
        output = inline_all_but_last(sch, stages)
        epilogue = [sch.cache_write(matmul, 0, "global")]
    apply_split_k_gemm(sch, blocks, epilogue, tiles, c)
    for fill in zero_fills:  # after the tile copies exist: s_tir inlines into them
        sch.compute_inline(fill)
    if output is not None:
        sch.reverse_compute_inline(output)


def pad_product(sch: s_tir.Schedule, matmul: SBlockRV, epilogue: list[SBlockRV],
                padding: list[int]) -> tuple[list[SBlockRV], list[SBlockRV]]:
    """``matmul`` padded to multiples of ``padding`` (s_tir's ``pad_einsum``): the zero fills of
    its padded operands (to inline into their tile copies once those exist), and the blocks
    after it: the copy out of the padded output where M or N was padded, then ``epilogue``."""
    names = {sch.get(b).name_hint for b in epilogue}
    sch.pad_einsum(matmul, padding)
    copy_out = [b for b in sch.get_consumers(matmul) if sch.get(b).name_hint not in names]
    return list(sch.get_producers(matmul)), [*copy_out, *epilogue]


def inline_all_but_last(sch: s_tir.Schedule, stages: list[SBlockRV]) -> SBlockRV:
    """``stages`` (elementwise blocks, each reading the one before) inlined into the last,
    which is returned."""
    *inner, last = stages
    for stage in inner:
        sch.compute_inline(stage)
    return last


def inline_into_outputs(sch: s_tir.Schedule, products: list[SBlockRV], epilogue: list[SBlockRV]) -> list[SBlockRV]:
    """Sibling ``products``' epilogue blocks: the last computed from each product (its output),
    in the products' order, every other one inlined into the blocks reading it."""
    positions = product_outputs([sch.get(p).writes[0].source for p in products], [sch.get(b) for b in epilogue])
    for n, block in enumerate(epilogue):
        if n not in positions:
            sch.compute_inline(block)
    return [epilogue[n] for n in positions]


def apply_split_k_gemm(
    sch: s_tir.Schedule,
    blocks: list[SBlockRV],
    epilogue: list[SBlockRV],
    shape: GemmShape,
    config: SplitKGemmConfig,
    in_registers: bool = True,
) -> None:
    """Schedule the matmul ``blocks`` (one, or a gated layer's gate and up products of the same
    ``X``, whose partial tiles the epilogue combines) and their ``epilogue`` blocks of ``sch`` in
    place. ``in_registers=False``: the epilogue gets its own thread loops (see
    :func:`sum_partials`), for one that reads what another kernel of the schedule computes."""
    c, s = config, config.cluster_size
    epilogue = [*epilogue, *outputs_through_copies(sch, blocks)]
    if shape.outputs > 1:
        outputs = inline_into_outputs(sch, blocks, epilogue)
        for depth in (0, 1):  # one loop nest over the sibling outputs' tiles
            sch.merge(*(sch.get_loops(o)[depth] for o in outputs))
    else:
        outputs = [inline_all_but_last(sch, epilogue)]
    output = outputs[0]

    # Split K over the cluster: each rfactor block computes one partial tile per rank.
    partials = []
    for block in blocks:
        k_rank, _ = sch.split(sch.get_loops(block)[-1], [s, None])
        partials.append(sch.rfactor(k_rank, factor_axis=0))

    # The final stage: CTA r of a tile's cluster reduces rows r*block_m/S.. of the tile.
    *batch, i, j = sch.get_loops(output)
    i_tile, i_in = sch.split(i, [None, c.block_m])
    j_tile, j_in = sch.split(j, [None, c.block_n])
    i_rank, i_row = sch.split(i_in, [s, None])
    # over a symbolic M the rows of tiles are not known to divide into groups: the cluster
    # loop is renumbered when lowered (tvm_dsm.transform.raster_clusters)
    group = 1 if shape.symbolic_rows else raster_group(shape.m // c.block_m)
    if group > 1:  # consecutive clusters walk `group` rows of tiles per column of tiles
        i_group, i_tile = sch.split(i_tile, [None, group])
        sch.reorder(*batch, i_group, j_tile, i_tile, i_rank, i_row, j_in)
        cluster = sch.fuse(*batch, i_group, j_tile, i_tile)
    else:
        sch.reorder(*batch, i_tile, j_tile, i_rank, i_row, j_in)
        cluster = sch.fuse(*batch, i_tile, j_tile)
        if shape.symbolic_rows and shape.n > c.block_n and not batch:  # renumbered as (row, column) tiles
            sch.annotate(cluster, RASTER_GROUP_KEY, [RASTER_GROUP, -(-shape.n // c.block_n)])
    bind_cluster_nest(sch, cluster, i_rank)
    for block in blocks:
        sch.compute_at(block, i_rank, preserve_unit_loops=True)

    # The partial stages: 16x16x16 tensor-core blocks over warps and K steps, at the cluster.
    main_loops = []
    for partial in partials:
        # Placed before blockizing: a blockized M of one fragment leaves a unit block variable
        # that compute_at's region solver cannot match (M = 16).
        sch.compute_at(partial, cluster, preserve_unit_loops=True)
        # (rank, batch axes, i, j, k), the batch axes unit loops here
        p_rank, *_, p_i, p_j, p_k = sch.get_loops(partial)[-4 - len(batch):]
        partial, fragment = blockize_fragments(sch, partial, [p_rank], p_i, p_j, p_k,
                                               c.warpgroup)
        p_rank, *_, p_i, p_j, p_k = sch.get_loops(partial)[-4 - len(batch):]
        main_loops.append((partial, fragment, p_rank, p_i, p_j, p_k))
    split_k_main_loops(sch, main_loops, shape, c)
    # compute_at regenerated the sums' loops in block-variable order: (peers, batch axes, rows,
    # cols), the batch axes unit loops here
    sums = [sch.get_loops(b)[-3 - len(batch):] for b in blocks]
    sum_partials(sch, blocks, outputs, [(rows, cols, peers) for peers, *_, rows, cols in sums], c.warps,
                 in_registers)
    if c.programmatic_launch:
        launch_programmatically(sch)


def shared_k_loop(config: SplitKGemmConfig, products: int) -> bool:
    """Whether ``products`` matmuls of one X (a gated layer's gate and up) run in one K loop,
    each step copying X's tile once beside every W tile, rather than one loop after the other:
    so where the tiles come by TMA (the pass streams any number of tiles per step)."""
    return config.tma and products > 1


def split_k_main_loops(sch: s_tir.Schedule, partials: list[tuple], shape: GemmShape,
                      config: SplitKGemmConfig, quantize: SBlockRV | None = None) -> None:
    """Schedule blockized partial-product blocks, each given as ``(block, fragment name, rank,
    i, j, k)`` (loops over the rank owning a K slice, then fragment rows, columns and depth), as
    one CTA's pipelined tensor-core main loop over its K slice per block, each ending with its
    fp32 partial tile stored into its DSM slice. Several blocks (a gated chain's gate and up
    GEMMs) share one loop and X's tiles where :func:`shared_k_loop` says so (s_tir's merge of
    their rank, warp and K-step loops), else run one after the other; every operand cache is
    placed before any rank loop is bound, because s_tir's compute_at rejects a scope with a
    rank-bound producer.

    ``quantize``: the elementwise block producing the (single) GEMM's X from a wider input (fp8
    quantization): X's tiles then arrive in the input's type by cp.async and are quantized in
    shared memory one step before their fragments are loaded."""
    c = config
    one_loop = shared_k_loop(config, len(partials))
    steps = []
    for partial, _, rank, i, j, k in partials:
        depth = c.warpgroup[1] if c.wgmma else k_tile(shape.dtype)
        k_step, k_frag = sch.split(k, [None, c.block_k // depth])
        warp, _, _ = warp_tile(sch, i, j, [k_step, k_frag], c.warps_m, c.warps_n,
                               bind=not one_loop)
        steps.append((rank, warp, k_step))
    if one_loop:  # one rank, warp and K step loop around every product: (rank, warp, K step)
        sch.merge(*(k_step for _, _, k_step in steps))
        steps = [tuple(sch.get_loops(partial)[-6:-3]) for partial, *_ in partials]
        sch.bind(steps[0][1], "threadIdx.y")
    loops = []
    for index, ((partial, *_), (rank, warp, k_step)) in enumerate(zip(partials, steps)):
        k_frag = sch.get_loops(partial)[-3]
        if not one_loop or index == 0:  # the loop's first product brings X's tile
            x_tile = stage_in_shared(sch, partial, 0, k_step, c.warps, 1, c.block_k, tma=c.tma,
                                     consumers=[p for p, *_ in partials] if one_loop else None)
        # a gated layer's W tile may start at a row of a fused weight past the tile's own: held
        # tile-local, its rows are those of the tile whatever the weight's first row
        stage_in_shared(sch, partial, 1, k_step, c.warps, 1 if shape.weight_nk else 0, c.block_k,
                        rows=c.block_n if shape.weight_nk and shape.products > 1 else None, tma=c.tma)
        if quantize is not None:
            sch.compute_inline(quantize)  # X's tile is computed from the input's tile
            # Quantized 4 at a time: CUDA has float4 and fp8x4 types, no 16-wide ones.
            sch.vectorize(sch.split(sch.get_loops(x_tile)[-1], [None, 4])[1])
            stage_in_shared(sch, x_tile, 0, k_step, c.warps, 1, c.block_k)
        loops.append((k_step, k_frag,
                      fragment_caches(sch, partial, k_frag, warp, operands_in_registers=not c.wgmma)))
    for index, ((partial, fragment, *_), (rank, *_), (k_step, k_frag, caches)) in enumerate(
            zip(partials, steps, loops)):
        first = not one_loop or index == 0  # the loop's first visit
        if first:
            bind_rank(sch, rank)  # after the operand caches: their region is one CTA's K slice
        tensorize_fragments(sch, partial, fragment, caches, k_step, shape.weight_nk,
                            dsm_store_intrinsic(shape.dtype),
                            wgmma_intrin(*c.warpgroup, shape.dtype, len(partials) if one_loop else 1,
                                         b_mn_major=not shape.weight_nk)
                            if c.wgmma else None)
        if not c.wgmma:  # fragments one 16-wide K step ahead (a wgmma step takes the whole tile)
            sch.annotate(k_frag, "software_pipeline_stage", [0, 0, 1])
            sch.annotate(k_frag, "software_pipeline_order", [0, 1, 2])
        if c.tma:  # tiles stages-1 steps ahead by TMA (tvm_dsm.transform.tma_pipeline)
            if first:
                sch.annotate(k_step, TMA_STAGES_KEY, c.stages)
            continue
        if c.stages == 1:  # one K step: copy, synchronize, multiply
            continue
        # Software pipeline: operand tiles stages-1 K steps ahead (cp.async), fragments one
        # 16-wide K step ahead. The outer body is [X tile, W tile, then the inner pipeline's
        # prologue, body and epilogue]; a quantized X adds its input tile (first, stage 0) and
        # the quantization (second, with the fragment prologue).
        last = c.stages - 1
        if quantize is None:
            stages, order = [0, 0, last - 1, last, last], [0, 1, 3, 2, 4]
        else:
            stages, order = [0, last - 1, 0, last - 1, last, last], [0, 3, 1, 4, 2, 5]
        sch.annotate(k_step, "software_pipeline_stage", stages)
        sch.annotate(k_step, "software_pipeline_order", order)
        sch.annotate(k_step, ASYNC_STAGES_KEY, [0])


def sum_partials(sch: s_tir.Schedule, blocks: list[SBlockRV], outputs: list[SBlockRV],
                 loops: list[tuple[LoopRV, LoopRV, LoopRV]], warps: int,
                 in_registers: bool = True) -> None:
    """Schedule the blocks summing the cluster's partial tiles (each with its ``(rows, cols,
    peers)`` loops) and ``outputs``, the epilogue blocks reading the sums: each thread sums 4
    fp32 columns of a few consecutive rows over the peers (one ld.shared::cluster.v4 per row and
    peer, all in flight, starting at its own rank) and computes the outputs from the sums in
    registers. Several blocks (a gated chain's gate and up, sibling products) share their thread
    loops, so the epilogue sees all sums at once. Each output stores its 4 columns as one vector;
    where a padded tile's store is predicated by column (N not a multiple of 4), TVM's vectorizer
    leaves the 4 stores one by one.

    ``in_registers=False`` keeps the sums in shared memory and gives each output its own thread
    loops (same shape): for an epilogue that also reads a block s_tir cannot move into the
    sums' thread loop (one computed at the cluster loop, such as a row scale)."""
    rows, cols, peers = loops[0]  # the products summed side by side have one shape
    n_peers = int(sch.get(peers).extent)
    # A CTA without peers reads its own shared memory: no DSM latency to hide.
    batch = _row_batch(sch, rows, cols, len(blocks) * n_peers, warps) if n_peers > 1 else 1
    threads, inner = [], []
    for block, (rows, cols, peers) in zip(blocks, loops):
        sch.set_scope(block, 0, "local" if in_registers else "shared.dyn")
        outer, warp, thread, batched, vector = _over_threads(sch, rows, cols, warps, batch)
        sch.reorder(outer, warp, thread, batched, peers, vector)
        threads.append(thread)
        inner.append((batched, peers, vector))
    if len(threads) > 1:
        sch.merge(*threads)
    # (outer, warp, thread, batched, peers, vector)
    outer, warp, thread = sch.get_loops(blocks[0])[-6:-3]
    sch.bind(warp, "threadIdx.y")
    sch.bind(thread, "threadIdx.x")
    own_outer = []  # each output's outer loop, where it has thread loops of its own
    for output in outputs:
        if in_registers:
            sch.reverse_compute_at(output, thread)
            if batch > 1:  # the batch's rows (a unit loop has none): their sums stay in registers
                sch.unroll(sch.get_loops(output)[-2])
        else:
            loop, own_warp, own_thread, _, _ = _over_threads(sch, *sch.get_loops(output)[-2:], warps)
            sch.bind(own_warp, "threadIdx.y")
            sch.bind(own_thread, "threadIdx.x")
            own_outer.append(loop)
    # Unrolled, an epilogue's loads of its other inputs (a bias, a residual) are issued together:
    # in a loop each waited one L2 round trip before its store (ViT-B/16's qkv at 6304 rows: 24 a
    # thread). Not behind peers' loads: those are volatile, and no load moves above them.
    if n_peers == 1:
        for loop in own_outer or [outer]:  # the loops holding the epilogue's loads
            sch.unroll(loop)
    for output in outputs:
        sch.vectorize(sch.get_loops(output)[-1])
    for block, (batched, peers, vector) in zip(blocks, inner):
        sch.annotate(peers, ROTATE_PEERS_KEY, 1)
        sch.vectorize(vector)  # before decompose_reduction: vectorize needs a reduction block
        sch.unroll(peers)
        sch.unroll(batched)
        sch.decompose_reduction(block, peers)


#: Bytes of partials a CTA's threads load before any adds and stores (16-byte vectors). The
#: peer loads are ``asm volatile`` with a memory clobber, so none moves above the store of an
#: earlier sum: a thread summing one vector at a time would wait one DSM latency per vector.
#: 32 KB is the best measured; 64 KB gains nothing (docs/gemm.md).
_BYTES_IN_FLIGHT = 32 * 1024


def _row_batch(sch: s_tir.Schedule, rows: LoopRV, cols: LoopRV, loads_per_row: int,
               warps: int) -> int:
    """Consecutive rows each thread sums together (a power of two), their ``loads_per_row``
    vectors (peers, times the products summed side by side) all in flight: as many as keep a
    CTA's loads within _BYTES_IN_FLIGHT and give every thread the same number of rows."""
    n_rows, vectors_per_row = int(sch.get(rows).extent), int(sch.get(cols).extent) // 4
    threads = 32 * warps
    batch = 1
    while (n_rows % (2 * batch) == 0
           and 2 * batch * loads_per_row * threads * VECTOR <= _BYTES_IN_FLIGHT
           and (n_rows // (2 * batch) * vectors_per_row) % threads == 0):
        batch *= 2
    return batch


def _over_threads(sch: s_tir.Schedule, rows: LoopRV, cols: LoopRV, warps: int,
                  batch: int = 1) -> list[LoopRV]:
    """(outer, warp, lane, batch of rows, vector of 4 columns) over a tile's ``rows x cols``:
    the (32, warps) thread shape of the main loop (UnifyThreadBinding needs equal extents).
    Vectors split off the columns first, so a vector never straddles two rows; a thread's
    ``batch`` rows are consecutive, so its share is one rectangle (compute_at needs one)."""
    cols, vector = sch.split(cols, [None, 4])
    rows, batched = sch.split(rows, [None, batch])
    sch.reorder(cols, batched)
    return [*sch.split(sch.fuse(rows, cols), [None, warps, 32]), batched, vector]
