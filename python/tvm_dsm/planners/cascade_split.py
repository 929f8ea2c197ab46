"""Choose how a fused cascade's rows are split over lanes, threads and a cluster, without
measuring.

A fused cascade reads each row once, so it runs at HBM speed exactly when enough loads are in
flight: by Little's law the threads must together hold ``HBM bandwidth x loaded latency``
bytes of outstanding loads. Each thread holds ``vector`` elements of every row it reads
(16-byte loads, or the widest of 8, 4 and 2 bytes that divides the row; with an element producer,
each lane a 16-byte slice of the key and value rows), twice: the fused loop loads the next chunk
while it applies the current one. Rows the parts' chunks do not divide are split anyway, the
last step of some parts predicated off; rows of an odd width are refused where TVM's stock
reduction schedules take the function (single-element loads ran 1.5x slower, docs/guide.md).
Only resident threads count: an SM holds at most 32 CTAs and 2048 threads (sm_90), so many
small CTAs (many rows, few threads each) saturate before the loads do. The plan takes the
fewest parts that reach that bytes in flight (or 90 % of the most any split reaches), adding
threads per CTA up to ``groups`` 16 and then CTAs per row (``ranks``, a cluster whose last
partials meet through DSM) before more threads: every rank costs cluster barriers and a DSM
merge, large CTAs cost occupancy. The loaded latency is the measured unloaded one times a
factor (fitted on bench/results/decode/latest.json and cascades/latest.json): larger when a row
spans a cluster, whose DSM merge and cluster barriers lie on every row's path.

With an element producer (decode attention: a score per key from 16-byte K and V slices) the
chunk is 4 or 8 keys a step, the split must hold ``PRODUCER_BYTES_IN_FLIGHT``, and CTAs grow
to 256 threads before ranks are added. Fitted on the decode sweeps, checked on
bench/results/decode_picks/latest.json (docs/cascades.md).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.schedule.schedule import ScheduleError

from ..errors import ClusterError
from ..fusion.cascade import element_producers, find_cascades, inline_elementwise
from ..hardware import Hardware, load_hardware
from ..ir import largest_power_of_two, loads, narrow_indices
from ..rules.fused_rows import schedule_fused_rows
from ..stock import stock_target
from ..transform.cascaded_reductions import fuse_cascaded_reductions

#: Loaded / unloaded HBM latency under full-bandwidth streaming, for rows in one CTA and rows
#: spanning a cluster (fitted, see the module doc).
_LOADED_LATENCY_FACTOR, _CLUSTER_LATENCY_FACTOR = 4.0, 6.0
_GROUPS = (8, 16, 32, 64, 128)
_CTAS_PER_SM, _THREADS_PER_SM = 32, 2048  # sm_90 residency limits
#: Cluster sizes a row may span: up to the portable 8. Clusters of 16 (non-portable) are the
#: slowest split on every decode shape (docs/cascades.md).
_RANKS = (1, 2, 4, 8)
_LOAD_BYTES = 16
#: Keys per step of a cascade with an element producer, the loads it must hold in flight, and
#: the threads of a CTA before more ranks are preferred.
_PRODUCER_VECTORS = (4, 8)
PRODUCER_BYTES_IN_FLIGHT = 16 * 2**20
_PRODUCER_CTA_THREADS = 256


@dataclass(frozen=True)
class CascadeSplit:
    """FuseCascadedReductions' split of each row and what the plan expects of it."""

    rows: int
    parts: int
    vector: int
    lanes: int
    ranks: int
    bytes_in_flight: int
    bytes_needed: int
    copy_stages: int = 0
    rows_per_cta: int = 1

    def kwargs(self) -> dict:
        return {"parts": self.parts, "vector": self.vector, "lanes": self.lanes, "ranks": self.ranks,
                "shuffle": True, "copy_stages": self.copy_stages, "rows_per_cta": self.rows_per_cta}

    def explain(self) -> str:
        groups = self.parts // self.ranks
        where = (f"a cluster of {self.ranks} CTAs per row (last partials merged through DSM)"
                 if self.ranks > 1 else f"{self.rows_per_cta} rows per CTA" if self.rows_per_cta > 1
                 else "one CTA per row")
        per_warp = min(groups, 32 // self.lanes)
        return (f"{self.rows} rows, {where}; {groups} parts of {self.lanes} lane(s) per row and CTA "
                f"({groups * self.lanes * self.rows_per_cta} threads a CTA; the {per_warp} parts of a warp merge by "
                f"shuffles), {self.vector} element(s) per load (the next chunk loaded ahead): "
                f"{self.bytes_in_flight / 2**20:.1f} MiB of loads in flight, "
                f"{self.bytes_needed / 2**20:.1f} MiB needed to cover HBM latency")


def plan_cascade_split(func: tirx.PrimFunc, hw: Hardware | None = None) -> CascadeSplit:
    """The split for the first cascade of ``func``; ClusterError if it has none."""
    return _plan(func, hw)[0]


def _plan(func: tirx.PrimFunc, hw: Hardware | None) -> tuple[CascadeSplit, s_tir.Schedule | None]:
    """The split and, for a cluster split, the schedule built to check it builds."""
    hw = hw or load_hardware()
    inlined = inline_elementwise(func)
    groups = find_cascades(inlined)
    if not groups:
        raise ClusterError("no cascaded reduction in this function")
    group = groups[0]
    first = group[0]
    rows = math.prod(int(first.output.ty.shape[a]) for a in range(len(first.spatial)))
    extent = first.extent
    producers = element_producers(inlined, group)
    if producers:  # lanes share an element: 16-byte slices of its inner axis
        prod = next(iter(producers.values()))
        width = _LOAD_BYTES // _elem_bytes(prod.value)
        lanes = max(1, min(32, prod.extent // width))
        vectors = _PRODUCER_VECTORS
        # the key slice, and the value slice of each level with an output axis of its own
        slices = 1 + sum(len(lvl.spatial) > len(first.spatial) for lvl in group)

        def step_bytes(vector: int) -> int:
            return vector * _LOAD_BYTES * slices
    else:
        lanes = 1
        elem = _elem_bytes(first.value)
        # the widest load (16 bytes, or the widest power of two of elements) that rows of this
        # width start on: every row's chunks then start on it too
        vector = largest_power_of_two(extent, _LOAD_BYTES // elem)
        if vector == 1 and stock_reduction_takes(func):
            raise ClusterError(f"rows of an odd width ({extent}) read an element a load: TVM's stock "
                               "reduction schedule runs them faster (docs/guide.md)")
        vectors = (vector,)

        def step_bytes(vector: int) -> int:  # one load of the vector's elements
            return vector * elem

    def per_thread(vector: int) -> int:
        """Bytes a thread loads per step, twice: the next chunk is in flight while the
        current one is applied."""
        return 2 * step_bytes(vector)

    def needed(c) -> int:
        if producers:
            return PRODUCER_BYTES_IN_FLIGHT
        factor = _CLUSTER_LATENCY_FACTOR if c[0] > 1 else _LOADED_LATENCY_FACTOR
        return int(hw.hbm_bw * hw.latency_ns["hbm"] * 1e-9 * factor)

    def splits(parts: int, vector: int) -> bool:
        """Whether ``parts`` parts read the row in ``vector``-element chunks: evenly with an
        element producer, else at least one chunk a part (the last step predicated where the
        parts do not divide the chunks)."""
        return extent % (parts * vector) == 0 if producers else extent >= parts * vector

    candidates = [
        (ranks, groups, vector) for ranks, groups, vector in itertools.product(_RANKS, _GROUPS, vectors)
        if groups * lanes <= 1024 and splits(ranks * groups, vector)
    ]
    if not candidates:
        raise ClusterError(f"reduction extent {extent} does not split into {min(_GROUPS)} parts "
                           f"of {min(vectors)}-element chunks")

    top_k = any(lvl.top_k for lvl in group)

    def rows_per_cta(c) -> int:
        """With a top-k level, rows whose threads fill less than a warp share CTAs to fill one
        (it halves MoE routing's time, bench/results/cascades_rows/latest.json; the plain
        cascades gain nothing from it)."""
        ranks, groups, _ = c
        if not (top_k and ranks == 1):
            return 1
        return largest_power_of_two(rows, max(1, 32 // (groups * lanes)))  # whole CTAs of rows

    def in_flight(c) -> int:
        ranks, groups, vector = c
        threads = groups * lanes * rows_per_cta(c)
        resident = hw.sm_count * min(_CTAS_PER_SM, _THREADS_PER_SM // threads)
        return min(rows * ranks // rows_per_cta(c), resident) * threads * per_thread(vector)

    def split(c) -> CascadeSplit:
        ranks, groups, vector = c
        return CascadeSplit(rows, ranks * groups, vector, lanes, ranks, in_flight(c), needed(c),
                            rows_per_cta=rows_per_cta(c))

    def large(c) -> bool:
        """Past 16 parts a CTA (with a producer: past 256 threads) more ranks come first."""
        return c[1] * lanes > _PRODUCER_CTA_THREADS if producers else c[1] > 16

    # Fewest ranks, then fewest threads per CTA beyond a large CTA, then the shortest chunk,
    # that cover the latency; else the most in flight. A cluster split must also build: its
    # partial states fit the static shared memory of a cluster merge, and every level merges
    # across CTAs.
    order = sorted(candidates, key=lambda c: (large(c), c[0], c[1], c[2]))
    most = max(in_flight(c) for c in candidates)
    enough = [c for c in order if in_flight(c) >= min(needed(c), 0.9 * most)]
    for c in enough + sorted(candidates, key=in_flight, reverse=True):
        if c[0] == 1:
            return split(c), None
        try:
            return split(c), _schedule(func, split(c))
        except (ClusterError, TypeError):  # TypeError: int64 indices kept beside the rank's int32 arithmetic
            continue
    raise ClusterError("no split of this cascade builds")  # ranks 1 always does: unreachable


def _schedule(func: tirx.PrimFunc, split: CascadeSplit) -> s_tir.Schedule:
    """The fused rows' schedule of ``func`` in ``split``, indexed in int32 (a cluster split's
    layout of the partial states mixes its rank's int32 arithmetic into Relax's int64 indices)."""
    fused, reports = fuse_cascaded_reductions(narrow_indices(func), **split.kwargs())
    if not reports or not all(r.fusible for r in reports):
        raise ClusterError("; ".join(str(r) for r in reports) or "no cascaded reduction")
    return schedule_fused_rows(fused)


def schedule_cascade(func: tirx.PrimFunc, hw: Hardware | None = None, split: CascadeSplit | None = None
                     ) -> tuple[s_tir.Schedule, CascadeSplit]:
    """``func``'s cascade fused by FuseCascadedReductions with ``split`` (default: the planned
    one) and scheduled for the GPU, with the split; ClusterError with the pass's reason if it
    does not fuse."""
    if split is None:
        split, sch = _plan(func, hw)
        if sch is not None:  # built while planning
            return sch, split
    return _schedule(func, split), split


def stock_reduction_takes(func: tirx.PrimFunc) -> bool:
    """Whether one of dlight's reduction rules schedules ``func`` (rather than its fallback, a
    thread walking each row alone: a cross-entropy's three sums ran 30x slower than the fused
    rows there, even with their single-element loads)."""
    from tvm.s_tir import dlight as dl

    target = stock_target()
    with target:
        for rule in (dl.gpu.Reduction(), dl.gpu.GeneralReduction()):
            try:
                if rule.apply(func, target, False) is not None:
                    return True
            except (ScheduleError, AssertionError, tvm.error.InternalError):  # a rule misjudging the form
                continue
    return False


def _elem_bytes(expr) -> int:
    """Bytes of the narrowest buffer element the expression loads (what a load's elements are)."""
    sizes = [tvm.DataType(str(ld.source.ty.dtype)).bits // 8 for ld in loads(expr)]
    return min(sizes) if sizes else 4
