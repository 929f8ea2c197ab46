"""Warpgroup MMA (sm_90a ``wgmma.mma_async``) as an s_tir tensor intrinsic.

mma.sync reaches about two thirds of the H100's tensor-core rate; ``wgmma`` reaches all of it,
with both operand tiles read straight from shared memory instead of through ldmatrix. A
warpgroup (4 warps) issues one ``m64nNk16`` together; warp ``w`` of it holds rows
``16w..16w+15`` of the 64-row accumulator, in the same register layout as N/16 mma.sync 16x16
fragments. So the schedule keeps TVM's per-warp model -- each warp multiplies its 16 rows --
and the intrinsic is the per-warp 16 x N x K step:

- X's 16 x K rows and W's N x K tile are read from shared memory through matrix descriptors.
  Both are the 128-byte-swizzled tiles TMA copies land
  (:mod:`tvm_dsm.transform.tma_pipeline` points the helper at the tiles' slot): X's
  K-contiguous; W's K-contiguous too, or, for a weight stored ``[K, N]``, a K x N tile in
  panels of K rows of 64 N-contiguous elements (MN-major, the transpose bit of 16-bit wgmma: no
  transposing copy); the warp's X descriptor starts at its warpgroup's first row, 16 rows per
  warp before its own;
- the accumulator is TVM's warp-scope fragment buffer, N/16 fragments of 16x16.

Each call issues the K/16 multiplies (fp8 e4m3: K/32 of ``m64nNk32``) as one group and
returns with at most that group in flight (``wait_group 1``; with a gated layer's two calls per
K step, both steps' groups: ``wait_group 2``): the multiply of step k overlaps the barrier, the
next tile's copy and wait of step k+1. The TMA pass keeps that legal: it refills a slot two
steps after its multiply was issued instead of one, and waits for every group after the loop.
fp8 calls wait for their group and add it to the accumulator in fp32 (see
:func:`helper_source`).

The descriptor and MMA statement builders here also serve the attention kernel
(:mod:`tvm_dsm.kernels.attention`: A from registers, B MN-major).
"""

from __future__ import annotations

from tvm.script import tirx as T

from ..annotations import WGMMA_HELPER_PREFIX as HELPER_PREFIX
from ..script_parsing import pseudo_files_skipped
from .registry import register_once
from .mma import TILE, mma

WARPGROUP_ROWS = 64  # rows of one wgmma: 4 warps x 16
MAX_N = 256  # wgmma's widest tile

_PTX_TYPE = {"float16": "f16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3"}
_C_TYPE = {"float16": "half", "bfloat16": "nv_bfloat16", "float8_e4m3fn": "__nv_fp8_e4m3"}
_SWIZZLE_ROW_BYTES = 128  # the TMA tile's rows; 8 of them make one swizzle atom
_K_STEP_BYTES = 32  # one K step along a swizzled row: 16 16-bit or 32 fp8 elements


def k_per_step(dtype: str) -> int:
    """K depth of one wgmma: 32 bytes of the row (k16 for 16-bit types, k32 for fp8)."""
    return _K_STEP_BYTES // (1 if dtype == "float8_e4m3fn" else 2)


def descriptor_source(name: str) -> str:
    """CUDA of ``{name}_desc(address, lead, stride)``: the matrix descriptor of a 128-byte-swizzled
    shared tile at ``address``. ``stride``: bytes between 8-row swizzle atoms along the strided
    dimension (1024 for rows of 128 bytes); ``lead``: bytes between the 64-element column panels of
    an MN-major tile (ignored for K-major tiles, whose K steps stay inside one panel)."""
    return f"""
__forceinline__ __device__ uint64_t {name}_desc(uint32_t address, uint32_t lead, uint32_t stride) {{
  return (uint64_t)((address & 0x3FFFF) >> 4) | ((uint64_t)(lead >> 4) << 16)
       | ((uint64_t)(stride >> 4) << 32) | ((uint64_t)1 << 62);
}}
"""


