"""Schedule a fused cascade (FuseCascadedReductions with ``parts`` > 1) on the GPU.

One CTA per row; its ``parts`` threads each scan a strided part of the reduction axis (adjacent
threads read adjacent elements) into partial states in shared memory, which then merge pairwise
in a tree (log2(parts) rounds, one thread per merge) with the cascade's corrections. (Several
rows per CTA would need the partial buffers indexed by the row within the CTA: the fused block
allocates them per row, so they would collide.)
"""

from __future__ import annotations

from tvm import s_tir, tirx

from ..errors import ClusterError


def schedule_fused_rows(func: tirx.PrimFunc) -> s_tir.Schedule:
    """Bind every ``fused_*`` block's rows to CTAs and its ``*_part`` child's parts to threads."""
    sch = s_tir.Schedule(func)
    parts = [rv for rv in _all_blocks(sch) if sch.get(rv).name_hint.endswith("_part")]
    if not parts:
        raise ClusterError("no split cascade: run FuseCascadedReductions(parts=P) with P > 1 first")
    row_loops = []
    for part in parts:
        fused = sch.get_sblock(sch.get(part).name_hint[: -len("_part")])
        rows = sch.get_loops(fused)
        row = sch.fuse(*rows) if len(rows) > 1 else rows[0]
        sch.bind(row, "blockIdx.x")
        row_loops.append(row)
        prefix = sch.get(part).name_hint[: -len("_part")] + "_merge"
        merges = [rv for rv in _all_blocks(sch) if sch.get(rv).name_hint.startswith(prefix)]
        for block in [part] + merges:  # partial states are exchanged between threads
            sch.bind(sch.get_loops(block)[-1], "threadIdx.x")
            for index in range(len(sch.get(block).writes)):
                sch.set_scope(block, index, "shared")
        # Intermediate results (not parameters) stay in the row's CTA for its epilogue.
        params = list(func.params)
        for index, region in enumerate(sch.get(fused).writes):
            if not any(region.source.same_as(p) for p in params):
                sch.set_scope(fused, index, "shared")
    # Element-wise stages after the cascade (e.g. log(l) + m) run in the row's CTA.
    fused_names = {sch.get(p).name_hint[: -len("_part")] for p in parts}
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint in fused_names:
            continue
        for row in row_loops:
            try:
                sch.reverse_compute_at(block, row)
                break
            except Exception:  # noqa: BLE001 - not a consumer of this row: try the next
                continue
        else:
            raise ClusterError(
                f"stage {sch.get(block).name_hint} is not a per-row consumer of the fused "
                "cascade; schedule it separately"
            )
    return sch


def _all_blocks(sch: s_tir.Schedule) -> list:
    found, stack = [], [sch.get_sblock("root")]
    while stack:
        for child in sch.get_child_blocks(stack.pop()):
            found.append(child)
            stack.append(child)
    return found
