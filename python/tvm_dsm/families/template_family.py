"""The schedule family of a kernel template (:class:`~tvm_dsm.kernels.template.KernelTemplate`):
it takes a function where the template finds its operation and some configuration fits, ranks
the template's configurations by the family's own roofline (:meth:`TemplateFamily.predict`)
with the template's default first, and applies one as the template's kernel."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from tvm import s_tir, tirx

from ..hardware import Hardware
from ..kernels.template import KernelTemplate
from .base import ScheduleFamily
from .kernel_plan import KernelPlan, default_first


class TemplateFamily(ScheduleFamily):
    """A family over ``template``; subclasses set ``name`` and ``template`` and implement
    ``predict``."""

    traced = False  # the kernel is written from a template, not a trace of the function
    template: KernelTemplate

    def recognize(self, func: tirx.PrimFunc) -> Any:
        """What the template finds in ``func``, where one of its configurations fits (the fused
        rows of :mod:`.fused_cascade` take the cascades none fits)."""
        found = self.template.find(func)
        self.template.configs(found)
        return found

    @abstractmethod
    def predict(self, found: Any, config: Any, hw: Hardware) -> KernelPlan:
        """The roofline plan of one configuration."""

    def rank(self, found: Any, hw: Hardware) -> list[KernelPlan]:
        """Every configuration of the template, its default for ``hw`` first (measured fastest
        on the GPU, an order the roofline does not resolve), the others by prediction."""
        default = self.template.default_config(found, hw)
        configs = dict.fromkeys((default, *self.template.configs(found)))
        return default_first([self.predict(found, c, hw) for c in configs], default)

    def apply(self, func: tirx.PrimFunc, config: Any, hw: Hardware) -> s_tir.Schedule:
        return s_tir.Schedule(self.template.fuse(func, config, hw))
