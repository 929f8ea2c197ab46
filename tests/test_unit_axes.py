"""Intermediate tensors without their unit axes (tvm_dsm.transform.unit_axes): a keepdims
reduction's ``[rows, 1]`` result held as ``[rows]``, the same values on llvm, and the family
that takes the function written without keepdims takes it."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, topi

from conftest import LLVM, TARGET
from tvm_dsm import driver
from tvm_dsm.transform.unit_axes import unit_axes_dropped


def logsumexp(rows: int, width: int, keepdims: bool = True):
    """With ``keepdims``, TOPI's ops as a user chains them: the row max kept ``[rows, 1]``, the
    sum of exponentials of the difference, its log plus the max reshaped to ``[rows]``; without,
    the same in TE over a ``[rows]`` max."""
    x = te.placeholder((rows, width), "float32", name="x")
    if keepdims:
        m = topi.max(x, axis=-1, keepdims=True)
        s = topi.sum(topi.exp(topi.subtract(x, m)), axis=-1)
        return te.create_prim_func([x, topi.add(topi.log(s), topi.reshape(m, (rows,)))])
    k, j = te.reduce_axis((0, width), name="k"), te.reduce_axis((0, width), name="j")
    m = te.compute((rows,), lambda i: te.max(x[i, k], axis=k), name="m")
    s = te.compute((rows,), lambda i: te.sum(te.exp(x[i, j] - m[i]), axis=j), name="s")
    return te.create_prim_func([x, te.compute((rows,), lambda i: te.log(s[i]) + m[i], name="lse")])


def _shapes(func) -> list[list[int]]:
    return [[int(d) for d in b.ty.shape] for b in func.body.block.alloc_buffers]


def test_a_keepdims_result_is_held_by_its_rows_and_computes_the_same_on_llvm():
    func = logsumexp(5, 300)
    dropped = unit_axes_dropped(func)
    assert [5, 1] in _shapes(func) and [5, 1] not in _shapes(dropped)
    assert "%" not in dropped.script()  # the reshape's m[v % 5, 0] reads m[v]
    x = np.random.default_rng().standard_normal((5, 300)).astype("float32")
    outs = []
    for f in (func, dropped):
        out = tvm.runtime.tensor(np.full(5, np.nan, "float32"))
        tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target=LLVM)(
            tvm.runtime.tensor(x), out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[1], outs[0])


def test_parameters_and_tensors_without_unit_axes_are_left_as_they_are():
    assert unit_axes_dropped(logsumexp(5, 300, keepdims=False)) is None
    x = te.placeholder((5, 300), "float32", name="x")
    func = te.create_prim_func([x, topi.max(x, axis=-1, keepdims=True)])  # the [5, 1] result is the output
    assert unit_axes_dropped(func) is None


@pytest.mark.parametrize("keepdims", [True, False])
def test_topis_logsumexp_with_keepdims_is_the_fused_cascade_as_without(keepdims):
    func = logsumexp(512, 128256, keepdims)
    assert driver.plan(func).family.name == "fused_cascade"
    assert driver.build(func, TARGET).mod.imports[0].inspect_source().count("__global__") == 2  # one kernel
