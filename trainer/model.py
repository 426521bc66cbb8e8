"""A decoder-only transformer language model over bytes (GPT-2 shaped, nanoGPT-direct)."""

import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer.presets import ModelConfig


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_head = config.n_head
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, 4 * config.d_model),
            # Exact GELU, as nanoGPT: the tanh approximation only mimics GPT-2's TensorFlow code
            # and costs more on CPU (several elementwise ops instead of one erf kernel).
            nn.GELU(),
            nn.Linear(4 * config.d_model, config.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.apply(self._init)
        # GPT-2: scale residual projections by depth so activations stay bounded.
        for block in self.blocks:
            nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * config.n_layer))

    def parameter_groups(self, weight_decay: float) -> list[dict]:
        """AdamW groups: decay only the Linear weights; norms, biases and embeddings keep none."""
        decayed = {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear)}
        params = list(self.parameters())
        return [
            {"params": [p for p in params if id(p) in decayed], "weight_decay": weight_decay},
            {"params": [p for p in params if id(p) not in decayed], "weight_decay": 0.0},
        ]

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-byte scores at every position of `tokens` (batch, time) -> (batch, time, 256)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.tok_emb.weight.T  # output head tied to the embedding

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 of a model's parameters by name: equal digests, bit-identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
