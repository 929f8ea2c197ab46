"""Rewrite a proven cascade into one s_tir block per row holding the incremental loop.

:func:`splice` puts the fused nest (:class:`tvm_dsm.fusion.fused_block.FusedBlock`) where the
cascade's last level was and drops the other levels' nests and the element producers computed
inside the loop.
"""

from __future__ import annotations

from tvm import tirx
from tvm.s_tir import SBlock

from ..ir import find_all, items, replace_node, with_block_body
from .cascade import Level
from .fused_block import FusedBlock


def splice(func: tirx.PrimFunc, group: list[Level], parts: int = 1, vector: int = 1, lanes: int = 1,
           ranks: int = 1, producers: dict | None = None, shuffle: bool = False,
           copy_stages: int = 0, rows_per_cta: int = 1) -> tirx.PrimFunc:
    """``func`` with the group's loop nests (and its element producers') replaced by the fused
    nest (where the last level was)."""
    root = func.body.block
    stages = items(root.body)
    names = {lvl.block for lvl in group} | {p.block for p in (producers or {}).values()}

    def blocks_in(stmt) -> set[str]:
        return {str(b.name_hint) for b in find_all(stmt, SBlock)}

    positions = [n for n, stage in enumerate(stages) if blocks_in(stage) & names]
    fused = FusedBlock(group, parts, vector, lanes, ranks, producers, shuffle, copy_stages, rows_per_cta).build()
    kept = [s for n, s in enumerate(stages) if n not in positions[:-1]]
    kept[kept.index(stages[positions[-1]])] = fused
    body = kept[0] if len(kept) == 1 else tirx.SeqStmt(kept)
    gone = list(producers or {})  # computed inside the loop: no longer stored
    allocs = [b for b in root.alloc_buffers if not any(b.same_as(g) for g in gone)]
    return func.with_body(replace_node(func.body, root, with_block_body(root, body, allocs)))
