"""tune_relax's tasks: a covered matmul gets PlannedSpace, an uncovered transpose TVM's default
space, and no ClusterError escapes (no measurement)."""

from __future__ import annotations

import logging

from tvm import relax, te
from tvm.script import relax as R
from tvm.s_tir import meta_schedule as ms

from tvm_dsm.meta_schedule import tuning_contexts
from tvm_dsm.workloads.dense import matmul


def _model():
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((128, 1024), "float16"))
    w = relax.Var("w", R.Tensor((1024, 1024), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_te(lambda a, b: te.compute(
                (128, 1024), lambda i, j: matmul(a, b)[i, j].astype("float16"), name="Y"), x, w)
            out = bb.emit_output(relax.op.permute_dims(relax.op.nn.softmax(y, axis=-1)))
        bb.emit_func_output(out)
    return relax.transform.LegalizeOps()(bb.get())


def test_uncovered_tasks_get_the_default_space(tmp_path, caplog, monkeypatch):
    # MetaSchedule's work-directory loggers list its logger's handlers by name; an earlier
    # tuning test leaves pytest's (unnamed) capture handlers there, on which TVM fails
    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    monkeypatch.setattr(ms_logger, "handlers", [h for h in ms_logger.handlers if h.get_name()])
    caplog.set_level("INFO", logger="tvm_dsm.meta_schedule.relax_tuning")
    contexts, weights = tuning_contexts(_model(), str(tmp_path))
    assert len(contexts) == len(weights) >= 2
    default = [c for c in contexts if isinstance(c.space_generator, ms.space_generator.PostOrderApply)]
    assert 0 < len(default) < len(contexts)  # the rest: PlannedSpace (a derived object over FFI)
    for context in contexts:
        assert context.generate_design_space()
    assert sum("no tvm-dsm family applies" in r.message for r in caplog.records) == len(default)
