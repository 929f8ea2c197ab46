"""tutorials/llm_end_to_end.py: without a GPU it compiles the 1B Llama through the "tvm_dsm"
pipeline and prints the per-kernel report; with one it also runs, checks and times it."""

from __future__ import annotations

import pytest

from conftest import run_tutorial


@pytest.mark.slow
def test_llm_tutorial_compiles_the_1b_llama_and_reports_its_kernels(capsys):
    out = run_tutorial("llm_end_to_end", capsys)
    assert "split_k_gemm" in out and "prescheduled" in out and "compiled in" in out
    assert "ms/step" in out or "compiled and reported above" in out
