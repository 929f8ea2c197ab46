"""tvm-dsm: thread-block clusters and distributed shared memory for TVM's schedulable TensorIR.

Importing it (or ``import tvm``, through the ``tvm.backends`` entry point) makes its pipeline TVM's
default s_tir pipeline. In runtime-only TVM (``TVM_USE_RUNTIME_LIB=1``, the GPU machine) only the
runtime helpers (:mod:`tvm_dsm.bench`, :mod:`tvm_dsm.gpu`) are usable.
"""

from __future__ import annotations

import tvm

__version__ = "0.1.0"

if not tvm.base._RUNTIME_ONLY:
    from . import schedule, transform
    from .errors import ClusterError
    from .pipeline import register_pipeline

    register_pipeline()


def _autoload() -> None:
    """``tvm.backends`` entry point: importing the package is the registration."""
