"""Attention on tensor cores: RedFuser's incremental form over key tiles, scheduled with mma.sync.

The user writes attention unfused (:func:`tvm_dsm.workloads.cascades.attention`: scores, row
max, exp-sum, exp-weighted sum of V, divide). :func:`find_attention` proves the cascade with
:mod:`tvm_dsm.fusion.cascade` (max -> sum and sum of V rescaled by ``exp(m_old - m_new)``) and
reads the shape; :func:`tile_incremental_form` writes the fused loop over key tiles, where
tile ``t`` of ``block_n`` keys updates each query row's states with the proven corrections:

    S_t = Q K_t^T                     (mma.sync; fp32 tile in shared memory)
    m_{t+1} = max(m_t, max_c scale S_t)
    l_{t+1} = l_t * fix(m_t, m_{t+1}) + sum_c exp(scale S_t - m_{t+1})
    O = O * fix(m_t, m_{t+1}) + P_t V_t      (P_t = fp16 exp(scale S_t - m_{t+1}); mma.sync)
    out = O / l_T

Each row's states are the values after the tiles so far (``M``, ``L``: the identities before
the first) and after tile ``t`` (``Mn``, ``Ln``), which the tile's last blocks advance into the
former: per thread scalars in registers, like O (each thread owns whole rows). One CTA per ``block_m`` query
rows of a head.

Why ``enable_check=False``: s_tir's dataflow checks ("stage pipeline": every read covered by a
write of the same loop iteration) reject any state carried from one iteration of the key loop
to the next through a block other than a reduction's own buffer, and compute_at refuses to
place the operand copies. The form is checked numerically instead: the unscheduled function
against float64 in CI (llvm), the kernel on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
import tvm
from tvm import s_tir, tirx
from tvm.s_tir import SBlock
from tvm.sym import Analyzer
from tvm.script import tirx as T

from ..errors import ClusterError
from ..fusion.cascade import analyze
from ..fusion.symbolic import ToTIR
from ..ir import find_all
from ..pipeline import ASYNC_STAGES_KEY, KEEP_SHARED_BUFFERS
from . import tensor_core as tc

_NEG = -3.0e38  # the max's identity: finite, so exp(identity - m) is 0, never inf - inf


@dataclass(frozen=True)
class AttentionShape:
    heads: int
    q_len: int
    kv_len: int
    dim: int
    scale: float
    causal: bool = False  # query i sees keys t <= i


@dataclass(frozen=True)
class AttentionConfig:
    block_m: int = 128  # query rows per CTA (one thread per row: block_m = 32 * warps)
    block_n: int = 64  # keys per tile
    warps_m: int = 2
    warps_n: int = 2

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n


def find_attention(func: tirx.PrimFunc) -> tuple[AttentionShape, sympy.Expr]:
    """The shape and the proven correction of ``func``, an unfused attention; ClusterError says
    what does not match (the cascade not fusible, other operands, no scale)."""
    groups = analyze(func)
    if len(groups) != 1:
        raise ClusterError(f"attention is one cascade (max, exp-sum, exp-weighted sum); found {len(groups)}")
    group, report = groups[0]
    if not report.fusible:
        raise ClusterError(f"the cascade does not fuse: {report.reason}")
    ops = sorted((lvl.op, lvl.form, len(lvl.spatial)) for lvl in group)
    if ops != [("max", "plain", 2), ("sum", "rescale", 2), ("sum", "rescale", 3)]:
        raise ClusterError(f"attention needs a row max and two rescaled sums; got {ops}")
    rescaled = [lvl for lvl in group if lvl.form == "rescale"]
    corrections = {str(lvl.correction) for lvl in rescaled}
    if len(corrections) != 1:
        raise ClusterError(f"the sums' corrections differ: {sorted(corrections)}")
    q, k, v, out = func.params
    shapes = [[int(x) for x in p.ty.shape] for p in (q, k, v, out)]
    heads, q_len, dim = shapes[0]
    kv_len = shapes[1][1]
    if shapes[1] != [heads, kv_len, dim] or shapes[2] != shapes[1] or shapes[3] != shapes[0]:
        raise ClusterError(f"attention takes q [H, N, D], k and v [H, KV, D], out [H, N, D]; got {shapes}")
    dtypes = {str(p.ty.dtype) for p in (q, k, v, out)}
    if dtypes != {"float16"}:
        raise ClusterError(f"attention on tensor cores takes float16 q, k, v and output; got {sorted(dtypes)}")
    scores = next(b for b in find_all(func.body, SBlock) if b.name_hint == "s")
    constants = [float(c.value) for c in find_all(scores.body, tirx.FloatImm, lambda c: float(c.value) != 0.0)]
    if len(constants) != 1:
        raise ClusterError("the scores must be q . k times one constant scale")
    shape = AttentionShape(heads, q_len, kv_len, dim, constants[0], _is_causal(func))
    return shape, rescaled[0].correction


def _is_causal(func: tirx.PrimFunc) -> bool:
    """Whether the scores are masked before the softmax; ClusterError for a mask other than
    PyTorch's ``is_causal`` (key t visible to query i iff t <= i, the others -inf)."""
    masks = [b.body for b in find_all(func.body, SBlock)
             if isinstance(b.body, tirx.BufferStore) and _select_parts(b.body.value)]
    if not masks:
        return False
    if len(masks) > 1:
        raise ClusterError(f"attention takes one mask on the scores; found {len(masks)}")
    cond, _, hidden = _select_parts(masks[0].value)
    _, i, t = masks[0].indices
    analyzer = Analyzer()
    causal = (analyzer.can_prove(tirx.Or(tirx.Not(cond), t <= i))
              and analyzer.can_prove(tirx.Or(cond, i < t)))
    if not causal or not (isinstance(hidden, tirx.FloatImm) and hidden.value == float("-inf")):
        raise ClusterError(f"only the causal mask (key t <= query i, others -inf) is supported; "
                           f"got {masks[0].value}")
    return True


