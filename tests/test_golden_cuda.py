"""Every family's best plans keep their generated CUDA byte for byte (``tests/golden_cuda.py``)."""

import json

import pytest

from golden_cuda import GOLDEN, digests, workloads

TABLE = json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def rankings() -> dict:
    """Each workload's ranking (``tvm_dsm.plan``), planned once for the module's tests."""
    import tvm_dsm

    return {name: tvm_dsm.plan(func) for name, func in workloads().items()}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_picks_generate_the_recorded_cuda(name, rankings):
    assert digests(rankings[name]) == TABLE[name]


def test_every_family_is_covered(rankings):
    families = {ranking.family.name for ranking in rankings.values()}
    assert families >= {"conv_chain", "gemm_chain", "gemm_row_max", "split_k_gemm", "attention", "top_k_rows",
                        "fused_cascade", "split_k_reduction"}
