"""Fit a GPU's GEMM constants (:mod:`tvm_dsm.calibration`) to measured configuration pools, so
that the split-K GEMM planner's first plan is the fastest measured.

``python -m tvm_dsm.bench.calibrate --gpu h200_sxm POOLS... --out FILE`` reads pools measured
on that GPU -- ``python -m tvm_dsm.bench.search_quality measure`` outputs (every candidate of a
workload built and timed) and GPU suite runs of several configurations of one dense layer
(``dense_candidates``; a model's decode GEMMs under two plans, ``batch`` the rows they were
called with), each run's candidates of a workload one pool, as its times compare; with
``--across RUNS``, runs of one suite that each hold one plan of a layer (``real_shapes`` under
several plannings), each layer's plans over the runs one pool --
keeps the split-K GEMM workloads (dense and gated layers) timed as they run in a model --
from HBM: a run whose inputs were rotated past L2, or a layer whose operands outgrow it
(MetaSchedule's runner repeats a kernel on the same buffers, so a small layer's weights come
from a warm L2 there, where fewer pipeline stages pay: on the H200, the 1B Llama's down
projection planned from such pools ran 18% slower in the model) -- and
searches the ``gemm.*`` constants of :data:`FITTED` one at a time over :data:`MULTIPLIERS` of
their current value, keeping a change where it lowers the *pick share*: over the workloads, the
geometric mean of the measured time of the plan the model ranks first among the measured ones
over the fastest measured. It writes that share per pool before and after the fit, also held
out (each workload's pick by the constants fitted on the others), into ``FILE``; with
``--write``, the fitted constants into ``data/<gpu>_calibration.json`` (each changed one's
source saying so) -- where the held-out share says the fit carries to other shapes.

With ``--measured-plans`` it fits nothing and writes the pools instead as the measurements
:func:`~tvm_dsm.learned_ranking.rerank` re-orders that GPU's first plans by
(``data/measured_plans_<gpu>.json``): where the constants fitted to few pools would move the
picks of shapes they do not hold.

What it cannot see: a pool holds the configurations the model of its day ranked first (its top
100 or fewer), so a refit model is judged on its order among them; a configuration it now ranks
first outside the pool was not measured (the GPU suites measure the picks themselves).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..calibration import DATA
from ..families.split_k_gemm import SplitKGemm
from ..families.configs import config_from, examples
from ..hardware import Hardware, load_hardware, refitted
from ..learned_ranking import FEATURE_NAMES, plan_features
from ..planners.split_k_gemm import plan_split_k_gemm, predict, ranked
from ..rules.split_k_gemm import SplitKGemmConfig
from ..workloads.dense import dense
from .results import L2_ROTATED, git_sha, new_suite, write
from .search_quality import WORKLOADS

#: The constants of the GEMM model refit, in the order searched.
FITTED = ("gemm.step_s", "gemm.tma_loaded_latency_s", "gemm.bytes_in_flight_per_sm", "gemm.sm_pull_cap", "gemm.sm_headroom",
          "gemm.launch_s", "gemm.cp_async_loaded_latency_s", "gemm.tile_l2_speedup",
          "gemm.dsm_reduce_efficiency", "gemm.mma_sync_exposed")
#: Values tried for a constant, as multiples of its current value.
MULTIPLIERS = (0.25, 0.5, 0.7, 0.85, 1.0, 1.2, 1.5, 2.0, 3.0, 4.0)
#: Passes over FITTED.
PASSES = 2
#: A change is kept where it lowers the pick share by more than this (ties keep the value).
MIN_GAIN = 1e-4


@dataclass(frozen=True)
class Pool:
    """One workload's configurations as measured: its shape, (configuration, microseconds), and
    the file name of the run that measured them (of the runs, joined by ``+``, for a pool over
    several: :func:`pools`' ``across``)."""

    workload: str
    shape: object
    measured: tuple
    source: str = ""


_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(SplitKGemmConfig))


def _measured(run: dict) -> Iterator[tuple[str, Callable, dict, float]]:
    """A run's split-K GEMM measurements: (workload, its function, configuration fields, us)."""
    for r in run["rows"]:
        if not (r.get("ok") and r.get("ours_us")):
            continue
        if r.get("family") == "split_k_gemm" and r["workload"] in WORKLOADS:  # a search_quality pool
            yield r["workload"], WORKLOADS[r["workload"]], r["config"], r["ours_us"]
        elif r["name"].startswith("dense_") and all(f in r.get("plan", {}) for f in _CONFIG_FIELDS):  # a GPU suite row
            batch = f"_b{r['batch']}" if "batch" in r else ""  # a model's kernel called with fewer rows
            dtype = r.get("dtype", "float16")
            yield (f"dense_{r['n']}x{r['k']}_m{r['m']}{batch}" + ("" if dtype == "float16" else f"_{dtype}"),
                   functools.partial(dense, r["m"], r["n"], r["k"], dtype=dtype),
                   {f: r["plan"][f] for f in _CONFIG_FIELDS}, r["ours_us"])


