"""Measuring on other machines' GPUs: TVM's RPC tracker and MetaSchedule's RPCRunner.

One tracker (``python -m tvm.exec.rpc_tracker``) and one RPC server per GPU registered with it
under a key (``python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY``); the tuning machine
builds every candidate and the runner sends each to a free server of that key, one candidate in
flight per server. ``docs/rpc.md`` gives the commands.
"""

from __future__ import annotations

import socket

from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig

from ..local_measure import GPU_EVALUATOR

#: Seconds a server may hold one candidate's session: upload, linking the builder's tar into a
#: shared library (g++ on the server), compiling its CUDA source when it loads (nvcc or NVRTC on
#: the server: seconds per module), filling the arguments and timing. A session
#: over this is killed and the candidate reported failed.
SESSION_TIMEOUT_S = 60

#: Seconds to wait for the tracker to accept a connection before saying none answers.
CONNECT_TIMEOUT_S = 5


def tracker_address(tracker: str) -> tuple[str, int]:
    """``"HOST:PORT"`` as ``(host, port)``; ValueError naming the expected form otherwise."""
    host, _, port = tracker.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"an RPC tracker is HOST:PORT (e.g. 10.0.0.1:9190), not {tracker!r}")
    return host, int(port)


def rpc_servers(tracker: str, key: str) -> int:
    """How many RPC servers the tracker at ``"HOST:PORT"`` has registered under ``key`` (busy or
    free); ConnectionError at once where no tracker answers there (TVM's own client retries a
    refused connection for a minute)."""
    host, port = tracker_address(tracker)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise ConnectionError(f"no RPC tracker answers at {tracker}: {err}") from None
    return RPCConfig(host, port, key).count_num_servers(allow_missing=True)


def rpc_runner(tracker: str, key: str, *, max_workers: int | None = None,
               evaluator_config: EvaluatorConfig = GPU_EVALUATOR,
               session_timeout_sec: int = SESSION_TIMEOUT_S) -> ms.runner.RPCRunner:
    """TVM's RPCRunner measuring on the servers the tracker at ``"HOST:PORT"`` holds under
    ``key``, ``max_workers`` candidates at a time: by default one per server registered now
    (ValueError where there is none: each candidate would wait for one forever)."""
    host, port = tracker_address(tracker)
    if max_workers is None:
        max_workers = rpc_servers(tracker, key)
        if max_workers == 0:
            raise ValueError(f"the RPC tracker at {tracker} has no server registered under key {key!r} "
                             f"(python -m tvm.exec.query_rpc_tracker --host {host} --port {port} lists them)")
    return ms.runner.RPCRunner(
        RPCConfig(host, port, key, session_timeout_sec=session_timeout_sec),
        evaluator_config=evaluator_config, max_workers=max_workers)
