#!/usr/bin/python3
"""Numerics at the edges, against Debian's PyTorch: the README's promise.

    /usr/bin/python3 tests/conformance/test_numerics.py LIBATTN_SO

Each check runs on the reference kernels and on the fast ones (a ctx's
default), on 1 and 3 threads.
  1. NaN and inf inputs: every module (and both causal masks) on inputs
     holding NaN, +inf or -inf in eight placements. The NaN, +inf and -inf
     positions of attn's output must be those of PyTorch float32's, exactly.
  2. Finite inputs whose intermediates overflow float32 or whose weights
     underflow there: PyTorch float32 gives NaN, attn gives the finite value
     float64 gives (relative L2 <= 1e-6 against torch float64):
       - SimplifiedSelfAttention on rows near 1e38 (x x^T overflows),
       - MultiHeadAttention, GPT-2 and CausalAttention on inputs scaled to
         1e19 (q k^T overflows),
       - the renormalising mask where a future score dwarfs the kept ones
         (the kept weights underflow to 0 / 0). There float64 PyTorch fails
         too once the gap passes 745; attn computes the mask as a softmax over
         the kept scores, so it gives the masked softmax, which is what the
         neg-inf mask gives: compared with torch float64's neg-inf result.
Ends with "N passed, N failed"; exits 1 on any failure.
"""
import math
import os
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_ctypes import (ATTN_KERNELS_AUTO, ATTN_KERNELS_REFERENCE, ATTN_MASK_NEG_INF,  # noqa: E402
                         ATTN_MASK_RENORMALIZE, Attn)
from seed_modules import (  # noqa: E402
    Batched2D, CausalAttention, CausalAttentionRenorm, CausalSelfAttention, GPTConfig,
    MultiHeadAttention, MultiHeadAttentionWrapper, SelfAttention_v1, SelfAttention_v2,
    SimplifiedSelfAttention)

passed = failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
    print("%s  %s%s" % ("ok  " if ok else "FAIL", what, ("  " + detail) if detail else ""))
    return ok


D_IN, D_OUT, HEADS, T, B = 6, 6, 2, 5, 2

