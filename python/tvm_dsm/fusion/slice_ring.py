"""A lane's moving slices (the key and value rows of decode attention) staged through a ring of
chunks in shared memory, filled by ``cp.async`` (CUDA only).

Register double buffering keeps one chunk in flight per thread and pays for it in registers,
which caps the warps an SM holds and so the bytes in flight. The ring keeps ``stages`` - 1
chunks in flight in shared memory: step t waits for chunk t (``wait_group(stages - 1)``;
every step commits one group, whose copies read nothing past the end), copies it into the
slice registers the step reads, and after the step's work, when those registers have been
read, refills the same slot with chunk t + stages. Each thread reads only what it copied, so no
CTA barrier is needed. Ring index: [part within the CTA, slot, 16-byte piece of the chunk, lane,
element of the piece]: a warp's lanes read adjacent 16-byte words, without bank conflicts.
"""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx.script.builder import ir as T

PIECE_BYTES = 16  # one cp.async.cg copy; every piece of a ring is exactly this


def slice_piece(width: int, dtype: str) -> int:
    """Elements per copy of a ``width``-element slice: 16 bytes where the slice divides into
    them, else 1."""
    piece = max(1, min(width, PIECE_BYTES // tvm.DataType(dtype).itemsize))
    return piece if width % piece == 0 else 1


class SliceRing:
    """The ring of ``block.copy_stages`` chunks of a fused block's moving lane slices (inside
    its thread block). ``element(t, v)``: the reduction element v of chunk t; ``steps``:
    the chunks of the scan. The block's slice registers of those sources become the ring's."""

    def __init__(self, block, rows: list, element, steps: int):
        self.block, self.rows, self.element, self.steps = block, rows, element, steps
        self.stages = block.copy_stages
        self.part = tirx.floordiv(block.part, block.ranks)
        # (load, owner, width, elements per 16-byte piece) of each moving slice
        self.sources = [(load, owner, width, slice_piece(width, str(load.source.ty.dtype)))
                        for load, owner, width in block.slice_sources(True)]
        self.rings, self.registers = {}, {}
        for load, _owner, width, piece in self.sources:
            dtype = str(load.source.ty.dtype)
            size = tvm.DataType(dtype).itemsize
            if piece * size != PIECE_BYTES:
                raise ValueError(f"copy stages need {PIECE_BYTES}-byte slices; "
                                 f"{load.source.name}'s are {width * size} bytes")
            self.rings[load.source] = T.sblock_alloc_buffer(
                [block.parts // block.ranks, self.stages, block.vector * width // piece, block.lanes, piece],
                dtype, scope="shared")
            self.registers[load.source] = T.sblock_alloc_buffer([block.vector * width], dtype, scope="local")
            block.slices[load.source] = self.registers[load.source], width, True
        # The rings' shared addresses, taken once: TVM's barrier planner (ThreadSync) counts an
        # address_of as a shared-memory write, and taken inside the scan it asked for a barrier.
        self.base = T.sblock_alloc_buffer([len(self.sources)], "uint32", scope="local")
        for n, (load, *_rest) in enumerate(self.sources):
            T.buffer_store(self.base, T.cuda.cvta_generic_to_shared(
                T.address_of(self.rings[load.source][self.part, 0, 0, block.lane, 0])), [n])
        for s in range(self.stages):
            self._issue(tirx.const(s, "int32"), tirx.const(s, "int32"))

    def _issue(self, step, slot) -> None:
        """cp.async of chunk ``step``'s slices into ``slot``, committed as one group; past the
        last chunk the copies read nothing (``ignore-src``: the slot is zero-filled, never read),
        so every thread commits a group per step without a branch."""
        block = self.block
        past = step >= self.steps
        step = tirx.min(step, self.steps - 1)
        for n, (load, owner, width, piece) in enumerate(self.sources):
            pieces = block.vector * width // piece
            for v in range(block.vector):
                *prefix, start = block.slice_start(load, owner, self.rows, self.element(step, v), width)
                for c in range(width // piece):
                    offset = (slot * pieces + v * width // piece + c) * block.lanes * PIECE_BYTES
                    dst = self.base[n] + tirx.Cast("uint32", offset)
                    src = T.address_of(tirx.BufferLoad(load.source, prefix + [start + c * piece]))
                    T.evaluate(T.ptx.cp.async_.cg.shared.global_(dst, src, PIECE_BYTES, past))
        T.evaluate(T.ptx.cp.async_.commit_group())

    def take(self, t) -> None:
        """Wait for chunk ``t`` and copy it into the slice registers."""
        T.evaluate(T.ptx.cp.async_.wait_group(self.stages - 1))
        slot = tirx.floormod(t, self.stages)
        for load, _owner, width, piece in self.sources:
            registers, ring = self.registers[load.source], self.rings[load.source]
            with T.serial(self.block.vector * width // piece) as outer:
                with T.vectorized(piece) as inner:
                    T.buffer_store(registers, ring[self.part, slot, outer, self.block.lane, inner],
                                   [outer * piece + inner])

    def refill(self, t) -> None:
        """Chunk ``t + stages`` into the slot chunk ``t`` used."""
        self._issue(t + self.stages, tirx.floormod(t, self.stages))