def mma_async_source(n: int, dtype: str, b: str, a: str | None = None, b_transposed: bool = False,
                     accumulate: str = "1", acc: str = "d") -> str:
    """One ``wgmma.mma_async m64n{n}k{16|32}`` statement accumulating into ``acc[0 .. n/2)``.
    ``b``: C expression of B's descriptor; ``a``: of A's, or None for A from registers
    ``a32[4k .. 4k+3]`` (the mma.sync A-fragment layout of the warp's 16 rows); ``accumulate``:
    C expression, 0 to overwrite ``acc``; ``b_transposed``: B is MN-major (N contiguous; 16-bit
    types only: fp8 wgmma has no transpose operands and reads both tiles K-major)."""
    regs = n // 2
    ptx = _PTX_TYPE[dtype]
    fp8 = dtype == "float8_e4m3fn"
    if fp8 and (b_transposed or a is None):
        raise ValueError("fp8 wgmma reads both operands K-major from shared memory")
    d_list = ", ".join(f"%{r}" for r in range(regs))
    outputs = ", ".join(f'"+f"({acc}[{r}])' for r in range(regs))
    if a is None:
        a_operand = "{" + ", ".join(f"%{regs + 1 + i}" for i in range(4)) + "}"
        inputs = [f'"r"(a32[4 * k + {i}])' for i in range(4)]
        transposes = f", {int(b_transposed)}"
    else:
        a_operand = f"%{regs + 1}"
        inputs = [f'"l"({a})']
        transposes = "" if fp8 else f", 0, {int(b_transposed)}"
    b_operand = f"%{regs + len(inputs) + 1}"
    inputs = [f'"r"({accumulate})', *inputs, f'"l"({b})']
    return f"""    asm volatile(
      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k{k_per_step(dtype)}.f32.{ptx}.{ptx} "
      "{{{d_list}}}, {a_operand}, {b_operand}, p, 1, 1{transposes};\\n}}\\n"
      : {outputs}
      : {", ".join(inputs)});
"""


def wait_source(name: str, regs: int, pending: int) -> str:
    """CUDA of ``{name}(d)``: wait until at most ``pending`` warpgroup MMA groups are in flight,
    then fence ``d[0 .. regs)`` so the compiler reads the accumulators only after the wait."""
    return f"""
__forceinline__ __device__ void {name}(float* d) {{
  asm volatile("wgmma.wait_group.sync.aligned {pending};\\n" ::: "memory");
#pragma unroll
  for (int r = 0; r < {regs}; ++r) asm volatile("" : "+f"(d[r]) :: "memory");
}}
"""


def call_source(name: str, ctype: str, setup: str, steps: int, step: str, finish: str = "") -> str:
    """CUDA of ``{name}(d, a, b)`` (with its descriptor function): ``setup`` (descriptors and
    registers), ``wgmma.fence``, ``steps`` MMA statements ``step`` (a C statement of ``k``)
    committed as one group, then ``finish`` (waits)."""
    return descriptor_source(name) + f"""
__forceinline__ __device__ void {name}(float* d, const {ctype}* a, const {ctype}* b) {{
{setup}
  asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");
#pragma unroll
  for (int k = 0; k < {steps}; ++k) {{
{step}  }}
  asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");
{finish}}}
"""


