#!/usr/bin/python3
"""Gradients of every module against PyTorch autograd.

    /usr/bin/python3 tests/conformance/test_grad_vs_torch.py LIBATTN_SO [--seed N] [--cases N]

For fresh random shapes and seeds each run (the run seed is printed; --seed
replays), every module is built in PyTorch (the seeds' classes) and in
attn from the same seed, so they hold the same weights. Both run forward on
the same x, then backward with the same random dy:

  1. eval mode, every module (simple, sa_v1, sa_v2, causal with each mask,
     the wrapper, mha with each mask and seed 000's unmasked one, gpt2), with
     and without qkv_bias, T <= context_length: dx and every parameter's
     grad within relative L2 1e-5 of a float64 autograd run;
  2. train mode with dropout: both draw the same mask (the mt19937 mode is
     PyTorch's own), and the backward must use it: same bound;
  3. determinism: the backward on 1 and 3 threads gives the same bits;
  4. gradients accumulate: a second backward doubles every grad;
     zero_grad clears them;
  5. NaN in dy: the NaN pattern of dx and every grad equals PyTorch's.

The relative L2 is ||ours - f64|| / ||f64||, with one exception: the key
bias's gradient is zero in exact arithmetic (softmax is blind to a shift
shared by every key), so what both float32 runs hold there is rounding
residue; it is measured against the norm of the key weight's gradient.

The bound is 1e-5, or four times PyTorch float32's own error on the same
case where that is larger. Some random cases are ill-conditioned: a
gradient that is a small difference of large terms (d_in = 1 makes
W_query's grad one sum over tokens of softmax-gradient rows that sum to
zero) loses digits in any float32 computation, PyTorch's too (1.5e-4
against float64 in such a case, ours 6e-5). No float32 kernel can meet
1e-5 there, so the test asks for no worse than four times what PyTorch
float32 reaches. There the two float32 errors are draws of a size: over 40
runs of test_grad_cli.py attn's was 0.05-0.3x PyTorch's on such cases,
but its seed 3003597992 (mha-wrapper, d_in 1, T 2, dropout 0.5) drew 2.0x
(3.01e-5 against 1.51e-5), and failed the twice this bound was until then,
on earlier code too. A wrong gradient is off by O(1). Such cases are
printed.
"""
import argparse
import copy
import os
import random
import sys
import time

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_ctypes import ATTN_BERNOULLI_MT19937, MODULES, Attn  # noqa: E402
from conformance import Results, make_case, rand_seed  # noqa: E402
from seed_modules import Batched2D, SimplifiedSelfAttention  # noqa: E402

TOL = 1e-5


def bound(torch_f32_error):
    """The error allowed: TOL, or four times PyTorch float32's own on an
    ill-conditioned case (see above)."""
    return max(TOL, 4 * torch_f32_error)

KINDS = ["simple", "sa_v1", "sa_v2", "causal_neg_inf", "causal_renorm", "mha_wrapper", "mha",
         "mha000", "gpt2"]
TRAIN_KINDS = ["causal_neg_inf", "causal_renorm", "mha_wrapper", "mha", "gpt2"]


def simple_case(r):
    B, T, d = r.randint(1, 4), r.randint(1, 24), r.randint(1, 48)
    return dict(ctor=lambda: Batched2D(SimplifiedSelfAttention()), ckind="simple",
                cfg=dict(d_in=d), prefix="inner.", B=B, T=T, d_in=d, d_out=d,
                desc="d_in=%d B=%d T=%d" % (d, B, T))


def torch_grads(tm, x, dy, dtype):
    """(y, dx, {name: grad}) of module tm (copied to dtype) at x with loss sum(y*dy)."""
    m = copy.deepcopy(tm).to(dtype)
    xt = x.to(dtype).clone().requires_grad_(True)
    y = m(xt)
    y.backward(dy.to(dtype))
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach()
             for n, p in m.named_parameters()}
    return y.detach(), xt.grad.detach(), grads


def rel_l2(ours, ref, floor=0.0):
    ref = np.asarray(ref, dtype=np.float64)
    diff = np.linalg.norm(np.asarray(ours, dtype=np.float64) - ref)
    return diff / max(np.linalg.norm(ref), floor, 1e-300)


def vanishing_floor(name, ref):
    """For a key bias, the norm of its weight's gradient (see the docstring)."""
    if name.endswith("W_key.bias"):
        return np.linalg.norm(ref[name[:-len("bias")] + "weight"])
    return 0.0