def _select_parts(value) -> tuple | None:
    """(condition, kept, hidden) of a select or if_then_else, else None."""
    if isinstance(value, tirx.Select):
        return value.condition, value.true_value, value.false_value
    if isinstance(value, tvm.ir.Call) and value.op.name.endswith("if_then_else"):
        return tuple(value.args)
    return None


def check_config(shape: AttentionShape, c: AttentionConfig) -> None:
    if c.block_m != 32 * c.warps:
        raise ClusterError(f"block_m={c.block_m}: one thread per query row needs 32 x {c.warps} warps")
    if shape.q_len % c.block_m or shape.kv_len % c.block_n:
        raise ClusterError(f"q_len={shape.q_len} / kv_len={shape.kv_len} are not multiples of "
                           f"the {c.block_m} x {c.block_n} tile")
    per_warp = (c.block_m // c.warps_m, c.block_n // c.warps_n, shape.dim // c.warps_n)
    if any(extent % (2 * tc.TILE) for extent in per_warp):
        # One 16-wide fragment per warp leaves a unit loop; block_n = 32 over 2 warps was
        # measured wrong on the H100 (rel err 0.49), like the GEMM rule's M = 16.
        raise ClusterError(f"dim={shape.dim} and the {c.block_m} x {c.block_n} tile give warps "
                           f"{per_warp} rows/keys/columns; each needs a multiple of 32")
    if per_warp[1] != 2 * tc.TILE:
        # 64 keys per warp (block_n = 128) was measured wrong on the H100 (non-finite rows at
        # random; 255 registers; correct with ptxas -O1, wrong at nvcc's default -O3), cause
        # unknown: refused rather than risk a wrong kernel.
        raise ClusterError(f"block_n={c.block_n}: {per_warp[1]} keys per warp; only 32 "
                           f"(block_n = {2 * tc.TILE * c.warps_n}) is verified on the H100")


def tile_incremental_form(shape: AttentionShape, c: AttentionConfig,
                          correction: sympy.Expr) -> tirx.PrimFunc:
    """The fused loop over key tiles (see the module docstring), unscheduled."""
    H, N, KV, D, BM, BN = shape.heads, shape.q_len, shape.kv_len, shape.dim, c.block_m, c.block_n
    NT, scale, NEG = KV // BN, shape.scale, _NEG

    def fix(old, new):
        return ToTIR({"y0_old": old, "y0_new": new}, "float32")(correction)

    def scaled(S, vh, vt, vi, vc):  # the scaled score, -inf where the causal mask hides the key
        score = S[vh, vt, vi, vc] * T.float32(scale)
        if not shape.causal:
            return score
        return T.if_then_else(vt * BN + vc <= vi, score, T.float32(float("-inf")))

    @T.prim_func(s_tir=True)
    def fused(q: T.Buffer((H, N, D), "float16"), k: T.Buffer((H, KV, D), "float16"),
              v: T.Buffer((H, KV, D), "float16"), out: T.Buffer((H, N, D), "float16")):
        S = T.sblock_alloc_buffer((H, NT, N, BN), "float32")
        P = T.sblock_alloc_buffer((H, NT, N, BN), "float16")
        Ot = T.sblock_alloc_buffer((H, NT, N, D), "float32")
        M = T.sblock_alloc_buffer((H, N), "float32")  # the states after the tiles so far
        L = T.sblock_alloc_buffer((H, N), "float32")
        Mn = T.sblock_alloc_buffer((H, NT, N), "float32")  # ... and after tile t
        Ln = T.sblock_alloc_buffer((H, NT, N), "float32")
        O = T.sblock_alloc_buffer((H, N, D), "float32")
        for h, it in T.grid(H, N // BM):
            for ii in range(BM):
                with T.sblock("identity"):
                    vh = T.axis.spatial(H, h)
                    vi = T.axis.spatial(N, it * BM + ii)
                    M[vh, vi] = T.float32(NEG)
                    L[vh, vi] = T.float32(0)
            for t in range(NT):
                for ii, cc, d in T.grid(BM, BN, D):
                    with T.sblock("scores"):
                        vh = T.axis.spatial(H, h)
                        vt = T.axis.spatial(NT, t)
                        vi = T.axis.spatial(N, it * BM + ii)
                        vc = T.axis.spatial(BN, cc)
                        vd = T.axis.reduce(D, d)
                        with T.init():
                            S[vh, vt, vi, vc] = T.float32(0)
                        S[vh, vt, vi, vc] = S[vh, vt, vi, vc] + T.Cast("float32", q[vh, vi, vd]) * T.Cast("float32", k[vh, vt * BN + vc, vd])
                for ii, cc in T.grid(BM, BN):
                    with T.sblock("max"):
                        vh = T.axis.spatial(H, h)
                        vt = T.axis.spatial(NT, t)
                        vi = T.axis.spatial(N, it * BM + ii)
                        vc = T.axis.reduce(BN, cc)
                        with T.init():
                            Mn[vh, vt, vi] = M[vh, vi]
                        Mn[vh, vt, vi] = T.max(Mn[vh, vt, vi], scaled(S, vh, vt, vi, vc))
                for ii, cc in T.grid(BM, BN):
                    with T.sblock("probabilities"):
                        vh = T.axis.spatial(H, h)
                        vt = T.axis.spatial(NT, t)
                        vi = T.axis.spatial(N, it * BM + ii)
                        vc = T.axis.spatial(BN, cc)
                        P[vh, vt, vi, vc] = T.Cast("float16", T.exp(scaled(S, vh, vt, vi, vc) - Mn[vh, vt, vi]))
                for ii, cc in T.grid(BM, BN):
                    with T.sblock("exp_sum"):
                        vh = T.axis.spatial(H, h)
                        vt = T.axis.spatial(NT, t)
                        vi = T.axis.spatial(N, it * BM + ii)
                        vc = T.axis.reduce(BN, cc)
                        with T.init():
                            Ln[vh, vt, vi] = L[vh, vi] * fix(M[vh, vi], Mn[vh, vt, vi])
                        Ln[vh, vt, vi] = Ln[vh, vt, vi] + T.exp(scaled(S, vh, vt, vi, vc) - Mn[vh, vt, vi])
                for ii, e, cc in T.grid(BM, D, BN):
                    with T.sblock("tile_pv"):
                        vh = T.axis.spatial(H, h)
                        vt = T.axis.spatial(NT, t)
                        vi = T.axis.spatial(N, it * BM + ii)
                        ve = T.axis.spatial(D, e)
                        vc = T.axis.reduce(BN, cc)
                        with T.init():
                            Ot[vh, vt, vi, ve] = T.float32(0)
                        Ot[vh, vt, vi, ve] = Ot[vh, vt, vi, ve] + T.Cast("float32", P[vh, vt, vi, vc]) * T.Cast("float32", v[vh, vt * BN + vc, ve])
                for ii, e in T.grid(BM, D):
                    with T.sblock("weighted_sum"):
                        vh = T.axis.spatial(H, h)
                        vi = T.axis.spatial(N, it * BM + ii)
                        ve = T.axis.spatial(D, e)
                        vt = T.axis.reduce(NT, t)
                        with T.init():
                            O[vh, vi, ve] = T.float32(0)
                        O[vh, vi, ve] = O[vh, vi, ve] * fix(M[vh, vi], Mn[vh, vt, vi]) + Ot[vh, vt, vi, ve]
                for ii in range(BM):
                    with T.sblock("advance_max"):
                        vh = T.axis.spatial(H, h)
                        vt = T.axis.spatial(NT, t)
                        vi = T.axis.spatial(N, it * BM + ii)
                        M[vh, vi] = Mn[vh, vt, vi]
                for ii in range(BM):
                    with T.sblock("advance_sum"):
                        vh = T.axis.spatial(H, h)
                        vt = T.axis.spatial(NT, t)
                        vi = T.axis.spatial(N, it * BM + ii)
                        L[vh, vi] = Ln[vh, vt, vi]
            for ii, e in T.grid(BM, D):
                with T.sblock("normalize"):
                    vh = T.axis.spatial(H, h)
                    vi = T.axis.spatial(N, it * BM + ii)
                    ve = T.axis.spatial(D, e)
                    out[vh, vi, ve] = T.Cast("float16", O[vh, vi, ve] / L[vh, vi])

    return fused.with_attr(KEEP_SHARED_BUFFERS, True)


def schedule_attention(func: tirx.PrimFunc, config: AttentionConfig | None = None) -> s_tir.Schedule:
    """Fuse and schedule ``func`` (an unfused attention, see :func:`find_attention`)."""
    c = config or AttentionConfig()
    shape, correction = find_attention(func)
    check_config(shape, c)
    sch = s_tir.Schedule(tile_incremental_form(shape, c, correction), enable_check=False)
    _schedule(sch, shape, c)
    return sch


def _schedule(sch: s_tir.Schedule, shape: AttentionShape, c: AttentionConfig) -> None:
    block = sch.get_sblock
    h, it, *_ = sch.get_loops(block("scores"))
    cta = sch.fuse(h, it)
    sch.bind(cta, "blockIdx.x")
    t = sch.get_loops(block("scores"))[1]

    def row_per_thread(name: str) -> None:
        """One thread per query row (``block_m`` = 32 x warps): its states and O in one thread."""
        loops = sch.get_loops(block(name))
        rows = loops[-1] if name in ("identity", "advance_max", "advance_sum") else loops[-2]  # else: (rows, columns)
        warp, lane = sch.split(rows, [c.warps, 32])
        sch.bind(warp, "threadIdx.y")
        sch.bind(lane, "threadIdx.x")

    def tile(block_rv, index: int, keep, pad: int) -> None:
        sch.transform_layout(block_rv, ("write", index), keep, assume_injective_transform=True)
        if pad:
            sch.storage_align(block_rv, index, axis=-2, factor=32, offset=pad)

    def rows_of_tile(*index):  # [head, tile, row, column] -> [row % block_m, column]
        return index[-2] % c.block_m, index[-1]

    def gemm(name: str, x_at, weight_nk: bool, k_extent: int) -> None:
        """S = Q K_t^T (Q staged once per CTA) or O_t = P_t V_t (P already in shared memory);
        fp32 result tile stored to padded shared memory."""
        rows, cols, depth = sch.get_loops(block(name))[-3:]
        fragments, fragment = tc.blockize_fragments(sch, block(name), [], rows, cols, depth)
        i, j, k = sch.get_loops(fragments)[-3:]
        warp, _, _ = tc.warp_tile(sch, i, j, [k], c.warps_m, c.warps_n)
        if x_at is not None:
            tc.stage_in_shared(sch, fragments, 0, x_at, c.warps, 1, k_extent, rows=c.block_m)
        tc.stage_in_shared(sch, fragments, 1, t, c.warps, 1 if weight_nk else 0, k_extent,
                           rows=c.block_n if weight_nk else None)
        caches = tc.fragment_caches(sch, fragments, k, warp)
        store = sch.get(caches[2]).name_hint
        sch.set_scope(caches[2], 0, "shared.dyn")
        tile(caches[2], 0, rows_of_tile, 0)
        tc.tensorize_fragments(sch, fragments, fragment, caches, k, weight_nk,
                               tc.mma.MMA_store_16x16_f32_shared_dyn_INTRIN_SIMPLE)
        # fp32 rows of 64 would put a column of every row in one bank; one word of padding
        # spreads the row-per-thread reads over all 32.
        sch.storage_align(block(f"{store}_o"), 0, axis=-2, factor=32, offset=1)

    gemm("scores", cta, True, shape.dim)
    for name in ("identity", "max", "probabilities", "exp_sum"):
        row_per_thread(name)
    # The row states stay in the thread that owns the row: registers, no shared memory, so no
    # barrier inside the row loops (ThreadSync cannot tell rows of one merged buffer apart).
    row_per_thread("advance_max")
    row_per_thread("advance_sum")
    for name, index in (("identity", 0), ("identity", 1), ("max", 0), ("exp_sum", 0)):
        sch.set_scope(block(name), index, "local")
        tile(block(name), index, lambda *i: (i[-1] % c.block_m,), 0)
    for name in ("max", "exp_sum"):
        sch.unroll(sch.get_loops(block(name))[-1])
    sch.set_scope(block("probabilities"), 0, "shared.dyn")
    lane, columns = sch.get_loops(block("probabilities"))[-2:]
    row = sch.cache_write(block("probabilities"), 0, "local")  # one 16-byte store per 8 columns
    tile(row, 0, rows_of_tile, tc.PAD)
    sch.reverse_compute_at(row, lane)
    sch.unroll(columns)
    sch.vectorize(sch.split(sch.get_loops(row)[-1], [None, tc.VECTOR // 2])[1])
    gemm("tile_pv", None, False, c.block_n)
    row_per_thread("weighted_sum")
    row_per_thread("normalize")
    sch.set_scope(block("weighted_sum"), 0, "local")
    for name in ("weighted_sum", "normalize"):  # O's row in registers
        sch.unroll(sch.get_loops(block(name))[-1])
    # Tile t + 1's keys and values load (cp.async) while tile t computes. The key loop's body
    # as the pipeline pass sees it (nested blocks flattened): K copy; S = Q K^T (fill, mma,
    # store); max; probabilities (compute, store); exp-sum; V copy; P V (fill, mma, store);
    # O update; advance M; advance L.
    sch.annotate(t, "software_pipeline_stage", [0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1])
    sch.annotate(t, "software_pipeline_order", [0, 2, 3, 4, 5, 6, 7, 8, 1, 9, 10, 11, 12, 13, 14])
    sch.annotate(t, ASYNC_STAGES_KEY, [0])
