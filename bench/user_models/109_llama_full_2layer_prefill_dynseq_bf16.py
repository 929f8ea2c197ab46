"""A full small Llama (torch, bf16), 2 layers: embedding, RoPE computed in forward from an
inv_freq buffer and arange(seq) (so cos/sin are symbolic in seq), RMSNorm, GQA 32/8 head_dim 64
via repeat_kv, SDPA causal, SwiGLU, final RMSNorm, LM head over every position cast to fp32.
Exported with a dynamic sequence length (Dim "seq" 2..2048), batch 1. hidden 2048, inter 5632,
vocab 32000 (TinyLlama widths)."""
import torch, torch.nn as nn, torch.nn.functional as F

def repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__(); self.weight = nn.Parameter(torch.ones(d)); self.eps = eps
    def forward(self, x):
        dt = x.dtype; x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)

class Layer(nn.Module):
    def __init__(self, d, h, kv, f):
        super().__init__()
        self.h, self.kv, self.dh = h, kv, d // h
        self.q_proj = nn.Linear(d, d, bias=False); self.k_proj = nn.Linear(d, kv * self.dh, bias=False)
        self.v_proj = nn.Linear(d, kv * self.dh, bias=False); self.o_proj = nn.Linear(d, d, bias=False)
        self.gate_proj = nn.Linear(d, f, bias=False); self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.input_layernorm = RMSNorm(d); self.post_attention_layernorm = RMSNorm(d)
    def forward(self, x, cos, sin):
        B, S, D = x.shape
        r = x; x = self.input_layernorm(x)
        q = self.q_proj(x).view(B, S, self.h, self.dh).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv, self.dh).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv, self.dh).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.h // self.kv), repeat_kv(v, self.h // self.kv)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = r + self.o_proj(a.transpose(1, 2).reshape(B, S, D))
        r = x; x = self.post_attention_layernorm(x)
        return r + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

class Llama(nn.Module):
    def __init__(self, vocab=32000, d=2048, h=32, kv=8, f=5632, n=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Layer(d, h, kv, f) for _ in range(n)])
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        dh = d // h
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh)), persistent=False)
    def forward(self, input_ids):
        B, S = input_ids.shape
        x = self.embed_tokens(input_ids)
        pos = torch.arange(S, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos().to(x.dtype)[None, None]; sin = emb.sin().to(x.dtype)[None, None]
        for l in self.layers:
            x = l(x, cos, sin)
        return self.lm_head(self.norm(x)).float()

def make():
    return Llama().to(torch.bfloat16), (torch.randint(0, 32000, (1, 64)),)


WRITTEN_AS = "torch.export dynamic seq (Dim 2..2048), bf16, B1, 2 layers H2048 32/8 heads, embedding, RoPE from arange(seq), SDPA causal, final norm, LM head 32000 fp32 logits"