# name: (torch constructor, attn kind or None for simple, attn config)
MODULES = {
    "SimplifiedSelfAttention": (lambda: Batched2D(SimplifiedSelfAttention()), None, {}),
    "SelfAttention_v1": (lambda: Batched2D(SelfAttention_v1(D_IN, D_OUT)), "sa_v1",
                         dict(d_in=D_IN, d_out=D_OUT, scale=0.0)),
    "SelfAttention_v2": (lambda: Batched2D(SelfAttention_v2(D_IN, D_OUT, qkv_bias=True)),
                         "sa_v2", dict(d_in=D_IN, d_out=D_OUT, qkv_bias=True, scale=0.0)),
    "CausalAttention": (lambda: CausalAttention(D_IN, D_OUT, T, 0.0, qkv_bias=True), "causal",
                        dict(d_in=D_IN, d_out=D_OUT, context_length=T, dropout=0.0,
                             qkv_bias=True, scale=0.0, mask=ATTN_MASK_NEG_INF)),
    "CausalAttention[renormalize]": (
        lambda: CausalAttentionRenorm(D_IN, D_OUT, T, 0.0, qkv_bias=True), "causal",
        dict(d_in=D_IN, d_out=D_OUT, context_length=T, dropout=0.0, qkv_bias=True, scale=0.0,
             mask=ATTN_MASK_RENORMALIZE)),
    "MultiHeadAttentionWrapper": (
        lambda: MultiHeadAttentionWrapper(D_IN, D_OUT // HEADS, T, 0.0, HEADS, qkv_bias=True),
        "mha_wrapper", dict(d_in=D_IN, d_out=D_OUT // HEADS, context_length=T,
                            num_heads=HEADS, dropout=0.0, qkv_bias=True, scale=0.0,
                            mask=ATTN_MASK_NEG_INF)),
    "MultiHeadAttention": (lambda: MultiHeadAttention(D_IN, D_OUT, T, 0.0, HEADS), "mha",
                           dict(d_in=D_IN, d_out=D_OUT, context_length=T, num_heads=HEADS,
                                dropout=0.0, qkv_bias=False, scale=0.0,
                                mask=ATTN_MASK_NEG_INF)),
    "CausalSelfAttention (GPT-2)": (lambda: CausalSelfAttention(GPTConfig(D_IN, HEADS, T, 0.0)),
                                    "gpt2", dict(n_embd=D_IN, n_head=HEADS, block_size=T,
                                                 dropout=0.0, scale=0.0)),
}


class Pair:
    """A torch module and attn's, same seed, same weights, eval mode."""

    def __init__(self, A, ctx, name, seed=123):
        ctor, kind, cfg = MODULES[name]
        self.A, self.ctx = A, ctx
        torch.manual_seed(seed)
        self.torch = ctor().eval()
        self.rng = A.rng_new(ctx, seed)
        if kind is None:
            self.h, self.m = A.simple_new(ctx, D_IN)
        else:
            self.h, self.m = A.module_new(ctx, kind, self.rng, **cfg)
        A.module_set_training(ctx, self.m, False)

    def ours(self, x):
        return self.A.module_forward(self.ctx, self.m, x.astype(np.float32))

    def torch32(self, x):
        with torch.no_grad():
            return self.torch(torch.from_numpy(x.astype(np.float32))).numpy()

    def torch64(self, x):
        import copy
        with torch.no_grad():
            return copy.deepcopy(self.torch).double()(torch.from_numpy(x.astype(np.float64))).numpy()

    def free(self):
        self.A.module_free(self.m)
        self.A.rng_free(self.rng)


def base_input(seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, (B, T, D_IN)).astype(np.float32)


def placements():
    """Eight ways to put NaN and inf into an input, by name."""
    nan, inf = float("nan"), float("inf")

    def put(*cells):
        def f(x):
            for (b, t, c), v in cells:
                if c is None:
                    x[b, t, :] = v
                else:
                    x[b, t, c] = v
            return x
        return f
    return [
        ("one NaN", put(((0, 2, 1), nan))),
        ("one +inf", put(((0, 1, 0), inf))),
        ("one -inf", put(((1, 3, 2), -inf))),
        ("+inf in the last token", put(((0, T - 1, 3), inf))),
        ("a NaN token", put(((1, 0, None), nan))),
        ("a -inf token first", put(((0, 0, None), -inf))),
        ("+inf and -inf in one token", put(((1, 2, 0), inf), ((1, 2, 4), -inf))),
        ("+inf first, NaN last", put(((0, 0, 5), inf), ((1, T - 1, 1), nan))),
    ]


def same_pattern(a, b):
    return (np.array_equal(np.isnan(a), np.isnan(b)) and
            np.array_equal(np.isposinf(a), np.isposinf(b)) and
            np.array_equal(np.isneginf(a), np.isneginf(b)))


def test_nonfinite(A, ctx):
    same = total = 0
    for name in MODULES:
        pair = Pair(A, ctx, name)
        for label, put in placements():
            x = put(base_input())
            ours, theirs = pair.ours(x), pair.torch32(x)
            ok = same_pattern(ours, theirs)
            same += ok
            total += 1
            check(ok, "%s, %s: NaN/inf where torch has them" % (name, label),
                  "" if ok else "ours NaN %d inf %d, torch NaN %d inf %d" % (
                      np.isnan(ours).sum(), np.isinf(ours).sum(), np.isnan(theirs).sum(),
                      np.isinf(theirs).sum()))
        pair.free()
    print("NaN/inf patterns identical to PyTorch float32: %d/%d" % (same, total))
    return same, total


def rel_l2(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def documented_difference(A, ctx, name, x, what, reference=None):
    """torch float32 has NaN, attn is finite and within 1e-6 of float64."""
    pair = Pair(A, ctx, name)
    ours, t32 = pair.ours(x), pair.torch32(x)
    want = pair.torch64(x) if reference is None else reference
    pair.free()
    check(np.isnan(t32).any(), "%s, %s: torch float32 gives NaN" % (name, what))
    check(np.isfinite(ours).all(), "%s, %s: attn is finite" % (name, what))
    err = rel_l2(ours, want) if np.isfinite(want).all() else float("nan")
    check(err <= 1e-6, "%s, %s: attn within 1e-6 of float64" % (name, what), "rel L2 %.3g" % err)
    return ours


def test_overflow(A, ctx):
    rng = np.random.default_rng(7)
    # rows near 1e38: x x^T is 1e76
    x = rng.uniform(0.5, 1.0, (B, T, D_IN)) * 1e38
    documented_difference(A, ctx, "SimplifiedSelfAttention", x, "rows near 1e38")
    # inputs at a few 1e19: q k^T passes float32's 3.4e38
    x = rng.uniform(-1, 1, (B, T, D_IN)) * 3e19
    for name in ("MultiHeadAttention", "CausalSelfAttention (GPT-2)", "CausalAttention",
                 "SelfAttention_v2"):
        documented_difference(A, ctx, name, x, "inputs scaled to 3e19")


def test_query_overflow(A, ctx):
    """The seeds' one-query steps (attn_simple_forward_query) on rows near 1e38:
    x_q . x_i overflows float32 (the scores inf, as PyTorch float32's); the weights
    and context are float64's finite ones, as the whole module's are."""
    rng = np.random.default_rng()
    x = (rng.uniform(0.5, 1.0, (T, D_IN)) * 1e38).astype(np.float32)
    q = int(rng.integers(T))
    h, m = A.simple_new(ctx, D_IN)
    scores, weights, context = A.simple_forward_query(ctx, h, x, q)
    A.module_free(m)
    x64 = torch.tensor(x, dtype=torch.float64)
    s64 = x64 @ x64[q]
    w64 = torch.softmax(s64, 0)
    c64 = w64 @ x64
    w32 = torch.softmax(torch.tensor(x) @ torch.tensor(x)[q], 0)
    check(np.isnan(w32.numpy()).any(), "one query, rows near 1e38: torch float32 gives NaN")
    check(np.array_equal(scores, s64.float().numpy()), "one query: the scores, float64's rounded")
    check(rel_l2(weights, w64.numpy()) <= 1e-6 and rel_l2(context, c64.numpy()) <= 1e-6,
          "one query, rows near 1e38: weights and context within 1e-6 of float64",
          "rel L2 %.3g, %.3g" % (rel_l2(weights, w64.numpy()), rel_l2(context, c64.numpy())))


def test_renormalize_underflow(A, ctx):
    """Scaled-up inputs make some future score exceed a row's kept ones by more
    than float32's exp range (~104) or even float64's (~745)."""
    rng = np.random.default_rng(11)
    neg_inf = Pair(A, ctx, "CausalAttention")
    for factor, which in ((40.0, "gap past float32's range"), (200.0, "gap past float64's range")):
        x = rng.uniform(-1, 1, (B, T, D_IN)) * factor
        want = neg_inf.torch64(x)  # the masked softmax the renormalising mask equals
        ours = documented_difference(A, ctx, "CausalAttention[renormalize]", x,
                                     "renormalize, %s (x%g)" % (which, factor), reference=want)
        check(rel_l2(ours, neg_inf.ours(x)) <= 1e-6,
              "renormalize equals neg-inf in attn, %s" % which)
        pair = Pair(A, ctx, "CausalAttention[renormalize]")
        t64 = pair.torch64(x)
        pair.free()
        print("    (torch float64 with the renormalising mask: %s)" %
              ("NaN" if np.isnan(t64).any() else "finite"))
    neg_inf.free()


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    A = Attn(sys.argv[1])
    torch.set_num_threads(1)
    print("torch %s, numpy %s" % (torch.__version__, np.__version__))
    # The reference kernels, and the fast ones a ctx gets by default (which
    # hand such inputs to the reference: dispatch.c, needs_reference).
    for kernels, label in ((ATTN_KERNELS_REFERENCE, "reference"), (ATTN_KERNELS_AUTO, "auto")):
        print("--- kernels: %s" % label)
        for threads in (1, 3):
            ctx = A.ctx_new(threads, kernels)
            test_nonfinite(A, ctx)
            test_overflow(A, ctx)
            test_query_overflow(A, ctx)
            test_renormalize_underflow(A, ctx)
            A.ctx_free(ctx)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
