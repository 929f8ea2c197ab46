"""Result helpers: NaN (unwritten output) never passes; the table and plot are produced; the
committed results (``bench/results/<suite>/latest.json``, ``bench/results/archive/``) are in the
schema and ``bench/RESULTS.md`` is what the generator makes of them."""

from __future__ import annotations

import math

import pytest

from tvm_dsm.bench import results


def test_relative_error_of_unwritten_output_is_infinite():
    torch = pytest.importorskip("torch")
    ref = torch.randn(64, dtype=torch.float64)
    out = ref.clone()
    out[3] = float("nan")
    assert math.isinf(results.relative_error(out, ref))
    assert results.relative_error(ref, ref) == 0.0


def test_table_and_plot(tmp_path):
    suite = results.new_suite("demo", "cpu", {"tvm": "x"}, "none")
    suite["rows"].append(
        {"name": "a", "ok": True, "rel_err": 1e-7, "ours_us": 3.0, "peers": {"torch_eager": 4.0}, "floor_us": 1.0}
    )
    text = results.table(suite)
    assert "torch_eager_us" in text and "3.0" in text
    assert results.plot(suite, tmp_path / "p.png").stat().st_size > 1000
    assert results.write(suite, tmp_path / "r.json").exists()


def test_chain_summary_reports_model_check_and_ablation_from_committed_results():
    import json
    from pathlib import Path

    from tvm_dsm.bench.chain_summary import summarise

    folder = Path(__file__).parent.parent / "bench" / "results"
    # the full chains sweep (every plan, random samples): archived; chains/latest.json holds the picks
    summary = summarise(json.loads((folder / "archive" / "chains.json").read_text()))
    assert all(s["all_correct"] for s in summary["shapes"])
    checked = [s for s in summary["shapes"] if "model_spearman" in s]
    assert len(checked) >= 4 and all(-1 <= s["model_spearman"] <= 1 for s in checked)
    g4 = next(s for s in summary["shapes"] if s["shape"] == "G4")["ablation"]
    assert g4["dsm_fused_searched_plan_us"] < g4["dsm_fused_random_plan_us"]
    # The family's pick is one of the measured kernels, fused or not.
    for s in summary["shapes"]:
        assert s["pick_us"] >= s["best_us"]
        assert s["pick_unfused"] == ("_unfused_" in s["planner_pick"])


def test_batch_summary_of_the_committed_gemm_m_run():
    """Per batch, each layer's pick against cuBLAS (torch eager) and their geomean, from the
    committed H100 run; at M = 16 the split-K GEMMs were at parity with cuBLAS."""
    import json
    from pathlib import Path

    from tvm_dsm.bench.gemm_summary import summarise_batches
    from tvm_dsm.gpu.suites import layer_shapes

    folder = Path(__file__).parent.parent / "bench" / "results"
    summary = summarise_batches(json.loads((folder / "gemm_m" / "latest.json").read_text()))
    # M = 1: the stock GEMV tvm_dsm.build falls back to (the run's dlight rows)
    assert summary["all_correct"] and set(summary["batches"]) == {1, 16, 64, 128, 256, 1024, 4096}
    for m, rows in summary["batches"].items():
        assert len(rows) == len(layer_shapes())
        ratios = [r["cublas_us"] / r["us"] for r in rows]
        assert summary["geomean_vs_cublas_by_m"][m] == pytest.approx(
            math.exp(sum(map(math.log, ratios)) / len(ratios)))
    assert summary["geomean_vs_cublas_by_m"][16] > 0.9 > summary["geomean_vs_cublas_by_m"][4096]


def test_gemm_summary_puts_stock_meta_schedule_beside_dlight():
    """The committed H100 runs: stock MetaSchedule's largest trial budget on G5b, slower than
    the planner's pick measured without any trial; shapes it did not tune have no entry."""
    import json
    from pathlib import Path

    from tvm_dsm.bench.gemm_summary import summarise

    folder = Path(__file__).parent.parent / "bench" / "results"
    baseline = json.loads((folder / "gemm_meta_schedule" / "latest.json").read_text())
    summary = summarise(json.loads((folder / "gemm" / "latest.json").read_text()), baseline)
    shapes = {(s["shape"], s["m"]): s for s in summary["shapes"]}
    g5b = shapes[("G5b", 128)]
    assert g5b["meta_schedule_trials"] == max(r["trials"] for r in baseline["rows"] if "_meta_schedule_" in r["name"])
    assert g5b["meta_schedule_us"] > g5b["pick_us"]
    assert shapes[("G5a", 128)]["meta_schedule_us"] is None


ROOT = __import__("pathlib").Path(__file__).parent.parent
RESULTS = ROOT / "bench" / "results"


