"""Counters that live in a CUDA module: a ``__device__`` array, zero when the module loads and
kept between launches. A kernel uses them to order its CTAs through global memory within one
launch, for a one-launch split reduction without a workspace to clear first:

* :func:`last_to_arrive`: the last CTA of a group to finish an output tile reduces the group's
  partial tiles (no CTA waits for another);
* :func:`gather` and :func:`leave`: every CTA of the group waits until all have written their
  partials, then reduces its share of the tile. Only for grids whose CTAs are all resident at
  once (a waiting CTA holds its SM). A dependent grid launched programmatically does not take
  their SMs: it launches once every CTA of the grid has started and triggered it.

TIR has no module-level variables. So a kernel names its counters by calls, and the CUDA
source TVM generates is post-processed to declare each array named (:func:`declare`): two
counters per index (arrivals, departures). TVM calls ``tvm_callback_cuda_postproc`` on every
CUDA module it generates, and :func:`install` registers the declaration there. The array
belongs to the module, so two launches of one kernel must not overlap: a kernel on two
streams at once would share its counters.
"""

from __future__ import annotations

import re

import tvm_ffi
from tvm import tirx

#: The calls a kernel makes on a counter array in the CUDA source: ``tvm_dsm_<call>_<name>_<count>(i, n)``.
_CALL = re.compile(r"\btvm_dsm_(?:last|gather|leave)_([A-Za-z0-9]+)_(\d+)\(")
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


def gather(name: str, count: int, index, arrivals: int) -> tirx.PrimExpr:
    """Wait until ``arrivals`` CTAs have arrived at counter ``index`` of ``name`` (this one
    included). Every thread of the CTA must call it (it holds two CTA barriers): every thread
    fences its global stores first, and what every arrived CTA stored is visible after it."""
    return tirx.call_extern("void", f"tvm_dsm_gather_{_checked(name, count)}", index, arrivals)


def leave(name: str, count: int, index, arrivals: int) -> tirx.PrimExpr:
    """Leave counter ``index`` of ``name`` after :func:`gather` (every thread of the CTA calls
    it, after its last read of the gathered data); the last of ``arrivals`` CTAs to leave sets
    the counter back to zero for the next launch."""
    return tirx.call_extern("void", f"tvm_dsm_leave_{_checked(name, count)}", index, arrivals)


def declare(code: str) -> str:
    """``code`` with each counter array its kernels name declared before the first kernel (a
    ``__device__`` array and its functions), where ``code`` does not declare it yet."""
    arrays = [(name, count) for name, count in sorted(set(_CALL.findall(code)))
              if f"tvm_dsm_counter_array_{name}[" not in code]
    if not arrays:
        return code
    sizes = {}
    for name, count in arrays:
        if sizes.setdefault(name, count) != count:
            raise ValueError(f"counter array {name!r} is named with two sizes ({sizes[name]} and {count})")
    declarations = "".join(_declaration(name, int(count)) for name, count in arrays)
    first_kernel = code.find('extern "C" __global__')
    at = first_kernel if first_kernel >= 0 else len(code)
    return code[:at] + declarations + code[at:]


def _declaration(name: str, count: int) -> str:
    """The CUDA of counter array ``name``: ``count`` arrival counters, then ``count`` departure
    counters, and the functions on them."""
    array = f"tvm_dsm_counter_array_{name}"
    first_thread = "threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0"
    return (
        f"__device__ unsigned int {array}[{2 * count}];\n"
        f"__device__ __forceinline__ bool tvm_dsm_last_{name}_{count}(int i, unsigned int arrivals) {{\n"
        "  __threadfence();\n  __syncthreads();\n  int last = 0;\n"
        f"  if ({first_thread}) {{\n"
        f"    last = atomicAdd({array} + i, 1u) == arrivals - 1u;\n"
        f"    if (last) atomicExch({array} + i, 0u);\n  }}\n"
        "  last = __syncthreads_or(last);\n  __threadfence();\n  return last != 0;\n}\n"
        f"__device__ __forceinline__ void tvm_dsm_gather_{name}_{count}(int i, unsigned int arrivals) {{\n"
        "  __threadfence();\n  __syncthreads();\n"
        f"  if ({first_thread}) {{\n"
        f"    if (atomicAdd({array} + i, 1u) != arrivals - 1u) {{\n"
        f"      while (atomicAdd({array} + i, 0u) < arrivals) __nanosleep(32);\n    }}\n  }}\n"
        "  __syncthreads();\n  __threadfence();\n}\n"
        f"__device__ __forceinline__ void tvm_dsm_leave_{name}_{count}(int i, unsigned int arrivals) {{\n"
        "  __syncthreads();\n"
        f"  if ({first_thread} && atomicAdd({array} + {count} + i, 1u) == arrivals - 1u) {{\n"
        f"    atomicExch({array} + i, 0u);\n    atomicExch({array} + {count} + i, 0u);\n  }}\n}}\n"
    )


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
