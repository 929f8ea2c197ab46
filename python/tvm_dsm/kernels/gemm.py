"""A GEMM ``C = A @ W^T`` as one warp-specialized kernel: a producer warp feeds a ring of
shared-memory stages by TMA, consumer warpgroups multiply them on warpgroup MMAs; the CTAs of a
cluster share one operand's tiles through TMA multicast.

    producer (warp 0):   for each K tile: wait until its stage is empty in every CTA of the
                         cluster, TMA this CTA's part of the shared operand's tile into all of
                         them (multicast) and its own tile of the other operand, completing on
                         each CTA's "full" mbarrier of the stage
    consumers (1-2 WGs): for each K tile: wait until its stage is full, issue its wgmma group,
                         wait for the previous group, mark the previous stage empty in every
                         CTA of the cluster

A cluster of ``cluster`` CTAs runs neighbouring output tiles: along N (same rows of A, so A's
tile is shared: each CTA copies ``block_m / cluster`` of its rows for all) or along M (same
columns of W, W's tile shared). Each CTA then reads ``1 / cluster`` of the shared tile from L2,
where the tiles of mid-size GEMMs are what bounds them (their operand tiles come from L2 at
4-5 TB/s). No CTA barrier sits in the main loop: a stage is handed over by its mbarriers alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvm import tirx
from tvm.script import tirx as T

from ..annotations import CLUSTER_SIZE_KEY
from ..errors import ClusterError
from ..intrin.wgmma import WARPGROUP_ROWS, call_source, mma_async_source, wait_source
from ..schedule.cluster import RANK_TAG
from ..transform.tma_pipeline import encode_tensor_map

_PANEL = 64  # 16-bit columns of one 128-byte swizzle panel: the K tile
_ROW_BYTES = 128
_ATOM_BYTES = 8 * _ROW_BYTES
_ATOM_ROWS = 8
_WARPGROUP_THREADS = 128
_MAX_SHARED_BYTES = 227 * 1024
_C_TYPES = {"float16": ("half", "__half2", "__floats2half2_rn"),
            "bfloat16": ("nv_bfloat16", "__nv_bfloat162", "__floats2bfloat162_rn")}


@dataclass(frozen=True)
class GemmConfig:
    """``consumers`` warpgroups of 64 rows each (the CTA's ``block_m``), ``block_n`` columns,
    ``stages`` K tiles of 64 in flight; ``registers``: (producer, consumer) registers a thread
    after ``setmaxnreg``, or None to keep ptxas's; ``cluster`` CTAs ``along`` "n" (sharing A's
    tile) or "m" (sharing W's)."""

    block_n: int = 128
    consumers: int = 2
    stages: int = 4
    registers: tuple[int, int] | None = None
    raster: int = 8
    cluster: int = 1
    along: str = "n"

    @property
    def block_m(self) -> int:
        return WARPGROUP_ROWS * self.consumers

    @property
    def threads(self) -> int:
        return _WARPGROUP_THREADS * (1 + self.consumers)

    @property
    def tag(self) -> str:
        regs = "_r" if self.registers else ""
        return f"ws_{self.block_m}x{self.block_n}_s{self.stages}_c{self.cluster}{self.along}{regs}"


def shared_bytes(c: GemmConfig) -> int:
    return c.stages * (c.block_m + c.block_n) * _PANEL * 2 + _ATOM_BYTES


def check_config(M: int, N: int, K: int, c: GemmConfig) -> None:
    if M % c.block_m or N % c.block_n or K % _PANEL:
        raise ClusterError(f"{M}x{N}x{K}: the kernel takes multiples of {c.block_m} x {c.block_n} x {_PANEL}")
    if c.block_n % 16 or not 16 <= c.block_n <= 256:
        raise ClusterError(f"block_n {c.block_n}: a multiple of 16 up to 256 (wgmma's N)")
    if shared_bytes(c) > _MAX_SHARED_BYTES:
        raise ClusterError(f"{c}: {shared_bytes(c)} B of shared memory, more than {_MAX_SHARED_BYTES}")
    tiles_along = (N // c.block_n) if c.along == "n" else (M // c.block_m)
    shared_rows = c.block_m if c.along == "n" else c.block_n
    if tiles_along % c.cluster or shared_rows % (c.cluster * _ATOM_ROWS):
        raise ClusterError(f"{c}: {tiles_along} tiles along {c.along} or {shared_rows} shared rows "
                           f"do not split over {c.cluster} CTAs")


def _helpers(c: GemmConfig, dtype: str) -> dict[str, tuple[str, str]]:
    element, pair, convert = _C_TYPES[dtype]
    kind = "" if dtype == "float16" else "_bf16"
    mma = f"tvm_dsm_gemm_mma_n{c.block_n}{kind}"
    step = mma_async_source(c.block_n, dtype, a="a_desc + 2 * k", b="b_desc + 2 * k")
    setup = (f"  uint64_t a_desc = {mma}_desc(static_cast<uint32_t>(__cvta_generic_to_shared(a)), 16, {_ATOM_BYTES});\n"
             f"  uint64_t b_desc = {mma}_desc(static_cast<uint32_t>(__cvta_generic_to_shared(b)), 16, {_ATOM_BYTES});")
    regs = c.block_n // 2
    pack = f"tvm_dsm_gemm_pack{kind}"
    helpers = {
        "mma": (mma, call_source(mma, element, setup, _PANEL // 16, step)),
        "wait1": (f"tvm_dsm_gemm_wait1_r{regs}", wait_source(f"tvm_dsm_gemm_wait1_r{regs}", regs, 1)),
        "wait0": (f"tvm_dsm_gemm_wait0_r{regs}", wait_source(f"tvm_dsm_gemm_wait0_r{regs}", regs, 0)),
        "pack": (pack, f"""
__forceinline__ __device__ void {pack}({element}* dst, float lo, float hi) {{
  *reinterpret_cast<{pair}*>(dst) = {convert}(lo, hi);
}}
"""),
        # a consumer warpgroup frees a stage in every CTA of the cluster (its own included)
        "release": ("tvm_dsm_gemm_release", """
__forceinline__ __device__ void tvm_dsm_gemm_release(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
""" if c.cluster == 1 else f"""
__forceinline__ __device__ void tvm_dsm_gemm_release(uint32_t bar) {{
#pragma unroll
  for (uint32_t cta = 0; cta < {c.cluster}; ++cta) {{
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(cta));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(remote) : "memory");
  }}
}}
"""),
        "wait_empty": ("tvm_dsm_gemm_wait_empty", """
__forceinline__ __device__ void tvm_dsm_gemm_wait_empty(uint32_t bar, int phase) {
  asm volatile(
    "{\\n.reg .pred P1;\\nLAB_WAIT:\\n"
    "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\\n"
    "@P1 bra.uni DONE;\\nbra.uni LAB_WAIT;\\nDONE:\\n}\\n" :: "r"(bar), "r"(phase) : "memory");
}
"""),
        "multicast": ("tvm_dsm_gemm_multicast", """
__forceinline__ __device__ void tvm_dsm_gemm_multicast(uint32_t dst, unsigned long long map, int c0, int c1,
                                                       uint32_t bar, int mask) {
  asm volatile(
    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
    " [%0], [%1, {%2, %3}], [%4], %5;"
    :: "r"(dst), "l"(map), "r"(c0), "r"(c1), "r"(bar), "h"((unsigned short)mask) : "memory");
}
"""),
        "cluster_sync": ("tvm_dsm_gemm_cluster_sync", """
__forceinline__ __device__ void tvm_dsm_gemm_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\\nbarrier.cluster.wait.acquire;\\n" ::: "memory");
}
"""),
    }
    if c.registers:
        for role, (verb, n) in zip(("shrink", "grow"), (("dec", c.registers[0]), ("inc", c.registers[1]))):
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
    BM, BN, S, C = c.block_m, c.block_n, c.stages, c.cluster
    MT, NT, KT = M // BM, N // BN, K // _PANEL
    NF = BN // 16
    A_AT, W_AT = 0, S * BM * _PANEL
    SMEM = shared_bytes(c) // 2
    stage_bytes = (BM + BN) * _PANEL * 2
    h = _helpers(c, dtype)
    # clusters tile a grid of (MT, NT / C) or (MT / C, NT) cluster tiles
    CMT, CNT = (MT, NT // C) if c.along == "n" else (MT // C, NT)
    group = min(c.raster, CMT)
    reallocate = c.registers is not None
    a_box, w_box = (BM // C, BN) if c.along == "n" else (BM, BN // C)

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

    def multicast(name, dst, col, row, bar):
        return call("multicast", dst, T.address_of(maps[name]), T.Cast("int32", col), T.Cast("int32", row),
                    bar, (1 << C) - 1)

    clusters = CMT * CNT

    @T.prim_func(s_tir=True, check_well_formed=False)
    def fused(a: T.Buffer((M, K), dtype), w: T.Buffer((N, K), dtype), out: T.Buffer((M, N), dtype)):
        T.func_attr({"tirx.noalias": True})
        for bx in T.thread_binding(clusters, thread="blockIdx.x", annotations={CLUSTER_SIZE_KEY: C}):
            for rank in T.thread_binding(C, thread=RANK_TAG):
                for tx in T.thread_binding(c.threads, thread="threadIdx.x"):
                    with T.sblock("gemm"):
                        T.reads()
                        T.writes()
                        smem = T.sblock_alloc_buffer((SMEM,), dtype, scope="shared.dyn")
                        bars = T.sblock_alloc_buffer((2 * S,), "uint64", scope="shared.dyn")
                        acc = T.sblock_alloc_buffer((BN // 2,), "float32", scope="local")
                        base = T.int32((_ATOM_BYTES - T.Cast("int32", T.cuda.cvta_generic_to_shared(
                            smem.access_ptr("r"))) % _ATOM_BYTES) % _ATOM_BYTES // 2)
                        # grouped rasterization of the cluster tiles: ``group`` rows per column
                        first = T.meta_var(bx // (group * CNT) * group)
                        rows = T.meta_var(T.min(CMT - first, group))
                        cmt = T.meta_var(first + bx % (group * CNT) % rows)
                        cnt = T.meta_var(bx % (group * CNT) // rows)
                        mt = T.meta_var(cmt if c.along == "n" else cmt * C + rank)
                        nt = T.meta_var(cnt * C + rank if c.along == "n" else cnt)
                        if tx == 0:
                            for i in T.unroll(S):
                                T.ptx.mbarrier.init.shared__cta.b64(barrier(bars, i), 1)
                                T.ptx.mbarrier.init.shared__cta.b64(barrier(bars, S + i), c.consumers * C)
                            T.ptx.fence.mbarrier_init.release.cluster()
                        T.tvm_storage_sync("shared")
                        if C > 1:
                            T.evaluate(call("cluster_sync"))
                        if tx < _WARPGROUP_THREADS:
                            if reallocate:
                                T.evaluate(call("shrink"))
                            if tx == 0:
                                for kt in range(KT):
                                    T.evaluate(call("wait_empty", barrier(bars, S + kt % S), (kt // S) % 2 ^ 1))
                                    T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(barrier(bars, kt % S),
                                                                                     T.uint32(stage_bytes))
                                    if C == 1:
                                        T.evaluate(copy("a", smem_at(smem, base + A_AT + kt % S * BM * _PANEL),
                                                        kt * _PANEL, mt * BM, barrier(bars, kt % S)))
                                        T.evaluate(copy("w", smem_at(smem, base + W_AT + kt % S * BN * _PANEL),
                                                        kt * _PANEL, nt * BN, barrier(bars, kt % S)))
                                    elif c.along == "n":
                                        T.evaluate(multicast(
                                            "a", smem_at(smem, base + A_AT + kt % S * BM * _PANEL + rank * a_box * _PANEL),
                                            kt * _PANEL, mt * BM + rank * a_box, barrier(bars, kt % S)))
                                        T.evaluate(copy("w", smem_at(smem, base + W_AT + kt % S * BN * _PANEL),
                                                        kt * _PANEL, nt * BN, barrier(bars, kt % S)))
                                    else:
                                        T.evaluate(copy("a", smem_at(smem, base + A_AT + kt % S * BM * _PANEL),
                                                        kt * _PANEL, mt * BM, barrier(bars, kt % S)))
                                        T.evaluate(multicast(
                                            "w", smem_at(smem, base + W_AT + kt % S * BN * _PANEL + rank * w_box * _PANEL),
                                            kt * _PANEL, nt * BN + rank * w_box, barrier(bars, kt % S)))
                        else:
                            if reallocate:
                                T.evaluate(call("grow"))
                            wg = T.meta_var(tx // _WARPGROUP_THREADS - 1)
                            warp = T.meta_var(tx % _WARPGROUP_THREADS // 32)
                            lane = T.meta_var(tx % 32)
                            for i in T.unroll(BN // 2):
                                acc[i] = T.float32(0)
                            for kt in range(KT):
                                T.evaluate(T.cuda.mbarrier_wait(barrier(bars, kt % S), (kt // S) % 2))
                                T.evaluate(call("mma", T.address_of(acc[0]),
                                                T.address_of(smem[base + A_AT + kt % S * BM * _PANEL
                                                                  + wg * WARPGROUP_ROWS * _PANEL]),
                                                T.address_of(smem[base + W_AT + kt % S * BN * _PANEL])))
                                T.evaluate(call("wait1", T.address_of(acc[0])))
                                if kt > 0 and tx % _WARPGROUP_THREADS == 0:
                                    T.evaluate(call("release", barrier(bars, S + (kt - 1) % S)))
                            T.evaluate(call("wait0", T.address_of(acc[0])))
                            if tx % _WARPGROUP_THREADS == 0:
                                T.evaluate(call("release", barrier(bars, S + (KT - 1) % S)))
                            for f in T.unroll(NF):
                                for half in T.unroll(2):
                                    for e in T.unroll(0, 4, step=2):
                                        T.evaluate(call("pack", out.access_ptr(
                                            "w", offset=(mt * BM + wg * WARPGROUP_ROWS + warp * 16 + lane // 4
                                                         + half * 8) * N
                                            + nt * BN + f * 16 + e // 2 * 8 + lane % 4 * 2, extent=2),
                                            acc[_reg(f, half, e)], acc[_reg(f, half, e + 1)]))
                        if C > 1:
                            # no CTA leaves while a peer may still free a stage in it
                            T.evaluate(call("cluster_sync"))

    host = []
    for name, param, rows in (("a", fused.params[0], a_box), ("w", fused.params[1], w_box)):
        host += [tirx.Bind(maps[name], T.tvm_stack_alloca("tensormap", 1)),
                 encode_tensor_map(maps[name], param, rows, _PANEL, 0)]
    return fused.with_body(tirx.SeqStmt([*host, fused.body]))
