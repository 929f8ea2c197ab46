"""The per-kernel report of a Relax model through the "tvm_dsm" pipeline (tvm_dsm.relax_report),
and the ``tvm-dsm compile-model`` command that prints it (the end-to-end LLM tutorial:
test_llm_tutorial.py, a module of its own so that its compile runs beside these)."""

from __future__ import annotations

import sys

from pathlib import Path

import pytest

import tvm_dsm
from conftest import TARGET
from tvm_dsm.cli import main
from tvm_dsm.relax_pipeline import DLIGHT, PAGED_DECODE, PRESCHEDULED, RAGGED_PREFILL, VIEW
from tvm_dsm.workloads.llama import LLAMA_TINY, export_llama
from tvm_dsm.workloads.relax_models import swiglu_mlp

ROOT = Path(__file__).parent.parent
#: nn.llm's paged-attention kernels, scheduled by nn.llm itself.
PREFILL_ATTENTION_KERNELS = {"batch_prefill_paged_kv"}


@pytest.fixture(scope="module")
def tiny_report():
    return tvm_dsm.relax_report(export_llama(LLAMA_TINY, TARGET)[0], TARGET)


def test_every_matmul_of_the_tiny_llama_is_a_split_k_gemm_per_range_of_rows(tiny_report):
    matmuls = [row for row in tiny_report.rows if row.name.startswith("fused_NT_matmul")]
    assert matmuls
    for row in matmuls:
        assert row.where == "row_gemv/split_k_gemm", row.format()
        assert [r.family for r in row.ranges] == ["row_gemv"] * 2 + ["split_k_gemm"] * (len(row.ranges) - 2)
        assert [r.bound for r in row.ranges[:2]] == [1, 2]
        assert row.row_variable in ("batch_size", "seq_len")
        assert row.ranges[-1].bound is None and all(r.predicted_us > 0 for r in row.ranges)
        assert f"{row.row_variable} <= {row.ranges[0].bound}: " in row.format()


def test_nn_llm_paged_prefill_is_prescheduled_its_ragged_prefill_and_decode_ours_and_the_rest_say_why_dlight(tiny_report):
    where = {row.name: row for row in tiny_report.rows}
    assert all(where[name].where == PRESCHEDULED for name in PREFILL_ATTENTION_KERNELS)
    assert where["batch_decode_paged_kv"].where == PAGED_DECODE
    assert where["batch_prefill_ragged_kv"].where == RAGGED_PREFILL
    dlight = [row for row in tiny_report.rows if row.where == DLIGHT]
    assert dlight and all(row.reason for row in dlight)
    assert all("\n" not in row.format() for row in dlight)  # the reason's first line only
    text = tiny_report.format()
    views = len(tiny_report.rows) - len(tiny_report.kernels)
    assert text.splitlines()[-1] == (f"{len(tiny_report.kernels)} kernels: "
                                     + ", ".join(f"{w} {n}" for w, n in tiny_report.counts().items())
                                     + (f"; {views} reshapes read in place" if views else ""))
    assert sum(tiny_report.counts().values()) == len(tiny_report.kernels)


