"""The oracles of test_lm_vs_book.py: the book's GPT-2 and Llama 3 (the PyPI
package llms-from-scratch 1.0.19, kv_cache/gpt2.py and kv_cache/llama3.py)
and Hugging Face's GPT2LMHeadModel / LlamaForCausalLM, built with random
weights, saved as the files attn loads, and run in float64.

    import lm_oracle as O
    model = O.book_gpt2(cfg, seed)            # float32, eval mode
    O.save_book(model, path)                  # safetensors.torch.save_file(state_dict)
    ref = O.Reference(model)                  # a float64 copy
    ref.logits(ids)                           # (B, T, V) without cache
    ref.cached_steps(prompt, steps)           # per step, the new tokens' logits

kv_cache/gpt2.py's own cached forward cannot take a one-token step (it
slices its causal mask on the key axis: (T, n) against scores (n, T)), so
GPT-2's cached reference is the no-cache forward of the whole sequence so
far, its last rows: what a correct cache must give. Llama 3's is the book's
cached forward with its KVCache.
"""
import copy
import json
import os

import book_shim  # noqa: F401  (nn.RMSNorm on torch 1.13), before llms_from_scratch
import torch
from llms_from_scratch.kv_cache import gpt2 as book_gpt2_module
from llms_from_scratch.kv_cache import llama3 as book_llama3_module
from llms_from_scratch.kv_cache.utils import KVCache


def book_gpt2(cfg, seed):
    """kv_cache/gpt2.py's GPTModel(cfg) after torch.manual_seed(seed), eval."""
    torch.manual_seed(seed)
    return book_gpt2_module.GPTModel(dict(cfg, drop_rate=cfg.get("drop_rate", 0.0))).eval()


def book_llama3(cfg, seed):
    """kv_cache/llama3.py's Llama3Model(cfg) (float32) after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    full = dict(cfg, dtype=torch.float32)
    full.setdefault("rope_freq", None)
    return book_llama3_module.Llama3Model(full).eval()


def save_book(model, path):
    """The state_dict under the book's names (what load_state_dict reads)."""
    from safetensors.torch import save_file
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, path,
              metadata={"format": "pt"})


def write_json(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f)


def json_cfg(cfg):
    """cfg as JSON can hold it (the book's keys; no dtype)."""
    return {k: v for k, v in cfg.items() if k != "dtype"}


class Reference:
    """A float64 copy of a book model (GPTModel or Llama3Model)."""

    def __init__(self, model):
        self.model = copy.deepcopy(model).double().eval()
        self.llama = isinstance(model, book_llama3_module.Llama3Model)
        if self.llama:
            self.model.cfg = dict(self.model.cfg, dtype=torch.float64)

    def round_linear_inputs(self, dtype):
        """Every nn.Linear's input rounded to dtype (then back to float64)
        before its product: attn_lm's bf16 products (matmul_dtype "bf16")."""
        for mod in self.model.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.register_forward_pre_hook(
                    lambda _mod, inp: (inp[0].float().to(dtype).double(),))
        return self

    @torch.no_grad()
    def logits(self, ids):
        """(B, T, V) float64 logits of ids (B, T), no cache."""
        ids = torch.as_tensor(ids, dtype=torch.long)
        if self.llama:
            self.model.reset_kv_cache()
            return self.model(ids).numpy()
        self.model.current_pos = 0
        return self.model(ids).numpy()

    @torch.no_grad()
    def cached_steps(self, prompt, steps):
        """Logits of the prompt (B, P), then of each step's tokens (B, n) fed on,
        as a list of (B, n, V) arrays."""
        prompt = torch.as_tensor(prompt, dtype=torch.long)
        out = []
        if self.llama:
            cache = KVCache(n_layers=len(self.model.trf_blocks))
            self.model.reset_kv_cache()
            out.append(self.model(prompt, cache=cache).numpy())
            for step in steps:
                out.append(self.model(torch.as_tensor(step, dtype=torch.long),
                                      cache=cache).numpy())
            return out
        seq = prompt
        out.append(self.logits(seq))
        for step in steps:
            step = torch.as_tensor(step, dtype=torch.long)
            seq = torch.cat([seq, step], dim=1)
            out.append(self.logits(seq)[:, -step.shape[1]:])
        return out


def hf_gpt2(cfg, seed, directory, tie=True):
    """transformers' GPT2LMHeadModel with the book cfg's sizes, random weights
    (std 0.2, so logits are not flat), saved by save_pretrained (safetensors)
    into directory; returns the float64 model."""
    import transformers
    torch.manual_seed(seed)
    hc = transformers.GPT2Config(vocab_size=cfg["vocab_size"], n_positions=cfg["context_length"],
                                 n_embd=cfg["emb_dim"], n_layer=cfg["n_layers"],
                                 n_head=cfg["n_heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                                 attn_pdrop=0.0, layer_norm_epsilon=1e-5,
                                 initializer_range=0.2, tie_word_embeddings=tie)
    model = transformers.GPT2LMHeadModel(hc).eval()
    randomize_norms(model, seed)
    model.save_pretrained(directory, safe_serialization=True)
    return model.double().eval()


def hf_llama(cfg, seed, directory, tie=False):
    """transformers' LlamaForCausalLM with the book cfg's sizes (no RoPE
    scaling: transformers 4.40 does not know rope_type llama3), saved by
    save_pretrained into directory; returns the float64 model."""
    import transformers
    torch.manual_seed(seed)
    hc = transformers.LlamaConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["emb_dim"],
                                  intermediate_size=cfg["hidden_dim"],
                                  num_hidden_layers=cfg["n_layers"],
                                  num_attention_heads=cfg["n_heads"],
                                  num_key_value_heads=cfg["n_kv_groups"],
                                  max_position_embeddings=cfg["context_length"],
                                  rope_theta=cfg["rope_base"], rms_norm_eps=1e-5,
                                  initializer_range=0.2, tie_word_embeddings=tie,
                                  attention_bias=False)
    model = transformers.LlamaForCausalLM(hc).eval()
    randomize_norms(model, seed)
    model.save_pretrained(directory, safe_serialization=True)
    return model.double().eval()


def randomize_norms(model, seed):
    """Norm weights and biases drawn around 1 and 0 (they start as ones and
    zeros, which would leave a mix-up of scale and shift unseen)."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("ln" in name or "norm" in name):
                if name.endswith("bias"):
                    p.copy_(0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))


def randomize_book_norms(model, seed):
    """The same for a book model (norm1/norm2/final_norm scale, shift, weight),
    and GPT-2's biases (nn.Linear's draws are small)."""
    randomize_norms(model, seed)


@torch.no_grad()
def hf_logits(model, ids):
    return model(torch.as_tensor(ids, dtype=torch.long)).logits.numpy()


def files_in(directory):
    return sorted(os.listdir(directory))
