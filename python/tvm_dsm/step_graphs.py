"""A step function replayed from CUDA graphs: a serving loop's decode call, captured on a stream
once per layout of the data its kernels take by address, then launched as one graph a step.

A decode step of a Relax model with ``nn.llm``'s KV cache is about 160 kernel launches, and
Relax's ``RewriteCUDAGraph`` cannot capture the KV cache's ``vm.builtin`` attention calls, so
the GPU idles between them while the host prepares the next launch (about 0.2 ms a step on a
1B Llama, every configuration, TVM's own stack's too). Captured whole, the step is one graph
launch (``bench/results/archive/step_graph.json``: 1.05 against 1.70 ms a step at batch 1).

A graph bakes in every kernel's arguments: buffer addresses and the scalar extents of symbolic
shapes. A step may be replayed while they stay the same; the caller names that state with a
*key* (for ``nn.llm``'s cache: the batch size and the pages in use, which fix where its per-step
arrays sit in its device buffer and their extents; their contents, copied before the launch,
may change). :class:`StepGraphs` runs a new key's first steps eagerly, captures the step once
the key has held ``settle`` steps, and replays it while the key holds, so layouts that change
every step or two (sequences of many lengths crossing pages) cost no captures.
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import tvm

#: cudaStreamCaptureModeRelaxed: calls that are unsafe during a capture stay legal, as the VM's
#: memory pool allocating while the step is captured.
_CAPTURE_RELAXED = 2
_CUDART = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
#: cudaMemcpyDefault: the copy's direction inferred from the addresses (unified addressing).
_COPY_INFERRED = 4


def _nbytes(tensor: tvm.runtime.Tensor) -> int:
    return tensor.numel() * tvm.runtime.DataType(str(tensor.dtype)).itemsize


class _UpdateResult(ctypes.Structure):
    """cudaGraphExecUpdateResultInfo: why an update was refused (unread: refused is enough)."""

    _fields_ = [("result", ctypes.c_int), ("error_node", ctypes.c_void_p), ("error_from_node", ctypes.c_void_p)]


class CudaGraphs:
    """Stream capture, instantiation and launch of CUDA graphs, through the CUDA runtime library
    (the first of :data:`_CUDART` found: the CUDA 13 one TVM 0.27's wheel links)."""

    def __init__(self):
        for name in _CUDART:
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise OSError(f"no CUDA runtime library found (tried {', '.join(_CUDART)})")
        self.lib.cudaGetErrorString.restype = ctypes.c_char_p

    def _check(self, code: int, what: str) -> None:
        if code:
            raise RuntimeError(f"{what}: {self.lib.cudaGetErrorString(code).decode()}")

    def capture(self, stream: int, body: Callable[[], Any],
                reuse: ctypes.c_void_p | None = None) -> tuple[ctypes.c_void_p, Any]:
        """``body()``'s work on ``stream`` as an executable graph (nothing runs), and what
        ``body`` returned. ``reuse``: an executable graph no longer needed, updated in place to
        the new one where their nodes match (a step of another layout: the same kernels, other
        arguments), else destroyed."""
        handle = ctypes.c_void_p(stream)
        self._check(self.lib.cudaStreamBeginCapture(handle, _CAPTURE_RELAXED), "cudaStreamBeginCapture")
        graph = ctypes.c_void_p()
        try:
            result = body()
        except BaseException:
            if reuse is not None:
                self.destroy(reuse)
            raise
        finally:
            self._check(self.lib.cudaStreamEndCapture(handle, ctypes.byref(graph)), "cudaStreamEndCapture")
        try:
            if reuse is not None:
                if not self.lib.cudaGraphExecUpdate(reuse, graph, ctypes.byref(_UpdateResult())):
                    return reuse, result
                self.lib.cudaGetLastError()  # an update refused is not an error of later calls
                self.destroy(reuse)
            executable = ctypes.c_void_p()
            self._check(self.lib.cudaGraphInstantiate(ctypes.byref(executable), graph, ctypes.c_ulonglong(0)),
                        "cudaGraphInstantiate")
        finally:
            self._check(self.lib.cudaGraphDestroy(graph), "cudaGraphDestroy")
        return executable, result

    def launch(self, executable: ctypes.c_void_p, stream: int) -> None:
        self._check(self.lib.cudaGraphLaunch(executable, ctypes.c_void_p(stream)), "cudaGraphLaunch")

    def copy(self, target: tvm.runtime.Tensor, source: tvm.runtime.Tensor, stream: int) -> None:
        """``source``'s elements into ``target`` (same type and size, each on the device or the
        host) in ``stream``'s order: the host does not wait for it, and work launched on
        ``stream`` after it reads the copy."""
        self._check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(target.data_ptr()), ctypes.c_void_p(source.data_ptr()),
                                             ctypes.c_size_t(_nbytes(source)), _COPY_INFERRED,
                                             ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def destroy(self, executable: ctypes.c_void_p) -> None:
        self._check(self.lib.cudaGraphExecDestroy(executable), "cudaGraphExecDestroy")


class StepGraphs:
    """``step(key, call)``: ``call()``'s result, eagerly for the first ``settle`` steps of a key,
    then from a graph captured on ``stream`` and replayed while the key holds (the last ``keep``
    keys' graphs kept). A key that follows one held ``stable`` steps or more is captured at its
    first step: layouts change seldom there (a batch decoding together crosses a page every
    page's worth of steps), and each eager step costs more than a replay (H200, 1B Llama,
    batch 8 at 2048 keys: 1.31 against 1.12 ms). Past ``keep`` graphs the oldest is updated to
    the new capture where its nodes match (0.03 ms against 0.19 to instantiate one). ``call``
    must launch all its work on ``stream`` and read its inputs from the same tensors every step;
    a replay writes the tensors the captured call returned, so a step's result is valid until
    the next step."""

    def __init__(self, stream: int, settle: int = 2, keep: int = 4, stable: int = 8,
                 graphs: CudaGraphs | None = None):
        if settle < 0 or keep < 1 or stable < 1:
            raise ValueError(f"settle >= 0, keep >= 1 and stable >= 1 (not {settle}, {keep}, {stable})")
        self.stream, self.settle, self.keep, self.stable = stream, settle, keep, stable
        self.graphs = graphs or CudaGraphs()
        self.captured: OrderedDict[Hashable, tuple[ctypes.c_void_p, Any]] = OrderedDict()
        self.counts = {"eager": 0, "captured": 0, "replayed": 0}
        self._key, self._held, self._settled = None, 0, False

    def step(self, key: Hashable, call: Callable[[], Any]) -> Any:
        if key != self._key:
            self._settled = self._held >= self.stable
            self._key, self._held = key, 0
        self._held += 1
        if key in self.captured:
            self.captured.move_to_end(key)
            executable, result = self.captured[key]
            self.counts["replayed"] += 1
        elif self._held <= self.settle and not self._settled:
            self.counts["eager"] += 1
            return call()
        else:
            reuse = self.captured.popitem(last=False)[1][0] if len(self.captured) >= self.keep else None
            executable, result = self.graphs.capture(self.stream, call, reuse)
            self.captured[key] = executable, result
            self.counts["captured"] += 1
        self.graphs.launch(executable, self.stream)
        return result

    def close(self) -> None:
        """Destroy every graph kept."""
        while self.captured:
            self.graphs.destroy(self.captured.popitem()[1][0])


class PagedDecodeGraphs:
    """``decode(tokens, cache, params)``: a Relax VM decode function over ``nn.llm``'s paged KV
    cache, its steps replayed by :class:`StepGraphs` on ``stream`` (the cache created while
    ``stream`` was the thread's current stream, the model compiled without Relax's CUDA-graph
    rewrite, whose own captures cannot nest in these). Call it between the cache's
    ``begin_forward`` and ``end_forward``, as the function itself; synchronize ``stream``
    before reading the result. The key (the tokens' shape and the pages in use) fixes the layout
    of the cache's per-step arrays only where every sequence of the cache takes part in every
    step and none is forked, as in a batch decoding together. ``tokens`` are copied in
    ``stream``'s order, so they must be complete there: written before the call (a copy from
    the host) or by work on ``stream`` (a sampler of the last step's logits)."""

    def __init__(self, function, device, stream: int, **settings):
        self.function, self.device = function, device
        self.graphs = StepGraphs(stream, **settings)
        self.counts = self.graphs.counts  # eager, captured and replayed steps
        self._inputs: dict[tuple[int, ...], tvm.runtime.Tensor] = {}
        self._commit = tvm.get_global_func("vm.builtin.attention_kv_cache_get_query_positions")
        self._pages = tvm.get_global_func("vm.builtin.attention_kv_cache_get_num_available_pages")

    def __call__(self, tokens, cache, params):
        # the previous step's graph reads the held tokens and the cache's per-step arrays, which
        # this step rewrites from other streams
        self.device.sync(self.graphs.stream)
        # the cache copies this step's page tables and positions to the device now, on its copy
        # stream, so that no graph holds the copy
        self._commit(cache)
        shape = tuple(int(d) for d in tokens.shape)
        if shape not in self._inputs:
            self._inputs[shape] = tvm.runtime.empty(shape, tokens.dtype, self.device)
        held = self._inputs[shape]
        self.graphs.graphs.copy(held, tokens, self.graphs.stream)  # ahead of the step's kernels
        key = (shape, int(self._pages(cache)))  # fixes the extents and offsets of the per-step arrays
        return self.graphs.step(key, lambda: self.function(held, cache, params))

    def close(self) -> None:
        self.graphs.close()
