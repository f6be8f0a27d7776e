#!/usr/bin/python3
"""Every module on the fast kernels against the reference kernels.

    /usr/bin/python3 tests/conformance/test_fast_vs_reference.py LIBATTN_SO [--seed N] [--cases N]

The reference kernels (double accumulation) are the oracle the exactness
suites hold against PyTorch; the fast ones (packed GEMM, fused attention,
per instruction set) must agree with them. For each module, random shapes
and seeds (fresh each run; --seed replays), eval and train mode with
dropout drawn both ways (mt19937, PyTorch's mask, which the fused kernels
take as bits; and Philox, which they draw in the kernel), on every kernel
set this CPU runs and on 1, 2 and 3 threads:
  - the output within relative L2 1e-5 of the reference run, and the
    gradients (input and every parameter, as one vector) likewise; each
    tensor's own error is printed too;
  - bitwise identical across the thread counts.
Inputs are of unit scale, as a model's activations are. A gradient that is
zero in exact arithmetic (the key bias always, since softmax is blind to a
shift shared by every key; the query and key weights when T = 1, as one
key takes all the weight) holds only rounding residue in float32, so each
tensor's error is measured against the larger of its own norm and 1e-3 of
the case's largest gradient norm (the key bias: its weight's gradient norm,
as in test_grad_vs_torch.py).
"""
import argparse
import ctypes
import os
import random
import sys
import time

import numpy as np

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_ctypes import (ATTN_BERNOULLI_MT19937, ATTN_KERNELS_AVX2, ATTN_KERNELS_AVX512,  # noqa: E402
                         ATTN_KERNELS_PORTABLE, ATTN_KERNELS_REFERENCE, Attn)
from conformance import Results, make_case, rand_seed  # noqa: E402
from test_grad_vs_torch import rel_l2, vanishing_floor  # noqa: E402

ATTN_BERNOULLI_PHILOX = 2
TOL = 1e-5
KINDS = ["sa_v1", "sa_v2", "causal_neg_inf", "causal_renorm", "mha_wrapper", "mha", "mha000",
         "gpt2"]
TRAIN_KINDS = ["causal_neg_inf", "causal_renorm", "mha_wrapper", "mha", "gpt2"]
KERNEL_NAMES = {ATTN_KERNELS_PORTABLE: "portable", ATTN_KERNELS_AVX2: "avx2",
                ATTN_KERNELS_AVX512: "avx512"}


def run(A, ctx, case, seed, x, dy, train, bernoulli):
    """(y, {"input": dx, name: grad}) of one forward and backward."""
    rng = A.rng_new(ctx, seed, bernoulli)
    h, m = A.module_new(ctx, case["ckind"], rng, **case["cfg"])
    try:
        A.module_set_training(ctx, m, train)
        y = A.module_forward(ctx, m, x, rng if train else None)
        grads = {"input": A.module_backward(ctx, m, dy)}
        grads.update(A.module_grads(ctx, m))
    finally:
        A.module_free(m)
        A.rng_free(rng)
    return y, grads


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--cases", type=int, default=2)
    args = ap.parse_args()
    run_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print("run seed %d (replay with --seed %d)" % (run_seed, run_seed))
    r = random.Random(run_seed)
    A = Attn(args.lib)
    A.lib.attn_kernels_supported.restype = ctypes.c_bool
    A.lib.attn_kernels_supported.argtypes = [ctypes.c_int]
    fast = [k for k in KERNEL_NAMES if A.lib.attn_kernels_supported(k)]
    print("fast kernel sets: %s" % ", ".join(KERNEL_NAMES[k] for k in fast))
    ref_ctx = A.ctx_new(num_threads=2, kernels=ATTN_KERNELS_REFERENCE)
    ctxs = {(k, t): A.ctx_new(num_threads=t, kernels=k) for k in fast for t in (1, 2, 3)}
    res = Results()
    t0 = time.time()
    for train_pass, kinds in ((False, KINDS), (True, TRAIN_KINDS)):
        for kind in kinds:
            for _ in range(args.cases):
                case = make_case(kind, r, train_pass)
                seed = rand_seed(r)
                nprng = np.random.default_rng(r.getrandbits(32))
                x = nprng.standard_normal((case["B"], case["T"], case["d_in"])).astype(np.float32)
                if kind == "sa_v1":  # the seeds' kind of input for torch.rand weights
                    x = (nprng.random(x.shape) / case["d_in"]).astype(np.float32)
                dy = nprng.standard_normal((case["B"], case["T"], case["d_out"])).astype(np.float32)
                for bernoulli in ((ATTN_BERNOULLI_MT19937, ATTN_BERNOULLI_PHILOX) if train_pass
                                  else (ATTN_BERNOULLI_MT19937,)):
                    ry, rg = run(A, ref_ctx, case, seed, x, dy, train_pass, bernoulli)
                    ref = dict(rg, output=ry)
                    for k in fast:
                        outs = []
                        for t in (1, 2, 3):
                            y, g = run(A, ctxs[(k, t)], case, seed, x, dy, train_pass, bernoulli)
                            outs.append(dict(g, output=y))
                        # forward: the output; backward: every gradient together (input
                        # and parameters, one vector), as the bound reads; each
                        # tensor's own error is reported, against its floor
                        names = [n for n in ref if n != "output"]
                        e_fwd = rel_l2(outs[0]["output"], ref["output"])
                        e_bwd = rel_l2(np.concatenate([outs[0][n].ravel() for n in names]),
                                       np.concatenate([ref[n].ravel() for n in names]))
                        floor = 1e-3 * max(np.linalg.norm(ref[n]) for n in names)
                        per_tensor = max(rel_l2(outs[0][n], ref[n], max(floor, vanishing_floor(n, ref)))
                                         for n in names)
                        worst = max(e_fwd, e_bwd)
                        bad = [] if worst <= TOL else ["forward %.3g backward %.3g" % (e_fwd, e_bwd)]
                        same = all(np.array_equal(o[n].view(np.uint32), outs[0][n].view(np.uint32))
                                   for o in outs[1:] for n in ref)
                        label = "%-15s %s %-8s %s seed=%d %s" % (
                            kind, "train" if train_pass else "eval ", KERNEL_NAMES[k],
                            "philox " if bernoulli == ATTN_BERNOULLI_PHILOX else "mt19937",
                            seed, case["desc"])
                        res.note(KERNEL_NAMES[k], n=1, rel_l2=worst, per_tensor=per_tensor)
                        res.check(not bad and same, label,
                                  "rel L2 forward %.3g backward %.3g (worst tensor %.3g)%s"
                                  % (e_fwd, e_bwd, per_tensor, "" if same else "; threads differ"))
    print()
    print("worst relative L2 against the reference, per kernel set (and of any one tensor):")
    for g, v in res.maxerr.items():
        print("  %-10s %5d cases  %.3g  (%.3g)" % (g, v["n"], v["rel_l2"], v["per_tensor"]))
    print("elapsed %.1f s, run seed %d" % (time.time() - t0, run_seed))
    if res.failures:
        print("failures:")
        for f in res.failures:
            print("  " + f)
    print("%d passed, %d failed" % (res.passed, res.failed))
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
