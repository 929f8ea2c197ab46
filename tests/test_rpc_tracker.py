"""Measuring through TVM's RPC tracker (``tvm_dsm.meta_schedule.rpc``), on this machine's CPU: a
local tracker, two RPC servers registered with it under one key, and a real candidate built by
MetaSchedule's LocalBuilder and timed on a server by TVM's RPCRunner."""

from __future__ import annotations

import socket
import time

import pytest
import tvm
from tvm import te
from tvm.rpc.server import Server
from tvm.rpc.tracker import Tracker
from tvm.s_tir import meta_schedule as ms

from tvm_dsm.cli import _runner, main, parser
from tvm_dsm.meta_schedule.rpc import rpc_runner, rpc_servers, tracker_address

KEY = "cpu-test"
SERVERS = 2
#: Port ranges away from the tracker's default (9190), where a real tracker may be listening.
TRACKER_PORTS = (19190, 19290)
SERVER_PORTS = (19300, 19400)


def _workers(runner: ms.runner.RPCRunner) -> int:
    """How many candidates ``runner`` has in flight at most (its pool's threads)."""
    return runner.pool._threadpool._max_workers


@pytest.fixture(scope="module")
def tracker():
    """``"HOST:PORT"`` of a local tracker with SERVERS servers of KEY registered (polled until
    the tracker lists them); all of them terminated afterwards."""
    tracker = Tracker(host="127.0.0.1", port=TRACKER_PORTS[0], port_end=TRACKER_PORTS[1], silent=True)
    servers = []
    try:
        servers = [Server(host="127.0.0.1", port=SERVER_PORTS[0], port_end=SERVER_PORTS[1], key=KEY,
                          tracker_addr=("127.0.0.1", tracker.port), silent=True)
                   for _ in range(SERVERS)]
        address = f"127.0.0.1:{tracker.port}"
        deadline = time.monotonic() + 10
        while rpc_servers(address, KEY) < SERVERS:
            assert time.monotonic() < deadline, "the RPC servers did not register with the tracker within 10 s"
            time.sleep(0.05)
        yield address
    finally:
        for server in servers:
            server.terminate()
        tracker.terminate()


def test_the_tracker_counts_the_servers_of_a_key(tracker):
    assert rpc_servers(tracker, KEY) == SERVERS
    assert rpc_servers(tracker, "h100") == 0


def test_no_tracker_is_said_at_once():
    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=f"no RPC tracker answers at 127.0.0.1:{port}"):
        rpc_servers(f"127.0.0.1:{port}", KEY)
    assert time.monotonic() - start < 2


def test_tracker_address_needs_host_and_port():
    assert tracker_address("10.0.0.1:9190") == ("10.0.0.1", 9190)
    for wrong in ("10.0.0.1", "10.0.0.1:", ":9190", "host:port"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            tracker_address(wrong)


def test_a_key_without_servers_is_refused_before_tuning(tracker):
    with pytest.raises(ValueError, match="no server registered under key 'h100'"):
        rpc_runner(tracker, "h100")
    with pytest.raises(SystemExit, match="^tvm-dsm tune: the RPC tracker at .* no server registered under key 'h100'"):
        main(["tune", "dense", "128", "1024", "1024", "db", "--rpc-tracker", tracker, "--rpc-key", "h100"])


def test_a_candidate_is_measured_on_a_server(tracker):
    """An llvm vector add built by LocalBuilder, uploaded, linked, loaded and timed on one of the
    tracker's servers by TVM's RPCRunner (one worker per server)."""

    def compile_only(mod, target, _params):
        """MetaSchedule's default build step less its import of every TVM tensor intrinsic (16 s
        on a 2-core machine), which a vector add does not use."""
        return tvm.compile(mod, target).mod

    n = 1 << 16
    a = te.placeholder((n,), "float32", name="a")
    b = te.placeholder((n,), "float32", name="b")
    c = te.compute((n,), lambda i: a[i] + b[i], name="c")
    func = te.create_prim_func([a, b, c])
    builder = ms.builder.LocalBuilder(f_build=compile_only, max_workers=1)
    (built,) = builder.build([ms.builder.BuilderInput(tvm.IRModule({"main": func}), tvm.target.Target("llvm"))])
    assert built.error_msg is None, built.error_msg

    runner = rpc_runner(tracker, KEY)
    assert isinstance(runner, ms.runner.RPCRunner) and _workers(runner) == SERVERS
    args_info = ms.arg_info.ArgInfo.from_prim_func(func)
    (future,) = runner.run([ms.runner.RunnerInput(built.artifact_path, "cpu", args_info)])
    result = future.result()
    assert result.error_msg is None, result.error_msg
    seconds = [float(s) for s in result.run_secs]
    assert len(seconds) == runner.evaluator_config.repeat
    assert all(0 < s < 0.05 for s in seconds), seconds


def test_the_tune_commands_rpc_options_give_an_rpc_runner(tracker):
    args = parser().parse_args(["tune", "dense", "128", "1024", "1024", "db", "--rpc-tracker", tracker,
                                "--rpc-key", KEY])
    runner = _runner(args)
    assert isinstance(runner, ms.runner.RPCRunner)
    assert runner.rpc_config.tracker_port == int(tracker.rpartition(":")[2])
    assert runner.rpc_config.tracker_key == KEY
    assert _workers(runner) == SERVERS


def test_the_tune_command_without_a_tracker_measures_on_this_machine():
    assert _runner(parser().parse_args(["tune", "dense", "128", "1024", "1024", "db"])) is None


def test_a_tracker_without_a_key_is_refused():
    args = parser().parse_args(["tune", "dense", "128", "1024", "1024", "db", "--rpc-tracker", "127.0.0.1:9190"])
    with pytest.raises(SystemExit, match="--rpc-tracker needs --rpc-key"):
        _runner(args)


def test_a_hung_candidate_is_timed_out_and_the_next_is_measured(tracker):
    """A kernel that never returns (as a cluster-barrier deadlock would) is cut at the session
    timeout and reported failed; the servers then measure the next candidate."""
    from tvm.script import tirx as T

    @T.prim_func
    def spin(a: T.Buffer((1,), "int32")):
        while a[0] >= 0:
            a[0] = (a[0] + 1) % 2

    n = 1024
    x = te.placeholder((n,), "float32", name="x")
    good = te.create_prim_func([x, te.compute((n,), lambda i: x[i] * 2.0, name="y")])
    builder = ms.builder.LocalBuilder(f_build=lambda mod, target, _: tvm.compile(mod, target).mod, max_workers=1)
    built = builder.build([ms.builder.BuilderInput(tvm.IRModule({"main": f}), tvm.target.Target("llvm"))
                           for f in (spin, good)])
    assert all(b.error_msg is None for b in built), [b.error_msg for b in built]
    runner = rpc_runner(tracker, KEY, max_workers=1, session_timeout_sec=3)
    start = time.monotonic()
    hung, measured = (runner.run([ms.runner.RunnerInput(b.artifact_path, "cpu", ms.arg_info.ArgInfo.from_prim_func(f))])[0]
                      for b, f in zip(built, (spin, good), strict=True))
    assert hung.result().error_msg and "timeout" in hung.result().error_msg.lower(), hung.result().error_msg
    assert measured.result().error_msg is None, measured.result().error_msg
    assert time.monotonic() - start < 30
