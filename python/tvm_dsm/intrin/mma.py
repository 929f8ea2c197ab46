"""mma.sync tensor intrinsics: TVM's CUDA library plus the few tvm-dsm adds, registered on use.

TVM registers its CUDA tensor intrinsics by parsing ~250 TVMScript functions, seconds of work a
planner never needs. :data:`mma` stands for TVM's ``tvm.s_tir.tensor_intrin.cuda`` module and
imports it on its first attribute access, registering tvm-dsm's additions (the DSM accumulator
store, fp8 ldmatrix from dynamic shared memory) in the same step.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import tvm
import tvm_ffi
from tvm.s_tir import TensorIntrin

from ..errors import ClusterError
from ..schedule.dsm import DSM_SCOPE
from ..script_parsing import on_a_shallow_stack
from .registry import register_once

#: Operand types mma.sync multiplies into fp32, and PTX's name for each.
OPERAND_TYPES = {"float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3"}
FP8 = "float8_e4m3fn"
#: Integer operands: mma.sync multiplies int8 into exact int32 sums (m16n8k32, the fp8 layout).
INT8 = "int8"
#: The type mma.sync accumulates each operand type in.
ACCUMULATOR_TYPES = {**dict.fromkeys(OPERAND_TYPES, "float32"), INT8: "int32"}

TILE = 16  # fragment rows and columns: mma.sync m16n8kK issued as 16x16xK by TVM's intrinsics
VECTOR = 16  # bytes per cp.async and per DSM load
PAD = 8  # fp16 elements of padding per shared row: ldmatrix rows land in different banks

#: Tensor intrinsic storing a 16x16 fp32 accumulator fragment into a DSM slice (plain stores,
#: which tvm_dsm.transform.lower_cluster turns into the CTA's own shared-memory stores).
MMA_STORE_F32_DSM = "tvm_dsm.mma_store_16x16_f32_dsm"
#: The same for an int32 accumulator fragment (int8 products).
MMA_STORE_I32_DSM = "tvm_dsm.mma_store_16x16_i32_dsm"

#: fp32 elements of padding after each row of an accumulator tile stored to shared memory by
#: :data:`MMA_STORE_F32_DSM` (rows ``cols + 8`` apart: storage_align factor 16, offset 8). One
#: store of a warp covers 8 rows x 4 column pairs of a fragment; rows a multiple of 32 floats
#: apart put those in 4 banks (8-way conflicts), rows 8 floats off put them in 16 (2-way, the
#: least for 32 scalar stores).
ACCUMULATOR_PAD = 8


def accumulator_tile_bytes(rows: int, cols: int) -> int:
    """Shared-memory bytes of a ``rows x cols`` fp32 (or int32) accumulator tile with its row
    padding."""
    return rows * (cols + ACCUMULATOR_PAD) * 4

#: ldmatrix of 8-bit A [m, k] and B [n, k] tiles from dynamic shared memory (TVM 0.27 registers
#: the fp8 and int8 ones for static shared memory only). ldmatrix cannot transpose 8-bit
#: elements, so 8-bit products need K-contiguous operands: X [m, k] and W [n, k].
LDMATRIX_FP8_A_DYN = "tvm_dsm.mma_ldmatrix_e4m3_a_dyn"
LDMATRIX_FP8_B_TRANS_DYN = "tvm_dsm.mma_ldmatrix_e4m3_b_trans_dyn"
LDMATRIX_I8_A_DYN = "tvm_dsm.mma_ldmatrix_i8_a_dyn"
LDMATRIX_I8_B_TRANS_DYN = "tvm_dsm.mma_ldmatrix_i8_b_trans_dyn"


def _import_shallow(name: str) -> ModuleType:
    """Import ``name`` on a shallow stack (:func:`~tvm_dsm.script_parsing.on_a_shallow_stack`):
    its TVMScript parses faster there."""
    return on_a_shallow_stack(lambda: importlib.import_module(name))


@functools.cache
def library() -> ModuleType:
    """TVM's CUDA tensor-intrinsic module, with tvm-dsm's mma.sync additions registered."""
    cuda = _import_shallow("tvm.s_tir.tensor_intrin.cuda")
    for name, accumulator in ((MMA_STORE_F32_DSM, "float32"), (MMA_STORE_I32_DSM, "int32")):
        TensorIntrin.register(name, *cuda.get_mma_store_intrin(accumulator, 8, DSM_SCOPE, False), override=True)
    for dtype, a, b in ((FP8, LDMATRIX_FP8_A_DYN, LDMATRIX_FP8_B_TRANS_DYN),
                        (INT8, LDMATRIX_I8_A_DYN, LDMATRIX_I8_B_TRANS_DYN)):
        TensorIntrin.register(a, *cuda.get_ldmatrix_intrin(32, dtype, "A", False, "shared.dyn"), override=True)
        TensorIntrin.register(b, *cuda.get_ldmatrix_intrin(32, dtype, "B", True, "shared.dyn"), override=True)
    return cuda


class _Library:
    """Attribute access to :func:`library`'s module, which it loads on first use."""

    def __getattr__(self, name: str):
        return getattr(library(), name)


