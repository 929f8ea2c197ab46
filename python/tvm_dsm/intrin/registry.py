"""Tensor intrinsics registered on first use, once, from any thread (MetaSchedule runs
postprocessors, which schedule with them, on several threads at a time)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from tvm.s_tir import TensorIntrin

_LOCK = threading.Lock()


def register_once(name: str, make: Callable[[], tuple]) -> str:
    """``name``, registered with ``make()``'s (desc, impl) unless it already is."""
    with _LOCK:
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *make())
    return name
