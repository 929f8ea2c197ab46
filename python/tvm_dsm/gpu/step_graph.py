"""Experiment: the 1B Llama's decode step as one CUDA graph, every kernel of the step including
the KV cache's attention calls, beside the same step as the Relax VM runs it.

Relax's ``RewriteCUDAGraph`` never captures the KV cache's ``vm.builtin`` attention calls, so
a step is about 17 graph launches and 16 eager attention calls. Between them the GPU idles
about 0.2 ms a step in every configuration, TVM's own stack's too (``bench/results/llm``,
``idle_us_per_step``). Here a second build of the model, without the rewrite, has its whole
``decode`` call captured by CUDA stream capture on the stream the KV cache was created on; the
VM runs the first build (the rewrite on, as users run it). Capture
starts after the cache's per-step data is on the device: ``begin_forward``, then the read of
the query positions, which commits the cache's copy.

A graph stays valid while every sequence stays on its page: the cache's per-step arrays keep
their offsets, which the attention kernels take as arguments. So a graph is captured at a
page's first token and replayed for the rest of the page. Each replayed step's logits are
compared with the same step run by the VM on a second cache fed the same tokens.

``python -m tvm_dsm.gpu.step_graph --batches 1,8 --pages 2 --out step_graph.json`` (GPU
machine, full compiler).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from .llm import MODELS, PAGE_SIZE, _session, _versions, compile_config, logit_errors

#: cudaStreamCaptureModeRelaxed: other threads' CUDA calls stay legal during the capture.
CAPTURE_RELAXED = 2


class CudaGraphs:
    """The CUDA runtime's graph calls, on the ``libcudart`` TVM's CUDA runtime loaded."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcudart.so.13")
        self.lib.cudaGetErrorString.restype = ctypes.c_char_p

    def _check(self, code: int, what: str) -> None:
        if code:
            raise RuntimeError(f"{what}: {self.lib.cudaGetErrorString(code).decode()}")

    def capture(self, stream: int, body) -> ctypes.c_void_p:
        """``body()``'s work on ``stream`` as an instantiated graph (nothing runs)."""
        handle = ctypes.c_void_p(stream)
        self._check(self.lib.cudaStreamBeginCapture(handle, CAPTURE_RELAXED), "cudaStreamBeginCapture")
        graph = ctypes.c_void_p()
        try:
            result = body()
        finally:
            self._check(self.lib.cudaStreamEndCapture(handle, ctypes.byref(graph)), "cudaStreamEndCapture")
        executable = ctypes.c_void_p()
        self._check(self.lib.cudaGraphInstantiate(ctypes.byref(executable), graph, ctypes.c_ulonglong(0)),
                    "cudaGraphInstantiate")
        self._check(self.lib.cudaGraphDestroy(graph), "cudaGraphDestroy")
        return executable, result

    def launch(self, executable: ctypes.c_void_p, stream: int) -> None:
        self._check(self.lib.cudaGraphLaunch(executable, ctypes.c_void_p(stream)), "cudaGraphLaunch")

    def destroy(self, executable: ctypes.c_void_p) -> None:
        self._check(self.lib.cudaGraphExecDestroy(executable), "cudaGraphExecDestroy")


