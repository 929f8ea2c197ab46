"""A GEMM ``C = A @ W^T`` as one warp-specialized kernel: a producer warp feeds a ring of
shared-memory stages by TMA, consumer warpgroups multiply them on warpgroup MMAs.

    producer (warp 0):   for each K tile: wait until its stage is empty, TMA A's and W's tiles
                         into it, completing on the stage's "full" mbarrier
    consumers (1-2 WGs): for each K tile: wait until its stage is full, issue its wgmma group,
                         wait for the previous group, mark the previous stage empty

No CTA barrier sits in the main loop: a stage is handed over by its two mbarriers alone, so a
consumer warpgroup runs as far ahead as the stages filled for it, and the producer as far as
the stages freed. Each consumer warpgroup owns 64 rows of the CTA's tile and all its columns
(``m64nN`` with N = ``block_n`` up to 256: the widest MMA reads the fewest shared bytes per
product). With ``registers`` the producer gives its registers to the consumers
(``setmaxnreg``), which hold 64 x ``block_n`` fp32 accumulators.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from ..errors import ClusterError
from ..transform.tma_pipeline import encode_tensor_map
from ..intrin.wgmma import WARPGROUP_ROWS, call_source, mma_async_source, wait_source

_PANEL = 64  # 16-bit columns of one 128-byte swizzle panel: the K tile
_ROW_BYTES = 128
_ATOM_BYTES = 8 * _ROW_BYTES
_WARPGROUP_THREADS = 128
_MAX_SHARED_BYTES = 227 * 1024
_C_TYPES = {"float16": ("half", "__half2", "__floats2half2_rn"),
            "bfloat16": ("nv_bfloat16", "__nv_bfloat162", "__floats2bfloat162_rn")}


@dataclass(frozen=True)
class GemmConfig:
    """``consumers`` warpgroups of 64 rows each (the CTA's ``block_m``), ``block_n`` columns,
    ``stages`` K tiles of 64 in flight; ``registers``: (producer, consumer) registers a thread
    after ``setmaxnreg``, or None to keep ptxas's."""

    block_n: int = 128
    consumers: int = 2
    stages: int = 4
    registers: tuple[int, int] | None = None
    raster: int = 8
    #: CTAs of a persistent grid, each walking tiles ``ctas`` apart (its consumers' epilogue
    #: overlapping the producer's copies for the next tile); 0: a CTA per tile
    ctas: int = 0

    @property
    def block_m(self) -> int:
        return WARPGROUP_ROWS * self.consumers

    @property
    def threads(self) -> int:
        return _WARPGROUP_THREADS * (1 + self.consumers)


def shared_bytes(c: GemmConfig) -> int:
    return c.stages * (c.block_m + c.block_n) * _PANEL * 2 + _ATOM_BYTES


def check_config(M: int, N: int, K: int, c: GemmConfig) -> None:
    if M % c.block_m or N % c.block_n or K % _PANEL:
        raise ClusterError(f"{M}x{N}x{K}: the kernel takes multiples of {c.block_m} x {c.block_n} x {_PANEL}")
    if c.block_n % 16 or not 16 <= c.block_n <= 256:
        raise ClusterError(f"block_n {c.block_n}: a multiple of 16 up to 256 (wgmma's N)")
    if shared_bytes(c) > _MAX_SHARED_BYTES:
        raise ClusterError(f"{c}: {shared_bytes(c)} B of shared memory, more than {_MAX_SHARED_BYTES}")


def _helpers(c: GemmConfig, dtype: str) -> dict[str, tuple[str, str]]:
    element, pair, convert = _C_TYPES[dtype]
    kind = "" if dtype == "float16" else "_bf16"
    mma = f"tvm_dsm_gemm_mma_n{c.block_n}{kind}"
    step = mma_async_source(c.block_n, dtype, a="a_desc + 2 * k", b="b_desc + 2 * k")
    setup = (f"  uint64_t a_desc = {mma}_desc(static_cast<uint32_t>(__cvta_generic_to_shared(a)), 16, {_ATOM_BYTES});\n"
             f"  uint64_t b_desc = {mma}_desc(static_cast<uint32_t>(__cvta_generic_to_shared(b)), 16, {_ATOM_BYTES});")
    regs = c.block_n // 2
    pack = f"tvm_dsm_gemm_pack{kind}"
    arrive = "tvm_dsm_gemm_arrive"
    helpers = {
        "mma": (mma, call_source(mma, element, setup, _PANEL // 16, step)),
        "wait1": (f"tvm_dsm_gemm_wait1_r{regs}", wait_source(f"tvm_dsm_gemm_wait1_r{regs}", regs, 1)),
        "wait0": (f"tvm_dsm_gemm_wait0_r{regs}", wait_source(f"tvm_dsm_gemm_wait0_r{regs}", regs, 0)),
        "pack": (pack, f"""
__forceinline__ __device__ void {pack}({element}* dst, float lo, float hi) {{
  *reinterpret_cast<{pair}*>(dst) = {convert}(lo, hi);
}}
"""),
        "arrive": (arrive, f"""
__forceinline__ __device__ void {arrive}(uint32_t bar) {{
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\\n" :: "r"(bar) : "memory");
}}
"""),
    }
    if c.registers:
        for role, (verb, n) in zip(("release", "acquire"), (("dec", c.registers[0]), ("inc", c.registers[1]))):
            name = f"tvm_dsm_gemm_setmaxnreg_{verb}{n}"
            helpers[role] = (name, f"""
__forceinline__ __device__ void {name}() {{
  asm volatile("setmaxnreg.{verb}.sync.aligned.u32 {n};\\n" ::: "memory");
}}
""")
    return helpers


def _reg(f, half, e):
    """A thread's accumulator register of 16-column fragment ``f``, row half ``half``, element
    ``e`` of its 4 columns (the wgmma accumulator layout)."""
    return f * 8 + e // 2 * 4 + half * 2 + e % 2


def gemm_kernel(M: int, N: int, K: int, dtype: str, c: GemmConfig) -> tirx.PrimFunc:
    check_config(M, N, K, c)
    BM, BN, S = c.block_m, c.block_n, c.stages
    MT, NT, KT = M // BM, N // BN, K // _PANEL
    NF = BN // 16
    A_AT, W_AT = 0, S * BM * _PANEL
    SMEM = shared_bytes(c) // 2
    stage_bytes = (BM + BN) * _PANEL * 2
    h = _helpers(c, dtype)
    group = min(c.raster, MT)
    reallocate = c.registers is not None

    def call(role, *args):
        name, source = h[role]
        return T.cuda.func_call(name, *args, source_code=source)

    def barrier(bars, i):
        return T.cuda.cvta_generic_to_shared(bars.access_ptr("r")) + T.uint32(8) * T.Cast("uint32", i)

    def smem_at(smem, elem):
        return T.cuda.cvta_generic_to_shared(smem.access_ptr("r")) + T.Cast("uint32", elem * 2)

    maps = {name: tirx.Var(f"{name}_tensormap", T.handle("tensormap").ty) for name in ("a", "w")}

    def copy(name, dst, col, row, bar):
        return T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](
            dst, T.address_of(maps[name]), T.Cast("int32", col), T.Cast("int32", row), bar)

    tiles = MT * NT
    grid = min(c.ctas, tiles) if c.ctas else tiles
    rounds = -(-tiles // grid)  # tiles a CTA walks, the last round partial

    @T.prim_func(s_tir=True, check_well_formed=False)
    def fused(a: T.Buffer((M, K), dtype), w: T.Buffer((N, K), dtype), out: T.Buffer((M, N), dtype)):
        T.func_attr({"tirx.noalias": True})
        for bx in T.thread_binding(grid, thread="blockIdx.x"):
            for tx in T.thread_binding(c.threads, thread="threadIdx.x"):
                with T.sblock("gemm"):
                    T.reads()
                    T.writes()
                    smem = T.sblock_alloc_buffer((SMEM,), dtype, scope="shared.dyn")
                    bars = T.sblock_alloc_buffer((2 * S,), "uint64", scope="shared.dyn")
                    acc = T.sblock_alloc_buffer((BN // 2,), "float32", scope="local")
                    base = T.int32((_ATOM_BYTES - T.Cast("int32", T.cuda.cvta_generic_to_shared(
                        smem.access_ptr("r"))) % _ATOM_BYTES) % _ATOM_BYTES // 2)
                    if tx == 0:
                        for i in T.unroll(S):
                            T.ptx.mbarrier.init.shared__cta.b64(barrier(bars, i), 1)
                            T.ptx.mbarrier.init.shared__cta.b64(barrier(bars, S + i), c.consumers)
                        T.ptx.fence.mbarrier_init.release.cluster()
                    T.tvm_storage_sync("shared")
                    if tx < _WARPGROUP_THREADS:
                        if reallocate:
                            T.evaluate(call("release"))
                        if tx == 0:
                            for r in range(rounds):
                                if bx + r * grid < tiles:
                                    # grouped rasterization: ``group`` rows of tiles per column
                                    tile = T.meta_var(bx + r * grid)
                                    first = T.meta_var(tile // (group * NT) * group)
                                    rows = T.meta_var(T.min(MT - first, group))
                                    for kt in range(KT):
                                        it = T.meta_var(r * KT + kt)
                                        T.evaluate(T.cuda.mbarrier_wait(barrier(bars, S + it % S), (it // S) % 2 ^ 1))
                                        T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(barrier(bars, it % S),
                                                                                         T.uint32(stage_bytes))
                                        T.evaluate(copy("a", smem_at(smem, base + A_AT + it % S * BM * _PANEL),
                                                        kt * _PANEL, (first + tile % (group * NT) % rows) * BM,
                                                        barrier(bars, it % S)))
                                        T.evaluate(copy("w", smem_at(smem, base + W_AT + it % S * BN * _PANEL),
                                                        kt * _PANEL, tile % (group * NT) // rows * BN,
                                                        barrier(bars, it % S)))
                    else:
                        if reallocate:
                            T.evaluate(call("acquire"))
                        wg = T.meta_var(tx // _WARPGROUP_THREADS - 1)
                        warp = T.meta_var(tx % _WARPGROUP_THREADS // 32)
                        lane = T.meta_var(tx % 32)
                        for r in range(rounds):
                            if bx + r * grid < tiles:
                                tile = T.meta_var(bx + r * grid)
                                first = T.meta_var(tile // (group * NT) * group)
                                rows = T.meta_var(T.min(MT - first, group))
                                mt = T.meta_var(first + tile % (group * NT) % rows)
                                nt = T.meta_var(tile % (group * NT) // rows)
                                for i in T.unroll(BN // 2):
                                    acc[i] = T.float32(0)
                                for kt in range(KT):
                                    it = T.meta_var(r * KT + kt)
                                    T.evaluate(T.cuda.mbarrier_wait(barrier(bars, it % S), (it // S) % 2))
                                    T.evaluate(call("mma", T.address_of(acc[0]),
                                                    T.address_of(smem[base + A_AT + it % S * BM * _PANEL
                                                                      + wg * WARPGROUP_ROWS * _PANEL]),
                                                    T.address_of(smem[base + W_AT + it % S * BN * _PANEL])))
                                    T.evaluate(call("wait1", T.address_of(acc[0])))
                                    if kt > 0 and tx % _WARPGROUP_THREADS == 0:
                                        T.evaluate(call("arrive", barrier(bars, S + (it - 1) % S)))
                                T.evaluate(call("wait0", T.address_of(acc[0])))
                                if tx % _WARPGROUP_THREADS == 0:
                                    T.evaluate(call("arrive", barrier(bars, S + (r * KT + KT - 1) % S)))
                                for f in T.unroll(NF):
                                    for half in T.unroll(2):
                                        for e in T.unroll(0, 4, step=2):
                                            T.evaluate(call("pack", out.access_ptr(
                                                "w", offset=(mt * BM + wg * WARPGROUP_ROWS + warp * 16 + lane // 4
                                                             + half * 8) * N
                                                + nt * BN + f * 16 + e // 2 * 8 + lane % 4 * 2, extent=2),
                                                acc[_reg(f, half, e)], acc[_reg(f, half, e + 1)]))

    host = []
    for name, param, rows in (("a", fused.params[0], BM), ("w", fused.params[1], BN)):
        host += [tirx.Bind(maps[name], T.tvm_stack_alloca("tensormap", 1)),
                 encode_tensor_map(maps[name], param, rows, _PANEL, 0)]
    return fused.with_body(tirx.SeqStmt([*host, fused.body]))
