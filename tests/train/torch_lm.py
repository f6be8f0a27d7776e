"""The PyTorch twin of attn's small language model (include/attn.h, "A small
language model"): the same modules, registered and constructed in the same
order, so that torch.manual_seed(s); TinyLM(...) draws what attn_model_new
draws from an rng seeded s, and the state_dict names are attn's names.

The attention modules are the seeds' classes (tests/conformance/
seed_modules.py): MultiHeadAttention, and GPT-2's CausalSelfAttention with
nanoGPT's two dropouts.
"""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conformance"))
from seed_modules import CausalSelfAttentionDropout, GPTConfig, MultiHeadAttention  # noqa: E402


class MLP(nn.Module):
    def __init__(self, d, dropout):
        super().__init__()
        self.fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()  # exact erf form
        self.proj = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return self.drop(self.proj(self.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d_model"]
        self.ln1 = nn.LayerNorm(d)
        if cfg["attention"] == "mha":
            self.attn = MultiHeadAttention(d, d, cfg["context_length"], cfg["dropout"],
                                           cfg["n_heads"], qkv_bias=cfg["qkv_bias"])
            self.drop_shortcut = nn.Dropout(cfg["dropout"])
        else:
            self.attn = CausalSelfAttentionDropout(
                GPTConfig(d, cfg["n_heads"], cfg["context_length"], cfg["dropout"]))
            self.drop_shortcut = nn.Identity()  # CausalSelfAttention has resid_dropout
        self.has_mlp = cfg["mlp"]
        if self.has_mlp:
            self.ln2 = nn.LayerNorm(d)
            self.mlp = MLP(d, cfg["dropout"])

    def forward(self, x):
        x = x + self.drop_shortcut(self.attn(self.ln1(x)))
        if self.has_mlp:
            x = x + self.mlp(self.ln2(x))
        return x


class TinyLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        self.pos_emb = nn.Embedding(cfg["context_length"], cfg["d_model"])
        self.drop = nn.Dropout(cfg["dropout"])
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg["n_layers"])])
        self.ln_f = nn.LayerNorm(cfg["d_model"])
        self.head = nn.Linear(cfg["d_model"], cfg["vocab_size"], bias=False)

    def forward(self, tokens, targets=None):
        t = tokens.shape[1]
        x = self.drop(self.tok_emb(tokens) + self.pos_emb(torch.arange(t)))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           targets.reshape(-1), ignore_index=-100)
        return logits, loss


def attn_config(cfg):
    """The ModelConfig fields for a cfg dict."""
    from train_ctypes import ATTN_MODULE_GPT2, ATTN_MODULE_MHA
    out = dict(cfg)
    out["attention"] = ATTN_MODULE_MHA if cfg["attention"] == "mha" else ATTN_MODULE_GPT2
    return out


def load_from_attn(model, attn_params):
    """Copies attn's [(name, data, grad)] into model's parameters by name."""
    named = dict(model.named_parameters())
    assert set(named) == {n for n, _, _ in attn_params}, (
        sorted(set(named) ^ {n for n, _, _ in attn_params}))
    with torch.no_grad():
        for name, data, _ in attn_params:
            named[name].copy_(torch.from_numpy(data.copy()))
