"""Every family's best plans keep their generated CUDA byte for byte (``tests/golden_cuda.py``)."""

import json

import pytest

from golden_cuda import GOLDEN, digests, workloads

TABLE = json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", sorted(TABLE))
def test_picks_generate_the_recorded_cuda(name):
    assert digests(name, workloads()[name]) == TABLE[name]


def test_every_family_is_covered():
    import tvm_dsm

    families = {tvm_dsm.plan(func).family.name for func in workloads().values()}
    assert families >= {"conv_chain", "gemm_chain", "gemm_row_max", "split_k_gemm", "attention", "top_k_rows",
                        "fused_cascade", "split_k_reduction"}
