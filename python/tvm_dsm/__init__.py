"""tvm-dsm: thread-block clusters and distributed shared memory for TVM's schedulable TensorIR.

Importing it (or ``import tvm``, through the ``tvm.backends`` entry point) makes its pipeline TVM's
default s_tir pipeline. In runtime-only TVM (``TVM_USE_RUNTIME_LIB=1``, the GPU machine) only the
runtime helpers (:mod:`tvm_dsm.bench`, :mod:`tvm_dsm.gpu`) are usable.
"""

from __future__ import annotations

__version__ = "0.1.0"


def _autoload() -> None:
    """``tvm.backends`` entry point: importing the package registers it.

    Defined before ``import tvm`` because ``import tvm`` runs the entry points, and may do so while
    this module is only partially imported.
    """


import tvm  # noqa: E402

if not tvm.base._RUNTIME_ONLY:
    from . import schedule, transform  # noqa: F401
    from .errors import ClusterError  # noqa: F401
    from .intrin.device_counters import install as _install_device_counters
    from .pipeline import register_pipeline

    register_pipeline()
    _install_device_counters()

    def _relax_pipeline(**kwargs):
        """``relax.get_pipeline("tvm_dsm")``: :func:`tvm_dsm.relax_pipeline.tvm_dsm_pipeline`,
        imported on first use (it loads the driver and its tensor intrinsics)."""
        from .relax_pipeline import tvm_dsm_pipeline

        return tvm_dsm_pipeline(**kwargs)

    from tvm.relax import pipeline as _relax_pipelines

    if "tvm_dsm" not in _relax_pipelines.PIPELINE_MAP:
        _relax_pipelines.register_pipeline("tvm_dsm")(_relax_pipeline)

# One compile path for every CUDA module loaded from here on (TVM compiles CUDA source when a module
# is loaded): nvcc where it exists, else NVRTC, with the same options (tvm_dsm.compile_options;
# TVM_DSM_CUDA_COMPILE=tvm keeps TVM's own callback).
from .compile_cache import register_default as _register_compile  # noqa: E402

_register_compile()


def __getattr__(name: str):
    """The user entry points load on first use: they import TVM's tensor intrinsics, which take
    seconds to parse, and ``import tvm`` loads this package."""
    if name in ("plan", "tune", "build", "driver"):
        import importlib

        driver = importlib.import_module(".driver", __name__)
        return driver if name == "driver" else getattr(driver, name)
    if name == "relax_report":
        from .model_report import relax_report

        return relax_report
    if name == "schedule_dense":
        from .planners.split_k_gemm import schedule_dense

        return schedule_dense
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
