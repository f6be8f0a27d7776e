#!/usr/bin/python3
"""Huge logits: the modules' fused backward against PyTorch float64.

    python3 tests/conformance/test_huge_logits_backward.py LIBATTN_SO

The book's MultiHeadAttention(16, 16, 64, 0, 2), B = 2, T = 64, on every
kernel set this CPU runs, forward and backward on fresh random inputs x ~
N(0, 1) s for s = 3e4 and 1e5 (scores of 1e9-1e11 whose rows weigh a few
keys), against the seeds' module (PyTorch autograd) in float64 on the same
float32 inputs and weights: x's gradient, as max |attn - float64| / max
|float64|. The backward's weights come from the forward's own row max and
sum (row_stats), rounded as the forward's are; from lse and lse_lo their
exponents were off by |lse| 2^-48, and dx by 3e-5 at s = 3e4 and 3e-3 at
1e5 (bounds 1e-5 and 2e-4; now about 2e-6 and 3e-5).
Prints the seed (ATTN_TEST_SEED repeats a run); exits 1 on any failure.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["ATTN_LIBRARY"] = sys.argv[1]
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import attn  # noqa: E402
import seed_modules as S  # noqa: E402

seed = int(os.environ.get("ATTN_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
print("seed", seed, "(ATTN_TEST_SEED to repeat)")
rng = np.random.default_rng(seed)
failed = 0


def kernel_sets():
    return [k for k in ("portable", "avx2", "avx512") if attn.kernels_supported(k)]


def errors(kernels, d, T, heads, s, scale=None, batch=2):
    """{"x": max |attn - float64| / max |float64|} for dx."""
    os.environ["ATTN_KERNELS"] = kernels
    attn.manual_seed(int(rng.integers(1 << 31)))
    a = attn.MultiHeadAttention(d, d, T, 0.0, heads, scale=scale)
    sd = {k: torch.tensor(np.asarray(v)) for k, v in a.state_dict().items()}
    x = (rng.standard_normal((batch, T, d)) * s).astype(np.float32)
    dy = rng.standard_normal((batch, T, d)).astype(np.float32)
    a(x)
    ours = {"x": a.backward(dy)}
    t = S.MultiHeadAttention(d, d, T, 0.0, heads)
    t.load_state_dict(sd)
    t.scale = scale
    t.double()
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    t(xt).backward(torch.tensor(dy, dtype=torch.float64))
    theirs = {"x": xt.grad.numpy()}
    return {n: np.abs(np.asarray(ours[n], np.float64) - theirs[n]).max() / np.abs(theirs[n]).max()
            for n in theirs}


def check(kernels, label, errs, bound):
    global failed
    for name, e in errs.items():
        ok = e <= bound
        failed += not ok
        print("%s %-8s %-28s %-16s %.3g (bound %g)" % ("ok  " if ok else "FAIL", kernels, label,
                                                        name, e, bound))


for kernels in kernel_sets():
    check(kernels, "x ~ 3e4", errors(kernels, 16, 64, 2, 3e4), 1e-5)
    check(kernels, "x ~ 1e5", errors(kernels, 16, 64, 2, 1e5), 2e-4)
sys.exit(1 if failed else 0)
