"""One set of compile options for tvm-dsm's CUDA, whichever way TVM would compile it.

TVM 0.27 builds a CUDA module as source and compiles it when the module is loaded, through the
global function ``tvm_callback_cuda_compile(code)`` that ``tvm/support/nvcc.py`` registers. That
function takes one of two paths, and a third is common on this project's GPU machine:

========================  ===================================================================
``nvrtc`` (TVM default)   NVRTC, cubin, ``--use_fast_math``, ptxas ``-v``
                          ``--register-usage-level=10`` ``--warn-on-local-memory-usage``
``nvcc`` mode             ``TVM_CUDA_COMPILE_MODE=nvcc``: nvcc ``--fatbin -O3``, the same
                          fast math and ptxas flags, ``--expt-relaxed-constexpr
                          --expt-extended-lambda``
bundle callback           ``nvcc -cubin -O3`` (no fast math, ptxas defaults); what
                          ``shared/gpu/bundle`` registers on the device machine
========================  ===================================================================

The machine code differs between them (fast math: 10-25% fewer instructions in the attention,
decode and cascade kernels; NVRTC keeps shared-memory pointers 64-bit, which costs the lm_head
epilogue its vector stores), but on the H100 the times agree within noise
(bench/results/compile_paths.json). This module compiles with one set of options
(:data:`DEFAULT`) through nvcc where nvcc exists and through NVRTC with the same options otherwise
(no ``Target.current()``, so it works in runtime-only TVM), and :func:`tvm_dsm.compile_cache.register` installs it as
``tvm_callback_cuda_compile``; importing tvm_dsm does that. ``TVM_DSM_CUDA_COMPILER`` = ``nvcc`` | ``nvrtc`` forces a backend,
``TVM_DSM_CUDA_ARCH`` (e.g. ``sm_90a``) the architecture, ``TVM_DSM_CUDA_COMPILE=tvm`` leaves TVM's
own callback in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

#: The half/bfloat16 operator macros TVM's generated CUDA relies on (both TVM paths set them).
_HALF_MACROS = (
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
)


@dataclass(frozen=True)
class CudaCompileOptions:
    """What decides the machine code: ``fast_math`` (``--use_fast_math``: flush-to-zero,
    approximate division, square root and exp/log), ptxas's ``--register-usage-level``
    (None: ptxas's default, 5; TVM passes 10) and ptxas's optimization level."""

    fast_math: bool = True
    register_usage_level: int | None = 10
    ptxas_opt_level: int = 3
    lineinfo: bool = False

    def ptxas_flags(self) -> list[str]:
        flags = [f"-O{self.ptxas_opt_level}"]
        if self.register_usage_level is not None:
            flags.append(f"--register-usage-level={self.register_usage_level}")
        return flags

    def nvcc_flags(self, arch: str) -> list[str]:
        """nvcc's command line after ``nvcc`` (without input and output)."""
        flags = ["-cubin", "-O3", f"-gencode=arch=compute_{arch[3:]},code={arch}", *_HALF_MACROS]
        flags += ["--use_fast_math"] if self.fast_math else []
        flags += ["-lineinfo"] if self.lineinfo else []
        return flags + [f"--ptxas-options={','.join(self.ptxas_flags())}"]

    def nvrtc_flags(self) -> list[str]:
        """The options that decide the code among those NVRTC gets (TVM adds the architecture,
        include paths and macros); NVRTC takes each ptxas flag as its own option."""
        flags = ["--use_fast_math"] if self.fast_math else []
        flags += ["--generate-line-info"] if self.lineinfo else []
        return flags + [f"--ptxas-options={f}" for f in self.ptxas_flags()]


#: The options tvm-dsm compiles its kernels with: TVM's own choices (fast math, ptxas
#: register-usage level 10), so the nvcc cubin has the machine code of TVM's nvcc mode and the NVRTC
#: cubin that of TVM's default. On the H100 (compile_paths.json, 18 picks x 12 binaries, 3 machines)
#: no flag set was faster beyond noise; level 10 was 1-3.7% ahead of level 5 on the power-capped
#: head-dim-64 attention pick on all three machines, within the noise of identical code elsewhere.
DEFAULT = CudaCompileOptions()

_NVRTC_LOCK = threading.Lock()


def find_nvcc() -> str | None:
    """nvcc on PATH, under ``$CUDA_PATH`` or in /usr/local/cuda; None if there is none."""
    for candidate in (shutil.which("nvcc"), os.environ.get("CUDA_PATH") and Path(os.environ["CUDA_PATH"], "bin", "nvcc"),
                      Path("/usr/local/cuda/bin/nvcc")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def cuda_arch() -> str:
    """``TVM_DSM_CUDA_ARCH``, else the current target's arch, else the GPU's (sm_90a on an H100:
    Hopper's wgmma, setmaxnreg and cluster instructions need the ``a`` variant)."""
    arch = os.environ.get("TVM_DSM_CUDA_ARCH")
    if arch:
        return arch
    try:
        import tvm

        target = tvm.target.Target.current(allow_none=True)
        arch = str(target.attrs.get("arch", "")) if target is not None else ""
        if arch.startswith("sm_"):
            return arch
    except (AttributeError, ImportError):  # runtime-only TVM has no Target.current
        pass
    import tvm

    if tvm.cuda(0).exist:
        major, minor = tvm.cuda(0).compute_version.split(".")
        return f"sm_{major}{minor}" + ("a" if int(major) >= 9 else "")
    return "sm_90a"


#: PTX instructions only an arch-specific target (``sm_90a``) has, not its family's (``sm_90``).
ARCH_SPECIFIC = ("wgmma.", "setmaxnreg.")


def arch_for(code: str, arch: str) -> str:
    """``arch``, or its arch-specific variant (``sm_90`` -> ``sm_90a``) where ``code`` uses
    instructions only that one has (:data:`ARCH_SPECIFIC`; a target of arch ``sm_90`` gets
    tvm-dsm's wgmma kernels): such code runs on that GPU generation alone either way."""
    plain = arch.startswith("sm_9") and arch[3:].isdigit()
    return arch + "a" if plain and any(instruction in code for instruction in ARCH_SPECIFIC) else arch


def compile_with_nvcc(code: str, arch: str, options: CudaCompileOptions = DEFAULT, nvcc: str | None = None) -> bytes:
    """A cubin of ``code`` from nvcc."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found")
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d, "tvm_kernels.cu"), Path(d, "tvm_kernels.cubin")
        src.write_text(code)
        proc = subprocess.run([nvcc, *options.nvcc_flags(arch), "-o", str(out), str(src)],
                              capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"nvcc failed:\n{proc.stdout}{proc.stderr}")
        return out.read_bytes()


def _cuda_path_with_headers() -> str | None:
    """A CUDA root holding cuda_runtime.h for NVRTC (TVM's guess from ``which nvcc`` lands on
    /usr/local for a wrapper script in /usr/local/bin)."""
    for root in (os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "include", "cuda_runtime.h").exists():
            return root
    nvcc = find_nvcc()
    if nvcc:
        root = Path(os.path.realpath(nvcc)).parent.parent
        if Path(root, "include", "cuda_runtime.h").exists():
            return str(root)
    return None


def _rewrite_nvrtc_options(opts: list[bytes], options: CudaCompileOptions) -> list[bytes]:
    """TVM's NVRTC options with its fast-math and ptxas choices replaced by ``options``'."""
    decided = ("--use_fast_math", "--ptxas-options=--register-usage-level", "--ptxas-options=-O",
               "--generate-line-info")
    kept = [o for o in opts if not o.decode().startswith(decided)]
    return kept + [f.encode() for f in options.nvrtc_flags()]


@contextlib.contextmanager
def _nvrtc_options(options: CudaCompileOptions):
    """Inside: TVM's NVRTC compile (``tvm.support.nvcc._compile_cuda_nvrtc``: its source preamble,
    include paths and macros) gets ``options``' flags in place of its own fast-math and ptxas
    choices, which it does not let a caller change."""
    from cuda.bindings import nvrtc

    original = nvrtc.nvrtcCompileProgram

    def compile_program(prog, count, opts):
        opts = _rewrite_nvrtc_options(list(opts), options)
        return original(prog, len(opts), opts)

    with _NVRTC_LOCK:
        nvrtc.nvrtcCompileProgram = compile_program
        try:
            yield
        finally:
            nvrtc.nvrtcCompileProgram = original


def compile_with_nvrtc(code: str, arch: str, options: CudaCompileOptions = DEFAULT) -> bytes:
    """A cubin of ``code`` from NVRTC (needs the cuda-bindings package and the CUDA headers)."""
    from tvm.support import nvcc as tvm_nvcc

    root = _cuda_path_with_headers()
    saved = os.environ.get("CUDA_PATH")
    if root:
        os.environ["CUDA_PATH"] = root
    try:
        with _nvrtc_options(options):
            return bytes(tvm_nvcc._compile_cuda_nvrtc(code, target_format="cubin", arch=arch))
    finally:
        if root:
            if saved is None:
                os.environ.pop("CUDA_PATH", None)
            else:
                os.environ["CUDA_PATH"] = saved


def backend() -> str:
    """``nvcc`` where nvcc exists (or ``TVM_DSM_CUDA_COMPILER`` says so), else ``nvrtc``."""
    forced = os.environ.get("TVM_DSM_CUDA_COMPILER", "").lower()
    if forced in ("nvcc", "nvrtc"):
        return forced
    return "nvcc" if find_nvcc() else "nvrtc"


def compile_cuda(code: str, arch: str | None = None, options: CudaCompileOptions = DEFAULT,
                 compiler: str | None = None) -> bytes:
    """A cubin of ``code`` with ``options``, by ``compiler`` (default :func:`backend`), for
    ``arch`` (default :func:`cuda_arch`; :func:`arch_for` the code)."""
    arch = arch_for(code, arch or cuda_arch())
    compiler = compiler or backend()
    if compiler == "nvcc":
        return compile_with_nvcc(code, arch, options)
    if compiler == "nvrtc":
        return compile_with_nvrtc(code, arch, options)
    raise ValueError(f"compiler must be nvcc or nvrtc, not {compiler!r}")
