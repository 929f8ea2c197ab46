"""Classification head (torch, fp16 body, fp32 loss): mean-pool over tokens, LayerNorm,
Linear(1024->1024)+tanh (pooler), Linear(1024->1000 classes), log_softmax in fp32, and
cross-entropy (nll over labels, mean). batch 4, seq 64."""
import torch, torch.nn as nn, torch.nn.functional as F

class Head(nn.Module):
    def __init__(self, d=1024, classes=1000):
        super().__init__()
        self.ln = nn.LayerNorm(d); self.pool = nn.Linear(d, d); self.cls = nn.Linear(d, classes)
    def forward(self, x, labels):
        h = self.ln(x.mean(dim=1))
        h = torch.tanh(self.pool(h))
        logits = self.cls(h)
        logp = F.log_softmax(logits.float(), dim=-1)
        loss = F.cross_entropy(logits.float(), labels)
        return logp, loss

def make():
    return Head().half(), (torch.randn(4, 64, 1024, dtype=torch.float16), torch.tensor([1, 5, 999, 0]))


WRITTEN_AS = "torch.export, fp16, B4 S64 D1024 -> 1000 classes, log_softmax + cross_entropy in fp32"
