"""Check and time exported kernels on the GPU machine (runtime-only TVM + torch).

``python -m tvm_dsm.gpu.run .gpu/kernels/SUITE --out bench/results/SUITE/latest.json`` (a partial or A/B run: ``--out bench/results/archive/NAME.json``)

For every kernel of the manifest: fresh random inputs, outputs poisoned with NaN, relative error
against a float64 reference, then GPU time under CUDA-graph replay for tvm-dsm, torch eager and
torch.compile, and the floor (bytes over the HBM bandwidth measured in the same run). The kernels
run in a worker process under a watchdog per kernel (:mod:`tvm_dsm.gpu.watchdog`): a kernel
that hangs (e.g. a cluster barrier deadlock) past ``--timeout`` or crashes its process gets a row
naming it (``"fault": "hang"`` or ``"crash"``, ``ok`` false), and a new worker runs the rest.
"""

from __future__ import annotations

import argparse
import itertools
import math
import json
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import tvm
import tvm_ffi

from ..bench import results as res
from ..bench.tolerance import tolerance
from ..bench.timing import graph_time_us, input_sets_for, python_call_us
from ..hardware import check_planned_for
from .references import REFERENCES
from .watchdog import DONE, START, Fault, announce, python_worker, supervise


def measure_hbm_bandwidth(copies: int = 8) -> float:
    """Device-to-device copy of 1 GiB: bytes read + written per second. ``copies`` back to back
    between the events, so the launch latency is hidden behind the previous copy (not in a CUDA
    graph: captured, the copy becomes a memcpy node, measured at 2.44 against 2.99 TB/s)."""
    n = 1 << 28
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(copies):
            dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / copies)
    return 2 * n * 4 / sorted(times)[len(times) // 2]


def _random_inputs(args: list[dict], n_sets: int) -> list[list[torch.Tensor]]:
    sets = []
    for _ in range(n_sets):
        tensors = []
        for a in args:
            dtype = getattr(torch, a["dtype"])
            if a["output"]:  # poisoned: NaN, or the most negative integer (never an index)
                poison = torch.iinfo(dtype).min if not dtype.is_floating_point else float("nan")
                tensors.append(torch.full(a["shape"], poison, dtype=dtype, device="cuda"))
            elif a.get("positive"):  # scales: uniform in [0.5, 1.5)
                tensors.append((torch.rand(a["shape"], device="cuda") + 0.5).to(dtype))
            else:
                # "scale" (a weight's 1/sqrt(fan_in)) keeps deep chains inside fp16's range.
                tensors.append((torch.randn(a["shape"], device="cuda") * a.get("scale", 1.0)).to(dtype))
        sets.append(tensors)
    return sets


def _split(kernel: dict, tensors: list) -> tuple[list, list]:
    """(inputs, outputs) by the manifest's output flags."""
    flags = [a["output"] for a in kernel["args"]]
    return [t for t, o in zip(tensors, flags) if not o], [t for t, o in zip(tensors, flags) if o]


def _check(func, kernel: dict, trials: int = 2) -> tuple[float, float]:
    """Worst relative error and smallest fraction of output elements written over fresh trials."""
    ref = REFERENCES[kernel["workload"]]
    kwargs = kernel.get("reference_kwargs", {})
    worst, written = 0.0, 1.0
    for _ in range(trials):
        tensors = _random_inputs(kernel["args"], 1)[0]  # outputs poisoned with NaN
        inputs, outputs = _split(kernel, tensors)
        func(*[tvm_ffi.from_dlpack(t) for t in tensors])
        torch.cuda.synchronize()
        expected = ref.float64(*inputs, **kwargs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        for out, want in zip(outputs, expected):
            if out.dtype.is_floating_point:
                worst = max(worst, res.relative_error(out, want))
                # counted exactly: a float mean of ones is 1 - 2^-24 for some sizes
                written = min(written, torch.isfinite(out.float()).sum().item() / out.numel())
            elif not torch.equal(out, want.to(out.dtype)):  # indices: exact or wrong
                worst = float("inf")
    return worst, written


def peer_steps(kernel: dict, sets: list[list[torch.Tensor]], peers: list[str]) -> dict:
    """Each peer's call on input set ``i`` (``step(i)``): torch eager, and those of
    ``peers`` among torch.compile and SDPA, with the kernel's reference arguments."""
    kwargs = kernel.get("reference_kwargs", {})
    reference = REFERENCES[kernel["workload"]]

    def eager(*inputs):
        return reference.torch_eager(*inputs, **kwargs)

    contenders = {"torch_eager": eager}
    if "torch_compile" in peers:
        # A fresh dynamo state per kernel: otherwise the shared ``eager`` code object reaches
        # dynamo's recompile limit after a few shapes (silently running eager from then on),
        # and the second shape is already compiled with symbolic sizes.
        torch._dynamo.reset()
        contenders["torch_compile"] = torch.compile(eager)
    if "torch_sdpa" in peers:
        contenders["torch_sdpa"] = lambda *inputs: reference.torch_sdpa(*inputs, **kwargs)
    inputs = [_split(kernel, s)[0] for s in sets]
    return {name: (lambda i, fn=fn: fn(*inputs[i])) for name, fn in contenders.items()}


def _time_peers(kernel: dict, sets: list[list[torch.Tensor]]) -> dict[str, float]:
    steps = peer_steps(kernel, sets, kernel.get("peers", ["torch_compile"]))
    return {name: graph_time_us(step, len(sets)) for name, step in steps.items()}


def bit_identical(func, kernel: dict, runs: int = 10) -> bool:
    """Whether ``runs`` calls of ``func`` on one set of fresh inputs give bit-identical outputs
    (no order of arrival, atomic or race shows in the result)."""
    tensors = _random_inputs(kernel["args"], 1)[0]
    outputs = _split(kernel, tensors)[1]
    wrapped = [tvm_ffi.from_dlpack(t) for t in tensors]
    first = None
    for _ in range(runs):
        for out in outputs:
            out.fill_(float("nan") if out.dtype.is_floating_point else torch.iinfo(out.dtype).min)
        func(*wrapped)
        torch.cuda.synchronize()
        got = [out.clone() for out in outputs]
        first = first or got
        if not all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(first, got)):
            return False
    return True


def verdict(func, kernel: dict, trials: int = 2) -> dict:
    """Whether ``func`` is correct on fresh inputs (``ok``: within its dtypes' tolerance of
    float64, :mod:`tvm_dsm.bench.tolerance`; every output element written), and whether repeated
    calls give bit-identical outputs (``bit_identical``, reported apart from ``ok``)."""
    rel_err, written = _check(func, kernel, trials)
    dtype = next(a["dtype"] for a in kernel["args"] if not a["output"])
    bound = tolerance(a["dtype"] for a in kernel["args"])
    return {"dtype": dtype, "ok": rel_err < bound and written == 1.0,
            "rel_err": rel_err, "written_fraction": written, "bit_identical": bit_identical(func, kernel)}


def time_call(func, kernel: dict) -> tuple[float, list[list[torch.Tensor]], list[list]]:
    """GPU time of ``func`` under CUDA-graph replay over input sets rotated past L2, with the
    sets (torch tensors, and as tvm-ffi arrays) for the peers and the Python-call timing."""
    sets = _random_inputs(kernel["args"], input_sets_for(kernel["bytes"]))
    wrapped = [[tvm_ffi.from_dlpack(t) for t in s] for s in sets]
    return graph_time_us(lambda i: func(*wrapped[i]), len(sets)), sets, wrapped


def run_kernel(folder: Path, kernel: dict, peer_cache: dict, hbm_bw: float, trials: int = 2,
               check_only: bool = False) -> dict:
    func = tvm.runtime.load_module(str(folder / kernel["lib"]))["main"]
    checked = verdict(func, kernel, trials)
    if check_only:
        return {"name": kernel["name"], "ok": checked["ok"], "rel_err": checked["rel_err"],
                "written_fraction": checked["written_fraction"], "trials": trials}
    ours, sets, wrapped = time_call(func, kernel)
    key = (kernel["workload"], json.dumps(kernel["args"]), json.dumps(kernel.get("reference_kwargs", {})))
    if key not in peer_cache:
        peer_cache[key] = _time_peers(kernel, sets)
    return {
        "name": kernel["name"],
        "shape": [a["shape"] for a in kernel["args"]],
        "dtype": checked["dtype"],
        "ok": checked["ok"],
        "expected_ok": kernel["expect_correct"],
        "rel_err": checked["rel_err"],
        "written_fraction": checked["written_fraction"],
        "bit_identical": checked["bit_identical"],
        "ours_us": ours,
        "peers": peer_cache[key],
        "floor_us": kernel["bytes"] / hbm_bw * 1e6,
        "flops": kernel["flops"],
        "python_call_us": python_call_us(lambda: func(*wrapped[0])),
        "plan": kernel["plan"],
        "pipeline": kernel["pipeline"],
        **kernel.get("extra", {}),
    }


def precompile(folder: Path, names: list[str]) -> None:
    """Compile the kernels' CUDA (exported beside each library) on every core into tvm-dsm's
    cubin cache, and load through tvm-dsm's compile callback, which reads it
    (:mod:`tvm_dsm.compile_cache`: the cubin a user's process gets): loading one by one would
    spend a second of nvcc per kernel."""
    from ..compile_cache import compiled, register

    sources = [p.read_text() for n in names if (p := folder / f"{n}.cu").exists()]

    def warm(code: str) -> None:
        try:
            compiled(code)
        except Exception:  # noqa: BLE001  (compiled again, raising, when loaded: that kernel's row records the error)
            pass

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(warm, sources))
    register()


