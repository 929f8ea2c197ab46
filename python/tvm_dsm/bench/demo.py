"""Small helpers the tutorials share: section headers, GPU detection, an nvcc assembly check."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import tvm


def section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))


def gpu_available() -> bool:
    """A CUDA GPU that both torch and TVM can use."""
    try:
        import torch

        return torch.cuda.is_available() and tvm.cuda(0).exist
    except ImportError:
        return False


def run_section(run_on_gpu, executable, suite: str) -> None:
    """The tutorials' last section: ``run_on_gpu(executable)`` where a GPU is present, else how
    the suite's kernels are checked and timed on a GPU machine."""
    section("run")
    if gpu_available():
        run_on_gpu(executable)
    else:
        print(f"no CUDA GPU here: plan and CUDA shown above; `python -m tvm_dsm.gpu.export {suite}` "
              "+ `python -m tvm_dsm.gpu.run` check and time the kernels on a GPU machine.")


def kernel_source(source: str) -> str:
    """The generated CUDA from the first kernel definition on (the helpers above it skipped)."""
    return source[source.index('extern "C" __global__ void __launch_bounds__'):].split(";\n", 1)[1]


def assemble(source: str, name: str) -> str:
    """Assemble CUDA for sm_90a with nvcc: "assembles", nvcc's message, or why it was skipped."""
    if not shutil.which("nvcc"):
        return "skipped (no nvcc)"
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp) / f"{name}.cu"
        cu.write_text(source)
        proc = subprocess.run(
            ["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-o", str(cu.with_suffix(".cubin")), str(cu)],
            capture_output=True, text=True,
        )
    return "assembles" if proc.returncode == 0 else proc.stderr
