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

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.made = 0

    def capture(self, stream, body):
        self.made += 1
        self.calls.append(("capture", self.made))
        return self.made, body()

    def launch(self, executable, stream):
        self.calls.append(("launch", executable))

    def destroy(self, executable):
        self.calls.append(("destroy", executable))


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
    for key in "aabbcc":  # each key captured on its second step; the first of three evicted
        graphs.step(key, lambda: None)
    assert [c for c in recorder.calls if c[0] != "launch"] == [("capture", 1), ("capture", 2), ("capture", 3),
                                                               ("destroy", 1)]
    graphs.step("b", lambda: None)  # kept: replayed at once
    assert recorder.calls[-1] == ("launch", 2)
    graphs.close()
    assert sorted(c[1] for c in recorder.calls if c[0] == "destroy") == [1, 2, 3]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="keep >= 1"):
        StepGraphs(stream=0, keep=0, graphs=_Recorder())


@pytest.mark.gpu
def test_tiny_llama_steps_from_graphs_match_the_vm(tmp_path):
    """Two sequences of 13 and 5 tokens (pages of 16: they cross at different steps), 40
    teacher-forced steps, the same kernels: the graphs' logits equal the VM's bit for bit."""
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
            counts = session.graphs.counts
            assert counts["captured"] >= 2 and counts["replayed"] >= 20, counts
        session.close()
    assert np.isfinite(logits[False]).all()
    np.testing.assert_array_equal(logits[True], logits[False])