def test_a_reshape_read_in_place_is_reported_as_a_view_and_builds_no_kernel():
    """A torch model's ``view`` before a matmul lowers to a copy Relax's build then replaces by
    a view of its input (the VM calls a builtin, not the kernel): the report says so rather than
    counting a dlight kernel that never runs."""
    from tvm import relax

    from tvm_dsm.model_report import compile_with_report

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 64, 512), "float16"))
    w = relax.Var("w", relax.TensorType((512, 256), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(x, (256, 512)))
            out = bb.emit_output(bb.emit(relax.op.matmul(rows, w, out_dtype="float16")))
        bb.emit_func_output(out)
    executable, report = compile_with_report(bb.get(), TARGET)
    views = [row for row in report.rows if row.where == VIEW]
    assert [row.name for row in views] == ["reshape"], report.format()
    calls = [line.split()[1] for line in executable.as_text().splitlines() if line.strip().startswith("call ")]
    assert "vm.builtin.reshape" in calls and "reshape" not in calls and "fused_matmul_cast" in calls
    assert len(report.kernels) == len(report.rows) - 1 and report.format().endswith("; 1 reshapes read in place")


def test_a_model_of_constant_shapes_reports_one_prediction_per_kernel():
    report = tvm_dsm.relax_report(swiglu_mlp(128, 1024, 512, 256), TARGET)
    (chain,) = [row for row in report.rows if row.where not in (DLIGHT, PRESCHEDULED)]
    assert chain.row_variable is None and len(chain.ranges) == 1 and chain.ranges[0].bound is None
    assert chain.format().endswith(f"{chain.where}  {chain.ranges[0].predicted_us:.1f} us")


@pytest.mark.slow
def test_compile_model_compiles_the_tiny_llama_reports_and_exports(tmp_path, capsys):
    lib = tmp_path / "llama.so"
    main(["compile-model", "llama", "--model-config", "tiny", "--out", str(lib)])
    out = capsys.readouterr().out
    assert lib.stat().st_size > 0
    assert "split_k_gemm" in out and "prescheduled" in out and "compiled in" in out
    with pytest.raises(SystemExit, match="no configuration"):
        main(["compile-model", "llama", "--model-config", "70b"])


def test_compile_model_takes_a_users_relax_model_from_a_file(tmp_path, capsys, monkeypatch):
    """A model of the user's own (a ``relax.frontend.nn`` SwiGLU MLP in a file of theirs, the
    callable taking its sizes): compiled with a progress bar over the kernels on a terminal's
    stderr, each named in the report; a file giving something else is refused naming what it
    gave."""
    source = tmp_path / "my_model.py"
    source.write_text(
        "from tvm.relax.frontend import nn\n"
        "class MLP(nn.Module):\n"
        "    def __init__(self, width, hidden):\n"
        "        self.gate = nn.Linear(width, hidden, bias=False, dtype='float16')\n"
        "        self.up = nn.Linear(width, hidden, bias=False, dtype='float16')\n"
        "        self.down = nn.Linear(hidden, width, bias=False, dtype='float16')\n"
        "    def forward(self, x):\n"
        "        return self.down(nn.op.silu(self.gate(x)) * self.up(x))\n"
        "def model(width, hidden):\n"
        "    spec = {'forward': {'x': nn.spec.Tensor([128, width], 'float16')}}\n"
        "    return MLP(width, hidden).export_tvm(spec)[0]\n"
        "def weights():\n"
        "    return 3\n")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    main(["compile-model", f"{source}:model", "512", "1024"])
    captured = capsys.readouterr()
    assert "gated_projection      split_k_gemm" in captured.out and "compiled in" in captured.out
    assert "scheduling: 100%" in captured.err and "2/2" in captured.err  # the bar
    with pytest.raises(SystemExit, match="gave a int, not a Relax IRModule"):
        main(["compile-model", f"{source}:weights"])
    with pytest.raises(SystemExit, match="no model 'gpt9'; one of llama"):
        main(["compile-model", "gpt9"])


def test_compile_model_imports_a_torch_export_program(tmp_path, capsys):
    """A torch user's model: a module exporting a ``torch.export`` program, imported by tvm-dsm's
    importer (its products kept in fp16), its linear layer on a tvm-dsm family."""
    pytest.importorskip("torch")
    source = tmp_path / "torch_model.py"
    source.write_text(
        "import torch\n"
        "def program():\n"
        "    layer = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU()).half()\n"
        "    return torch.export.export(layer, (torch.randn(64, 512, dtype=torch.float16),))\n")
    main(["compile-model", f"{source}:program"])
    out = capsys.readouterr().out
    assert "1 kernels: split_k_gemm 1" in out, out


def test_a_runs_per_kernel_times_join_the_report(tiny_report):
    """After a run, each kernel's line carries its measured time per step beside its family and
    prediction (the rows a run's breakdown records: function, µs per step, launches)."""
    from tvm_dsm.model_report import measured_kernels

    gemm = next(row.name for row in tiny_report.rows if row.where == "row_gemv/split_k_gemm")
    joined = tiny_report.with_measured([
        {"function": gemm, "us_per_step": 12.5, "launches_per_step": 2.0},
        {"function": "a_kernel_the_model_does_not_have", "us_per_step": 1.0, "launches_per_step": 1.0}])
    line = next(row.format() for row in joined.rows if row.name == gemm)
    assert line.startswith(f"{gemm}  row_gemv/split_k_gemm") and line.endswith("[measured 6.2 us x 2 a step]")
    assert sum(row.measured_us is not None for row in joined.rows) == 1
    committed = measured_kernels(ROOT / "bench/results/llm/latest.json", batch=8)  # its tvm-dsm configuration
    assert {"rms_norm", "batch_decode_paged_kv"} <= {k["function"] for k in committed}
    with pytest.raises(ValueError, match="no per-kernel breakdown of tvm_dsm_step_graphs at batch 3"):
        measured_kernels(ROOT / "bench/results/llm/latest.json", "tvm_dsm_step_graphs", 3)
