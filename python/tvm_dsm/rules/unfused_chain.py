"""A GEMM chain as two cluster split-K GEMM kernels,
``H`` through global memory: the "no fusion" point of the chain's design space.

Fusion keeps ``H`` on chip, but a fused chain pays for it: GEMM0's partial tiles are
all-exchanged (DSM bytes grow with the square of the cluster), the clusters owning different
columns of ``H`` write fp32 partials of the whole output, and each CTA's steps form a latency
chain. Where ``H`` is small next to the weights (M = 128 and below) that often costs more than
its round trip (docs/chains.md). So the chain family plans both, and :func:`tvm_dsm.plan` ranks
them by the same model.

Kernel 1 computes GEMM0 (for a gated chain both products on one output tile) with the
activation (or ``silu(gate) * up``) and the cast as its epilogue, and writes ``H`` in the
function's own type, so the result is the function's, rounding included. Kernel 2 multiplies
``H`` by ``W2`` (TMA copies read ``H`` like a parameter: :mod:`tvm_dsm.transform.tma_pipeline`).

A gated chain's two products share the first kernel (each CTA one output tile of both, in one
K loop). A gate kernel of its own (its fp32 sums through global memory, the up kernel applying
``silu(gate) * up`` as its epilogue) would fill the machine with twice the CTAs, but is slower
wherever the planner would pick it (docs/chains.md).

All kernels are scheduled in one s_tir schedule, so a MetaSchedule trace records them. s_tir's
checks stay on where they can, since MetaSchedule replays a trace with them on. Where the first
kernel splits K over a cluster they cannot: once its rank loop is bound to the cluster, s_tir's
region-cover analysis of the root scope (re-run when the second kernel's partial product is
blockized) reports that kernel's main-loop block uncovered by its producers, and refuses to
place its operand tiles; binding the ranks after both kernels' tiles are placed is refused too
(``bind`` then finds no compact dataflow). Such a chain is scheduled
with ``enable_check=False`` (each kernel's instructions are those of a dense layer's schedule,
built with the checks on: :func:`schedule_split_k_gemm`), and its trace replays only with the
checks off (:func:`tvm_dsm.driver.replay`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import s_tir, tirx
from tvm.s_tir.schedule.schedule import ScheduleError

from ..hardware import Hardware
from ..transform.programmatic_launch import launch_programmatically
from .fused_chain import ChainShape, find_chain, first_gemm
from .split_k_gemm import GemmShape, SplitKGemmConfig, apply_split_k_gemm, check_config


@dataclass(frozen=True)
class UnfusedChainConfig:
    """Each GEMM's split-K configuration (a gated chain: both products in ``gemm0``'s kernel).
    ``programmatic_launch``: the second kernel launches while the first one runs (the planner
    turns it off where that would crowd GEMM1's CTAs onto GEMM0's idle SMs,
    :func:`tvm_dsm.planners.unfused_chain.crowded`); not part of the point's identity."""

    gemm0: SplitKGemmConfig
    gemm1: SplitKGemmConfig
    programmatic_launch: bool = field(default=True, compare=False)


def gemm_shapes(shape: ChainShape) -> tuple[GemmShape, GemmShape]:
    """GEMM0 (``M x N x K``; gated: two products) and GEMM1 (``M x L x N``) as dense layers."""
    return first_gemm(shape), GemmShape(shape.m, shape.l, shape.n, shape.w2_nk, shape.dtype)


def check_unfused_config(shape: ChainShape, config: UnfusedChainConfig, hw: Hardware) -> None:
    """Raise :class:`~tvm_dsm.errors.ClusterError` naming what a kernel does not fit on ``hw``."""
    first, second = gemm_shapes(shape)
    check_config(first, config.gemm0, hw)
    check_config(second, config.gemm1, hw)


def schedule_unfused_chain(func: tirx.PrimFunc, config: UnfusedChainConfig, hw: Hardware) -> s_tir.Schedule:
    """Schedule ``func`` (a GEMM chain, see :func:`~tvm_dsm.rules.fused_chain.find_chain`) as
    two split-K GEMM kernels within ``hw``'s limits
    (:func:`tvm_dsm.planners.unfused_chain.plan_unfused_chain` plans them)."""
    try:
        return _schedule(s_tir.Schedule(func), config, hw)
    except ScheduleError:  # see the module docstring
        return _schedule(s_tir.Schedule(func, enable_check=False), config, hw)


def _schedule(sch: s_tir.Schedule, config: UnfusedChainConfig, hw: Hardware) -> s_tir.Schedule:
    blocks, shape = find_chain(sch)
    check_unfused_config(shape, config, hw)
    first, second = gemm_shapes(shape)
    apply_split_k_gemm(sch, blocks.gemm0, [blocks.combine], first, config.gemm0)
    apply_split_k_gemm(sch, [blocks.gemm1], blocks.epilogue, second, config.gemm1)
    # Each kernel's launch overlaps the previous one's tail, or (the function's one
    # annotation, whatever the kernels' configurations asked) none does.
    launch_programmatically(sch, config.programmatic_launch)
    return sch
