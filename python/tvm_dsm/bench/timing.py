"""GPU timing the same way for every contender: CUDA events around CUDA-graph replays.

Each contender's calls are captured into one graph, cycling through input sets whose total size
exceeds L2, so replays read from HBM rather than from the cache; at least ``MIN_CALLS_PER_GRAPH``
calls, so that the latency of launching the graph itself is shared by many calls as in a model's
captured step. The graph is replayed many times after warm-up and the median time per call is
reported. Python-call latency (host time to issue one call, without the graph) is measured
separately.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

try:  # TVM launches on tvm-ffi's current stream: point it at torch's (the capture stream).
    from tvm_ffi import use_torch_stream
except ImportError:  # pragma: no cover - tvm-ffi without torch integration
    use_torch_stream = None

L2_BYTES = 50 * 1024 * 1024
#: A graph replay starts its first kernel microseconds after the replay is issued; over the two
#: calls of a kernel reading hundreds of MB that would add several percent to each
#: (bench/results/archive/graph_calls.json).
MIN_CALLS_PER_GRAPH = 20
#: Seconds of replays a contender may take, and the fewest replays whose median is reported.
BUDGET_S, MIN_REPLAYS = 5.0, 5


def input_sets_for(bytes_per_call: int, *, cap: int = 64) -> int:
    """How many input sets to rotate so that one graph replay overflows L2 twice."""
    return max(2, min(cap, -(-2 * L2_BYTES // max(bytes_per_call, 1))))


def _on_torch_stream(step: Callable[[int], None], i: int) -> None:
    if use_torch_stream is None:
        step(i)
    else:
        with use_torch_stream():
            step(i)


def graph_time_us(step: Callable[[int], None], n_sets: int, *, replays: int = 50,
                  calls: int | None = None, budget_s: float = BUDGET_S) -> float:
    """Median GPU time of ``step(i)`` (one call on input set i) under CUDA-graph replay, in us:
    ``calls`` calls per graph (default: ``n_sets``, at least ``MIN_CALLS_PER_GRAPH``), set i
    for call i mod ``n_sets``. A call slow enough that the replays would take over ``budget_s``
    gets fewer replays (at least ``MIN_REPLAYS``), then fewer calls a graph: a millisecond
    call's time no longer depends on L2 or on the graph's launch."""
    calls = calls or max(n_sets, MIN_CALLS_PER_GRAPH)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(n_sets):  # warm-up: module load, JIT, allocator, torch.compile
            _on_torch_stream(step, i)
        torch.cuda.synchronize()
        began = time.perf_counter()
        _on_torch_stream(step, 0)
        torch.cuda.synchronize()
    call_s = time.perf_counter() - began
    replays = max(MIN_REPLAYS, min(replays, int(budget_s / (call_s * calls))))
    calls = max(1, min(calls, int(budget_s / (call_s * (replays + 3)))))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            _on_torch_stream(step, i % n_sets)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    return statistics.median(samples)


def python_call_us(call: Callable[[], None], *, calls: int = 200) -> float:
    """Host time to issue one call from Python (launch overhead), in us."""
    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / calls
