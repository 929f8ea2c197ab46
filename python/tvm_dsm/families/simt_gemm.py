"""A GEMM on the CUDA cores (:mod:`tvm_dsm.rules.simt_gemm`) at any M, N and K, for the products
the tensor-core families refuse: fp32 operands (exact to fp32), 16-bit ones of rows off 16 bytes.

The model: the CTAs' K steps run one after another, each waiting for its copies from global
memory (the HBM latency) unless the CTAs sharing an SM fill the wait with their multiply-adds
(CUDA-core FLOPs, and the shared-memory reads feeding them, at the SM's share of the measured
rates); rounds of resident CTAs follow each other; HBM and L2 bytes bound it from below; split-K
adds its partial tiles' traffic and the second kernel's launch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import tvm
from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware
from ..planners.split_k_gemm import plan_split_k_gemm
from ..rules.aligned_rows import ALIGNED_ELEMENTS, padded_columns
from ..rules.simt_gemm import FP32, SimtGemmConfig, check_config, find_simt_gemm, schedule_simt_gemm
from ..rules.split_k_gemm import GemmShape, whole
from .base import ScheduleFamily
from .kernel_plan import KernelPlan, hardware_rates

#: (block_m, block_n, thread_m, thread_n) of the space: the tiles that led a sweep of seven over
#: six shapes on the H200 (``bench/results/archive/simt_gemm_configs_s62.json``); 64-thread CTAs
#: and 2 x 8 or 4 x 8 blocks a thread trailed at every shape.
TILES = ((32, 64, 4, 4), (64, 64, 4, 4), (64, 128, 8, 8), (128, 128, 8, 8))
BLOCK_K = 16
SPLIT_K = (1, 2, 4, 8, 16, 32)
#: Threads an SM holds at once (every CUDA architecture since Volta: 64 warps).
SM_THREADS = 2048
#: Registers a thread needs besides its ``thread_m x thread_n`` accumulators and operand vectors
#: (addresses, loop state): an estimate for the occupancy bound.
OTHER_REGISTERS = 32
#: Independent accumulators an SM needs in flight to issue multiply-adds at its peak (its 128
#: lanes over a multiply-add's latency, and the shared loads between): the value whose picks
#: came closest to the sweep's best (1.07x of it, geomean over its six shapes).
CHAINS_FOR_PEAK = 4096
#: How much slower a step runs where the operands' rows are off 16 bytes (16-bit products: the
#: tile copies move an element a load): the measured over predicted time of the two such
#: products large enough to be bound by their steps, 257x1024x1021 bf16 (49.8 us, 13.3 predicted)
#: and 64x4096x1021 fp16 (27.7, 13.7), geomean (H200, ``bench/results/generality/latest.json``).
ELEMENT_COPY_SLOWDOWN = 2.7
#: Predictions this close to the best count as equal: the model's terms are estimates.
TIE = 1.05


class SimtGemm(ScheduleFamily):
    name = "simt_gemm"
    symbolic_rows = True

    def recognize(self, func: tirx.PrimFunc) -> GemmShape:
        return find_simt_gemm(func)

    def space(self, shape: GemmShape, hw: Hardware) -> list[SimtGemmConfig]:
        configs = []
        for (bm, bn, tm, tn), split in itertools.product(TILES, SPLIT_K):
            config = SimtGemmConfig(bm, bn, BLOCK_K, tm, tn, split)
            try:
                check_config(shape, config)
            except ClusterError:
                continue
            if ctas_per_sm(config, _element_bytes(shape), hw):
                configs.append(config)
        return configs

    def predict(self, shape: GemmShape, config: SimtGemmConfig, hw: Hardware) -> KernelPlan:
        c, rate = config, hardware_rates(hw)
        m, n, k = whole(shape.m, c.block_m), whole(shape.n, c.block_n), whole(shape.k, c.block_k * c.split_k)
        ctas = m // c.block_m * (n // c.block_n) * c.split_k
        resident = ctas_per_sm(c, _element_bytes(shape), hw)
        sharing = min(resident, math.ceil(ctas / hw.sm_count))
        step_flops = 2 * c.block_m * c.block_n * c.block_k
        step_compute = step_flops / (rate["fp32"] / hw.sm_count)
        if shape.dtype != FP32:  # rows off 16 bytes: the tile copies move an element a load
            step_compute *= ELEMENT_COPY_SLOWDOWN
        steps = k // (c.block_k * c.split_k)
        rounds = math.ceil(ctas / (hw.sm_count * resident))
        chains = c.threads * c.thread_m * c.thread_n  # independent accumulators of a CTA
        # one CTA's step: its copies' wait, then its multiply-adds at the issue rate its
        # independent accumulators reach; the SM's CTAs overlap
        alone = hw.latency_ns["hbm"] * 1e-9 + step_compute / min(1.0, chains / CHAINS_FOR_PEAK)
        together = sharing * step_compute / min(1.0, sharing * chains / CHAINS_FOR_PEAK)
        main = rounds * steps * max(alone, together)
        partials = 2 * c.split_k * m * n * 4 if c.split_k > 1 else 0
        elem = _element_bytes(shape)
        traffic = {"hbm": elem * (shape.m * shape.k + shape.n * shape.k) + 4 * shape.m * shape.n + partials,
                   "l2": elem * (m * k * (n // c.block_n) + n * k * (m // c.block_m))}
        seconds = {level: amount / rate[level] for level, amount in traffic.items()}
        seconds["main_loop"] = main
        launches = 2 if c.split_k > 1 else 1
        seconds["launch"] = launches * hw.fitted("gemm.launch_s")
        total = max(v for name, v in seconds.items() if name != "launch") + seconds["launch"]
        return KernelPlan(bytes=traffic, seconds=seconds, predicted_us=total * 1e6, config=c)

    def rank(self, shape: GemmShape, hw: Hardware) -> list[KernelPlan]:
        plans = [self.predict(shape, c, hw) for c in self.space(shape, hw)]
        if not plans:
            raise ClusterError(f"no CUDA-core GEMM configuration fits {shape.m}x{shape.n}x{shape.k}")
        best = min(p.predicted_us for p in plans)

        def order(plan: KernelPlan) -> tuple:
            # within TIE of the best: fewer partial tiles (a second kernel the model barely charges)
            tied = plan.predicted_us <= best * TIE
            return (not tied, plan.config.split_k if tied else 0, plan.predicted_us)

        return sorted(plans, key=order)

    def apply(self, func: tirx.PrimFunc, config: SimtGemmConfig, hw: Hardware) -> s_tir.Schedule:
        return schedule_simt_gemm(func, config)


def pads_faster(shape: GemmShape, hw: Hardware) -> bool:
    """Whether one 16-bit product of ``shape`` (rows off 16 bytes) is predicted faster over
    padded copies on the tensor cores (:func:`padded_tensor_core_us`) than on the CUDA cores;
    never for fp32 (no padded path), a symbolic row count (planned per range of rows) or a single
    row (its GEMV reads W once, copies would read and write it again)."""
    if shape.dtype == FP32 or shape.symbolic_rows or shape.m == 1:
        return False
    one = dataclasses.replace(shape, products=1)
    padded = padded_tensor_core_us(one, hw)
    return padded is not None and padded < SimtGemm().rank(one, hw)[0].predicted_us


def padded_tensor_core_us(shape: GemmShape, hw: Hardware) -> float | None:
    """Predicted time of a 16-bit product whose operand rows are off 16 bytes, run as
    :mod:`tvm_dsm.rules.aligned_rows` runs it: X and W copied to rows of whole 16-byte pieces
    (each copy a kernel reading and writing its operand at the HBM rate; a padded N also copies
    the output's real columns out), then the tensor-core split-K GEMM's best plan over the
    padded extents; None where that GEMM has no plan."""
    k, n = whole(shape.k, ALIGNED_ELEMENTS), whole(shape.n, padded_columns(shape))
    aligned = dataclasses.replace(shape, k=k, n=n)
    try:
        plans = plan_split_k_gemm(aligned, hw, padded=True)
    except ClusterError:
        return None
    elem = _element_bytes(shape)
    copied = elem * (shape.m * (shape.k + k) + shape.n * shape.k + n * k)
    copies = 2
    if n != shape.n:
        copied, copies = copied + elem * shape.m * (n + shape.n), copies + 1
    return plans[0].predicted_us + 1e6 * (copied / hardware_rates(hw)["hbm"] + copies * hw.fitted("gemm.launch_s"))


def _element_bytes(shape: GemmShape) -> int:
    return tvm.DataType(shape.dtype).bits // 8


def ctas_per_sm(config: SimtGemmConfig, operand_bytes: int, hw: Hardware) -> int:
    """CTAs of ``config`` (operands of ``operand_bytes`` elements) resident on one SM at once:
    its threads, shared memory and registers."""
    c = config
    registers = c.thread_m * c.thread_n + c.thread_m + c.thread_n + OTHER_REGISTERS
    return min(SM_THREADS // c.threads, hw.smem_per_sm // c.shared_bytes(operand_bytes),
               hw.regs_per_sm // (c.threads * registers))
