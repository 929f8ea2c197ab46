"""Functions users wrote, checked against float64 and timed on the GPU beside torch and TVM's
stock schedules.

``python -m tvm_dsm.gpu.user_functions bench/user_functions --out $OUT/user_functions.json``
(the whole compiler on the device: ../shared/gpu/README.md, part 2)

Each ``*.py`` of the folder is one function written the way a user writes it (TE, TOPI,
TVMScript, Relax's legalization), by someone who did not read tvm-dsm's builders. It defines
``make()`` (the PrimFunc, outputs its last parameters), ``inputs(rng)`` (numpy arrays, one per
input parameter), ``reference(*inputs)`` (numpy: the outputs, evaluated in float64 on the inputs
rounded to their parameters' types) and ``torch_impl(*inputs)`` (the same in torch: the peer).
A function over symbolic extents also defines ``SYMBOLIC = {name: [values]}``: its three
functions then take the value last, and each value is a row.

Per function, in worker processes: ``tvm_dsm.build`` (the family that plans it, or its
fallback) and TVM's stock schedule (dlight under "sm_90"), compiled as a user's call compiles
them and exported. Then one at a time on the GPU: fresh inputs, outputs poisoned (NaN; integers
their minimum), each float output's relative error against the reference (integer outputs must
match exactly), and times under CUDA-graph replay of ours, dlight, torch eager and torch.compile,
with the floor (bytes over the bandwidth measured in the same run).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np
import torch
import tvm
import tvm_ffi

from ..bench import results as res
from ..bench.timing import graph_time_us, input_sets_for
from ..bench.tolerance import tolerance
from ..workloads.user_functions import extents, load_case, param_types, shape_of
from .run import measure_hbm_bandwidth

TARGET = {"kind": "cuda", "arch": "sm_90a"}
BUILDS = ("tvm_dsm", "dlight")


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    picked = next((line for line in lines if "Error" in line), lines[0] if lines else "")
    return f"{type(err).__name__}: {picked[:300]}"


def _taken_by(func) -> str:
    """The family ``tvm_dsm.build`` plans the function with, or why none does."""
    from .. import driver
    from ..errors import ClusterError
    from ..ir import extent_variables

    if extent_variables(func):
        return "row_ranges"
    try:
        return driver.plan(func).family.name
    except ClusterError as err:
        return f"fallback ({str(err).splitlines()[0][:200]})"


def _logged(build: Callable[[], Any], info: dict):
    """``build()``, with what tvm-dsm's driver logged at INFO on the way (the forms and
    fallbacks it took: "scheduled as matrices ... by a family", "its statistics apart") in
    ``info["how"]``, one line each."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage().strip().splitlines()[0][:200])
    logger = logging.getLogger("tvm_dsm.driver")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        return build()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        info["how"] = lines


def build_case(path: str, folder: str) -> dict:
    """Worker: ``path``'s function built both ways into ``folder``, with who took it and any
    build's error."""
    import tvm_dsm  # noqa: F401  (its pipeline, TVM's default)
    from .. import driver
    from ..stock import stock_target

    path = Path(path)
    case = load_case(path)
    func = case.make()
    target = tvm.target.Target(TARGET, host="llvm")
    info = {"name": path.stem, "desc": (case.__doc__ or "").strip().splitlines()[0], "errors": {}}
    try:
        info["taken_by"] = _taken_by(func)
    except Exception as err:  # noqa: BLE001 - the planner failing is a finding, the build decides
        info["taken_by"] = f"plan raised {_first_line(err)}"
    builds = {
        "tvm_dsm": lambda: _logged(lambda: driver.build(func, target), info),
        "dlight": lambda: tvm.compile(driver.stock_schedule(func).mod, stock_target(target),
                                      tir_pipeline="s_tir_stock"),
    }
    for label, compile_ in builds.items():
        start = time.time()
        try:
            compile_().export_library(os.path.join(folder, f"{path.stem}_{label}.so"))
        except Exception as err:  # noqa: BLE001 - a build failure is a row's finding
            info["errors"][label] = _first_line(err)
        info[f"{label}_build_s"] = round(time.time() - start, 1)
    return info


