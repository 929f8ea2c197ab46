"""A Llama-architecture decoder written as TVM users write LLMs: a ``tvm.relax.frontend.nn``
module over ``tvm.relax.frontend.nn.llm``'s paged KV cache (its TIR prefill, decode and RoPE
kernels), laid out the way MLC-LLM lays out Llama (fused QKV and gate/up projections).

Exported functions (:func:`export_llama`), batch and sequence lengths symbolic:

- ``prefill(input_ids [1, seq_len], logit_positions [batch_size], cache)``: the prompts of a
  batch concatenated along ``seq_len`` (the cache knows each sequence's length); returns the
  fp32 logits ``[1, batch_size, vocab]`` at ``logit_positions`` and the cache;
- ``decode(input_ids [batch_size, 1], cache)``: one token per sequence; logits
  ``[batch_size, 1, vocab]``;
- ``create_tir_paged_kv_cache(max_batch_size, max_total_seq_len, prefill_chunk_size,
  page_size, support_sliding_window)``: the cache object the other two take.

:func:`reference_logits` is the same decoder written with array operators only, so that numpy
(float64, the CPU tests) and torch (fp32 on the GPU) both evaluate it from the same weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable

import ml_dtypes
import numpy as np
import tvm
from tvm import relax
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op
from tvm.relax.frontend.nn.llm.kv_cache import PagedKVCache, RopeMode, TIRPagedKVCache

from ..step_graphs import PagedDecodeGraphs


@dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    dtype: str = "float16"

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights (what one decode step reads at least)."""
        elements = sum(int(np.prod(shape)) for shape in parameter_shapes(self).values())
        return elements * tvm.runtime.DataType(self.dtype).bits // 8


#: The 1B-class configuration of issue 51 (TinyLlama-like widths, 16 layers).
LLAMA_1B = LlamaConfig(hidden_size=2048, num_layers=16, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=64, intermediate_size=8192,
                       vocab_size=32000)

#: A tiny configuration with the same structure (GQA 4:2, SwiGLU), for CPU tests.
LLAMA_TINY = LlamaConfig(hidden_size=256, num_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, intermediate_size=512,
                         vocab_size=1024)


class LlamaMLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, gate and up as one projection."""

    def __init__(self, config: LlamaConfig):
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size,
                                      bias=False, dtype=config.dtype)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False,
                                   dtype=config.dtype)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        gate, up = op.split(self.gate_up_proj(x), 2, axis=-1)
        return self.down_proj(op.silu(gate) * up)


class LlamaAttention(nn.Module):
    """Grouped-query attention over the paged KV cache (RoPE applied by the cache)."""

    def __init__(self, config: LlamaConfig):
        self.num_q_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size,
                                  (self.num_q_heads + 2 * self.num_kv_heads) * self.head_dim,
                                  bias=False, dtype=config.dtype)
        self.o_proj = nn.Linear(self.num_q_heads * self.head_dim, config.hidden_size,
                                bias=False, dtype=config.dtype)

    def forward(self, x: nn.Tensor, cache: PagedKVCache, layer_id: int) -> nn.Tensor:
        b, s, _ = x.shape
        qkv = op.reshape(self.qkv_proj(x), (b, s, self.num_q_heads + 2 * self.num_kv_heads,
                                            self.head_dim))
        out = cache.attention_with_fused_qkv(layer_id, qkv, self.num_q_heads,
                                             sm_scale=self.head_dim ** -0.5)
        return self.o_proj(op.reshape(out, (b, s, self.num_q_heads * self.head_dim)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig):
        self.input_layernorm = nn.RMSNorm(config.hidden_size, -1, config.rms_norm_eps,
                                          bias=False, dtype=config.dtype)
        self.self_attn = LlamaAttention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, -1, config.rms_norm_eps,
                                                   bias=False, dtype=config.dtype)
        self.mlp = LlamaMLP(config)

    def forward(self, x: nn.Tensor, cache: PagedKVCache, layer_id: int) -> nn.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cache, layer_id)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaForCausalLM(nn.Module):
    """The decoder with its embedding, final norm and LM head (tied to the embedding when the
    configuration says so). ``target`` selects the KV cache's attention kernels (CUDA or CPU)."""

    def __init__(self, config: LlamaConfig, target: tvm.target.Target):
        self.config = config
        self.target = target
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=config.dtype)
        self.layers = nn.ModuleList([LlamaDecoderLayer(config) for _ in range(config.num_layers)])
        self.norm = nn.RMSNorm(config.hidden_size, -1, config.rms_norm_eps, bias=False,
                               dtype=config.dtype)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False,
                                     dtype=config.dtype)

    def _hidden(self, input_ids: nn.Tensor, cache: PagedKVCache) -> nn.Tensor:
        x = self.embed_tokens(input_ids)
        for layer_id, layer in enumerate(self.layers):
            x = layer(x, cache, layer_id)
        return self.norm(x)

    def _logits(self, x: nn.Tensor) -> nn.Tensor:
        if self.config.tie_word_embeddings:
            logits = op.matmul(x, op.permute_dims(self.embed_tokens.weight))
        else:
            logits = self.lm_head(x)
        return op.astype(logits, "float32")

    def prefill(self, input_ids: nn.Tensor, logit_positions: nn.Tensor, cache: PagedKVCache):
        hidden = op.take(self._hidden(input_ids, cache), logit_positions, axis=1)
        return self._logits(hidden), cache

    def decode(self, input_ids: nn.Tensor, cache: PagedKVCache):
        return self._logits(self._hidden(input_ids, cache)), cache

    def create_tir_paged_kv_cache(self, max_batch_size: tvm.tirx.Var,
                                  max_total_seq_len: tvm.tirx.Var,
                                  prefill_chunk_size: tvm.tirx.Var, page_size: tvm.tirx.Var,
                                  support_sliding_window: tvm.tirx.Var) -> PagedKVCache:
        c = self.config
        return TIRPagedKVCache(
            attn_kind="mha", max_batch_size=max_batch_size, max_total_seq_len=max_total_seq_len,
            prefill_chunk_size=prefill_chunk_size, page_size=page_size,
            support_sliding_window=support_sliding_window,
            layer_partition=relax.ShapeExpr([0, c.num_layers]), num_hidden_layers=c.num_layers,
            num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
            qk_head_dim=c.head_dim, v_head_dim=c.head_dim, mla_original_qk_head_dim=0,
            mla_original_v_head_dim=0, rope_mode=RopeMode.NORMAL, rope_scale=1,
            rope_theta=c.rope_theta, rope_scaling={}, rope_ext_factors=relax.prim_value(0),
            rotary_dim=c.head_dim, enable_disaggregation=False, dtype=c.dtype,
            target=self.target)

    def spec(self) -> dict[str, dict[str, Any]]:
        """The export spec: packed weights as the last argument, no effects."""
        modes = {"param_mode": "packed", "effect_mode": "none"}
        cache = nn.spec.Object(object_type=PagedKVCache)
        return {
            "prefill": {"input_ids": nn.spec.Tensor([1, "seq_len"], "int32"),
                        "logit_positions": nn.spec.Tensor(["batch_size"], "int32"),
                        "cache": cache, "$": modes},
            "decode": {"input_ids": nn.spec.Tensor(["batch_size", 1], "int32"),
                       "cache": cache, "$": modes},
            "create_tir_paged_kv_cache": {
                name: int for name in ("max_batch_size", "max_total_seq_len",
                                       "prefill_chunk_size", "page_size",
                                       "support_sliding_window")} | {
                "$": {"param_mode": "none", "effect_mode": "none"}},
        }


def export_llama(config: LlamaConfig, target) -> tuple[tvm.IRModule, list[str]]:
    """The model as a Relax IRModule (prefill, decode, create_tir_paged_kv_cache) and the names
    of its weights in the order the packed weight tuple takes them."""
    target = tvm.target.Target(target)
    model = LlamaForCausalLM(config, target)
    mod, params = model.export_tvm(spec=model.spec())
    return mod, [name for name, _ in params]


