"""The accuracy cost of each KV cache type: for every (K, V) storage type,
the next-token distributions of teacher-forced decoding against those of
the float32 cache on the same tokens.

    ATTN_LIBRARY=build/libattn.so .venv/bin/python bench/kv_accuracy/kv_accuracy.py \
        [--model trained|llama|both|mla] [--llama-layers 8] [--llama-prompt 3584] \
        [--llama-steps 512] [--products] [--json OUT]

trained: the small chapter-5 GPT of train_verdict.py (run that first; its
file is build/kv_accuracy/verdict-gpt.safetensors). Four sequences of 256
tokens (its context): two windows of the-verdict's training text, the
validation window, and 256 tokens the model sampled itself (temperature 1,
from "Every effort moves you", float32 cache). Each is prefilled with its
first 128 tokens and then decoded one token at a time through the other
128: 512 decode steps at cache lengths 129 to 256, the four sequences as
one batch of a cache.

mla: the same model with chapter 4's latent attention, trained alike
(train_verdict.py --arch mla), on the same kind of sequences: its cache holds
the latent once, read as keys and as values, so each type rounds the latent
and K and V share it (the K=V pairs alone).

llama: a Llama-3-shaped model with random weights (hidden 2048, 32 query
heads over 8 KV heads, head_dim 64, intermediate 8192, vocab 32000, context
4096, RoPE theta 500000 with Llama 3.2's scaling), one sequence of random
token ids: --llama-prompt tokens prefilled, then --llama-steps decode steps
(the defaults end at cache length 4096).

Per type: the cache's bytes per token (all layers, K and V, scales
included), the mean and the largest KL(p_f32 || p_type) in nats over the
decode steps, where p is softmax of the step's logits (in float64), and
top-1 agreement: how often the argmax is the float32 cache's. A prompt into
an empty cache attends in float32 on the fast kernels, so only decode steps
are counted: each of them reads every earlier token as stored.

--products measures the linear layers instead, on float32 caches: the
model's weights rounded to bf16 (products on float32 activations, exact),
and with bf16 products too (matmul_dtype "bf16": the activations rounded to
bf16 as well), against the float32 model, over the same decode steps (the
prompt's products, which fill the cache, are rounded alike).
"""
import argparse
import json
import platform
import subprocess
import sys
import time

import numpy as np

import common

# (K, V) pairs measured: every type for both, then mixed examples.
PAIRS = [("bf16", "bf16"), ("f16", "f16"), ("fp8", "fp8"), ("int8", "int8"), ("int4", "int4"),
         ("int8", "int4"), ("bf16", "int8"), ("fp8", "int4")]

LLAMA_CFG = {
    "vocab_size": 32000, "context_length": 4096, "emb_dim": 2048, "n_heads": 32,
    "n_kv_groups": 8, "n_layers": 8, "hidden_dim": 8192, "rope_base": 500000.0,
    "rope_freq": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_context_length": 8192},
}


def log_softmax(logits):
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def teacher_forced(lm, seqs, prompt_len, k_dtype, v_dtype):
    """The log-probabilities of every decode step, (steps, batch, vocab) as a
    list of (batch, vocab) arrays, and the cache's bytes per token."""
    batch, total = seqs.shape
    cache = lm.new_cache(batch=batch, max_len=total, k_dtype=k_dtype, v_dtype=v_dtype)
    lm.forward(seqs[:, :prompt_len], cache=cache, last_only=True)
    for t in range(prompt_len, total):
        yield log_softmax(lm.forward(seqs[:, t:t + 1], cache=cache, last_only=True))
    yield cache.token_bytes()


