"""Parse TVMScript without paying for the frames of files that are not on disk."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator


@contextlib.contextmanager
def pseudo_files_skipped() -> Iterator[None]:
    """While active, ``inspect.getmodule`` answers None at once for a frame or code object of a
    pseudo-file: ``<frozen ...>`` (the import system), ``<ast>`` (the expressions TVMScript's
    parser compiles and evaluates), ``<string>``.

    TVMScript's ``T.prim_func``, and its builder calls made from those expressions, call
    ``inspect.stack()``, and for every frame whose file is not on disk ``inspect.getmodule``
    scans all of ``sys.modules``: importing TVM's ~500 tensor intrinsics took 48 s on the 2-core
    CI machine, about 10 s with frozen frames skipped, and the ``<ast>`` frames cost a scan
    apiece too. Such a file has no module (no module's ``__file__`` is a pseudo-file), so the
    scan ends in None for these objects anyway: no frame info changes. Objects that name their
    module (functions, classes) and modules are looked up as before.
    """
    getmodule = inspect.getmodule

    def skip_pseudo_files(obj, _filename=None):
        if (_filename or "").startswith("<") and not inspect.ismodule(obj) and not hasattr(obj, "__module__"):
            return None
        return getmodule(obj, _filename)

    inspect.getmodule = skip_pseudo_files
    try:
        yield
    finally:
        inspect.getmodule = getmodule
