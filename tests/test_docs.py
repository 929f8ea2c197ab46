"""Every Python block of the README and docs/ runs as written, each in a fresh process (the
GPU parts guard themselves with ``tvm_dsm.device.gpu_or_reason``).

Each block runs in a process forked from one server that has imported tvm_dsm and registered
its tensor intrinsics (:func:`_serve`): a block's process starts as a fresh one that did only
that, without paying seconds of imports and TVMScript parsing per block."""

from __future__ import annotations

import multiprocessing
import os
import re
import runpy
import sys
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks() -> list:
    found = []
    for doc in DOCUMENTS:
        text = doc.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append(pytest.param(match.group(1), id=f"{doc.relative_to(ROOT)}:{line}"))
    return found


def _serve(connection) -> None:
    """Import tvm_dsm and register its intrinsics, then run each script path received in a
    forked child (its working directory the script's folder, its stderr to ``<script>.err``),
    answering with the child's exit status; ``None`` ends the server."""
    import tvm_dsm.intrin

    tvm_dsm.intrin.register_all()
    while (script := connection.recv()) is not None:
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                os.chdir(Path(script).parent)
                err = os.open(f"{script}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(err, 2)
                sys.argv = [script]
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:  # noqa: BLE001 - the block's failure, reported as a process's
                traceback.print_exc()
                status = 1
            sys.stderr.flush()
            os._exit(status)
        connection.send(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))


@pytest.fixture(scope="module")
def run_script():
    """Run a script file in a process forked from the server (:func:`_serve`): (exit status,
    stderr)."""
    parent, child = multiprocessing.get_context("spawn").Pipe()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(child,), daemon=True)
    server.start()

    def run(script: Path) -> tuple[int, str]:
        parent.send(str(script))
        status = parent.recv()
        return status, Path(f"{script}.err").read_text()

    yield run
    parent.send(None)
    server.join(timeout=60)


def test_readme_is_short_and_has_examples():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert len(BLOCK.findall(text)) >= 6


@pytest.mark.parametrize("code", _blocks())
def test_block_runs(code, tmp_path, run_script):
    script = tmp_path / "block.py"  # a file: TVMScript reads the source of what it parses
    script.write_text(code)
    status, stderr = run_script(script)
    assert status == 0, stderr[-3000:]
