"""03 with SDPA is_causal=True instead of the sliding-window mask (to see whether repeat_kv is read in place without a mask); otherwise identical.
boolean mask built from arange ((j <= i) & (j > i - window)), window 128, passed to SDPA as
attn_mask; GQA 16/4 via HF repeat_kv (expand + reshape), head_dim 128, RoPE theta 1e6, SwiGLU.
hidden 2048, inter 5632; batch 1, seq 512."""
import torch, torch.nn as nn, torch.nn.functional as F

def repeat_kv(x, n):
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

class Layer(nn.Module):
    def __init__(self, hidden=2048, heads=16, kv=4, inter=5632, seq=512, window=128):
        super().__init__()
        self.h, self.kv, self.d, self.window = heads, kv, 128, window
        self.q_proj = nn.Linear(hidden, heads * 128, bias=False)
        self.k_proj = nn.Linear(hidden, kv * 128, bias=False)
        self.v_proj = nn.Linear(hidden, kv * 128, bias=False)
        self.o_proj = nn.Linear(heads * 128, hidden, bias=False)
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.n1, self.n2 = nn.RMSNorm(hidden, eps=1e-5), nn.RMSNorm(hidden, eps=1e-5)
        inv = 1.0 / (1e6 ** (torch.arange(0, 128, 2).float() / 128))
        emb = torch.cat([torch.outer(torch.arange(seq).float(), inv)] * 2, -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
    def forward(self, x):
        B, S, _ = x.shape
        r = x; x = self.n1(x)
        q = self.q_proj(x).view(B, S, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv, self.d).transpose(1, 2)
        cos = self.cos[:S].to(x.dtype)[None, None]; sin = self.sin[:S].to(x.dtype)[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.h // self.kv), repeat_kv(v, self.h // self.kv)
        i = torch.arange(S)[:, None]; j = torch.arange(S)[None, :]
        mask = (j <= i) & (j > i - self.window)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = r + self.o_proj(a.transpose(1, 2).reshape(B, S, -1))
        r = x; x = self.n2(x)
        return r + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

def make():
    return Layer().half(), (torch.randn(1, 512, 2048, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, B1 S512 H2048 16/4 heads d128, sliding window 128 as SDPA bool attn_mask, repeat_kv"
