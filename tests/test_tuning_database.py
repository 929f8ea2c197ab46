"""A tuning database survives the tuning process being killed: a write cut short is dropped,
every complete record is kept, and a fresh process reads and extends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tvm
from tvm.s_tir import meta_schedule as ms

from tvm_dsm.tuning_database import FILES, drop_cut_last_line, open_database
from tvm_dsm.workloads.dense import dense

#: Commits one record after another into the database in argv[1], forever.
WRITER = """
import sys, tvm
from tvm.s_tir import meta_schedule as ms
from tvm_dsm.tuning_database import open_database
from tvm_dsm.workloads.dense import dense

func = dense(16, 64, 64, "float16").with_attr("global_symbol", "main")
mod = tvm.IRModule({"main": func})
database = open_database(sys.argv[1])
workload = database.commit_workload(mod)
trace = tvm.s_tir.Schedule(mod).trace
args = ms.arg_info.ArgInfo.from_prim_func(func)
target = tvm.target.Target("nvidia/nvidia-h100")
n = 0
while True:
    n += 1
    database.commit_tuning_record(ms.database.TuningRecord(trace, workload, [1e-6 * n], target, args))
"""


def _records(work_dir: Path) -> int:
    return len((work_dir / FILES[1]).read_bytes().splitlines()) if (work_dir / FILES[1]).exists() else 0


def _commit(database, n: int) -> None:
    func = dense(16, 64, 64, "float16").with_attr("global_symbol", "main")
    mod = tvm.IRModule({"main": func})
    workload = database.commit_workload(mod)
    trace = tvm.s_tir.Schedule(mod).trace
    for i in range(n):
        database.commit_tuning_record(ms.database.TuningRecord(
            trace, workload, [1e-6 * (i + 1)], tvm.target.Target("nvidia/nvidia-h100"),
            ms.arg_info.ArgInfo.from_prim_func(func)))


def test_a_record_cut_short_is_dropped_and_the_others_kept(tmp_path, caplog):
    _commit(open_database(tmp_path), 3)
    records = tmp_path / FILES[1]
    records.write_bytes(records.read_bytes() + records.read_bytes().splitlines()[0][:57])  # a cut write
    with pytest.raises(Exception, match="Unexpected EOF"):
        ms.database.JSONDatabase(work_dir=str(tmp_path))  # MetaSchedule's own loader refuses it
    with caplog.at_level("WARNING", logger="tvm_dsm.tuning_database"):
        database = open_database(tmp_path)
    assert len(database) == 3 and "dropped a last line cut short (57 bytes)" in caplog.text
    _commit(database, 1)  # and it goes on
    assert len(open_database(tmp_path)) == 4


def test_complete_and_empty_files_are_left_alone(tmp_path):
    path = tmp_path / "f.json"
    path.write_bytes(b'[1, 2]\n["a"]\n')
    assert drop_cut_last_line(path) == 0 and path.read_bytes() == b'[1, 2]\n["a"]\n'
    path.write_bytes(b"")
    assert drop_cut_last_line(path) == 0
    path.write_bytes(b'[1, 2]\n["a", {"b"\n')
    assert drop_cut_last_line(path) == len(b'["a", {"b"\n') and path.read_bytes() == b"[1, 2]\n"


def test_a_writer_killed_mid_run_loses_no_committed_record(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], env=env)
    deadline = time.time() + 120
    while _records(tmp_path) < 50 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    lines = (tmp_path / FILES[1]).read_bytes().splitlines()
    assert len(lines) >= 50
    complete = len(lines) - (drop_cut_last_line(tmp_path / FILES[1]) > 0)
    database = open_database(tmp_path)  # in this, a fresh process for the database
    assert len(database) == complete
    _commit(database, 2)  # tuning resumes into it
    assert len(open_database(tmp_path)) == complete + 2