#: TVM's ``tvm.s_tir.tensor_intrin.cuda``, loaded on first attribute access.
mma = _Library()


def element_bytes(dtype: str) -> int:
    return 1 if dtype in (FP8, INT8) else 2


def k_tile(dtype: str) -> int:
    """The K depth of one mma.sync: 16 for 16-bit operands (m16n8k16), 32 for 8-bit ones (m16n8k32)."""
    return 32 // element_bytes(dtype)


def pad(dtype: str) -> int:
    """Padding per shared row in elements of ``dtype``: 16 bytes, as for fp16."""
    return PAD * 2 // element_bytes(dtype)


def retyped(name: str, dtype: str) -> str:
    """The fp16 intrinsic ``name`` for another 16-bit operand type, registered on first use.
    TVM 0.27 ships ldmatrix and mma.sync intrinsics for fp16 only; ldmatrix moves b16 whatever
    the type, and mma.sync differs only in its operand type name, so the bf16 ones are the fp16
    ones with the types renamed (and their ldmatrix calls typed: :func:`_ldmatrix_typed`)."""
    if dtype == "float16":
        return name
    def retyped():
        fp16 = TensorIntrin.get(name)
        return tuple(_ldmatrix_typed(tvm.script.from_source(f.script().replace('"float16"', f'"{dtype}"')
                                                            .replace('"fp16"', f'"{OPERAND_TYPES[dtype]}"')), dtype)
                     for f in (fp16.desc, fp16.impl))

    return register_once(f"tvm_dsm.{name}_{dtype}", retyped)


def _ldmatrix_typed(func, dtype: str):
    """``func`` with its ldmatrix calls typed ``dtype``. The script of a call prints no type, and
    parsed back it is int8, which TVM's CUDA codegen takes for an 8-bit transposed ldmatrix and
    emulates with a gather loop whose indices are wrong for these tiles (a bf16 W stored [K, N]
    read outside shared memory: an illegal address on the H200)."""
    ldmatrix = tvm.ir.Op.get("tirx.ptx_legacy.ldmatrix")

    def typed(call):
        if call.op.same_as(ldmatrix):
            return tvm.ir.Call(call.op, call.args, call.attrs, ret_ty=tvm.ir.PrimType(dtype))
        return call

    return func.with_body(tvm_ffi.structural_map(func.body, [(tvm.ir.Call, typed)]))


def fragment_map(i, j):
    """Shared 16x16 tile -> (tile row, tile col, lane, register) of mma.sync's fragment layout."""
    return (i // TILE, j // TILE, *mma.shared_16x16_to_ldmatrix_32x8_layout(i % TILE, j % TILE))


def byte_fragment_map(i, j):
    """Shared 16x32 8-bit tile (rows of A, or of B stored [n, k]) -> mma.sync m16n8k32's layout."""
    return (i // TILE, j // 32, *mma.shared_16x32_to_ldmatrix_32x16_layout(i % TILE, j % 32))


def operand_map(dtype: str):
    """The shared tile -> fragment map of ``dtype`` operands."""
    return byte_fragment_map if element_bytes(dtype) == 1 else fragment_map


def fill_intrinsic(dtype: str) -> str:
    """The accumulator fragment's zero fill for ``dtype`` operands."""
    return mma.MMA_fill_16x16_i32_INTRIN if dtype == INT8 else mma.MMA_fill_16x16_f32_INTRIN


def dsm_store_intrinsic(dtype: str) -> str:
    """The accumulator fragment's store into a DSM slice for ``dtype`` operands."""
    return MMA_STORE_I32_DSM if dtype == INT8 else MMA_STORE_F32_DSM


def operand_intrinsics(dtype: str, weight_nk: bool) -> tuple[str, str, str]:
    """(ldmatrix of X, ldmatrix of W, mma.sync) for ``dtype`` operands and W's layout."""
    if element_bytes(dtype) == 1:
        if not weight_nk:
            raise ClusterError(f"{dtype} GEMMs need the weight stored [n, k]: ldmatrix cannot "
                               "transpose 8-bit elements")
        if dtype == INT8:
            return LDMATRIX_I8_A_DYN, LDMATRIX_I8_B_TRANS_DYN, mma.MMA_i8i8i32_TRANS_B_INTRIN
        return LDMATRIX_FP8_A_DYN, LDMATRIX_FP8_B_TRANS_DYN, mma.MMA_e4m3e4m3f32_TRANS_B_INTRIN
    if weight_nk:
        load_w, multiply = mma.LDMATRIX_f16_B_TRANS_DYN_INTRIN, mma.MMA_f16f16f32_TRANS_B_INTRIN
    else:
        load_w, multiply = mma.LDMATRIX_f16_B_DYN_INTRIN, mma.MMA_f16f16f32_INTRIN
    return (retyped(mma.LDMATRIX_f16_A_DYN_INTRIN, dtype), retyped(load_w, dtype),
            retyped(multiply, dtype))
