"""Warpgroup MMA (sm_90a ``wgmma.mma_async``) as an s_tir tensor intrinsic.

mma.sync reaches about two thirds of the H100's tensor-core rate; ``wgmma`` reaches all of it,
with the weight tile read straight from shared memory instead of through ldmatrix. A warpgroup
(4 warps) issues one ``m64nNk16`` together; warp ``w`` of it holds rows ``16w..16w+15`` of the
64-row accumulator, in the same register layout as N/16 mma.sync 16x16 fragments. So the
schedule keeps TVM's per-warp model -- each warp multiplies its 16 rows -- and the intrinsic
is the per-warp 16 x N x K step:

- X's 16 x K fragment comes from registers (the ``rs`` form), loaded by TVM's ldmatrix
  intrinsic as for mma.sync;
- W's N x K tile is read from shared memory through a matrix descriptor. It must be the
  128-byte-swizzled K-contiguous tile a TMA copy lands (:mod:`tvm_dsm.transform.tma_pipeline`
  points the descriptor at the tile's slot);
- the accumulator is TVM's warp-scope fragment buffer, N/16 fragments of 16x16.

Each call issues the K/16 multiplies and waits for them (``wait_group 0``): the operand
registers and the shared tile are free again when it returns, which is what the surrounding
pipeline (one CTA barrier per K step) assumes.
"""

from __future__ import annotations

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

from ..transform.tma_pipeline import WGMMA_HELPER_PREFIX as HELPER_PREFIX
from .tensor_core import TILE, mma

WARPGROUP_ROWS = 64  # rows of one wgmma: 4 warps x 16
MAX_N = 256  # wgmma's widest tile

_PTX_TYPE = {"float16": "f16", "bfloat16": "bf16"}
_C_TYPE = {"float16": "half", "bfloat16": "nv_bfloat16"}
_SWIZZLE_ROW_BYTES = 128  # the TMA tile's rows; 8 of them make one swizzle atom
_K_STEP_BYTES = TILE * 2  # one 16-deep K step of 16-bit elements along a swizzled row


def helper_source(name: str, n: int, depth: int, dtype: str) -> str:
    """CUDA of one call: ``depth / 16`` wgmma ``m64n{n}k16`` (A from registers, B by
    descriptor), committed and awaited. The descriptor addresses W's swizzled tile: 128-byte
    swizzle, 8-row atoms 1024 bytes apart; each K step starts 32 bytes further along the row
    (the hardware applies the swizzle to the address it forms)."""
    steps = depth // TILE
    regs = n // 2
    d_list = ", ".join(f"%{r}" for r in range(regs))
    a_list = ", ".join(f"%{regs + r}" for r in range(4))
    d_ops = ", ".join(f'"+f"(d[{r}])' for r in range(regs))
    ptx = _PTX_TYPE[dtype]
    return f"""
__forceinline__ __device__ void {name}(float* d, const {_C_TYPE[dtype]}* a, const {_C_TYPE[dtype]}* b) {{
  const uint32_t* ar = reinterpret_cast<const uint32_t*>(a);
  uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(b));
  asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
#pragma unroll
  for (int k = 0; k < {steps}; ++k) {{
    uint64_t desc = (uint64_t)(((base + k * {_K_STEP_BYTES}) & 0x3FFFF) >> 4)
                  | ((uint64_t)1 << 16)
                  | ((uint64_t)({8 * _SWIZZLE_ROW_BYTES} >> 4) << 32)
                  | ((uint64_t)1 << 62);
    asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} "
      "{{{d_list}}}, {{{a_list}}}, %{regs + 4}, p, 1, 1, 0;\\n}}\\n"
      : {d_ops}
      : "r"(ar[4 * k]), "r"(ar[4 * k + 1]), "r"(ar[4 * k + 2]), "r"(ar[4 * k + 3]),
        "l"(desc), "r"(1));
  }}
  asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
}}
"""


def wgmma_intrin(n: int, depth: int, dtype: str) -> str:
    """The tensor intrinsic multiplying a warp's 16 x ``depth`` X fragments (warp scope, the
    ldmatrix layout) by an ``n x depth`` W tile in shared memory into ``n / 16`` accumulator
    fragments; registered on first use."""
    if dtype not in _PTX_TYPE or n % TILE or not TILE <= n <= MAX_N or depth % TILE:
        raise ValueError(f"no wgmma for {n}x{depth} {dtype} tiles")
    name = f"{HELPER_PREFIX}m64n{n}k{depth}_{_PTX_TYPE[dtype]}"
    if TensorIntrin.get(name, allow_missing=True) is None:
        TensorIntrin.register(name, *_desc_impl(name, n, depth, dtype))
    return name


def _desc_impl(name: str, n: int, depth: int, dtype: str):
    frags, cols = depth // TILE, n // TILE
    layout = mma.shared_16x16_to_ldmatrix_32x8_layout
    source = helper_source(name, n, depth, dtype)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (frags, 32, 8), dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (n, depth), dtype, align=64, offset_factor=1, scope="shared.dyn")
        C = T.match_buffer(c, (cols, 32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:cols, 0:32, 0:8], A[0:frags, 0:32, 0:8], B[0:n, 0:depth])
            T.writes(C[0:cols, 0:32, 0:8])
            for i, j, k in T.grid(TILE, n, depth):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    lane_c, reg_c = T.meta_var(layout(vi, vj % TILE))
                    lane_a, reg_a = T.meta_var(layout(vi, vk % TILE))
                    T.reads(C[vj // TILE, lane_c, reg_c], A[vk // TILE, lane_a, reg_a], B[vj, vk])
                    T.writes(C[vj // TILE, lane_c, reg_c])
                    C[vj // TILE, lane_c, reg_c] = C[vj // TILE, lane_c, reg_c] + T.Cast(
                        "float32", A[vk // TILE, lane_a, reg_a]) * T.Cast("float32", B[vj, vk])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        A = T.match_buffer(a, (frags, 32, 8), dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (n, depth), dtype, align=64, offset_factor=1, scope="shared.dyn",
                           strides=[s0, s1])
        C = T.match_buffer(c, (cols, 32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:cols, 0:32, 0:8], A[0:frags, 0:32, 0:8], B[0:n, 0:depth])
            T.writes(C[0:cols, 0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.cuda.func_call(name, T.address_of(C[0, tx, 0]),
                                            T.address_of(A[0, tx, 0]), B.access_ptr("r"),
                                            source_code=source))

    return desc, impl
