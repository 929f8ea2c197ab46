"""Decode steps replayed from CUDA graphs (tvm_dsm.step_graphs): a key's first steps eager, one
capture once it holds, replays while it holds; on the GPU, a tiny Llama's steps from graphs give
the same logits as the VM's, sequences of two lengths crossing pages."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_dsm.step_graphs import StepGraphs


class _Recorder:
    """CudaGraphs' calls recorded; a capture runs the body (as the CUDA runtime runs the host
    part of captured work) and returns a numbered graph."""

    def __init__(self, updates: bool = True):
        self.calls: list[tuple[str, int]] = []
        self.made, self.updates = 0, updates

    def capture(self, stream, body, reuse=None):
        result = body()
        if reuse is not None and self.updates:
            self.calls.append(("update", reuse))
            return reuse, result
        if reuse is not None:
            self.destroy(reuse)
        self.made += 1
        self.calls.append(("capture", self.made))
        return self.made, result

    def launch(self, executable, stream):
        self.calls.append(("launch", executable))

    def destroy(self, executable):
        self.calls.append(("destroy", executable))

    def copy(self, target, source, stream):
        target.copyfrom(source)


def test_a_key_runs_eagerly_then_is_captured_once_and_replayed():
    recorder, ran = _Recorder(), []
    graphs = StepGraphs(stream=7, settle=2, keep=2, graphs=recorder)
    results = [graphs.step("a", lambda i=i: ran.append(i) or f"out{i}") for i in range(5)]
    assert ran == [0, 1, 2]  # two eager steps, then the body once more inside the capture
    assert results == ["out0", "out1", "out2", "out2", "out2"]  # replays return the captured outputs
    assert recorder.calls == [("capture", 1), ("launch", 1), ("launch", 1), ("launch", 1)]
    assert graphs.counts == {"eager": 2, "captured": 1, "replayed": 2}


def test_keys_that_change_every_step_cost_no_capture_and_old_graphs_are_destroyed():
    recorder = _Recorder()
    graphs = StepGraphs(stream=7, settle=1, keep=2, graphs=recorder)
    for key in "abcdef":
        graphs.step(key, lambda: None)
    assert recorder.made == 0 and graphs.counts["eager"] == 6
    for key in "aabbcc":  # each key captured on its second step; the first's graph updated to the third's
        graphs.step(key, lambda: None)
    assert [c for c in recorder.calls if c[0] != "launch"] == [("capture", 1), ("capture", 2), ("update", 1)]
    graphs.step("b", lambda: None)  # kept: replayed at once
    assert recorder.calls[-1] == ("launch", 2)
    graphs.close()
    assert sorted(c[1] for c in recorder.calls if c[0] == "destroy") == [1, 2]


def test_a_graph_whose_update_is_refused_is_destroyed_and_a_new_one_made():
    recorder = _Recorder(updates=False)
    graphs = StepGraphs(stream=7, settle=0, keep=1, graphs=recorder)
    for key in "ab":
        graphs.step(key, lambda: None)
    assert [c for c in recorder.calls if c[0] != "launch"] == [("capture", 1), ("destroy", 1), ("capture", 2)]


def test_a_key_after_a_stable_one_is_captured_at_its_first_step():
    """A batch decoding together: the layout holds a page's worth of steps, then changes; the
    new layout's step is captured at once rather than run eagerly ``settle`` times."""
    recorder = _Recorder()
    graphs = StepGraphs(stream=7, settle=2, keep=4, stable=4, graphs=recorder)
    for key in "aaaaaabbc":
        graphs.step(key, lambda: None)
    # a: two eager steps, then captured; b (after 6 steps of a): at once; c (after 2 of b): eager
    assert graphs.counts == {"eager": 3, "captured": 2, "replayed": 4}


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="keep >= 1"):
        StepGraphs(stream=0, keep=0, graphs=_Recorder())
    with pytest.raises(ValueError, match="stable >= 1"):
        StepGraphs(stream=0, stable=0, graphs=_Recorder())


