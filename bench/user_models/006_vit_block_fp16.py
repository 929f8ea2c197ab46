"""ViT block (timm-style, torch, fp16): LayerNorm, fused qkv reshape(B,N,3,H,D).permute(2,0,3,1,4)
.unbind(0), SDPA (no mask), proj, GELU(tanh) MLP, two residuals. batch 2, 197 tokens, dim 768."""
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, dim=768, heads=12, mlp=4):
        super().__init__()
        self.h = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6); self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.qkv = nn.Linear(dim, 3 * dim); self.proj = nn.Linear(dim, dim)
        self.fc1 = nn.Linear(dim, mlp * dim); self.fc2 = nn.Linear(mlp * dim, dim)
    def forward(self, x):
        B, N, C = x.shape
        y = self.norm1(x)
        q, k, v = self.qkv(y).reshape(B, N, 3, self.h, C // self.h).permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(B, N, C))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))

def make():
    return Block().half(), (torch.randn(2, 197, 768, dtype=torch.float16),)


WRITTEN_AS = "torch.export, fp16, B2 N197 D768, fused qkv unbind, SDPA, GELU tanh"