def measure(lm, seqs, prompt_len, label, pairs=PAIRS):
    """Rows of the table: the f32 cache, then each pair against it."""
    seqs = np.ascontiguousarray(seqs, dtype=np.int32)
    start = time.time()
    *ref, f32_bytes = teacher_forced(lm, seqs, prompt_len, "f32", "f32")
    seconds = time.time() - start
    steps = len(ref) * seqs.shape[0]
    entropy = float(np.mean([-(np.exp(r) * r).sum(-1) for r in ref]))
    print("%s: %d decode steps (batch %d, cache lengths %d to %d); float32 cache %.1f s; "
          "mean entropy of the float32 distributions %.3f nats (uniform: %.3f)"
          % (label, steps, seqs.shape[0], prompt_len + 1, seqs.shape[1], seconds, entropy,
             np.log(ref[0].shape[-1])), flush=True)
    rows = [{"k": "f32", "v": "f32", "token_bytes": f32_bytes, "mean_kl": 0.0, "max_kl": 0.0,
             "top1": 100.0}]
    for k, v in pairs:
        start = time.time()
        kls, agree = [], 0
        gen = teacher_forced(lm, seqs, prompt_len, k, v)
        for r in ref:
            q = next(gen)
            kls.append((np.exp(r) * (r - q)).sum(-1))
            agree += int((r.argmax(-1) == q.argmax(-1)).sum())
        token_bytes = next(gen)
        kls = np.maximum(np.concatenate(kls), 0.0)  # rounding can leave -1e-17
        row = {"k": k, "v": v, "token_bytes": token_bytes, "mean_kl": float(kls.mean()),
               "max_kl": float(kls.max()), "top1": 100.0 * agree / steps}
        rows.append(row)
        print("  K %-4s V %-4s %8d B/token  mean KL %.2e  max KL %.2e  top-1 %.2f%%  (%.1f s)"
              % (k, v, token_bytes, row["mean_kl"], row["max_kl"], row["top1"],
                 time.time() - start), flush=True)
    return {"label": label, "steps": steps, "batch": int(seqs.shape[0]),
            "prompt_len": prompt_len, "total_len": int(seqs.shape[1]),
            "f32_entropy": entropy, "uniform_entropy": float(np.log(ref[0].shape[-1])),
            "rows": rows}


def compare(ref, runs, label):
    """KL and top-1 of each of runs ((name, generator) pairs, as
    teacher_forced yields) against ref's steps."""
    rows = []
    steps = len(ref) * ref[0].shape[0]
    for name, gen in runs:
        kls, agree = [], 0
        for r in ref:
            q = next(gen)
            kls.append((np.exp(r) * (r - q)).sum(-1))
            agree += int((r.argmax(-1) == q.argmax(-1)).sum())
        kls = np.maximum(np.concatenate(kls), 0.0)
        rows.append({"run": name, "mean_kl": float(kls.mean()), "max_kl": float(kls.max()),
                     "top1": 100.0 * agree / steps})
        print("  %-40s mean KL %.2e  max KL %.2e  top-1 %.2f%%"
              % (name, rows[-1]["mean_kl"], rows[-1]["max_kl"], rows[-1]["top1"]), flush=True)
    return {"label": label, "steps": steps, "rows": rows}


def measure_products(load, seqs, prompt_len, label):
    """bf16 weights, and bf16 weights with bf16 products (matmul_dtype),
    against the float32 model; float32 caches throughout."""
    seqs = np.ascontiguousarray(seqs, dtype=np.int32)
    *ref, _ = teacher_forced(load("f32"), seqs, prompt_len, "f32", "f32")
    print("%s: bf16 weights and products against float32 weights (float32 cache, %d decode "
          "steps)" % (label, len(ref) * seqs.shape[0]), flush=True)
    exact = load("bf16")
    fast = load("bf16")
    fast.matmul_dtype = "bf16"
    return compare(ref, [("bf16 weights, f32 products", teacher_forced(exact, seqs, prompt_len,
                                                                       "f32", "f32")),
                         ("bf16 weights, bf16 products", teacher_forced(fast, seqs, prompt_len,
                                                                        "f32", "f32"))], label)


def trained_sequences(lm, tok):
    train_text, val_text = common.text_splits()
    train_ids, val_ids = tok.encode(train_text), tok.encode(val_text)
    n = common.CFG["context_length"]
    if len(val_ids) < n:
        sys.exit("the validation text has %d tokens, fewer than %d" % (len(val_ids), n))
    prompt = tok.encode("Every effort moves you")
    sampled = list(prompt) + [int(t) for t in lm.generate(prompt, n - len(prompt),
                                                          temperature=1.0, seed=123)]
    if len(sampled) != n:
        sys.exit("the sampled sequence has %d tokens, not %d" % (len(sampled), n))
    return np.array([train_ids[:n], train_ids[2048:2048 + n], val_ids[:n], sampled])


