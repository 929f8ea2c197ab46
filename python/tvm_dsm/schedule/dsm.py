"""Place a buffer in the cluster's distributed shared memory (DSM).

A DSM buffer has the storage scope ``shared::cluster`` and a leading axis whose extent is the
cluster size: index ``r`` along it is the slice owned by (stored in the SMEM of) the CTA of rank
``r``. Each CTA allocates only its own slice. A read or write of another rank's slice lowers to
``mapa`` + ``ld/st.shared::cluster``, and the lowering puts ``barrier.cluster`` before and after
every stage that touches a peer's slice (see :mod:`tvm_dsm.transform.lower_cluster`).
"""

from __future__ import annotations

from tvm import s_tir
from tvm.s_tir.schedule import SBlockRV

#: Storage scope of DSM buffers (the PTX state space's name).
DSM_SCOPE = "shared::cluster"


def place_in_dsm(sch: s_tir.Schedule, block: SBlockRV, write_buffer_index: int = 0) -> None:
    """Store the ``write_buffer_index``-th buffer written by ``block`` in DSM.

    The buffer's leading axis must index the owning CTA's rank (``rfactor`` over a loop bound to
    the rank gives exactly that); the lowering rejects any other shape with a clear error.
    """
    sch.set_scope(block, write_buffer_index, DSM_SCOPE)
