"""CLIP ViT-L/14 text encoder (torch, fp16), 2 layers: token + position embedding, additive causal
mask (full(-inf).triu(1)), pre-LN layers with eager attention (q scaled, bmm over B*H, softmax,
bmm), quick_gelu MLP (x * sigmoid(1.702 x)), final LayerNorm, EOS pooling by argmax of input_ids,
text projection. seq 77 (odd), batch 2, hidden 768, 12 heads, ffn 3072, proj 768."""
import torch, torch.nn as nn, torch.nn.functional as F

class Block(nn.Module):
    def __init__(self, d, h, f):
        super().__init__()
        self.h, self.dh = h, d // h
        self.layer_norm1 = nn.LayerNorm(d); self.layer_norm2 = nn.LayerNorm(d)
        self.q_proj = nn.Linear(d, d); self.k_proj = nn.Linear(d, d); self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d); self.fc1 = nn.Linear(d, f); self.fc2 = nn.Linear(f, d)
    def forward(self, x, mask):
        B, S, D = x.shape
        r = x; x = self.layer_norm1(x)
        sh = lambda t: t.view(B, S, self.h, self.dh).transpose(1, 2).reshape(B * self.h, S, self.dh)
        q = sh(self.q_proj(x) * self.dh ** -0.5); k = sh(self.k_proj(x)); v = sh(self.v_proj(x))
        w = torch.bmm(q, k.transpose(1, 2)).view(B, self.h, S, S) + mask
        p = F.softmax(w.view(B * self.h, S, S), dim=-1)
        a = torch.bmm(p, v).view(B, self.h, S, self.dh).transpose(1, 2).reshape(B, S, D)
        x = r + self.out_proj(a)
        r = x; x = self.fc1(self.layer_norm2(x))
        x = x * torch.sigmoid(1.702 * x)
        return r + self.fc2(x)

class CLIPText(nn.Module):
    def __init__(self, vocab=49408, d=768, h=12, f=3072, n=2, ctx=77, proj=768):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, d)
        self.position_embedding = nn.Embedding(ctx, d)
        self.layers = nn.ModuleList([Block(d, h, f) for _ in range(n)])
        self.final_layer_norm = nn.LayerNorm(d)
        self.text_projection = nn.Linear(d, proj, bias=False)
    def forward(self, input_ids):
        B, S = input_ids.shape
        x = self.token_embedding(input_ids) + self.position_embedding(torch.arange(S)[None])
        mask = torch.full((S, S), float("-inf"), dtype=x.dtype).triu(1)[None, None]
        for l in self.layers:
            x = l(x, mask)
        x = self.final_layer_norm(x)
        pooled = x[torch.arange(B), input_ids.argmax(dim=-1)]
        return self.text_projection(pooled), x

def make():
    return CLIPText().half(), (torch.randint(0, 49408, (2, 77)),)


WRITTEN_AS = "torch.export, fp16, B2 S77 H768 12 heads, 2 layers, causal -inf mask, bmm attention, quick_gelu, EOS argmax pooling"
