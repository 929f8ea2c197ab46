"""Measuring candidates on this machine's GPU with MetaSchedule's LocalBuilder and LocalRunner,
with the work that does not need the GPU done by the builder's parallel workers.

The runner has one worker and takes candidates one after the other, so whatever it does per
candidate besides timing multiplies by the trial count. With MetaSchedule's defaults that is
most of a tuning run: loading a candidate links its exported tar into a shared library and
compiles its CUDA source (TVM 0.27 compiles CUDA when a module is loaded), and the arguments are
allocated and filled with random values again for every candidate (a 8192 x 8192 weight takes
about a second). Here the builder exports a shared library and compiles its CUDA into tvm-dsm's
cubin cache (:mod:`tvm_dsm.compile_cache`), which the runner's load then reads; the runner keeps
one set of random arguments per argument signature for all the candidates of a task.
"""

from __future__ import annotations

import json
import os
import tempfile

from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig
from tvm.s_tir.meta_schedule.runner.local_runner import default_alloc_argument

from .compile_cache import compiled

#: How a runner (this machine's, or an RPC server) times one candidate. A repeat runs the kernel
#: back to back for at least ``min_repeat_ms`` (``number`` runs at the least), after one
#: discarded warm-up run; tvm-dsm's kernels take from about 5 us (a small split-K GEMM) to a few
#: ms, so a repeat averages thousands of launches of the short ones and still ten of the long ones. ``tvm_dsm.tune``
#: reports the median of the ``repeat`` values: five keep one disturbed repeat (a clock change,
#: another process on the GPU) from moving it. About 0.1 s of GPU time per candidate. No CPU
#: cache flush: the operands live on the GPU, where back-to-back runs keep those that fit in L2
#: (the benchmark suites rotate theirs past it, so small shapes time lower here than there).
GPU_EVALUATOR = EvaluatorConfig(number=10, repeat=5, min_repeat_ms=20, enable_cpu_cache_flush=False)

#: The random arguments of the last signature the runner's worker allocated for.
_ARGUMENTS: dict[str, list] = {}


def export_compiled(mod) -> str:
    """A builder's export: ``mod`` as a shared library, its CUDA compiled into the cubin cache."""
    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    mod.export_library(path)
    for imported in mod.imports:
        if imported.kind == "cuda":
            compiled(imported.inspect_source())
    return path


def reused_arguments(device, args_info, alloc_repeat: int) -> list:
    """A runner's argument allocation: MetaSchedule's random arguments, allocated once per
    signature (the previous signature's are freed when another comes)."""
    key = json.dumps([str(device), args_info, alloc_repeat], default=str)
    if key not in _ARGUMENTS:
        _ARGUMENTS.clear()
        _ARGUMENTS[key] = default_alloc_argument(device, args_info, alloc_repeat)
    return _ARGUMENTS[key]


def local_builder(timeout_sec: float, initializer) -> ms.builder.LocalBuilder:
    """MetaSchedule's LocalBuilder on every core, exporting with :func:`export_compiled`."""
    return ms.builder.LocalBuilder(timeout_sec=timeout_sec, initializer=initializer, f_export=export_compiled)


def local_runner(initializer) -> ms.runner.LocalRunner:
    """MetaSchedule's LocalRunner timing by :data:`GPU_EVALUATOR`, loading through tvm-dsm's
    compile callback (``initializer`` imports tvm-dsm in its worker) and reusing arguments
    (:func:`reused_arguments`)."""
    return ms.runner.LocalRunner(evaluator_config=GPU_EVALUATOR, initializer=initializer,
                                 f_alloc_argument=reused_arguments)
