"""Group attention a Relax model spells out into one TIR function, so the attention family sees it.

A model written with ``relax.frontend.nn`` operators (BERT's and ViT's self-attention: ``matmul(q,
k^T) * scale``, ``softmax``, ``matmul(p, v)``) reaches TIR as three functions after ``FuseOps``
(a reduction ends a group): a batched matmul that dlight schedules, a softmax, another batched
matmul, the scores and probabilities written to memory and read back between them. The attention
family recognizes attention by meaning within one function (:mod:`tvm_dsm.kernels.attention_pattern`).
:func:`FuseAttention` groups the calls first with Relax's pattern fusion, after ``LegalizeOps``: a
product of two activations, at most :data:`_MAX_ELEMENTWISE` element-wise operators (a scale), a
softmax (a row max and a row sum), and a product of the probabilities with a third activation;
an element-wise operator may take other inputs (BERT's additive mask, a ``where`` over a bool
mask), which the attention kernel computes per key (:class:`tvm_dsm.kernels.attention_pattern.ScoreTerms`).
At a decode step (one query row), where k and v reach the products through copies that repeat
their heads for the query heads (grouped-query attention as Hugging Face's ``repeat_kv`` writes
it: ``expand_dims``, ``broadcast_to``, ``reshape``), those copies join the group: inlined, the
products read ``k[b, h // g, t, d]``, each KV head's rows once for its ``g`` query heads, where
apart they are a kernel writing ``g`` copies of the cache that attention then reads.
``FuseTIR`` then makes one PrimFunc of each group. Only attention of the attention family's
form is grouped (constant heads and batch, head dims a multiple of 8 up to 256); a group no
family takes is scheduled operator by operator (:class:`tvm_dsm.relax_integration.ScheduleTIR`).
"""

from __future__ import annotations

import functools
import operator

import tvm
from tvm import tirx
from tvm.ir import TensorLoad
from tvm.relax.dpl import DFPattern, wildcard

from .ir import find_all, is_reduction, root_blocks
from .relax_grouping import call_tir, group_calls

#: Name of the composite functions the pattern fusion makes.
COMPOSITE = "tvm_dsm.attention"
_MAX_ELEMENTWISE = 8  # operators between the scores and the softmax
_MAX_AFTER = 3  # operators of the probabilities alone between the softmax and the second product
_MAX_REPEAT = 3  # copies between a cache tensor and a product (expand_dims, broadcast_to, reshape)


def _repeated(operand: DFPattern) -> DFPattern:
    """``operand`` through 1 to :data:`_MAX_REPEAT` one-input calls, the most first."""
    chains = []
    for length in range(_MAX_REPEAT, 0, -1):
        chain = operand
        for _ in range(length):
            chain = call_tir(chain)
        chains.append(chain)
    return functools.reduce(operator.or_, chains)


def attention_patterns(products: DFPattern) -> list:
    """The scores' product (a call of a function ``products`` matches), up to
    :data:`_MAX_ELEMENTWISE` element-wise operators (each of the scores alone, a scale, a cast,
    a soft cap's tanh, or of the scores and other inputs: an additive mask, ``where(mask,
    scores, fill)``), the softmax, up to :data:`_MAX_AFTER`
    operators of the probabilities alone (a cast back to the 16-bit type, where the model
    upcasts the softmax: ``softmax(s.float()).to(dtype)``; a view), the product with v, and
    perhaps its cast to the operands' type; most operators first (pattern fusion takes the
    first match)."""
    def step(s):  # one operator of the scores, at any of its (up to three) operands
        forms = [call_tir(*(s if n == at else wildcard() for n in range(arity))) for arity in (1, 2, 3)
                 for at in range(arity)]
        return functools.reduce(operator.or_, forms)

    patterns = []
    # a pattern object matches one expression wherever it stands: one for k, another for v
    for kv in (lambda: _repeated(wildcard()), wildcard):
        for after in range(_MAX_AFTER, -1, -1):
            for between in range(_MAX_ELEMENTWISE, -1, -1):
                scores = call_tir(wildcard(), kv(), func=products)
                for _ in range(between):
                    scores = step(scores)
                probabilities = call_tir(scores)
                for _ in range(after):
                    probabilities = call_tir(probabilities)
                output = call_tir(probabilities, kv())
                patterns += [call_tir(output), output]  # the output cast to the operands' type, or as it is
    return patterns


