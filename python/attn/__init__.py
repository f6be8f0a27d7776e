"""attn: the attention mechanisms of transformer language models, number for
number with PyTorch, as NumPy-in, NumPy-out modules over the C library libattn.

    import numpy as np, attn
    attn.manual_seed(123)                               # torch.manual_seed(123)
    mha = attn.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)
    y = mha(np.ones((2, 6, 3), np.float32))             # (2, 6, 2) float32
    mha.state_dict()["out_proj.weight"]                 # a NumPy copy
    mha.save("mha.safetensors")                         # safetensors, state_dict names

Every library failure raises attn.AttnError carrying the library's message;
an argument of the wrong kind (a float for an integer, bytes for a str)
raises TypeError, one out of range (a negative count, a token id past
int32) ValueError, each naming the argument and the value.

Threads: an object (a module, a LanguageModel and its caches, a Tokenizer)
runs one call at a time: calls on the same object from several threads
wait for each other (a lock per object), calls on different objects run in
parallel (the library runs without the GIL).

attn.torch (imported on first use, and only then needs torch) is the PyTorch
binding: scaled_dot_product_attention, flash_attn_func, patch().
"""
from ._lib import AttnError
from .modules import (CausalAttention, CausalSelfAttention, GroupedQueryAttention, Module,
                      MultiHeadAttention, MultiHeadAttentionWithSWA, MultiHeadAttentionWrapper,
                      MultiHeadLatentAttention, SelfAttention_v1, SelfAttention_v2,
                      SimpleSelfAttention, get_num_threads, manual_seed, rand, randn,
                      set_bernoulli, set_num_threads)
from .safetensors import load_file, save_file
from .lm import KVCache, LanguageModel
from .pretrain import Pretraining, pretrain
from .tokenizer import Tokenizer
from .functional import kernels_supported
from ._lib import lib as _clib

__version__ = _clib.attn_version().decode()

__all__ = [
    "AttnError", "Module", "SimpleSelfAttention", "SelfAttention_v1", "SelfAttention_v2",
    "CausalAttention", "MultiHeadAttentionWrapper", "MultiHeadAttention",
    "CausalSelfAttention", "GroupedQueryAttention", "MultiHeadLatentAttention",
    "MultiHeadAttentionWithSWA", "manual_seed", "rand", "randn", "set_bernoulli", "set_num_threads",
    "get_num_threads", "save_file", "load_file", "LanguageModel", "KVCache", "Tokenizer",
    "pretrain", "Pretraining", "kernels_supported",
    "__version__",
]


def __getattr__(name):
    # attn.torch loads torch: only when asked for (import attn.torch, or attn.torch.x)
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
