"""StableLM-3B-style decoder layer (torch, fp16): LayerNorm with bias, partial rotary (25% of
head_dim 80 = 20 dims rotated, the rest passed through and concatenated), eager attention written
out (q @ k^T / sqrt(d) + additive causal mask of finfo.min, softmax fp32, @ v), SwiGLU MLP.
hidden 2560, 32 heads, inter 6912; batch 2, seq 64."""
import math
import torch, torch.nn as nn, torch.nn.functional as F

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

class Layer(nn.Module):
    def __init__(self, hidden=2560, heads=32, inter=6912, seq=64, partial=0.25):
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.rd = int(self.d * partial)
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.input_layernorm = nn.LayerNorm(hidden, eps=1e-5)
        self.post_attention_layernorm = nn.LayerNorm(hidden, eps=1e-5)
        inv = 1.0 / (10000 ** (torch.arange(0, self.rd, 2).float() / self.rd))
        emb = torch.cat([torch.outer(torch.arange(seq).float(), inv)] * 2, -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
    def forward(self, x):
        B, S, H = x.shape
        r = x; x = self.input_layernorm(x)
        q = self.q_proj(x).view(B, S, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.h, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.h, self.d).transpose(1, 2)
        cos = self.cos[:S].to(x.dtype)[None, None]; sin = self.sin[:S].to(x.dtype)[None, None]
        q_rot, q_pass = q[..., :self.rd], q[..., self.rd:]
        k_rot, k_pass = k[..., :self.rd], k[..., self.rd:]
        q = torch.cat((q_rot * cos + rotate_half(q_rot) * sin, q_pass), dim=-1)
        k = torch.cat((k_rot * cos + rotate_half(k_rot) * sin, k_pass), dim=-1)
        s = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
        mask = torch.full((S, S), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)
        s = s + mask[None, None]
        p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(p, v).transpose(1, 2).reshape(B, S, H)
        x = r + self.o_proj(a)
        r = x; x = self.post_attention_layernorm(x)
        return r + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

def make():
    return Layer().half(), (torch.randn(2, 64, 2560, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, B2 S64 H2560 32 heads d80, partial rotary 20 dims, LayerNorm+bias, eager attention with finfo.min triu mask"