@pytest.mark.gpu
def test_tiny_llama_steps_from_graphs_match_the_vm(tmp_path):
    """Two sequences of 13 and 5 tokens (pages of 16: they cross at different steps), 40
    teacher-forced steps, the same kernels: the graphs' logits (each next step prepared ahead,
    the default at every batch) equal the VM's bit for bit."""
    import json

    from tvm_dsm.gpu.llm import compile_config
    from tvm_dsm.workloads.llama import LLAMA_TINY, LlamaSession, random_weights

    compile_config("tvm_dsm", LLAMA_TINY, tmp_path / "tiny.so", tmp_path / "tiny.json")
    executable = tvm.runtime.load_module(str(tmp_path / "tiny.so"))
    names = json.loads((tmp_path / "tiny.json").read_text())["names"]
    weights = random_weights(LLAMA_TINY)
    dev = tvm.cuda(0)
    rng = np.random.default_rng()
    prompts = [rng.integers(0, LLAMA_TINY.vocab_size, (1, n)) for n in (13, 5)]
    forced = rng.integers(0, LLAMA_TINY.vocab_size, (2, 40)).astype(np.int32)
    logits = {}
    for graphed in (False, True):
        session = LlamaSession(executable, dev, weights, names, LLAMA_TINY, max_batch_size=2,
                               max_total_seq_len=128, prefill_chunk_size=16, step_graphs=graphed)
        for prompt in prompts:
            session.prefill(prompt)
        steps = []
        for step in range(forced.shape[1]):
            steps.append(session.decode(tvm.runtime.tensor(forced[:, step:step + 1], dev)).numpy())
        logits[graphed] = np.stack(steps)
        if graphed:
            assert session._prepared  # the next step's begin_forward already called
            counts = session.graphs.counts
            assert counts["captured"] >= 2 and counts["replayed"] >= 20, counts
        session.close()
    assert np.isfinite(logits[False]).all()
    np.testing.assert_array_equal(logits[True], logits[False])
    alone = LlamaSession(executable, dev, weights, names, LLAMA_TINY, max_batch_size=1, max_total_seq_len=64,
                         prefill_chunk_size=16, step_graphs=True)
    alone.prefill(prompts[0])
    alone.decode(tvm.runtime.tensor(forced[:1, :1], dev))
    assert alone._prepared  # one sequence too: the next step's begin_forward already called
    alone.close()


class _Replaying(_Recorder):
    """A capture keeps its body; a launch runs it again and writes what it returns into the
    tensors the capture returned, as a replayed graph writes the captured outputs."""

    def __init__(self):
        super().__init__()
        self.bodies = {}

    def capture(self, stream, body, reuse=None):
        executable, result = super().capture(stream, body, reuse)
        self.bodies[executable] = body, result
        return executable, result

    def launch(self, executable, stream):
        super().launch(executable, stream)
        body, result = self.bodies[executable]
        result[0].copyfrom(body()[0])


def test_paged_decode_graphs_key_on_the_caches_pages_and_feed_each_steps_tokens():
    """A tiny Llama on the CPU: two sequences of 13 and 5 tokens (pages of 16) decoded 24 steps
    through PagedDecodeGraphs (its replays emulated by running the captured call again: this
    checks that each step's tokens reach the held input and which steps are captured; whether a
    key's graph stays valid only the GPU test can tell) give the logits of the VM's own calls on
    a second cache; a page taken by either sequence is a new key."""
    from tvm_dsm.step_graphs import PagedDecodeGraphs
    from tvm_dsm.workloads.llama import LLAMA_TINY, LlamaSession, export_llama, random_weights

    mod, names = export_llama(LLAMA_TINY, {"kind": "llvm"})
    executable = tvm.compile(mod, tvm.target.Target({"kind": "llvm"}), tir_pipeline="s_tir_stock")
    weights, dev, rng = random_weights(LLAMA_TINY), tvm.cpu(), np.random.default_rng()
    sessions = [LlamaSession(executable, dev, weights, names, LLAMA_TINY, max_batch_size=2,
                             max_total_seq_len=128, prefill_chunk_size=16) for _ in range(2)]
    for n in (13, 5):
        prompt = rng.integers(0, LLAMA_TINY.vocab_size, (1, n))
        for session in sessions:
            session.prefill(prompt)
    plain, graphed = sessions
    replaying = _Replaying()
    decode = PagedDecodeGraphs(graphed.vm["decode"], dev, stream=0, graphs=replaying)
    for step in range(24):
        tokens = tvm.runtime.tensor(rng.integers(0, LLAMA_TINY.vocab_size, (2, 1)).astype(np.int32), dev)
        want = plain.decode(tokens).numpy()
        graphed.begin_decode()
        got, _ = decode(tokens, graphed.cache, graphed.params)
        graphed.end_forward()
        np.testing.assert_array_equal(got.numpy(), want)
    # pages taken at steps 4 (13 + 4 > 16), 12 (5 + 12 > 16) and 20 (13 + 20 > 32): four keys,
    # the first two captured on their third step, the last two (each after a key held 8 steps,
    # StepGraphs.stable) on their first
    assert replaying.made == 4 and decode.counts == {"eager": 4, "captured": 4, "replayed": 16}
