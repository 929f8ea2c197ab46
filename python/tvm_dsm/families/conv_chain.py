"""A chain of two convolutions (the second 1x1) as a GEMM chain over the pixel matrix: gather
kernels build the windows where the first convolution needs them, then the GEMM chain family's
plan runs (:mod:`tvm_dsm.rules.conv_chain`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware
from ..planners.fused_chain import ChainPlan
from ..planners.report import Plan
from ..rules.conv_chain import ConvChainConfig, ConvChainShape, conv_kernels, copies, find_conv_chain, gemm_view
from .base import ScheduleFamily
from .gemm_chain import GemmChain


@dataclass(frozen=True)
class ConvChainPlan(Plan):
    """The GEMM chain's plan plus the gather kernels' traffic (level ``gather``)."""

    config: ConvChainConfig
    chain: Plan

    def summary(self) -> str:
        c = self.config
        inputs = "a gather kernel first" if "gather" in self.bytes else "no copies (views of X and Out)"
        return f"conv chain as a {c.rows}x{c.depth} GEMM chain, {inputs}; " + self.chain.summary()


def conv_rank_key(plan: ConvChainPlan, hw: Hardware) -> float:
    """Its GEMM chain's prediction with the convolution chains' own fused bias on ``hw``
    (``conv_chains.fused_pick_bias``, fitted as the chain family's: the median measured over
    predicted time of fused and of unfused kernels; on the H100 C1-C8 at batch 1 and 8,
    bench/results/conv_chains/latest.json, docs/chains.md), plus the gather kernels' time."""
    fused = isinstance(plan.chain, ChainPlan)
    gather_us = plan.predicted_us - plan.chain.predicted_us
    return plan.chain.predicted_us * (hw.fitted("conv_chains.fused_pick_bias") if fused else 1.0) + gather_us


def _sizes(shape: ConvChainShape) -> list[tuple[int, int]]:
    """The GEMM input sizes (rows, depth) tried, in order: the pixels and window rounded up to
    the 16-row and 32-column granules of the GEMM tiles, then a depth of at least 3 pipeline
    steps of 32 (a 1x1 chain over 64 channels has 2)."""
    rows, depth = -(-shape.pixels // 16) * 16, -(-shape.depth // 32) * 32
    return list(dict.fromkeys([(rows, depth), (rows, max(depth, 96))]))


class ConvChain(ScheduleFamily):
    name = "conv_chain"
    traced = False  # gather kernels and the chain's kernels are assembled into a new function

    def recognize(self, func: tirx.PrimFunc) -> ConvChainShape:
        return find_conv_chain(func)

    def rank(self, shape: ConvChainShape, hw: Hardware) -> list[ConvChainPlan]:
        """The chain family's plans for the pixel matrix at the first input size any
        configuration fits, each with its gather kernels' HBM time added."""
        reasons = []
        for rows, depth in _sizes(shape):
            gathered = sum(copies(shape, rows, depth).values())
            try:
                plans = _GEMM_CHAIN.rank(_GEMM_CHAIN.recognize(gemm_view(shape, rows, depth)), hw)
            except ClusterError as err:
                reasons.append(f"{rows}x{depth}: {err}")
                continue
            level = {"gather": gathered} if gathered else {}
            return sorted((ConvChainPlan(bytes={**level, **p.bytes},
                                         seconds={**{k: v / hw.hbm_bw for k, v in level.items()}, **p.seconds},
                                         predicted_us=p.predicted_us + gathered / hw.hbm_bw * 1e6,
                                         config=ConvChainConfig(p.config, rows, depth), chain=p) for p in plans),
                          key=functools.partial(conv_rank_key, hw=hw))
        raise ClusterError("no GEMM chain schedule fits the convolution chain's pixel matrix: " + "; ".join(reasons))

    def apply(self, func: tirx.PrimFunc, config: ConvChainConfig, hw: Hardware) -> s_tir.Schedule:
        shape = find_conv_chain(func)
        chain = _GEMM_CHAIN.apply(gemm_view(shape, config.rows, config.depth), config.chain, hw).mod["main"]
        return s_tir.Schedule(conv_kernels(func, shape, chain, config.rows, config.depth), enable_check=False)


_GEMM_CHAIN = GemmChain()
