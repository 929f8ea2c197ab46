"""Tensor intrinsics tvm-dsm's schedules tensorize with: mma.sync (TVM's, plus a DSM store and
fp8 loads) and warpgroup MMAs. Each registers on first use, so planning never pays for TVMScript
parsing; :func:`register_all` registers every one a tuning record may name, for a process that
replays records without scheduling first."""

from __future__ import annotations

import functools


@functools.cache
def register_all() -> None:
    """Register every tensor intrinsic a tvm-dsm schedule may name (a few seconds, once)."""
    from . import mma, wgmma

    mma.library()
    wgmma.register_planned()


@functools.cache
def import_tvm_intrinsics() -> None:
    """Import TVM's whole tensor-intrinsic package the fast way (see :func:`.mma._import_shallow`):
    MetaSchedule's ``TuneContext`` imports it, from whatever stack it is created on."""
    from .mma import _import_shallow

    _import_shallow("tvm.s_tir.tensor_intrin")
