"""A row reduction (row sum, GEMV) over a long K split over the CTAs of a cluster, partial sums
reduced through DSM (:mod:`tvm_dsm.rules.split_k_reduction`)."""

from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx

from ..errors import ClusterError
from ..hardware import Hardware
from ..planners import split_k as model
from ..rules.split_k_reduction import SplitKReductionConfig, reduction_block, schedule_split_k_reduction
from ..transform.buffers import buffer_bytes
from ..transform.dsm_buffer import moves_through_dsm
from .base import ScheduleFamily


@dataclass(frozen=True)
class ReductionShape:
    """A row reduction as its planner sees it: extents and the bytes besides the matrix."""

    rows: int
    depth: int
    elem_bytes: int
    extra_input_bytes: int


class SplitKReduction(ScheduleFamily):
    name = "split_k_reduction"
    generic = True

    def recognize(self, func: tirx.PrimFunc) -> ReductionShape:
        sch = s_tir.Schedule(func)
        block, rows, depth = reduction_block(sch)
        accumulator = sch.get(block).writes[0].source.ty.dtype
        if not moves_through_dsm(accumulator):
            raise ClusterError(f"a split-K row reduction exchanges its {accumulator} partial results through DSM, "
                               "which moves no such elements")
        reads = [r.source for r in sch.get(block).reads]
        matrix = next((b for b in reads if len(b.ty.shape) == 2), None)
        if matrix is None:
            raise ClusterError("a split-K row reduction reads a [rows, K] matrix")
        return ReductionShape(rows, depth, tvm.DataType(str(matrix.ty.dtype)).bits // 8,
                              sum(buffer_bytes(b) for b in reads if not b.same_as(matrix)))

    def predict(self, shape: ReductionShape, config: SplitKReductionConfig, hw: Hardware) -> model.SplitKPlan:
        return model.predict(shape.rows, shape.depth, shape.elem_bytes, shape.extra_input_bytes, config, hw)

    def rank(self, shape: ReductionShape, hw: Hardware) -> list[model.SplitKPlan]:
        return model.plan_split_k_reduction(shape.rows, shape.depth, hw, elem_bytes=shape.elem_bytes,
                                            extra_input_bytes=shape.extra_input_bytes)

    def apply(self, func: tirx.PrimFunc, config: SplitKReductionConfig, hw: Hardware) -> s_tir.Schedule:
        return schedule_split_k_reduction(func, config)
