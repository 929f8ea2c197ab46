"""Cluster collectives as TE computations over a DSM tile, for tests and bandwidth benchmarks.

Each function returns a PrimFunc ``(A, O)``: cluster ``c``'s CTA ``r`` loads its tile
``X[r, c, :] = A[c, r, :]`` (the owner-rank axis first, as DSM buffers require), the collective
computes ``Y[r, c, :]`` from the cluster's tiles, and the CTA stores ``O[c, r, :] = Y[r, c, :]``.
``kind="copy"`` (no exchange) is the baseline the benchmark subtracts. ``all_exchange_rs_ag`` is
all-exchange as reduce-scatter (stage Z) then all-gather (stage Y): 2 (S - 1) / S of a tile read
per CTA instead of S - 1 tiles.

``resident=True`` measures the exchange alone: the tile is made in SMEM from a small pattern
(``X[r, c, i] = A[c, r, i % PATTERN]``) and each CTA writes only the fp32 sum of its result
(``O[c, r] = sum_i Y[r, c, i]``), so HBM traffic is negligible next to the DSM traffic.
"""

from __future__ import annotations

from tvm import te, tirx

KINDS = ("copy", "all_exchange", "all_exchange_rs_ag", "reduce_scatter", "broadcast", "shuffle",
         "gated")
#: Elements of the pattern a resident tile repeats.
PATTERN = 256


def collective(
    kind: str, clusters: int, size: int, n: int, dtype: str = "float32", resident: bool = False
) -> tirx.PrimFunc:
    """The ``kind`` collective over tiles of ``n`` elements in clusters of ``size`` CTAs."""
    if resident:
        a = te.placeholder((clusters, size, PATTERN), dtype, name="A")
        x = te.compute((size, clusters, n), lambda r, c, i: a[c, r, i % PATTERN], name="X")
    else:
        a = te.placeholder((clusters, size, n), dtype, name="A")
        x = te.compute((size, clusters, n), lambda r, c, i: a[c, r, i], name="X")
    p = te.reduce_axis((0, size), name="p")
    acc = "float32"  # reductions accumulate in fp32 (Y), the result is cast back on store (O)

    def f32(value):
        return value.astype(acc)

    if kind == "copy":
        y = te.compute((size, clusters, n), lambda r, c, i: x[r, c, i], name="Y")
    elif kind == "all_exchange":  # every CTA: the sum of all tiles
        y = te.compute((size, clusters, n), lambda r, c, i: te.sum(f32(x[p, c, i]), axis=p), name="Y")
    elif kind == "reduce_scatter":  # CTA r: part r of the sum
        m = n // size
        y = te.compute(
            (size, clusters, m), lambda r, c, j: te.sum(f32(x[p, c, r * m + j]), axis=p), name="Y"
        )
    elif kind == "all_exchange_rs_ag":  # the same result as all_exchange, in two phases
        m = n // size
        z = te.compute(
            (size, clusters, m), lambda r, c, j: te.sum(f32(x[p, c, r * m + j]), axis=p), name="Z"
        )
        y = te.compute((size, clusters, n), lambda r, c, i: z[i // m, c, i % m], name="Y")
    elif kind == "broadcast":  # every CTA: rank 0's tile
        y = te.compute((size, clusters, n), lambda r, c, i: x[0, c, i], name="Y")
    elif kind == "gated":  # every CTA: silu(rank 0's tile) * rank 1's tile (a SwiGLU's halves)
        def gate(c, i):
            g = f32(x[0, c, i])
            return g / (1 + te.exp(-g)) * f32(x[1, c, i])

        y = te.compute((size, clusters, n), lambda r, c, i: gate(c, i), name="Y")
    elif kind == "shuffle":  # round t: CTA r consumes the tile of rank (r + t) % size
        y = te.compute(
            (size, clusters, n),
            lambda r, c, i: te.sum(f32(x[(r + p) % size, c, i]) * f32(p + 1), axis=p),
            name="Y",
        )
    else:
        raise ValueError(f"unknown collective {kind!r}; one of {KINDS}")
    if resident:
        i = te.reduce_axis((0, y.shape[2]), name="i")
        o = te.compute((clusters, size), lambda c, r: te.sum(f32(y[r, c, i]), axis=i), name="O")
    else:
        o = te.compute(
            (clusters, size, y.shape[2]), lambda c, r, i: y[r, c, i].astype(dtype), name="O"
        )
    return te.create_prim_func([a, o])


def split_sum(groups: int, clusters_per_group: int, size: int, n: int, dtype: str = "float32") -> tirx.PrimFunc:
    """``O[g, i] = sum over the group's clusters k and their CTAs r of A[g, k, r, i]`` (fp32).

    Inside each cluster a reduce-scatter (stage Z) leaves CTA r with part r of the cluster's sum,
    which it writes to the global partial ``P[g, k, :]``; the inter-cluster reduce sums the
    ``clusters_per_group`` partials of each group (stage O).
    """
    m = n // size
    a = te.placeholder((groups * clusters_per_group, size, n), dtype, name="A")
    x = te.compute((size, groups * clusters_per_group, n), lambda r, c, i: a[c, r, i], name="X")
    p = te.reduce_axis((0, size), name="p")
    z = te.compute(
        (size, groups * clusters_per_group, m),
        lambda r, c, j: te.sum(x[p, c, r * m + j].astype("float32"), axis=p),
        name="Z",
    )
    partial = te.compute(
        (groups * clusters_per_group, size, m), lambda c, r, j: z[r, c, j], name="P"
    )
    k = te.reduce_axis((0, clusters_per_group), name="k")
    o = te.compute(
        (groups, n),
        lambda g, i: te.sum(partial[g * clusters_per_group + k, i // m, i % m], axis=k),
        name="O",
    )
    return te.create_prim_func([a, o])
