"""A function that sorts with TVM's CPU sort (TOPI's generic topk) is refused at build time,
naming the GPU form, and that form builds CUDA kernels; but a MoE router written with it (the
topk of a softmax) is built as the fused router, which computes what TOPI's does."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from conftest import LLVM, TARGET
from tvm import te, topi

import tvm_dsm
from tvm_dsm.transform.host_sorts import router_top_k


def _router_logits():
    return te.placeholder((13, 128), "float32", name="logits")


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_topis_generic_topk_is_refused_naming_the_gpu_form(index_dtype):
    x = _router_logits()
    values, indices = topi.topk(x, k=2, ret_type="both", dtype=index_dtype)
    with pytest.raises(tvm_dsm.ClusterError, match=r"tvm\.contrib\.sort\.topk.*topi\.gpu\.topk"):
        tvm_dsm.build(te.create_prim_func([x, values, indices]), TARGET)


@pytest.mark.parametrize("dtype, index_dtype", [("float32", "int32"), ("float16", "int32"), ("float16", "int64")])
def test_a_router_written_with_topis_topk_is_the_fused_router_computing_what_topi_does(dtype, index_dtype):
    """Indices of int32, or int64 (``topi.topk``'s default, and torch's)."""
    x = te.placeholder((13, 64), dtype, name="logits")
    wide = x if dtype == "float32" else topi.cast(x, "float32")
    func = te.create_prim_func([x, *topi.topk(topi.nn.softmax(wide), k=2, ret_type="both", dtype=index_dtype)])
    assert tvm_dsm.plan(func).family.name == "top_k_rows"
    assert "__global__" in tvm_dsm.build(func, TARGET).mod.imports[0].inspect_source()
    logits = np.random.default_rng(5).standard_normal((13, 64)).astype(dtype)
    outputs = []
    for f in (func, router_top_k(func)):  # TOPI's (the CPU sort) and the router's, on llvm
        args = [tvm.runtime.tensor(logits), tvm.runtime.tensor(np.zeros((13, 2), "float32")),
                tvm.runtime.tensor(np.zeros((13, 2), index_dtype))]
        tvm.compile(f, target=LLVM)(*args)
        outputs.append([a.numpy() for a in args[1:]])
    (values, indices), (router_values, router_indices) = outputs
    np.testing.assert_array_equal(router_indices, indices)
    np.testing.assert_allclose(router_values, values, rtol=1e-6)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_a_router_written_with_the_gpu_topk_is_the_fused_router(index_dtype):
    """The form the refusal above names, built under a CUDA target as TOPI's GPU strategy builds
    it: the same router as the generic topk's."""
    x = te.placeholder((13, 64), "float16", name="logits")
    probabilities = topi.nn.softmax(topi.cast(x, "float32"))
    with TARGET:
        func = te.create_prim_func([x, *topi.gpu.topk(probabilities, k=2, ret_type="both", dtype=index_dtype)])
    generic = te.create_prim_func([x, *topi.topk(probabilities, k=2, ret_type="both", dtype=index_dtype)])
    assert tvm_ffi.structural_equal(router_top_k(func), router_top_k(generic))
    assert tvm_dsm.plan(func).family.name == "top_k_rows"
    # a top-k of the logits themselves is not the router
    with TARGET:
        logits_top = te.create_prim_func([x, *topi.gpu.topk(x, k=2, ret_type="both", dtype=index_dtype)])
    assert router_top_k(logits_top) is None
    # nor the router with its parameters in another order (fp32 logits, every expert kept: the
    # values' shape and type are the logits')
    logits = te.placeholder((13, 8), "float32", name="logits")
    with TARGET:
        values, indices = topi.gpu.topk(topi.nn.softmax(logits), k=8, ret_type="both", dtype=index_dtype)
    assert router_top_k(te.create_prim_func([logits, values, indices])) is not None
    assert router_top_k(te.create_prim_func([values, logits, indices])) is None


def test_the_gpu_topk_with_outputs_named_apart_builds_cuda_kernels():
    x = _router_logits()
    with TARGET:
        values, indices = topi.gpu.topk(topi.nn.softmax(x), k=2, ret_type="both", dtype="int32")
    values = te.compute(values.shape, lambda i, j: values[i, j], name="values")
    indices = te.compute(indices.shape, lambda i, j: indices[i, j], name="indices")
    source = tvm_dsm.build(te.create_prim_func([x, values, indices]), TARGET).mod.imports[0].inspect_source()
    assert "__global__" in source


@pytest.mark.parametrize("scan", ["cumsum", "cumprod"])
def test_topis_generic_scans_are_refused_naming_the_gpu_form_which_builds(scan):
    """TOPI's generic scan is a parallel loop, the host's: refused by build and plan (a module
    without a kernel would run it on device memory); topi.gpu's builds a kernel."""
    x = te.placeholder((4, 4100), "float32", name="x")
    func = te.create_prim_func([x, getattr(topi, scan)(x, axis=1)])
    for call in (lambda: tvm_dsm.build(func, TARGET), lambda: tvm_dsm.plan(func)):
        with pytest.raises(tvm_dsm.ClusterError, match=rf"parallel loop.*topi\.gpu\.{scan}"):
            call()
    with TARGET:
        gpu = te.create_prim_func([x, getattr(topi.gpu, scan)(x, axis=1)])
    assert "__global__" in tvm_dsm.build(gpu, TARGET).mod.imports[0].inspect_source()
