"""Opening a tuning database: MetaSchedule's JSON database, made safe to reopen.

MetaSchedule's ``JSONDatabase`` appends one line per workload and per measured record. A tuning
process killed in the middle of such a write (SIGKILL, a lost machine) leaves a cut last line,
and the database then refuses to load at all ("Unexpected EOF"): every earlier record is lost
to the next run. :func:`open_database` drops such a cut last line (logged with its size) before
loading, and registers tvm-dsm's tensor intrinsics, which the records' traces name, so a fresh
process can read what another wrote and tuning resumes from it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tvm.s_tir import meta_schedule as ms

from .intrin import register_all

logger = logging.getLogger(__name__)

#: The files MetaSchedule's JSON database keeps in its work directory.
FILES = ("database_workload.json", "database_tuning_record.json")


def drop_cut_last_line(path: Path) -> int:
    """Remove the last line of ``path`` if it does not parse as JSON (a write cut short);
    returns the bytes removed. A bad line before the last is not a cut write and stays (the
    database's own error names it)."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    body = data.rstrip(b"\n")
    start = body.rfind(b"\n") + 1
    last = body[start:]
    if not last:
        return 0
    try:
        json.loads(last)
        return 0
    except ValueError:
        path.write_bytes(body[:start])
        return len(data) - start


def open_database(work_dir: str | Path) -> ms.database.JSONDatabase:
    """The JSON database in ``work_dir`` (created if absent), any write cut short by a killed
    process dropped first, with tvm-dsm's tensor intrinsics registered."""
    register_all()
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        dropped = drop_cut_last_line(work_dir / name)
        if dropped:
            logger.warning("%s: dropped a last line cut short (%d bytes) by a process killed while "
                           "writing it; every complete record is kept", work_dir / name, dropped)
    return ms.database.JSONDatabase(work_dir=str(work_dir))
