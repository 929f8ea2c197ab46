"""A tuning run's progress as a MetaSchedule measure callback: a progress bar over the trial
budget (tqdm, on stderr), and the first failure of each task in one log line.

MetaSchedule logs every round to its work directory and a table of all tasks per round to the
console; what a user watching a long run wants is how far it is, and, when candidates fail
(no GPU on a runner, a build error), why, once, rather than hundreds of error records.
"""

from __future__ import annotations

import logging

from tqdm import tqdm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..errors import last_line

logger = logging.getLogger(__name__)


@derived_object
class TuningProgress(ms.measure_callback.PyMeasureCallback):
    """Advances a progress bar by each round's candidates (``total``: the trial budget) and
    logs each task's first failed candidate: the task, the stage (build or run) and the last
    line of its error."""

    def __init__(self, total: int, disable: bool | None = None):
        super().__init__()
        self.bar = tqdm(total=total, unit="trial", desc="tuning", disable=disable)
        self.trials = self.failed = 0
        self._reported: set[int] = set()

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results) -> None:
        for built, ran in zip(builder_results, runner_results):
            stage, error = ("build", built.error_msg) if built.error_msg else ("run", ran.error_msg)
            if error is None:
                continue
            self.failed += 1
            if task_id not in self._reported:
                self._reported.add(task_id)
                logger.warning("task %d: a candidate failed to %s: %s", task_id, stage, last_line(error))
        self.trials += len(measure_candidates)
        self.bar.set_postfix(task=task_id, failed=self.failed, refresh=False)
        self.bar.update(len(measure_candidates))
        if self.trials >= self.bar.total:
            self.bar.close()
