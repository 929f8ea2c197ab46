"""softmax(X)·V as one kernel: RedFuser's incremental form over key tiles on CUDA cores, the
keys split over a cluster whose partial states merge through DSM.

The user writes the cascade unfused (:func:`tvm_dsm.workloads.cascades.softmax_pv`: a row max
of X [M, K], a sum of ``F(x, max)``, and a sum of ``F(x, max) * V[k, c]``). :func:`find_softmax_gemm`
proves it with :mod:`tvm_dsm.fusion.cascade` (both sums rescaled by one correction, ``exp(m_old -
m_new)`` for softmax) and takes ``F`` from the function, so any element function the prover
accepts runs, not only ``exp``. :func:`softmax_gemm_kernel` writes the loop, each CTA owning
``block_m`` rows and ``block_j`` columns of the output and 1/``ranks`` of the keys:

    x_t  = X[rows, keys of tile t]         each thread one 16-byte load of one row, into registers
    m'   = max(m, rowmax(x_t))             per row: the thread's keys, then a shuffle over the row's lanes
    P_t  = F(x_t, m')                      into shared memory, key-major
    O    = O * fix(m, m') + P_t V_t        each thread a few rows x 4 or 8 columns, V_t from shared
    l    = l * fix(m, m') + rowsum(P_t)

Why this shape and not the generic fused rows (:mod:`tvm_dsm.rules.fused_rows`, one row per CTA
with parts of the keys on threads): there every thread keeps its own copy of the row's J output
sums and reads V from L2 once per row, so the products run at a small fraction of torch's
speed (docs/cascades.md). Here a V tile
in shared memory serves ``block_m`` rows and each thread's outputs are a small outer product, the
SGEMM register tiling. The math is fp32 (inputs of fp16 are widened on load): V·P on tensor cores
would round P to fp16 or tf32, outside the fp32 standard the other cascades meet.

softmax(X)·V normalized is taken in both forms a user writes it: P = F / l before the product
(the product reads the sum; its term is F(x, m)·v·g(l), so O accumulates F·v under F's
correction and is multiplied by g(l_final) = 1 / l when written) or ``out = o / l`` as a stage
after the cascade (:mod:`tvm_dsm.fusion.epilogue`, evaluated where O is written).

With ``ranks`` > 1 the CTAs of a cluster take consecutive slices of the keys for the same rows
(the grid needs them when the rows alone give too few CTAs) and leave their (m, l, O) in shared
memory; after a cluster barrier rank q merges rows q/ranks of the block from every rank's slice
through DSM by the same rule, ``y = sum_r y_r * fix(m_r, max_r m_r)``, and writes them.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

import sympy
import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock
from tvm.script import tirx as T
from tvm.tirx.script.builder import ir as B

from ..errors import ClusterError, passes
from ..hardware import MAX_CTA_THREADS, Hardware
from ..fusion.cascade import LoadSymbols, indexed_by, inline_elementwise, only_load, single_fusible_cascade
from ..fusion.epilogue import bind_stage, find_epilogue
from ..fusion.symbolic import ToSympy, ToTIR, simplify
from ..ir import loads, shuffle_reduce, tree_reduce, with_block_body
from ..schedule.cluster import MAX_CLUSTER_SIZE
from ..annotations import CLUSTER_LAUNCH_KEY
from .template import KernelTemplate

_NEG = -3.0e38  # the max's identity: finite, so fix(identity, m) is 0 or 1, never inf - inf
_LOAD_BYTES = 16
_PIECE = 4  # V and O move in float4 pieces
_INPUT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class SoftmaxGemmShape:
    rows: int  # M
    keys: int  # K, the reduced axis
    columns: int  # J, V's second axis
    x_dtype: str
    v_dtype: str


@dataclass(frozen=True)
class SoftmaxGemmConfig:
    """``block_m`` rows x ``block_j`` columns per CTA, ``block_k`` keys per step, each thread
    ``rows_per_thread`` x ``columns_per_thread`` outputs (4 or 8: one float4 piece, or two
    ``block_j / 2`` apart so that a warp's V reads stay conflict-free); ``ranks`` CTAs of a
    cluster split the keys."""

    block_m: int = 16
    block_k: int = 32
    block_j: int = 64
    rows_per_thread: int = 2
    ranks: int = 1
    columns_per_thread: int = 4

    @property
    def threads(self) -> int:
        return self.block_m // self.rows_per_thread * (self.block_j // self.columns_per_thread)

    def explain(self) -> str:
        split = (f", the keys split over a cluster of {self.ranks} CTAs (partials merged through DSM)"
                 if self.ranks > 1 else "")
        return (f"softmax·V tiled: {self.block_m} rows x {self.block_j} columns per CTA, {self.block_k} "
                f"keys a step, {self.threads} threads of {self.rows_per_thread} x "
                f"{self.columns_per_thread} outputs{split}")


@dataclass(frozen=True)
class SoftmaxGemm:
    """What the kernel takes from the function: the shape, the element function F(x, m) and the
    correction fix(m_old, m_new) as SymPy over ``x``/``m`` and ``y0_old``/``y0_new``, the
    product's factor of the row sum ``l`` (``1 / l`` when the user normalizes P before the
    product, else 1), which level results are parameters (written: max, sum, product), the
    function's parameters in order, each as its role's index in (X, V, max, sum, product) or
    None for an element-wise stage's output, and those stages (``o / l``, say)."""

    shape: SoftmaxGemmShape
    element: sympy.Expr
    correction: sympy.Expr
    normalizer: sympy.Expr
    order: tuple[int | None, ...]
    params: tuple
    epilogue: tuple
    results: tuple  # the max, sum and product levels' buffers (None where absent)

    @property
    def written(self) -> tuple[bool, bool, bool]:
        """Whether the max, the sum and the product are parameters."""
        return tuple(role in self.order for role in (2, 3, 4))