def _torch_dtype(dtype: str) -> torch.dtype:
    return {"float8_e4m3fn": torch.float8_e4m3fn, "bool": torch.bool}.get(dtype) or getattr(torch, dtype)


def _poison(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    value = float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min if dtype != torch.bool else False
    return torch.full(shape, value, dtype=dtype, device="cuda")


def _as_float64(t: torch.Tensor) -> np.ndarray:
    return t.float().double().cpu().numpy() if t.dtype.is_floating_point else t.cpu().numpy()


class Point:
    """One size of a case: its inputs (on the GPU, in the parameters' types), fresh output
    buffers, and the reference on the rounded inputs."""

    def __init__(self, case: ModuleType, func, extra: tuple, rng: np.random.Generator):
        self.case, self.extra = case, extra
        buffers = param_types(func)
        arrays = case.inputs(rng, *extra)
        self.n_out = len(buffers) - len(arrays)
        values = extents(buffers, arrays)
        self.inputs = [torch.from_numpy(np.ascontiguousarray(a)).cuda().to(_torch_dtype(str(b.dtype)))
                       for a, b in zip(arrays, buffers)]
        self.out_specs = [(shape_of(b, values), _torch_dtype(str(b.dtype))) for b in buffers[len(arrays):]]
        self.dtypes = [str(b.dtype) for b in buffers]

    def outputs(self) -> list[torch.Tensor]:
        return [_poison(shape, dtype) for shape, dtype in self.out_specs]

    def reference(self) -> list[np.ndarray]:
        expected = self.case.reference(*[_as_float64(t) for t in self.inputs], *self.extra)
        return [np.asarray(e, dtype=np.float64) for e in expected]

    def nbytes(self) -> int:
        sizes = [(t.numel(), t.element_size()) for t in self.inputs]
        sizes += [(math.prod(shape), torch.empty((), dtype=dtype).element_size()) for shape, dtype in self.out_specs]
        return sum(n * size for n, size in sizes)


def error_of(outputs: list[torch.Tensor], expected: list[np.ndarray]) -> float:
    """The worst relative error over float outputs; inf where an integer output differs or an
    output's shape is not the reference's."""
    worst = 0.0
    for out, want in zip(outputs, expected):
        got = out.float().double().cpu() if out.dtype.is_floating_point else out.cpu()
        want = torch.from_numpy(want)
        if tuple(got.shape) != tuple(want.shape) and got.numel() == want.numel():
            want = want.reshape(got.shape)
        if tuple(got.shape) != tuple(want.shape):
            return math.inf
        if out.dtype.is_floating_point:
            worst = max(worst, res.relative_error(got, want))
        elif not torch.equal(got.long(), want.long()):
            return math.inf
    return worst


def _torch_steps(point: Point, sets: list[list[torch.Tensor]]) -> dict:
    torch._dynamo.reset()
    compiled = torch.compile(point.case.torch_impl)
    return {name: (lambda i, fn=fn: fn(*sets[i], *point.extra))
            for name, fn in (("torch_eager", point.case.torch_impl), ("torch_compile", compiled))}


def run_point(case: ModuleType, func, extra: tuple, folder: Path, info: dict, hbm_bw: float) -> dict:
    rng = np.random.default_rng(len(info["name"]) * 7919 + sum(extra))
    point = Point(case, func, extra, rng)
    name = info["name"] + "".join(f"_{k}{v}" for k, v in zip(getattr(case, "SYMBOLIC", {}), extra))
    row = {"name": name, "class": info["name"], "desc": info["desc"], "taken_by": info["taken_by"],
           "how": info.get("how", []),
           "dtype": point.dtypes[0], "errors": dict(info["errors"]), "peers": {}, "rel_errs": {},
           "build_s": {label: info[f"{label}_build_s"] for label in BUILDS}}
    expected = point.reference()
    bytes_ = point.nbytes()
    n_sets = input_sets_for(bytes_, cap=16)
    sets = [point.inputs] + [[t.clone() for t in point.inputs] for _ in range(n_sets - 1)]
    for label in BUILDS:
        lib = folder / f"{info['name']}_{label}.so"
        if not lib.exists():
            continue
        if info.get(OURS_ALONE) and label != "tvm_dsm":
            row["errors"][label] = "not timed: the process timing it beside tvm-dsm's module died"
            continue
        try:
            kernel = tvm.runtime.load_module(str(lib))["main"]
            outs = point.outputs()
            kernel(*[tvm_ffi.from_dlpack(t) for t in point.inputs + outs])
            torch.cuda.synchronize()
            row["rel_errs"][label] = error_of(outs, expected)
            out_sets = [point.outputs() for _ in sets]
            wrapped = [[tvm_ffi.from_dlpack(t) for t in s + o] for s, o in zip(sets, out_sets)]
            us = graph_time_us(lambda i: kernel(*wrapped[i]), len(sets))
        except Exception as err:  # noqa: BLE001 - a kernel that fails to load or run is a row's finding
            row["errors"][label] = _first_line(err)
            continue
        if label == "tvm_dsm":
            row["ours_us"] = us
        else:
            row["peers"][label] = us
    try:
        got = point.case.torch_impl(*point.inputs, *point.extra)
        got = [got] if isinstance(got, torch.Tensor) else got
        row["rel_errs"]["torch_eager"] = error_of([g.contiguous() for g in got], expected)
        for peer, step in _torch_steps(point, sets).items():
            row["peers"][peer] = graph_time_us(step, len(sets))
    except Exception as err:  # noqa: BLE001 - a torch form that does not run on these types
        row["errors"]["torch"] = _first_line(err)
    row["rel_err"] = row["rel_errs"].get("tvm_dsm", math.inf)
    try:
        bound = tolerance(point.dtypes)
    except ValueError:  # integer-only functions: exact
        bound = 0.0
    # A function that rounds between its operations (a bf16 intermediate) is held to torch's
    # error on the same types where that is larger than its dtypes' bound.
    torch_err = row["rel_errs"].get("torch_eager", 0.0)
    row["ok"] = math.isfinite(row["rel_err"]) and row["rel_err"] <= max(
        bound, 1.1 * torch_err if math.isfinite(torch_err) else 0.0)
    row["floor_us"] = bytes_ / hbm_bw * 1e6
    return row


def _time_cases(cases: list[tuple[str, dict]], libs: Path, out: Path, progress: Path) -> None:
    """Child process: each of ``cases`` (path, build info) timed at each of its points, every row
    added to ``out`` (read first where a crashed child left rows there) as it is done; ``progress``
    names the function running (:data:`RUNNING`), then the one finished (:data:`DONE`)."""
    hbm_bw = measure_hbm_bandwidth()
    if out.exists():
        results = json.loads(out.read_text())
    else:
        results = res.new_suite("user_functions", torch.cuda.get_device_name(0),
                                {"tvm": tvm.__version__, "torch": torch.__version__, "tvm_dsm": res.git_sha(),
                                 "hbm_copy_bytes_per_s": hbm_bw}, res.GRAPH_TIMING)
        results["command"] = f"python -m tvm_dsm.gpu.user_functions {Path(cases[0][0]).parent}"
        res.write(results, out)  # the header, for the parent should this process die
    import tvm_dsm  # noqa: F401  (its CUDA compile path, as a user's process has it)
    for path, info in cases:
        progress.write_text(RUNNING + path)
        case = load_case(Path(path))
        func = case.make()
        for extra in list(zip(*case.SYMBOLIC.values())) if hasattr(case, "SYMBOLIC") else [()]:
            try:
                row = run_point(case, func, extra, libs, info, hbm_bw)
            except Exception as err:  # noqa: BLE001 - the harness failing on a case is reported, not fatal
                row = _failed_row(info, "harness", _first_line(err))
            results["rows"].append(row)
            res.write(results, out)
            peers = " ".join(f"{k} {v:.1f}" for k, v in row.get("peers", {}).items())
            print(f"{row['name']}: ok={row['ok']} err={row['rel_err']:.1e} by={row['taken_by'][:40]} "
                  f"ours={row.get('ours_us', math.nan):.1f} {peers} {row['errors'] or ''}", flush=True)
        progress.write_text(DONE + path)


#: What the timing child's progress file says: the function it runs, or the last it finished.
RUNNING, DONE = "running ", "done "
#: A build info's key: time tvm-dsm's module alone (the TVM peer's module may have crashed the
#: process that timed both).
OURS_ALONE = "ours_alone"


def _failed_row(info: dict, where: str, error: str) -> dict:
    return {"name": info["name"], "ok": False, "rel_err": math.inf, "taken_by": info["taken_by"],
            "errors": {**info["errors"], where: error}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="name prefixes of the functions to run")
    parser.add_argument("--libs", type=Path, default=Path("/tmp/tvm_dsm_user_functions"))
    parser.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    args = parser.parse_args(argv)
    paths = sorted(p for p in args.folder.glob("*.py") if not args.only or p.stem.startswith(tuple(args.only)))
    args.libs.mkdir(parents=True, exist_ok=True)
    # spawned, not forked: the workers start without this process's TVM and torch state
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        infos = list(pool.map(build_case, [str(p) for p in paths], [str(args.libs)] * len(paths)))
    print(f"built {len(infos)} functions", flush=True)
    time_in_children([(str(p), info) for p, info in zip(paths, infos)], args.libs, args.out)


def time_in_children(cases: list[tuple[str, dict]], libs: Path, out: Path,
                     time_cases: Callable[[list, Path, Path, Path], None] = _time_cases) -> None:
    """``time_cases`` of ``cases`` in a child process; where a module crashes it (a segfault in
    TVM's host code) a new child times that function with tvm-dsm's module alone
    (:data:`OURS_ALONE`; dlight's module of MLC's batched decode GEMV segfaulted on torch's
    tensors), then, should that die too, its row says so, and the functions after it.
    The child's progress file names the function it is timing (:data:`RUNNING`) or the last it
    finished (:data:`DONE`: a crash between functions, or on exit, costs no row)."""
    spawn = multiprocessing.get_context("spawn")
    progress = libs / "timing_progress"
    out.unlink(missing_ok=True)
    while cases:
        progress.unlink(missing_ok=True)
        child = spawn.Process(target=time_cases, args=(cases, libs, out, progress))
        child.start()
        child.join()
        if child.exitcode == 0:
            return
        if not progress.exists():
            raise RuntimeError(f"the timing process died (exit code {child.exitcode}) before its first function")
        state = progress.read_text()
        last = next(n for n, (path, _) in enumerate(cases) if state in (RUNNING + path, DONE + path))
        if state.startswith(RUNNING):  # it died timing this function: once more with tvm-dsm's module alone
            info = cases[last][1]
            if not info.get(OURS_ALONE):
                print(f"{info['name']}: the timing process died (exit code {child.exitcode}); "
                      "once more without the other TVM module", flush=True)
                cases = [(cases[last][0], {**info, OURS_ALONE: True}), *cases[last + 1:]]
                continue
            results = json.loads(out.read_text())
            results["rows"].append(_failed_row(info, "harness", f"the timing process died (exit code {child.exitcode})"))
            res.write(results, out)
            print(f"{info['name']}: the timing process died (exit code {child.exitcode})", flush=True)
        cases = cases[last + 1:]


if __name__ == "__main__":
    main()
