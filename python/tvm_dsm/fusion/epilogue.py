"""Element-wise stages after a cascade (``weights = exp(top - max) / sum``, ``out = o / l``),
for kernels that compute them where the cascade's results are still in registers instead of
writing the results and reading them back.

A stage qualifies when it writes a parameter ``out[row, ...]`` element by element (its store
indexed exactly by its own variables) from the cascade's results alone, each read at the
stage's leading variables (``o[row, col]``, ``l[row]``).
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.sym import Analyzer

from ..errors import ClusterError
from ..ir import loads, substitute
from .cascade import indexed_by


def find_epilogue(func: tirx.PrimFunc, level_blocks: set[str], results: list, rows) -> tuple:
    """The root blocks of ``func`` other than ``level_blocks`` (the cascade's), each checked to
    be a stage as above over the buffers ``results`` and ``rows`` rows (a constant or the
    function's row variable); ClusterError naming the first that is not."""
    params = list(func.params)
    sch = s_tir.Schedule(func)
    stages = []
    for rv in sch.get_child_blocks(sch.get_sblock("root")):
        block = sch.get(rv)
        if block.name_hint in level_blocks:
            continue
        store = block.body
        variables = [iv.var for iv in block.iter_vars]
        if not (isinstance(store, tirx.BufferStore) and block.init is None
                and any(store.buffer.same_as(p) for p in params)
                and all(int(iv.iter_type) == tirx.IterVar.DataPar for iv in block.iter_vars)
                and len(store.indices) == len(variables) and indexed_by(store, *variables)
                and Analyzer().can_prove_equal(block.iter_vars[0].dom.extent, rows)):
            raise ClusterError(f"{block.name_hint}: after the cascade only element-wise stages writing "
                               "out[row, ...] are taken")
        for load in loads(store.value):
            if not (any(load.source.same_as(b) for b in results) and indexed_by(load, *variables)):
                raise ClusterError(f"{block.name_hint} reads {load}: only the cascade's results of its row "
                                   "are taken")
        stages.append(block)
    return tuple(stages)


def bind_stage(block, indices: list, registers: dict) -> tuple:
    """(buffer, value, indices) of ``block``'s store at ``indices`` (one per block variable),
    each cascade result it reads replaced by its value in ``registers`` (buffer -> expression)."""

    def from_registers(load):
        return next(value for buf, value in registers.items() if load.source.same_as(buf))

    store = block.body
    value = tvm_ffi.structural_map(store.value, [(tvm.ir.TensorLoad, from_registers)])
    value = substitute(value, list(zip([iv.var for iv in block.iter_vars], indices)))
    return store.buffer, value, indices
