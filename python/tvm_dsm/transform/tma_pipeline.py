"""Stream a main loop's operand tiles with TMA tensor copies that complete on per-stage mbarriers.

s_tir's software pipeline copies a tile as 16-byte ``cp.async`` per thread. On the H100 those
loads alone take as long as cuBLAS's whole GEMM (G5a: 66.5 us vs 52.6), while 2D TMA tensor
copies of the same tiles take 53.1 us (``src/hwbench/operand_stream.cu``,
``bench/results/archive/operand_stream.json``): one instruction per tile, issued by one thread,
with no per-thread address arithmetic and full 128-byte L2 requests.

The schedule marks a K loop with ``TMA_STAGES_KEY = S`` and the shared-memory copies in its
body with ``TMA_COPY_KEY`` (:func:`tvm_dsm.rules.tensor_core.stage_in_shared`). This pass,
run where s_tir's own software pipeline would run, rewrites the loop into::

    host:  cuTensorMapEncodeTiled per copied operand (128-byte swizzle), passed to the kernel
           as a __grid_constant__ CUtensorMap
    init:  (a dependent kernel, small weights: every step's tiles of a parameter prefetched
           into L2, see PREFETCH_WINDOW_S) the tensor maps' descriptors prefetched, one
           mbarrier per slot; the first S-1 steps' tiles issued
           (a dependent kernel: the parameters' tiles first, marked EARLY_COPY_KEY, so they
           may load while the previous kernel finishes; see programmatic_launch)
    for k:
        __syncthreads()                      # every warp is done with the slot refilled below
        one thread: issue step k+S-1 into slot (k+S-1) % S (expect_tx, one TMA copy per
                    128-byte panel of a tile)
        mbarrier wait on slot k % S, parity (k / S) % 2
        the body, reading slot k % S
    __syncthreads(); the mbarriers invalidated

A CTA barrier per step, not CUTLASS-style per-warp release mbarriers: with those the issuing
thread waits for the slowest warp's release and the refill starts later (measured slower,
docs/lowering.md).

The tiles land 128-byte swizzled (16-byte chunk c of row r at chunk ``c ^ (r % 8)``), so
ldmatrix reads them without bank conflicts and without padding; the pass rewrites every
ldmatrix of a copied tile to the swizzled slot, and points warpgroup MMAs
(:mod:`tvm_dsm.intrin.wgmma`, whose descriptors swizzle in hardware) at the slot's tiles. Those
return with their multiplies still reading the slot, so a loop that issues them refills a slot
two steps after it was read (``S - 2`` ahead) and waits for every multiply after the loop.
The hardware swizzles on absolute shared addresses, and TVM's shared-memory merge does not
promise a buffer 1024-byte alignment (it placed one at byte 2624), so each operand's slots start
at the first 1024-byte boundary inside a buffer one alignment larger, computed in the kernel.

What a copy must be (otherwise ClusterError): ``tile[a, b] = G[.., r0 + a, .., k0 + b]`` over
the whole unpadded tile, with ``G`` a contiguous global buffer the host allocates before the
launch (a parameter, or an intermediate of the function's root block such as the ``H`` between
the kernels of an unfused GEMM chain), ``b`` its innermost
axis, rows of whole 128-byte panels and at most 256 rows (TMA's box limit; a tile wider than one
panel lands as one box a panel, panel after panel, for warpgroup MMAs only). A tile that runs past
``G``'s edge (a GEMM padded to whole tiles, :func:`tvm_dsm.rules.split_k_gemm.apply_padded_split_k_gemm`)
may copy ``if_then_else(inside, G[..], 0)`` where ``inside`` holds exactly inside ``G``: the
tensor map describes ``G`` as it is, so the copy is issued unpredicated and TMA lands zeros
past the edge; the mbarrier still counts the whole box's bytes (:func:`zero_filled_load`).
"""

from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize
from tvm.ir import Range
from tvm.sym import Analyzer
from tvm.script import tirx as T

from ..errors import ClusterError
from ..hardware import Hardware
from ..ir import (IF_THEN_ELSE, declares, find_all, is_zero, items, replace_node, seq, substitute, tree_reduce,
                  with_block_body)
from .buffers import element_bytes, element_offset
from .programmatic_launch import L2_PREFETCH_KEY, launched_programmatically, read_only_params
from ..annotations import EARLY_COPY_KEY
from ..annotations import TMA_COPY_KEY, TMA_STAGES_KEY, WGMMA_HELPER_PREFIX

#: A kernel launched programmatically after another may warm L2 with all its tiles of a
#: parameter before it waits for the previous grid (tvm_dsm.transform.programmatic_launch),
#: when those tiles arrive within this time at HBM bandwidth: about the launch gap such a
#: prefetch hides. Larger footprints compete with the previous kernel for HBM, and its stream
#: evicts them before use (measurements: docs/lowering.md).
PREFETCH_WINDOW_S = 1e-6

ROW_BYTES = 128  # CU_TENSOR_MAP_SWIZZLE_128B: rows of 128 bytes, 16-byte chunks XOR (row % 8)
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
SLOT_ALIGN = 1024  # the swizzle pattern repeats every 8 rows of 128 bytes
MAX_BOX = 256



