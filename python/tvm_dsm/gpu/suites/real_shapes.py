"""The performance floor on real models' shapes (tvm_dsm.workloads.real_models): each layer as a
user writes it, built through ``tvm_dsm.build``'s path (a family, else the fallback), against
the better of torch's contenders on the same run (:data:`_PEERS`). Every row
carries its ``class``:

- ``swiglu``: the model's MLP as one SwiGLU chain function ``(silu(X Wg^T) * (X Wu^T)) W2^T``
  over M rows; for a mixture of experts one expert's MLP, M the rows routed to it. Gemma's
  GeGLU MLP is timed at its shape with SiLU's gate: the GEMMs are the cost.
- ``dense``: the attention projections, Q, K and V fused ([heads + 2 kv heads] x head dim
  columns) and O, over M rows (Qwen2's QKV bias left out).
- ``attention``: prefill in the user's [B, H, S, D] layout, the model's heads, kv heads and
  head dim, causal and not, at S of :data:`SEQ_LENS`; the batch makes each case at least
  :data:`ATTENTION_FLOPS` without the mask.

  A model whose head dim the attention kernel does not take (outside :data:`ATTENTION_DIMS`:
  Gemma's 256) has neither class: its FFN and norm only.
- ``norm``: RMSNorm over the hidden size (TOPI's, epsilon 1e-5) at M rows.

All fp16. Not every model at every M: the three :data:`REPRESENTATIVES` (1B, 8B and 70B
Llamas) at every M of :data:`ROWS` and S of :data:`SEQ_LENS`, the other models at
:data:`FEW_ROWS` and :data:`FEW_SEQ_LENS`. Cases of the same shape (Mistral-7B's, Mixtral's
experts' and Llama-3-8B's MLPs) are one variant whose ``uses`` names every model layer of it.
That is 260 variants (swiglu 60, dense 108, attention 44, norm 48), each named after its class
first (``--only swiglu_`` runs one class).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ...driver import plan, schedule
from ...errors import ClusterError
from ...workloads.attention_forms import te_attention
from ...workloads.chains import swiglu_ffn
from ...workloads.dense import dense
from ...workloads.norms import topi_norm
from ...workloads.real_models import MODELS, ModelConfig
from .base import Variant, args_of, nbytes_of

#: The models measured at every row count and sequence length: small, mid-size, 70B-class.
REPRESENTATIVES = ("Llama-3.2-1B", "Llama-3-8B", "Llama-3-70B")
#: Rows (tokens) per call: decode batches to prefill chunks.
ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
FEW_ROWS = (1, 16, 128, 1024)
#: Prefill lengths.
SEQ_LENS = (512, 1024, 2048, 4096)
FEW_SEQ_LENS = (1024, 4096)
#: Head dims the attention kernel takes.
ATTENTION_DIMS = (64, 96, 128)
#: Least work of one attention case (unmasked): batches are added up to it.
ATTENTION_FLOPS = 4e9

CLASSES = ("swiglu", "dense", "attention", "norm")


@dataclass(frozen=True)
class Case:
    """One shape of one class, and the model layers that run at it ("model:layer").
    ``shape``: (m, n, k) for swiglu (l = k) and dense, (m, width) for norm, (batch, heads,
    kv_heads, seq, dim, causal) for attention."""

    cls: str
    shape: tuple
    uses: tuple[str, ...]


def _model_cases(model: ModelConfig) -> list[tuple[str, tuple, str]]:
    """(class, shape, layer) of every case of ``model``."""
    rows = ROWS if model.name in REPRESENTATIVES else FEW_ROWS
    seq_lens = SEQ_LENS if model.name in REPRESENTATIVES else FEW_SEQ_LENS
    mlp = "expert_mlp" if model.moe else "mlp"
    cases = []
    attention = model.head_dim in ATTENTION_DIMS
    for m in rows:
        cases += [("swiglu", (m, model.ffn, model.hidden), mlp), ("norm", (m, model.hidden), "rms_norm")]
        if attention:
            cases += [("dense", (m, model.qkv, model.hidden), "qkv_proj"),
                      ("dense", (m, model.hidden, model.attention_width), "o_proj")]
    if attention:
        for s in seq_lens:
            per_batch = 4 * model.heads * s * s * model.head_dim
            batch = max(1, math.ceil(ATTENTION_FLOPS / per_batch))
            cases += [("attention", (batch, model.heads, model.kv_heads, s, model.head_dim, causal), "attention")
                      for causal in (False, True)]
    return cases


def cases() -> list[Case]:
    """Every case of the suite, by class, each shape once."""
    uses: dict[tuple[str, tuple], list[str]] = {}
    for model in MODELS:
        for cls, shape, layer in _model_cases(model):
            uses.setdefault((cls, shape), []).append(f"{model.name}:{layer}")
    return sorted((Case(cls, shape, tuple(names)) for (cls, shape), names in uses.items()),
                  key=lambda case: CLASSES.index(case.cls))


def sample_cases() -> list[Case]:
    """One case per class, the median by work: a quick check that each class builds."""
    every = cases()
    picked = []
    for cls in CLASSES:
        of_class = sorted((c for c in every if c.cls == cls), key=lambda c: (math.prod(c.shape), c.shape))
        picked.append(of_class[len(of_class) // 2])
    return picked


@dataclass(frozen=True)
class _Built:
    """A case's function, its variant's name and workload (the key of its reference), and
    what the variant records beside: flops, each argument's initial scale (0: unit), the
    reference's keyword arguments and the result row's own fields."""

    func: object
    name: str
    workload: str
    flops: int
    scales: list = field(default_factory=list)
    reference_kwargs: dict = field(default_factory=dict)
    fields: dict = field(default_factory=dict)


def _plan(func) -> dict:
    """The family ``tvm_dsm.build`` schedules ``func`` with and its configuration's fields (a
    measured pick: python -m tvm_dsm.bench.calibrate reads them), or "fallback" (dlight, or one
    schedule per operator)."""
    try:
        best = plan(func)
    except ClusterError:
        return {"family": "fallback"}
    config = best.best.config
    return {"family": best.family.name, **(dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {})}


def _swiglu(case: Case) -> _Built:
    m, n, k = case.shape
    return _Built(swiglu_ffn(m, n, k, k), f"swiglu_{n}x{k}_m{m}", "swiglu", 6 * m * n * k,
                  [0, k ** -0.5, k ** -0.5, n ** -0.5], fields={"m": m, "n": n, "k": k})


def _dense(case: Case) -> _Built:
    m, n, k = case.shape
    return _Built(dense(m, n, k), f"dense_{n}x{k}_m{m}", "dense", 2 * m * n * k, [0, k ** -0.5],
                  fields={"m": m, "n": n, "k": k})


def _norm(case: Case) -> _Built:
    m, width = case.shape
    return _Built(topi_norm("rms_norm", m, width, "float16"), f"norm_{width}_m{m}", "rms_norm", 0,
                  fields={"m": m, "width": width})


def _attention(case: Case) -> _Built:
    batch, heads, kv_heads, s, dim, causal = case.shape
    return _Built(te_attention(batch, heads, s, s, dim, kv_heads=kv_heads, causal=causal),
                  f"attention_b{batch}h{heads}kv{kv_heads}s{s}d{dim}{'_causal' if causal else ''}",
                  "attention_layout", 4 * batch * heads * s * s * dim // (2 if causal else 1),
                  reference_kwargs={"layout": "bhsd", "causal": causal},
                  fields={"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq": s, "dim": dim,
                          "causal": causal})


_BUILDERS: dict[str, Callable[[Case], _Built]] = {
    "swiglu": _swiglu, "dense": _dense, "attention": _attention, "norm": _norm}


#: torch's contenders per class. A lone projection under torch.compile calls the same cuBLAS GEMM
#: as eager (inductor's default lowers mm to the extern kernel), and attention's best torch form
#: is SDPA: torch.compile only where it generates kernels of its own (SwiGLU's gating, norms).
_PEERS: dict[str, tuple[str, ...]] = {
    "swiglu": ("torch_eager", "torch_compile"), "dense": ("torch_eager",),
    "attention": ("torch_eager", "torch_sdpa"), "norm": ("torch_eager", "torch_compile")}


def variant(case: Case) -> Variant:
    """``case`` as a Variant: the driver's schedule, torch's peers (SDPA too for attention)."""
    built = _BUILDERS[case.cls](case)
    args = args_of(built.func)
    for a, scale in zip(args, built.scales):
        if scale:  # weights initialized like torch.nn.Linear's: outputs of unit scale
            a["scale"] = scale
    peers = _PEERS[case.cls]
    return Variant(name=built.name, workload=built.workload, mod=schedule(built.func).mod, args=args,
                   bytes=nbytes_of(args), flops=built.flops, plan=_plan(built.func), peers=peers,
                   reference_kwargs=built.reference_kwargs,
                   extra={"class": case.cls, "uses": list(case.uses), **built.fields})


def real_shapes(sample: bool = False) -> list[Variant]:
    """Every case of :func:`cases` as a Variant; ``sample``: only :func:`sample_cases`."""
    return [variant(case) for case in (sample_cases() if sample else cases())]