_M, _L, _V = (sympy.Symbol(n, real=True) for n in ("m", "l", "v"))


def find_softmax_gemm(func: tirx.PrimFunc) -> SoftmaxGemm:
    """The cascade of ``func`` as the kernel takes it; ClusterError saying what does not match."""
    func = inline_elementwise(func)
    group, report = single_fusible_cascade(func, "softmax·V (max, sum, sum of products)")
    if report.approximate:
        raise ClusterError("the cascade rounds inside (a cast to a narrower float): the kernel computes "
                           "in fp32 and would not match it")
    ops = [(lvl.op, lvl.form, len(lvl.spatial)) for lvl in group]
    if ops[0] != ("max", "plain", 1) or sorted(ops[1:]) not in ([("sum", "rescale", 1), ("sum", "rescale", 2)],
                                                                [("sum", "rescale", 2)]):
        raise ClusterError(f"softmax·V needs a row max, then a rescaled sum of products with a [K, J] matrix "
                           f"and a rescaled row sum (or none); got {ops}")
    top = group[0]
    product = next(lvl for lvl in group if len(lvl.spatial) == 2)
    total = next((lvl for lvl in group[1:] if len(lvl.spatial) == 1), None)
    x_load = only_load(top.value, "the max")
    x = x_load.source
    if len(x.ty.shape) != 2 or not indexed_by(x_load, top.spatial[0], top.reduce_var):
        raise ClusterError(f"the max must reduce X[row, key] of a 2-D X; got {top.value}")
    sum_index = group.index(total) if total is not None else None
    product_term, v = _element(group, product, x, rest="v", sum_index=sum_index)
    element = _element(group, total, x)[0] if total is not None else simplify(product_term / _V)
    normalizer = simplify(product_term / (element * _V)) if v is not None else sympy.nan
    if (v is None or v.same_as(x) or element.has(_V) or normalizer.free_symbols - {_L}
            or simplify(product_term - element * normalizer * _V) != 0):
        raise ClusterError(f"the product level must be the sum level's term times V[key, column] (times a "
                           f"function of the sum); got {product.value}")
    rows, keys = (int(d) for d in x.ty.shape)
    columns = int(v.ty.shape[1])
    dtypes = {str(x.ty.dtype), str(v.ty.dtype)}
    if not dtypes <= set(_INPUT_DTYPES):
        raise ClusterError(f"X and V must be of {_INPUT_DTYPES}; got {sorted(dtypes)}")
    params = list(func.params)
    levels = (top, total, product)
    results = tuple(None if lvl is None else lvl.output for lvl in levels)
    epilogue = find_epilogue(func, {lvl.block for lvl in group}, [b for b in results if b is not None], rows)
    for block in epilogue:
        extents = [int(iv.dom.extent) for iv in block.iter_vars]
        reads_product = any(ld.source.same_as(product.output) for ld in loads(block.body.value))
        if extents not in ([rows], [rows, columns]) or (reads_product and len(extents) == 1):
            raise ClusterError(f"{block.name_hint}: the stages after softmax·V write out[row] from the max and "
                               f"sum or out[row, column] from the product too; got extents {extents}")
    outputs = tuple(None if b is None else next((p for p in params if p.same_as(b)), None) for b in results)
    for lvl, param in zip(levels, outputs):
        if param is not None and str(param.ty.dtype) != "float32":
            raise ClusterError(f"{lvl.block} is written in {param.ty.dtype}: the kernel writes float32")
    shape = SoftmaxGemmShape(rows, keys, columns, str(x.ty.dtype), str(v.ty.dtype))
    roles = (x, v, *outputs)
    order = tuple(next((i for i, b in enumerate(roles) if b is not None and b.same_as(p)), None) for p in params)
    correction = (total if total is not None else product).correction
    return SoftmaxGemm(shape, element, correction, normalizer, order, tuple(params), epilogue, results)


