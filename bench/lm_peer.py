"""The peer of `attn-bench --section decode`'s whole-model rows: PyTorch
running the book's cached GPTModel with random weights, greedy, batch 1, as
the book's generate_text_simple_cached does.

The model is ch04's optimized KV-cache GPT (gpt_with_kv_cache_optimized.py,
the preallocated cache) from ../shared/reference/llms-from-scratch, the
fastest of the book's versions. (llms-from-scratch 1.0.19's
kv_cache/gpt2.py cannot decode: it slices the causal mask on the wrong
axis, so a 1-token step fails to broadcast; tests/conformance says so.)

  python bench/lm_peer.py --threads 1,2 --runs 5 --prompt 16 --new 64

prints one line per thread count:
  lm_peer threads=N prefill_ms=... decode_tokens_per_s=... (medians)
"""
import argparse
import importlib.util
import os
import statistics
import sys
import time
import types

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BOOK_FILE = os.path.join(ROOT, "..", "shared", "reference", "llms-from-scratch",
                         "gpt_with_kv_cache_optimized.py")


def load_book(path):
    # The file imports tiktoken for its main() only; the peers venv need not have it.
    sys.modules.setdefault("tiktoken", types.ModuleType("tiktoken"))
    spec = importlib.util.spec_from_file_location("book_gpt_kv", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

GPT2_124M = {"vocab_size": 50257, "context_length": 1024, "emb_dim": 768, "n_heads": 12,
             "n_layers": 12, "drop_rate": 0.0, "qkv_bias": True}


def one_run(model, prompt, new_tokens):
    """Prefill seconds, then seconds for new_tokens greedy steps (the loop of
    the book's generate_text_simple_cached, timed in two parts)."""
    model.reset_kv_cache()
    with torch.no_grad():
        t0 = time.perf_counter()
        logits = model(prompt, use_cache=True)
        t1 = time.perf_counter()
        for _ in range(new_tokens):
            next_id = logits[:, -1].argmax(dim=-1, keepdim=True)
            logits = model(next_id, use_cache=True)
        t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--book-file", default=BOOK_FILE)
    args = ap.parse_args()
    if not os.path.exists(args.book_file):
        print(f"lm_peer: no {args.book_file}; skipped", flush=True)
        return
    book = load_book(args.book_file)
    torch.manual_seed(123)
    model = book.GPTModel(GPT2_124M).eval()
    prompt = torch.randint(0, GPT2_124M["vocab_size"], (1, args.prompt))
    print(f"lm_peer torch={torch.__version__} model=gpt2-124M(book gpt_with_kv_cache_optimized.py) "
          f"prompt={args.prompt} new={args.new}", flush=True)
    for n in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(n)
        one_run(model, prompt, 4)  # warm-up
        prefill, decode = [], []
        for _ in range(args.runs):
            p, d = one_run(model, prompt, args.new)
            prefill.append(p)
            decode.append(d)
        print(f"lm_peer threads={n} prefill_ms={1e3 * statistics.median(prefill):.2f} "
              f"decode_tokens_per_s={args.new / statistics.median(decode):.2f}", flush=True)


if __name__ == "__main__":
    main()
