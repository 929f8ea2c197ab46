"""A GEMM (``Y = epilogue(X @ W^T)`` or ``X @ W``) on the CUDA cores, for the products the
tensor-core GEMM does not take: fp32 operands, exact to fp32 (TF32 keeps 10 mantissa bits, fewer
than asked), and 16-bit ones whose rows do not start 16 bytes apart (an odd K), accumulated in
fp32; the product is tiled as the classic register-blocked GEMM.

Each CTA owns a ``block_m x block_n`` output tile, each thread a ``thread_m x thread_n`` block of
it in registers; a K step copies ``block_k`` columns of X's and W's tiles into shared memory
(transposed to ``[k, m]`` and ``[k, n]``, so a warp's reads of one k fall in distinct banks, in
vectors of four elements where the rows allow), and every thread multiplies its row and
column vectors into its block, ``thread_m * thread_n`` multiply-adds per ``thread_m + thread_n``
shared loads. A short M or N leaves few tiles: ``split_k`` CTAs then share each tile's K, writing
partial tiles that a second kernel sums in a fixed order (the same result every run) under the
epilogue. Sizes off the tiles are padded inside the kernel: the operand copies read zeros past
M, N and K, and the stores are predicated.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import s_tir, tirx
from tvm.ir import TensorLoad  # what tirx.BufferLoad builds
from tvm.s_tir.schedule import SBlockRV

from ..errors import ClusterError, passes
from ..hardware import MAX_CTA_THREADS
from .split_k_gemm import (GemmShape, check_rows_aligned, find_gemm, find_gemm_operands, inline_all_but_last,
                           pad_product)

#: The operand types this rule takes: fp32, which the tensor cores do not take exactly, and the
#: 16-bit types where the tensor-core GEMM cannot copy their rows.
FP32 = "float32"
OPERAND_TYPES = (FP32, "float16", "bfloat16")
#: Elements of one vectorized copy or register load (16 bytes of fp32, 8 of a 16-bit type).
VECTOR_ELEMENTS = 4
#: Threads a CTA of the kernel summing split-K partial tiles.
SUM_THREADS = 256
#: Threads a CTA of the GEMM at the least (two warps).
MIN_THREADS = 64


@dataclass(frozen=True)
class SimtGemmConfig:
    """Output tile ``block_m x block_n`` a CTA, ``thread_m x thread_n`` of it a thread,
    ``block_k`` columns of K a step, ``split_k`` CTAs sharing each tile's K."""

    block_m: int
    block_n: int
    block_k: int
    thread_m: int
    thread_n: int
    split_k: int = 1

    @property
    def threads(self) -> int:
        return (self.block_m // self.thread_m) * (self.block_n // self.thread_n)

    def shared_bytes(self, element_bytes: int) -> int:
        """Shared memory of one K step's X and W tiles of ``element_bytes`` elements."""
        return (self.block_m + self.block_n) * self.block_k * element_bytes

    def explain(self) -> str:
        split = f", K split over {self.split_k} CTAs summed by a second kernel" if self.split_k > 1 else ""
        return (f"CUDA-core GEMM: {self.block_m}x{self.block_n} tiles, {self.thread_m}x{self.thread_n} "
                f"a thread ({self.threads} threads), {self.block_k}-deep K steps{split}")


def find_simt_gemm(func: tirx.PrimFunc) -> GemmShape:
    """The shape of ``func``'s matmul (one product, then elementwise epilogue blocks, as the
    split-K GEMM rule reads them): of fp32 operands, or of 16-bit ones whose rows do not start
    16 bytes apart (an odd K; the tensor-core GEMM's copies move 16-byte pieces), more than one
    row; ClusterError names what differs."""
    sch = s_tir.Schedule(func)
    products, _, shape = find_gemm(sch, operand_types=OPERAND_TYPES)
    if len(products) != 1:
        raise ClusterError("the CUDA-core GEMM computes one product (a gated layer's two run one by one)")
    check_sum_of_products(sch.get(products[0]))
    one_row = not shape.symbolic_rows and shape.m == 1
    if shape.dtype != FP32:
        if passes(check_rows_aligned, shape):
            raise ClusterError(f"{shape.dtype} products whose rows start 16 bytes apart take the tensor-core GEMM")
        if one_row:
            raise ClusterError("one row is a GEMV: TVM's GEMV schedule streams W at the HBM floor")
    elif one_row and shape.weight_nk and not passes(check_rows_aligned, shape):
        # (the row GEMV takes fp32 rows of whole 16-byte vectors) H200 generality run
        # (bench/results/archive/generality_clusters_depth_s70.json): an fp32 FFN of one row over
        # K = 127 31.6 -> 3.8 us with its first product on TVM's GEMV (torch 10.0)
        raise ClusterError("one fp32 row over W [N, K] with K off 16 bytes is a GEMV: TVM's GEMV schedule "
                           "streams W at the HBM floor")
    return shape


def check_sum_of_products(block: tirx.SBlock) -> None:
    """``block`` starts its output at zero and adds one product of two loads (each perhaps cast)
    a step: what the zeros of padded K add nothing to. ClusterError otherwise (a max, a sum of
    exponentials: the tensor-core rule's tensorize refuses them, this rule must say so)."""
    init, body = block.init, block.body
    if not (isinstance(init, tirx.BufferStore) and isinstance(init.value, tirx.FloatImm) and init.value.value == 0):
        raise ClusterError(f"{block.name_hint} does not start its sums at zero")
    value = body.value if isinstance(body, tirx.BufferStore) else None
    if not (isinstance(value, tirx.Add) and isinstance(value.a, TensorLoad)
            and value.a.source.same_as(body.buffer) and isinstance(value.b, tirx.Mul)
            and all(isinstance(_uncast(f), TensorLoad) for f in (value.b.a, value.b.b))):
        raise ClusterError(f"{block.name_hint} is not a sum of products of two loads")


def _uncast(expr: tirx.PrimExpr) -> tirx.PrimExpr:
    return expr.value if isinstance(expr, tirx.Cast) else expr


def check_config(shape: GemmShape, config: SimtGemmConfig) -> None:
    """ClusterError naming the first limit ``config`` breaks for ``shape``."""
    c = config
    if c.block_m % c.thread_m or c.block_n % c.thread_n:
        raise ClusterError(f"{c.block_m}x{c.block_n} tiles do not split into {c.thread_m}x{c.thread_n} blocks")
    if not MIN_THREADS <= c.threads <= MAX_CTA_THREADS:
        raise ClusterError(f"{c.threads} threads a CTA: between {MIN_THREADS} and {MAX_CTA_THREADS}")
    if c.split_k > 1 and shape.k < c.split_k * c.block_k * 2:
        raise ClusterError(f"K={shape.k} gives {c.split_k} CTAs fewer than two {c.block_k}-deep steps each")


def schedule_simt_gemm(func: tirx.PrimFunc, config: SimtGemmConfig) -> s_tir.Schedule:
    """``func`` (see :func:`find_simt_gemm`) scheduled as the register-blocked GEMM of
    ``config`` (the module docstring)."""
    c = config
    sch = s_tir.Schedule(func)
    (matmul,), epilogue, shape = find_gemm(sch, operand_types=OPERAND_TYPES)
    check_config(shape, c)
    padding = [c.block_m, c.block_n, c.block_k * c.split_k]
    fills = []
    if not isinstance(shape.m, int) or any(e % p for e, p in zip((shape.m, shape.n, shape.k), padding)):
        fills, epilogue = pad_product(sch, matmul, epilogue, padding)
    _, (x, w) = find_gemm_operands(sch.get(matmul), operand_types=OPERAND_TYPES)  # padded ones where padded
    output = inline_all_but_last(sch, epilogue) if epilogue else None
    if c.split_k > 1:
        _, _, k = sch.get_loops(matmul)
        k_part, _ = sch.split(k, [c.split_k, None])
        partials = sch.rfactor(k_part, factor_axis=0)
        i, j, part, k = sch.get_loops(partials)
        _tile_product(sch, partials, (part, i, j, k), x, w, c, shape)
    else:
        _tile_product(sch, matmul, (None, *sch.get_loops(matmul)), x, w, c, shape)
    for fill in fills:  # inlined into the shared-memory copies: zeros past M, N and K
        sch.compute_inline(fill)
    if c.split_k > 1:
        _sum_partials(sch, matmul, output)
    elif output is not None:
        sch.reverse_compute_inline(output)
    return sch


def _tile_product(sch: s_tir.Schedule, block: SBlockRV, loops: tuple, x: tirx.Buffer, w: tirx.Buffer,
                  c: SimtGemmConfig, shape: GemmShape) -> None:
    """The register-blocked main loop of ``block`` over its ``loops`` (the split-K part, None
    for the whole product; then i, j, k), its accumulators written back by the threads owning
    them."""
    part, i, j, k = loops
    part = [part] if part is not None else []
    i_tile, i_thread, i_reg = sch.split(i, [None, c.block_m // c.thread_m, c.thread_m])
    j_tile, j_thread, j_reg = sch.split(j, [None, c.block_n // c.thread_n, c.thread_n])
    k_step, k_in = sch.split(k, [None, c.block_k])
    # the rows of tiles outermost: over a symbolic M the grid's other axes divide by constants
    sch.reorder(i_tile, j_tile, *part, i_thread, j_thread, k_step, k_in, i_reg, j_reg)
    sch.bind(sch.fuse(i_tile, j_tile, *part), "blockIdx.x")
    sch.bind(i_thread, "threadIdx.y")
    sch.bind(j_thread, "threadIdx.x")
    accumulators = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(accumulators, j_thread, preserve_unit_loops=True)

    for operand, contiguous_k in ((x, True), (w, shape.weight_nk)):
        index = next(n for n, r in enumerate(sch.get(block).reads) if r.source.same_as(operand))
        shared = sch.cache_read(block, index, "shared")
        sch.compute_at(shared, k_step, preserve_unit_loops=True)
        rows, cols = sch.get_loops(shared)[-2:]
        if contiguous_k:  # [rows, k] in global memory: stored [k, rows], the banks a warp reads
            sch.transform_layout(shared, ("write", 0), lambda a, b: (b, a))
        fused = sch.fuse(rows, cols)
        # 16-byte global loads along the rows where every row starts 16 bytes apart
        row, tile_row = (shape.k, c.block_k) if contiguous_k else (shape.n, c.block_n)
        vector = VECTOR_ELEMENTS if row % VECTOR_ELEMENTS == 0 == tile_row % VECTOR_ELEMENTS else 1
        _, ty, tx, lanes = sch.split(fused, [None, c.block_m // c.thread_m, c.block_n // c.thread_n, vector])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(lanes)
        registers = sch.cache_read(block, index, "local")
        sch.compute_at(registers, k_in, preserve_unit_loops=True)
        inner = sch.get_loops(registers)[-1]
        if sch.get(inner).extent.value % VECTOR_ELEMENTS == 0:
            sch.vectorize(inner)
    sch.decompose_reduction(block, k_step)
    for loop in (k_in, i_reg, j_reg):
        sch.unroll(loop)


def _sum_partials(sch: s_tir.Schedule, total: SBlockRV, output: SBlockRV | None) -> None:
    """The second kernel: each thread sums one output element's partials in part order and
    applies the epilogue (``output``, the copy into the function's output) to it."""
    result = sch.cache_write(total, 0, "local")
    if output is not None:
        sch.reverse_compute_inline(output)
    i, j = sch.get_loops(result)
    block_x, thread_x = sch.split(sch.fuse(i, j), [None, SUM_THREADS])
    sch.bind(block_x, "blockIdx.x")
    sch.bind(thread_x, "threadIdx.x")
    sch.compute_at(total, thread_x, preserve_unit_loops=True)