def from_hbm(run: dict, shape, hw: Hardware) -> bool:
    """Whether ``run`` timed ``shape``'s kernels reading their operands from HBM: its inputs
    rotated past L2 between calls, or the operands more than twice the L2."""
    operands = (shape.m * shape.k + shape.products * shape.n * shape.k + shape.m * shape.n) * 2
    return L2_ROTATED in run.get("timing", "") or operands > 2 * hw.l2_bytes


def pools(paths: Iterable[Path], hw: Hardware, across: Iterable[Path] = ()) -> list[Pool]:
    """The split-K GEMM pools measured on ``hw``'s GPU: each file's (``paths``) measurements of a
    workload, and each workload's measurements over all the files ``across`` (runs of one suite
    and timing, each with one plan of a layer: the plans of several plannings compared), where a
    pool holds two or more configurations read from HBM (:func:`from_hbm`). A configuration
    measured in several runs counts with its mean time; an ``across`` pool's source names the
    runs that measured it."""
    pooled = {Path(p): True for p in across}
    files = {**{Path(p): False for p in paths if Path(p) not in pooled}, **pooled}
    grouped: dict[tuple, list] = {}
    for path, is_pooled in files.items():
        run = json.loads(path.read_text())
        if run["device"] != hw.device:
            continue
        for name, function, fields, us in _measured(run):
            grouped.setdefault((None if is_pooled else path, name), [function]).append((fields, us, run, path.name))
    found = []
    family = SplitKGemm()  # what the pools' configurations are of
    for (_, name), (function, *measured) in grouped.items():
        shape = family.recognize(function())
        if not all(from_hbm(run, shape, hw) for _, _, run, _ in measured):
            continue
        times: dict[str, list] = {}
        for fields, us, _, _ in measured:
            times.setdefault(json.dumps(fields, sort_keys=True), []).append(us)
        if len(times) < 2:
            continue
        typed = examples(family.space(shape, hw))
        found.append(Pool(name, shape, tuple((config_from(json.loads(fields), typed), sum(us) / len(us))
                                             for fields, us in times.items()),
                          "+".join(sorted({source for *_, source in measured}))))
    return found


def pick_share(pool: Pool, hw: Hardware) -> float:
    """The measured time of the plan ``hw``'s model ranks first among ``pool``'s over its
    fastest."""
    plans = [(predict(pool.shape, config, hw), t) for config, t in pool.measured]
    first = ranked(pool.shape, [p for p, _ in plans])[0]
    chosen = next(t for p, t in plans if p is first)
    return chosen / min(t for _, t in pool.measured)


def first_plan_measured(pool: Pool, hw: Hardware) -> bool:
    """Whether ``hw``'s model's first plan over the whole space is one ``pool`` measured. Where
    not, the pool cannot say how fast the pick runs: a fit that ranks well among the measured
    plans planned the 1B Llama's decode down projection 2.4-3.1x slower in the model
    (bench/results/archive/llama_1b_grid_cal_swiglu_s57.json); measure such picks before
    trusting the fit."""
    first = dataclasses.replace(plan_split_k_gemm(pool.shape, hw, padded=True)[0].config, programmatic_launch=False)
    return any(dataclasses.replace(c, programmatic_launch=False) == first for c, _ in pool.measured)


def geomean_share(found: list[Pool], hw: Hardware) -> float:
    return math.exp(sum(math.log(pick_share(p, hw)) for p in found) / len(found))


def fit(found: list[Pool], hw: Hardware, log=lambda line: None) -> Hardware:
    """``hw`` with the constants of :data:`FITTED` searched to lower the pick share on ``found``."""
    base = dict(hw.calibration)
    best = geomean_share(found, hw)
    for _ in range(PASSES):
        for key in FITTED:
            for multiple in MULTIPLIERS:
                trial = refitted(hw, **{key: base[key] * multiple})
                share = geomean_share(found, trial)
                if share < best - MIN_GAIN:
                    best, hw = share, trial
        log(f"pick share {best:.4f}: " + ", ".join(f"{k} x{hw.fitted(k) / base[k]:.3g}" for k in FITTED
                                                   if hw.fitted(k) != base[k]))
    return hw


def held_out(found: list[Pool], hw: Hardware, log=lambda line: None) -> list[float]:
    """Each pool's pick share by the constants fitted on the other workloads' pools."""
    shares = []
    for pool in found:
        refit = fit([p for p in found if p.workload != pool.workload], hw)
        shares.append(pick_share(pool, refit))
        log(f"  held out {pool.workload} ({pool.source}): {shares[-1]:.3f}")
    return shares


