"""Where a step's GPU time goes, kernel by kernel: what holds a model's step above its floor.

:func:`profile_kernels` runs a step (a decode step of a Relax VM, a kernel call: anything that
launches CUDA work in this process, CUDA graphs included) a few times under the CUDA profiler
(CUPTI through ``torch.profiler``: it records TVM's kernels like any other) and
:func:`summarize` folds the kernel records into per-kernel rows: launches and device time per
step, share of the step's kernel time. Against the step's wall time, the difference is what no
kernel ran for (launch gaps, host work, synchronization).

A kernel launched programmatically (:mod:`tvm_dsm.transform.programmatic_launch`) starts while
the previous one runs and waits for it in ``griddepcontrol.wait``: its device time includes that
wait, so its ``us_per_step`` overstates it and the kernels' total can exceed the step (the 1B
Llama's one-row GEMVs: ``bench/results/archive/llama_1b_row_gemv_s51.json``). Each row's
``critical_us_per_step`` (:func:`critical_path`) counts only the time a function's kernels
extend the GPU's busy time, which sums to that busy time: what a faster kernel would save.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable

#: Kernels listed by name; the rest are summed into one "other" row.
TOP = 15
#: Functions listed by the idle time before them.
TOP_IDLE = 8
#: The profiler's names of copies and fills, which are not kernels.
_COPIES = ("Memcpy", "Memset")


def kernel_name(name: str) -> str:
    """The function a kernel belongs to: TVM names a PrimFunc's kernels ``<func>_kernel``
    (``<func>_kernel_1``, ... for further kernels of the same function)."""
    return re.sub(r"_kernel(_\d+)?$", "", name)


def summarize(records: Iterable[tuple[str, float]], steps: int, step_us: float | None = None,
              top: int = TOP, critical: dict[str, float] | None = None) -> dict:
    """Per-function rows from ``(kernel name, device microseconds)`` records of ``steps`` steps:
    launches and microseconds per step, share of the kernels' time, largest first; the step's
    kernel time, and (given its wall time ``step_us``) the time no kernel ran. ``critical``: each
    function's :func:`critical_path` microseconds over the steps, given per step in its row."""
    launches: dict[str, int] = defaultdict(int)
    micros: dict[str, float] = defaultdict(float)
    for name, us in records:
        key = kernel_name(name)
        launches[key] += 1
        micros[key] += us
    total = sum(micros.values())
    ordered = sorted(micros, key=micros.get, reverse=True)
    rows = [{"function": f, "launches_per_step": launches[f] / steps, "us_per_step": micros[f] / steps,
             "share": micros[f] / total if total else 0.0} for f in ordered[:top]]
    rest = ordered[top:]
    if rest:
        other = sum(micros[f] for f in rest)
        rows.append({"function": f"other ({len(rest)} functions)",
                     "launches_per_step": sum(launches[f] for f in rest) / steps,
                     "us_per_step": other / steps, "share": other / total if total else 0.0})
    if critical is not None:
        for row, functions in zip(rows, [[f] for f in ordered[:top]] + [rest]):
            row["critical_us_per_step"] = sum(critical.get(f, 0.0) for f in functions) / steps
    out = {"steps": steps, "kernels_per_step": sum(launches.values()) / steps,
           "kernel_us_per_step": total / steps, "rows": rows}
    if step_us is not None:
        out["step_us"] = step_us
        out["idle_us_per_step"] = step_us - total / steps
    return out


def _in_start_order(timeline: Iterable[tuple[str, float, float]]):
    """``(name, start, end, busy_until)`` of each piece of work in the order it started, with
    the end of all work started before it (its own start for the first)."""
    busy_until = None
    for name, start, end in sorted(timeline, key=lambda r: r[1]):
        yield name, start, end, start if busy_until is None else busy_until
        busy_until = end if busy_until is None else max(busy_until, end)


def idle_before(timeline: Iterable[tuple[str, float, float]], steps: int, top: int = TOP_IDLE) -> list[dict]:
    """The GPU's idle time before each function's work, per step, largest first, from ``(name,
    start, end)`` microseconds of every kernel and copy of ``steps`` steps: a gap is the time
    from the end of all work started before to the next start (copies named as the profiler
    names them)."""
    idle: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    for name, start, _, busy_until in _in_start_order(timeline):
        if start > busy_until:
            key = kernel_name(name)
            idle[key] += start - busy_until
            launches[key] += 1
    ordered = sorted(idle, key=idle.get, reverse=True)[:top]
    return [{"function": f, "idle_us_per_step": idle[f] / steps, "gaps_per_step": launches[f] / steps} for f in ordered]


def critical_path(timeline: Iterable[tuple[str, float, float]]) -> dict[str, float]:
    """Per function, the microseconds its kernels extend the GPU's busy time, from ``(name,
    start, end)`` of every kernel and copy (copies left out of the result): each from the later
    of its start and the end of all work started before it, to its end (nothing where it ends
    first). A kernel waiting in ``griddepcontrol.wait`` overlaps its predecessor, so the wait is
    billed to the predecessor; the values sum to the time the GPU was busy."""
    extends: dict[str, float] = defaultdict(float)
    for name, start, end, busy_until in _in_start_order(timeline):
        if not name.startswith(_COPIES):
            extends[kernel_name(name)] += max(0.0, end - max(start, busy_until))
    return dict(extends)


def profile_kernels(step: Callable[[], object], steps: int = 5, step_us: float | None = None) -> dict:
    """:func:`summarize` of ``steps`` calls of ``step`` under the CUDA profiler (after one
    warm-up call outside it), with :func:`idle_before` as ``idle_before``."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    work = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    records = [(e.name, e.time_range.elapsed_us()) for e in work if not e.name.startswith(_COPIES)]
    timeline = [(e.name, e.time_range.start, e.time_range.end) for e in work]
    out = summarize(records, steps, step_us, critical=critical_path(timeline))
    out["idle_before"] = idle_before(timeline, steps)
    return out
