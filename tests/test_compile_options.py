"""tvm_dsm.compile_options: one set of CUDA compile options through nvcc or NVRTC (CPU only)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import tvm
import tvm_ffi

import tvm_dsm  # noqa: F401  (registers the compile callback)
from tvm_dsm import compile_options as co
from tvm_dsm.gpu.compile_paths import cubin_info, fatbin_cubin

KERNEL = r"""
extern "C" __global__ void __launch_bounds__(128) softmax_row(float* __restrict__ y, const float* __restrict__ x) {
  __shared__ float row[128];
  float v = x[blockIdx.x * 128 + threadIdx.x];
  row[threadIdx.x] = v;
  __syncthreads();
  float m = row[0];
  for (int i = 1; i < 128; ++i) m = fmaxf(m, row[i]);
  float s = 0.0f;
  for (int i = 0; i < 128; ++i) s += expf(row[i] - m);
  y[blockIdx.x * 128 + threadIdx.x] = expf(v - m) / s;
}
"""

needs_nvcc = pytest.mark.skipif(co.find_nvcc() is None, reason="needs nvcc")


def _has_nvrtc() -> bool:
    try:
        from cuda.bindings import nvrtc  # noqa: F401

        return co._cuda_path_with_headers() is not None
    except ImportError:
        return False


needs_nvrtc = pytest.mark.skipif(not _has_nvrtc(), reason="needs cuda-bindings (NVRTC) and the CUDA headers")


def _text(binary: bytes) -> dict:
    """The machine code of each kernel of a cubin (or of the cubin inside a fatbin)."""
    import struct

    elf = binary if binary[:4] == b"\x7fELF" else fatbin_cubin(binary)
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    base = sections[shstrndx][4]

    def name(offset):
        return elf[base + offset:elf.index(b"\0", base + offset)].decode()

    return {name(s[0]): elf[s[4]:s[4] + s[5]] for s in sections if name(s[0]).startswith(".text.")}


def test_flags_name_every_choice():
    fast = co.CudaCompileOptions(fast_math=True, register_usage_level=None)
    flags = fast.nvcc_flags("sm_90a")
    assert flags[:3] == ["-cubin", "-O3", "-gencode=arch=compute_90a,code=sm_90a"]
    assert "--use_fast_math" in flags and "--ptxas-options=-O3" in flags
    assert not any("register-usage-level" in f for f in flags)
    exact = co.CudaCompileOptions(fast_math=False, register_usage_level=10)
    assert "--use_fast_math" not in exact.nvcc_flags("sm_90a")
    assert "--ptxas-options=-O3,--register-usage-level=10" in exact.nvcc_flags("sm_90a")
    # NVRTC takes each ptxas flag as its own option
    assert exact.nvrtc_flags() == ["--ptxas-options=-O3", "--ptxas-options=--register-usage-level=10"]
    assert fast.nvrtc_flags() == ["--use_fast_math", "--ptxas-options=-O3"]


def test_nvrtc_options_rewritten_keep_tvms_others():
    tvm_options = [b"--gpu-architecture=sm_90a", b"-default-device", b"-I/usr/local/cuda/include",
                   b"-U__CUDA_NO_HALF_OPERATORS__", b"--use_fast_math", b"--ptxas-options=-v",
                   b"--ptxas-options=--register-usage-level=10",
                   b"--ptxas-options=--warn-on-local-memory-usage"]
    options = co.CudaCompileOptions(fast_math=False, register_usage_level=None)
    out = co._rewrite_nvrtc_options(tvm_options, options)
    assert b"--use_fast_math" not in out
    assert not any(b"register-usage-level" in o for o in out)
    assert out[:4] == tvm_options[:4] and b"--ptxas-options=-v" in out
    assert out[-1] == b"--ptxas-options=-O3"


def test_arch_from_environment_then_target(monkeypatch):
    monkeypatch.setenv("TVM_DSM_CUDA_ARCH", "sm_100a")
    assert co.cuda_arch() == "sm_100a"
    monkeypatch.delenv("TVM_DSM_CUDA_ARCH")
    with tvm.target.Target({"kind": "cuda", "arch": "sm_89"}):
        assert co.cuda_arch() == "sm_89"


@pytest.mark.skipif(co.find_nvcc() is None, reason="needs nvcc")
def test_a_target_of_arch_sm_90_gets_kernels_that_compile():
    """Built for arch ``sm_90`` (not ``sm_90a``), the GEMM family's wgmma kernel compiles: its
    code is compiled for the arch-specific variant, which only it needs."""
    from tvm_dsm.workloads.dense import dense

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    source = tvm_dsm.build(dense(128, 1024, 1024), target).mod.imports[0].inspect_source()
    assert "wgmma." in source and co.arch_for(source, "sm_90") == "sm_90a"
    with target:
        assert co.compile_cuda(source, compiler="nvcc")
    assert co.arch_for("__global__ void k() {}", "sm_90") == "sm_90"
    assert co.arch_for(source, "sm_100a") == "sm_100a"


def test_backend_prefers_nvcc(monkeypatch):
    monkeypatch.delenv("TVM_DSM_CUDA_COMPILER", raising=False)
    assert co.backend() == ("nvcc" if co.find_nvcc() else "nvrtc")
    monkeypatch.setenv("TVM_DSM_CUDA_COMPILER", "nvrtc")
    assert co.backend() == "nvrtc"


@needs_nvcc
def test_importing_tvm_dsm_registers_the_callback(monkeypatch):
    monkeypatch.setenv("TVM_DSM_CUDA_COMPILER", "nvcc")
    monkeypatch.setenv("TVM_DSM_CUDA_ARCH", "sm_90a")
    registered = bytes(tvm_ffi.get_global_func("tvm_callback_cuda_compile")(KERNEL))
    assert _text(registered) == _text(co.compile_cuda(KERNEL))


@needs_nvcc
@pytest.mark.parametrize("opt_out", [False, True])
def test_opt_out_keeps_tvms_callback(opt_out):
    """TVM's callback in nvcc mode returns a fatbin, tvm-dsm's a cubin (an ELF)."""
    code = ("import tvm, tvm_ffi, tvm_dsm\n"
            "with tvm.target.Target({'kind': 'cuda', 'arch': 'sm_90a'}):\n"
            f"    out = bytes(tvm_ffi.get_global_func('tvm_callback_cuda_compile')({KERNEL!r}))\n"
            "print('ELF' if out[:4] == b'\\x7fELF' else 'other')\n")
    env = {**os.environ, "TVM_CUDA_COMPILE_MODE": "nvcc", "TVM_DSM_CUDA_COMPILER": "nvcc"}
    env.pop("TVM_DSM_CUDA_COMPILE", None)
    if opt_out:
        env["TVM_DSM_CUDA_COMPILE"] = "tvm"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == ("other" if opt_out else "ELF")


@needs_nvcc
@needs_nvrtc
def test_both_backends_reproduce_tvms_paths_and_differ_only_by_compiler(monkeypatch):
    """With TVM's own choices (fast math, register-usage level 10) the module's nvcc cubin has
    the machine code of TVM_CUDA_COMPILE_MODE=nvcc and its NVRTC cubin that of TVM's default."""
    from tvm.support import nvcc as tvm_nvcc

    root = co._cuda_path_with_headers()
    monkeypatch.setenv("CUDA_PATH", root)
    tvm_like = co.CudaCompileOptions(fast_math=True, register_usage_level=10)
    tvm_nvrtc = bytes(tvm_nvcc.compile_cuda(KERNEL, target_format="cubin", arch="sm_90a", compiler="nvrtc"))
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}):
        tvm_fatbin = bytes(tvm_nvcc.compile_cuda(KERNEL, target_format="fatbin", compiler="nvcc"))
    assert _text(co.compile_cuda(KERNEL, "sm_90a", tvm_like, "nvrtc")) == _text(tvm_nvrtc)
    assert _text(co.compile_cuda(KERNEL, "sm_90a", tvm_like, "nvcc")) == _text(tvm_fatbin)
    # and without fast math the code changes (exp and the division are exact)
    exact = co.CudaCompileOptions(fast_math=False)
    assert _text(co.compile_cuda(KERNEL, "sm_90a", exact, "nvcc")) != _text(co.compile_cuda(KERNEL, "sm_90a"))


@needs_nvrtc
def test_nvrtc_gets_the_options(monkeypatch):
    from cuda.bindings import nvrtc

    seen = []
    original = nvrtc.nvrtcCompileProgram

    def spy(prog, count, opts):
        seen.append([o.decode() for o in opts])
        return original(prog, count, opts)

    monkeypatch.setattr(nvrtc, "nvrtcCompileProgram", spy)
    binary = co.compile_with_nvrtc(KERNEL, "sm_90a", co.CudaCompileOptions(fast_math=False))
    assert binary[:4] == b"\x7fELF" and cubin_info(binary)["softmax_row"]["regs"] > 0
    assert "--use_fast_math" not in seen[-1] and "--ptxas-options=-O3" in seen[-1]
    assert "--gpu-architecture=sm_90a" in seen[-1]
    assert nvrtc.nvrtcCompileProgram is spy  # restored after the call (the spy stays ours)
