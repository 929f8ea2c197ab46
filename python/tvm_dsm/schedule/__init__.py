"""tvm-dsm's schedule primitives: compositions of recorded s_tir instructions, so traces replay."""

from .cluster import MAX_CLUSTER_SIZE, RANK_TAG, bind_cluster, bind_cluster_nest, bind_rank, check_cluster_size
from .dsm import DSM_SCOPE, place_in_dsm

__all__ = [
    "DSM_SCOPE",
    "MAX_CLUSTER_SIZE",
    "RANK_TAG",
    "bind_cluster",
    "bind_cluster_nest",
    "bind_rank",
    "check_cluster_size",
    "place_in_dsm",
]
