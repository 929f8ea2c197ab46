"""Parse TVMScript without paying for the frames of files that are not on disk."""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")


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


def on_a_shallow_stack(call: Callable[[], T]) -> T:
    """``call()`` run from a fresh thread with pseudo-files' frames skipped
    (:func:`pseudo_files_skipped`), its exception raised here: TVMScript parsing calls
    ``inspect.stack()``, whose cost grows with the caller's stack, so the TVMScript a call
    imports or parses (TVM's ~500 tensor intrinsics, which dlight's matmul rule imports on its
    first tensor-core schedule) costs less from a fresh thread: from a deep stack (a test
    runner, a Relax pass, a lazy attribute) that import took 150 s instead of 48, and 10 s with
    frozen frames skipped. Thread-local state (the current target) is the caller's to re-enter."""
    result: list = []

    def run() -> None:
        try:
            result.append((True, call()))
        except BaseException as err:  # noqa: BLE001  (raised again in the caller's thread)
            result.append((False, err))

    with pseudo_files_skipped():
        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value
