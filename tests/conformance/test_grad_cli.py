#!/usr/bin/python3
"""`attn grad` end to end against PyTorch autograd.

    /usr/bin/python3 tests/conformance/test_grad_cli.py path/to/attn [--seed N] [--cases K]

For every --module, random shapes and options (2-D and 3-D inputs,
--qkv-bias, --context > T, --mask, --dropout P --train for the causal
modules), a random dy is saved as .npy and `attn grad` writes output.npy,
input.npy and one <state_dict name>.npy per parameter. The seeds' PyTorch
class, built after torch.manual_seed(S) and run in float64 (with the same
dropout draws), gives y, x.grad and every p.grad: each file must be within
relative L2 1e-5 of it, or of four times PyTorch float32's own error where the case
is ill-conditioned (this and the key bias against its weight's gradient norm:
see test_grad_vs_torch.py), on the reference kernels (ATTN_KERNELS=reference; the
fast ones are held to those by test_fast_vs_reference.py). Then the usage errors: a dy of the wrong shape, a
missing --grad-output or --out. Ends with "N passed, N failed".
"""
import argparse
import copy
import os
import random
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_cli  # noqa: E402
from test_cli import MODULES, Runner, build_torch, check, random_case, random_input, show  # noqa: E402
from test_grad_vs_torch import bound, rel_l2, vanishing_floor  # noqa: E402



def torch_grads(c, x, dy, dtype):
    """y, x.grad and {name: grad} of the seed's class in dtype."""
    mod = build_torch(c)  # torch.manual_seed(c.seed), then the constructor's draws
    mod.train(c.train)
    mod = copy.deepcopy(mod).to(dtype)
    xt = torch.from_numpy(x).to(dtype).requires_grad_(True)
    if c.module in ("simple", "sa1", "sa2"):
        xs = xt if xt.dim() == 3 else xt.unsqueeze(0)
        y = torch.stack([mod(xs[b]) for b in range(xs.shape[0])])
        y = y if xt.dim() == 3 else y.squeeze(0)
    else:
        y = mod(xt if xt.dim() == 3 else xt.unsqueeze(0))
        y = y if xt.dim() == 3 else y.squeeze(0)
    y.backward(torch.from_numpy(dy).to(dtype))
    grads = {n: p.grad.numpy() for n, p in mod.named_parameters()}
    return y.detach().numpy(), xt.grad.numpy(), grads


def grad_args(c, inp, dy_path, out_dir):
    args = test_cli.cli_args(c, inp, "unused")
    i = args.index("--output")
    del args[i:i + 2]
    args[0] = "grad"
    return args + ["--grad-output", dy_path, "--out", out_dir]


def grad_case(r, rng, c):
    x = random_input(rng, c)
    y_shape = x.shape[:-1] + (c.d_out * (c.heads if c.module == "mha-wrapper" else 1),)
    dy = np.random.default_rng(rng.getrandbits(32)).standard_normal(y_shape).astype(np.float32)
    inp, dy_path, out_dir = r.path("x.npy"), r.path("dy.npy"), r.path("grads")
    np.save(inp, x)
    np.save(dy_path, dy)
    args = grad_args(c, inp, dy_path, out_dir)
    rc, so, se = r.run(args)
    label = test_cli.describe(c)
    if not check(rc == 0 and so == "", "grad exits 0 silently: " + label,
                 "%s\n      rc=%s stderr=%r" % (show(args), rc, se.strip()[:400])):
        return
    y64, dx64, g64 = torch_grads(c, x, dy, torch.float64)
    ref = dict(g64, input=dx64, output=y64)
    y32, dx32, g32 = torch_grads(c, x, dy, torch.float32)  # the same dropout draws
    t32 = dict(g32, input=dx32, output=y32)
    problems = []
    files = sorted(f[:-4] for f in os.listdir(out_dir))
    if files != sorted(ref):
        problems.append("files %s, want %s" % (files, sorted(ref)))
    for name, want in ref.items():
        path = os.path.join(out_dir, name + ".npy")
        if not os.path.exists(path):
            continue
        got = np.load(path)
        if got.shape != want.shape or got.dtype != np.float32:
            problems.append("%s: %s %s, want %s float32" % (name, got.shape, got.dtype, want.shape))
            continue
        floor = vanishing_floor(name, ref) if name != "output" else 0.0
        e = rel_l2(got, want, floor)
        if not e <= bound(rel_l2(t32[name], want, floor)):
            problems.append("%s: rel L2 %.3g" % (name, e))
    check(not problems, "grad matches float64 autograd: " + label,
          "%s\n      %s" % (show(args), "; ".join(problems)))


def expect_usage(r, args, fragment):
    rc, so, se = r.run(args)
    check(rc == 2 and so == "" and se.startswith("attn: ") and se.count("\n") == 1
          and fragment in se, "usage error '%s': %s" % (fragment, show(args)),
          "rc=%s stdout=%r stderr=%r" % (rc, so[:200], se[:300]))


def test_errors(r, rng):
    c = random_case(rng, "mha")
    x = random_input(rng, c)
    inp, dy_path = r.path("x.npy"), r.path("dy.npy")
    np.save(inp, x)
    wrong = x.shape[:-1] + (c.d_out + 1,)
    np.save(dy_path, np.ones(wrong, dtype=np.float32))
    args = grad_args(c, inp, dy_path, r.path("out"))
    expect_usage(r, args, "does not match the output's")
    i = args.index("--grad-output")
    expect_usage(r, args[:i] + args[i + 2:], "--grad-output")
    i = args.index("--out")
    expect_usage(r, args[:i] + args[i + 2:], "--out")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("attn")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--cases", type=int, default=4)
    opts = ap.parse_args()
    seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(2 ** 32)
    print("run seed: %d (replay with --seed %d)" % (seed, seed), flush=True)
    rng = random.Random(seed)
    torch.set_num_threads(1)
    # the oracle's kernels: the fast ones are held to them in test_fast_vs_reference.py
    os.environ["ATTN_KERNELS"] = "reference"
    tmp = tempfile.mkdtemp(prefix="attn_test_grad_cli_")
    try:
        r = Runner(os.path.abspath(opts.attn), tmp)
        for module in MODULES:
            for i in range(opts.cases):
                c = random_case(rng, module)
                if module in ("causal", "mha-wrapper", "mha") and i % 2 == 1:
                    c.dropout, c.train = rng.choice([0.1, 0.5, rng.uniform(0.05, 0.9)]), True
                if module in ("causal", "mha-wrapper", "mha") and rng.random() < 0.3:
                    c.mask = "renormalize"
                grad_case(r, rng, c)
        test_errors(r, rng)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (test_cli.passed, test_cli.failed))
    return 1 if test_cli.failed else 0


if __name__ == "__main__":
    sys.exit(main())
