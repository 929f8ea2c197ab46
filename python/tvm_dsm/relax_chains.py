"""Group a Relax model's GEMM chains into one TIR function each, so the chain family sees them.

Relax's ``FuseOps`` makes one operator group per matmul (a reduction ends a group), so a
chain ``act(x @ W1^T) @ W2^T`` or SwiGLU's ``(silu(x @ Wg^T) * (x @ Wu^T)) @ W2^T`` reaches TIR
as two or three functions and the chain family (fused through DSM, or unfused with
programmatic launch between its kernels, whichever its model predicts faster) never sees it.
:func:`FuseGemmChains` groups them first with Relax's pattern fusion, after
``FuseTransposeMatmul`` and ``LegalizeOps``: a matmul of fp16 or bf16 operands with fp32
accumulation and weights ``[out, in]`` (or two over the same input), elementwise operators, a
second such matmul, then elementwise operators (a cast, say). ``FuseTIR`` then makes one
PrimFunc of each group, and :func:`merge_elementwise` inlines the elementwise blocks into the
one the chain family expects between the matmuls.
"""

from __future__ import annotations

import itertools

import tvm
from tvm import s_tir, tirx
from tvm.relax.dpl import DFPattern, wildcard

from .errors import ClusterError
from .ir import is_reduction, root_blocks
from .relax_grouping import call_tir, group_calls
from .rules.fused_chain import merge_elementwise_blocks
from .rules.split_k_gemm import find_gemm_operands

#: Name of the composite functions the pattern fusion makes.
COMPOSITE = "tvm_dsm.gemm_chain"
_MAX_ELEMENTWISE = 3  # operators between the matmuls, and after the second


def chain_patterns(matmuls: DFPattern) -> list:
    """The chains' dataflow patterns (each first matmul a call of a function ``matmuls``
    matches), most operators first (pattern fusion takes the first
    match): ``between`` elementwise operators from the first matmul (or, gated, from the gate's
    activation times the up product) to the second matmul, ``after`` (at least one: the chain
    family writes its output from an elementwise block) behind it."""
    patterns = []
    for between, after, gated in itertools.product(range(_MAX_ELEMENTWISE, 0, -1),
                                                   range(_MAX_ELEMENTWISE, 0, -1), (True, False)):
        x = wildcard()
        h = call_tir(x, wildcard(), func=matmuls)
        if gated:
            if between < 2:
                continue
            h = call_tir(call_tir(h), call_tir(x, wildcard(), func=matmuls))
        for _ in range(between - (2 if gated else 0)):
            h = call_tir(h)
        out = call_tir(h, wildcard())
        for _ in range(after):
            out = call_tir(out)
        patterns.append(out)
    return patterns


def _kind(func: tirx.PrimFunc) -> str | None:
    """``"matmul"`` (one matmul block, weights ``[out, in]``, a constant row count: the chain
    family plans constant extents), ``"elementwise"`` (no reduction) or None."""
    blocks = root_blocks(func)
    if not any(is_reduction(b) for b in blocks):
        return "elementwise"
    if len(blocks) != 1:
        return None
    try:
        shape = find_gemm_operands(blocks[0])[0]
        return "matmul" if shape.weight_nk and not shape.symbolic_rows else None
    except ClusterError:
        return None


def _accept(kinds: list[str | None], sources: list[str | None]) -> bool:
    """Each call's PrimFunc is a matmul where the chain has one, else elementwise (exactly two or
    three matmuls in all); the calls reading only what the chain does not compute are matmuls."""
    return kinds.count("matmul") in (2, 3) and None not in kinds and all(k == "matmul" for k in sources)


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.FuseGemmChains")
def FuseGemmChains(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Group each GEMM chain of ``mod`` into one function (see the module docstring)."""
    return group_calls(mod, COMPOSITE, chain_patterns, _kind, _accept, ("matmul",))


def merge_elementwise(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every elementwise block that feeds only elementwise blocks inlined into
    them (:func:`~tvm_dsm.rules.fused_chain.merge_elementwise_blocks`)."""
    sch = s_tir.Schedule(func)
    merge_elementwise_blocks(sch)
    return sch.mod["main"]