def helper_source(name: str, n: int, depth: int, dtype: str, in_flight: int = 1,
                  b_mn_major: bool = False) -> str:
    """CUDA of one call: ``depth / k`` wgmma ``m64n{n}k{k}`` (k: :func:`k_per_step`), both
    operands by descriptor, committed as one group, returning with at most ``in_flight``
    groups in flight, this one among them (fp8: awaited and added to the accumulator in fp32).
    Descriptors: 128-byte swizzle, 8-row atoms 1024 bytes apart; each K step starts 32 bytes
    further along a K-contiguous row (the hardware applies the swizzle to the address it forms):
    the descriptors are formed once and a step adds 32 / 16 to their start address field.
    ``b_mn_major``: W's tile is panels of ``depth`` rows of 64 N-contiguous elements (128
    bytes), one panel after the other, a K step 16 of their rows further on."""
    ctype = _C_TYPE[dtype]
    warp_rows = TILE * _SWIZZLE_ROW_BYTES  # bytes of one warp's 16 rows of X
    atoms = 8 * _SWIZZLE_ROW_BYTES
    fp8 = dtype == "float8_e4m3fn"
    b_step = (k_per_step(dtype) * _SWIZZLE_ROW_BYTES if b_mn_major else _K_STEP_BYTES) // 16
    step = mma_async_source(n, dtype, a=f"a_desc + k * {_K_STEP_BYTES // 16}",
                            b=f"b_desc + k * {b_step}", b_transposed=b_mn_major,
                            **({"accumulate": "k", "acc": "t"} if fp8 else {}))
    if fp8:
        # Hopper's fp8 wgmma adds its products into the accumulator with about 14 mantissa
        # bits: K = 14336 reached a relative error of 1.9e-3 against float64 (the fp16
        # output's rounding alone is 2e-4). Each call's 128-deep tile therefore accumulates into
        # fresh registers that are added to the fp32 accumulator in full precision, the way
        # DeepSeek-V3 promotes every 128 of K; the group is awaited in the call.
        finish = f"""  asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");
#pragma unroll
  for (int r = 0; r < {n // 2}; ++r) {{
    asm volatile("" : "+f"(t[r]) :: "memory");
    d[r] += t[r];
  }}
"""
        accumulators = f"\n  float t[{n // 2}];"
    else:
        finish = f"""  asm volatile("wgmma.wait_group.sync.aligned {in_flight};\\n" ::: "memory");\n"""
        accumulators = ""
    setup = f"""  uint32_t warp = ((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) >> 5;
  uint64_t a_desc = {name}_desc(static_cast<uint32_t>(__cvta_generic_to_shared(a)) - (warp & 3) * {warp_rows}, 16, {atoms});
  uint64_t b_desc = {name}_desc(static_cast<uint32_t>(__cvta_generic_to_shared(b)), {depth * _SWIZZLE_ROW_BYTES if b_mn_major else 16}, {atoms});{accumulators}"""
    return call_source(name, ctype, setup, depth // k_per_step(dtype), step, finish)


def wgmma_intrin(n: int, depth: int, dtype: str, in_flight: int = 1, b_mn_major: bool = False) -> str:
    """The tensor intrinsic multiplying a warp's 16 x ``depth`` rows of X by an ``n x depth``
    W tile (``b_mn_major``: a ``depth x n`` one, W stored ``[K, N]``; 16-bit types, panels of
    :data:`MN_MAJOR_N` columns), both in shared memory, into ``n / 16`` accumulator fragments;
    registered on first use. ``in_flight``: groups a call may leave in flight, one per call of a
    K step (a gated layer's gate and up in one loop: 2, so neither call waits for the other's group)."""
    if dtype not in _PTX_TYPE or n % TILE or not TILE <= n <= MAX_N or depth % k_per_step(dtype):
        raise ValueError(f"no wgmma for {n}x{depth} {dtype} tiles")
    if b_mn_major and (dtype == "float8_e4m3fn" or n % MN_MAJOR_N):
        raise ValueError(f"MN-major wgmma operands are 16-bit tiles of {MN_MAJOR_N}-wide panels, got {n} of {dtype}")
    groups = f"_g{in_flight}" if in_flight > 1 else ""
    name = f"{HELPER_PREFIX}m64n{n}k{depth}_{_PTX_TYPE[dtype]}{groups}{'_mn' if b_mn_major else ''}"
    return register_once(name, lambda: _desc_impl(name, n, depth, dtype, in_flight, b_mn_major))


def _desc_impl(name: str, n: int, depth: int, dtype: str, in_flight: int, b_mn_major: bool):
    cols = n // TILE
    layout = mma.shared_16x16_to_ldmatrix_32x8_layout
    source = helper_source(name, n, depth, dtype, in_flight, b_mn_major)
    b_shape = (depth, n) if b_mn_major else (n, depth)

    def b_index(j, k):
        return (k, j) if b_mn_major else (j, k)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (TILE, depth), dtype, align=64, offset_factor=1, scope="shared.dyn")
        B = T.match_buffer(b, b_shape, dtype, align=64, offset_factor=1, scope="shared.dyn")
        C = T.match_buffer(c, (cols, 32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:cols, 0:32, 0:8], A[0:TILE, 0:depth], B[0:b_shape[0], 0:b_shape[1]])
            T.writes(C[0:cols, 0:32, 0:8])
            for i, j, k in T.grid(TILE, n, depth):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    lane, reg = T.meta_var(layout(vi, vj % TILE))
                    bj, bk = T.meta_var(b_index(vj, vk))
                    T.reads(C[vj // TILE, lane, reg], A[vi, vk], B[bj, bk])
                    T.writes(C[vj // TILE, lane, reg])
                    C[vj // TILE, lane, reg] = C[vj // TILE, lane, reg] + T.Cast(
                        "float32", A[vi, vk]) * T.Cast("float32", B[bj, bk])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        a0 = T.int32()
        a1 = T.int32()
        b0 = T.int32()
        b1 = T.int32()
        A = T.match_buffer(a, (TILE, depth), dtype, align=64, offset_factor=1, scope="shared.dyn",
                           strides=[a0, a1])
        B = T.match_buffer(b, b_shape, dtype, align=64, offset_factor=1, scope="shared.dyn",
                           strides=[b0, b1])
        C = T.match_buffer(c, (cols, 32, 8), "float32", align=64, offset_factor=16, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:cols, 0:32, 0:8], A[0:TILE, 0:depth], B[0:b_shape[0], 0:b_shape[1]])
            T.writes(C[0:cols, 0:32, 0:8])
            for tx in T.thread_binding(0, 32, "threadIdx.x"):
                T.evaluate(T.cuda.func_call(name, T.address_of(C[0, tx, 0]), A.access_ptr("r"),
                                            B.access_ptr("r"), source_code=source))

    return desc, impl


#: The tile widths the split-K planner gives warpgroup MMAs (its ``BLOCK_N``): 64-256 in steps
#: of 16 but 240, which ran 1.47-1.53x the fastest configuration, and 1.12-1.28x the 256-wide
#: tile of the same height, on all four layers it was measured on (H200,
#: bench/results/archive/model_gemm_widths_s76.json, tile_widths_s75.json).
TILE_WIDTHS = (64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 256)
#: The width of a panel of an MN-major W tile: one 128-byte row of 16-bit elements a K row, what
#: a TMA box lands swizzled; a wider tile is panels one after the other (the descriptor's
#: leading offset steps from one to the next).
MN_MAJOR_N = _SWIZZLE_ROW_BYTES // 2


def register_planned() -> None:
    """Register the intrinsic of every width, operand type and in-flight count a plan may use: a
    MetaSchedule database's traces name them, and a fresh process replaying one has scheduled
    nothing that would register them."""
    with pseudo_files_skipped():
        for n in TILE_WIDTHS:
            for dtype in _PTX_TYPE:
                for in_flight in (1, 2):
                    depth = _SWIZZLE_ROW_BYTES // (_K_STEP_BYTES // k_per_step(dtype))
                    wgmma_intrin(n, depth, dtype, in_flight)
                    if n % MN_MAJOR_N == 0 and dtype != "float8_e4m3fn":
                        wgmma_intrin(n, depth, dtype, in_flight, b_mn_major=True)