class _ByIdentity(dict):
    """A dict of buffers (Vars) whose ``get`` matches by identity, not by structural hash."""

    def get(self, key, default=None):
        return next((v for k, v in self.items() if k.same_as(key)), default)


class TileCopy:
    """One marked copy ``tile[a, b] = G[origin + (a along row_axis, b along the last axis)]``,
    or ``tile[a, b] = if_then_else(inside, G[..], 0)`` where ``inside`` says exactly that the
    element lies in ``G`` (a tile past the tensor's edge, see :func:`zero_filled_load`).
    ``outer``: the loops around the copy's nest, whose ranges that proof uses."""

    def __init__(self, nest, sources: list, analyzer: Analyzer, outer: list, lets: list = ()):
        loops = []
        while isinstance(nest, tirx.For):
            loops.append(nest)
            nest = nest.body
        realize = nest
        if not isinstance(realize, SBlockRealize) or len(loops) != 2:
            raise ClusterError("TMA copy: expected a 2-deep loop nest over one tile copy block")
        store = realize.block.body
        load = store.value if isinstance(store, tirx.BufferStore) else None
        if load is not None and not isinstance(load, tvm.ir.TensorLoad):
            load = zero_filled_load(load, [*outer, *loops], lets)
        if not isinstance(load, tvm.ir.TensorLoad) or not (
                analyzer.can_prove(realize.predicate) or _holds_where_run(realize, sources, [*outer, *loops], lets)):
            raise ClusterError(f"TMA copy {realize.block.name_hint}: not a plain, unpredicated copy, "
                               "nor one whose predicate says only that it reads inside the tensor")
        self.name = realize.block.name_hint
        self.tile, self.source = store.buffer, load.source
        (a, rows), (b, cols) = ((lp.loop_var, int(lp.extent)) for lp in loops)
        self.rows, self.cols = rows, cols
        self.dtype = str(self.tile.ty.dtype)
        self.elem_bytes = element_bytes(self.tile)
        shape = [int(d) for d in self.tile.shape]
        if shape != [rows, cols] or list(self.tile.strides):
            raise ClusterError(f"TMA copy {self.name}: the tile must be one unpadded "
                               f"{rows}x{cols} buffer, got shape {shape}")
        if cols * self.elem_bytes % ROW_BYTES or rows > MAX_BOX:
            raise ClusterError(f"TMA copy {self.name}: tiles need rows of whole {ROW_BYTES}-byte "
                               f"panels and at most {MAX_BOX} rows, got {rows}x{cols} {self.dtype}")
        #: Columns of one panel (a box of the tensor map): a tile wider than 128 bytes lands as
        #: that many boxes, panel after panel, each rows x 128 bytes (what a warpgroup MMA reads
        #: MN-major, its descriptor's leading offset one panel's bytes; ldmatrix reads single
        #: panels only). Each panel starts on a swizzle atom: whole 8-row groups.
        self.panel_cols = ROW_BYTES // self.elem_bytes
        self.panels = cols // self.panel_cols
        if self.panels > 1 and (rows * ROW_BYTES) % SLOT_ALIGN:
            raise ClusterError(f"TMA copy {self.name}: a tile of {self.panels} panels needs rows in "
                               f"whole swizzle atoms ({SLOT_ALIGN // ROW_BYTES}), got {rows}")
        if not all(analyzer.can_prove_equal(i, v) for i, v in zip(store.indices, (a, b))):
            raise ClusterError(f"TMA copy {self.name}: must write tile[a, b] in loop order")
        if not any(self.source.same_as(p) for p in sources) or list(self.source.strides):
            raise ClusterError(f"TMA copy {self.name}: the source must be a contiguous parameter "
                               "or global intermediate of the function")
        at_origin = [(a, tirx.const(0, a.ty)), (b, tirx.const(0, b.ty))]
        self.origin = [analyzer.simplify(substitute(i, at_origin)) for i in load.indices]
        offsets = [analyzer.simplify(i - o) for i, o in zip(load.indices, self.origin)]
        row_axes = [d for d, off in enumerate(offsets[:-1]) if analyzer.can_prove_equal(off, a)]
        rest = [off for d, off in enumerate(offsets[:-1]) if d not in row_axes[:1]]
        if (len(row_axes) < 1 or not analyzer.can_prove_equal(offsets[-1], b)
                or not all(analyzer.can_prove_equal(off, 0) for off in rest)):
            raise ClusterError(f"TMA copy {self.name}: reads {self.source.name}{offsets}; needs a "
                               "row axis and its innermost axis")
        self.row_axis = row_axes[0]
        self.rank = len(offsets)

    @property
    def bytes(self) -> int:
        return self.rows * self.cols * self.elem_bytes

    def encode(self, tensor_map: tirx.Var) -> tirx.Stmt:
        """Host statement encoding this copy's tensor map (CUDA's innermost-first order): boxes
        of one panel."""
        return encode_tensor_map(tensor_map, self.source, self.rows, self.panel_cols, self.row_axis)

    def coordinates(self, loop_var: tirx.Var, step, panel: int = 0) -> list:
        """The origin of the tile's ``panel`` at K step ``step``, innermost axis first."""
        coords = [tirx.Cast("int32", substitute(o, [(loop_var, step)])) for o in self.origin[::-1]]
        return [coords[0] + panel * self.panel_cols, *coords[1:]] if panel else coords


