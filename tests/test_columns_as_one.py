"""A norm over several trailing axes (TOPI's layer_norm over axis=[1, 2], torch's
normalized_shape=(C, W)) as rows of one axis: the row norm family's kernel, where dlight's was the
only schedule (0.54x torch on the H200 for [32, 64, 512])."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te, topi

import tvm_dsm
from tvm_dsm.transform.columns_as_one import columns_as_one
from tvm_dsm.transform.rows_as_matrix import over_original_tensors

from conftest import TARGET


def _layer_norm(n: int, c: int, w: int, dtype: str = "float32"):
    x = te.placeholder((n, c, w), dtype, name="x")
    g, b = te.placeholder((c, w), dtype, name="gamma"), te.placeholder((c, w), dtype, name="beta")
    return te.create_prim_func([x, g, b, topi.nn.layer_norm(x, g, b, axis=[1, 2], epsilon=1e-5)])


def _reference(x, g, b):
    mu = x.mean((1, 2), keepdims=True)
    var = ((x - mu) ** 2).mean((1, 2), keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def _inputs(rng, n, c, w):
    return [rng.standard_normal((n, c, w)), rng.uniform(0.5, 1.5, (c, w)), rng.uniform(-0.5, 0.5, (c, w))]


def test_the_merged_function_called_with_the_original_tensors_computes_the_same():
    func = _layer_norm(2, 3, 16)
    merged = columns_as_one(func)
    assert merged is not None and [list(p.ty.shape) for p in merged.func.params][0] == [2, 48]
    arrays = [a.astype(np.float32) for a in _inputs(np.random.default_rng(0), 2, 3, 16)]
    dev = tvm.cpu()
    for f in (func, over_original_tensors(func, merged, merged.func)):
        out = tvm.runtime.tensor(np.full((2, 3, 16), np.nan, np.float32), dev)
        tvm.compile(f, target="llvm")["main"](*(tvm.runtime.tensor(a, dev) for a in arrays), out)
        np.testing.assert_allclose(out.numpy(), _reference(*arrays), rtol=1e-5, atol=1e-5)


def test_axes_read_in_another_order_or_a_single_reduced_axis_are_left_as_written():
    x = te.placeholder((4, 8, 16), "float32", name="x")
    r1, r2 = te.reduce_axis((0, 8), name="r1"), te.reduce_axis((0, 16), name="r2")
    transposed = te.compute((4,), lambda i: te.sum(x[i, r1, r2] * x[i, r2 % 8, r1], axis=[r1, r2]), name="s")
    assert columns_as_one(te.create_prim_func([x, transposed])) is None
    y = te.placeholder((4, 16), "float32", name="y")
    assert columns_as_one(te.create_prim_func([y, topi.nn.softmax(y)])) is None


def test_a_layer_norm_over_two_axes_is_one_row_norm_kernel():
    source = tvm_dsm.build(_layer_norm(32, 64, 512), TARGET).mod.imports[0].inspect_source()
    assert "row_norm_kernel" in source and source.count("__global__") == 2  # that one kernel (declared, defined)


@pytest.mark.gpu
def test_gpu_a_layer_norm_over_two_axes_matches_float64():
    arrays = [a.astype(np.float32) for a in _inputs(np.random.default_rng(1), 32, 64, 512)]
    dev = tvm.cuda(0)
    out = tvm.runtime.tensor(np.full((32, 64, 512), np.nan, np.float32), dev)
    tvm_dsm.build(_layer_norm(32, 64, 512), TARGET)(*(tvm.runtime.tensor(a, dev) for a in arrays), out)
    ref = _reference(*(a.astype(np.float64) for a in arrays))
    assert np.linalg.norm(out.numpy() - ref) / np.linalg.norm(ref) < 1e-5
