"""Counters kept in the CUDA module between launches (tvm_dsm.intrin.device_counters): the
source TVM generates declares each array a kernel names, and (GPU) the last CTA of a group to
finish reduces the group's partials, in order, launch after launch."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from conftest import TARGET
from tvm_dsm.intrin.device_counters import declare, gather, last_to_arrive, leave

GROUPS, RANKS, COLUMNS, LANES = 6, 5, 256, 32


def _group_sums(gathered: bool):
    """``out[g, t] = sum(x[g, :, t::LANES])``: thread t of CTA (g, r) sums its strided share of
    row r of group g into ``partial``; then the last of the group's CTAs to finish (a counter
    per group) adds the partials in rank order, every thread its own column, or (``gathered``)
    every CTA of the group waits until all have written their partials and CTA r adds the
    columns t with ``t % RANKS == r``."""

    @T.prim_func(s_tir=True)
    def group_sums(x: T.Buffer((GROUPS, RANKS, COLUMNS), "float32"),
                   partial: T.Buffer((GROUPS, RANKS, LANES), "float32"),
                   out: T.Buffer((GROUPS, LANES), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for b in T.thread_binding(GROUPS * RANKS, thread="blockIdx.x"):
            for t in T.thread_binding(LANES, thread="threadIdx.x"):
                with T.sblock("group_sum"):
                    acc = T.sblock_alloc_buffer((1,), "float32", scope="local")
                    acc[0] = T.float32(0)
                    for i in range(COLUMNS // LANES):
                        acc[0] = acc[0] + x[b // RANKS, b % RANKS, i * LANES + t]
                    partial[b // RANKS, b % RANKS, t] = acc[0]
                    if gathered:
                        T.evaluate(gather("groups", GROUPS, b // RANKS, RANKS))
                        if t % RANKS == b % RANKS:
                            acc[0] = T.float32(0)
                            for r in range(RANKS):
                                acc[0] = acc[0] + partial[b // RANKS, r, t]
                            out[b // RANKS, t] = acc[0]
                        T.evaluate(leave("groups", GROUPS, b // RANKS, RANKS))
                    else:
                        if last_to_arrive("groups", GROUPS, b // RANKS, RANKS):
                            acc[0] = T.float32(0)
                            for r in range(RANKS):
                                acc[0] = acc[0] + partial[b // RANKS, r, t]
                            out[b // RANKS, t] = acc[0]

    return group_sums


@pytest.mark.parametrize("gathered", [False, True])
def test_generated_cuda_declares_each_named_array_once_and_assembles(assemble, gathered):
    source = tvm.compile(tvm.IRModule({"main": _group_sums(gathered)}), target=TARGET).mod.imports[0].inspect_source()
    assert source.count(f"__device__ unsigned int tvm_dsm_counter_array_groups[{2 * GROUPS}];") == 1
    assert source.index("tvm_dsm_counter_array_groups") < source.index('extern "C" __global__')
    assert declare(source) == source  # declaring twice changes nothing
    assemble(source, f"device_counters_{'gathered' if gathered else 'last'}")


def test_names_and_sizes_are_checked():
    with pytest.raises(ValueError, match="letters and digits"):
        last_to_arrive("a_b", 4, 0, 2)
    with pytest.raises(ValueError, match="two sizes"):
        declare("tvm_dsm_last_x_4(0, 2); tvm_dsm_last_x_8(1, 2);")
    assert declare("int main() {}") == "int main() {}"


@pytest.mark.gpu
@pytest.mark.parametrize("gathered", [False, True])
def test_the_groups_reduce_launch_after_launch(gathered):
    """Three launches with fresh inputs: each output is the group's sum (the counters were
    zero again after every launch), and the same inputs give bit-identical outputs."""
    dev = tvm.cuda(0)
    lib = tvm.compile(tvm.IRModule({"main": _group_sums(gathered)}), target=TARGET)
    rng = np.random.default_rng()
    partial = tvm.runtime.tensor(np.zeros((GROUPS, RANKS, LANES), np.float32), dev)
    for _ in range(3):
        x = rng.standard_normal((GROUPS, RANKS, COLUMNS)).astype(np.float32)
        outs = []
        for _ in range(2):
            out = tvm.runtime.tensor(np.full((GROUPS, LANES), np.nan, np.float32), dev)
            lib(tvm.runtime.tensor(x, dev), partial, out)
            outs.append(out.numpy())
        ref = x.astype(np.float64).reshape(GROUPS, RANKS, COLUMNS // LANES, LANES).sum(axis=(1, 2))
        assert np.linalg.norm(outs[0] - ref) / np.linalg.norm(ref) < 1e-5
        assert np.array_equal(outs[0], outs[1])
