"""Functions users wrote, as files: the protocol the GPU runner (:mod:`tvm_dsm.gpu.user_functions`)
and the tests read them by.

Each ``*.py`` of ``bench/user_functions`` defines ``make()`` (the PrimFunc, outputs its last
parameters), ``inputs(rng)`` (numpy arrays, one per input parameter), ``reference(*inputs)``
(numpy, in float64), ``torch_impl(*inputs)`` (the same in torch), ``SMALL`` (its constants at a
size the CPU checks quickly) and, over symbolic extents, ``SYMBOLIC = {name: [values]}`` (its
functions then take the value last).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
from tvm import tirx
from tvm.sym import Analyzer
from tvm.tirx.analysis import undefined_vars

from ..ir import substitute


def load_case(path: Path) -> ModuleType:
    """The file at ``path`` as a module."""
    spec = importlib.util.spec_from_file_location(f"user_function_{path.stem}", path)
    case = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(case)
    return case


def param_types(func) -> list:
    """Each parameter's tensor type (shape and dtype)."""
    return [p.ty for p in func.params]


def extents(types: list, arrays: list) -> dict[str, int]:
    """The symbolic extents' values, read off the input arrays' shapes."""
    return {dim.name: size for ty, a in zip(types, arrays) for dim, size in zip(ty.shape, np.shape(a))
            if isinstance(dim, tirx.Var)}


def shape_of(ty, values: dict[str, int]) -> list[int]:
    """A tensor type's shape, its symbolic extents at ``values`` (by name)."""
    analyzer = Analyzer()
    return [int(analyzer.simplify(substitute(dim, [(v, tirx.IntImm(str(v.ty), values[v.name]))
                                                   for v in undefined_vars(dim)])))
            for dim in ty.shape]
