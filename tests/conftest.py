"""Shared fixtures: the H100 target, nvcc assembly checks and the GPU marker."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tvm
from tvm import s_tir

import tvm_dsm  # noqa: F401  (registers the pipeline)
from tvm_dsm.script_parsing import pseudo_files_skipped

TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}, host="llvm")
#: llvm without LLVM's own optimizations, for tests that run functions on the CPU: the JIT of a
#: module took tens of milliseconds a function at the default level.
LLVM = tvm.target.Target({"kind": "llvm", "opt-level": 0})


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def without_unnamed_meta_schedule_handlers() -> None:
    """Take pytest's log-capture handlers off MetaSchedule's logger: a tuning run re-configures
    that logger by the names of the handlers on it, and fails on these unnamed ones (found there
    from a test's second run in a process on)."""
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in [h for h in logger.handlers if h.get_name() is None]:
        logger.removeHandler(handler)


_SESSION = contextlib.ExitStack()


def pytest_configure(config):
    """TVMScript parsed while test modules import (module-level ``@T.prim_func`` and
    ``@I.ir_module``, under the import system's frozen frames) and in tests (nn.llm's KV-cache
    kernels, Relax models) makes ``inspect.getmodule`` scan every loaded module for each frame
    of a file not on disk: skip those for the session. What ``inspect`` answers is the same
    (see :func:`tvm_dsm.script_parsing.pseudo_files_skipped`); only the scans go."""
    _SESSION.enter_context(pseudo_files_skipped())


def pytest_unconfigure(config):
    _SESSION.close()


def pytest_collection_modifyitems(config, items):
    # the long tests first: pytest-xdist hands out tests in this order, so the workers' last
    # tests are short ones and neither waits long for the other
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def cuda_source(mod: tvm.IRModule, pipeline: str = "default") -> str:
    """Compile ``mod`` for sm_90a and return the generated CUDA."""
    return tvm.compile(mod, target=TARGET, tir_pipeline=pipeline).mod.imports[0].inspect_source()


def relax_cuda_source(module) -> str:
    """The CUDA source of a compiled Relax module: its (nested) imports', depth first."""
    return "".join((m.inspect_source() if m.kind == "cuda" else "") + relax_cuda_source(m) for m in module.imports)


def named_alike(source: str) -> str:
    """``source`` with its kernels named by position (a kernel is named after its function's
    symbol, which a generated kernel and the function it replaces may spell differently)."""
    for i, name in enumerate(kernels(source)):
        source = source.replace(name, f"kernel_{i}")
    return source


def kernels(source: str) -> dict[str, str]:
    """Each kernel's definition (signature and body) in generated CUDA, by name, in order."""
    import re

    starts = [(m.start(), m.group(1)) for m in re.finditer(
        r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\([^;{]*\{', source)]
    ends = [a for a, _ in starts[1:]] + [len(source)]
    return {name: source[a:b] for (a, name), b in zip(starts, ends)}


def run_tutorial(name: str, capsys) -> str:
    """Run ``tutorials/<name>.py`` as a script; what it printed."""
    import runpy

    runpy.run_path(str(Path(__file__).parent.parent / "tutorials" / f"{name}.py"), run_name="__main__")
    return capsys.readouterr().out


def host_launch(mod: tvm.IRModule, pipeline: str = "default") -> list[str]:
    """The host-side kernel launch calls (``T.call_ffi_kernel(...)``) after lowering."""
    from tvm.tirx.compilation_pipeline import get_tir_pipeline

    lowered = get_tir_pipeline(pipeline)[0](tvm.tirx.transform.BindTarget(TARGET)(mod))
    return [line.strip() for line in lowered["main"].script().splitlines() if "call_ffi_kernel" in line]


def dense_relu_error_on_gpu(m: int, n: int, k: int, config) -> float:
    """Relative error vs float64 of the split-K GEMM ``relu(X @ W^T + b)`` scheduled with
    ``config``, run on the GPU with fresh random inputs and a NaN-poisoned output."""
    from tvm_dsm.hardware import load_hardware
    from tvm_dsm.rules.split_k_gemm import schedule_split_k_gemm
    from tvm_dsm.workloads.dense import dense

    sch = schedule_split_k_gemm(dense(m, n, k, bias=True, activation="relu"), config, load_hardware())
    func = tvm.compile(sch.mod, target=TARGET)
    dev = tvm.cuda(0)
    rng = np.random.default_rng()
    x = rng.standard_normal((m, k)).astype(np.float16)
    w = rng.standard_normal((n, k)).astype(np.float16)
    b = rng.standard_normal(n).astype(np.float16)
    y = tvm.runtime.tensor(np.full((m, n), np.nan, np.float16), dev)
    func(*(tvm.runtime.tensor(a, dev) for a in (x, w, b)), y)
    ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + b, 0)
    return float(np.linalg.norm(y.numpy() - ref) / np.linalg.norm(ref))


def chain_error_on_gpu(func, mod: tvm.IRModule) -> float:
    """Relative error vs float64 of ``mod``, a schedule of the GEMM chain ``func`` (FFN with
    ReLU, or SwiGLU: gate and up weights first; fp16 or bf16), run on the GPU with fresh random
    inputs (weights scaled like torch.nn.Linear's) and a NaN-poisoned output."""
    lib = tvm.compile(mod, target=TARGET)
    dev = tvm.cuda(0)
    rng = np.random.default_rng()
    host = ml_dtypes.bfloat16 if str(func.params[0].ty.dtype) == "bfloat16" else np.float16
    (m, k), *shapes, out_shape = [tuple(int(d) for d in p.ty.shape) for p in func.params]
    a = rng.standard_normal((m, k)).astype(host)
    weights = [(rng.standard_normal(s) / np.sqrt(s[1])).astype(host) for s in shapes]
    out = tvm.runtime.tensor(np.full(out_shape, np.nan).astype(host), dev)
    lib(*(tvm.runtime.tensor(x, dev) for x in (a, *weights)), out)
    x = a.astype(np.float64)
    if len(weights) == 3:
        g, u = (x @ w.astype(np.float64).T for w in weights[:2])
        h = g / (1 + np.exp(-g)) * u
    else:
        h = np.maximum(x @ weights[0].astype(np.float64).T, 0)
    ref = h.astype(host).astype(np.float64) @ weights[-1].astype(np.float64).T  # H as the function rounds it
    return float(np.linalg.norm(out.numpy().astype(np.float64) - ref) / np.linalg.norm(ref))


def relative_error_on_gpu(func, inputs: list, reference, out_shape: tuple, dtype) -> float:
    """``func`` built by ``tvm_dsm.build`` (a schedule: compiled as it is) and run on ``inputs``
    (float64, rounded to ``dtype``) with a NaN-poisoned output, against ``reference`` of the
    rounded inputs in float64; asserts every output element was written."""
    lib = tvm.compile(func.mod, target=TARGET) if isinstance(func, s_tir.Schedule) else tvm_dsm.build(func, TARGET)
    dev = tvm.cuda(0)
    rounded = [a.astype(dtype) for a in inputs]
    out = tvm.runtime.tensor(np.full(out_shape, np.nan).astype(dtype), dev)
    lib(*(tvm.runtime.tensor(a, dev) for a in rounded), out)
    got = out.numpy().astype(np.float64)
    assert not np.isnan(got).any()
    ref = reference(*(a.astype(np.float64) for a in rounded))
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def _nvcc(folder: Path, source: str, name: str, *flags: str) -> subprocess.CompletedProcess:
    """Compile ``source`` to an sm_90a cubin in ``folder``; fails the test with nvcc's message."""
    cu, cubin = folder / f"{name}.cu", folder / f"{name}.cubin"
    cu.write_text(source)
    proc = subprocess.run(
        ["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", *flags, "-o", str(cubin), str(cu)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="session")
def nvcc_folder(tmp_path_factory) -> Path:
    """A folder for nvcc's inputs and outputs; skips the test where nvcc is not installed."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    return tmp_path_factory.mktemp("nvcc")


@pytest.fixture(scope="session")
def assemble(nvcc_folder):
    """Assemble CUDA source for sm_90a with nvcc; fails the test with nvcc's message."""

    def run(source: str, name: str = "kernel", include_dirs: tuple[Path, ...] = ()) -> bytes:
        _nvcc(nvcc_folder, source, name, *(f"-I{d}" for d in include_dirs))
        return (nvcc_folder / f"{name}.cubin").read_bytes()

    return run


def registers(report: str) -> int:
    """The registers a thread of the (first) kernel in ptxas's resource ``report`` uses."""
    return int(re.search(r"Used (\d+) registers", report).group(1))


@pytest.fixture(scope="session")
def ptxas_report(nvcc_folder):
    """ptxas's resource report (registers, stack frame) of CUDA source assembled for sm_90a."""

    def run(source: str, name: str = "kernel") -> str:
        return _nvcc(nvcc_folder, source, name, "-Xptxas", "-v").stderr

    return run


def planned_candidates(space, mod: tvm.IRModule, indices=None, target="nvidia/nvidia-h100") -> list:
    """What MetaSchedule makes of a ``PlannedSpace`` design space for ``target`` whose decision
    is each of ``indices`` (all of the space's configurations by default): the trace replayed
    with it, then the space's postprocessors; (schedule, each postprocessor's verdict) each."""
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    context = ms.TuneContext(mod=mod, target=tvm.target.Target(target), space_generator=space, task_name="planned")
    (design,) = context.generate_design_space()
    sample = next(i for i in design.trace.insts if i.kind.name == "SampleCategorical")
    out = []
    for index in range(len(space.plans.ranking.plans)) if indices is None else indices:
        sch = s_tir.Schedule(mod)
        design.trace.with_decision(sample, index, True).apply_to_schedule(sch, remove_postproc=True)
        sch.enter_postproc()
        out.append((sch, [postproc.apply(sch) for postproc in space.postprocs]))
    return out


def planned_candidate(space, mod: tvm.IRModule, index: int):
    """:func:`planned_candidates`' schedule for decision ``index``, every postprocessor passed."""
    ((sch, verdicts),) = planned_candidates(space, mod, [index])
    assert all(verdicts)
    return sch
