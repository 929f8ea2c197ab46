"""The GPU runner's watchdog (tvm_dsm.gpu.watchdog, tvm_dsm.gpu.run): a kernel that hangs or
crashes its process is reported by name, and the kernels after it still run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
import tvm
from tvm.script import tirx as T

from tvm_dsm.gpu.watchdog import DONE, START, Fault, supervise

#: A worker for supervise: announces each item given after ``--names``; an item named
#: "hang..." sleeps, "crash..." exits, "fail_outside" exits before announcing anything.
FAKE_WORKER = textwrap.dedent(f"""
    import os, sys, time
    names = sys.argv[sys.argv.index("--names") + 1:]
    if names and names[0] == "fail_outside":
        sys.exit(5)
    for name in names:
        print("{START}", name, flush=True)
        print("working on", name, flush=True)
        if name.startswith("hang"):
            time.sleep(600)
        if name.startswith("crash"):
            os._exit(3)
        print("{DONE}", name, flush=True)
""")


def _fake_worker(started: list):
    def command(names):
        started.append(list(names))
        return [sys.executable, "-c", FAKE_WORKER, "--names", *names]

    return command


def test_a_hang_is_killed_named_and_the_rest_runs():
    started, reported, echoed = [], [], []
    t0 = time.monotonic()
    faults = supervise(["a", "hang_b", "c", "d"], _fake_worker(started), timeout=2.0,
                       on_fault=reported.append, echo=echoed.append)
    assert time.monotonic() - t0 < 30
    assert [(f.name, f.kind) for f in faults] == [("hang_b", "hang")]
    assert "after 2 s" in faults[0].detail and reported == faults
    assert started == [["a", "hang_b", "c", "d"], ["c", "d"]]
    assert [line.split()[-1] for line in echoed] == ["a", "hang_b", "c", "d"]


def test_a_crash_is_named_and_the_rest_runs():
    started = []
    faults = supervise(["crash_a", "b", "crash_c", "hang_d", "e"], _fake_worker(started), timeout=2.0,
                       echo=lambda line: None)
    assert faults == [Fault("crash_a", "crash", faults[0].detail), Fault("crash_c", "crash", faults[1].detail),
                      Fault("hang_d", "hang", faults[2].detail)]
    assert "exited (3)" in faults[0].detail and "working on crash_a" in faults[0].detail
    assert started == [["crash_a", "b", "crash_c", "hang_d", "e"], ["b", "crash_c", "hang_d", "e"],
                       ["hang_d", "e"], ["e"]]


def test_a_worker_failing_outside_an_item_raises():
    with pytest.raises(RuntimeError, match="exit 5"):
        supervise(["fail_outside", "b"], _fake_worker([]), timeout=2.0, echo=lambda line: None)


def test_no_fault_no_restart():
    started = []
    assert supervise(["a", "b"], _fake_worker(started), timeout=2.0, echo=lambda line: None) == []
    assert started == [["a", "b"]]


#: One of two expected arrivals on a shared-memory mbarrier, then a wait for its phase to
#: complete: every thread of the kernel spins forever.
_WAIT_FOREVER = """
__device__ void wait_forever(float* out) {
  __shared__ __align__(8) unsigned long long barrier;
  unsigned addr = (unsigned)__cvta_generic_to_shared(&barrier);
  if (threadIdx.x == 0) asm volatile("mbarrier.init.shared::cta.b64 [%0], 2;" :: "r"(addr));
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(addr) : "memory");
  unsigned done = 0;
  while (!done) {
    asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                 : "=r"(done) : "r"(addr) : "memory");
  }
  out[blockIdx.x] = 0.0f;
}
"""


def deadlocking_row_sum(m: int, k: int) -> tvm.IRModule:
    """A kernel with a row sum's signature (``A[m, k]`` in, ``B[m]`` out) that never ends."""

    @T.prim_func
    def main(A: T.Buffer((m, k), "float32"), B: T.Buffer((m,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for row in T.thread_binding(m, thread="blockIdx.x"):
            for tx in T.thread_binding(32, thread="threadIdx.x"):
                T.evaluate(T.cuda.func_call("wait_forever", B.access_ptr("w"), source_code=_WAIT_FOREVER))

    return tvm.IRModule({"main": main})


def _deadlock_source() -> str:
    from conftest import TARGET

    return tvm.compile(deadlocking_row_sum(64, 256), target=TARGET).mod.imports[0].inspect_source()


def test_deadlocking_kernel_builds_and_assembles(assemble):
    source = _deadlock_source()
    assert "mbarrier.try_wait.parity" in source and "__global__" in source
    assemble(source, "deadlock")


def _row_sum_variant(name: str, mod: tvm.IRModule, m: int, k: int):
    from tvm_dsm.gpu.suites.base import Variant, args_of, nbytes_of
    from tvm_dsm.workloads.reductions import row_sum

    args = args_of(row_sum(m, k))
    return Variant(name=name, workload="row_sum", mod=mod, args=args, bytes=nbytes_of(args),
                   flops=2 * m * k, pipeline="default")


@pytest.mark.gpu
def test_gpu_runner_kills_a_deadlocked_kernel_and_runs_the_rest(tmp_path):
    """Three kernels through the runner's export format: a row sum, a kernel deadlocked on an
    mbarrier, another row sum. The deadlocked one gets a row naming it (a hang, killed after
    the watchdog's timeout); both row sums are checked and correct."""
    from tvm_dsm.driver import schedule
    from tvm_dsm.gpu.export import export_variants
    from tvm_dsm.workloads.reductions import row_sum

    m, k = 64, 256
    good = schedule(row_sum(m, k)).mod
    variants = [_row_sum_variant("a_row_sum", good, m, k), _row_sum_variant("b_deadlock", deadlocking_row_sum(m, k), m, k),
                _row_sum_variant("c_row_sum", good, m, k)]
    folder = export_variants("watchdog", variants, tmp_path)
    out = tmp_path / "results.json"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tvm_dsm.gpu.run", str(folder), "--out", str(out),
                           "--timeout", "30", "--check-only", "--trials", "1"],
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert time.monotonic() - t0 < 400
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["a_row_sum", "b_deadlock", "c_row_sum"]
    assert rows["a_row_sum"]["ok"] and rows["c_row_sum"]["ok"]
    assert rows["b_deadlock"]["ok"] is False and rows["b_deadlock"]["fault"] == "hang"
    assert "b_deadlock: watchdog: hang" in proc.stdout