def _cuda_version() -> str:
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
        return out.strip().splitlines()[-1]
    except OSError:
        return "unknown"


def fault_row(fault: Fault) -> dict:
    """The result row of a kernel the watchdog reports: not ok, no result."""
    return {"name": fault.name, "ok": False, "rel_err": math.inf, "fault": fault.kind, "error": fault.detail}


def run_worker(args, kernels: list[dict], manifest: dict) -> None:
    """Check (and time) ``kernels`` in this process, announcing each to the watchdog; rows go
    to ``args.out`` after each kernel, after those already there with ``--resume``."""
    precompile(args.folder, [k["name"] for k in kernels])
    hbm_bw = measure_hbm_bandwidth()
    if args.resume:
        results = json.loads(args.out.read_text())
    else:
        versions = {
            "tvm": manifest["tvm"],
            "tvm_dsm": manifest["tvm_dsm"],
            "planned_for": manifest.get("planned_for"),
            "torch": torch.__version__,
            "cuda": _cuda_version(),
            "hbm_copy_bytes_per_s": hbm_bw,
        }
        results = res.new_suite(
            manifest["suite"],
            torch.cuda.get_device_name(),
            versions,
            res.GRAPH_TIMING,
        )
        res.write(results, args.out)  # the header, before any kernel can hang
    peer_cache: dict = {}
    for kernel in kernels:
        announce(START, kernel["name"])
        try:
            row = run_kernel(args.folder, kernel, peer_cache, hbm_bw, args.trials, args.check_only)
        except Exception as err:  # noqa: BLE001  (a kernel that fails to compile or load: its row says why)
            row = {"name": kernel["name"], "ok": False, "rel_err": math.inf, "written_fraction": None,
                   "error": f"{type(err).__name__}: {str(err).strip()[-2000:]}"}
        results["rows"].append(row)
        res.write(results, args.out)
        print(f"{row['name']}: ok={row['ok']} err={row['rel_err']:.1e} written={row['written_fraction']}", flush=True)
        announce(DONE, kernel["name"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="kernel name prefixes to run (default: all)")
    parser.add_argument("--timeout", type=float, default=120.0, help="watchdog per kernel, s")
    parser.add_argument("--trials", type=int, default=2, help="fresh random inputs per check")
    parser.add_argument("--check-only", action="store_true", help="no timing (e.g. under compute-sanitizer)")
    parser.add_argument("--names", nargs="*", help="(internal) the worker: run exactly these kernels")
    parser.add_argument("--resume", action="store_true", help="(internal) the worker: add to --out's rows")
    args = parser.parse_args(argv)
    manifest = json.loads((args.folder / "manifest.json").read_text())
    check_planned_for(manifest, torch.cuda.get_device_name())
    if args.names is not None:
        run_worker(args, [k for k in manifest["kernels"] if k["name"] in args.names], manifest)
        return
    names = [k["name"] for k in manifest["kernels"] if not args.only or k["name"].startswith(tuple(args.only))]
    options = [str(args.folder), "--out", str(args.out), "--trials", str(args.trials),
               *(["--check-only"] if args.check_only else [])]
    # the first worker writes the results header, each later one adds to its rows
    workers = itertools.chain([python_worker("tvm_dsm.gpu.run", *options)],
                              itertools.repeat(python_worker("tvm_dsm.gpu.run", *options, "--resume")))

    def record(fault: Fault) -> None:
        results = json.loads(args.out.read_text())
        results["rows"].append(fault_row(fault))
        res.write(results, args.out)
        print(f"{fault.name}: watchdog: {fault.kind}: {fault.detail}", flush=True)

    supervise(names, lambda remaining: next(workers)(remaining), args.timeout, record)
    if not args.check_only:
        print(res.table(json.loads(args.out.read_text())))


if __name__ == "__main__":
    main()