def test_every_latest_json_is_in_the_results_schema():
    """suite, device, date, versions, timing; rows with a name, a boolean ok and a rel_err; the
    folder is named after the suite; nothing but folders and the archive at the top."""
    latest = sorted(RESULTS.glob("*/latest.json"))
    assert len(latest) >= 20
    for path in latest:
        data = __import__("json").loads(path.read_text())
        assert results.schema_errors(data) == [], path
        assert data["suite"] == path.parent.name
        assert all(isinstance(r["ok"], bool) for r in data["rows"])
    assert not [p for p in RESULTS.iterdir() if p.is_file()]


def test_schema_check_rejects_a_hand_written_ok():
    suite = results.new_suite("demo", "cpu", {"tvm": "x"}, "none")
    suite["rows"].append({"name": "a", "ok": "yes", "rel_err": 0.0})
    assert any("boolean" in e for e in results.schema_errors(suite))
    assert any("rel_err" in e for e in results.schema_errors({"rows": [{"name": "a", "ok": True}]}))


def test_archive_index_lists_every_archived_file():
    import json

    index = json.loads((RESULTS / "archive" / "index.json").read_text())
    files = {p.name for p in (RESULTS / "archive").glob("*.json")} - {"index.json"}
    assert {e["file"] for e in index} == files
    for e in index:
        assert isinstance(e["reproducible"], bool) and e["measured"]
        assert e.get("how" if e["reproducible"] else "reason")


def test_report_generator_reproduces_the_committed_markdown(tmp_path):
    """``python -m tvm_dsm.bench.report`` runs on the committed results and its output is the
    committed ``bench/RESULTS.md`` and ``archive/INDEX.md`` (deterministic, up to date)."""
    from tvm_dsm.bench import report

    text = report.generate(RESULTS)
    assert text == report.generate(RESULTS)
    assert text == (ROOT / "bench" / "RESULTS.md").read_text()
    for suite in (p.parent.name for p in RESULTS.glob("*/latest.json")):
        assert f"## {suite}\n" in text
    import json

    index = json.loads((RESULTS / "archive" / "index.json").read_text())
    assert report.index_markdown(index) == (RESULTS / "archive" / "INDEX.md").read_text()
    report.main(["--results", str(RESULTS), "--out", str(tmp_path / "R.md")])
    assert (tmp_path / "R.md").read_text() == text


def test_report_prints_one_file(capsys):
    from tvm_dsm.bench import report

    report.main(["report", str(RESULTS / "split_k" / "latest.json")])
    out = capsys.readouterr().out
    assert "stock_bind_trap_4096x1024_c4" in out and "expected failure" in out


def test_derived_paths_of_latest_and_archived_files():
    assert results.derived_path("bench/results/gemm/latest.json", "summary").as_posix() == "bench/results/gemm/summary.json"
    assert results.plot_path("bench/results/gemm/latest.json").name == "plot.png"
    assert results.derived_path("a/archive/chains.json", "summary").name == "chains_summary.json"
    assert results.plot_path("a/archive/chains.json").name == "chains.png"
    assert results.source_name("bench/results/gemm/latest.json") == "gemm/latest.json"


def test_class_summary_reproduces_the_committed_real_shapes_summary():
    import json

    from tvm_dsm.bench.class_summary import summarise

    from tvm_dsm.bench.class_summary import load_evidence

    folder = RESULTS / "real_shapes"
    committed = json.loads((folder / "summary.json").read_text())
    root = RESULTS.parents[1]
    evidence = {name: results for name, results in zip(
        committed["evidence"], load_evidence([str(root / name) for name in committed["evidence"]]).values())}
    summary = summarise(json.loads((folder / "latest.json").read_text()), evidence)
    assert {k: v for k, v in committed.items() if k != "source"} == {k: v for k, v in summary.items() if k != "source"}
    assert set(summary["classes"]) == {"attention", "dense", "norm", "swiglu"}


def test_class_summary_counts_slow_rows_and_leaves_wrong_ones_out():
    from tvm_dsm.bench.class_summary import summarise

    suite = results.new_suite("demo", "cpu", {"tvm": "x"}, "none")
    suite["rows"] += [
        {"name": "a", "ok": True, "rel_err": 0.0, "class": "dense", "m": 1, "ours_us": 2.0, "peers": {"t": 4.0}},
        {"name": "b", "ok": True, "rel_err": 0.0, "class": "dense", "m": 1, "ours_us": 4.0, "peers": {"t": 2.0, "u": 3.0}},
        {"name": "c", "ok": False, "rel_err": 1.0, "class": "dense", "m": 8, "ours_us": 1.0, "peers": {"t": 9.0}},
    ]
    dense = summarise(suite)["classes"]["dense"]
    assert dense["rows"] == 2 and abs(dense["geomean"] - 1.0) < 1e-12
    assert dense["below"] == ["b"] and dense["worst"] == {"name": "b", "ratio": 0.5}
    assert dense["below_why"] == {"b": "no other build of it measured"}
    assert summarise(suite)["not_ok"] == ["c"]


