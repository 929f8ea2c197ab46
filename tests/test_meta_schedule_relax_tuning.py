"""tune_relax's tasks: a covered matmul gets PlannedSpace, an uncovered transpose TVM's default
space, and no ClusterError escapes (no measurement)."""

from __future__ import annotations

import pytest
from tvm import relax, te, tirx
from tvm.ir.utils import derived_object
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


def test_uncovered_tasks_get_the_default_space(tmp_path, caplog):
    from conftest import without_unnamed_meta_schedule_handlers

    without_unnamed_meta_schedule_handlers()
    caplog.set_level("INFO", logger="tvm_dsm.meta_schedule.relax_tuning")
    contexts, weights = tuning_contexts(_model(), str(tmp_path))
    assert len(contexts) == len(weights) >= 2
    default = [c for c in contexts if isinstance(c.space_generator, ms.space_generator.PostOrderApply)]
    assert 0 < len(default) < len(contexts)  # the rest: PlannedSpace (a derived object over FFI)
    for context in contexts:
        assert context.generate_design_space()
    assert sum("no tvm-dsm space" in r.message for r in caplog.records) == len(default)


def test_the_final_table_has_a_line_per_task():
    from types import SimpleNamespace

    import tvm

    from tvm_dsm.meta_schedule.planned_space import PlannedSpace
    from tvm_dsm.meta_schedule.relax_tuning import task_table

    tasks = ms.relax_integration.extract_tasks(_model(), tvm.target.Target("nvidia/nvidia-h100"))
    contexts = [SimpleNamespace(mod=t.dispatched[0], task_name=t.task_name,
                                space_generator=PlannedSpace() if i == 0 else ms.space_generator.PostOrderApply())
                for i, t in enumerate(tasks)]
    database = ms.database.MemoryDatabase()
    first = contexts[0]
    workload = database.commit_workload(first.mod)
    for seconds in (3e-6, 2e-6, 1e10):  # the last a failed measurement
        database.commit_tuning_record(ms.database.TuningRecord(
            tvm.s_tir.Schedule(first.mod).trace, workload, [seconds], tvm.target.Target("nvidia/nvidia-h100"),
            ms.arg_info.ArgInfo.from_prim_func(first.mod["main"])))
    lines = task_table(contexts, database).splitlines()
    assert len(lines) == 1 + len(contexts) >= 3
    assert lines[1].split()[-3:] == ["tvm-dsm", "2", "2.0"]  # two valid records, the best 2.0 us
    assert all(line.split()[-3:] == ["default", "0", "-"] for line in lines[2:])


def test_tuning_without_a_gpu_says_so_in_one_line(tmp_path):
    from tvm_dsm.device import gpu_or_reason
    from tvm_dsm.meta_schedule import tune_relax

    if gpu_or_reason() is None:
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="tune_relax measures on this machine's GPU: .*RPCRunner"):
        tune_relax(_model(), str(tmp_path), max_trials_global=1)


def test_tune_relax_tunes_every_task_and_the_pipeline_compiles_from_its_records(tmp_path):
    """A whole model tuned with a scripted runner: the matmul in tvm-dsm's space, the softmax and
    transpose in TVM's, all into the one database; the "tvm_dsm" pipeline then schedules each
    function from its record: the families' with the tuned configuration, the transpose no
    family takes with MetaSchedule's schedule instead of dlight's."""
    import tvm
    from conftest import without_unnamed_meta_schedule_handlers
    from test_driver import InProcessBuilder, _ScriptedRunner

    from tvm_dsm.hardware import load_hardware
    from tvm_dsm.meta_schedule import tune_relax
    from tvm_dsm.meta_schedule.relax_tuning import tuning_tasks
    from tvm_dsm.relax_integration import TUNED_IN_TVM_SPACE
    from tvm_dsm.relax_pipeline import schedule_kernels

    mod, target = _model(), tvm.target.Target("nvidia/nvidia-h100")
    tasks = tuning_tasks(mod, target, load_hardware())
    without_unnamed_meta_schedule_handlers()
    database = tune_relax(mod, str(tmp_path), max_trials_global=4 * len(tasks), num_trials_per_iter=4, top=8,
                          builder=InProcessBuilder(), runner=_ScriptedRunner())
    assert len(database.get_all_tuning_records()) >= len(tasks) >= 3
    assert all(database.has_workload(task.dispatched[0]) for task in tasks)

    choices = {}
    _, coverage = schedule_kernels(mod, target, database=database, choices=choices)
    tuned = {name for name, choice in choices.items() if choice.tuned}
    in_tvm_space = {name for name, where in coverage.items() if where == TUNED_IN_TVM_SPACE}
    assert tuned and in_tvm_space and tuned | in_tvm_space == {task.task_name for task in tasks}


