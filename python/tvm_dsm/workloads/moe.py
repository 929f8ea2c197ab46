"""A mixture-of-experts block as a ``relax.frontend.nn`` user writes it first: a router, top-k
experts per token with renormalized weights (as Mixtral routes), and every expert's SwiGLU MLP
applied to every token, each weighted by its routing weight (zero where not chosen).

Computing every expert for every token costs ``experts / k`` times the FLOPs of a gathered
(grouped-GEMM) MoE; it is the form that needs no custom kernels, and it gives tvm-dsm's
pipeline the router (softmax + top-k: MoE routing) and the expert GEMMs to take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op


@dataclass(frozen=True)
class MoEConfig:
    hidden_size: int
    intermediate_size: int
    experts: int
    top_k: int
    dtype: str = "float16"


#: Mixtral's routing (8 experts, top 2) at a 1B-class width, and a fine-grained router (64
#: experts, top 8) as in DeepSeek- and Qwen-MoE models.
MOE_8X2 = MoEConfig(hidden_size=2048, intermediate_size=1024, experts=8, top_k=2)
MOE_64X8 = MoEConfig(hidden_size=2048, intermediate_size=256, experts=64, top_k=8)
MOE_TINY = MoEConfig(hidden_size=64, intermediate_size=32, experts=8, top_k=2)


class MoEBlock(nn.Module):
    """``x [tokens, hidden]`` to ``[tokens, hidden]`` (see the module docstring)."""

    def __init__(self, config: MoEConfig):
        self.config = config
        c = config
        self.router = nn.Linear(c.hidden_size, c.experts, bias=False, dtype=c.dtype)
        self.gate_up = nn.ModuleList([nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False, dtype=c.dtype)
                                      for _ in range(c.experts)])
        self.down = nn.ModuleList([nn.Linear(c.intermediate_size, c.hidden_size, bias=False, dtype=c.dtype)
                                   for _ in range(c.experts)])

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        c = self.config
        probs = op.softmax(self.router(x).astype("float32"), axis=-1)
        top, chosen = op.topk(probs, c.top_k, axis=-1, ret_type="both", largest=True)
        weights = top / op.sum(top, axis=-1, keepdims=True)
        out = None
        for e in range(c.experts):
            is_e = op.equal(chosen, op.full(chosen.shape, e, "int32"))
            weight = op.sum(op.where(is_e, weights, op.zeros(weights.shape, "float32")), axis=-1, keepdims=True)
            gate, up = op.split(self.gate_up[e](x), 2, axis=-1)
            y = self.down[e](op.silu(gate) * up).astype("float32") * weight
            out = y if out is None else out + y
        return out.astype(c.dtype)


def export_moe(config: MoEConfig) -> tuple[tvm.IRModule, list[str]]:
    """The block as a Relax module (``forward`` over a symbolic token count, weights as
    parameters) and its weights' names in parameter order."""
    block = MoEBlock(config)
    spec = {"forward": {"x": nn.spec.Tensor(["tokens", config.hidden_size], config.dtype)}}
    mod, params = block.export_tvm(spec=spec)
    return mod, [name for name, _ in params]


def random_moe_weights(config: MoEConfig, names: list[str], seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights, rounded to the block's type: projections of standard deviation
    1/sqrt(fan-in)."""
    rng = np.random.default_rng(seed)
    c, weights = config, {}
    for name in names:
        if name.startswith("router"):
            shape = (c.experts, c.hidden_size)
        elif name.startswith("gate_up"):
            shape = (2 * c.intermediate_size, c.hidden_size)
        else:
            shape = (c.hidden_size, c.intermediate_size)
        weights[name] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(c.dtype).astype(np.float32)
    return weights


def routing_margins(config: MoEConfig, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """Per token, the float64 router logit of its last chosen expert minus the best unchosen
    one: below the rounding of 16-bit logits, a model computing them in fp16 may choose the
    other expert, and both are right."""
    logits = np.sort(x.astype(np.float64) @ weights["router.weight"].T, axis=-1)[:, ::-1]
    return logits[:, config.top_k - 1] - logits[:, config.top_k] if config.top_k < config.experts else np.full(len(x), np.inf)


def reference_moe(config: MoEConfig, weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The block in float64 numpy, choosing each token's experts from gathered (not dense)
    expert outputs; ties in the router go to the lower expert, as ``topk`` breaks them."""
    c = config
    x = x.astype(np.float64)
    logits = x @ weights["router.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        chosen = np.argsort(-probs[t], kind="stable")[:c.top_k]
        share = probs[t, chosen] / probs[t, chosen].sum()
        for e, w in zip(chosen, share):
            gate, up = np.split(x[t] @ weights[f"gate_up.{e}.weight"].T, 2)
            out[t] += w * (weights[f"down.{e}.weight"] @ (gate / (1 + np.exp(-gate)) * up))
    return out
