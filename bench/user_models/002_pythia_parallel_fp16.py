"""GPT-NeoX/Pythia-style layer (torch, fp16): parallel residual, LayerNorm, fused qkv Linear
viewed [B,S,H,3D] and split, partial rotary (25%), eager causal attention (tril buffer +
masked_fill), GELU MLP. batch 2, seq 128, hidden 1024, 16 heads."""
import math, torch, torch.nn as nn, torch.nn.functional as F

class Layer(nn.Module):
    def __init__(self, hidden=1024, heads=16, seq=128, rotary_pct=0.25):
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.rd = int(self.d * rotary_pct)
        self.input_layernorm = nn.LayerNorm(hidden)
        self.post_attention_layernorm = nn.LayerNorm(hidden)
        self.query_key_value = nn.Linear(hidden, 3 * hidden)
        self.dense = nn.Linear(hidden, hidden)
        self.dense_h_to_4h = nn.Linear(hidden, 4 * hidden)
        self.dense_4h_to_h = nn.Linear(4 * hidden, hidden)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq, dtype=torch.bool)).view(1, 1, seq, seq), persistent=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.rd, 2).float() / self.rd))
        emb = torch.cat([torch.outer(torch.arange(seq).float(), inv)] * 2, -1)
        self.register_buffer("cos", emb.cos()[None, None], persistent=False)
        self.register_buffer("sin", emb.sin()[None, None], persistent=False)
    @staticmethod
    def rot(x):
        a, b = x.chunk(2, dim=-1); return torch.cat((-b, a), -1)
    def attn(self, x):
        B, S, _ = x.shape
        qkv = self.query_key_value(x).view(B, S, self.h, 3 * self.d).permute(0, 2, 1, 3)
        q, k, v = qkv[..., :self.d], qkv[..., self.d:2 * self.d], qkv[..., 2 * self.d:]
        qr, qp = q[..., :self.rd], q[..., self.rd:]
        kr, kp = k[..., :self.rd], k[..., self.rd:]
        cos, sin = self.cos[..., :S, :].to(x.dtype), self.sin[..., :S, :].to(x.dtype)
        q = torch.cat((qr * cos + self.rot(qr) * sin, qp), -1)
        k = torch.cat((kr * cos + self.rot(kr) * sin, kp), -1)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)
        mask = self.bias[:, :, :S, :S]
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        p = F.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
        o = torch.matmul(p, v).permute(0, 2, 1, 3).reshape(B, S, -1)
        return self.dense(o)
    def forward(self, x):
        a = self.attn(self.input_layernorm(x))
        m = self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x))))
        return x + a + m

def make():
    return Layer().half(), (torch.randn(2, 128, 1024, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, B2 S128 H1024, fused qkv split, partial rotary, eager masked_fill attention, GELU"