def zero_filled_load(value, loops: list, lets: list = ()):
    """The load ``G[i]`` of a copied value ``if_then_else(inside, G[i], 0)`` whose condition
    holds exactly where ``i`` lies in ``G`` (proven over the ranges of ``loops``, the loops
    around the copy); None for any other value. A TMA copy of it needs no predicate: where a
    box leaves the tensor its map describes, the copy lands zeros (and still counts the whole
    box's bytes on its mbarrier). ``lets``: the function's variables bound before its kernels
    (a view's extent, :mod:`tvm_dsm.transform.rows_as_matrix`), as ``tirx.Bind`` statements."""
    if not (isinstance(value, tvm.ir.Call) and value.op.same_as(IF_THEN_ELSE)):
        return None
    inside, load, otherwise = value.args
    if not isinstance(load, tvm.ir.TensorLoad) or not is_zero(otherwise):
        return None
    analyzer = _analyzer_over(loops, lets)
    in_tensor = tirx.const(True, "bool")
    for index, extent in zip(load.indices, load.source.shape):
        in_tensor = tirx.And(in_tensor, tirx.And(index >= 0, index < _tightest(extent, analyzer)))
    with analyzer.constraint_scope(_running_extents([load.source], loops)):
        with analyzer.constraint_scope(in_tensor):
            sufficient = analyzer.can_prove(inside)
        with analyzer.constraint_scope(inside):
            necessary = analyzer.can_prove(_quotients_as_products(in_tensor, analyzer))
    return load if sufficient and necessary else None


def _analyzer_over(loops: list, lets: list) -> Analyzer:
    """An analyzer of the variables ``lets`` binds and of ``loops``' ranges."""
    analyzer = Analyzer()
    for let in lets:
        analyzer.bind(let.var, let.value)
    for loop in loops:
        analyzer.bind(loop.loop_var, Range.from_min_extent(loop.min, loop.extent))
    return analyzer


def _holds_where_run(realize, sources: list, loops: list, lets: list) -> bool:
    """Whether ``realize``'s predicate holds wherever it runs: over the ranges of ``loops`` (the
    loops around it, thread bindings included) and what they imply of the tensors' extents
    (:func:`_running_extents`), quotients bounded as products (:func:`_quotients_as_products`)."""
    analyzer = _analyzer_over(loops, lets)
    with analyzer.constraint_scope(_running_extents([*sources, *_loads_of(realize.block.body)], loops)):
        return analyzer.can_prove(_quotients_as_products(realize.predicate, analyzer))


def _quotients_as_products(condition, analyzer: Analyzer):
    """``condition`` with each ``a // d < c`` written ``a < c * d`` where ``d`` is provably
    positive (the same then): a batch index of a symbolic grid, ``bx // (ceil(S / 16) * 56) < 8``,
    which the analyzer does not bound through the division."""
    def rewrite(lt):
        if isinstance(lt.a, tirx.FloorDiv) and analyzer.can_prove(lt.a.b > 0):
            return tirx.LT(lt.a.a, lt.b * lt.a.b)
        return lt

    return tvm_ffi.structural_map(condition, [(tirx.LT, rewrite)])


def _loads_of(stmt) -> list:
    """The tensors ``stmt`` reads."""
    return [ld.source for ld in find_all(stmt, tvm.ir.TensorLoad)]


def _running_extents(tensors: list, loops: list):
    """What a statement's running implies of the variables in ``tensors``' shapes: each is an
    extent, at least 0, and at least 1 where at 0 it empties one of ``loops``, the loops around
    the statement (a grid over a batch of products' symbolic rows, ``bx % (ceil(S / 16) * 56)``,
    is empty at S = 0, so a CTA runs only where that divisor is positive)."""
    holds = tirx.const(True, "bool")
    variables = {v.name: v for t in tensors for d in getattr(t.ty, "shape", None) or ()
                 for v in tirx.analysis.undefined_vars(d)}
    for var in variables.values():
        at_zero = [Analyzer().simplify(substitute(loop.extent, [(var, tirx.const(0, var.ty))])) for loop in loops]
        empties = any(isinstance(e, tirx.IntImm) and int(e) <= 0 for e in at_zero)
        holds = tirx.And(holds, var >= (1 if empties else 0))
    return holds


def _tightest(extent, analyzer: Analyzer):
    """``extent`` with each ``min(a, b)`` whose one side is provably the smaller replaced by it: an
    intermediate buffer compacted to the rows its kernels touch has the extent ``min(m, padded
    rows)``, which the analyzer does not reduce to ``m`` by itself."""
    if isinstance(extent, tirx.Min):
        a, b = _tightest(extent.a, analyzer), _tightest(extent.b, analyzer)
        if _at_least(b, a, analyzer):
            return a
        if _at_least(a, b, analyzer):
            return b
        return tirx.Min(a, b)
    return extent