def table(result):
    if "run" in result["rows"][0]:  # measure_products
        lines = ["| model | mean KL (nats) | max KL (nats) | top-1 agreement |",
                 "|---|---|---|---|", "| f32 weights, f32 products | 0 (reference) | 0 | 100% |"]
        for r in result["rows"]:
            lines.append("| %s | %.1e | %.1e | %.2f%% |"
                         % (r["run"], r["mean_kl"], r["max_kl"], r["top1"]))
        return "\n".join(lines)
    lines = ["| K / V | bytes/token | mean KL (nats) | max KL (nats) | top-1 agreement |",
             "|---|---|---|---|---|"]
    for r in result["rows"]:
        kl = ("%.1e" % r["mean_kl"], "%.1e" % r["max_kl"]) if r["k"] != "f32" or r["v"] != "f32" \
            else ("0 (reference)", "0")
        lines.append("| %s / %s | %d | %s | %s | %.2f%% |"
                     % (r["k"], r["v"], r["token_bytes"], kl[0], kl[1], r["top1"]))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("trained", "llama", "both", "mla"), default="both")
    ap.add_argument("--weights", default=common.WEIGHTS)
    ap.add_argument("--llama-layers", type=int, default=8)
    ap.add_argument("--llama-prompt", type=int, default=3584)
    ap.add_argument("--llama-steps", type=int, default=512)
    ap.add_argument("--threads", type=int, default=0, help="0: all cores")
    ap.add_argument("--products", action="store_true",
                    help="instead of the caches: bf16 weights and bf16 products against f32")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    attn = common.import_attn()
    cpu = subprocess.run(["sh", "-c", "lscpu | grep 'Model name'"], capture_output=True,
                         text=True).stdout.strip()
    results = {"machine": cpu or platform.processor(), "results": []}
    print(results["machine"])
    threads = args.threads or None
    if args.model in ("trained", "both"):
        lm = attn.LanguageModel.load(args.weights, config=common.CONFIG, num_threads=threads)
        seqs = trained_sequences(lm, common.tokenizer())
        label = "trained chapter-5 GPT (%s)" % ", ".join("%s %s" % kv for kv in common.CFG.items())
        if args.products:
            result = measure_products(
                lambda dtype: attn.LanguageModel.load(args.weights, config=common.CONFIG,
                                                      num_threads=threads, weights_dtype=dtype),
                seqs, 128, label)
        else:
            result = measure(lm, seqs, 128, label)
        results["results"].append(result)
        print(table(result))
        del lm
    if args.model == "mla":
        lm = attn.LanguageModel.load(common.MLA_WEIGHTS, config=common.MLA_CONFIG,
                                     num_threads=threads)
        seqs = trained_sequences(lm, common.tokenizer())
        label = "trained chapter-5 GPT with latent attention (%s)" % ", ".join(
            "%s %s" % kv for kv in common.MLA_CFG.items())
        result = measure(lm, seqs, 128, label, [(k, v) for k, v in PAIRS if k == v])
        results["results"].append(result)
        print(table(result))
        del lm
    if args.model in ("llama", "both"):
        cfg = dict(LLAMA_CFG, n_layers=args.llama_layers)
        total = args.llama_prompt + args.llama_steps
        if total > cfg["context_length"]:
            sys.exit("--llama-prompt + --llama-steps = %d is past the context, %d"
                     % (total, cfg["context_length"]))
        seqs = np.random.default_rng(123).integers(0, cfg["vocab_size"], size=(1, total))
        label = "Llama-3-shaped, random weights, %d layers" % args.llama_layers
        if args.products:
            result = measure_products(
                lambda dtype: attn.LanguageModel(dict(cfg, weights_dtype=dtype), seed=123,
                                                 num_threads=threads),
                seqs, args.llama_prompt, label)
        else:
            result = measure(attn.LanguageModel(cfg, seed=123, num_threads=threads), seqs,
                             args.llama_prompt, label)
        results["results"].append(result)
        print(table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
