"""Falcon-7B decoder layer (torch, bf16): one LayerNorm feeding attention and MLP in parallel
(x + attn(ln(x)) + mlp(ln(x))), fused query_key_value with multi-query attention (71 query heads,
1 KV head, head_dim 64) split by view, RoPE, K/V expanded to all heads, SDPA causal, MLP 4x with
exact GELU, no biases. hidden 4544 (odd: 71 x 64), inter 18176; batch 1, seq 128."""
import torch, torch.nn as nn, torch.nn.functional as F

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

class FalconLayer(nn.Module):
    def __init__(self, hidden=4544, heads=71, seq=128):
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.input_layernorm = nn.LayerNorm(hidden, eps=1e-5)
        self.query_key_value = nn.Linear(hidden, (heads + 2) * self.d, bias=False)
        self.dense = nn.Linear(hidden, hidden, bias=False)
        self.dense_h_to_4h = nn.Linear(hidden, 4 * hidden, bias=False)
        self.dense_4h_to_h = nn.Linear(4 * hidden, hidden, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        emb = torch.cat([torch.outer(torch.arange(seq).float(), inv)] * 2, -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
    def forward(self, x):
        B, S, H = x.shape
        ln = self.input_layernorm(x)
        fused = self.query_key_value(ln).view(B, S, self.h + 2, self.d)
        q = fused[:, :, :-2].transpose(1, 2)
        k = fused[:, :, [-2]].transpose(1, 2)
        v = fused[:, :, [-1]].transpose(1, 2)
        cos = self.cos[:S].to(x.dtype)[None, None]; sin = self.sin[:S].to(x.dtype)[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.expand(B, self.h, S, self.d); v = v.expand(B, self.h, S, self.d)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn = self.dense(a.transpose(1, 2).reshape(B, S, H))
        mlp = self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(ln)))
        return x + attn + mlp

def make():
    return FalconLayer().to(torch.bfloat16), (torch.randn(1, 128, 4544, dtype=torch.bfloat16),)


WRITTEN_AS = "torch.export, bf16, B1 S128 H4544 71 q heads / 1 kv head d64, parallel attn+MLP, fused qkv, GELU"
