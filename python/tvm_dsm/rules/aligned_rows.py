"""A 16-bit GEMM whose operand rows do not start 16 bytes apart (K not a multiple of 8; with
weights ``[K, N]``, also N), given zero-filled copies of its operands whose rows do.

The tensor-core GEMM copies its tiles in 16-byte pieces (TMA), so it cannot read such rows; the
CUDA-core GEMM can, at a fraction of the tensor cores' rate. :func:`pad_rows_to_vectors` pads
each product (s_tir's ``pad_einsum``) to a multiple of 8 elements in K, and for ``[K, N]``
weights in N: copies of X and W with zeros past their rows' ends, the product over the padded
extents, and for a padded N the output's real columns copied out of the padded product. Split
into operators (:mod:`tvm_dsm.transform.split_operators`) the copies are element-wise kernels
and the product a GEMM the tensor-core family takes. Zeros past K add nothing to the sums.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir import SBlock, SBlockRealize
from tvm.s_tir.schedule.schedule import ScheduleError

from ..annotations import COPIED_OPERANDS_KEY
from ..errors import ClusterError, passes
from ..ir import find_all, is_reduction, with_block_body
from ..intrin.mma import VECTOR
from .padded_gated_tiles import share_padded_input
from .simt_gemm import FP32, OPERAND_TYPES
from .split_k_gemm import GemmShape, check_rows_aligned, find_gemm

#: 16-bit elements in one 16-byte copy: what padded rows are whole multiples of.
ALIGNED_ELEMENTS = VECTOR // 2


def _misaligned_gemm(sch: s_tir.Schedule) -> tuple[list, GemmShape] | None:
    """The product blocks and shape of ``sch``'s function where :func:`pad_rows_to_vectors`
    applies: one or two 16-bit products whose operand rows are off 16 bytes, elementwise blocks
    after them; else None."""
    try:
        products, _, shape = find_gemm(sch, operand_types=OPERAND_TYPES)
    except (ClusterError, ScheduleError):  # not a GEMM's form (no root block: s_tir says so)
        return None
    if shape.dtype == FP32 or passes(check_rows_aligned, shape):
        return None
    return products, shape


def padded_columns(shape: GemmShape) -> int:
    """What N is padded to a multiple of: 8 where the weights ``[K, N]`` have rows of N elements
    off 16 bytes, else 1."""
    return 1 if shape.weight_nk or shape.n % ALIGNED_ELEMENTS == 0 else ALIGNED_ELEMENTS


def misaligned_products(func: tirx.PrimFunc) -> GemmShape | None:
    """The shape of ``func``'s product(s) where :func:`pad_rows_to_vectors` applies, else None."""
    found = _misaligned_gemm(s_tir.Schedule(func))
    return None if found is None else found[1]


def pad_rows_to_vectors(func: tirx.PrimFunc) -> tirx.PrimFunc | None:
    """``func`` with its products reading zero-filled copies of their operands padded to whole
    16-byte rows (the module docstring); None where :func:`misaligned_products` finds none, or
    s_tir cannot pad them (a fused weight read from a row on is not an einsum)."""
    sch = s_tir.Schedule(func)
    found = _misaligned_gemm(sch)
    if found is None:
        return None
    try:
        products, shape = found
        for product in products:
            sch.pad_einsum(product, [1, padded_columns(shape), ALIGNED_ELEMENTS])
            sch.annotate(product, COPIED_OPERANDS_KEY, True)
        return _parameter_reads_first(share_padded_input(sch.mod["main"]))
    except (ClusterError, ScheduleError):
        return None


def _parameter_reads_first(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the element-wise blocks that read parameters only (the zero-filled copies)
    first: split into operators, they are then one run of element-wise blocks before the
    products, not a block after a product that the product's operator would take."""
    root = func.body.block
    nests = list(root.body.seq)
    params = list(func.params)

    def reads_parameters(nest) -> bool:
        (block,) = find_all(nest, SBlock)
        return all(any(r.source.same_as(p) for p in params) for r in block.reads) and not is_reduction(block)

    ordered = [n for n in nests if reads_parameters(n)] + [n for n in nests if not reads_parameters(n)]
    return func.with_body(SBlockRealize([], True, with_block_body(root, tirx.SeqStmt(ordered), root.alloc_buffers)))
