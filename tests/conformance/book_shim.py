"""Lets the book's later code (the PyPI package llms-from-scratch) run on
Debian's torch 1.13: defines what it uses from newer PyTorch, only where the
running torch lacks it, then the caller imports llms_from_scratch as usual.

    import book_shim                       # before any llms_from_scratch import
    from llms_from_scratch import ch04, llama3, qwen3
    from llms_from_scratch.kv_cache import gpt2

What it adds (each as PyTorch 2.x defines it):
  - torch.nn.RMSNorm (2.4): y = x / sqrt(mean(x^2 over the normalized dims)
    + eps) * weight, eps None meaning torch.finfo(x.dtype).eps, weight ones.
  - torch.nn.functional.scaled_dot_product_attention (2.0, with the scale=
    of 2.1 and enable_gqa= of 2.5): the math path, softmax(q k^T * scale +
    mask) v, is_causal aligned top-left, dropout by F.dropout.
Nothing is replaced when torch has it. Run as a script, it imports the
modules the tests use and says which shims it installed.
"""
import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F

installed = []


class RMSNorm(nn.Module):
    """torch.nn.RMSNorm of PyTorch 2.4, for older torch."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device,
                                                  dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def reset_parameters(self):
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x):
        dims = tuple(range(-len(self.normalized_shape), 0))
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        y = x * torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + eps)
        return y * self.weight if self.weight is not None else y

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention's math path, for torch < 2.0."""
    T, S = query.size(-2), key.size(-2)
    scale = 1.0 / math.sqrt(query.size(-1)) if scale is None else scale
    if enable_gqa:
        group = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(group, dim=-3)
        value = value.repeat_interleave(group, dim=-3)
    scores = query @ key.transpose(-2, -1) * scale
    if is_causal:
        keep = torch.ones(T, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ value


if not hasattr(nn, "RMSNorm"):
    nn.RMSNorm = RMSNorm
    installed.append("torch.nn.RMSNorm")
if not hasattr(F, "scaled_dot_product_attention"):
    F.scaled_dot_product_attention = scaled_dot_product_attention
    installed.append("torch.nn.functional.scaled_dot_product_attention")


if __name__ == "__main__":
    from llms_from_scratch import ch04, llama3, qwen3  # noqa: F401
    from llms_from_scratch.kv_cache import gpt2  # noqa: F401
    # Build one small model of each, which needs the shims on torch < 2.4.
    torch.manual_seed(0)
    cfg = {"vocab_size": 50, "context_length": 8, "emb_dim": 16, "n_heads": 4,
           "n_layers": 1, "drop_rate": 0.0, "qkv_bias": False}
    ids = torch.randint(0, 50, (1, 5))
    ch04.GPTModel(cfg)(ids)
    gpt2.GPTModel(cfg)(ids)
    small = {"vocab_size": 50, "context_length": 8, "emb_dim": 16, "n_heads": 4,
             "n_kv_groups": 2, "n_layers": 1, "hidden_dim": 32, "rope_base": 10000.0,
             "dtype": torch.float32, "head_dim": 4, "qk_norm": True,
             "rope_freq": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_context_length": 8}}
    llama3.Llama3Model(small)(ids)
    qwen3.Qwen3Model(small)(ids)
    print(f"book_shim: torch {torch.__version__}; shims installed: "
          f"{', '.join(installed) or 'none'}; ch04, llama3, qwen3, kv_cache.gpt2 import and run")
