"""Counters that live in a CUDA module: a ``__device__`` array, zero when the module loads and
kept between launches. A kernel uses them to order its CTAs through global memory within one
launch: the last CTA of a group to finish an output tile reduces the group's partial tiles.
This is what a one-launch split reduction needs, without a workspace to clear first.

TIR has no module-level variables. So a kernel names its counters by a call,
:func:`last_to_arrive`, and the CUDA source TVM generates is post-processed to declare each
array named (:func:`declare`). TVM calls ``tvm_callback_cuda_postproc`` on every CUDA module it
generates, and :func:`install` registers the declaration there. The array belongs to the
module, so two launches of one kernel must not overlap: a kernel on two streams at once would
share its counters.
"""

from __future__ import annotations

import re

import tvm_ffi
from tvm import tirx

#: The call a kernel makes on a counter array in the CUDA source: ``tvm_dsm_last_<name>_<count>(i, n)``.
_CALL = re.compile(r"\btvm_dsm_last_([A-Za-z0-9]+)_(\d+)\(")
_POSTPROC = "tvm_callback_cuda_postproc"


def _checked(name: str, count: int) -> str:
    if not re.fullmatch(r"[A-Za-z0-9]+", name) or count < 1:
        raise ValueError(f"counters need a name of letters and digits and a positive count (got {name!r}, {count})")
    return f"{name}_{count}"


def last_to_arrive(name: str, count: int, index, arrivals: int) -> tirx.PrimExpr:
    """Whether this CTA is the last of ``arrivals`` CTAs to arrive at counter ``index`` of the
    module's ``count`` counters named ``name`` (letters and digits). Every thread of the CTA
    must evaluate it (it holds two CTA barriers): every thread fences its global stores, one
    thread increments the counter, and all learn the answer; the last CTA sets the counter
    back to zero for the next launch, and what the CTAs before it stored is visible to it."""
    return tirx.call_extern("bool", f"tvm_dsm_last_{_checked(name, count)}", index, arrivals)


def declare(code: str) -> str:
    """``code`` with each counter array its kernels name declared before the first kernel (a
    ``__device__`` array and its arrival function), where ``code`` does not declare it yet."""
    arrays = [(name, count) for name, count in sorted(set(_CALL.findall(code)))
              if f"tvm_dsm_counter_array_{name}[" not in code]
    if not arrays:
        return code
    sizes = {}
    for name, count in arrays:
        if sizes.setdefault(name, count) != count:
            raise ValueError(f"counter array {name!r} is named with two sizes ({sizes[name]} and {count})")
    declarations = "".join(
        f"__device__ unsigned int tvm_dsm_counter_array_{name}[{count}];\n"
        f"__device__ __forceinline__ bool tvm_dsm_last_{name}_{count}(int i, unsigned int arrivals) {{\n"
        "  __threadfence();\n"
        "  __syncthreads();\n"
        "  int last = 0;\n"
        "  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {\n"
        f"    last = atomicAdd(tvm_dsm_counter_array_{name} + i, 1u) == arrivals - 1u;\n"
        f"    if (last) atomicExch(tvm_dsm_counter_array_{name} + i, 0u);\n"
        "  }\n"
        "  last = __syncthreads_or(last);\n"
        "  __threadfence();\n"
        "  return last != 0;\n"
        "}\n"
        for name, count in arrays)
    first_kernel = code.find('extern "C" __global__')
    at = first_kernel if first_kernel >= 0 else len(code)
    return code[:at] + declarations + code[at:]


def install() -> None:
    """Register :func:`declare` as TVM's CUDA source post-processing, after the one registered
    before it (if any); once a process."""
    global _installed
    if _installed:
        return
    previous = tvm_ffi.get_global_func(_POSTPROC, allow_missing=True)

    def postprocess(code, target):
        return declare(previous(code, target) if previous is not None else code)

    tvm_ffi.register_global_func(_POSTPROC, postprocess, override=True)
    _installed = True


_installed = False