def write_calibration(gpu: str, fitted_hw: Hardware, before: Hardware, note: str) -> Path:
    """``data/<gpu>_calibration.json`` with the fitted values of the constants that changed."""
    path = DATA / f"{gpu}_calibration.json"
    data = json.loads(path.read_text())
    for key in FITTED:
        if fitted_hw.fitted(key) != before.fitted(key):
            entry = data["constants"][key]
            entry["value"] = float(fitted_hw.fitted(key))
            entry["source"] = note
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def write_measured_plans(gpu: str, found: list[Pool], hw: Hardware, source: str) -> Path:
    """``data/measured_plans_<gpu>.json``: every plan of ``found`` as the features
    :func:`~tvm_dsm.learned_ranking.rerank` learns from, with its measured time (for GPUs whose
    split-K GEMM plans are re-ranked rather than fitted into the constants)."""
    family = SplitKGemm()
    rows = [{"workload": pool.workload, "family": family.name, "m": pool.shape.m, "shape": repr(pool.shape),
             "config": {f: getattr(config, f) for f in _CONFIG_FIELDS}, "measured_us": us,
             "features": [round(float(x), 5) for x in
                          plan_features(family.name, config, predict(pool.shape, config, hw), hw)]}
            for pool in found for config, us in pool.measured]
    path = DATA / f"measured_plans_{gpu}.json"
    path.write_text(json.dumps({"source": source, "device": hw.device, "feature_names": list(FEATURE_NAMES),
                                "rows": rows}) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pools", nargs="+", type=Path, help="search_quality measure outputs")
    parser.add_argument("--across", nargs="*", type=Path, default=[],
                        help="runs of one suite whose plans of each layer are pooled over the runs")
    parser.add_argument("--gpu", required=True, help="the description fitted (data/<gpu>.json)")
    parser.add_argument("--out", type=Path, help="the per-workload shares (results JSON; required to fit)")
    parser.add_argument("--no-held-out", action="store_true", help="skip the held-out shares (minutes)")
    parser.add_argument("--write", action="store_true", help="write the fitted constants into data/<gpu>_calibration.json")
    parser.add_argument("--measured-plans", action="store_true",
                        help="write the pools as the GPU's re-ranking measurements (data/measured_plans_<gpu>.json)")
    args = parser.parse_args(argv)
    hw = load_hardware(args.gpu)
    found = pools(args.pools, hw, args.across)
    if len(found) < 3:
        raise SystemExit(f"{len(found)} split-K GEMM pools measured on {hw.device}: too few to fit")
    if args.measured_plans:
        command = (f"python -m tvm_dsm.bench.calibrate --gpu {args.gpu} --measured-plans "
                   + " ".join(map(str, args.pools))
                   + (" --across " + " ".join(map(str, args.across)) if args.across else ""))
        path = write_measured_plans(args.gpu, found, hw, command)
        print(f"{sum(len(p.measured) for p in found)} measured plans of {len(found)} workloads -> {path}")
        return
    if args.out is None:
        parser.error("--out is required to fit")
    fitted_hw = fit(found, hw, log=print)
    shares_before = [pick_share(p, hw) for p in found]
    shares_after = [pick_share(p, fitted_hw) for p in found]
    held = [] if args.no_held_out else held_out(found, hw, log=print)
    unmeasured = [not first_plan_measured(p, fitted_hw) for p in found]
    results = new_suite("calibration", hw.device, {"fitted_with": git_sha()},
                        "no timing: pick shares over measured pools " + " ".join(map(str, [*args.pools, *args.across])))
    results["command"] = ("python -m tvm_dsm.bench.calibrate --gpu " + args.gpu + " " + " ".join(map(str, args.pools))
                          + (" --across " + " ".join(map(str, args.across)) if args.across else ""))
    results["constants"] = {k: {"before": hw.fitted(k), "after": fitted_hw.fitted(k)} for k in FITTED}
    results["rows"] = [{"name": p.workload, "source": p.source, "candidates": len(p.measured),
                        "share_before": round(shares_before[i], 4), "share_after": round(shares_after[i], 4),
                        "first_plan_measured": not unmeasured[i],
                        **({"share_held_out": round(held[i], 4)} if held else {})} for i, p in enumerate(found)]
    geo = (lambda values: math.exp(sum(map(math.log, values)) / len(values)))
    results["summary"] = {"pools": len(found), "workloads": len({p.workload for p in found}),
                          "share_before": geo(shares_before), "share_after": geo(shares_after),
                          "first_plans_unmeasured": sum(unmeasured),
                          **({"share_held_out": geo(held)} if held else {})}
    write(results, args.out)
    note = (f"fitted on {sum(len(p.measured) for p in found)} measured plans of "
            f"{results['summary']['workloads']} split-K GEMM workloads (python -m tvm_dsm.bench.calibrate, {args.out}): pick share "
            f"{results['summary']['share_before']:.3f} -> {results['summary']['share_after']:.3f}"
            + (f", held out {results['summary']['share_held_out']:.3f}" if held else ""))
    print(f"{write_calibration(args.gpu, fitted_hw, hw, note)}: {note}" if args.write else note)
    print(f"the fitted model's first plan is not among the measured in {sum(unmeasured)} of {len(found)} pools "
          "(measure those picks before trusting the fit): "
          + ", ".join(p.workload for p, u in zip(found, unmeasured) if u))


if __name__ == "__main__":
    main()