def same_nan_pattern(a, b):
    return np.array_equal(np.isnan(a), np.isnan(np.asarray(b)))


class Case:
    """One module built in torch and in attn from the same seed."""

    def __init__(self, A, ctxs, r, kind, train):
        self.A, self.train = A, train
        self.case = simple_case(r) if kind == "simple" else make_case(kind, r, train)
        c = self.case
        self.seed = rand_seed(r)
        gen = torch.Generator().manual_seed(r.randrange(2 ** 63))
        self.x = torch.randn(c["B"], c["T"], c["d_in"], generator=gen)
        if kind == "sa_v1":
            # torch.rand weights are all positive: inputs of the seeds' kind,
            # in [0, 1) and scaled by 1/d_in, keep the scores O(1) instead of
            # saturating the softmax (where every gradient underflows).
            self.x = torch.rand(c["B"], c["T"], c["d_in"], generator=gen) / c["d_in"]
        self.dy = torch.randn(c["B"], c["T"], c["d_out"], generator=gen)
        torch.manual_seed(self.seed)
        self.tm = c["ctor"]()
        self.tm.train(train)
        self.ctxs = ctxs

    def torch_run(self, dtype, dy=None):
        """torch's gradients; the dropout draws restart from the module's seed."""
        torch.manual_seed(self.seed)
        self.c_ctor_draws()
        return torch_grads(self.tm, self.x, self.dy if dy is None else dy, dtype)

    def c_ctor_draws(self):
        # The constructor's draws, so the forward's dropout starts where it
        # did in attn (constructed from the same seed, then forward).
        self.case["ctor"]()

    def attn_module(self, threads):
        A, c = self.A, self.case
        ctx = self.ctxs[threads]
        rng = A.rng_new(ctx, self.seed, ATTN_BERNOULLI_MT19937)
        if c["ckind"] == "simple":
            h, m = A.simple_new(ctx, c["d_in"])
        else:
            h, m = A.module_new(ctx, c["ckind"], rng, **c["cfg"])
        A.module_set_training(ctx, m, self.train)
        return ctx, rng, h, m

    def attn_run(self, threads, dy=None, typed=False):
        """attn's (y, dx, {name: grad}) on `threads` threads."""
        A = self.A
        ctx, rng, h, m = self.attn_module(threads)
        try:
            y = A.module_forward(ctx, m, self.x.numpy(), rng if self.train else None)
            prefix = "attn_simple" if self.case["ckind"] == "simple" else MODULES[self.case["ckind"]][1]
            dx = A.module_backward(ctx, m, (self.dy if dy is None else dy).numpy(),
                                   typed=(prefix, h) if typed else None)
            grads = dict(A.module_grads(ctx, m))
        finally:
            A.module_free(m)
            A.rng_free(rng)
        return y, dx, grads


def check_case(A, ctxs, res, r, kind, train):
    case = Case(A, ctxs, r, kind, train)
    c = case.case
    threads = r.choice(sorted(ctxs))
    name = "%-15s %s seed=%d %s threads=%d" % (kind, "train" if train else "eval ", case.seed,
                                               c["desc"], threads)
    _, tdx32, tg32 = case.torch_run(torch.float32)
    ty64, tdx64, tg64 = case.torch_run(torch.float64)
    oy, odx, og = case.attn_run(threads, typed=r.random() < 0.5)
    strip = lambda n: n[len(c["prefix"]):]
    ref = {"input": tdx64.numpy()}
    ref.update({strip(n): g.numpy() for n, g in tg64.items()})
    t32 = {"input": tdx32.numpy()}
    t32.update({strip(n): g.numpy() for n, g in tg32.items()})
    ours = {"input": odx}
    ours.update(og)
    problems, worst = [], 0.0
    if sorted(ours) != sorted(ref):
        problems.append("gradient names: ours %s torch %s" % (sorted(ours), sorted(ref)))
    for n in ref:
        if n not in ours:
            continue
        floor = vanishing_floor(n, ref)
        e = rel_l2(ours[n], ref[n], floor)
        e32 = rel_l2(t32[n], ref[n], floor)
        worst = max(worst, e)
        res.note(kind + (" train" if train else ""), n=1, **{"rel_l2": e, "torch_f32_rel": e32})
        if not e <= bound(e32):
            problems.append("%s: rel L2 %.3g vs float64 (torch float32: %.3g)" % (n, e, e32))
        elif e > TOL:
            print("ill-conditioned: %s %s: rel L2 %.3g vs float64, torch float32 %.3g"
                  % (name, n, e, e32))
    # the forward the gradients belong to
    fe = rel_l2(oy, ty64.numpy())
    if not fe <= TOL:
        problems.append("forward: rel L2 %.3g vs float64 (different dropout mask?)" % fe)
    res.check(not problems, name, "; ".join(problems)[:800] or "worst rel L2 %.3g" % worst)
    return case