def run_batch(builds: dict, config, weights, batch: int, prompt_len: int, pages: int,
              rng: np.random.Generator) -> dict:
    """One page of VM steps on both caches (warming the captured session's allocator), then
    ``pages`` pages captured once each and replayed; wall times per step and logits errors.
    ``builds``: ``{"vm": (executable, info), "captured": (executable, info)}``."""
    import tvm

    dev = tvm.cuda(0)
    # a non-blocking stream (capture cannot use the legacy one): synchronize on it, as the
    # legacy stream does not wait for it
    stream = dev.create_raw_stream()
    dev.set_raw_stream(stream)  # the caches take the current stream as their compute stream
    steps = PAGE_SIZE * (1 + pages)
    vm, graphed = (_session(*builds[name], config, weights, batch, prompt_len, steps) for name in ("vm", "captured"))
    prompts = rng.integers(0, config.vocab_size, (batch, prompt_len))
    forced = rng.integers(0, config.vocab_size, (batch, steps)).astype(np.int32)
    for session in (vm, graphed):
        session.prefill(prompts)
    dev.sync(stream)
    positions = tvm.get_global_func("vm.builtin.attention_kv_cache_get_query_positions")
    graphs = CudaGraphs()
    tokens = tvm.runtime.tensor(np.ascontiguousarray(forced[:, :1]), dev)
    vm_ms, graph_ms, errors, captured, logits = [], [], [], None, None
    for step in range(steps):
        column = np.ascontiguousarray(forced[:, step:step + 1])
        token = tvm.runtime.tensor(column, dev)
        start = time.perf_counter()
        reference = vm.decode(token)
        dev.sync(stream)
        vm_ms.append((time.perf_counter() - start) * 1e3)
        # read now: the pool may hand the graph's intermediates' memory to this step's tensors
        reference = reference.numpy()
        if step < PAGE_SIZE:  # the allocator's pool filled before any capture
            graphed.decode(token)
            continue
        start = time.perf_counter()
        graphed.begin_decode()
        positions(graphed.cache)  # commits the cache's per-step copy, outside the graph
        tokens.copyfrom(column)
        first = step % PAGE_SIZE == 0
        if first:
            if captured is not None:
                graphs.destroy(captured)
            captured, (logits, _) = graphs.capture(
                stream, lambda: graphed.vm["decode"](tokens, graphed.cache, graphed.params))
        graphs.launch(captured, stream)
        graphed.end_forward()
        dev.sync(stream)
        if not first:
            graph_ms.append((time.perf_counter() - start) * 1e3)
        errors.append(logit_errors(logits.numpy(), reference)["rel_l2_max"])
    graphs.destroy(captured)
    del vm, graphed, logits
    dev.set_raw_stream(0)
    dev.free_raw_stream(stream)
    replayed_vm = vm_ms[PAGE_SIZE:]
    return {"vm_ms_per_step": round(float(np.median(replayed_vm)), 4),
            "graph_ms_per_step": round(float(np.median(graph_ms)), 4),
            "speedup": round(float(np.median(replayed_vm) / np.median(graph_ms)), 3),
            "logits_rel_err_max": float(max(errors)), "steps_replayed": len(graph_ms),
            "vm_ms_steps": [round(t, 3) for t in replayed_vm], "graph_ms_steps": [round(t, 3) for t in graph_ms]}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, default="1b")
    parser.add_argument("--config", default="tvm_dsm")
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",")], default=[1, 8])
    parser.add_argument("--prompt", type=int, default=512, help="a multiple of the page size")
    parser.add_argument("--pages", type=int, default=2, help="pages of steps captured and replayed")
    parser.add_argument("--out", default="step_graph.json")
    args = parser.parse_args(argv)
    if args.prompt % PAGE_SIZE:
        parser.error(f"--prompt must be a multiple of the page size ({PAGE_SIZE}): graphs start at a page's first token")
    import torch
    import tvm

    from ..bench.results import git_sha
    from ..workloads.llama import random_weights

    config = MODELS[args.model]
    folder = Path(tempfile.mkdtemp(prefix="tvm_dsm_step_graph_"))
    builds = {}
    for name, cuda_graph in (("vm", True), ("captured", False)):
        compile_config(args.config, config, folder / f"{name}.so", folder / f"{name}.json", cuda_graph=cuda_graph)
        builds[name] = (tvm.runtime.load_module(str(folder / f"{name}.so")),
                        json.loads((folder / f"{name}.json").read_text()))
    weights = random_weights(config)
    results = {"suite": "step_graph", "device": torch.cuda.get_device_name(0), "tvm_dsm": git_sha(),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "versions": _versions(), "config": args.config, "prompt_len": args.prompt,
               "timing": "host wall per decode step, device synchronized after it, median", "batches": {}}
    rng = np.random.default_rng(0)
    for batch in args.batches:
        try:
            results["batches"][str(batch)] = run_batch(builds, config, weights, batch, args.prompt, args.pages, rng)
        except Exception as err:  # noqa: BLE001  (recorded; the other batch sizes go on)
            results["batches"][str(batch)] = {"error": f"{type(err).__name__}: {err}"}
        print(batch, {k: v for k, v in results["batches"][str(batch)].items() if not k.endswith("steps")}, flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
