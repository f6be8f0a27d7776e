"""`attn generate` sampling as chapter 5 ends: the book's generate()
(llms_from_scratch.ch05: top-k through torch.where(logits < min_val, -inf),
temperature scaling, softmax, torch.multinomial after torch.manual_seed) on
the same model gives the same tokens as
`attn generate --temperature T --top-k K --seed S`.

On a fresh model each run (the book's GPTModel, emb 64, 2 layers, 4 heads,
context 32, the real 50257-token vocabulary, weights drawn from a random
seed and saved with safetensors under the book's names): the book's
(T 1.4, top-k 25, seed 123) and random temperatures, top-k and seeds. A
sampled step may differ only where float32 rounding decides a near-tie of
torch.multinomial's choice, argmax(probs / q) over exponential draws q:
the two tokens' ratios within SLACK (relative), or where it decides which
tokens top-k keeps: the k-th and (k+1)-th largest logits within SLACK
(relative); that run's comparison stops there.

Usage: test_generate_ch05.py ATTN_CLI [--seed N]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

from test_book_data import book_ch05  # the plotting stand-ins

SLACK = 1e-5
CFG = {"vocab_size": 50257, "context_length": 32, "emb_dim": 64, "n_heads": 4, "n_layers": 2,
       "drop_rate": 0.0, "qkv_bias": False}


def attn_tokens(cli, weights, config, prompt, n, temperature, top_k, seed):
    cmd = [cli, "generate", "--weights", weights, "--config", config, "--prompt-ids",
           ",".join(map(str, prompt)), "--max-new-tokens", str(n), "--temperature",
           repr(temperature), "--top-k", str(top_k), "--seed", str(seed), "--threads", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("attn generate failed: %s\n%s" % (" ".join(cmd), p.stderr))
    return [int(t) for t in p.stdout.strip().splitlines()[-1].split(",") if t]


def book_run(model, prompt, n, temperature, top_k, seed):
    """The book's generate step by step (its lines, in float32), keeping
    per step the generator's state before the draw and the probabilities."""
    torch.manual_seed(seed)
    idx = torch.tensor([prompt])
    states, probs, step_logits = [], [], []
    with torch.no_grad():
        for _ in range(n):
            logits = model(idx[:, -CFG["context_length"]:])[:, -1, :]
            step_logits.append(logits[0].clone())
            top, _ = torch.topk(logits, top_k)
            logits = torch.where(logits < top[:, -1], torch.tensor(float("-inf")), logits)
            p = torch.softmax(logits / temperature, dim=-1)
            states.append(torch.get_rng_state())
            probs.append(p[0])
            idx = torch.cat((idx, torch.multinomial(p, num_samples=1)), dim=1)
    return idx[0, len(prompt):].tolist(), states, probs, step_logits


def near_tie(state, probs, a, b):
    """Whether tokens a and b nearly tie in torch.multinomial's choice,
    argmax(probs / q) with q the exponential draws made from state."""
    torch.set_rng_state(state)
    q = torch.empty(probs.shape[0]).exponential_().double()
    r = probs.double() / q
    return abs(r[a] - r[b]) <= SLACK * max(r[a], r[b])


def top_k_near_tie(logits, top_k):
    """Whether the k-th and (k+1)-th largest logits nearly tie, so that
    float32 rounding decides which of them top-k keeps."""
    if top_k >= logits.shape[0]:
        return False
    v = torch.topk(logits.double(), top_k + 1).values
    return abs(v[top_k - 1] - v[top_k]) <= SLACK * max(abs(v[top_k - 1]), abs(v[top_k]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--seed", type=int)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else \
        int(os.environ.get("ATTN_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print("seed", seed, "(--seed or ATTN_TEST_SEED to repeat)")
    rnd = np.random.RandomState(seed)
    ch05 = book_ch05()
    from llms_from_scratch.ch04 import GPTModel
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    model = GPTModel(CFG).eval()
    failed = compared = 0
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "model.safetensors")
        config = os.path.join(tmp, "config.json")
        state = {k: v.contiguous() for k, v in model.state_dict().items()
                 if not k.endswith(".att.mask")}
        save_file(state, weights)
        with open(config, "w") as f:
            json.dump(CFG, f)
        cases = [(1.4, 25, 123)] + [(float(rnd.choice([0.5, 1.0, 1.4, 2.0])),
                                     int(rnd.choice([1, 3, 25, 200, 50257])),
                                     int(rnd.randint(2**31))) for _ in range(5)]
        for temperature, top_k, s in cases:
            prompt = [int(t) for t in rnd.randint(0, CFG["vocab_size"], size=4)]
            n = 20
            torch.manual_seed(s)
            with torch.no_grad():
                book = ch05.generate(model, torch.tensor([prompt]), max_new_tokens=n,
                                     context_size=CFG["context_length"],
                                     temperature=temperature, top_k=top_k)
            want, states, probs, step_logits = book_run(model, prompt, n, temperature, top_k, s)
            if book[0, len(prompt):].tolist() != want:
                sys.exit("the test's replay of the book's generate is not the book's")
            got = attn_tokens(a.cli, weights, config, prompt, n, temperature, top_k, s)
            same = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), None)
            what = "T %g top_k %d seed %d prompt %s" % (temperature, top_k, s, prompt)
            if len(got) != len(want):
                failed += 1
                print("FAIL %s: %d tokens, the book %d" % (what, len(got), len(want)))
            elif same is None:
                compared += n
                print("ok   %s: %d tokens as the book's" % (what, n))
            elif near_tie(states[same], probs[same], got[same], want[same]):
                compared += same
                print("ok   %s: same to step %d, then a float32 near-tie" % (what, same))
            elif top_k_near_tie(step_logits[same], top_k):
                compared += same
                print("ok   %s: same to step %d, then a float32 near-tie at top-k's k-th "
                      "logit" % (what, same))
            else:
                failed += 1
                print("FAIL %s: step %d attn %d, the book %d\n  attn %s\n  book %s" %
                      (what, same, got[same], want[same], got, want))
    print("%d tokens compared, %d failed" % (compared, failed))
    sys.exit(1 if failed or compared == 0 else 0)


if __name__ == "__main__":
    main()
