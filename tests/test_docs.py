"""Every Python block of the README and docs/ runs as written, each in a fresh process (the
GPU parts guard themselves with ``tvm_dsm.device.gpu_or_reason``)."""

from __future__ import annotations

import re
import subprocess
import sys
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


def test_readme_is_short_and_has_examples():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert len(BLOCK.findall(text)) >= 6


@pytest.mark.parametrize("code", _blocks())
def test_block_runs(code, tmp_path):
    script = tmp_path / "block.py"  # a file: TVMScript reads the source of what it parses
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
