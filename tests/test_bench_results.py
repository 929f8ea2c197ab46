"""Result helpers: NaN (unwritten output) never passes; the table and plot are produced."""

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
