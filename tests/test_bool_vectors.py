"""Vectorized loops over bool buffers are unrolled (tvm_dsm.transform.bool_vectors): TVM's CUDA
code reads a bool vector through a ``ushort2`` / ``ushort4`` pointer, two bytes a lane where a
bool is one, so a vectorized mask read its lanes wrong and faulted on misaligned addresses (an
MQA attention's per-operator epilogue: ``cudaErrorMisalignedAddress`` on the H200)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import te, tirx

from conftest import TARGET


def _masked(lanes: int, n: int = 1024):
    """``y = where(m, x, 0)`` and ``z = x > 0`` over ``n`` elements, ``lanes`` a thread,
    vectorized: a bool buffer read and one written."""
    m = te.placeholder((n,), "bool", name="m")
    x = te.placeholder((n,), "float16", name="x")
    y = te.compute((n,), lambda i: tirx.Select(m[i], x[i], tirx.const(0, "float16")), name="y")
    z = te.compute((n,), lambda i: x[i] > tirx.const(0, "float16"), name="z")
    sch = tvm.s_tir.Schedule(te.create_prim_func([m, x, y, z]))
    for name in ("y", "z"):
        (i,) = sch.get_loops(sch.get_sblock(name))
        outer, thread, lane = sch.split(i, [None, 32, lanes])
        sch.bind(outer, "blockIdx.x")
        sch.bind(thread, "threadIdx.x")
        sch.vectorize(lane)
    return sch.mod


@pytest.mark.parametrize("lanes", [2, 4])
def test_a_vectorized_mask_is_read_and_written_a_byte_at_a_time(lanes, assemble):
    source = tvm.compile(_masked(lanes), target=TARGET).mod.imports[0].inspect_source()
    assert not re.search(r"\((u?short|u?char|u?int)\d\*\)\((m|z)_ptr", source), source
    assert re.search(r"\bm_ptr\[", source) and re.search(r"\bz_ptr\[", source)
    assemble(source, f"bool_vectors_{lanes}")


@pytest.mark.gpu
@pytest.mark.parametrize("lanes", [2, 4])
def test_gpu_a_vectorized_mask_keeps_its_values(lanes):
    lib = tvm.compile(_masked(lanes), target=TARGET)
    dev = tvm.cuda(0)
    rng = np.random.default_rng()
    m = rng.random(1024) > 0.5
    x = rng.standard_normal(1024).astype("float16")
    y, z = (tvm.runtime.tensor(np.full(1024, np.nan, "float16"), dev), tvm.runtime.tensor(np.zeros(1024, bool), dev))
    lib(tvm.runtime.tensor(m, dev), tvm.runtime.tensor(x, dev), y, z)
    np.testing.assert_array_equal(y.numpy(), np.where(m, x, np.float16(0)))
    np.testing.assert_array_equal(z.numpy(), x > 0)
