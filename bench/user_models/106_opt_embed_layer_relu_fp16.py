"""OPT-1.3b front (torch, fp16) as modeling_opt writes it: token embedding + learned positional
embedding (positions from an attention-mask cumsum, offset 2), one pre-LN decoder layer (q/k/v/out
with bias, q scaled by head_dim^-0.5 before the product, heads folded into batch and bmm, additive
causal mask of finfo.min, softmax, bmm), ReLU FFN fc1/fc2 with bias, final LayerNorm.
vocab 50272, hidden 2048, 32 heads, ffn 8192; batch 2, seq 64."""
import torch, torch.nn as nn, torch.nn.functional as F

class OPT(nn.Module):
    def __init__(self, vocab=50272, hidden=2048, heads=32, ffn=8192, max_pos=2048):
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.embed_positions = nn.Embedding(max_pos + 2, hidden)
        self.self_attn_layer_norm = nn.LayerNorm(hidden)
        self.q_proj = nn.Linear(hidden, hidden); self.k_proj = nn.Linear(hidden, hidden)
        self.v_proj = nn.Linear(hidden, hidden); self.out_proj = nn.Linear(hidden, hidden)
        self.final_layer_norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, ffn); self.fc2 = nn.Linear(ffn, hidden)
        self.norm_out = nn.LayerNorm(hidden)
    def forward(self, input_ids, attention_mask):
        B, S = input_ids.shape
        pos = (torch.cumsum(attention_mask, dim=1) * attention_mask).long() - 1
        x = self.embed_tokens(input_ids) + self.embed_positions(pos + 2)
        r = x; x = self.self_attn_layer_norm(x)
        q = self.q_proj(x) * (self.d ** -0.5)
        shape = lambda t: t.view(B, S, self.h, self.d).transpose(1, 2).reshape(B * self.h, S, self.d)
        q, k, v = shape(q), shape(self.k_proj(x)), shape(self.v_proj(x))
        w = torch.bmm(q, k.transpose(1, 2)).view(B, self.h, S, S)
        causal = torch.full((S, S), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)
        w = (w + causal[None, None]).view(B * self.h, S, S)
        p = F.softmax(w, dim=-1)
        a = torch.bmm(p, v).view(B, self.h, S, self.d).transpose(1, 2).reshape(B, S, -1)
        x = r + self.out_proj(a)
        r = x; x = self.final_layer_norm(x)
        x = r + self.fc2(F.relu(self.fc1(x)))
        return self.norm_out(x)

def make():
    return OPT().half(), (torch.randint(0, 50272, (2, 64)), torch.ones(2, 64, dtype=torch.long))


WRITTEN_AS = "torch.export, fp16, B2 S64 H2048 32 heads, learned positions from mask cumsum, bmm attention, ReLU FFN, final LN"
