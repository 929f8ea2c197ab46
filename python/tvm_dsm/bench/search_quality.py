"""How good a tuning search is: does it find the best of the planner's top configurations within
a trial budget, and does a learned model of the measurements make it find it sooner?

``python -m tvm_dsm.bench.search_quality measure --out X`` (on the GPU machine, full compiler):
for each workload of :data:`WORKLOADS`, the planner's top ``--top`` (100) configurations built
and timed by :func:`tvm_dsm.tune` (MetaSchedule's builder and runner), one row per candidate with
its rank, prediction, measured time and plan features
(:func:`~tvm_dsm.meta_schedule.plan_features.plan_features`).

``python -m tvm_dsm.bench.search_quality simulate X [X2 ...] --out Y`` (anywhere) replays
searches over those measured pools, each measuring batches of :data:`BATCH` candidates:

- ``analytical``: in the planner's order (what ``tvm_dsm.tune`` with ``top_k=T`` measures);
- ``learned``: each next batch the best by :class:`~tvm_dsm.meta_schedule.PlanResidualModel`
  refitted on the workload's measurements so far;
- ``learned_prior``: the same model fitted on the other workloads' measurements first (a tuning
  session over many tasks, as ``tune_relax`` shares its cost model);
- ``tvm_xgb``: TVM's own ``XGBModel`` on :class:`~tvm_dsm.meta_schedule.PlanFeatureExtractor`'s
  features (the first batch in the planner's order, then each the best it predicts).

Per workload and search: the best time found within ``T`` trials (16, 32, 64) as a share of the
pool's best (1.0: found), the untuned pick's share (the planner's first) and that of the pick
re-ranked by the measurements of the other workloads of its family (what :func:`tvm_dsm.learned_ranking.rerank`
does with the committed ones), and the Spearman rank correlation with the measured times, on
the candidates the learned search has not measured after 32 and 64 trials, of the analytical
and the learned predictions (and of TVM's XGBModel on those its search has not measured). Features are recomputed from each row's configuration by this
commit's planner.

``python -m tvm_dsm.bench.search_quality search --pools X [X2 ...] --out Y`` (on the GPU
machine) runs the search itself: MetaSchedule's ``tune_tir`` over the workload's
:class:`~tvm_dsm.meta_schedule.PlannedSpace` with the search ``tune_relax`` uses (:class:`~tvm_dsm.meta_schedule.PlannedSearch`)
and the learned cost model, ``--trials`` (64) candidates in rounds of :data:`BATCH`. Then, in
the same process, the best candidate it found, the best of the workload's measured pool and the
untuned pick are timed side by side; the row's ``share`` is the pool's best over the search's.

``python -m tvm_dsm.bench.search_quality merge-search X [X2 ...] --out Y`` merges search runs
(a later run's row replaces an earlier one of the same workload; each row names its run) and
writes their summary beside ``Y`` (``summary.json``: the geometric mean share and gain over the
untuned pick, the workloads found within 2%).

``python -m tvm_dsm.bench.search_quality prior X [X2 ...]`` writes the measurements
:func:`~tvm_dsm.learned_ranking.rerank` learns from (``tvm_dsm/data/measured_plans.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from ..learned_ranking import (ANALYTICAL, FEATURE_NAMES, MEASURED_PLANS, MIN_WORKLOADS, RERANKED, PlanResidual,
                               plan_features, row_count)
from ..workloads.cascades import attention
from ..workloads.chains import gemm_chain, swiglu_ffn
from ..workloads.dense import dense, gated_dense
from ..workloads.norms import topi_norm
from .results import RESULTS, geomean, git_sha, merge, new_suite, write

SUITE = "search_quality"
#: Candidates a search measures at a time (MetaSchedule's trials per iteration).
BATCH = 16
BUDGETS = (16, 32, 64)
#: The workloads (name: function): GEMMs, gated layers, chains, attention and norms across M,
#: from the real model shapes (bench/results/real_shapes), including ones whose planned pick
#: measured below the better torch peer there, and a 1B Llama's decode-batch GEMMs and gated GEMMs.
WORKLOADS: dict[str, Callable] = {
    **{f"dense_{n}x{k}_m{m}": (lambda m=m, n=n, k=k: dense(m, n, k)) for m, n, k in (
        (8, 6144, 4096), (16, 8192, 8192), (32, 14336, 4096), (64, 10240, 8192), (128, 9216, 3072),
        (128, 4608, 3584), (128, 8192, 8192), (256, 3072, 2048), (512, 4096, 4096), (1024, 1152, 896),
        (2048, 4096, 4096), (16, 3072, 2048), (16, 2048, 2048), (16, 2048, 8192), (16, 16384, 2048),
        *((m, n, k) for m in (32, 64) for n, k in ((3072, 2048), (2048, 2048), (2048, 8192), (32000, 2048))))},
    **{f"gated_{n}x{k}_m{m}": (lambda m=m, n=n, k=k: gated_dense(m, n, k)) for m, n, k in (
        (16, 14336, 4096), (64, 8192, 2048), (256, 4864, 896))},
    # the 1B Llama's SwiGLU as one gated GEMM of its fused gate/up weight (tvm_dsm.relax_gated)
    **{f"gated_fused_{n}x{k}_m{m}": (lambda m=m, n=n, k=k: gated_dense(m, n, k, fused_weight=True)) for m, n, k in (
        (16, 8192, 2048), (32, 8192, 2048), (64, 8192, 2048), (2048, 8192, 2048))},
    **{f"swiglu_{n}x{k}_m{m}": (lambda m=m, n=n, k=k: swiglu_ffn(m, n, k, k)) for m, n, k in (
        (64, 14336, 4096), (128, 8192, 2048), (1024, 4864, 896))},
    "ffn_relu_4096x1024_m128": lambda: gemm_chain(128, 4096, 1024, 1024, "relu"),
    **{f"attention_h{h}_s{s}_d{d}{'_causal' if c else ''}": (lambda h=h, s=s, d=d, c=c: attention(h, s, s, d, c))
       for h, s, d, c in ((32, 2048, 128, False), (16, 1024, 64, True))},
    **{f"{op}_{w}_m{m}": (lambda op=op, m=m, w=w: topi_norm(op, m, w, "float16")) for op, m, w in (
        ("rms_norm", 32, 8192), ("rms_norm", 1024, 4096), ("layer_norm", 4096, 4096), ("softmax", 4096, 32000))},
}


def measure(names: list[str], top: int, builder=None, runner=None, log=print) -> list[dict]:
    """One row per measured candidate of each named workload's top ``top`` (see the module
    docstring); ``builder`` and ``runner`` go to :func:`tvm_dsm.tune` (default: this machine's
    GPU)."""
    from ..driver import plan, tune
    from ..hardware import load_hardware

    hw = load_hardware()
    rows = []
    for name in names:
        start = time.perf_counter()
        func = WORKLOADS[name]()
        family = plan(func, hw).family.name
        with tempfile.TemporaryDirectory() as work_dir:
            measured = tune(func, work_dir, top_k=top, hw=hw, builder=builder, runner=runner)
        for m in sorted(measured, key=lambda m: m.rank):
            rows.append({
                "name": f"{name}_r{m.rank}", "workload": name, "rank": m.rank, "family": family,
                "ok": m.measured_us is not None, "rel_err": None, "ours_us": m.measured_us,
                "predicted_us": m.plan.predicted_us, "config": dataclasses.asdict(m.plan.config),
                "features": plan_features(family, m.plan.config, m.plan, hw).tolist(),
                **({"error": m.error[-300:]} if m.error else {}),  # the exception is at the end
            })
        ok = [m for m in measured if m.measured_us is not None]
        log(f"{name}: {len(ok)} of {len(measured)} measured, best {min((m.measured_us for m in ok), default=0):.1f} us "
            f"({time.perf_counter() - start:.0f} s)")
    return rows


def search(name: str, pool: list[dict], trials: int, top: int = 64, builder=None, runner=None,
           log=print) -> dict:
    """MetaSchedule's search of workload ``name``'s planned space (see the module docstring),
    then its best, the best of ``pool`` (the workload's measured rows) and the untuned pick
    timed side by side by :func:`tvm_dsm.tune`; ``builder`` and ``runner`` default to this
    machine's GPU (:mod:`tvm_dsm.local_measure`)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from ..driver import BUILD_TIMEOUT_S, load_tvm_dsm, plan, tune
    from ..hardware import load_hardware
    from ..local_measure import local_builder, local_runner
    from ..meta_schedule import LearnedPlanModel, PlannedSpace
    from ..families.configs import config_from, examples
    from ..meta_schedule.planned_space import PlannedSearch, plan_index
    from ..meta_schedule.relax_tuning import H100_TAG
    from ..tuning_database import open_database

    hw = load_hardware()
    func = WORKLOADS[name]()
    ranking = plan(func, hw)
    space = PlannedSpace(top, hw)
    with tempfile.TemporaryDirectory() as work_dir:
        start = time.perf_counter()
        database = ms.tir_integration.tune_tir(
            tvm.IRModule({"main": func}), target=H100_TAG, work_dir=work_dir, max_trials_global=trials,
            num_trials_per_iter=BATCH, space=space, strategy=PlannedSearch(), cost_model=LearnedPlanModel(hw),
            builder=builder or local_builder(BUILD_TIMEOUT_S, load_tvm_dsm),
            runner=runner or local_runner(load_tvm_dsm), database=open_database(work_dir))
        seconds = time.perf_counter() - start
        planned = space.plans.plan(tvm.IRModule({"main": func})).plans  # what the search's clone sampled from
        searched = {}  # the planner's rank of each measured candidate: its median time
        for record in database.get_all_tuning_records():
            index = plan_index(ms.database.TuningRecord.as_measure_candidate(record).sch)
            times = [float(t) for t in record.run_secs]
            if index is not None and max(times) < 1e9:
                searched[ranking.plans.index(planned[index])] = float(np.median(times)) * 1e6
    typed = examples([p.config for p in ranking.plans])
    pool_best = min((r for r in pool if r["ok"]), key=lambda r: r["ours_us"])
    pool_rank = next((i for i, p in enumerate(ranking.plans) if p.config == config_from(pool_best["config"], typed)), None)
    tuned_rank = min(searched, key=searched.get)
    ranks = list(dict.fromkeys(r for r in (tuned_rank, pool_rank, 0) if r is not None))
    with tempfile.TemporaryDirectory() as work_dir:
        timed = {m.rank: m.measured_us for m in tune(func, work_dir, ranks=ranks, hw=hw, builder=builder, runner=runner)}
    row = {"name": name, "ok": timed.get(tuned_rank) is not None, "rel_err": None, "trials": trials,
           "measured": len(searched), "search_seconds": round(seconds, 1), "tuned_rank": tuned_rank,
           "pool_best_rank": pool_rank, "ours_us": timed.get(tuned_rank), "pool_best_us": timed.get(pool_rank),
           "untuned_us": timed.get(0), "pool_best_us_when_pooled": pool_best["ours_us"]}
    if row["ok"] and row["pool_best_us"]:
        row["share"] = row["pool_best_us"] / row["ours_us"]
    if row["ok"] and row["untuned_us"]:
        row["gain_over_untuned"] = row["untuned_us"] / row["ours_us"]
    log(f"{name}: {len(searched)} measured in {seconds:.0f} s; tuned rank {tuned_rank} {row['ours_us']} us, "
        f"pool best rank {pool_rank} {row['pool_best_us']} us, untuned {row['untuned_us']} us")
    return row


def with_features(rows: list[dict], device: str) -> list[dict]:
    """The measured ``rows`` with the features of their configurations as planned by this
    commit for ``device``, the GPU they were measured on (a pool keeps its configurations and
    times; the feature vector follows the code). A configuration the family no longer plans (a
    limit added since it was measured) has no features and is left out."""
    from ..errors import ClusterError
    from ..families import match_family
    from ..hardware import description_for, load_hardware
    from ..families.configs import config_from, examples

    name = description_for(device)
    if name is None:
        raise ValueError(f"no hardware description for {device}, where the pools were measured")
    hw = load_hardware(name)
    out = []
    for name in dict.fromkeys(r["workload"] for r in rows):
        family, shape = match_family(WORKLOADS[name]())
        typed = examples(family.space(shape, hw))
        for r in rows:
            if r["workload"] == name and r["ok"]:
                config = config_from(r["config"], typed)
                try:
                    planned = family.predict(shape, config, hw)
                except ClusterError:
                    continue
                features = plan_features(family.name, config, planned, hw)
                out.append({**r, "features": features.tolist(), "m": row_count(shape)})
    return out


def _pools(rows: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each workload's measured candidates in the planner's order: (features, measured us)."""
    by_workload = defaultdict(list)
    for r in rows:
        if r["ok"]:
            by_workload[r["workload"]].append(r)
    return {w: (np.array([r["features"] for r in sorted(rs, key=lambda r: r["rank"])], dtype="float32"),
                np.array([r["ours_us"] for r in sorted(rs, key=lambda r: r["rank"])]))
            for w, rs in by_workload.items()}


def learned_order(features: np.ndarray, times: np.ndarray, budget: int,
                  prior: tuple[np.ndarray, np.ndarray] | None = None) -> list[int]:
    """The candidates a learned search measures, in order, up to ``budget``: batches of BATCH,
    each the best by the model refitted on what was measured before (and on ``prior``)."""
    model = PlanResidual()
    if prior is not None and len(prior[1]):
        model.add(*prior)
    order: list[int] = []
    while len(order) < min(budget, len(times)):
        left = np.array([i for i in range(len(times)) if i not in order])
        predicted = model.predict_us(features[left])
        batch = [int(i) for i in left[np.argsort(predicted, kind="stable")][:BATCH]]
        order += batch[:budget - len(order)]
        model.add(features[batch], times[batch])
    return order


def tvm_xgb_search(name: str, configs: list[dict], times: np.ndarray, budget: int) -> tuple[list[int], dict]:
    """The candidates a search scored by TVM's ``XGBModel`` over tvm-dsm's plan features
    measures, in order, up to ``budget`` (batches of BATCH; the first in the planner's order),
    and per budget of 32 and 64 trials the Spearman correlation of its predictions with the
    times of the candidates it has not measured."""
    import tvm
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms

    from ..intrin import import_tvm_intrinsics
    from ..families.configs import config_from
    from ..meta_schedule.candidate_config import annotate_config
    from ..meta_schedule.plan_features import PlanFeatureExtractor

    func = WORKLOADS[name]()
    mod = tvm.IRModule({"main": func})
    extractor = PlanFeatureExtractor()
    typed = extractor.task(mod)[3]
    import_tvm_intrinsics()  # before TuneContext imports them, slowly from a deep stack
    context = ms.TuneContext(mod=mod, target=tvm.target.Target("nvidia/nvidia-h100"), task_name=name)
    args_info = ms.arg_info.ArgInfo.from_prim_func(func)
    candidates = []
    for fields in configs:  # the function with the configuration its features describe
        sch = s_tir.Schedule(mod)
        annotate_config(sch, config_from(fields, typed))
        candidates.append(ms.MeasureCandidate(sch, args_info))
    model = ms.cost_model.XGBModel(extractor=extractor, num_warmup_samples=0, verbose_eval=10**6)
    order: list[int] = []
    spearman = {}
    while len(order) < min(budget, len(times)):
        left = [i for i in range(len(times)) if i not in order]
        scores = model.predict(context, [candidates[i] for i in left]) if order else -np.arange(len(left))
        if len(order) in (32, 64):
            spearman[len(order)] = _spearman(-np.asarray(scores), times[left])
        batch = [left[i] for i in np.argsort(-np.asarray(scores), kind="stable")][:BATCH]
        order += batch[:budget - len(order)]
        model.update(context, [candidates[i] for i in batch],
                     [ms.runner.RunnerResult([float(times[i]) * 1e-6], None) for i in batch])
    left = [i for i in range(len(times)) if i not in order]
    if len(order) in (32, 64) and left:
        spearman[len(order)] = _spearman(-model.predict(context, [candidates[i] for i in left]), times[left])
    return order, spearman


def _reranked_pick(features: np.ndarray, family_pools: list[tuple[np.ndarray, np.ndarray]]) -> int:
    """The candidate an untuned build takes where the committed measurements are
    ``family_pools`` (the other workloads of its family): the first
    :data:`~tvm_dsm.learned_ranking.RERANKED` re-ordered by the correction learned from them
    where they are :data:`~tvm_dsm.learned_ranking.MIN_WORKLOADS` or more
    (:func:`tvm_dsm.learned_ranking.rerank`)."""
    if len(family_pools) < MIN_WORKLOADS:
        return 0
    model = PlanResidual()
    for pool in family_pools:
        model.add(*pool)
    return int(np.argmin(model.predict_us(features[:RERANKED])))


def _spearman(predicted: np.ndarray, measured: np.ndarray) -> float | None:
    if len(measured) < 3 or np.ptp(measured) == 0:
        return None
    return float(spearmanr(predicted, measured).statistic)


def simulate(rows: list[dict]) -> list[dict]:
    """One row per workload (see the module docstring)."""
    pools = _pools(rows)
    configs = {w: [r.get("config") for r in sorted((r for r in rows if r["ok"] and r["workload"] == w), key=lambda r: r["rank"])]
               for w in pools}
    families = {r["workload"]: r.get("family") for r in rows}
    out = []
    for name, (features, times) in pools.items():
        best = float(times.min())
        others = [pools[w] for w in pools if w != name]
        same_family = [pools[w] for w in pools if w != name and families[w] == families[name]]
        prior = (np.concatenate([f for f, _ in others]), np.concatenate([t for _, t in others])) if others else None
        orders = {"analytical": list(range(len(times))),
                  "learned": learned_order(features, times, max(BUDGETS)),
                  "learned_prior": learned_order(features, times, max(BUDGETS), prior)}
        tvm_xgb_spearman = {}
        if name in WORKLOADS and None not in configs[name]:  # TVM's model scores candidates of the workload
            orders["tvm_xgb"], tvm_xgb_spearman = tvm_xgb_search(name, configs[name], times, max(BUDGETS))
        row = {"name": name, "ok": True, "rel_err": None, "candidates": len(times), "best_us": best,
               "untuned_share": best / float(times[0]), "reranked_share": best / float(times[_reranked_pick(features, same_family)])}
        for search, order in orders.items():
            for budget in BUDGETS:
                row[f"{search}_share_{budget}"] = best / float(times[order[:budget]].min())
        for budget in (32, 64):
            model = PlanResidual()
            measured = orders["learned"][:budget]
            model.add(features[measured], times[measured])
            left = [i for i in range(len(times)) if i not in measured]
            row[f"spearman_analytical_after_{budget}"] = _spearman(np.exp2(features[left, ANALYTICAL]), times[left])
            row[f"spearman_learned_after_{budget}"] = _spearman(model.predict_us(features[left]), times[left])
            if "tvm_xgb" in orders:
                row[f"spearman_tvm_xgb_after_{budget}"] = tvm_xgb_spearman.get(budget)
        out.append(row)
    return out


def summary(rows: list[dict]) -> dict:
    """Per search and budget: the workloads whose best was found within 2% (share >= 0.98) and
    the geometric mean share; the untuned pick's geometric mean share."""
    out = {"workloads": len(rows), "untuned_geomean_share": geomean([r["untuned_share"] for r in rows]),
           "reranked_geomean_share": geomean([r["reranked_share"] for r in rows])}
    shares = [k for k in rows[0] if "_share_" in k] if rows else []
    for key in shares:
        found = [r[key] for r in rows]
        out[key] = {"within_2pct": sum(s >= 0.98 for s in found), "geomean": geomean(found)}
    return out


def search_summary(rows: list[dict]) -> dict:
    """Over the searched workloads: how many found the pool's best within 2%, the geometric
    mean share of it and of the gain over the untuned pick, the trials and seconds spent."""
    done = [r for r in rows if "share" in r]
    return {"workloads": len(done), "within_2pct": sum(r["share"] >= 0.98 for r in done),
            "geomean_share": geomean([r["share"] for r in done]),
            "geomean_gain_over_untuned": geomean([r["gain_over_untuned"] for r in done if "gain_over_untuned" in r]),
            "max_trials": max((r["trials"] for r in done), default=None),
            "median_search_seconds": float(np.median([r["search_seconds"] for r in done])) if done else None}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="measure the planner's top candidates of each workload (GPU)")
    m.add_argument("--out", required=True)
    m.add_argument("--top", type=int, default=100)
    m.add_argument("--only", nargs="*", help="workload names containing one of these")
    s = sub.add_parser("simulate", help="replay searches over a measure run's pools")
    s.add_argument("measured", nargs="+", help="measure runs' results (e.g. one per --only group)")
    s.add_argument("--out", default=str(RESULTS / SUITE / "latest.json"))
    t = sub.add_parser("search", help="MetaSchedule's search of each pooled workload's planned space (GPU)")
    t.add_argument("--pools", nargs="+", required=True, help="measure runs' results")
    t.add_argument("--out", required=True)
    t.add_argument("--trials", type=int, default=64)
    t.add_argument("--only", nargs="*", help="workload names containing one of these, in this order")
    t.add_argument("--stop-after", type=float, default=float("inf"),
                   help="start no further workload after this many seconds (a device call's time limit)")
    g = sub.add_parser("merge-search", help="merge search runs' results, later rows replacing earlier ones")
    g.add_argument("runs", nargs="+", help="search runs' results, oldest first")
    g.add_argument("--out", default=str(RESULTS / f"{SUITE}_search" / "latest.json"))
    p = sub.add_parser("prior", help="write the measurements plan() re-ranks with (tvm_dsm/data/measured_plans.json)")
    p.add_argument("measured", nargs="+", help="measure runs' results")
    p.add_argument("--out", default=str(MEASURED_PLANS))
    args = parser.parse_args(argv)
    import tvm

    import json

    if args.command == "merge-search":
        merged = merge([json.loads(Path(path).read_text()) for path in args.runs])
        write(merged, args.out)
        merged_summary = search_summary(merged["rows"])
        (Path(args.out).parent / "summary.json").write_text(json.dumps(merged_summary, indent=1) + "\n")
        print(json.dumps(merged_summary, indent=1))
        return
    if args.command in ("measure", "search"):
        import torch

        device, versions = torch.cuda.get_device_name(0), {"tvm": tvm.__version__, "tvm_dsm": git_sha()}
    if args.command == "search":
        pools = [row for path in args.pools for row in json.loads(Path(path).read_text())["rows"]]
        pooled = list(dict.fromkeys(r["workload"] for r in pools))
        names = [n for n in dict.fromkeys(n for o in args.only or [""] for n in pooled if o in n)]
        results = new_suite(f"{SUITE}_search", device, versions,
                            "MetaSchedule's LocalBuilder and LocalRunner through tvm_dsm's local_measure, median of its repeats")
        results["command"] = f"python -m tvm_dsm.bench.search_quality search --trials {args.trials}"
        results["rows"] = []
        started = time.perf_counter()
        for name in names:
            if time.perf_counter() - started > args.stop_after:
                break
            results["rows"].append(search(name, [r for r in pools if r["workload"] == name], args.trials,
                                          log=lambda line: print(line, flush=True)))
            write(results, args.out)
        return
    if args.command == "measure":
        names = [n for n in WORKLOADS if not args.only or any(o in n for o in args.only)]
        results = new_suite(f"{SUITE}_pools", device, versions,
                            "tvm_dsm.tune: MetaSchedule's LocalBuilder and LocalRunner, median of its repeats")
        results["command"] = "python -m tvm_dsm.bench.search_quality measure --top " + str(args.top)
        results["rows"] = []
        for name in names:  # written after each workload: a device call cut short keeps what it measured
            results["rows"] += measure([name], args.top, log=lambda line: print(line, flush=True))
            write(results, args.out)
        return
    runs = [json.loads(Path(path).read_text()) for path in args.measured]
    results = new_suite(SUITE, f"CPU (offline, from {runs[0]['device']} measurements)",
                        {"measured_with": [run["versions"] for run in runs], "simulated_with": git_sha()},
                        "no timing: " + " ".join(args.measured))
    results["command"] = "python -m tvm_dsm.bench.search_quality simulate " + " ".join(args.measured)
    devices = {run["device"] for run in runs}
    if len(devices) > 1:
        raise SystemExit(f"pools measured on several GPUs ({', '.join(sorted(devices))}): one at a time")
    rows = with_features([row for run in runs for row in run["rows"]], runs[0]["device"])
    if args.command == "prior":
        prior = {"source": results["command"].replace("simulate", "prior"), "measured_with": results["versions"]["measured_with"],
                 "device": runs[0]["device"], "feature_names": list(FEATURE_NAMES),
                 "rows": [{"workload": r["workload"], "family": r["family"], "m": r["m"], "config": r["config"],
                           "measured_us": r["ours_us"], "features": [round(x, 5) for x in r["features"]]}
                          for r in rows]}
        Path(args.out).write_text(json.dumps(prior) + "\n")
        print(f"{len(prior['rows'])} measured plans of {len({r['workload'] for r in rows})} workloads -> {args.out}")
        return
    results["rows"] = simulate(rows)
    results["summary"] = summary(results["rows"])
    write(results, args.out)
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
