"""A GEMM chain as cluster split-K GEMM kernels (two, or three with a gated chain's gate apart),
``H`` through global memory: the "no fusion" point of the chain's design space.

Fusion keeps ``H`` on chip, but a fused chain pays for it: GEMM0's partial tiles are
all-exchanged (DSM bytes grow with the square of the cluster), the clusters owning different
columns of ``H`` write fp32 partials of the whole output, and each CTA's steps form a latency
chain. Where ``H`` is small next to the weights (M = 128 and below) that costs more than its
round trip: on the H100 our two split-K GEMMs ran G4 in 17.5 us against 28.5 for the best
fused plan (``bench/results/chains_summary.json``). So the chain family plans both, and
:func:`tvm_dsm.plan` ranks them by the same model.

Kernel 1 computes GEMM0 (for a gated chain both products on one output tile) with the
activation (or ``silu(gate) * up``) and the cast as its epilogue, and writes ``H`` in the
function's own type, so the result is the function's, rounding included. Kernel 2 multiplies
``H`` by ``W2`` (TMA copies read ``H`` like a parameter: :mod:`tvm_dsm.transform.tma_pipeline`).

A gated chain's products may also run apart (``UnfusedChainConfig.gate``): one kernel writes
the gate's fp32 sums to global memory, the next computes the up product with ``silu(gate) * up``
as its epilogue. Both products in one kernel do twice the work per output tile, so that kernel
launches half the CTAs (86 for 132 SMs on S3's 128x128 tiles); apart, each fills the machine
for the price of the gate's fp32 round trip and one more launch. With mma.sync main loops the
one-kernel form ran 1.4x slower than a dense layer of the same bytes; with wgmma it measured
faster than the gate apart on all 8 SwiGLU FFNs at M = 128 (bench/results/chains.json), and
the planner weighs both.

All kernels are scheduled in one s_tir schedule, so a MetaSchedule trace records them. The
schedule is created with ``enable_check=False``: the first kernel's decomposed reductions leave
two writers of its partial sums in the root scope, which then stops being a "stage pipeline",
and s_tir refuses compute_at anywhere in such a scope, also for the later kernels' blocks,
which touch none of the first's buffers. Each kernel's instructions are those of a dense
layer's schedule, which is built with the checks on (:func:`schedule_split_k_gemm`); the up
kernel of a separate gate keeps its sums in shared memory for an epilogue with thread loops of
its own, as the quantized GEMM's does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import s_tir, tirx

from ..errors import ClusterError
from ..transform.programmatic_launch import launch_programmatically
from .fused_chain import ChainShape, find_chain
from .split_k_gemm import GemmShape, SplitKGemmConfig, apply_split_k_gemm, check_config, check_epilogue_in_shared


@dataclass(frozen=True)
class UnfusedChainConfig:
    """Each GEMM's split-K configuration; ``gate``: a gated chain's gate product as a kernel of
    its own with this configuration (``gemm0`` is then the up product's), None: both products
    in ``gemm0``'s kernel. ``programmatic_launch``: each kernel launches while the previous one
    runs (the planner turns it off where that would crowd GEMM1's CTAs onto GEMM0's idle SMs,
    :func:`tvm_dsm.planners.unfused_chain.crowded`); not part of the point's identity."""

    gemm0: SplitKGemmConfig
    gemm1: SplitKGemmConfig
    gate: SplitKGemmConfig | None = None
    programmatic_launch: bool = field(default=True, compare=False)


def gemm_shapes(shape: ChainShape, gate_apart: bool = False) -> tuple[GemmShape, GemmShape]:
    """GEMM0 (``M x N x K``; gated: two products, or one when the gate runs apart with the same
    shape) and GEMM1 (``M x L x N``) as dense layers."""
    products = 1 if gate_apart else len(shape.gemm0)
    return (GemmShape(shape.m, shape.n, shape.k, True, products=products),
            GemmShape(shape.m, shape.l, shape.n, True))


def check_unfused_config(shape: ChainShape, config: UnfusedChainConfig) -> None:
    """Raise :class:`~tvm_dsm.errors.ClusterError` naming what a kernel does not fit."""
    apart = config.gate is not None
    if apart and not shape.gated:
        raise ClusterError("a separate gate kernel needs a gated chain (two GEMM0 products)")
    first, second = gemm_shapes(shape, apart)
    check_config(first, config.gemm0)
    check_config(second, config.gemm1)
    if apart:
        check_config(first, config.gate)
        check_epilogue_in_shared(first, config.gemm0, "the up kernel")


def schedule_unfused_chain(func: tirx.PrimFunc, config: UnfusedChainConfig) -> s_tir.Schedule:
    """Schedule ``func`` (a GEMM chain, see :func:`~tvm_dsm.rules.fused_chain.find_chain`) as
    two split-K GEMM kernels (:func:`tvm_dsm.planners.unfused_chain.plan_unfused_chain` plans
    them)."""
    sch = s_tir.Schedule(func, enable_check=False)  # see the module docstring
    blocks, shape = find_chain(sch)
    check_unfused_config(shape, config)
    first, second = gemm_shapes(shape, config.gate is not None)
    products = blocks.gemm0
    if config.gate is not None:
        gate, up = products
        apply_split_k_gemm(sch, [gate], [], first, config.gate)  # its sums, written to G
        products = [up]
    # An epilogue reading the gate's kernel gets thread loops of its own (s_tir moves a block
    # into another's loop only with all its producers there).
    apply_split_k_gemm(sch, products, [blocks.combine], first, config.gemm0,
                       in_registers=config.gate is None)
    apply_split_k_gemm(sch, [blocks.gemm1], blocks.epilogue, second, config.gemm1)
    # Each kernel's launch overlaps the previous one's tail, or (the function's one
    # annotation, whatever the kernels' configurations asked) none does.
    launch_programmatically(sch, config.programmatic_launch)
    return sch
