"""A Llama layer with fp32 master weights run under hand-written autocast (torch): every Linear
casts its input and fp32 weight to bf16 (F.linear(x.bfloat16(), w.bfloat16())) and returns bf16,
RMSNorms and residual stream in fp32, RoPE in fp32, attention in bf16 (SDPA causal, GQA 16/4
with enable_gqa=True), the MLP output cast back to fp32 before the residual add.
batch 2, seq 128, hidden 1024, inter 2816."""
import torch, torch.nn as nn, torch.nn.functional as F

bf = torch.bfloat16

class ALinear(nn.Linear):
    def forward(self, x):
        return F.linear(x.to(bf), self.weight.to(bf))

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)

class Layer(nn.Module):
    def __init__(self, d=1024, h=16, kv=4, f=2816, seq=128):
        super().__init__()
        self.h, self.kv, self.dh = h, kv, d // h
        self.q_proj = ALinear(d, d, bias=False); self.k_proj = ALinear(d, kv * self.dh, bias=False)
        self.v_proj = ALinear(d, kv * self.dh, bias=False); self.o_proj = ALinear(d, d, bias=False)
        self.gate_proj = ALinear(d, f, bias=False); self.up_proj = ALinear(d, f, bias=False)
        self.down_proj = ALinear(f, d, bias=False)
        self.n1 = nn.RMSNorm(d, eps=1e-6); self.n2 = nn.RMSNorm(d, eps=1e-6)
        inv = 1.0 / (10000 ** (torch.arange(0, self.dh, 2).float() / self.dh))
        emb = torch.cat([torch.outer(torch.arange(seq).float(), inv)] * 2, -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
    def forward(self, x):
        B, S, D = x.shape                                   # x fp32
        y = self.n1(x)
        q = self.q_proj(y).view(B, S, self.h, self.dh).transpose(1, 2).float()
        k = self.k_proj(y).view(B, S, self.kv, self.dh).transpose(1, 2).float()
        v = self.v_proj(y).view(B, S, self.kv, self.dh).transpose(1, 2)
        cos, sin = self.cos[:S][None, None], self.sin[:S][None, None]
        q = (q * cos + rotate_half(q) * sin).to(bf)
        k = (k * cos + rotate_half(k) * sin).to(bf)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(B, S, D)).float()
        y = self.n2(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y)).float()

def make():
    return Layer(), (torch.randn(2, 128, 1024),)


WRITTEN_AS = "torch.export, fp32 weights+residual, every Linear casts x and W to bf16, SDPA bf16 enable_gqa, B2 S128 H1024"