def _element(group, level, x, rest: str | None = None, sum_index: int | None = None
             ) -> tuple[sympy.Expr, tirx.Var | None]:
    """The level's term as SymPy over ``x`` (X[row, key]), ``m`` (the max), for the product
    ``rest`` (V[key, column], returned with it) and ``l`` (the row sum, level ``sum_index``);
    ClusterError if it reads anything else."""
    symbols = LoadSymbols(group, level)
    term = ToSympy(symbols)(level.value)
    renames, other = {sympy.Symbol("y0", real=True): _M}, None
    if sum_index is not None:
        renames[sympy.Symbol(f"y{sum_index}", real=True)] = _L
    for name, expr in symbols.loads.items():
        if not isinstance(expr, tvm.ir.TensorLoad):
            raise ClusterError(f"{level.block} reads {expr}: only X[row, key] and V[key, column] are taken")
        if expr.source.same_as(x) and indexed_by(expr, level.spatial[0], level.reduce_var):
            renames[sympy.Symbol(name, real=True)] = sympy.Symbol("x", real=True)
        elif (rest is not None and other is None and len(expr.source.ty.shape) == 2
              and indexed_by(expr, level.reduce_var, level.spatial[1])):
            renames[sympy.Symbol(name, real=True)], other = sympy.Symbol(rest, real=True), expr.source
        else:
            raise ClusterError(f"{level.block} reads {expr}: only X[row, key] and V[key, column] are taken")
    term = term.subs(renames)
    allowed = {sympy.Symbol(n, real=True) for n in ("x", "m", rest or "x")} | ({_L} if sum_index is not None else set())
    if term.free_symbols - allowed:
        raise ClusterError(f"{level.block} reads results other than the max and the sum: {term}")
    return term, other


def check_config(shape: SoftmaxGemmShape, c: SoftmaxGemmConfig) -> None:
    """ClusterError naming the first constraint ``c`` breaks on ``shape``."""
    x_vector = _LOAD_BYTES // _bytes(shape.x_dtype)
    per_thread = c.block_m * c.block_k // max(c.threads, 1)
    lanes = c.block_k // max(per_thread, 1)
    checks = [
        (shape.rows % c.block_m == 0, f"{shape.rows} rows are not a multiple of block_m={c.block_m}"),
        (shape.columns % c.block_j == 0, f"{shape.columns} columns are not a multiple of block_j={c.block_j}"),
        (shape.keys % (c.block_k * c.ranks) == 0,
         f"{shape.keys} keys do not split into {c.ranks} ranks of block_k={c.block_k} tiles"),
        (c.block_m % c.rows_per_thread == 0 and c.columns_per_thread in (4, 8)
         and c.block_j % c.columns_per_thread == 0,
         "block_m must be a multiple of rows_per_thread, columns_per_thread 4 or 8 dividing block_j"),
        (c.block_m * c.block_k % c.threads == 0 and per_thread > 0
         and (x_vector % per_thread == 0 or per_thread % x_vector == 0),
         f"the {c.block_m}x{c.block_k} X tile must split into aligned pieces of 16 bytes (or a "
         f"divisor) over {c.threads} threads"),
        (lanes & (lanes - 1) == 0 and lanes <= 32, f"a row's {lanes} lanes must be a power of two <= 32"),
        (c.block_k * c.block_j % (c.threads * _PIECE) == 0,
         f"the {c.block_k}x{c.block_j} V tile must split into 4-element pieces over {c.threads} threads"),
        (c.ranks in range(1, MAX_CLUSTER_SIZE + 1) and c.block_m % c.ranks == 0,
         f"ranks={c.ranks}: a cluster of 1-{MAX_CLUSTER_SIZE} CTAs dividing block_m={c.block_m}"),
        (c.threads <= MAX_CTA_THREADS, f"{c.threads} threads per CTA"),
    ]
    for ok, message in checks:
        if not ok:
            raise ClusterError(f"softmax·V {shape.rows}x{shape.keys}x{shape.columns}, {c}: {message}")


