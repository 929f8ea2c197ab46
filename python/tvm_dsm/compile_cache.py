"""Compiled CUDA kept on disk, so a kernel is compiled once and every later load reads its cubin.

TVM 0.27 compiles a CUDA module's source when the module is loaded (see
:mod:`tvm_dsm.compile_options`): a second process loading the same model, or a MetaSchedule
runner loading candidates one after the other, spends seconds of nvcc per module again. The
callback tvm-dsm registers goes through :func:`compiled`, which keys a cubin by everything that
decides its machine code: the source, the architecture, the options, the compiler and that
compiler's build. Entries are written atomically, so processes compiling in parallel (a
MetaSchedule builder's workers) share the cache safely.

``TVM_DSM_CUBIN_CACHE`` names the folder (default ``$XDG_CACHE_HOME/tvm_dsm/cubin``, i.e.
``~/.cache/tvm_dsm/cubin``); ``TVM_DSM_CUBIN_CACHE=off`` compiles every time.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from .compile_options import DEFAULT, CudaCompileOptions, arch_for, backend, compile_cuda, cuda_arch, find_nvcc

CACHE_ENV = "TVM_DSM_CUBIN_CACHE"


def cache_dir() -> Path | None:
    """The cache folder, or None where ``TVM_DSM_CUBIN_CACHE`` turns it off."""
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() in ("off", "0", "none"):
        return None
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tvm_dsm" / "cubin"


def compiler_build(compiler: str) -> str:
    """What identifies the compiler's build: nvcc's resolved path, size and modification time
    (a CUDA upgrade replaces the file), or NVRTC's version."""
    if compiler == "nvcc":
        path = os.path.realpath(find_nvcc() or "nvcc")
        try:
            stat = os.stat(path)
        except OSError:
            return path
        return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    from cuda.bindings import nvrtc

    _, major, minor = nvrtc.nvrtcVersion()
    return f"nvrtc {major}.{minor}"


def cache_key(code: str, arch: str, options: CudaCompileOptions, compiler: str) -> str:
    identity = f"{compiler}|{compiler_build(compiler)}|{arch}|{options!r}\n"
    return hashlib.sha256((identity + code).encode()).hexdigest()


def compiled(code: str, arch: str | None = None, options: CudaCompileOptions = DEFAULT,
             compiler: str | None = None) -> bytes:
    """The cubin of ``code`` (as :func:`~tvm_dsm.compile_options.compile_cuda` makes it), from
    the cache where an earlier compile left it."""
    arch = arch_for(code, arch or cuda_arch())
    compiler = compiler or backend()
    folder = cache_dir()
    if folder is None:
        return compile_cuda(code, arch, options, compiler)
    path = folder / f"{cache_key(code, arch, options, compiler)}.cubin"
    try:
        return path.read_bytes()
    except OSError:
        pass
    cubin = compile_cuda(code, arch, options, compiler)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".tmp", delete=False) as out:
            out.write(cubin)
        os.replace(out.name, path)
    except OSError:  # a read-only or full disk: the cubin is still returned, just not kept
        pass
    return cubin


def register(options: CudaCompileOptions = DEFAULT, compiler: str | None = None):
    """Make ``tvm_callback_cuda_compile`` compile with ``options`` (every CUDA module loaded
    afterwards, tvm-dsm's or not), through the on-disk cache of :mod:`tvm_dsm.compile_cache`.
    Returns the registered function."""
    import tvm_ffi

    try:  # TVM registers its own callback when this module is imported: let it, then replace it.
        import tvm.support.nvcc  # noqa: F401
    except ImportError:
        pass

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def tvm_callback_cuda_compile(code, *_):
        return bytearray(compiled(code, options=options, compiler=compiler))

    return tvm_callback_cuda_compile


def register_default() -> None:
    """What importing tvm-dsm does: :func:`register` unless ``TVM_DSM_CUDA_COMPILE=tvm``."""
    if os.environ.get("TVM_DSM_CUDA_COMPILE", "").lower() != "tvm":
        register()