@derived_object
class _NoBuild(ms.builder.PyBuilder):
    """Builds nothing: the scripted runner never loads what it measures (MetaSchedule removes
    each candidate's folder afterwards)."""

    def build(self, build_inputs):
        import tempfile

        return [ms.builder.BuilderResult(tempfile.mkdtemp() + "/unbuilt.so", None) for _ in build_inputs]


@pytest.mark.slow
def test_a_symbolic_row_count_is_tuned_per_range_and_compiled_from_those_records(tmp_path):
    """A matmul over a symbolic batch: one task per range of rows, at the range's row count;
    the pipeline then schedules each range in its record's configuration (the scripted runner
    reports later candidates faster, so the records are not the planner's picks)."""
    import tvm
    from conftest import without_unnamed_meta_schedule_handlers
    from test_driver import _ScriptedRunner

    from tvm_dsm.families.row_ranges import ROW_RANGES, ROWS_BEYOND
    from tvm_dsm.hardware import load_hardware
    from tvm_dsm.meta_schedule import tune_relax
    from tvm_dsm.meta_schedule.relax_tuning import tuning_tasks
    from tvm_dsm.relax_pipeline import schedule_kernels

    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((n, 1024), "float16"))
    w = relax.Var("w", R.Tensor((2048, 1024), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.op.permute_dims(w)))
        bb.emit_func_output(out)
    mod, target = bb.get(), tvm.target.Target("nvidia/nvidia-h100")
    tasks = tuning_tasks(mod, target, load_hardware())
    assert sorted(int(t.task_name.rsplit("_rows", 1)[1]) for t in tasks) == sorted((*ROW_RANGES, ROWS_BEYOND))
    assert [t.task_name for t in tuning_tasks(mod, target, load_hardware(), rows=(16,))] == ["fused_NT_matmul_cast_rows16"]
    without_unnamed_meta_schedule_handlers()
    database = tune_relax(mod, str(tmp_path), max_trials_global=3 * len(tasks), num_trials_per_iter=3, top=3,
                          builder=_NoBuild(), runner=_ScriptedRunner())
    assert all(database.has_workload(task.dispatched[0]) for task in tasks)
    choices, tuned_choices = {}, {}
    schedule_kernels(mod, target, choices=choices)
    schedule_kernels(mod, target, database=database, choices=tuned_choices)
    [name] = [name for name, choice in tuned_choices.items() if choice.ranges]
    assert tuned_choices[name].tuned and not choices[name].tuned


def test_a_declined_chain_is_not_a_task(caplog):
    """Falcon-7B's MLP at 2048 rows, which the chain family declines (its GEMMs apart are
    predicted faster): no task, so no record of the chain's kernel replaces build's kernel per
    operator; the model's other function (a transpose) stays a task."""
    import tvm

    from tvm_dsm.hardware import load_hardware
    from tvm_dsm.meta_schedule.relax_tuning import tuning_tasks
    from tvm_dsm.workloads.chains import gemm_chain

    chain = gemm_chain(2048, 18176, 4544, 4544, activation="gelu")
    bb = relax.BlockBuilder()
    params = [relax.Var(p.name, R.Tensor([int(d) for d in p.ty.shape], "float16"))
              for p in chain.params[:-1]]
    with bb.function("main", params):
        with bb.dataflow():
            mlp = bb.add_func(chain.with_attr("global_symbol", "mlp"), "mlp")
            y = bb.emit(relax.call_tir(mlp, params, R.Tensor((2048, 4544), "float16")))
            out = bb.emit_output(relax.op.permute_dims(y))
        bb.emit_func_output(out)
    caplog.set_level("INFO", logger="tvm_dsm.meta_schedule.relax_tuning")
    names = [t.task_name for t in tuning_tasks(bb.get(), tvm.target.Target("nvidia/nvidia-h100"),
                                               load_hardware("h200_sxm"))]
    assert "mlp" not in names and names
    assert any("task mlp: not tuned" in r.message and "per operator" in r.message for r in caplog.records)