def _bytes(dtype: str) -> int:
    return tvm.DataType(dtype).bits // 8


#: The configurations :func:`default_config` chooses among: 32 x 32 tiles of 4 x 4 outputs a
#: thread, 64 or 32 columns a CTA, 1-16 ranks.
_TILES = tuple(SoftmaxGemmConfig(32, 32, block_j, 4, ranks, 4)
               for block_j, ranks in itertools.product((64, 32), (1, 2, 4, 8, 16)))


def fitting_configs(shape: SoftmaxGemmShape) -> list[SoftmaxGemmConfig]:
    """The configurations of :data:`_TILES` that fit ``shape``, else (a small matrix) the
    smallest tile that fits; ClusterError naming the limit where none does."""
    fitting = []
    for config in _TILES:
        if not passes(check_config, shape, config):
            continue
        fitting.append(config)
    if not fitting:
        small = SoftmaxGemmConfig(16, 32, next(j for j in (64, 32, 16, 8, 4) if shape.columns % j == 0))
        check_config(shape, small)
        fitting.append(small)
    return fitting


def default_config(shape: SoftmaxGemmShape, hw: Hardware) -> SoftmaxGemmConfig:
    """32 rows x 64 columns per CTA, 4 x 4 outputs per thread, 32 keys a step, and the fewest
    ranks that give the grid two CTAs per SM (16, the most, where none does; then 32 columns
    per CTA if that adds CTAs). Fitted on ``bench/results/softmax_gemm/latest.json`` (H100, 333
    kernels over five shapes): these picks ran within 0.87-1.0x of each shape's fastest
    configuration; 4 x 8 outputs per thread, 64-key steps or 16-row CTAs won nowhere by more
    than the run-to-run spread, and fewer CTAs than two per SM left SMs waiting."""
    def ctas(config: SoftmaxGemmConfig) -> int:
        return shape.rows // config.block_m * (shape.columns // config.block_j) * config.ranks

    fitting = fitting_configs(shape)
    return next((c for c in fitting if ctas(c) >= 2 * hw.sm_count), max(fitting, key=ctas))


class SoftmaxGemmTemplate(KernelTemplate):
    """The softmax·V kernel of a cascade :func:`find_softmax_gemm` takes."""

    def find(self, func: tirx.PrimFunc) -> SoftmaxGemm:
        return find_softmax_gemm(func)

    def configs(self, found: SoftmaxGemm) -> list[SoftmaxGemmConfig]:
        return fitting_configs(found.shape)

    def default_config(self, found: SoftmaxGemm, hw: Hardware) -> SoftmaxGemmConfig:
        return default_config(found.shape, hw)

    def check(self, found: SoftmaxGemm, config: SoftmaxGemmConfig) -> None:
        check_config(found.shape, config)

    def kernel(self, found: SoftmaxGemm, config: SoftmaxGemmConfig) -> tirx.PrimFunc:
        return softmax_gemm_kernel(found, config)


TEMPLATE = SoftmaxGemmTemplate()
#: The fused kernel of a function (see :func:`find_softmax_gemm`), in a configuration or the
#: default's for a GPU.
fuse_softmax_gemm = TEMPLATE.fuse


