"""tvm_dsm.ir.root_blocks lists what a schedule lists as the root's children, without one."""

from __future__ import annotations

import pytest
from tvm import s_tir

from tvm_dsm.errors import ClusterError
from tvm_dsm.ir import root_blocks
from tvm_dsm.workloads.attention_forms import te_attention
from tvm_dsm.workloads.norms import topi_norm


def _norm():
    return topi_norm("rms_norm", 64, 1024, "float16")


@pytest.mark.parametrize("func", [_norm(), te_attention(1, 2, 128, 128, 64)], ids=["rms_norm", "attention"])
def test_the_root_blocks_are_the_schedules_in_its_order(func):
    sch = s_tir.Schedule(func)
    want = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]
    assert [b.name_hint for b in root_blocks(func)] == want and len(want) > 2


def test_a_function_without_a_root_block_is_refused():
    func = _norm()
    with pytest.raises(ClusterError, match="no root block"):
        root_blocks(func.with_body(func.body.block.body))