def _at_least(x, y, analyzer: Analyzer) -> bool:
    """Whether ``x >= y`` provably, ``x`` or an expression below it made by keeping one side of
    each of its maxima: the rows kernels touch are a max over their ranges' padded rows and a
    few exact row counts' (``max(..., (m + 15) // 16 * 16 - 1, 3) + 1``), which the analyzer does
    not show to reach ``m`` although one term alone does."""
    return any(analyzer.can_prove(lower >= y) for lower in _below(x))


def _below(x) -> list:
    """``x`` and the expressions made from it by replacing each ``max(a, b)`` by ``a`` or ``b``
    (each at most ``x``), through sums."""
    if isinstance(x, tirx.Max):
        return [x, *_below(x.a), *_below(x.b)]
    if isinstance(x, tirx.Add):
        return [x, *(tirx.Add(a, b) for a in _below(x.a) for b in _below(x.b))]
    return [x]


def encode_tensor_map(tensor_map: tirx.Var, source: tirx.Buffer, rows: int, cols: int,
                      row_axis: int, axes: list[int] | None = None) -> tirx.Stmt:
    """Host statement encoding ``tensor_map`` (bound to ``T.tvm_stack_alloca("tensormap", 1)``):
    boxes of ``rows`` x ``cols`` of the contiguous ``source``, rows along ``row_axis`` and
    columns along its innermost axis, landing 128-byte swizzled. ``axes``: the source's axes in
    the map's dimension order (the innermost first, which must be the source's last axis); by
    default from the innermost outwards. A copy names its coordinates in that order."""
    # a symbolic extent (a batch) is read when the host encodes the map, before each launch
    shape = [int(d) if isinstance(d, tirx.IntImm) else d for d in source.shape]
    rank, elem_bytes = len(shape), element_bytes(source)
    axes = list(range(rank))[::-1] if axes is None else axes
    if axes[0] != rank - 1:
        raise ValueError(f"a tensor map's first dimension is the innermost axis; got axes {axes}")
    element_strides = [math.prod(shape[a + 1:]) for a in range(rank)]
    dims = [shape[a] for a in axes]
    strides = [element_strides[a] * elem_bytes for a in axes[1:]]
    box = [cols if a == rank - 1 else rows if a == row_axis else 1 for a in axes]
    # the map starts at the tensor's first element: past the data pointer by its element offset
    offset = element_offset(source)
    start = source.data if offset is None else tirx.call_intrin(
        "handle", "tirx.handle_add_byte_offset", source.data, tirx.Cast("int64", offset) * elem_bytes)
    encode = tirx.Evaluate(tirx.call_packed(
        "runtime.cuTensorMapEncodeTiled", tensor_map, str(source.ty.dtype), rank,
        start, *dims, *strides, *box, *([1] * rank),
        0, _SWIZZLE_128B, _L2_PROMOTION_256B, 0))
    symbolic = [d for d in dims if not isinstance(d, int)]
    if not symbolic:
        return encode
    # CUDA refuses a map of an empty tensor; the kernel is not launched for one either
    # (tvm_dsm.ir.branch_on)
    return tirx.IfThenElse(tree_reduce(tirx.And, [d > 0 for d in symbolic]), encode, None)


def swizzled_offset(offset, elem_bytes: int):
    """Element ``offset`` of a tile of 128-byte rows, in the 128-byte swizzled layout."""
    row_elems, chunk_elems = ROW_BYTES // elem_bytes, 16 // elem_bytes
    row, col = tirx.floordiv(offset, row_elems), tirx.floormod(offset, row_elems)
    chunk = tirx.bitwise_xor(tirx.floordiv(col, chunk_elems), tirx.floormod(row, 8))
    return row * row_elems + chunk * chunk_elems + tirx.floormod(col, chunk_elems)


