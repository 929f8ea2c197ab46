"""The schedule families tvm-dsm applies to a PrimFunc (:class:`~.base.ScheduleFamily`), one
module each, in order of specificity (a GEMM chain before the GEMM that is its first half), and
the choice among those that take a function: the one whose best plan is predicted fastest
(:func:`fastest_family`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import tvm
from tvm import tirx

from tvm.s_tir import SBlock
from tvm.s_tir.schedule.schedule import ScheduleError

from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import find_all
from ..transform.generate_kernels import register_generator
from ..transform.reduction_inits import starts_elsewhere
from .attention import Attention
from .base import ScheduleFamily
from .column_gemv import ColumnGemvFamily
from .configs import config_from, examples
from .conv_chain import ConvChain
from .decode_attention import DecodeAttention
from .elementwise import Elementwise
from .fused_cascade import FusedCascade
from .gemm_chain import GemmChain
from .gemm_row_max import GemmRowMax
from .packed_gemv import PackedGemvFamily
from .per_thread_math import PerThreadMath
from .row_gemv import RowGemvFamily
from .row_norm import RowNorm
from .simt_gemm import SimtGemm
from .softmax_gemm import SoftmaxGemm
from .split_k_gemm import SplitKGemm
from .split_k_reduction import SplitKReduction
from .strided_rows import StridedRows
from .top_k_rows import TopKRows

#: Elements a tensor of a tvm-dsm kernel holds fewer of: the kernels index in int32, so a
#: function with a larger tensor is refused (dlight takes it; TVM narrows its indices only where
#: their bounds allow) and a call of a symbolic one with a larger tensor stops before launch
#: (:func:`row_ranges.int32_extent_check`).
INT32_ELEMENTS = 2 ** 31
#: Most specific first: one row of a matmul before the GEMMs; a cascade's own kernel (attention,
#: decode attention, softmax·V, top-k rows, row norms, strided rows) before the fused rows that
#: take any cascade; elementwise functions last (those whose math is computed once per thread
#: before those that stream in vectors).
FAMILIES: tuple[ScheduleFamily, ...] = (ConvChain(), GemmChain(), GemmRowMax(), RowGemvFamily(), PackedGemvFamily(),
                                        ColumnGemvFamily(),
                                        SplitKGemm(),
                                        SimtGemm(), Attention(), DecodeAttention(), SoftmaxGemm(), TopKRows(),
                                        RowNorm(), StridedRows(), FusedCascade(), SplitKReduction(), PerThreadMath(),
                                        Elementwise())



def _generator(family: ScheduleFamily):
    """The kernel ``family`` writes for a function in the configuration given by its fields."""
    def generate(func: tirx.PrimFunc, fields: dict, hw: Hardware) -> tirx.PrimFunc:
        config = config_from(fields, examples(family.space(family.recognize(func), hw)))
        return family.apply(func, config, hw).mod["main"]

    return generate


for _family in FAMILIES:
    if not _family.traced:
        register_generator(_family.name, _generator(_family))


def hopper_target(target: Any) -> bool:
    """Whether ``target`` is a CUDA target of compute capability 9.x (the cluster and DSM
    instructions tvm-dsm emits exist from sm_90 on)."""
    target = tvm.target.Target(target)
    return target.kind.name == "cuda" and str(target.attrs.get("arch", "")).startswith("sm_90")


def int32_overflows(func: tirx.PrimFunc) -> list[str]:
    """The parameters of ``func`` (constant extents) that hold 2^31 elements or more, which
    tvm-dsm's int32-indexed kernels do not take: ``name[shape]`` each."""
    shapes = {p.name: getattr(p.ty, "shape", None) for p in func.params}
    return [f"{name}{[int(d) for d in shape]}" for name, shape in shapes.items()
            if shape is not None and math.prod(int(d) for d in shape) >= INT32_ELEMENTS]


def match_family(func: tirx.PrimFunc, target: Any = None,
                 families: Sequence[ScheduleFamily] | None = None) -> tuple[ScheduleFamily, Any]:
    """The first family of ``families`` (default :data:`FAMILIES`) whose pattern ``func`` holds,
    with its shape; ClusterError listing why each family does not apply otherwise (or that
    ``target`` is not a Hopper GPU)."""
    return matching_families(func, target, families, first=True)[0]


#: How much faster another family's best plan must be predicted than the most specific one's to
#: be taken: the families' models are fitted each on its own kernels, not against each other.
#: The decode kernel over one query was predicted 6x faster than the prefill kernel's padded
#: query tiles (measured 2x); over 16-32 tokens the attention kernel ran 1.3x faster than the
#: decode kernel, which the decode family's compute term predicts within the margin, so the most
#: specific keeps it (``bench/results/archive/short_attention_families_s86.json``).
FAMILY_MARGIN = 1.25


