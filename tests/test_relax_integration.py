"""tvm-dsm inside Relax model compilation: its families schedule the model's matmuls, dlight
the rest; the compiled model computes the model."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax

from conftest import TARGET, kernels
from tvm_dsm.relax_integration import ScheduleTIR, compile_model, lower_to_tir
from tvm_dsm.workloads.relax_models import swiglu_mlp

SHAPE = (128, 1024, 512, 256)  # m, n (intermediate), k (in), l (out)


def _kernels(executable) -> dict[str, str]:
    """Each CUDA kernel of a compiled Relax model by name, its body as text."""
    found = {}

    def walk(module):
        for imported in module.imports:
            if imported.kind in ("cuda", "c", "source"):
                found.update(kernels(imported.inspect_source()))
            walk(imported)

    walk(executable.mod)
    return found


def test_model_matmuls_get_tvm_dsm_schedules_and_the_rest_dlight(caplog):
    with caplog.at_level(logging.DEBUG, logger="tvm_dsm.relax"):
        kernels = _kernels(compile_model(swiglu_mlp(*SHAPE, softmax=True), target=TARGET))
    matmuls = {name: body for name, body in kernels.items() if "matmul" in name}
    assert len(matmuls) == 3  # gate (+ silu), up (+ multiply, cast), down
    for name, body in matmuls.items():  # split-K GEMMs: TMA main loop, DSM reduce-scatter
        tensor_cores = "mma.sync.aligned" in body or "tvm_dsm_wgmma_" in body
        assert "CUtensorMap" in body and tensor_cores and "mapa" in body, name
    others = [name for name in kernels if "matmul" not in name]
    assert others and not any("CUtensorMap" in kernels[name] for name in others)
    assert "no tvm-dsm family" in caplog.text  # the softmax: said why, left to dlight


def test_schedule_tir_leaves_scheduled_functions_alone():
    mod = lower_to_tir(swiglu_mlp(*SHAPE))
    once = ScheduleTIR()(mod)
    scheduled = [gv for gv, f in once.functions.items()
                 if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("tir.is_scheduled", False)]
    assert scheduled
    twice = ScheduleTIR()(once)
    for gv in scheduled:
        assert twice[gv].same_as(once[gv])


@pytest.mark.gpu
def test_gpu_compiled_model_matches_float64():
    m, n, k, l = SHAPE
    vm = relax.VirtualMachine(compile_model(swiglu_mlp(m, n, k, l, softmax=True), target=TARGET),
                              tvm.cuda(0))
    rng = np.random.default_rng()
    x = rng.standard_normal((m, k)).astype(np.float16)
    wg, wu = ((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16) for _ in range(2))
    w2 = (rng.standard_normal((l, n)) / np.sqrt(n)).astype(np.float16)
    out = vm["main"](*(tvm.runtime.tensor(a, tvm.cuda(0)) for a in (x, wg, wu, w2))).numpy()
    g, u = (x.astype(np.float64) @ w.astype(np.float64).T for w in (wg, wu))
    h = (g / (1 + np.exp(-g)) * u).astype(np.float16).astype(np.float64)
    y = h @ w2.astype(np.float64).T
    ref = np.exp(y - y.max(1, keepdims=True))
    ref /= ref.sum(1, keepdims=True)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3
