"""A function that sorts with TVM's CPU sort (TOPI's generic topk) is refused at build time,
naming the GPU form, and that form builds CUDA kernels."""

from __future__ import annotations

import pytest
from conftest import TARGET
from tvm import te, topi

import tvm_dsm


def _router_logits():
    return te.placeholder((13, 128), "float32", name="logits")


def test_topis_generic_topk_is_refused_naming_the_gpu_form():
    x = _router_logits()
    values, indices = topi.topk(topi.nn.softmax(x), k=2, ret_type="both", dtype="int32")
    with pytest.raises(tvm_dsm.ClusterError, match=r"tvm\.contrib\.sort\.topk.*topi\.gpu\.topk"):
        tvm_dsm.build(te.create_prim_func([x, values, indices]), TARGET)


def test_the_gpu_topk_with_outputs_named_apart_builds_cuda_kernels():
    x = _router_logits()
    with TARGET:
        values, indices = topi.gpu.topk(topi.nn.softmax(x), k=2, ret_type="both", dtype="int32")
    values = te.compute(values.shape, lambda i, j: values[i, j], name="values")
    indices = te.compute(indices.shape, lambda i, j: indices[i, j], name="indices")
    source = tvm_dsm.build(te.create_prim_func([x, values, indices]), TARGET).mod.imports[0].inspect_source()
    assert "__global__" in source