class _TmaLoop:
    """One loop marked ``TMA_STAGES_KEY``, rewritten as described in the module docstring."""

    def __init__(self, loop: tirx.For, threads: list, sources: list, analyzer: Analyzer,
                 outer: list, lets: list = ()):
        """``outer``: the loops around ``loop``; ``lets``: the function's bound variables."""
        self.loop = loop
        #: In a dependent kernel, the copies from parameters: their first steps' tiles may load
        #: before the previous grid ends (see ``_prologue``), and ``prefetch`` says whether all
        #: their tiles are prefetched into L2 too (see ``_prefetch``).
        self.early: list[TileCopy] = []
        self.prefetch = False
        self.leader = tirx.const(True, "bool")  # thread 0 of the CTA issues the copies
        for var in threads:
            self.leader = tirx.And(self.leader, tirx.EQ(var, tirx.const(0, var.ty)))
        self.stages = int(loop.annotations[TMA_STAGES_KEY])
        realize = loop.body
        if not isinstance(realize, SBlockRealize):
            raise ClusterError("TMA pipeline: the loop body must be one block")
        self.block = realize.block
        self.copies, self.rest = [], []
        for item in items(self.block.body):
            if find_all(item, SBlock, lambda b: TMA_COPY_KEY in b.annotations):
                self.copies.append(TileCopy(item, sources, analyzer, [*outer, loop], lets))
            else:
                self.rest.append(item)
        if not self.copies:
            raise ClusterError("TMA pipeline: the loop copies no marked tile")
        self.slots = _ByIdentity({
            c.tile: tirx.decl_buffer((self.stages * c.rows * c.panels + SLOT_ALIGN // ROW_BYTES, c.panel_cols),
                                     c.dtype, f"{c.tile.name}_tma", scope="shared.dyn",
                                     data_alignment=16)
            for c in self.copies
        })
        self.maps = [tirx.Var(f"{c.source.name}_tensormap", T.handle("tensormap").ty)
                     for c in self.copies]
        # barrier s completes when slot s has received its tiles' bytes
        self.barriers = tirx.decl_buffer((self.stages,), "uint64", "tma_mbarrier",
                                         scope="shared.dyn", data_alignment=8)

    def plan_prefetch(self, params: list, ctas: int | None, budget: float, sm_count: int) -> None:
        """Let the copies from ``params`` prefetch all their tiles into L2 when the kernel's
        ``ctas`` CTAs (None: a symbolic grid, not prefetched) run in one wave of one CTA per SM
        (``sm_count``) and those tiles take at most ``budget`` bytes (see
        ``PREFETCH_WINDOW_S``), and copy their first steps' tiles early (see ``_prologue``). In
        a grid of several waves every CTA of a later wave would prefetch again what the first
        brought (ViT-B/16's qkv at 6304 rows, 600 CTAs, a 3.5 MB weight: 15% slower)."""
        self.early = [c for c in self.copies if any(c.source.same_as(p) for p in params)]
        if (ctas is None or ctas > sm_count
                or not all(isinstance(d, tirx.IntImm) for c in self.early for d in c.source.shape)):
            return
        steps = int(self.loop.extent)
        footprint = sum(min(ctas * steps * c.bytes, math.prod(int(d) for d in c.source.shape)
                            * element_bytes(c.source)) for c in self.early)
        self.prefetch = footprint <= budget

    # -- host -------------------------------------------------------------------------------
    def host(self) -> list:
        stmts = []
        for copy, tensor_map in zip(self.copies, self.maps):
            stmts.append(tirx.Bind(tensor_map, T.tvm_stack_alloca("tensormap", 1)))
            stmts.append(copy.encode(tensor_map))
        return stmts

    # -- device -----------------------------------------------------------------------------
    @staticmethod
    def _address(buffer, offset_bytes=0):
        """Shared-memory address of ``buffer`` plus ``offset_bytes``. Taken through a read-only
        access pointer at every use: ThreadSync then sees no write to fence (the copies are
        asynchronous, ordered by the mbarriers), and the shared
        memory merge sees the buffer live wherever it is used."""
        base = T.cuda.cvta_generic_to_shared(buffer.access_ptr("r"))
        return base + tirx.Cast("uint32", offset_bytes)

    def _barrier(self, slot):
        return self._address(self.barriers, slot * 8)

    def _aligned(self, slots):
        """Shared address of the first 1024-byte boundary in ``slots``: slot 0."""
        mask = tirx.const(SLOT_ALIGN - 1, "uint32")
        return tirx.bitwise_and(self._address(slots) + mask, tirx.bitwise_not(mask))

    def _lead(self, slots):
        """Elements of ``slots`` before slot 0 (its alignment)."""
        return tirx.Cast("int32", self._aligned(slots) - self._address(slots)) // element_bytes(slots)

    def _issue(self, step) -> tirx.Stmt:
        """One thread's statements loading K step ``step`` into its slot."""
        return seq([self._expect(step), *(self._copy(c, step) for c in self.copies)])

    def _expect(self, step) -> tirx.Stmt:
        """Arrive on ``step``'s slot barrier, announcing the bytes of all its tiles."""
        total = sum(c.bytes for c in self.copies)
        return tirx.Evaluate(T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(
            self._barrier(tirx.floormod(step, self.stages)), tirx.const(total, "uint32")))

    def _copy_of(self, tile) -> TileCopy:
        """The copy landing ``tile``."""
        return next(c for c in self.copies if c.tile.same_as(tile))

    def _map(self, copy: TileCopy) -> tirx.Var:
        """The tensor map ``copy`` reads through."""
        return self.maps[self.copies.index(copy)]

    def _copy(self, copy: TileCopy, step) -> tirx.Stmt:
        slot = tirx.floormod(step, self.stages)
        dst = self._aligned(self.slots.get(copy.tile)) + tirx.Cast("uint32", slot * copy.bytes)
        return seq([tirx.Evaluate(T.ptx[
            f"cp.async.bulk.tensor.{copy.rank}d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ](dst + tirx.const(panel * copy.rows * ROW_BYTES, "uint32"), T.address_of(self._map(copy)),
          *copy.coordinates(self.loop.loop_var, step, panel), self._barrier(slot)))
            for panel in range(copy.panels)])

    def _prologue(self, lookahead: int) -> list:
        """One thread's loads of the first ``lookahead`` steps. In a dependent kernel, the
        tiles of copies from parameters come first, each copy marked ``EARLY_COPY_KEY`` so that
        they may load before the kernel waits for the previous grid (see ``EARLY_COPY_KEY``)."""
        s = tirx.Var("tma_stage", "int32")

        def steps(body):
            return tirx.IfThenElse(self.leader, tirx.For(s, 0, lookahead, tirx.ForKind.SERIAL, body), None)

        if not self.early:
            return [steps(self._issue(s))]
        late = [c for c in self.copies if c not in self.early]
        return [steps(self._expect(s)),  # every tile's bytes announced before any copy lands
                *(tirx.AttrStmt(c.source, EARLY_COPY_KEY, 0, steps(self._copy(c, s))) for c in self.early),
                *([steps(seq([self._copy(c, s) for c in late]))] if late else [])]

    def _prefetch(self) -> list:
        """Where ``prefetch`` holds, for each early copy: one thread's L2 prefetch of the tiles of
        every step (see ``L2_PREFETCH_KEY``)."""
        stmts = []
        for copy in self.early if self.prefetch else []:
            s = tirx.Var("prefetch_step", "int32")
            issue = tirx.For(s, 0, self.loop.extent, tirx.ForKind.SERIAL, seq([tirx.Evaluate(T.ptx[
                f"cp.async.bulk.prefetch.tensor.{copy.rank}d.L2.global.tile"
            ](T.address_of(self._map(copy)), *copy.coordinates(self.loop.loop_var, s, panel)))
                for panel in range(copy.panels)]))
            stmts.append(tirx.AttrStmt(copy.source, L2_PREFETCH_KEY, 0,
                                       tirx.IfThenElse(self.leader, issue, None)))
        return stmts

    def _read_slot(self, body, slot):
        """``body`` with each copied tile read from ``slot`` of its swizzled slots."""

        def in_slot(tile, offset):
            """Read pointer to element ``offset`` of ``tile``'s copy in ``slot``."""
            slots = self.slots.get(tile)
            per_slot = int(tile.shape[0]) * int(tile.shape[1])
            return slots.access_ptr("r", offset=self._lead(slots) + slot * per_slot + offset)

        def ldmatrix(node):
            """ldmatrix(trans, num, type, frag, frag offset, access_ptr(tile, base), offset)."""
            if not node.op.name.endswith("ldmatrix") or len(node.args) != 7:
                return node
            args = list(node.args)
            ptr = args[5]
            tile = _pointee(ptr)
            if self.slots.get(tile) is None:
                return node
            if self._copy_of(tile).panels != 1:
                raise ClusterError(f"TMA pipeline: ldmatrix reads tiles of one {ROW_BYTES}-byte panel; "
                                   f"{tile.name} has {self._copy_of(tile).panels}")
            args[5] = in_slot(tile, swizzled_offset(ptr.args[2] + args[6], element_bytes(tile)))
            args[6] = tirx.const(0, "int32")
            return tvm.ir.Call(node.op, args, node.attrs, ret_ty=node.ty)

        def wgmma(node):
            """A warpgroup MMA's tile pointers (tvm_dsm.intrin.wgmma) to the slot's tiles,
            unswizzled: its descriptors name logical addresses and the hardware swizzles."""
            if not is_wgmma_call(node):
                return node
            args = list(node.args)
            for at, ptr in enumerate(args):
                tile = _pointee(ptr)
                if tile is not None and self.slots.get(tile) is not None:
                    if self._copy_of(tile).panels != 1 and not Analyzer().can_prove_equal(ptr.args[2], 0):
                        raise ClusterError(f"TMA pipeline: a warpgroup MMA reads {tile.name}'s panels "
                                           "from the tile's start only")
                    args[at] = in_slot(tile, ptr.args[2])
            return tvm.ir.Call(node.op, args, node.attrs, ret_ty=node.ty)

        def region(node):
            slots = self.slots.get(node.source)
            if slots is None:
                return node
            rows = int(node.source.shape[0]) * self._copy_of(node.source).panels
            return tirx.BufferRegion(slots, [Range.from_min_extent(slot * rows, rows),
                                             Range(0, int(slots.shape[1]))])

        body = tvm_ffi.structural_map(body, [(tvm.ir.Call, lambda c: wgmma(ldmatrix(c))),
                                             (tvm.ir.TensorRegion, region)])
        for tile in self.slots:
            if find_all(body, tirx.Var, lambda v, t=tile: v.same_as(t)):
                raise ClusterError(f"TMA pipeline: {tile.name} is read other than by ldmatrix or "
                                   "wgmma, which the swizzled slots cannot serve")
        return body

    def lower(self) -> tirx.Stmt:
        loop, stages, n = self.loop, self.stages, int(self.loop.extent)
        k = loop.loop_var
        slot = tirx.floormod(k, stages)
        inner = with_block_body(self.block, seq(self.rest), alloc_buffers=[
            b for b in self.block.alloc_buffers if self.slots.get(b) is None])
        # A step's warpgroup MMAs may still read its slot during the next step (they return
        # with their group in flight): refill a slot two steps after it was read, not one.
        deferred = bool(find_all(inner, tvm.ir.Call, is_wgmma_call))
        lookahead = stages - 2 if deferred else stages - 1
        if int(loop.min) != 0 or n < lookahead or lookahead < 1:
            raise ClusterError(f"TMA pipeline: {n} steps cannot fill {lookahead} stages ahead")
        inner = self._read_slot(inner, slot)
        ahead = k + lookahead
        parity = lambda step: tirx.floormod(tirx.floordiv(step, stages), 2)  # noqa: E731
        body = seq([
            tirx.Evaluate(T.tvm_storage_sync("shared")),
            tirx.IfThenElse(tirx.And(self.leader, ahead < n), self._issue(ahead), None),
            tirx.Evaluate(T.cuda.mbarrier_wait(self._barrier(slot), parity(k))),
            SBlockRealize([], True, inner),
        ])
        new_loop = tirx.For(k, loop.min, loop.extent, loop.kind, body, loop.thread_binding,
                            {key: v for key, v in loop.annotations.items() if key != TMA_STAGES_KEY})
        s = tirx.Var("tma_stage", "int32")
        stmts = [
            *self._prefetch(),
            # The descriptors first: the first copy through a map would otherwise wait for its
            # fetch.
            tirx.IfThenElse(self.leader, seq([
                *(tirx.Evaluate(T.ptx.prefetch.tensormap(T.address_of(m))) for m in self.maps),
                tirx.For(s, 0, stages, tirx.ForKind.SERIAL, tirx.Evaluate(
                    T.ptx.mbarrier.init.shared__cta.b64(self._barrier(s), 1))),
                tirx.Evaluate(T.ptx.fence.mbarrier_init.release.cluster()),
            ]), None),
            tirx.Evaluate(T.tvm_storage_sync("shared")),
            *self._prologue(lookahead),
            new_loop,
            *([tirx.Evaluate(T.ptx.wgmma.wait_group.sync.aligned(0))] if deferred else []),
            # Invalidate before the memory is reused (by the merge, or a re-run of the loop):
            # PTX leaves re-initialising a live mbarrier undefined.
            tirx.Evaluate(T.tvm_storage_sync("shared")),
            tirx.IfThenElse(self.leader, tirx.For(s, 0, stages, tirx.ForKind.SERIAL, tirx.Evaluate(
                T.ptx.mbarrier.inval.shared__cta.b64(self._barrier(s)))), None),
        ]
        wrapper = SBlock([], self.block.reads, self.block.writes, "tma_pipeline", seq(stmts),
                         alloc_buffers=[*self.slots.values(), self.barriers])
        return SBlockRealize([], True, wrapper)


def is_wgmma_call(call) -> bool:
    """Whether ``call`` issues warpgroup MMAs through a tvm_dsm.intrin.wgmma helper."""
    return call.op.name == "tirx.cuda.func_call" and call.args[0].value.startswith(WGMMA_HELPER_PREFIX)


def _pointee(ptr):
    """The buffer a ``tvm_access_ptr(type, buffer.data, ...)`` points into, or None."""
    if not (isinstance(ptr, tvm.ir.Call) and ptr.op.name == "tirx.tvm_access_ptr"):
        return None
    data = ptr.args[1]
    if isinstance(data, tvm.ir.Call) and data.op.name == "tirx.buffer_data":
        return data.args[0]
    return None


def _dependent_kernels(body) -> list:
    """The kernels (outermost ``blockIdx`` loops) after the first of a function launched
    programmatically: those that may prefetch any parameter no earlier kernel names before
    waiting for the previous grid (every kernel may prefetch ``read_only_params``)."""
    launches = find_all(body, tirx.For, lambda lp: _binds(lp, "blockIdx"))
    kernels = [k for k in launches if not any(_encloses(o, k) for o in launches)]
    return [k for i, k in enumerate(kernels)
            if any(not _alternatives(body, earlier, k) for earlier in kernels[:i])]


def _alternatives(body, first: tirx.For, second: tirx.For) -> bool:
    """Whether the kernels ``first`` and ``second`` sit in the two branches of one ``if`` (a
    function choosing its kernel by a row count: :mod:`tvm_dsm.families.row_ranges`), so that
    neither runs after the other."""
    return bool(find_all(body, tirx.IfThenElse, lambda node: node.else_case is not None and any(
        find_all(a, tirx.For, lambda lp: lp.same_as(first)) and find_all(b, tirx.For, lambda lp: lp.same_as(second))
        for a, b in ((node.then_case, node.else_case), (node.else_case, node.then_case)))))


def _binds(loop: tirx.For, tags) -> bool:
    """Whether ``loop`` is bound to a thread tag starting with ``tags`` (a str or a tuple)."""
    return loop.thread_binding is not None and str(loop.thread_binding.thread_tag).startswith(tags)


def _encloses(outer: tirx.For, loop: tirx.For) -> bool:
    return bool(find_all(outer.body, tirx.For, lambda lp: lp.same_as(loop)))


def _enclosing(body, loop: tirx.For, tags=None) -> list:
    """The loops around ``loop``, those bound to ``tags`` if given (a function may launch
    several kernels, each binding its own thread variables)."""
    return find_all(body, tirx.For, lambda lp: (tags is None or _binds(lp, tags)) and _encloses(lp, loop))


def _ctas(body, loop: tirx.For) -> int | None:
    """CTAs of the kernel enclosing ``loop``: its block and cluster-rank bindings' extents
    (None where a grid extent is symbolic)."""
    extents = [b.extent for b in _enclosing(body, loop, ("blockIdx", "clusterCtaIdx"))]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        return None
    return math.prod(int(e) for e in extents)


def _threads(body, loop: tirx.For) -> list:
    """The threadIdx variables of the kernel enclosing ``loop``."""
    return [b.loop_var for b in _enclosing(body, loop, "threadIdx")]


def _global_declaration(stmt) -> bool:
    """Whether ``stmt`` allocates or declares a global buffer (a workspace, a view of a parameter)."""
    return isinstance(stmt, (tirx.AllocBuffer, tirx.DeclBuffer)) and str(stmt.buffer.ty.storage_scope) == "global"


def _views_before_kernels(stmts: list, loops: list) -> int:
    """How many of the root block's statements ``stmts`` lead up to its last global buffer
    declaration (a view of a parameter a kernel written one operator at a time reads, declared
    after the kernels before it), where every TMA loop of ``loops`` lies in a statement after
    it; 0 otherwise. Host statements of the TMA kernels go after those views: the tensor maps
    are encoded from them."""
    declared = [n for n, stmt in enumerate(stmts) if _global_declaration(stmt)]
    if not declared:
        return 0
    after = declared[-1] + 1
    within = [n for n, stmt in enumerate(stmts) for loop in loops
              if find_all(stmt, tirx.For, lambda lp, loop=loop: lp.same_as(loop))]
    return after if all(n >= after for n in within) else 0


def lower_tma_pipeline(func: tirx.PrimFunc, hw: Hardware) -> tirx.PrimFunc:
    """Rewrite every loop marked ``TMA_STAGES_KEY`` (see the module docstring); ``hw``'s HBM
    bandwidth sizes the L2 prefetch of a dependent kernel (``PREFETCH_WINDOW_S``)."""
    loops = find_all(func.body, tirx.For, lambda lp: TMA_STAGES_KEY in lp.annotations)
    if not loops:
        return func
    # Buffers whose address the host holds before the launch: the tensor maps are encoded there.
    # A function may first declare global buffers (workspaces, views of its parameters:
    # tvm_dsm.rules.conv_chain, tvm_dsm.transform.rows_as_matrix, with the variables their
    # shapes use) and then hold its root block.
    stmts = items(func.body)
    decls, body = stmts[:-1], stmts[-1]
    if not all(declares(d) for d in decls):
        decls, body = [], func.body
    sources = list(func.params) + [d.buffer for d in decls if _global_declaration(d)]
    views = 0  # the root block's leading statements up to its last view of a parameter
    if isinstance(body, SBlockRealize):
        sources += [b for b in body.block.alloc_buffers if b.scope() == "global"]
        views = _views_before_kernels(items(body.block.body), loops)
        sources += [d.buffer for d in items(body.block.body)[:views] if _global_declaration(d)]
    analyzer = Analyzer()
    host = []
    programmatic = launched_programmatically(func)
    dependent = _dependent_kernels(body) if programmatic else []
    read_only = read_only_params(func) if programmatic else []
    budget = hw.hbm_bw * PREFETCH_WINDOW_S
    for loop in loops:
        lowering = _TmaLoop(loop, _threads(func.body, loop), sources, analyzer,
                            _enclosing(func.body, loop), [d for d in decls if isinstance(d, tirx.Bind)])
        if any(_encloses(k, loop) for k in dependent):
            lowering.plan_prefetch(list(func.params), _ctas(func.body, loop), budget, hw.sm_count)
        elif read_only:  # the first kernel: the parameters no kernel writes
            lowering.plan_prefetch(read_only, _ctas(func.body, loop), budget, hw.sm_count)
        body = replace_node(body, loop, lowering.lower())
        host += lowering.host()
    if isinstance(body, SBlockRealize):  # the root block: host statements go before the launch
        root = body.block
        leading = items(root.body)[:views]
        body = SBlockRealize(body.iter_values, body.predicate,
                             with_block_body(root, seq([*leading, *host, *items(root.body)[views:]])))
    else:
        body = seq([*host, body])
    body = seq([*decls, body])
    return func.with_body(body)


def LowerTmaPipeline(hw: Hardware) -> tvm.transform.Pass:
    """Pass form of :func:`lower_tma_pipeline` for the GPU ``hw`` describes."""

    @tirx.transform.prim_func_pass(opt_level=0, name="tvm_dsm.LowerTmaPipeline")
    def lower(func: tirx.PrimFunc, _mod: tvm.IRModule, _ctx) -> tirx.PrimFunc:
        return lower_tma_pipeline(func, hw)

    return lower