def test_a_row_below_is_explained_by_the_fastest_build_of_it_measured_elsewhere():
    """A configuration sweep whose best build also trails its peer: the kernels; one whose best
    build keeps up: the plan. Wrong rows and other workloads are not evidence."""
    from tvm_dsm.bench.class_summary import summarise

    suite = results.new_suite("demo", "cpu", {"tvm": "x"}, "none")
    suite["rows"] += [{"name": "d_m128", "ok": True, "rel_err": 0.0, "class": "dense", "ours_us": 10.0,
                       "peers": {"t": 7.0}}]
    sweep = results.new_suite("sweep", "cpu", {"tvm": "x"}, "none")
    sweep["rows"] += [
        {"name": "d_m128_c1", "ok": True, "ours_us": 9.0, "peers": {"t": 7.1}},
        {"name": "d_m128_c2", "ok": True, "ours_us": 9.5, "peers": {"t": 7.0}},
        {"name": "d_m128_c3", "ok": False, "ours_us": 5.0, "peers": {"t": 7.0}},  # wrong: no evidence
        {"name": "d_m1280_c1", "ok": True, "ours_us": 1.0, "peers": {"t": 7.0}},  # another workload
    ]
    why = summarise(suite, {"sweep.json": sweep})["classes"]["dense"]["below_why"]["d_m128"]
    assert why.startswith("the kernels trail: the fastest build measured (2 in all), d_m128_c1 (sweep.json), ran 9.0 us, 0.79x")
    sweep["rows"][0]["peers"] = {"t": 9.0}
    why = summarise(suite, {"sweep.json": sweep})["classes"]["dense"]["below_why"]["d_m128"]
    assert why.startswith("the plan trails") and "1.00x" in why


def test_a_sanitizer_sample_spreads_over_every_class():
    from tvm_dsm.gpu.sanitize import stratified_sample

    kernels = [{"name": f"{c}_{i}", "extra": {"class": c}} for c in "abc" for i in range(10 if c == "a" else 3)]
    picked = stratified_sample(kernels, 7)
    classes = [k["extra"]["class"] for k in picked]
    assert {c: classes.count(c) for c in "abc"} == {"a": 3, "b": 2, "c": 2}  # round robin
    assert stratified_sample(kernels, 7) == picked  # seeded
    assert len(stratified_sample(kernels, 100)) == len(kernels)


def test_k_scaling_summary_splits_each_series_into_a_fixed_part_and_a_rate_per_k():
    """Times linear in K (a fixed part plus a main loop) come back as that line, per series and
    for cuBLAS per row count; a failed kernel is left out of its series."""
    from tvm_dsm.bench.gemm_summary import summarise_depths

    def row(m, tag, k, us, cublas_us, ok=True):
        return {"name": f"dense_2048x{k}_m{m}_{tag}", "m": m, "n": 2048, "k": k, "ok": ok, "ours_us": us,
                "peers": {"torch_eager": cublas_us}}

    rows = [row(32, "c8_32x64x64_s3_tma", k, 3.0 + 1.5 * k / 1024, 2.0 + 1.75 * k / 1024) for k in (512, 2048, 8192)]
    rows += [row(32, "c1_32x64x64_s3_tma", k, 1.0 + 4.0 * k / 1024, 2.0 + 1.75 * k / 1024) for k in (1024, 4096)]
    rows.append(row(32, "c1_32x64x64_s3_tma", 8192, 0.0, 16.0, ok=False))
    rows.append(row(64, "c4_64x128x64_s4_tma_wg", 2048, 9.0, 8.0))  # one depth only: no line
    rows.append({"name": "dense_2048x4096_m32_c2_32x64x64_s3_tma", "ok": False, "error": "build"})  # never ran
    summary = summarise_depths({"device": "GPU", "date": "today", "suite": "gemm_k_scaling", "rows": rows})
    assert {s["m"] for s in summary["series"]} == {c["m"] for c in summary["cublas"]} == {32}
    lines = {s["config"]: s for s in summary["series"]}
    assert lines["c8_32x64x64_s3_tma"]["fixed_us"] == pytest.approx(3.0)
    assert lines["c8_32x64x64_s3_tma"]["us_per_1024_k"] == pytest.approx(1.5)
    assert lines["c1_32x64x64_s3_tma"]["points"] == [(1024, 5.0), (4096, 17.0)]
    assert lines["c1_32x64x64_s3_tma"]["fixed_us"] == pytest.approx(1.0)
    ((cublas,),) = [summary["cublas"]]
    assert (cublas["fixed_us"], cublas["us_per_1024_k"]) == (pytest.approx(2.0), pytest.approx(1.75))
