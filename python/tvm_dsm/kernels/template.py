"""What a kernel template is: an operation found by meaning in a PrimFunc and one whole CUDA
kernel written for it in TIR, in one of a few configurations.

Each template says what is its own: how it finds its operation (``find``, what the kernel takes
from the function), which configurations fit what it found (``configs``, ``check``), which one
was measured fastest on a GPU (``default_config``) and the kernel of one (``kernel``).
:meth:`KernelTemplate.fuse` joins them into the module a user compiles, and
:class:`tvm_dsm.families.template_family.TemplateFamily` into a schedule family.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import tvm
from tvm import tirx

from ..hardware import Hardware


class KernelTemplate(ABC):
    """One kernel template (see the module docstring)."""

    @abstractmethod
    def find(self, func: tirx.PrimFunc) -> Any:
        """What the kernel takes from ``func``; ClusterError saying what does not match."""

    @abstractmethod
    def configs(self, found: Any) -> list[Any]:
        """The configurations a family ranks for ``found``, each one that fits; ClusterError
        naming the limit where none does."""

    @abstractmethod
    def default_config(self, found: Any, hw: Hardware) -> Any:
        """The configuration measured fastest for ``found`` on the GPU ``hw`` describes."""

    @abstractmethod
    def check(self, found: Any, config: Any) -> None:
        """ClusterError naming the first constraint ``config`` breaks on ``found``."""

    @abstractmethod
    def kernel(self, found: Any, config: Any) -> tirx.PrimFunc:
        """The kernel of ``found`` in ``config`` (a checked one)."""

    def fuse(self, func: tirx.PrimFunc, config: Any = None, hw: Hardware | None = None) -> tvm.IRModule:
        """The kernel of ``func`` in ``config``, or in :meth:`default_config`'s for ``hw`` (the
        templates whose default sizes its grid by the GPU's SMs need it then)."""
        found = self.find(func)
        config = self.default_config(found, hw) if config is None else config
        self.check(found, config)
        return tvm.IRModule({"main": self.kernel(found, config)})
