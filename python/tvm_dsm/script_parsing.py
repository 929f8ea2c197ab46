"""Parse TVMScript at import time without paying for the import system's frozen frames."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_frames_skipped() -> Iterator[None]:
    """While active, ``inspect.getmodule`` answers None for ``<frozen ...>`` files at once.

    TVMScript's ``T.prim_func`` calls ``inspect.stack()``, and for every frame whose file is not
    on disk, such as the import system's ``<frozen importlib...>`` frames, ``inspect.getmodule``
    scans all of ``sys.modules``. Parsing during an import therefore costs a scan per frozen
    frame: importing TVM's ~500 tensor intrinsics took 48 s on the 2-core CI machine, about
    10 s with this. Frozen modules have no source to find, so no frame info changes.
    """
    getmodule = inspect.getmodule

    def skip_frozen(obj, _filename=None):
        return None if (_filename or "").startswith("<frozen ") else getmodule(obj, _filename)

    inspect.getmodule = skip_frozen
    try:
        yield
    finally:
        inspect.getmodule = getmodule
