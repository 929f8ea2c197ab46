"""A frame the kernels written with TVM's IRBuilder share."""

from __future__ import annotations

from tvm.tirx.script.builder import ir as B


class Guarded:
    """``with B.If(cond): with B.Then():`` as one frame; no frame where ``cond`` is None."""

    def __init__(self, cond):
        self.cond, self.frames = cond, []

    def __enter__(self):
        if self.cond is not None:
            self.frames = [B.If(self.cond), B.Then()]
            for frame in self.frames:
                frame.__enter__()

    def __exit__(self, *exc):
        for frame in reversed(self.frames):
            frame.__exit__(*exc)