def _attention_operand(buf) -> bool:
    """Whether ``buf`` (k of the scores' product, v of the output's: ``[..heads, keys, dim]``)
    has the form the attention family takes: constant heads, a head dim that is a constant
    multiple of 8 up to 256; the keys and the batch (the outer axis of four) may be variables."""
    *heads, _, dim = buf.ty.shape
    return (all(isinstance(d, tirx.IntImm) for d in heads[len(heads) - 1:]) and isinstance(dim, tirx.IntImm)
            and int(dim) % 8 == 0 and int(dim) <= 256)


def _kind(func: tirx.PrimFunc) -> str | None:
    """``"product"`` (one reduction block, a sum of products of two tensors of one 16-bit
    type and one rank, 3 or 4: activations, not a weight; the second in the attention family's
    form, :func:`_attention_operand`; ``"one_row_product"`` where its rows are one query, a
    decode step's), ``"softmax"`` (a row max and a row sum, then element-wise blocks),
    ``"repeat"`` or ``"copy"`` (:func:`_copied_elements`), ``"elementwise"`` (no reduction) or None."""
    blocks = root_blocks(func)
    reductions = [b for b in blocks if is_reduction(b)]
    if not reductions:
        return _copied_elements(func, blocks) or "elementwise"
    if len(blocks) == 1:
        block = blocks[0]
        operands = [r.source for r in block.reads if not r.source.same_as(block.writes[0].source)]
        types = {str(o.ty.dtype) for o in operands}
        ranks = {len(o.ty.shape) for o in operands}
        if len(operands) == 2 and len(types) == 1 and types <= {"float16", "bfloat16"} and ranks in ({3}, {4}):
            if not _attention_operand(operands[1]):  # activations, not a weight
                return None
            rows = block.writes[0].source.ty.shape[-2]
            return "one_row_product" if isinstance(rows, tirx.IntImm) and int(rows) == 1 else "product"
        return None
    if len(reductions) == 2 and find_all(reductions[0].body, tirx.Max) and not find_all(reductions[1].body, tirx.Max):
        return "softmax"
    return None


def _copied_elements(func: tirx.PrimFunc, blocks: list) -> str | None:
    """``"repeat"`` where ``func`` copies the elements of its one input into an output of more
    (``broadcast_to``), ``"copy"`` into one of as many (a reshape, ``expand_dims``): each block
    stores a load, nothing computed; else None."""
    if len(func.params) != 2 or not all(hasattr(p.ty, "shape") for p in func.params):  # a scalar parameter
        return None
    numel = [functools.reduce(operator.mul, p.ty.shape, 1) for p in func.params]
    if (not all(isinstance(n, tirx.IntImm) for n in numel) or int(numel[1]) < int(numel[0])
            or not all(isinstance(s.value, TensorLoad) for b in blocks for s in find_all(b.body, tirx.BufferStore))):
        return None
    return "repeat" if int(numel[1]) > int(numel[0]) else "copy"


#: The kinds of the attention's two products.
_PRODUCTS = ("product", "one_row_product")


def _accept(kinds: list[str | None], sources: list[str | None]) -> bool:
    """The calls' PrimFuncs are two products, a softmax and element-wise operators (the
    patterns order them); the calls reading only what the group does not compute are the
    products, or, at a decode step (products of one query row), the copies before them where
    those repeat the KV heads (a broadcast for k and one for v). A prefill's repeats stay apart:
    its kernel takes q before k and v, which the copies' grouping would put first."""
    products = [k for k in kinds if k in _PRODUCTS]
    copies = kinds.count("repeat") + kinds.count("copy")
    heads_repeated = (kinds.count("repeat") == 2 and products == ["one_row_product"] * 2
                      and set(sources) <= {"repeat", "copy", *_PRODUCTS})
    return (len(products) == 2 and kinds.count("softmax") == 1
            and kinds.count("elementwise") + copies == len(kinds) - 3
            and (heads_repeated or set(sources) <= set(_PRODUCTS)))


@tvm.transform.module_pass(opt_level=0, name="tvm_dsm.FuseAttention")
def FuseAttention(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 - TVM pass style
    """Group each spelled-out attention of ``mod`` into one function (see the module docstring)."""
    return group_calls(mod, COMPOSITE, attention_patterns, _kind, _accept, _PRODUCTS)
