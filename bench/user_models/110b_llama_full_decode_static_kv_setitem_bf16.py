"""10 with the cache written by `k_cache[:, :, cache_position] = k` (transformers StaticCache's fallback when index_copy_ is not implemented) instead of index_copy_; otherwise identical.
KV cache: per-layer k/v caches [1, 8, 1024, 64] registered as buffers and updated in place with
index_copy_(2, cache_position, k) (what transformers' StaticCache.update does), RoPE cos/sin
gathered at cache_position, SDPA over the whole cache with a boolean mask arange(Smax) <=
cache_position, GQA via repeat_kv, final norm, LM head fp32. input_ids [1, 1], cache_position [1]."""
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
    def __init__(self, d, h, kv, f, smax):
        super().__init__()
        self.h, self.kv, self.dh = h, kv, d // h
        self.q_proj = nn.Linear(d, d, bias=False); self.k_proj = nn.Linear(d, kv * self.dh, bias=False)
        self.v_proj = nn.Linear(d, kv * self.dh, bias=False); self.o_proj = nn.Linear(d, d, bias=False)
        self.gate_proj = nn.Linear(d, f, bias=False); self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.input_layernorm = RMSNorm(d); self.post_attention_layernorm = RMSNorm(d)
        self.register_buffer("k_cache", torch.zeros(1, kv, smax, self.dh))
        self.register_buffer("v_cache", torch.zeros(1, kv, smax, self.dh))
    def forward(self, x, cos, sin, cache_position, mask):
        B, S, D = x.shape
        r = x; x = self.input_layernorm(x)
        q = self.q_proj(x).view(B, S, self.h, self.dh).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.kv, self.dh).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.kv, self.dh).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        self.k_cache[:, :, cache_position] = k
        self.v_cache[:, :, cache_position] = v
        keys, vals = repeat_kv(self.k_cache, self.h // self.kv), repeat_kv(self.v_cache, self.h // self.kv)
        a = F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)
        x = r + self.o_proj(a.transpose(1, 2).reshape(B, S, D))
        r = x; x = self.post_attention_layernorm(x)
        return r + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

class Llama(nn.Module):
    def __init__(self, vocab=32000, d=2048, h=32, kv=8, f=5632, n=2, smax=1024):
        super().__init__()
        self.smax = smax
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Layer(d, h, kv, f, smax) for _ in range(n)])
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        dh = d // h
        inv = 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh))
        emb = torch.cat([torch.outer(torch.arange(smax).float(), inv)] * 2, -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
    def forward(self, input_ids, cache_position):
        x = self.embed_tokens(input_ids)
        cos = self.cos[cache_position].to(x.dtype)[None, None]
        sin = self.sin[cache_position].to(x.dtype)[None, None]
        mask = (torch.arange(self.smax)[None, :] <= cache_position[:, None])[None, None]
        for l in self.layers:
            x = l(x, cos, sin, cache_position, mask)
        return self.lm_head(self.norm(x)).float()

def make():
    return Llama().to(torch.bfloat16), (torch.randint(0, 32000, (1, 1)), torch.tensor([37]))


WRITTEN_AS = "torch.export, bf16, decode B1, 2 layers H2048 32/8, StaticCache buffers written with k_cache[:, :, pos] = k, SDPA over Smax 1024 with bool mask, LM head"
