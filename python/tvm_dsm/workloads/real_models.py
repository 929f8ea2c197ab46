"""Public configurations of real decoder models: the layer sizes their FFNs, attention
projections, attention and norms run at, from 0.5B to 70B parameters, dense and mixture of
experts.

Each value is the model's ``config.json`` on the Hugging Face hub (the repository named in
``repo``; the fields are listed in :class:`ModelConfig`). Only sizes are kept: what a kernel's
shape depends on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConfig:
    """One model's layer sizes, as its ``config.json`` names them: ``hidden`` (hidden_size),
    ``intermediate`` (intermediate_size: the dense MLP's width), ``heads``
    (num_attention_heads), ``kv_heads`` (num_key_value_heads; absent means ``heads``),
    ``head_dim`` (head_dim where given, else hidden_size / num_attention_heads), ``vocab``
    (vocab_size), ``activation`` (hidden_act: the MLP's gate), and for mixtures of experts
    ``expert_intermediate`` (an expert's width: moe_intermediate_size, or Mixtral's
    intermediate_size), ``experts`` (num_experts, n_routed_experts or num_local_experts) and
    ``experts_per_token`` (num_experts_per_tok)."""

    name: str
    repo: str  # huggingface.co/<repo>/blob/main/config.json
    params: str  # the size the model is known by (total parameters; active ones for MoE)
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    activation: str = "silu"
    expert_intermediate: int | None = None
    experts: int = 0
    experts_per_token: int = 0
    #: config.json sets head_dim apart from hidden_size: heads * head_dim need not be hidden.
    head_dim_set: bool = False

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def ffn(self) -> int:
        """The width of the MLP a token passes through: an expert's for a mixture of experts."""
        return self.expert_intermediate if self.moe else self.intermediate

    @property
    def qkv(self) -> int:
        """Output columns of the fused Q, K and V projection."""
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def attention_width(self) -> int:
        """Columns of the attention output (the O projection's input)."""
        return self.heads * self.head_dim


MODELS = [
    # Qwen/Qwen2-0.5B: hidden_size 896, intermediate_size 4864, num_attention_heads 14,
    # num_key_value_heads 2, vocab_size 151936, hidden_act silu.
    ModelConfig("Qwen2-0.5B", "Qwen/Qwen2-0.5B", "0.5B", hidden=896, intermediate=4864, heads=14,
                kv_heads=2, head_dim=64, vocab=151936),
    # meta-llama/Llama-3.2-1B: hidden_size 2048, intermediate_size 8192, num_attention_heads 32,
    # num_key_value_heads 8, head_dim 64, vocab_size 128256, hidden_act silu.
    ModelConfig("Llama-3.2-1B", "meta-llama/Llama-3.2-1B", "1.2B", hidden=2048, intermediate=8192, heads=32,
                kv_heads=8, head_dim=64, vocab=128256),
    # google/gemma-2b: hidden_size 2048, intermediate_size 16384, num_attention_heads 8,
    # num_key_value_heads 1, head_dim 256, vocab_size 256000, hidden_act gelu (GeGLU MLP, tanh GELU).
    ModelConfig("gemma-2b", "google/gemma-2b", "2.5B", hidden=2048, intermediate=16384, heads=8,
                kv_heads=1, head_dim=256, vocab=256000, activation="gelu_tanh"),
    # microsoft/Phi-3-mini-4k-instruct: hidden_size 3072, intermediate_size 8192,
    # num_attention_heads 32, num_key_value_heads 32, vocab_size 32064, hidden_act silu.
    ModelConfig("Phi-3-mini", "microsoft/Phi-3-mini-4k-instruct", "3.8B", hidden=3072, intermediate=8192,
                heads=32, kv_heads=32, head_dim=96, vocab=32064),
    # mistralai/Mistral-7B-v0.1: hidden_size 4096, intermediate_size 14336, num_attention_heads 32,
    # num_key_value_heads 8, vocab_size 32000, hidden_act silu.
    ModelConfig("Mistral-7B", "mistralai/Mistral-7B-v0.1", "7.2B", hidden=4096, intermediate=14336, heads=32,
                kv_heads=8, head_dim=128, vocab=32000),
    # Qwen/Qwen2-7B: hidden_size 3584, intermediate_size 18944, num_attention_heads 28,
    # num_key_value_heads 4, vocab_size 152064, hidden_act silu.
    ModelConfig("Qwen2-7B", "Qwen/Qwen2-7B", "7.6B", hidden=3584, intermediate=18944, heads=28,
                kv_heads=4, head_dim=128, vocab=152064),
    # meta-llama/Meta-Llama-3-8B: hidden_size 4096, intermediate_size 14336, num_attention_heads 32,
    # num_key_value_heads 8, vocab_size 128256, hidden_act silu.
    ModelConfig("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", "8.0B", hidden=4096, intermediate=14336, heads=32,
                kv_heads=8, head_dim=128, vocab=128256),
    # meta-llama/Meta-Llama-3-70B: hidden_size 8192, intermediate_size 28672, num_attention_heads 64,
    # num_key_value_heads 8, vocab_size 128256, hidden_act silu.
    ModelConfig("Llama-3-70B", "meta-llama/Meta-Llama-3-70B", "70.6B", hidden=8192, intermediate=28672,
                heads=64, kv_heads=8, head_dim=128, vocab=128256),
    # mistralai/Mixtral-8x7B-v0.1: hidden_size 4096, intermediate_size 14336 (each expert's),
    # num_attention_heads 32, num_key_value_heads 8, num_local_experts 8, num_experts_per_tok 2,
    # vocab_size 32000, hidden_act silu.
    ModelConfig("Mixtral-8x7B", "mistralai/Mixtral-8x7B-v0.1", "46.7B (12.9B active)", hidden=4096,
                intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=32000,
                expert_intermediate=14336, experts=8, experts_per_token=2),
    # Qwen/Qwen1.5-MoE-A2.7B: hidden_size 2048, intermediate_size 5632, moe_intermediate_size 1408,
    # num_experts 60, num_experts_per_tok 4, num_attention_heads 16, num_key_value_heads 16,
    # vocab_size 151936, hidden_act silu.
    ModelConfig("Qwen1.5-MoE-A2.7B", "Qwen/Qwen1.5-MoE-A2.7B", "14.3B (2.7B active)", hidden=2048,
                intermediate=5632, heads=16, kv_heads=16, head_dim=128, vocab=151936,
                expert_intermediate=1408, experts=60, experts_per_token=4),
    # deepseek-ai/deepseek-moe-16b-base: hidden_size 2048, intermediate_size 10944,
    # moe_intermediate_size 1408, n_routed_experts 64, num_experts_per_tok 6,
    # num_attention_heads 16, num_key_value_heads 16, vocab_size 102400, hidden_act silu.
    ModelConfig("DeepSeek-MoE-16B", "deepseek-ai/deepseek-moe-16b-base", "16.4B (2.8B active)", hidden=2048,
                intermediate=10944, heads=16, kv_heads=16, head_dim=128, vocab=102400,
                expert_intermediate=1408, experts=64, experts_per_token=6),
    # Qwen/Qwen3-30B-A3B: hidden_size 2048, intermediate_size 6144, moe_intermediate_size 768,
    # num_experts 128, num_experts_per_tok 8, num_attention_heads 32, num_key_value_heads 4,
    # head_dim 128, vocab_size 151936, hidden_act silu.
    ModelConfig("Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B", "30.5B (3.3B active)", hidden=2048, intermediate=6144,
                heads=32, kv_heads=4, head_dim=128, vocab=151936, expert_intermediate=768, experts=128,
                experts_per_token=8, head_dim_set=True),
]

#: MODELS by name.
BY_NAME = {model.name: model for model in MODELS}