def softmax_gemm_kernel(found: SoftmaxGemm, c: SoftmaxGemmConfig) -> tirx.PrimFunc:  # noqa: C901
    """The loop of the module docstring as one CUDA kernel's TIR."""
    s = found.shape
    M, K, J = s.rows, s.keys, s.columns
    BM, BK, BJ, TM, R = c.block_m, c.block_k, c.block_j, c.rows_per_thread, c.ranks
    THREADS = c.threads
    XPT = BM * BK // THREADS  # X elements per thread per tile: one row, consecutive keys
    XV = min(XPT, _LOAD_BYTES // _bytes(s.x_dtype))  # elements per load
    LANES = BK // XPT  # threads per row in the statistics
    TN = c.columns_per_thread
    V_PIECES = BK * BJ // (THREADS * _PIECE)  # pieces of V each thread loads per tile
    V_GROUPS = BJ // _PIECE  # pieces per V row
    COL_GROUPS = BJ // TN  # threads across the columns in the products
    SPAN = BJ // (TN // _PIECE)  # columns between a thread's pieces
    TILES = K // R // BK
    ROWS_PER_RANK = BM // R
    MERGED = ROWS_PER_RANK * BJ  # outputs rank q merges
    has_max, has_sum, has_product = found.written
    m_buf, l_buf, o_buf = found.results
    row_stages = [b for b in found.epilogue if len(b.iter_vars) == 1]
    cell_stages = [b for b in found.epilogue if len(b.iter_vars) == 2]
    # The product threads need their rows' max and sum: for 1 / l, or for stages reading them.
    needs_stats = found.normalizer != 1 or bool(cell_stages)
    STAGE_ROWS = TM if cell_stages else 0  # a thread's rows the stages write

    def product(acc_value, l_value):  # the product level's value from its accumulated sum
        if found.normalizer == 1:
            return acc_value
        return acc_value * ToTIR({"l": l_value}, "float32")(found.normalizer)

    def stage_inputs(m, l, acc_value=None):  # the level results a stage may read, as registers
        values = {m_buf: m, l_buf: l, o_buf: None if acc_value is None else product(acc_value, l)}
        return {buf: value for buf, value in values.items() if buf is not None and value is not None}

    def write_stages(stages, indices, registers):
        for block in stages:
            B.buffer_store(*bind_stage(block, indices, registers))

    def fix(old, new):
        return ToTIR({"y0_old": old, "y0_new": new}, "float32")(found.correction)

    def element(x_value, m):
        return ToTIR({"x": x_value, "m": m}, "float32")(found.element)

    def widen(value):
        return value if str(value.ty.dtype) == "float32" else T.Cast("float32", value)

    def row_reduce(op, values):  # a thread's values of its row, then the row's LANES threads
        return shuffle_reduce(op, tree_reduce(op, values), LANES)

    x_dtype, v_dtype = s.x_dtype, s.v_dtype

    @T.macro
    def load_tile(x, v, xr, vr, tx, row0, key, col0):
        """The thread's pieces of the X and V tiles starting at ``key`` into registers."""
        for q in T.unroll(XPT // XV):
            for e in T.vectorized(XV):
                xr[q * XV + e] = x[row0 + tx // LANES, key + tx % LANES * XPT + q * XV + e]
        for q in T.unroll(V_PIECES):
            for e in T.vectorized(_PIECE):
                vr[q * _PIECE + e] = v[key + (tx + q * THREADS) // V_GROUPS,
                                       col0 + (tx + q * THREADS) % V_GROUPS * _PIECE + e]

    @T.macro
    def load_peer(dst, peer, buf, offset, rank):
        """Element ``offset`` of ``buf`` in the cluster's CTA ``rank`` into ``dst``, through DSM."""
        T.evaluate(T.ptx.mapa.shared__cluster.u32(peer[0], T.cuda.cvta_generic_to_shared(
            buf.access_ptr("r", offset=offset)), T.Cast("uint32", rank)))
        T.evaluate(T.ptx.ld.shared__cluster.f32(dst, peer[0]))

    @T.prim_func(s_tir=True, check_well_formed=False)
    def fused(x: T.Buffer((M, K), x_dtype), v: T.Buffer((K, J), v_dtype), mx: T.Buffer((M,), "float32"),
              l_out: T.Buffer((M,), "float32"), o: T.Buffer((M, J), "float32")):
        T.func_attr({"tirx.noalias": True})
        for bx in T.thread_binding(M // BM * R, thread="blockIdx.x"):
            for by in T.thread_binding(J // BJ, thread="blockIdx.y"):
                for tx in T.thread_binding(THREADS, thread="threadIdx.x"):
                    with T.sblock("softmax_gemm"):
                        T.reads()
                        T.writes()
                        vs = T.sblock_alloc_buffer((BK, BJ), "float32", scope="shared")
                        ps = T.sblock_alloc_buffer((BK, BM), "float32", scope="shared")
                        fixes = T.sblock_alloc_buffer((BM,), "float32", scope="shared")
                        part_o = T.sblock_alloc_buffer((BM, BJ), "float32", scope="shared")
                        part_ml = T.sblock_alloc_buffer((2, BM), "float32", scope="shared")
                        xr = T.sblock_alloc_buffer((XPT,), x_dtype, scope="local")
                        vr = T.sblock_alloc_buffer((V_PIECES * 4,), v_dtype, scope="local")
                        acc = T.sblock_alloc_buffer((TM * TN,), "float32", scope="local")
                        p = T.sblock_alloc_buffer((XPT,), "float32", scope="local")
                        pk = T.sblock_alloc_buffer((TM,), "float32", scope="local")
                        vk = T.sblock_alloc_buffer((TN,), "float32", scope="local")
                        state = T.sblock_alloc_buffer((4,), "float32", scope="local")  # m, l, m', fix
                        peer = T.sblock_alloc_buffer((1,), "uint32", scope="local")
                        remote = T.sblock_alloc_buffer((1,), "float32", scope="local")
                        merged = T.sblock_alloc_buffer((4,), "float32", scope="local")  # max, fix, l, o
                        row0 = T.meta_var(bx // R * BM)
                        rank = T.meta_var(bx % R)
                        key0 = T.meta_var(rank * (K // R))
                        col0 = T.meta_var(by * BJ)
                        s_row = T.meta_var(tx // LANES)  # the statistics' row and keys (as load_tile's)
                        s_key = T.meta_var(tx % LANES * XPT)
                        g_row = T.meta_var(tx // COL_GROUPS * TM)  # the products' rows and columns
                        g_col = T.meta_var(tx % COL_GROUPS * 4)
                        load_tile(x, v, xr, vr, tx, row0, key0, col0)
                        for e in T.unroll(TM * TN):
                            acc[e] = T.float32(0)
                        state[0] = T.float32(_NEG)
                        state[1] = T.float32(0)
                        for t in range(TILES):
                            for q in T.unroll(V_PIECES):
                                for e in T.vectorized(4):
                                    vs[(tx + q * THREADS) // V_GROUPS, (tx + q * THREADS) % V_GROUPS * 4 + e] = widen(vr[q * 4 + e])
                            state[2] = T.max(state[0], row_reduce(tirx.max, [widen(xr[e]) for e in range(XPT)]))
                            state[3] = fix(state[0], state[2])
                            state[0] = state[2]
                            for e in T.unroll(XPT):
                                p[e] = element(widen(xr[e]), state[2])
                                ps[s_key + e, s_row] = p[e]
                            state[1] = state[1] * state[3] + row_reduce(operator.add, [p[e] for e in range(XPT)])
                            if tx % LANES == 0:
                                fixes[s_row] = state[3]
                            if t + 1 < TILES:
                                load_tile(x, v, xr, vr, tx, row0, key0 + (t + 1) * BK, col0)
                            T.tvm_storage_sync("shared")
                            for i in T.unroll(TM):
                                for e in T.unroll(TN):
                                    acc[i * TN + e] = acc[i * TN + e] * fixes[g_row + i]
                            for k in T.unroll(BK):
                                for i in T.vectorized(TM):
                                    pk[i] = ps[k, g_row + i]
                                for h in T.unroll(TN // _PIECE):
                                    for e in T.vectorized(_PIECE):
                                        vk[h * _PIECE + e] = vs[k, g_col + h * SPAN + e]
                                for i in T.unroll(TM):
                                    for e in T.unroll(TN):
                                        acc[i * TN + e] = acc[i * TN + e] + pk[i] * vk[e]
                            T.tvm_storage_sync("shared")
                        if R == 1:
                            if needs_stats:  # the statistics threads' max and sum, for the product threads
                                if tx % LANES == 0:
                                    part_ml[0, s_row] = state[0]
                                    part_ml[1, s_row] = state[1]
                                T.tvm_storage_sync("shared")
                            if has_product:
                                for i in T.unroll(TM):
                                    for h in T.unroll(TN // _PIECE):
                                        for e in T.vectorized(_PIECE):
                                            o[row0 + g_row + i, col0 + g_col + h * SPAN + e] = product(
                                                acc[i * TN + h * _PIECE + e], part_ml[1, g_row + i])
                            for i in T.unroll(STAGE_ROWS):
                                for h in T.unroll(TN // _PIECE):
                                    for e in T.unroll(_PIECE):
                                        write_stages(
                                            cell_stages, [row0 + g_row + i, col0 + g_col + h * SPAN + e],
                                            stage_inputs(part_ml[0, g_row + i], part_ml[1, g_row + i],
                                                         acc[i * TN + h * _PIECE + e]))
                            if tx % LANES == 0 and by == 0:
                                if has_max:
                                    mx[row0 + s_row] = state[0]
                                if has_sum:
                                    l_out[row0 + s_row] = state[1]
                                write_stages(row_stages, [row0 + s_row], stage_inputs(state[0], state[1]))
                        else:
                            for i in T.unroll(TM):
                                for h in T.unroll(TN // _PIECE):
                                    for e in T.vectorized(_PIECE):
                                        part_o[g_row + i, g_col + h * SPAN + e] = acc[i * TN + h * _PIECE + e]
                            if tx % LANES == 0:
                                part_ml[0, s_row] = state[0]
                                part_ml[1, s_row] = state[1]
                            T.evaluate(T.cuda.cluster_sync())  # every rank's partials are in place
                            for n in T.unroll((MERGED + THREADS - 1) // THREADS):
                                if n * THREADS + tx < MERGED:
                                    row = T.meta_var(rank * ROWS_PER_RANK + (n * THREADS + tx) // BJ)  # in the block
                                    merged[0] = T.float32(_NEG)
                                    for r in T.unroll(R):
                                        load_peer(remote[0], peer, part_ml, row, r)
                                        merged[0] = T.max(merged[0], remote[0])
                                    merged[2] = T.float32(0)
                                    merged[3] = T.float32(0)
                                    # Each rank's max is read again rather than kept: 16 of them in
                                    # registers run slower (docs/cascades.md).
                                    for r in T.unroll(R):
                                        load_peer(remote[0], peer, part_ml, row, r)
                                        merged[1] = fix(remote[0], merged[0])
                                        load_peer(remote[0], peer, part_ml, BM + row, r)
                                        merged[2] = merged[2] + remote[0] * merged[1]
                                        load_peer(remote[0], peer, part_o, row * BJ + (n * THREADS + tx) % BJ, r)
                                        merged[3] = merged[3] + remote[0] * merged[1]
                                    if has_product:
                                        o[row0 + row, col0 + (n * THREADS + tx) % BJ] = product(merged[3], merged[2])
                                    write_stages(cell_stages, [row0 + row, col0 + (n * THREADS + tx) % BJ],
                                                 stage_inputs(merged[0], merged[2], merged[3]))
                                    if (n * THREADS + tx) % BJ == 0 and by == 0:
                                        if has_max:
                                            mx[row0 + row] = merged[0]
                                        if has_sum:
                                            l_out[row0 + row] = merged[2]
                                        write_stages(row_stages, [row0 + row], stage_inputs(merged[0], merged[2]))
                            T.evaluate(T.cuda.cluster_sync())  # peers have read this CTA's partials

    body = fused.body
    if R > 1:
        def launch_cluster(block):  # consecutive blockIdx.x form one cluster (rank = bx % R)
            marked = tirx.AttrStmt(tvm.ir.StringImm("cluster"), CLUSTER_LAUNCH_KEY, R, block.body)
            return with_block_body(block, marked) if block.name_hint == "softmax_gemm" else block

        body = tvm_ffi.structural_map(body, [(SBlock, launch_cluster)])
    # The function's own parameters, in its order: the levels' results it keeps (the others are
    # not written) and its stages' outputs.
    params = [p if role is None else fused.params[role] for role, p in zip(found.order, found.params)]
    return tirx.PrimFunc(params, body, attrs=fused.attrs)
