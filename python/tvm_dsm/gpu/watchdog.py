"""Run named items in a worker process under a watchdog per item; a hang or crash costs one item.

A kernel that deadlocks (a cluster barrier or mbarrier that never completes) cannot be stopped
from inside its process: the launch or the synchronization after it never returns, and the CUDA
context is lost with it. So the GPU runner (:mod:`tvm_dsm.gpu.run`) runs its kernels in a
worker process that announces each kernel on its standard output (``START name`` before,
``DONE name`` after); :func:`supervise` starts the worker on the remaining names, kills its
process group when one kernel has run longer than the timeout, reports that kernel (``hang``)
and starts a new worker on the kernels after it. A worker that exits during a kernel (a crash)
is reported the same way (``crash``). Torch-free, so the supervision runs anywhere.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

START = "WATCHDOG_START"
DONE = "WATCHDOG_DONE"


def announce(marker: str, name: str) -> None:
    """In the worker: tell the supervisor that item ``name`` starts (START) or is done (DONE)."""
    print(f"{marker} {name}", flush=True)


@dataclass(frozen=True)
class Fault:
    """An item the worker did not finish: ``kind`` is "hang" (killed after the timeout) or
    "crash" (the worker exited during it); ``detail`` says how."""

    name: str
    kind: str
    detail: str


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)  # end of output


def supervise(names: list[str], worker: Callable[[list[str]], list[str]], timeout: float,
              on_fault: Callable[[Fault], None] = lambda fault: None,
              echo: Callable[[str], None] = lambda line: print(line, end="", flush=True)) -> list[Fault]:
    """Run ``worker(remaining)`` (a command line) until every one of ``names`` is done or has
    failed; each item may run ``timeout`` seconds. Each fault is handed to ``on_fault`` as it
    happens and returned; the worker's other output goes to ``echo``. A worker that fails
    outside an item (before the first or between two) raises RuntimeError."""
    remaining, faults = list(names), []
    while remaining:
        proc = subprocess.Popen(worker(remaining), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
        current, started, tail = None, 0.0, []
        while True:
            wait = None if current is None else max(0.0, started + timeout - time.monotonic())
            try:
                line = lines.get(timeout=wait)
            except queue.Empty:  # the current item ran past its time
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                fault = Fault(current, "hang", f"no result after {timeout:g} s; the worker was killed")
                break
            if line is None:  # the worker exited
                rc = proc.wait()
                if current is None:
                    if rc != 0:
                        raise RuntimeError(f"the worker failed (exit {rc}) outside a kernel:\n{''.join(tail)}")
                    return faults
                fault = Fault(current, "crash", f"the worker exited ({rc}) during it: {''.join(tail[-6:])}".strip())
                break
            marker, _, name = line.strip().partition(" ")
            if marker == START:
                current, started, tail = name, time.monotonic(), []
            elif marker == DONE:
                remaining.remove(name)
                current = None
            else:
                tail = (tail + [line])[-20:]
                echo(line)
        faults.append(fault)
        on_fault(fault)
        remaining = remaining[remaining.index(fault.name) + 1:]
    return faults


def python_worker(module: str, *args: str) -> Callable[[list[str]], list[str]]:
    """A ``worker`` for :func:`supervise`: ``python -m module *args --names NAME...``."""
    return lambda names: [sys.executable, "-m", module, *args, "--names", *names]
