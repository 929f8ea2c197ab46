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
from tvm_dsm.workloads.relax_models import ffn, linear, swiglu_mlp

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


def test_model_matmuls_and_softmax_get_tvm_dsm_schedules(caplog):
    """Here the second matmul feeds a softmax, so the model holds no chain the chain family
    takes (it writes its output from an elementwise block): one split-K GEMM per matmul. The
    softmax, whose normalize stage reads the data again, is the row-norm family's (each row
    read once)."""
    with caplog.at_level(logging.DEBUG, logger="tvm_dsm.relax"):
        kernels = _kernels(compile_model(swiglu_mlp(*SHAPE, softmax=True), target=TARGET))
    matmuls = {name: body for name, body in kernels.items() if "matmul" in name}
    assert len(matmuls) == 3  # gate (+ silu), up (+ multiply, cast), down
    for name, body in matmuls.items():  # split-K GEMMs: TMA main loop, DSM reduce-scatter
        tensor_cores = "mma.sync.aligned" in body or "tvm_dsm_wgmma_" in body
        assert "CUtensorMap" in body and tensor_cores and "mapa" in body, name
    others = [name for name in kernels if "matmul" not in name]
    assert others and not any("CUtensorMap" in kernels[name] for name in others)
    assert "no tvm-dsm family" not in caplog.text  # the softmax included


@pytest.mark.parametrize("model", [ffn(*SHAPE), swiglu_mlp(*SHAPE)])
def test_relax_groups_each_gemm_chain_into_one_function_the_chain_family_plans(model):
    from tvm_dsm import driver
    from tvm_dsm.relax_chains import merge_elementwise

    mod = lower_to_tir(model)
    funcs = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    (name,) = funcs  # nothing else in the model
    func = tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": funcs[name]}))["main"]
    assert driver.plan(merge_elementwise(func)).family.name == "gemm_chain"


def test_matmuls_that_are_no_chain_are_left_to_relax():
    """A matmul whose result feeds a softmax before the next matmul is no chain: Relax's own
    grouping stays (one function per matmul)."""
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((128, 512), "float16"))
    w1, w2 = relax.Var("w1", R.Tensor((1024, 512), "float16")), relax.Var("w2", R.Tensor((256, 1024), "float16"))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            p = bb.emit(relax.op.astype(relax.op.nn.softmax(linear(x, w1), axis=-1), "float16"))
            out = bb.emit_output(relax.op.astype(linear(p, w2), "float16"))
        bb.emit_func_output(out)
    names = [gv.name_hint for gv, f in lower_to_tir(bb.get()).functions.items()
             if isinstance(f, tvm.tirx.PrimFunc)]
    assert sum("matmul" in n for n in names) == 2


def test_schedule_tir_leaves_scheduled_functions_alone():
    mod = lower_to_tir(swiglu_mlp(*SHAPE))
    once = ScheduleTIR()(mod)
    scheduled = [gv for gv, f in once.functions.items()
                 if isinstance(f, tvm.tirx.PrimFunc) and f.attrs.get("tirx.is_scheduled", False)]
    assert scheduled
    twice = ScheduleTIR()(once)
    for gv in scheduled:
        assert twice[gv].same_as(once[gv])


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_gpu_compiled_ffn_matches_float64(activation):
    m, n, k, l = SHAPE
    vm = relax.VirtualMachine(compile_model(ffn(m, n, k, l, activation), target=TARGET), tvm.cuda(0))
    rng = np.random.default_rng()
    x = rng.standard_normal((m, k)).astype(np.float16)
    w1 = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float16)
    w2 = (rng.standard_normal((l, n)) / np.sqrt(n)).astype(np.float16)
    out = vm["main"](*(tvm.runtime.tensor(a, tvm.cuda(0)) for a in (x, w1, w2))).numpy()
    c = x.astype(np.float64) @ w1.astype(np.float64).T
    from math import erf, sqrt
    act = np.maximum(c, 0) if activation == "relu" else c * 0.5 * (1 + np.vectorize(erf)(c / sqrt(2)))
    ref = act.astype(np.float16).astype(np.float64) @ w2.astype(np.float64).T
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3


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


def test_compiled_ffn_runs_the_chain_familys_kernels():
    kernels = _kernels(compile_model(ffn(*SHAPE), target=TARGET))
    assert kernels and all("NT_matmul_relu_cast_NT_matmul1_cast1" in name for name in kernels)
    assert any("CUtensorMap" in body and "mapa" in body for body in kernels.values())


def test_a_function_with_an_int64_tensor_is_scheduled_without_narrowing():
    """A causal mask built from ``arange`` (torch-exported attention) passes int64 tensors
    between kernels; TVM's int32 narrowing refuses such a function, so it keeps its int64
    indices and goes on to the families rather than crashing them: the elementwise family's
    stores in vectors, its lanes compared apart (the comparison differs between them)."""
    from tvm import te

    from tvm_dsm.ir import narrow_indices

    pos = te.placeholder((128,), "int64", name="pos")
    mask = te.compute((128, 128), lambda i, j: tvm.tirx.Select(pos[j] <= pos[i], tvm.tirx.const(0.0, "float32"),
                                                                tvm.tirx.const(-1e9, "float32")), name="mask")
    func = te.create_prim_func([pos, mask]).with_attr("global_symbol", "mask")
    with pytest.raises(Exception, match="has dtype T.int64"):
        tvm.tirx.transform.ForceNarrowIndexToInt32()(tvm.IRModule({"main": func}))
    assert narrow_indices(func).same_as(func)
    choices = {}
    scheduled = ScheduleTIR(TARGET, choices=choices)(tvm.IRModule({"mask": func}))  # no crash survived
    assert scheduled["mask"].attrs["tvm_dsm.family"] == "elementwise"
    source = tvm.compile(scheduled, target=TARGET).mod.imports[0].inspect_source()
    assert "*(float2*)(mask_ptr" in source
