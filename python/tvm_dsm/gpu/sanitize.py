"""compute-sanitizer over exported kernels: memcheck, racecheck, synccheck and initcheck.

``python -m tvm_dsm.gpu.sanitize FOLDER --out sanitizer.json [--tools ...] [--only NAME ...] [--sample N]``
(on the GPU machine; FOLDER from ``python -m tvm_dsm.gpu.picks sanitizer`` or
:mod:`tvm_dsm.gpu.export`). The kernels' CUDA (exported beside each library) is compiled once up
front with :mod:`tvm_dsm.compile_options`; then each kernel x tool runs in its own process,
``timeout T compute-sanitizer --tool TOOL python -m tvm_dsm.gpu.sanitize --one ...``, which loads
the module, fills the inputs with random values (outputs poisoned) and calls the kernel twice: no
timing, no CUDA graph, no torch. Per kernel x tool: the errors the sanitizer counts, its first
report, seconds, and ``ok`` (no errors, the driver reached its end, nothing timed out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
#: Seconds per sanitizer run (racecheck instruments every shared-memory access: slowest).
TIMEOUTS = {"memcheck": 120, "racecheck": 240, "synccheck": 120, "initcheck": 120}
DONE = "SANITIZE_DRIVER_DONE"


def run_one(folder: Path, name: str, binary: Path, calls: int = 2) -> None:
    """Inside the sanitizer: load ``name`` with ``binary`` as its compiled code, call it."""
    import numpy as np
    import tvm
    import tvm_ffi

    data = binary.read_bytes()

    @tvm_ffi.register_global_func("tvm_callback_cuda_compile", override=True)
    def _serve(code, *_):
        return bytearray(data)

    manifest = json.loads((folder / "manifest.json").read_text())
    kernel = next(k for k in manifest["kernels"] if k["name"] == name)
    func = tvm.runtime.load_module(str(folder / kernel["lib"]))["main"]
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    tensors = []
    for a in kernel["args"]:
        dtype = a["dtype"]
        if a["output"]:
            value = np.iinfo(dtype).min if dtype.startswith(("int", "uint")) else np.nan
            host = np.full(a["shape"], value, dtype=dtype)
        elif a.get("positive"):
            host = (rng.random(a["shape"], dtype=np.float32) + 0.5).astype(dtype)
        elif dtype.startswith(("int", "uint")):
            host = rng.integers(0, 4, a["shape"]).astype(dtype)
        else:
            host = (rng.standard_normal(a["shape"], dtype=np.float32) * a.get("scale", 1.0)).astype(dtype)
        tensors.append(tvm.runtime.tensor(host, dev))
    for _ in range(calls):
        func(*tensors)
    dev.sync()
    outputs = [t.numpy() for t, a in zip(tensors, kernel["args"]) if a["output"]]
    unwritten = sum(int(np.isnan(o).sum()) for o in outputs if o.dtype.kind == "f")
    print(f"{DONE} {name} unwritten_outputs={unwritten}", flush=True)


_SUMMARY = re.compile(r"(?:ERROR SUMMARY: (\d+) error)|(?:RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\))")


def parse(output: str) -> tuple[int | None, str | None]:
    """(errors the summary counts, first reported problem) of a compute-sanitizer run."""
    errors = None
    for m in _SUMMARY.finditer(output):
        errors = int(m.group(1) if m.group(1) is not None else m.group(2))
    first = None
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("========= "):
            continue
        text = line[len("========= "):]
        if text and not text[0].isspace() and "COMPUTE-SANITIZER" not in text and "SUMMARY" not in text:
            first = " | ".join(t[len("========= "):].strip() for t in lines[i:i + 4]
                               if t.startswith("========= ") and t[len("========= "):].strip())[:600]
            break
    return errors, first


def sanitize_one(folder: Path, name: str, binary: Path, tool: str, timeout: int) -> dict:
    cmd = ["timeout", str(timeout), "compute-sanitizer", "--tool", tool, "--print-limit", "20",
           sys.executable, "-m", "tvm_dsm.gpu.sanitize", "--one", str(folder), name, "--binary", str(binary)]
    if tool == "racecheck":
        cmd[5:5] = ["--racecheck-report", "all"]
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = round(time.time() - t0, 1)
    output = proc.stdout + proc.stderr
    errors, first = parse(output)
    reached = DONE in output
    timed_out = proc.returncode == 124
    unwritten = re.search(r"unwritten_outputs=(\d+)", output)
    if not reached and first is None:
        first = " | ".join(output.strip().splitlines()[-6:])[-600:]
    return {"kernel": name, "tool": tool, "errors": errors, "first_error": first, "seconds": seconds,
            "rc": proc.returncode, "timed_out": timed_out, "driver_finished": reached,
            "unwritten_outputs": int(unwritten.group(1)) if unwritten else None,
            "ok": bool(reached and errors == 0 and not timed_out)}


def stratified_sample(kernels: list[dict], count: int, seed: int = 0) -> list[dict]:
    """``count`` kernels spread evenly over the manifest's op classes (``extra.class``), seeded:
    a sanitizer sample of a generated suite covers every class, not only the first ones."""
    import random

    by_class: dict[str, list[dict]] = {}
    for k in kernels:
        by_class.setdefault(str(k.get("extra", {}).get("class")), []).append(k)
    rng = random.Random(seed)
    for members in by_class.values():
        rng.shuffle(members)
    picked: list[dict] = []
    while len(picked) < min(count, len(kernels)):
        for members in by_class.values():
            if members and len(picked) < count:
                picked.append(members.pop())
    return sorted(picked, key=lambda k: k["name"])


def compile_all(folder: Path, names: list[str], cache: Path) -> dict[str, Path]:
    """Each kernel's cubin by :mod:`tvm_dsm.compile_options` (nvcc if present), by name."""
    from ..compile_options import compile_cuda

    cache.mkdir(parents=True, exist_ok=True)

    def build(name):
        code = (folder / f"{name}.cu").read_text()
        path = cache / f"{hashlib.sha1(code.encode()).hexdigest()[:16]}.cubin"
        if not path.exists():
            path.write_bytes(compile_cuda(code))
        return name, path

    with ThreadPoolExecutor(os.cpu_count()) as pool:
        return dict(pool.map(build, names))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("name", nargs="?")
    parser.add_argument("--one", action="store_true", help="(internal) the driver the sanitizer runs")
    parser.add_argument("--binary", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tools", nargs="*", default=list(TOOLS))
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--sample", type=int, help="sanitize this many kernels, spread over classes")
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--deadline", type=float, default=480.0, help="start no run after this, s")
    parser.add_argument("--timeout-scale", type=float, default=1.0)
    args = parser.parse_args()
    if args.one:
        run_one(args.folder, args.name, args.binary)
        return
    start = time.time()
    manifest = json.loads((args.folder / "manifest.json").read_text())
    kernels = [k for k in manifest["kernels"] if not args.only or any(o in k["name"] for o in args.only)]
    if args.sample:
        kernels = stratified_sample(kernels, args.sample)
    cubins = compile_all(args.folder, [k["name"] for k in kernels], Path(tempfile.gettempdir()) / "tvm_dsm_sanitize")
    family = {k["name"]: k.get("extra", {}).get("family") for k in kernels}
    jobs = [(k["name"], tool) for tool in sorted(args.tools, key=lambda t: t != "racecheck") for k in kernels]
    results = {"suite": "sanitizer", "tvm_dsm": manifest.get("tvm_dsm"), "rows": []}

    def work(job):
        name, tool = job
        if time.time() - start > args.deadline:
            return {"kernel": name, "tool": tool, "errors": None, "first_error": "not run: deadline",
                    "seconds": 0.0, "ok": False, "skipped": True}
        return sanitize_one(args.folder, name, cubins[name], tool, int(TIMEOUTS[tool] * args.timeout_scale))

    with ThreadPoolExecutor(args.jobs) as pool:
        for row in pool.map(work, jobs):
            row["family"] = family[row["kernel"]]
            results["rows"].append(row)
            print(f"{row['kernel'][:50]:50s} {row['tool']:9s} errors={row['errors']} ok={row['ok']} "
                  f"{row['seconds']}s {(row['first_error'] or '')[:120]}", flush=True)
            if args.out:
                args.out.write_text(json.dumps(results, indent=1))
    results["seconds"] = round(time.time() - start, 1)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