def check_determinism(A, ctxs, res, case):
    _, dx1, g1 = case.attn_run(1)
    _, dx3, g3 = case.attn_run(3)
    same = np.array_equal(dx1.view(np.uint32), dx3.view(np.uint32)) and all(
        np.array_equal(g1[n].view(np.uint32), g3[n].view(np.uint32)) for n in g1)
    res.check(same, "%-15s bitwise identical on 1 and 3 threads" % case.case["ckind"], "")


def check_accumulation(A, ctxs, res, case):
    ctx, rng, h, m = case.attn_module(1)
    try:
        x, dy = case.x.numpy(), case.dy.numpy()
        A.module_forward(ctx, m, x, rng if case.train else None)
        A.module_backward(ctx, m, dy)
        once = dict(A.module_grads(ctx, m))
        A.module_backward(ctx, m, dy)
        twice = dict(A.module_grads(ctx, m))
        ok = all(np.allclose(twice[n], 2 * once[n], rtol=1e-6, atol=1e-30) for n in once)
        A.module_zero_grad(ctx, m)
        zeroed = all(not np.any(g) for _, g in A.module_grads(ctx, m))
    finally:
        A.module_free(m)
        A.rng_free(rng)
    res.check(ok and zeroed, "%-15s grads accumulate (+=), zero_grad clears" % case.case["ckind"],
              "accumulate %s zero_grad %s" % (ok, zeroed))


def check_nan(A, ctxs, res, r, case):
    dy = case.dy.clone()
    idx = tuple(r.randrange(s) for s in dy.shape)
    dy[idx] = float("nan")
    _, tdx, tg = case.torch_run(torch.float32, dy=dy)
    _, odx, og = case.attn_run(r.choice(sorted(ctxs)), dy=dy)
    strip = lambda n: n[len(case.case["prefix"]):]
    bad = [] if same_nan_pattern(odx, tdx.numpy()) else ["input"]
    bad += [n for n, g in tg.items() if not same_nan_pattern(og[strip(n)], g.numpy())]
    counts = "dx NaN ours %d torch %d" % (np.isnan(odx).sum(), np.isnan(tdx.numpy()).sum())
    res.check(not bad, "%-15s NaN in dy%s spreads as in autograd" % (case.case["ckind"], list(idx)),
              "differs in %s (%s)" % (bad, counts) if bad else counts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--cases", type=int, default=4, help="random cases per module and mode")
    args = ap.parse_args()
    run_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print("run seed %d (replay with --seed %d)" % (run_seed, run_seed))
    r = random.Random(run_seed)
    torch.set_num_threads(1)
    A = Attn(args.lib)
    ctxs = {n: A.ctx_new(num_threads=n) for n in (1, 2, 3)}
    res = Results()
    t0 = time.time()
    for kind in KINDS:
        for i in range(args.cases):
            case = check_case(A, ctxs, res, r, kind, train=False)
            if i == 0:
                check_determinism(A, ctxs, res, case)
                check_accumulation(A, ctxs, res, case)
                check_nan(A, ctxs, res, r, case)
    for kind in TRAIN_KINDS:
        for i in range(args.cases):
            case = check_case(A, ctxs, res, r, kind, train=True)
            if i == 0:
                check_determinism(A, ctxs, res, case)
                check_nan(A, ctxs, res, r, case)
    print()
    print("worst gradient error per module (relative L2 vs torch float64 autograd):")
    print("  %-22s %5s %12s %16s" % ("module", "n", "attn", "torch float32"))
    for g, v in res.maxerr.items():
        print("  %-22s %5d %12.3g %16.3g" % (g, v["n"], v.get("rel_l2", 0),
                                            v.get("torch_f32_rel", 0)))
    print("elapsed %.1f s, run seed %d" % (time.time() - t0, run_seed))
    if res.failures:
        print("failures:")
        for f in res.failures:
            print("  " + f)
    print("%d passed, %d failed" % (res.passed, res.failed))
    for c in ctxs.values():
        A.ctx_free(c)
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