def fastest_family(matches: Sequence[tuple[ScheduleFamily, Any]], hw: Hardware,
                   ranking: Callable[[ScheduleFamily, Any], list] | None = None) -> tuple[ScheduleFamily, Any, list]:
    """Of the families whose pattern a function holds (``matches``, :func:`matching_families`,
    most specific first), the first, unless another's best plan is predicted faster by
    :data:`FAMILY_MARGIN` (then the fastest of those), with its shape and ranking (``ranking``:
    the plans of a family and shape, by default its own ``rank``): a decode attention written as
    attention over one query reaches the decode kernel. A generic family
    (``ScheduleFamily.generic``: its model sees bytes, not compute) only where no other takes
    the function. A family that declines the function (``ScheduleFamily.declines``) is left out.
    ClusterError, the first family's, where none has a valid plan."""
    ranking = ranking or (lambda family, shape: family.rank(shape, hw))
    ranked, refusals = [], []
    specific = [(family, shape) for family, shape in matches if not family.generic]
    for family, shape in specific or matches[:1]:
        try:
            plans = ranking(family, shape)
        except ClusterError as err:
            refusals.append(err)
            continue
        declined = family.declines(shape, plans, hw)
        if declined is None:
            ranked.append((family, shape, plans))
        else:
            refusals.append(ClusterError(declined))
    if not ranked:
        raise refusals[0]
    first = ranked[0][2][0].predicted_us
    faster = [r for r in ranked[1:] if r[2][0].predicted_us * FAMILY_MARGIN < first]
    return min(faster, key=lambda r: r[2][0].predicted_us) if faster else ranked[0]


def matching_families(func: tirx.PrimFunc, target: Any = None, families: Sequence[ScheduleFamily] | None = None,
                      first: bool = False, refused: list[str] | None = None) -> list[tuple[ScheduleFamily, Any]]:
    """Every family of ``families`` (default :data:`FAMILIES`) whose pattern ``func`` holds, in
    that order, with its shape (``first``: the first alone); ClusterError as :func:`match_family`.
    ``refused``: a list to append why each other family does not take it (``"name: reason"``)."""
    if target is not None and not hopper_target(target):
        target = tvm.target.Target(target)
        raise ClusterError(f"tvm-dsm schedules for Hopper GPUs (CUDA sm_90a); the target is "
                           f"{target.kind.name} {target.attrs.get('arch', '')}".rstrip())
    shapes = {p.name: getattr(p.ty, "shape", None) for p in func.params}
    symbolic = [f"{name}{list(shape)}" for name, shape in shapes.items()
                if shape is not None and not all(isinstance(d, tirx.IntImm) for d in shape)]
    if symbolic:
        raise ClusterError(f"families plan constant extents; {', '.join(symbolic)} are symbolic (a function of one "
                           "symbolic row count is planned per range of rows by build and schedule: "
                           "tvm_dsm.families.row_ranges.range_kernels)")
    large = int32_overflows(func)
    if large:
        raise ClusterError(f"tvm-dsm's kernels index in int32; {', '.join(large)} hold 2^31 elements or more")
    accumulating = [b.name_hint for b in find_all(func.body, SBlock)
                    if b.init is None and any(iv.iter_type == tirx.IterVar.CommReduce for iv in b.iter_vars)]
    if accumulating:
        raise ClusterError(f"{', '.join(accumulating)}: a reduction without an init adds to what its output "
                           "held before the call; the families compute it from its identity")
    started = [b.name_hint for b in find_all(func.body, SBlock) if starts_elsewhere(b)]
    if started:
        raise ClusterError(f"{', '.join(started)}: a reduction started from another value than its identity; the "
                           "families compute it from its identity (where the start reads neither a reduction "
                           "variable nor the output, plan and build start it there and combine the value after: "
                           "tvm_dsm.transform.reduction_inits)")
    reasons, found = [], []
    for family in FAMILIES if families is None else families:
        try:
            found.append((family, family.recognize(func)))
        except (ClusterError, ScheduleError) as err:  # s_tir refuses what is not its form
            reasons.append(f"{family.name}: {err}")
            continue
        if first:
            break
    if not found:
        raise ClusterError("no tvm-dsm schedule family applies:\n  " + "\n  ".join(reasons))
    if refused is not None:
        refused.extend(reasons)
    return found
