"""tvm_dsm.compile_cache and tvm_dsm.local_measure: compiled CUDA kept on disk, and a tuning
runner that neither compiles nor refills arguments per candidate (CPU only)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_dsm import compile_cache as cc
from tvm_dsm import compile_options as co
from tvm_dsm.local_measure import export_compiled, reused_arguments

KERNEL = r"""
extern "C" __global__ void scale(float* __restrict__ y, const float* __restrict__ x) {
  y[blockIdx.x * 128 + threadIdx.x] = 2.0f * x[blockIdx.x * 128 + threadIdx.x];
}
"""

needs_nvcc = pytest.mark.skipif(co.find_nvcc() is None, reason="needs nvcc")


@pytest.fixture
def counted_compiles(monkeypatch):
    """Every compile cc makes, by (code, options): the real compiler behind a counter."""
    calls = []

    def compile_cuda(code, arch, options, compiler):
        calls.append((code, options))
        return b"\x7fELF" + f"{arch}|{options!r}|{compiler}".encode() + code.encode()

    monkeypatch.setattr(cc, "compile_cuda", compile_cuda)
    monkeypatch.setattr(cc, "compiler_build", lambda compiler: f"{compiler} 13.0")
    return calls


def test_compiled_once_then_read(tmp_path, monkeypatch, counted_compiles):
    monkeypatch.setenv(cc.CACHE_ENV, str(tmp_path))
    first = cc.compiled(KERNEL, "sm_90a", compiler="nvcc")
    assert cc.compiled(KERNEL, "sm_90a", compiler="nvcc") == first
    assert len(counted_compiles) == 1
    assert [p.suffix for p in tmp_path.iterdir()] == [".cubin"]  # no temporary file left behind


def test_everything_that_decides_the_code_is_in_the_key(tmp_path, monkeypatch, counted_compiles):
    monkeypatch.setenv(cc.CACHE_ENV, str(tmp_path))
    cc.compiled(KERNEL, "sm_90a", compiler="nvcc")
    cc.compiled(KERNEL + "\n", "sm_90a", compiler="nvcc")
    cc.compiled(KERNEL, "sm_90", compiler="nvcc")
    cc.compiled(KERNEL, "sm_90a", co.CudaCompileOptions(fast_math=False), compiler="nvcc")
    cc.compiled(KERNEL, "sm_90a", compiler="nvrtc")
    monkeypatch.setattr(cc, "compiler_build", lambda compiler: f"{compiler} 13.1")
    cc.compiled(KERNEL, "sm_90a", compiler="nvcc")
    assert len(counted_compiles) == 6
    assert len(list(tmp_path.iterdir())) == 6


def test_off_compiles_every_time(monkeypatch, counted_compiles):
    monkeypatch.setenv(cc.CACHE_ENV, "off")
    assert cc.cache_dir() is None
    cc.compiled(KERNEL, "sm_90a", compiler="nvcc")
    cc.compiled(KERNEL, "sm_90a", compiler="nvcc")
    assert len(counted_compiles) == 2


def test_unwritable_cache_still_compiles(tmp_path, monkeypatch, counted_compiles):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(cc.CACHE_ENV, str(blocker / "cubin"))  # a folder below a file
    assert cc.compiled(KERNEL, "sm_90a", compiler="nvcc").startswith(b"\x7fELF")


@needs_nvcc
def test_builder_export_fills_the_cache_the_callback_reads(tmp_path, monkeypatch):
    """A MetaSchedule builder worker compiles the candidate's CUDA; the runner's load (TVM calls
    tvm_callback_cuda_compile with the same source) then finds it without compiling."""
    import tvm_ffi
    from tvm_dsm.workloads.dense import dense
    from tvm_dsm.driver import H100, plan

    monkeypatch.setenv(cc.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("TVM_DSM_CUDA_COMPILER", "nvcc")
    monkeypatch.setenv("TVM_DSM_CUDA_ARCH", "sm_90a")
    ranking = plan(dense(64, 256, 256))
    module = tvm.compile(ranking.schedule(0).mod, target=tvm.target.Target(H100, host="llvm"))
    path = export_compiled(module.mod if hasattr(module, "mod") else module)
    assert path.endswith(".so")
    assert len(list((tmp_path / "cache").iterdir())) == 1
    source = (module.mod if hasattr(module, "mod") else module).imports[0].inspect_source()
    monkeypatch.setattr(co, "compile_with_nvcc", lambda *a: pytest.fail("compiled again"))
    monkeypatch.setattr(cc, "compile_cuda", lambda *a: pytest.fail("compiled again"))
    cubin = bytes(tvm_ffi.get_global_func("tvm_callback_cuda_compile")(source))
    assert cubin[:4] == b"\x7fELF"


def test_runner_arguments_allocated_once_per_signature():
    device = tvm.cpu(0)
    a = [["TENSOR", "float32", [64, 32]], ["TENSOR", "float32", [64]]]
    b = [["TENSOR", "float16", [8, 8]]]
    first = reused_arguments(device, a, 1)
    assert reused_arguments(device, a, 1) is first
    assert [t.shape for t in first[0]] == [(64, 32), (64,)]
    assert np.isfinite(first[0][0].numpy()).all()
    other = reused_arguments(device, b, 1)
    assert other is not first and other[0][0].dtype == "float16"
    assert reused_arguments(device, a, 1) is not first  # only the last signature is kept
