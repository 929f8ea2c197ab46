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