def parameter_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Every weight's shape by its export name."""
    c = config
    qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim
    shapes = {"embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    for i in range(c.num_layers):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": (c.hidden_size,),
                   p + "self_attn.qkv_proj.weight": (qkv, c.hidden_size),
                   p + "self_attn.o_proj.weight": (c.hidden_size, c.num_attention_heads * c.head_dim),
                   p + "post_attention_layernorm.weight": (c.hidden_size,),
                   p + "mlp.gate_up_proj.weight": (2 * c.intermediate_size, c.hidden_size),
                   p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size)}
    shapes["norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return shapes


def numpy_dtype(dtype: str):
    """The numpy type of a model type (bfloat16 through ml_dtypes)."""
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def random_weights(config: LlamaConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights (already rounded to the model's type, so the model and a float
    reference read the same values): projections with standard deviation 1/sqrt(fan-in), so
    activations keep their scale through the layers; norm weights near 1."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in parameter_shapes(config).items():
        if len(shape) == 1:
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name == "embed_tokens.weight":
            w = rng.standard_normal(shape)
        else:
            w = rng.standard_normal(shape) / np.sqrt(shape[1])
        weights[name] = w.astype(numpy_dtype(config.dtype)).astype(np.float32)
    return weights


def reference_logits(config: LlamaConfig, weights: dict[str, Any], token_ids: np.ndarray,
                     logit_positions: np.ndarray, xp, asarray: Callable[[np.ndarray], Any]):
    """The decoder's logits ``[batch, len(logit_positions), vocab]`` for ``token_ids``
    ``[batch, seq]`` (each sequence from position 0, causal), evaluated with the array module
    ``xp`` (numpy or torch) on ``weights`` (arrays of ``xp``); ``asarray`` moves a host numpy
    array (float ones into the working precision) to where ``weights`` live."""
    c = config
    batch, seq = token_ids.shape
    group = c.num_attention_heads // c.num_key_value_heads
    half = c.head_dim // 2
    inv_freq = c.rope_theta ** (-np.arange(half, dtype=np.float64) * 2 / c.head_dim)
    angles = np.arange(seq, dtype=np.float64)[:, None] * inv_freq[None, :]
    cos = asarray(np.concatenate([np.cos(angles)] * 2, axis=-1)[None, :, None, :])
    sin = asarray(np.concatenate([np.sin(angles)] * 2, axis=-1)[None, :, None, :])
    causal = asarray(np.tril(np.ones((seq, seq), dtype=bool)))
    kv_head_of_q = asarray(np.arange(c.num_attention_heads) // group)

    def rms_norm(x, w):
        return x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + c.rms_norm_eps) * w

    def rope(x):  # rotate-half form, as nn.llm's "normal" RoPE
        rotated = xp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    x = weights["embed_tokens.weight"][asarray(token_ids)]
    for i in range(c.num_layers):
        p = f"layers.{i}."
        h = rms_norm(x, weights[p + "input_layernorm.weight"])
        qkv = (h @ weights[p + "self_attn.qkv_proj.weight"].T).reshape(
            batch, seq, c.num_attention_heads + 2 * c.num_key_value_heads, c.head_dim)
        q = rope(qkv[:, :, :c.num_attention_heads])
        k = rope(qkv[:, :, c.num_attention_heads:c.num_attention_heads + c.num_key_value_heads])
        v = qkv[:, :, c.num_attention_heads + c.num_key_value_heads:]
        k, v = k[:, :, kv_head_of_q], v[:, :, kv_head_of_q]  # [batch, seq, q heads, dim]
        scores = q.swapaxes(1, 2) @ k.swapaxes(1, 2).swapaxes(2, 3) * c.head_dim ** -0.5
        scores = xp.where(causal, scores, -float("inf"))
        probs = xp.exp(scores - xp.amax(scores, axis=-1, keepdims=True))
        probs = probs / probs.sum(axis=-1, keepdims=True)
        attn = (probs @ v.swapaxes(1, 2)).swapaxes(1, 2).reshape(batch, seq, -1)
        x = x + attn @ weights[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, weights[p + "post_attention_layernorm.weight"])
        gate_up = h @ weights[p + "mlp.gate_up_proj.weight"].T
        gate, up = gate_up[..., :c.intermediate_size], gate_up[..., c.intermediate_size:]
        x = x + (gate / (1 + xp.exp(-gate)) * up) @ weights[p + "mlp.down_proj.weight"].T
    x = rms_norm(x[:, asarray(logit_positions)], weights["norm.weight"])
    head = weights["embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"]
    return x @ head.T


def device_params(weights: dict[str, np.ndarray], names: list[str], config: LlamaConfig, device) -> list:
    """``weights`` in the model's type on ``device``, in ``names`` order: a compiled model's
    parameters (:func:`export_llama`'s names)."""
    return [tvm.runtime.tensor(weights[n].astype(numpy_dtype(config.dtype)), device) for n in names]


class LlamaSession:
    """A compiled model (:func:`export_llama`) driven on a device, as a serving loop drives it:
    one paged KV cache, sequence ids ``0 .. batch - 1``. The cache's ``begin_forward`` tells
    the attention kernels each sequence's new tokens before every prefill or decode call.
    ``weights``: arrays by name, copied to the device in ``names`` order (``params``); or another
    session's ``params``, shared (a server loads its weights once for all its sessions).

    With ``step_graphs`` (a CUDA device; the model compiled without Relax's CUDA-graph rewrite)
    every call runs on a stream of the session's own, made the thread's current stream until
    :meth:`close`, and decode steps are replayed from CUDA graphs
    (:class:`tvm_dsm.step_graphs.PagedDecodeGraphs`). Each call then returns with its result
    computed, valid until the next call.

    With ``prepare_ahead`` (step graphs on a GPU, or the CPU) each decode call, once its step is
    launched, calls the cache's ``begin_forward`` for the next step while the device computes:
    host-only bookkeeping (each sequence one token longer, a page where it needs one, the page
    tables), 0.01 ms at batch 1 and 0.1-0.3 ms at 32-64 (measured on a CPU), which a serving loop
    otherwise pays between steps, where the cache has the pages for it (a session sized for
    exactly the tokens it decodes has none to spare at its last step). The next decode call
    starts from it; a prefill first takes the token back (``popn``: the cache has no sliding
    window, so nothing else moved), a reset removes it with its sequences.
    Without step graphs a GPU step copies its page tables while it runs, from the host arrays
    the next ``begin_forward`` rewrites: refused there. By default (None) a session with step
    graphs prepares ahead at every batch (H200, 1B Llama at batch 1, eight alternating pairs in four
    processes: 0.978x the step time without, median; at 8 1.140 against 1.268 ms, at 32 and 64 over
    2048-8192 keys 0.17-0.54 ms less: ``bench/results/archive/llama_1b_session_order_s57.json``,
    ``llama_1b_prepare_ahead_ab_s55.json``, ``llama_1b_prepare_ahead_contexts_s55.json``)."""

    def __init__(self, executable, device, weights: dict[str, np.ndarray] | Sequence, names: list[str],
                 config: LlamaConfig, max_batch_size: int, max_total_seq_len: int,
                 prefill_chunk_size: int, page_size: int = 16, step_graphs: bool = False,
                 prepare_ahead: bool | None = None):
        if prepare_ahead and not step_graphs and device.dlpack_device_type() != tvm.cpu().dlpack_device_type():
            raise ValueError("prepare_ahead needs step_graphs on a GPU: without them a step's page tables "
                             "are copied to the device while it runs, from the arrays the next step rewrites")
        self.vm = relax.VirtualMachine(executable, device)
        self.device, self.config = device, config
        if isinstance(weights, dict):
            self.params = device_params(weights, names, config, device)
        elif len(weights) == len(names):
            self.params = list(weights)
        else:
            raise ValueError(f"a session's params are the model's {len(names)} parameters in order, not {len(weights)}")
        self.graphs, self.stream = None, None
        if step_graphs:
            self.stream = device.create_raw_stream()
            device.set_raw_stream(self.stream)  # the cache takes the current stream for its kernels
            self.graphs = PagedDecodeGraphs(self.vm["decode"], device, self.stream)
        shape = tvm.runtime.ShapeTuple
        self.cache = self.vm["create_tir_paged_kv_cache"](
            shape([max_batch_size]), shape([max_total_seq_len]), shape([prefill_chunk_size]),
            shape([page_size]), shape([0]))
        self.batch, self.prefill_chunk_size, self.page_size = 0, prefill_chunk_size, page_size
        self.lengths: list[int] = []  # each sequence's tokens in the cache
        self.prepare_ahead, self._prepared = prepare_ahead, False
        self._begin = tvm.get_global_func("vm.builtin.kv_state_begin_forward")
        self._end = tvm.get_global_func("vm.builtin.kv_state_end_forward")
        self._pop = tvm.get_global_func("vm.builtin.kv_state_popn")
        self._free_pages = tvm.get_global_func("vm.builtin.attention_kv_cache_get_num_available_pages")

    def prefill(self, prompts: np.ndarray):
        """Add one sequence per row of ``prompts`` ``[batch, seq]`` and run them as ragged
        prefills of whole sequences, as many a call as ``prefill_chunk_size`` tokens hold (a
        server's chunked prefill); the fp32 logits ``[1, batch, vocab]`` (a device tensor) at each
        last token."""
        batch, seq = prompts.shape
        if batch == 0 or seq == 0:
            raise ValueError(f"prefill takes at least one prompt of at least one token, not {batch} of {seq}")
        if seq > self.prefill_chunk_size:
            raise ValueError(f"a prompt of {seq} tokens is longer than the prefill chunk "
                             f"({self.prefill_chunk_size} tokens)")
        self._take_back_prepared()
        per_call = self.prefill_chunk_size // seq
        logits = [self._prefill_call(prompts[start:start + per_call]) for start in range(0, batch, per_call)]
        if len(logits) == 1:
            return logits[0]
        return tvm.runtime.tensor(np.concatenate([part.numpy() for part in logits], axis=1), self.device)

    def _prefill_call(self, prompts: np.ndarray):
        """One ragged prefill of the new sequences ``prompts`` ``[batch, seq]``; their logits."""
        batch, seq = prompts.shape
        add = tvm.get_global_func("vm.builtin.kv_state_add_sequence")
        for seq_id in range(self.batch, self.batch + batch):
            add(self.cache, seq_id)
        ids = list(range(self.batch, self.batch + batch))
        self.batch += batch
        self.lengths += [seq] * batch
        last = np.arange(1, batch + 1, dtype=np.int32) * seq - 1
        self._begin(self.cache, tvm.runtime.ShapeTuple(ids), tvm.runtime.ShapeTuple([seq] * batch))
        logits, self.cache = self.vm["prefill"](
            tvm.runtime.tensor(prompts.reshape(1, -1).astype(np.int32), self.device),
            tvm.runtime.tensor(last, self.device), self.cache, self.params)
        self._end(self.cache)
        self._sync()
        return logits

    def reset(self) -> None:
        """Remove every sequence (their pages return to the cache), as a server does when
        requests finish; the next prefill starts from sequence 0 again."""
        self._prepared = False  # a prepared token goes with its sequence
        remove = tvm.get_global_func("vm.builtin.kv_state_remove_sequence")
        for seq_id in range(self.batch):
            remove(self.cache, seq_id)
        self.batch, self.lengths = 0, []

    def begin_decode(self) -> None:
        """Tell the cache that the next call adds one token to every sequence."""
        self._begin(self.cache, tvm.runtime.ShapeTuple(list(range(self.batch))),
                    tvm.runtime.ShapeTuple([1] * self.batch))
        self.lengths = [n + 1 for n in self.lengths]

    def end_forward(self) -> None:
        """Tell the cache that the call is done."""
        self._end(self.cache)

    def decode(self, tokens):
        """One step for every sequence: ``tokens`` (a device int32 tensor ``[batch, 1]``) in,
        the fp32 logits ``[batch, 1, vocab]`` (a device tensor) out."""
        if not self._prepared:
            self.begin_decode()
        self._prepared = False
        decode = self.vm["decode"] if self.graphs is None else self.graphs
        logits, self.cache = decode(tokens, self.cache, self.params)
        self.end_forward()
        if self._prepares_ahead() and self._room_for_a_token():
            self.begin_decode()
            self._prepared = True
        self._sync()
        return logits

    def _prepares_ahead(self) -> bool:
        """Whether a decode call prepares the next step: ``prepare_ahead``, or by default (None)
        with step graphs."""
        if self.prepare_ahead is None:
            return self.graphs is not None
        return self.prepare_ahead

    def _room_for_a_token(self) -> bool:
        """Whether the cache has the pages for one more token of every sequence (a sequence
        whose pages are full takes a new one)."""
        needed = sum(1 for n in self.lengths if n % self.page_size == 0)
        return needed <= int(self._free_pages(self.cache))

    def _take_back_prepared(self) -> None:
        """Undo the ``begin_forward`` of a prepared decode step (see the class docstring)."""
        if self._prepared:
            for seq_id in range(self.batch):
                self._pop(self.cache, seq_id, 1)
            self.lengths = [n - 1 for n in self.lengths]
            self._prepared = False

    def _sync(self) -> None:
        if self.stream is not None:
            self.device.sync(self.stream)

    def close(self) -> None:
        """Give back the session's stream and graphs, the thread's current stream the default
        one again; the session (whose cache computes on that stream) is not used after."""
        if self.graphs is not None:
            self._sync()
            self.graphs.close()
            self.cache = self.vm = None
            self.device.set_raw_stream(0)
            self.device.free_raw_stream(self.stream)
            self.graphs, self.stream = None, None
