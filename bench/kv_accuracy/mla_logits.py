"""gpt-mla's logits against the book's model in float64: attn with its
latent cache (each head's query taken down to the latent, its output up)
and the book's gpt_with_kv_mla.py in float32 with its own cache, both on
the 124M model (latent_dim 96, weights from torch.manual_seed(123)), a
prompt of 16 random ids then one token at a time to N (default 300).

    ATTN_LIBRARY=build/libattn.so .venv/bin/python bench/kv_accuracy/mla_logits.py [N]
"""
import importlib.util
import os
import sys

import numpy as np
import torch

import common

CFG = {"vocab_size": 50257, "context_length": 1024, "emb_dim": 768, "n_heads": 12,
       "n_layers": 12, "drop_rate": 0.0, "qkv_bias": False, "latent_dim": 96}
PROMPT = 16


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    spec = importlib.util.spec_from_file_location(
        "gpt_with_kv_mla", os.path.join(common.BOOK, "gpt_with_kv_mla.py"))
    book = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(book)
    torch.manual_seed(123)
    model = book.GPTModel(CFG).eval()
    seq = torch.randint(0, CFG["vocab_size"], (1, n), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.reset_kv_cache()
        steps = [model(seq[:, :PROMPT], use_cache=True)[0]]
        steps += [model(seq[:, t:t + 1], use_cache=True)[0] for t in range(PROMPT, n)]
        book32 = torch.cat(steps).numpy()
        model64 = book.GPTModel(CFG).eval()
        model64.load_state_dict(model.state_dict())
        want = model64.double()(seq)[0].numpy()
    attn = common.import_attn()
    lm = attn.LanguageModel(CFG, seed=123)
    cache = lm.new_cache()
    ids = seq[0].numpy().astype(np.int32)
    got = [lm.forward(ids[None, :PROMPT], cache=cache)[0]]
    got += [lm.forward(ids[None, t:t + 1], cache=cache)[0] for t in range(PROMPT, n)]
    got = np.concatenate(got)
    print("%d prompt ids, %d decode steps; largest |logit| %.3g"
          % (PROMPT, n - PROMPT, np.abs(want).max()))
    for name, x in (("book float32, its latent cache", book32),
                    ("attn, its latent cache", got)):
        d = np.abs(x - want)
        print("%-32s max |logit - float64| %.3g, mean %.3g, top-1 agreement %.1f%%"
              % (name, d.max(), d.mean(), 100 * np.mean(x.argmax(1) == want.argmax(1))))
    print("attn's cache: %d bytes a token" % cache.token_bytes())


if __name__ == "__main__":
    main()
