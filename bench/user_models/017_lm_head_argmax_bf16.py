"""LM head with greedy sampling (torch, bf16): final RMSNorm, Linear(1024 -> 32000, no bias),
logits of the last token, argmax and max logit; batch 4, seq 16 (prefill-last-token form)."""
import torch, torch.nn as nn

class Head(nn.Module):
    def __init__(self, d=1024, vocab=32000):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6); self.lm_head = nn.Linear(d, vocab, bias=False)
    def forward(self, h):
        logits = self.lm_head(self.norm(h[:, -1:, :]))
        m, i = logits.float().max(dim=-1)
        return i, m

def make():
    return Head().to(torch.bfloat16), (torch.randn(4, 16, 1024, dtype=torch.bfloat16),)


WRITTEN_AS = "torch.export, bf16, last token of B4 S16, nn.RMSNorm, vocab 32000, max/argmax"
