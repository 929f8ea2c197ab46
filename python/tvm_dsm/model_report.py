"""What the "tvm_dsm" Relax pipeline does with each kernel of a Relax model, one row per PrimFunc
it produces: the tvm-dsm family that schedules it with its plan's predicted time (for a
symbolic row count, the family and prediction of each range of rows), or why no family takes it
and dlight schedules it, or that it arrived scheduled (``nn.llm``'s attention kernels).

The rows come from the pipeline itself (its ``coverage`` and ``choices``), so they say what a
compile does: :func:`relax_report` runs the pipeline up to dlight, without generating code;
:func:`compile_with_report` compiles and reports that compile.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from .driver import H100
from .families.row_ranges import ROWS_BEYOND
from .hardware import Hardware
from .relax_integration import Choice, RangeChoice
from .relax_pipeline import DLIGHT, VIEW, schedule_kernels, tvm_dsm_pipeline


@dataclass(frozen=True)
class KernelRow:
    """One PrimFunc: ``where`` it is scheduled (a family's name, ``"dlight"``,
    ``"prescheduled"``, ``"per_operator"``, a kernel tvm-dsm put in whole such as
    ``"paged_decode"``, or ``"view"``: a reshape read in place, no kernel), the family and
    prediction of each range of its rows (one range, bound None, for constant extents), for
    dlight why no family takes it (its first line printed), per operator what took each, and
    after a run its measured device time per model step with its launches."""

    name: str
    where: str
    ranges: tuple[RangeChoice, ...] = ()
    row_variable: str | None = None
    reason: str = ""
    measured_us: float | None = None
    launches: float | None = None

    def format(self, width: int = 0) -> str:
        """The row as one line, the name padded to ``width``."""
        measured = ("" if self.measured_us is None else  # per launch, as the prediction is
                    f"  [measured {self.measured_us / self.launches:.1f} us x {self.launches:g} a step]")
        return f"{self.name:<{width}}  {self.where}{self._detail()}{measured}"

    def _detail(self) -> str:
        if self.where == DLIGHT or not self.ranges:
            return f": {_first_line(self.reason)}" if self.reason else ""
        if self.row_variable is None:
            return f"  {self.ranges[0].predicted_us:.1f} us"
        several = len({r.family for r in self.ranges}) > 1
        parts = []
        for previous, r in zip((None, *self.ranges), self.ranges):
            rows = (f"<= {r.bound}" if r.bound is not None
                    else f"> {previous.bound}" if previous is not None else "any")
            at = f" (at {ROWS_BEYOND})" if r.bound is None else ""
            parts.append(f"{rows}: {r.family + ' ' if several else ''}{r.predicted_us:.1f} us{at}")
        return f"  {self.row_variable} " + ", ".join(parts)


@dataclass(frozen=True)
class ModelReport:
    """The rows of every PrimFunc of a compiled model, by name."""

    rows: tuple[KernelRow, ...]

    @property
    def kernels(self) -> tuple[KernelRow, ...]:
        """The rows of functions that run as kernels (not views)."""
        return tuple(row for row in self.rows if row.where != VIEW)

    def counts(self) -> dict[str, int]:
        """Kernels per ``where``: each family, dlight, prescheduled; most first."""
        return dict(Counter(row.where for row in self.kernels).most_common())

    def with_measured(self, kernels: list[dict]) -> ModelReport:
        """The report with each kernel's measured time from a run's per-kernel breakdown
        (:func:`tvm_dsm.gpu.kernel_breakdown.summarize` rows: ``function``, ``us_per_step``,
        ``launches_per_step``); kernels the run did not launch keep no measurement."""
        by_name = {k["function"]: k for k in kernels}
        return ModelReport(tuple(
            dataclasses.replace(row, measured_us=by_name[row.name]["us_per_step"],
                                launches=by_name[row.name]["launches_per_step"])
            if row.name in by_name else row for row in self.rows))

    def format(self) -> str:
        """One line per kernel, then the kernels per family."""
        width = max((len(row.name) for row in self.rows), default=0)
        summary = ", ".join(f"{where} {n}" for where, n in self.counts().items())
        in_place = len(self.rows) - len(self.kernels)
        return "\n".join([*(row.format(width) for row in self.rows),
                          f"{len(self.kernels)} kernels: {summary}"
                          + (f"; {in_place} reshapes read in place" if in_place else "")])


def model_report(coverage: dict[str, str], choices: dict[str, Choice]) -> ModelReport:
    """The report of one run of the pipeline, from what it filled into ``coverage`` and
    ``choices`` (:func:`tvm_dsm.relax_pipeline.tvm_dsm_pipeline`)."""
    rows = []
    for name, where in sorted(coverage.items()):
        choice = choices.get(name, Choice())
        if choice.ranges:
            tuned = " (tuned)" if choice.tuned else ""
            rows.append(KernelRow(name, choice.families + tuned, choice.ranges, choice.row_variable))
        elif where.startswith(DLIGHT):
            rows.append(KernelRow(name, DLIGHT, reason=choice.reason))
        elif where == VIEW:
            rows.append(KernelRow(name, VIEW, reason="a reshape Relax reads in place: no kernel"))
        else:  # prescheduled, per operator, or a kernel tvm-dsm put in the module whole (paged decode)
            rows.append(KernelRow(name, where, reason=choice.reason))
    return ModelReport(tuple(rows))


def relax_report(mod: tvm.IRModule, target=H100, hw: Hardware | None = None) -> ModelReport:
    """The report of the "tvm_dsm" pipeline on ``mod`` (a Relax IRModule before compilation)
    for ``target``, from the pipeline run up to dlight: no code is generated."""
    choices: dict[str, Choice] = {}
    _, coverage = schedule_kernels(mod, tvm.target.Target(target), hw=hw, choices=choices)
    return model_report(coverage, choices)


def compile_with_report(mod: tvm.IRModule, target=H100, hw: Hardware | None = None,
                        database: ms.Database | None = None,
                        progress: Callable[[int, int, str], None] | None = None,
                        ) -> tuple[relax.VMExecutable, ModelReport]:
    """``mod`` compiled for ``target`` through the "tvm_dsm" pipeline (each function from its
    tuning record in ``database``, where it has one; ``progress(done, total, name)`` called
    before each is scheduled), and that compile's report."""
    coverage: dict[str, str] = {}
    choices: dict[str, Choice] = {}
    pipeline = tvm_dsm_pipeline(database=database, hw=hw, coverage=coverage, choices=choices, progress=progress)
    executable = tvm.compile(mod, tvm.target.Target(target), relax_pipeline=pipeline)
    return executable, model_report(coverage, choices)


#: The configurations of an LLM run whose kernels the report joins by default, in order: the
#: "tvm_dsm" pipeline's, with or without whole-step graphs (the same kernels).
_MEASURED_CONFIGS = ("tvm_dsm", "tvm_dsm_step_graphs")


def measured_kernels(results: str | Path, config: str | None = None, batch: int = 1) -> list[dict]:
    """The per-kernel breakdown of a decode step that an LLM run (``python -m
    tvm_dsm.gpu.llm``) recorded for ``config`` at ``batch`` (by default the first of
    :data:`_MEASURED_CONFIGS` the run has); ValueError naming what the file lacks."""
    found = json.loads(Path(results).read_text())
    configs = found.get("configs", {})
    if config is None:
        config = next((name for name in _MEASURED_CONFIGS if name in configs), _MEASURED_CONFIGS[0])
    try:
        return configs[config]["batches"][str(batch)]["decode_kernels"]["rows"]
    except KeyError as err:
        raise ValueError(f"{results} has no per-kernel breakdown of {config} at batch {batch} "
                         f"(missing {err})") from None


def _first_line(text: str) -> str:
    """The first line of ``text``, without the colon that introduces the lines after it."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "").rstrip(":")
