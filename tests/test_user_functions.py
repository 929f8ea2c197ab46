"""The functions users wrote (bench/user_functions) hold what the GPU runner reads: at their
small sizes each builds its PrimFunc, its inputs fit its parameters, and its reference gives one
array per output parameter of that parameter's shape, symbolic extents read off the inputs."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import numpy as np
import pytest

from tvm_dsm.workloads.user_functions import extents, load_case, param_types, shape_of

FOLDER = Path(__file__).resolve().parents[1] / "bench" / "user_functions"
CASES = sorted(FOLDER.glob("*.py"))


def test_the_folder_holds_the_sweeps_functions():
    assert len(CASES) >= 100


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_a_function_at_its_small_size_fits_its_inputs_and_reference(path):
    case = load_case(path)
    for name, value in case.SMALL.items():
        setattr(case, name, value)
    func = case.make()
    extra = tuple(values[0] for values in getattr(case, "SYMBOLIC", {}).values())
    arrays = case.inputs(np.random.default_rng(0), *extra)
    types = param_types(func)
    assert len(arrays) < len(types)
    values = extents(types, arrays)
    for a, ty in zip(arrays, types):
        assert list(np.shape(a)) == shape_of(ty, values)
    expected = case.reference(*[np.asarray(a, dtype=np.float64) if np.asarray(a).dtype.kind == "f" else a
                                for a in arrays], *extra)
    outputs = [shape_of(ty, values) for ty in types[len(arrays):]]
    assert len(expected) == len(outputs)
    for want, shape in zip(expected, outputs):
        assert np.size(want) == int(np.prod(shape))


def test_an_output_of_other_shape_or_unwritten_is_an_error():
    torch = pytest.importorskip("torch")
    from tvm_dsm.gpu.user_functions import error_of

    want = [np.ones((2, 3))]
    assert error_of([torch.ones(2, 3)], want) == 0.0
    assert error_of([torch.ones(3, 3)], want) == float("inf")
    assert error_of([torch.full((2, 3), float("nan"))], want) == float("inf")
    assert error_of([torch.tensor([1, 2])], [np.array([1, 3])]) == float("inf")


MODELS = sorted((FOLDER.parent / "user_models").glob("*.py"))


@pytest.mark.parametrize("path", MODELS, ids=[p.stem for p in MODELS])
def test_a_model_script_defines_its_model_and_says_how_it_is_written(path):
    """What ``python -m tvm_dsm.gpu.torch_layer --scripts bench/user_models`` reads."""
    tree = ast.parse(path.read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == "make" for n in tree.body)
    assert any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "WRITTEN_AS" for t in n.targets)
               for n in tree.body)


def test_a_build_records_the_forms_and_fallbacks_the_driver_took(tmp_path):
    """The runner's row says how tvm-dsm built a function no family takes as written (its plan
    says "fallback"): here GPT-2's attention over packed qkv, split into heads."""
    pytest.importorskip("torch")
    from tvm_dsm.gpu.user_functions import build_case

    info = build_case(str(FOLDER / "128_attn_packed_qkv_gpt2.py"), str(tmp_path))
    assert info["taken_by"].startswith("fallback")
    assert any("merged head axes split" in line for line in info["how"]), info["how"]


def _rows_crashing_on(cases, libs, out, progress):
    """A stand-in for the timing child: a row a case, the process killed at the case named
    "crashes" (as a segfault in a module's host code kills it), at "peer_crashes" unless it times
    tvm-dsm's module alone, and on exit after the case named "crashes_on_exit"."""
    import json
    import signal

    from tvm_dsm.gpu.user_functions import DONE, OURS_ALONE, RUNNING

    results = json.loads(out.read_text()) if out.exists() else {"rows": []}
    for path, info in cases:
        progress.write_text(RUNNING + path)
        if info["name"] == "crashes" or (info["name"] == "peer_crashes" and not info.get(OURS_ALONE)):
            os.kill(os.getpid(), signal.SIGSEGV)
        results["rows"].append({"name": info["name"], "ok": True, "alone": bool(info.get(OURS_ALONE))})
        out.write_text(json.dumps(results))
        progress.write_text(DONE + path)
        if info["name"] == "crashes_on_exit":
            os.kill(os.getpid(), signal.SIGSEGV)


@pytest.mark.parametrize(("names", "rows"), [
    (["a", "crashes", "b"], [("a", True), ("crashes", False), ("b", True)]),
    (["a", "crashes_on_exit"], [("a", True), ("crashes_on_exit", True)]),
    (["crashes_on_exit", "b"], [("crashes_on_exit", True), ("b", True)]),
    (["a", "peer_crashes", "b"], [("a", True), ("peer_crashes", True), ("b", True)]),
])
def test_a_function_that_kills_the_timing_process_costs_its_own_row_only(tmp_path, names, rows):
    pytest.importorskip("torch")
    import json

    from tvm_dsm.gpu.user_functions import time_in_children

    cases = [(f"/f/{name}.py", {"name": name, "taken_by": "x", "errors": {}}) for name in names]
    out = tmp_path / "out.json"
    time_in_children(cases, tmp_path, out, _rows_crashing_on)
    got = json.loads(out.read_text())["rows"]
    assert [(r["name"], r["ok"]) for r in got] == rows
    assert all("the timing process died (exit code -11)" in r["errors"]["harness"] for r in got if not r["ok"])
    assert [r["name"] for r in got if r.get("alone")] == [n for n in names if n == "peer_crashes"]


def _dies_at_start(cases, libs, out, progress):
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)


def test_a_timing_process_that_dies_before_its_first_function_is_an_error(tmp_path):
    pytest.importorskip("torch")
    from tvm_dsm.gpu.user_functions import RUNNING, time_in_children

    (tmp_path / "timing_progress").write_text(RUNNING + "/f/stale.py")  # a previous run's
    with pytest.raises(RuntimeError, match="before its first function"):
        time_in_children([("/f/a.py", {"name": "a", "taken_by": "x", "errors": {}})], tmp_path,
                         tmp_path / "out.json", _dies_at_start)
