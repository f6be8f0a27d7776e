#!/usr/bin/python3
"""End-to-end tests of the attn command against PyTorch and its own contract.

    /usr/bin/python3 tests/conformance/test_cli.py path/to/attn [--seed N] [--cases K] [--jobs J]

Run with Debian's /usr/bin/python3 (torch 1.13 built without MKL, numpy).
Every run draws fresh random shapes, options and inputs; the run seed is
printed first and --seed replays a run exactly.

  a. `attn forward` for every --module against the seeds' PyTorch classes
     built after torch.manual_seed(S): 2-D and 3-D .npy inputs, --qkv-bias,
     --scale, --context > T, --mask renormalize/none, --threads, and
     --dropout P --train (dropout draws continue after the init draws; this
     torch draws Bernoulli with mt19937, the CLI's default --bernoulli).
     Pass: max |attn - torch| <= 1e-6 (relative L2 <= 1e-6 for width >= 256);
     with --dropout P --train the bound is 1e-6 / (1 - P), as the kept
     weights (and float32 torch's rounding errors) grow by 1 / (1 - P).
  b. Bad arguments: exit code 2 (usage) or 1 (the library refused), exactly
     one stderr line starting "attn: ", nothing on stdout, no output file.
  c. --help for attn and each command; `attn version`.
  d. `attn params` counts (per module, whole model, all presets).
  e. `attn trace` shapes in the seeds' order, and its failures.
  f. --kernels: every module with --kernels reference matches torch as in a;
     the default (auto: the fast kernels) and every kernel set this CPU
     runs agree with the reference within relative L2 1e-5, forward and
     `attn grad`; unknown names (option or ATTN_KERNELS) are usage errors.
  g. `attn sdpa`: one GQA case (window, softcap, sinks, Dv != D) against
     float64 torch autograd (out, lse, dq, dk, dv, dsinks; relative L2 <=
     1e-5); --dropout's default seed; every bad input (files, ranks, shapes,
     heads, window, softcap, cu_seqlens, options) as in b.
  h. attn sdpa's block maps and score modifiers against float64 torch
     autograd (out, lse, dq, dk, dv, dbias, drel_bias_table): --mask bool,
     integer and float additive in broadcast shapes, --prefix-lm, --doc-ids,
     --chunk, --block-topk, --bias after --softcap and --alibi, T5's
     --rel-bias-table; the refused combinations and shapes as in b.
  i. `attn mask`: a causal map's drawing and counts exactly, --doc-ids' tiles,
     the PNG's size and each tile's colour; its usage errors.

Ends with "N passed, N failed"; exits 1 on any failure.
"""
import argparse
import contextlib
import io
import multiprocessing
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import types
import zlib

import numpy as np
import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from seed_modules import (  # noqa: E402
    SimplifiedSelfAttention,
    SelfAttention_v1,
    SelfAttention_v2,
    CausalAttention,
    MultiHeadAttentionWrapper,
    MultiHeadAttention,
    CausalSelfAttention)

TOL = 1e-6
TIMEOUT = 60
VERBOSE = False

passed = 0
failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s%s" % (what, ("\n      " + detail) if detail else ""))
    return ok


MODULES = ["simple", "sa1", "sa2", "causal", "mha-wrapper", "mha", "gpt2"]


def build_torch(case):
    """The seed's class for case, after torch.manual_seed(case.seed)."""
    torch.manual_seed(case.seed)
    m = case.module
    if m == "simple":
        mod = SimplifiedSelfAttention()
    elif m == "sa1":
        mod = SelfAttention_v1(case.d_in, case.d_out)
    elif m == "sa2":
        mod = SelfAttention_v2(case.d_in, case.d_out, qkv_bias=case.qkv_bias)
    elif m == "causal":
        mod = CausalAttention(case.d_in, case.d_out, case.context, case.dropout, case.qkv_bias)
    elif m == "mha-wrapper":
        mod = MultiHeadAttentionWrapper(case.d_in, case.d_out, case.context, case.dropout,
                                        case.heads, case.qkv_bias)
    elif m == "mha":
        mod = MultiHeadAttention(case.d_in, case.d_out, case.context, case.dropout, case.heads,
                                 case.qkv_bias)
    else:
        cfg = types.SimpleNamespace(n_embd=case.d_in, n_head=case.heads, block_size=case.context)
        mod = CausalSelfAttention(cfg)
    if case.scale is not None:
        for sub in mod.modules():
            if hasattr(sub, "scale"):
                sub.scale = case.scale
    if case.mask == "none":
        for sub in mod.modules():
            if isinstance(sub, (CausalAttention, MultiHeadAttention)):
                sub.mask.zero_()  # an all-False mask: nothing hidden
    return mod


def torch_forward(case, x):
    """The torch output for the numpy input x (2-D or 3-D)."""
    mod = build_torch(case)
    if case.train:
        mod.train()
    else:
        mod.eval()
    with torch.no_grad():
        t = torch.from_numpy(x)
        if case.module in ("simple", "sa1", "sa2"):
            # The seeds' 2-D classes (x @ W, keys.T): one sequence at a time.
            if t.dim() == 2:
                return mod(t).numpy()
            return torch.stack([mod(t[b]) for b in range(t.shape[0])]).numpy()
        if t.dim() == 2:
            return mod(t.unsqueeze(0)).squeeze(0).numpy()
        return mod(t).numpy()


# ---------------------------------------------------------------------------
# Running the CLI
# ---------------------------------------------------------------------------

class Runner:
    def __init__(self, attn, tmp, wrapper=()):
        self.attn = attn
        self.tmp = tmp
        self.count = 0
        self.wrapper = list(wrapper)  # e.g. valgrind and its options

    def path(self, name):
        self.count += 1
        return os.path.join(self.tmp, "%d_%s" % (self.count, name))

    def command(self, args):
        return self.wrapper + [self.attn] + [str(a) for a in args]

    def run(self, args, timeout=TIMEOUT, stdout=subprocess.PIPE):
        if self.wrapper:
            timeout *= 20
        try:
            # In the temporary directory: a wrongly taken "--output -h" lands there.
            p = subprocess.run(self.command(args), stdout=stdout, stderr=subprocess.PIPE,
                               timeout=timeout, cwd=self.tmp)
            out = p.stdout.decode(errors="replace") if p.stdout is not None else ""
            err = p.stderr.decode(errors="replace")
            if (p.returncode == 0 and args and args[0] in ("forward", "grad", "sdpa")
                    and "--help" not in args and "-h" not in args):
                err = take_wrote_line(args, err)
            return p.returncode, out, err
        except subprocess.TimeoutExpired:
            return None, "", "(timed out after %ss)" % timeout


def take_wrote_line(args, err):
    """err without its last line, "attn: wrote ...", which must name every
    output that args give (--output, --lse, --grad-dir, --out): the checks
    on what else the command prints stay as they were."""
    lines = err.splitlines(True)
    last = lines[-1] if lines else ""
    named = [str(args[i + 1]) for i, a in enumerate(args[:-1])
             if a in ("--output", "--lse", "--grad-dir", "--out")]
    check(last.startswith("attn: wrote ") and last.endswith("\n") and last.count("\n") == 1
          and all(n in last for n in named),
          "%s says what it wrote" % show(args), "stderr=%r" % err[-400:])
    return "".join(lines[:-1])


def show(args):
    return "attn " + " ".join(str(a) for a in args)


# ---------------------------------------------------------------------------
# a. forward vs torch
# ---------------------------------------------------------------------------

class Case(types.SimpleNamespace):
    pass


def random_case(rng, module):
    c = Case(module=module, qkv_bias=False, scale=None, mask=None, dropout=0.0, train=False,
             heads=1, threads=None, explicit_d_in=False, explicit_context=False)
    c.seed = rng.getrandbits(64) if rng.random() < 0.2 else rng.randrange(0, 2 ** 31)
    c.rank = rng.choice([2, 3])
    c.batch = rng.randint(1, 3) if c.rank == 3 else 1
    c.tokens = rng.randint(1, 12)
    if module == "simple":
        c.d_in = rng.randint(1, 64)
        c.d_out = c.d_in
    elif module in ("sa1", "sa2", "causal"):
        c.d_in = rng.randint(1, 64)
        c.d_out = rng.randint(1, 64)
    elif module == "mha-wrapper":
        c.d_in = rng.randint(1, 64)
        c.heads = rng.randint(1, 4)
        c.d_out = rng.randint(1, 16)  # per head
    elif module == "mha":
        c.d_in = rng.randint(1, 64)
        c.heads = rng.choice([1, 1, 2, 3, 4, 8])
        c.d_out = c.heads * rng.randint(1, 64 // c.heads)
    else:
        c.heads = rng.choice([1, 1, 2, 3, 4, 8])
        c.d_in = c.heads * rng.randint(1, 64 // c.heads)
        c.d_out = c.d_in
    c.context = c.tokens
    if module in ("causal", "mha-wrapper", "mha", "gpt2") and rng.random() < 0.5:
        c.context = c.tokens + rng.randint(0, 8)
        c.explicit_context = True
    if module in ("sa2", "causal", "mha-wrapper", "mha"):
        c.qkv_bias = rng.random() < 0.5
    if rng.random() < 0.3:
        c.threads = rng.randint(1, 4)
    c.explicit_d_in = rng.random() < 0.3
    return c


def cli_args(c, inp, out):
    args = ["forward", "--module", c.module, "--input", inp, "--output", out, "--seed", c.seed]
    if c.module not in ("simple", "gpt2"):
        args += ["--d-out", c.d_out]
    if c.module in ("mha-wrapper", "mha", "gpt2"):
        args += ["--heads", c.heads]
    if c.explicit_context:
        args += ["--context", c.context]
    if c.explicit_d_in:
        args += ["--d-in", c.d_in]
    if c.qkv_bias:
        args.append("--qkv-bias")
    if c.scale is not None:
        args += ["--scale", repr(c.scale)]
    if c.mask is not None:
        args += ["--mask", c.mask]
    if c.dropout:
        args += ["--dropout", repr(c.dropout)]
    if c.train:
        args.append("--train")
    if c.threads:
        args += ["--threads", c.threads]
    return args


def describe(c):
    keys = ["module", "seed", "rank", "batch", "tokens", "d_in", "d_out", "heads", "context",
            "qkv_bias", "scale", "mask", "dropout", "train", "threads"]
    return ", ".join("%s=%s" % (k, getattr(c, k)) for k in keys)


def random_input(rng, c):
    shape = (c.batch, c.tokens, c.d_in) if c.rank == 3 else (c.tokens, c.d_in)
    nprng = np.random.default_rng(rng.getrandbits(32))
    # Inputs of unit size; for SelfAttention_v1 (torch.rand weights, all
    # positive) scaled so projections stay O(1) as in the seeds' example.
    x = nprng.uniform(-1.0, 1.0, size=shape)
    if c.module == "sa1":
        x = nprng.uniform(0.0, 1.0, size=shape) / c.d_in
    return np.ascontiguousarray(x, dtype=np.float32)


def compare(got, want, tol=TOL):
    """(ok, detail): max-abs diff <= tol, or relative L2 <= tol for width >= 256."""
    if got.shape != want.shape:
        return False, "shape %s, torch %s" % (got.shape, want.shape)
    if not np.all(np.isfinite(got)) and not np.array_equal(np.isnan(got), np.isnan(want)):
        return False, "non-finite values where torch has none"
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0
    if want.shape[-1] >= 256:
        norm = float(np.linalg.norm(want.astype(np.float64)))
        rel = float(np.linalg.norm(got.astype(np.float64) - want.astype(np.float64))) / max(norm, 1e-30)
        return rel <= tol, "relative L2 %.3g (max-abs %.3g)" % (rel, diff)
    return diff <= tol, "max-abs diff %.3g" % diff


def forward_case(r, c, x, want=None, what=None):
    inp = r.path("x.npy")
    out = r.path("y.npy")
    np.save(inp, x)
    args = cli_args(c, inp, out)
    rc, so, se = r.run(args)
    label = what or describe(c)
    if not check(rc == 0, "forward exits 0: " + label,
                 "%s\n      rc=%s stderr=%r" % (show(args), rc, se.strip()[:400])):
        return None
    note_ok = se == "" or (c.dropout and not c.train and se.startswith("attn: note:")
                           and se.count("\n") == 1)
    check(note_ok and so == "", "forward prints nothing: " + label,
          "stdout=%r stderr=%r" % (so[:200], se[:200]))
    try:
        got = np.load(out)
    except Exception as e:  # noqa: BLE001
        check(False, "forward output loads: " + label, repr(e))
        return None
    check(got.dtype == np.float32, "output is float32: " + label, str(got.dtype))
    check(got.ndim == x.ndim, "output rank equals input rank: " + label,
          "input %s, output %s" % (x.shape, got.shape))
    if want is None:
        want = torch_forward(c, x)
    # Dropout multiplies the kept weights by 1/(1-p), and float32 torch's
    # rounding with them; a wrong mask is off by O(0.1), far above this.
    tol = TOL / (1.0 - c.dropout) if c.train and c.dropout < 1.0 else TOL
    ok, detail = compare(got, want, tol)
    check(ok, "forward matches torch: " + label, "%s\n      %s" % (show(args), detail))
    if VERBOSE:
        print("  %s: %s" % (detail, label))
    return got


def test_forward(r, rng, cases):
    # Random shapes for every module.
    for module in MODULES:
        for _ in range(cases):
            c = random_case(rng, module)
            forward_case(r, c, random_input(rng, c))

    # Fixed edges: T = 1, d_out = 1, head_dim 1, context == T.
    edges = [
        dict(module="causal", tokens=1, d_in=1, d_out=1),
        dict(module="mha", tokens=1, d_in=5, d_out=4, heads=4),
        dict(module="mha", tokens=7, d_in=3, d_out=6, heads=6, explicit_context=True),
        dict(module="gpt2", tokens=5, d_in=8, heads=8),
        dict(module="mha-wrapper", tokens=1, d_in=2, d_out=1, heads=3),
        dict(module="sa1", tokens=1, d_in=1, d_out=1),
        dict(module="simple", tokens=1, d_in=1, d_out=1),
    ]
    for e in edges:
        c = random_case(rng, e["module"])
        for k, v in e.items():
            setattr(c, k, v)
        if e["module"] == "gpt2":
            c.d_out = c.d_in
        c.context = c.tokens
        forward_case(r, c, random_input(rng, c), what="edge " + describe(c))

    # Wide: relative L2 for width >= 256.
    for module in ("mha", "gpt2"):
        c = random_case(rng, module)
        c.d_in, c.heads, c.tokens, c.rank, c.batch = 256, 4, 5, 3, 2
        c.d_out = 256
        c.context = c.tokens
        forward_case(r, c, random_input(rng, c), what="wide " + describe(c))

    # --qkv-bias and --scale, every weighted module.
    for module in MODULES[1:]:
        c = random_case(rng, module)
        if module in ("sa2", "causal", "mha-wrapper", "mha"):
            c.qkv_bias = True
        c.scale = float(np.float32(rng.uniform(0.05, 2.0)))
        forward_case(r, c, random_input(rng, c), what="--scale " + describe(c))

    # --mask renormalize gives the neg-inf result; --mask none the unmasked one.
    for module in ("causal", "mha-wrapper", "mha"):
        c = random_case(rng, module)
        c.tokens = max(c.tokens, 3)
        c.context = c.tokens + (rng.randint(0, 4) if c.explicit_context else 0)
        x = random_input(rng, c)
        c.mask = None
        want = torch_forward(c, x)
        c.mask = "renormalize"
        forward_case(r, c, x, want=want, what="--mask renormalize == neg-inf torch: " + describe(c))
        c.mask = "none"
        forward_case(r, c, x, what="--mask none == unmasked torch: " + describe(c))
        c.mask = "neg-inf"
        forward_case(r, c, x, want=want, what="--mask neg-inf: " + describe(c))

    # Dropout in training mode: torch.manual_seed(S); build; train(); forward.
    for module in ("causal", "mha", "mha-wrapper", "causal", "mha"):
        c = random_case(rng, module)
        c.tokens = max(c.tokens, 4)
        c.context = c.tokens + (rng.randint(0, 4) if c.explicit_context else 0)
        c.dropout = rng.choice([0.1, 0.25, 0.5, 0.9, float(np.float32(rng.uniform(0.01, 0.99)))])
        c.train = True
        forward_case(r, c, random_input(rng, c), what="--dropout --train " + describe(c))
    # dropout 1.0 and 0.0 in training; dropout without --train is eval (with a note).
    for module, p in (("causal", 1.0), ("mha", 1.0), ("mha", 0.0)):
        c = random_case(rng, module)
        c.dropout, c.train = p, True
        forward_case(r, c, random_input(rng, c), what="--dropout %g --train %s" % (p, describe(c)))
    c = random_case(rng, "mha")
    c.dropout = 0.5
    forward_case(r, c, random_input(rng, c), what="--dropout without --train is eval: " + describe(c))

    # float64 input is read and narrowed (the reference sees the same floats).
    c = random_case(rng, "causal")
    x = random_input(rng, c)
    inp = r.path("x64.npy")
    out = r.path("y64.npy")
    np.save(inp, x.astype(np.float64))
    rc, so, se = r.run(cli_args(c, inp, out))
    if check(rc == 0, "forward reads float64 .npy", se.strip()):
        ok, detail = compare(np.load(out), torch_forward(c, x))
        check(ok, "float64 input matches torch", detail)


# ---------------------------------------------------------------------------
# b. bad arguments
# ---------------------------------------------------------------------------

def expect_error(r, args, codes, fragments=(), out=None, what=None):
    if out is not None and os.path.exists(out):
        os.remove(out)  # left by an earlier case that wrongly succeeded
    rc, so, se = r.run(args)
    label = what or show(args)
    lines = se.splitlines()
    ok_rc = rc in codes
    check(ok_rc, "exit code %s: %s" % ("/".join(map(str, codes)), label), "rc=%s stderr=%r" % (rc, se[:500]))
    check(len(lines) == 1 and se.endswith("\n") and lines[0].startswith("attn: "),
          "exactly one stderr line starting 'attn: ': " + label, "stderr=%r" % se[:500])
    check(so == "", "nothing on stdout: " + label, "stdout=%r" % so[:300])
    for frag in fragments:
        check(frag in se, "stderr mentions %r: %s" % (frag, label), "stderr=%r" % se[:500])
    if out is not None:
        check(not os.path.exists(out), "no output file after failure: " + label)


def save(r, name, arr):
    p = r.path(name)
    np.save(p, np.asarray(arr))
    return p


def test_bad_args(r, rng):
    x = save(r, "x.npy", np.random.default_rng(1).uniform(-1, 1, (2, 5, 6)).astype(np.float32))
    out = r.path("never.npy")
    base = ["forward", "--input", x, "--output", out]
    mha = base + ["--module", "mha", "--d-out", 6, "--heads", 2]

    expect_error(r, ["frobnicate"], [2], ["frobnicate"])
    expect_error(r, ["--frobnicate"], [2], ["frobnicate"])
    expect_error(r, mha + ["--frobnicate", "3"], [2], ["unknown option", "--frobnicate"], out)
    # An unknown option at the end must still be called unknown, not "needs a value".
    expect_error(r, mha + ["--frobnicate"], [2], ["unknown option", "--frobnicate"], out)
    expect_error(r, ["trace", "--frobnicate"], [2], ["unknown option", "--frobnicate"])
    expect_error(r, ["trace", "--frobnicate", "1"], [2], ["unknown option", "--frobnicate"])
    expect_error(r, ["params", "--preset", "small", "--frobnicate", "1"], [2],
                 ["unknown option", "--frobnicate"])
    expect_error(r, ["demo", "extra"], [2], ["extra"])
    expect_error(r, base, [2], ["--module"], out)
    expect_error(r, ["forward", "--module", "mha", "--d-out", 6, "--output", out], [2], ["--input"], out)
    expect_error(r, ["forward", "--module", "mha", "--d-out", 6, "--input", x], [2], ["--output"])
    expect_error(r, base + ["--module", "bogus"], [2], ["bogus", "mha-wrapper"], out)
    expect_error(r, base + ["--module", "mha"], [2], ["--d-out"], out)
    for bad in ["x", "-1", "0", "1.5", "", "2x", "99999999999999999999999", "0x2", " 2", " -1", "\t-2"]:
        # Control characters come back escaped (\t), never raw.
        expect_error(r, mha + ["--heads", bad], [2], ["--heads", "'%s'" % bad.replace("\t", "\\t")], out)
    # A leading blank must not smuggle a negative number in as 2^64 - n.
    for opt in ["--seed", "--context", "--d-out", "--threads"]:
        expect_error(r, mha + [opt, " -1"], [2], [opt, "' -1'"], out)
    for opt in ["--d-in", "--d-out", "--context", "--threads"]:
        expect_error(r, mha + [opt, "0"], [2], [opt], out)
    for bad in ["1.5", "-0.1", "nan", "inf", "x", ""]:
        expect_error(r, mha + ["--dropout", bad], [2], ["--dropout", "'%s'" % bad], out)
    for bad in ["nan", "inf", "-inf", "x", "1e999"]:
        expect_error(r, mha + ["--scale", bad], [2], ["--scale", "'%s'" % bad], out)
    expect_error(r, mha + ["--mask", "bogus"], [2], ["--mask", "bogus"], out)
    expect_error(r, mha + ["--bernoulli", "bogus"], [2], ["--bernoulli", "bogus"], out)
    expect_error(r, mha + ["--seed", "-1"], [2], ["--seed"], out)
    expect_error(r, mha + ["--threads", "100000"], [2], ["--threads"], out)
    for opt in ["--module", "--input", "--output", "--heads", "--seed", "--dropout", "--mask"]:
        expect_error(r, ["forward", opt], [2], [opt, "needs a value"])
    expect_error(r, ["trace", "--preset"], [2], ["--preset", "needs a value"])
    expect_error(r, ["params", "--preset"], [2], ["--preset", "needs a value"])

    missing = os.path.join(r.tmp, "does_not_exist.npy")
    expect_error(r, ["forward", "--module", "mha", "--d-out", 6, "--input", missing, "--output", out],
                 [1], [missing, "cannot open"], out)
    expect_error(r, mha + ["--d-in", 7], [2], ["(6)", "(7)", "--d-in"], out)
    expect_error(r, base + ["--module", "mha", "--d-out", 6, "--heads", 4], [1],
                 ["must be divisible", "(6)", "(4)"], out)
    expect_error(r, base + ["--module", "gpt2", "--heads", 4], [1], ["must be divisible", "(6)", "(4)"], out)
    expect_error(r, base + ["--module", "simple", "--d-out", 3], [2], ["--d-out"], out)
    for module in ("causal", "mha-wrapper", "mha", "gpt2"):
        heads = [] if module == "causal" else ["--heads", 2]
        expect_error(r, base + ["--module", module, "--d-out", 6, "--context", 4] + heads,
                     [1], ["sequence length (5)", "exceeds context_length (4)"], out)
    x4 = save(r, "x4.npy", np.zeros((1, 2, 3, 6), np.float32))
    expect_error(r, ["forward", "--module", "mha", "--d-out", 6, "--input", x4, "--output", out],
                 [2], ["4 dimensions", x4, "(1, 2, 3, 6)"], out)
    x1 = save(r, "x1.npy", np.zeros((6,), np.float32))
    expect_error(r, ["forward", "--module", "mha", "--d-out", 6, "--input", x1, "--output", out],
                 [2], ["1 dimensions", x1, "(6,)"], out)
    x0w = save(r, "x0w.npy", np.zeros((1, 2, 0), np.float32))
    expect_error(r, ["forward", "--module", "mha", "--d-out", 6, "--input", x0w, "--output", out],
                 [2], ["--input", x0w, "d_in 0"], out)
    # An empty sequence is an input problem, whatever the module.
    for module in ("sa1", "mha", "gpt2"):
        x0 = save(r, "x0.npy", np.zeros((1, 0, 6), np.float32))
        expect_error(r, ["forward", "--module", module, "--d-out", 6, "--input", x0, "--output", out],
                     [1, 2], ["empty"], out, what="empty (1, 0, 6) input, --module " + module)

    corrupt = r.path("corrupt.npy")
    with open(corrupt, "wb") as f:
        f.write(bytes(rng.getrandbits(8) for _ in range(200)))
    expect_error(r, ["forward", "--module", "mha", "--d-out", 6, "--input", corrupt, "--output", out],
                 [1], [corrupt], out)
    good = open(x, "rb").read()
    truncated = r.path("truncated.npy")
    with open(truncated, "wb") as f:
        f.write(good[:-7])
    expect_error(r, ["forward", "--module", "mha", "--d-out", 6, "--input", truncated, "--output", out],
                 [1], ["truncated"], out)
    ints = save(r, "ints.npy", np.zeros((2, 3, 6), np.int32))
    expect_error(r, ["forward", "--module", "mha", "--d-out", 6, "--input", ints, "--output", out],
                 [1], ["<i4"], out)
    expect_error(r, mha + ["--output", os.path.join(r.tmp, "no_dir", "y.npy")], [1], ["no_dir"])


# ---------------------------------------------------------------------------
# f. --kernels
# ---------------------------------------------------------------------------

KERNEL_SETS = ["portable", "avx2", "avx512"]
KERNELS_TOL = 1e-5


def rel_l2(got, want):
    got = got.astype(np.float64)
    want = want.astype(np.float64)
    norm = float(np.linalg.norm(want))
    err = float(np.linalg.norm(got - want))
    return err / norm if norm > 0 else err


def run_kernels(r, args, kernels, label):
    """Runs args with --kernels kernels (None: the default); the output, or
    None where this CPU does not run that set (usage error naming it)."""
    out = r.path("y.npy")
    full = args + ["--output", out] + (["--kernels", kernels] if kernels else [])
    rc, so, se = r.run(full)
    if kernels in KERNEL_SETS and rc == 2 and "does not run" in se:
        return None
    if not check(rc == 0, "forward --kernels %s exits 0: %s" % (kernels, label),
                 "%s\n      rc=%s stderr=%r" % (show(full), rc, se.strip()[:400])):
        return None
    return np.load(out)


def test_kernels(r, rng):
    for module in MODULES:
        c = random_case(rng, module)
        c.tokens = max(c.tokens, 4)
        c.context = c.tokens
        x = random_input(rng, c)
        inp = r.path("x.npy")
        np.save(inp, x)
        args = [a for a in cli_args(c, inp, "unused")]
        i = args.index("--output")
        del args[i:i + 2]
        label = describe(c)
        ref = run_kernels(r, args, "reference", label)
        if ref is None:
            continue
        ok, detail = compare(ref, torch_forward(c, x),
                             TOL / (1.0 - c.dropout) if c.train and c.dropout < 1.0 else TOL)
        check(ok, "--kernels reference matches torch: " + label, detail)
        for kernels in [None] + KERNEL_SETS:
            got = run_kernels(r, args, kernels, label)
            if got is None:
                continue
            e = rel_l2(got, ref)
            check(e <= KERNELS_TOL, "--kernels %s agrees with reference: %s" % (kernels or "(default)", label),
                  "relative L2 %.3g" % e)
            if VERBOSE:
                print("  --kernels %s vs reference: relative L2 %.3g: %s" % (kernels or "(default)", e, label))

    # attn grad: every gradient, default kernels against the reference.
    c = random_case(rng, "mha")
    c.tokens = max(c.tokens, 4)
    c.context = c.tokens
    x = random_input(rng, c)
    shape = x.shape[:-1] + (c.d_out,)
    dy = np.random.default_rng(rng.getrandbits(32)).uniform(-1, 1, shape).astype(np.float32)
    inp, dyp = save(r, "x.npy", x), save(r, "dy.npy", dy)
    base = ["grad", "--module", "mha", "--d-out", c.d_out, "--heads", c.heads, "--seed", c.seed,
            "--input", inp, "--grad-output", dyp, "--threads", 2]
    grads = {}
    for kernels in ["reference", None]:
        out_dir = r.path("grads_%s" % (kernels or "default"))
        full = base + ["--out", out_dir] + (["--kernels", kernels] if kernels else [])
        rc, so, se = r.run(full)
        if check(rc == 0, "grad --kernels %s exits 0" % kernels, "%s\n      stderr=%r" % (show(full), se[:300])):
            grads[kernels] = {f: np.load(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
    if len(grads) == 2:
        check(sorted(grads["reference"]) == sorted(grads[None]), "grad writes the same files for every --kernels")
        for f, want in grads["reference"].items():
            if f in grads[None]:
                e = rel_l2(grads[None][f], want)
                # the key bias's gradient is analytically zero: rounding noise only
                if "W_key.bias" in f:
                    e = float(np.linalg.norm(grads[None][f] - want))
                check(e <= KERNELS_TOL, "grad %s: default kernels agree with reference" % f,
                      "relative L2 %.3g" % e)

    # Unknown names: the option and the environment variable.
    out = r.path("never.npy")
    x6 = save(r, "x6.npy", np.zeros((1, 3, 6), np.float32))
    mha = ["forward", "--module", "mha", "--d-out", 6, "--heads", 2, "--input", x6, "--output", out]
    for bad in ["bogus", "", "AVX512", "auto,avx2"]:
        expect_error(r, mha + ["--kernels", bad], [2], ["--kernels"], out)
    env = dict(os.environ, ATTN_KERNELS="bogus")
    p = subprocess.run([r.attn] + [str(a) for a in mha], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=env, timeout=TIMEOUT)
    se = p.stderr.decode(errors="replace")
    check(p.returncode == 2 and "ATTN_KERNELS" in se and "bogus" in se and se.count("\n") == 1,
          "ATTN_KERNELS=bogus: exit 2 naming it", "rc=%s stderr=%r" % (p.returncode, se))
    env["ATTN_KERNELS"] = "reference"
    p = subprocess.run([r.attn] + [str(a) for a in mha], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, env=env, timeout=TIMEOUT)
    check(p.returncode == 0, "ATTN_KERNELS=reference runs", "stderr=%r" % p.stderr[:300])


# ---------------------------------------------------------------------------
# c. help and version
# ---------------------------------------------------------------------------

def header_version():
    here = os.path.dirname(os.path.abspath(__file__))
    header = os.path.join(here, "..", "..", "include", "attn.h")
    try:
        m = re.search(r'#define ATTN_VERSION_STRING "([^"]+)"', open(header).read())
        return m.group(1) if m else None
    except OSError:
        return None


def test_help(r):
    for args in (["--help"], ["-h"], ["help"]):
        rc, so, se = r.run(args)
        check(rc == 0 and so.startswith("usage: attn") and se == "", "%s prints usage" % show(args),
              "rc=%s stdout=%r stderr=%r" % (rc, so[:200], se[:200]))
        for cmd in ("demo", "trace", "params", "forward", "version"):
            check(cmd in so, "%s lists %s" % (show(args), cmd))
    rc, so, se = r.run([])
    check(rc == 2 and so == "" and se.startswith("usage: attn"), "attn without a command: usage on stderr, exit 2",
          "rc=%s stdout=%r" % (rc, so[:200]))
    for cmd in ("demo", "trace", "params", "forward"):
        for flag in ("--help", "-h"):
            rc, so, se = r.run([cmd, flag])
            check(rc == 0 and so.startswith("usage: attn " + cmd) and se == "",
                  "attn %s %s prints its usage" % (cmd, flag), "rc=%s stdout=%r stderr=%r" % (rc, so[:200], se[:200]))
    rc, so, _ = r.run(["forward", "--help"])
    for opt in ("--module", "--input", "--output", "--seed", "--d-in", "--d-out", "--heads", "--context",
                "--qkv-bias", "--dropout", "--train", "--scale", "--mask", "--bernoulli", "--threads"):
        check(opt in so, "attn forward --help mentions " + opt)
    want = header_version()
    for args in (["version"], ["--version"]):
        rc, so, se = r.run(args)
        # attn version adds the CPU, two lines "cpu: ..."; --version is the one line
        first, _, cpu = so.partition("\n")
        cpu_ok = cpu == "" if args == ["--version"] else re.fullmatch(r"(cpu: [^\n]*\n){2}kernels: [^\n]*\n", cpu)
        check(rc == 0 and se == "" and re.fullmatch(r"attn \d+\.\d+\.\d+", first) is not None
              and bool(cpu_ok), "%s prints 'attn X.Y.Z'" % show(args), "rc=%s stdout=%r" % (rc, so))
        if want:
            check(first == "attn %s" % want, "%s matches attn.h (%s)" % (show(args), want), repr(so))


# ---------------------------------------------------------------------------
# d. params
# ---------------------------------------------------------------------------

PRESETS = {  # name: (n_embd, n_head, n_layer, whole model)
    "gpt2-small": (768, 12, 12, 124439808),
    "gpt2-medium": (1024, 16, 24, 354823168),
    "gpt2-large": (1280, 20, 36, 774030080),
    "gpt2-xl": (1600, 25, 48, 1557611200),
}


def grouped(n):
    return "{:,}".format(n)


def total_of(text):
    m = re.search(r"^\s*total\s+([\d,]+)\s*$", text, re.M)
    return int(m.group(1).replace(",", "")) if m else None


def model_of(text):
    m = re.search(r"whole GPT-2 model.*?:\s+([\d,]+)", text)
    return int(m.group(1).replace(",", "")) if m else None


def test_params(r):
    rc, so, se = r.run(["params", "--preset", "gpt2-small", "--module", "mha"])
    check(rc == 0 and se == "", "params gpt2-small mha runs", se)
    check(total_of(so) == 2360064, "MultiHeadAttention at gpt2-small: 2,360,064", so)
    check("2,360,064" in so, "the total is printed grouped")
    check(model_of(so) == 124439808, "whole gpt2-small model: 124,439,808", so)
    rc, so, se = r.run(["params", "--preset", "gpt2-small", "--module", "mha", "--qkv-bias"])
    check(total_of(so) == 2360064 + 3 * 768, "MultiHeadAttention --qkv-bias: 2,362,368", so)
    rc, so, se = r.run(["params", "--preset", "gpt2-small", "--module", "gpt2"])
    check(rc == 0 and total_of(so) == 2362368, "CausalSelfAttention at gpt2-small: 2,362,368", so)
    check(re.search(r"c_attn\.weight\s+\[2304, 768\]\s+1,769,472", so) is not None,
          "c_attn.weight [2304, 768] 1,769,472 listed", so)
    rc, so2, se = r.run(["params", "--preset", "small"])
    check(rc == 0 and so2 == so, "params defaults to --module gpt2 and 'small' means gpt2-small")

    # Against the seeds' torch classes (cheap: 4 C^2 floats).
    for name, (C, H, L, whole) in PRESETS.items():
        rc, so, se = r.run(["params", "--preset", name, "--module", "mha"])
        check(rc == 0, "params %s runs" % name, se)
        check(re.search(r"n_head %d\b" % H, so) is not None, "%s has %d heads" % (name, H), so[:200])
        check(model_of(so) == whole, "%s whole model %s" % (name, grouped(whole)), so)
        torch.manual_seed(0)
        n = sum(p.numel() for p in MultiHeadAttention(C, C, 8, 0.0, H).parameters())
        check(total_of(so) == n == 4 * C * C + C, "%s MultiHeadAttention = torch's %s" % (name, grouped(n)), so)
        rc, so, se = r.run(["params", "--preset", name, "--module", "gpt2"])
        cfg = types.SimpleNamespace(n_embd=C, n_head=H, block_size=8)
        n = sum(p.numel() for p in CausalSelfAttention(cfg).parameters())
        check(total_of(so) == n == 4 * C * C + 4 * C, "%s CausalSelfAttention = torch's %s" % (name, grouped(n)), so)

    rc, so, se = r.run(["params", "--preset", "all"])
    check(rc == 0 and se == "", "params --preset all runs", se)
    for name, (_, _, _, whole) in PRESETS.items():
        check(name in so and grouped(whole) in so, "params --preset all shows %s (%s)" % (name, grouped(whole)))
    expect_error(r, ["params", "--preset", "gpt2-tiny"], [2],
                 ["gpt2-tiny", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"])
    expect_error(r, ["params"], [2], ["--preset"])
    expect_error(r, ["params", "--preset", "small", "--module", "sa1"], [2], ["sa1"])


# ---------------------------------------------------------------------------
# e. trace
# ---------------------------------------------------------------------------

ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s+(.*?)\s+\[([\d, ]*)\](\s+\(view\))?\s*$")


def trace_rows(text):
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if m:
            shape = [int(v) for v in m.group(4).split(",") if v.strip()]
            rows.append((m.group(3).strip(), shape))
    return rows


def in_order(rows, expected):
    """expected [(name prefix, shape)] occur in rows in this order."""
    i = 0
    for name, shape in rows:
        if i < len(expected) and name.startswith(expected[i][0]) and shape == expected[i][1]:
            i += 1
    return i == len(expected)


def test_trace(r):
    args = ["trace", "--preset", "gpt2-small", "--batch", 2, "--tokens", 6]
    rc, so, se = r.run(args)
    check(rc == 0 and se == "", "trace gpt2-small runs", se)
    rows = trace_rows(so)
    shapes = [s for _, s in rows]
    for s in ([2, 6, 768], [2, 12, 6, 64], [2, 12, 6, 6]):
        check(s in shapes, "trace lists %s" % s, so)
    want = [("x", [2, 6, 768]), ("queries", [2, 6, 768]), ("keys", [2, 6, 768]), ("values", [2, 6, 768]),
            ("heads", [2, 12, 6, 64]), ("attn_scores", [2, 12, 6, 6]), ("attn_weights", [2, 12, 6, 6]),
            ("context_vec", [2, 6, 768]), ("out_proj", [2, 6, 768])]
    check(in_order(rows, want), "trace (mha) lists the seeds' steps in order", so)
    check("MultiHeadAttention" in so, "trace defaults to --module mha")

    rc, so, se = r.run(args + ["--module", "gpt2"])
    check(rc == 0 and se == "", "trace --module gpt2 runs", se)
    rows = trace_rows(so)
    want = [("x", [2, 6, 768]), ("qkv", [2, 6, 2304]), ("q, k, v", [2, 12, 6, 64]),
            ("attn_scores", [2, 12, 6, 6]), ("attn_weights", [2, 12, 6, 6]), ("y", [2, 6, 768]),
            ("c_proj", [2, 6, 768])]
    check(in_order(rows, want), "trace --module gpt2 shows [2, 6, 2304] and the steps in order", so)

    for module in ("simple", "sa1", "sa2", "causal", "mha-wrapper"):
        rc, so, se = r.run(["trace", "--module", module, "--batch", 1, "--tokens", 3])
        rows = trace_rows(so)
        check(rc == 0 and se == "" and rows and rows[-1][1] == [1, 3, 768],
              "trace --module %s ends with [1, 3, 768]" % module, "rc=%s %s %s" % (rc, so[-300:], se))
    rc, so, se = r.run(["trace", "--preset", "medium", "--tokens", 1, "--batch", 1])
    check(rc == 0 and [1, 16, 1, 64] in [s for _, s in trace_rows(so)], "trace medium: 16 heads of 64", so)

    rc, so, se = r.run(["trace", "--preset", "gpt2-small", "--tokens", 2000])
    lines = se.splitlines()
    check(rc == 1 and len(lines) == 1 and lines[0].startswith("attn: ") and "exceeds context_length" in se,
          "trace --tokens 2000 fails with 'exceeds context_length'", "rc=%s stderr=%r" % (rc, se[:300]))
    # past the context before x is drawn: 10^8 tokens of 768 floats would be 307 GB
    expect_error(r, ["trace", "--tokens", 10 ** 8], [1], ["100000000", "context_length (1024)"],
                 what="trace --tokens 10^8 (the context, not the memory)")
    expect_error(r, ["trace", "--tokens", 0], [2], ["--tokens"])
    expect_error(r, ["trace", "--batch", "-2"], [2], ["--batch"])
    expect_error(r, ["trace", "--preset", "gpt2-tiny"], [2], ["gpt2-tiny", "gpt2-small"])
    expect_error(r, ["trace", "--module", "bogus"], [2], ["bogus"])
    # batch x tokens x n_embd x 4 bytes overflows size_t: refused, not a crash.
    expect_error(r, ["trace", "--batch", 2 ** 54, "--tokens", 1], [1, 2], ["18014398509481984"],
                 what="trace --batch 2^54 (x's bytes overflow size_t)")


# ---------------------------------------------------------------------------
# f. the defects a hostile test found, one regression each
# ---------------------------------------------------------------------------

def test_scale_edges(r, rng):
    """Defect 1: every finite --scale is honoured, or refused naming it."""
    def case(module, scale):
        c = Case(module=module, qkv_bias=False, scale=scale, mask=None, dropout=0.0, train=False,
                 heads=2 if module == "mha" else 1, threads=None, explicit_d_in=False,
                 explicit_context=False, seed=77, rank=3, batch=2, tokens=6, d_in=4, d_out=4,
                 context=6)
        return c

    x = np.random.default_rng(8).uniform(-3, 3, (2, 6, 4)).astype(np.float32)
    # SelfAttention_v2 has no mask: torch multiplies by float32(scale) (0 for
    # 1e-50 and 1e-310), which is uniform attention.
    default = forward_case(r, case("sa2", None), x, what="--scale edges: sa2, default scale")
    for scale in (1e-30, 1e-50, 1e-310, -1e-50, -2.5, 1e-44):
        got = forward_case(r, case("sa2", scale), x, what="--scale %r: sa2 matches torch" % scale)
        if got is not None and default is not None:
            check(not np.array_equal(got, default), "--scale %r is not the default scale" % scale)
    # The masked modules mask after scaling (the seeds' classes scale after
    # masked_fill, so -inf * 0 is NaN there): 1e-50 is uniform over the causal
    # window, as 1e-30 is in torch.
    want = torch_forward(case("mha", 1e-30), x)
    default = forward_case(r, case("mha", None), x, what="--scale edges: mha, default scale")
    for scale in (1e-30, 1e-50, 1e-310):
        got = forward_case(r, case("mha", scale), x, want=want,
                           what="--scale %r: mha is uniform over the causal window" % scale)
        if got is not None and default is not None:
            check(not np.array_equal(got, default), "--scale %r on mha is not the default" % scale)
    forward_case(r, case("mha", 0.0), x, want=default, what="--scale 0 is the default scale")
    # The largest scales are honoured too (float32 torch overflows its scores there).
    y = r.path("big_scale.npy")
    inp = save(r, "scale_x.npy", x)
    rc, _, se = r.run(["forward", "--module", "mha", "--d-out", 4, "--heads", 2, "--input", inp,
                       "--output", y, "--scale", "3.4e38"])
    check(rc == 0 and np.all(np.isfinite(np.load(y))), "--scale 3.4e38 is honoured (finite output)", se)
    out = r.path("never.npy")
    args = ["forward", "--module", "mha", "--d-out", 4, "--heads", 2, "--input", inp, "--output", out]
    expect_error(r, args + ["--scale", "3.5e38"], [2], ["--scale", "3.5e38", "float32"], out)
    expect_error(r, args + ["--scale", "-3.5e38"], [2], ["--scale", "-3.5e38"], out)
    expect_error(r, args + ["--scale", "1e-400"], [2], ["--scale", "'1e-400'", "range"], out)
    rc, so, _ = r.run(["forward", "--help"])
    check(rc == 0 and "0 or absent: 1/sqrt(head_dim)" in so, "forward --help says what --scale 0 means")


def copy_case(c):
    return Case(**vars(c))


INAPPLICABLE = [  # (module, option args): PyTorch's class has no such argument
    ("gpt2", ["--mask", "renormalize"]), ("gpt2", ["--mask", "neg-inf"]),
    ("gpt2", ["--qkv-bias"]),
    ("simple", ["--scale", "0.5"]), ("simple", ["--heads", "2"]), ("simple", ["--context", "9"]),
    ("simple", ["--dropout", "0.1"]), ("simple", ["--qkv-bias"]), ("simple", ["--mask", "none"]),
    ("sa1", ["--qkv-bias"]), ("sa1", ["--heads", "1"]), ("sa1", ["--dropout", "0"]),
    ("sa1", ["--train"]), ("sa1", ["--context", "5"]), ("sa1", ["--mask", "neg-inf"]),
    ("sa2", ["--dropout", "0.1"]), ("sa2", ["--train"]), ("sa2", ["--heads", "2"]),
    ("sa2", ["--mask", "none"]), ("sa2", ["--context", "5"]),
    ("causal", ["--heads", "2"]), ("causal", ["--heads", "1"]),
]


def test_inapplicable_options(r, rng):
    """Defect 2: an option the module's class does not take is a usage error."""
    x = save(r, "x6.npy", np.random.default_rng(2).uniform(-1, 1, (1, 5, 6)).astype(np.float32))
    out = r.path("never.npy")
    for module, opt in INAPPLICABLE:
        args = ["forward", "--module", module, "--input", x, "--output", out] + opt
        if module not in ("simple", "gpt2"):
            args += ["--d-out", 6]
        expect_error(r, args, [2], [opt[0], "does not apply", "--module " + module], out)
    # ... and every option a class does take still works.
    for module, opt in [("gpt2", ["--scale", "0.5", "--dropout", "0.1", "--train", "--context", 7]),
                        ("causal", ["--mask", "renormalize", "--qkv-bias", "--dropout", "0.2"]),
                        ("sa2", ["--qkv-bias", "--scale", "2"]), ("sa1", ["--scale", "0.1"]),
                        ("mha-wrapper", ["--heads", 2, "--mask", "none", "--train"])]:
        args = ["forward", "--module", module, "--input", x, "--output", r.path("y.npy")] + opt
        if module not in ("simple", "gpt2"):
            args += ["--d-out", 6]
        rc, so, se = r.run(args)
        check(rc == 0, "forward --module %s %s works" % (module, " ".join(map(str, opt))), se)
    expect_error(r, ["params", "--preset", "small", "--qkv-bias"], [2],
                 ["--qkv-bias", "does not apply", "gpt2"])


def test_stdout_write_errors(r):
    """Defect 4: a failed write to stdout is an error (exit 1), for every command."""
    if not os.path.exists("/dev/full"):
        return
    for args in (["params", "--preset", "all"], ["demo"], ["trace"], ["version"], ["--version"],
                 ["--help"], ["help"], ["help", "forward"], ["forward", "--help"], ["trace", "-h"]):
        with open("/dev/full", "w") as full:
            rc, _, se = r.run(args, stdout=full)
        check(rc == 1 and "error writing to standard output" in se,
              "%s > /dev/full exits 1 with a message" % show(args), "rc=%s stderr=%r" % (rc, se[:300]))


# Measured from a small python without torch: a child's peak RSS counts the
# memory of the process it was forked from, and this one holds torch.
PEAK_RSS = """
import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
out = p.stdout.read()
_, status, usage = os.wait4(p.pid, 0)
print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)
sys.stdout.write(out.decode(errors="replace"))
"""


def peak_rss_kib(cmd, cwd):
    """Runs cmd; returns (exit code, peak RSS in KiB, stdout) of that process."""
    out = subprocess.run([sys.executable, "-S", "-c", PEAK_RSS] + cmd, stdout=subprocess.PIPE,
                         cwd=cwd, check=True).stdout.decode(errors="replace")
    first, _, rest = out.partition("\n")
    rc, kib = first.split()
    return int(rc), int(kib), rest


def test_trace_memory(r, sanitized):
    """Defect 5: trace keeps no B*H*T*T weights; gpt2-small at batch 8 x 1024 tokens fits in 64 MiB."""
    if r.wrapper or sanitized:
        # The wrapper's or the sanitizer's own memory would be measured, and
        # an unoptimised forward over 1024 tokens takes a minute there.
        args = ["trace", "--batch", 8, "--tokens", 64]
        rc, so, se = r.run(args)
        check(rc == 0 and "[8, 12, 64, 64]" in so, "trace at batch 8 prints the batch's shapes", se)
        return
    for module in ("mha", "gpt2"):
        args = ["trace", "--batch", 8, "--tokens", 1024, "--module", module]
        rc, kib, so = peak_rss_kib(r.command(args), r.tmp)
        check(rc == 0 and kib < 64 * 1024, "%s: peak RSS %d KiB < 64 MiB" % (show(args), kib))
        check(rc == 0 and "[8, 12, 1024, 1024]" in so and "[8, 1024, 768]" in so,
              "%s prints the batch's shapes" % show(args), so[-400:])


def test_small_defects(r):
    """Defect 8: escaping, trace output on failure, subnormals, -h as a value, version args."""
    x = save(r, "x8.npy", np.random.default_rng(3).uniform(-1, 1, (1, 5, 6)).astype(np.float32))
    out = r.path("never.npy")
    mha = ["forward", "--module", "mha", "--d-out", 6, "--heads", 2]
    # Values are echoed escaped: no raw newline, ESC or invalid UTF-8 reaches the terminal.
    hostile = "evil\x1b[31m\nname\r\x07\x9b.npy"
    for args in (mha + ["--input", hostile, "--output", out],
                 ["forward", "--module", "\x1b[2J", "--input", x, "--output", out],
                 mha + ["--input", x, "--output", out, "--seed", "1\n2"],
                 ["trace", "--preset", "\x1b]0;title\x07"]):
        rc, so, se = r.run(args)
        raw = any(ch in se[:-1] for ch in "\x1b\n\r\x07\x9b\ufffd")
        check(rc in (1, 2) and not raw and se.count("\n") == 1 and ("\\x1b" in se or "\\n" in se),
              "control characters escaped: " + repr(args[-1]), "stderr=%r" % se)
    # trace fails before printing anything.
    expect_error(r, ["trace", "--tokens", 1025], [1], ["exceeds context_length (1024)"])
    # --dropout without --train: a note, from forward and grad alike
    dy = save(r, "dy8.npy", np.ones((1, 5, 6), np.float32))
    for cmd, extra in (("forward", ["--output", r.path("y8.npy")]),
                       ("grad", ["--grad-output", dy, "--out", r.path("g8")])):
        rc, so, se = r.run([cmd] + mha[1:] + ["--input", x, "--dropout", "0.5"] + extra)
        check(rc == 0 and se.startswith("attn: note: --dropout has no effect without --train"),
              "%s --dropout without --train: a note" % cmd, "rc=%s stderr=%r" % (rc, se))
    # Subnormal values are numbers: --dropout 1e-310 works (keeps everything).
    c = Case(module="causal", qkv_bias=False, scale=None, mask=None, dropout=1e-310, train=True,
             heads=1, threads=None, explicit_d_in=False, explicit_context=False, seed=5, rank=3,
             batch=1, tokens=5, d_in=6, d_out=3, context=5)
    forward_case(r, c, np.load(x), what="--dropout 1e-310 --train is a probability")
    expect_error(r, mha + ["--input", x, "--output", out, "--dropout", "1e-400"], [2],
                 ["--dropout", "'1e-400'", "range"], out)
    # -h and --help as the values of options are values, not help requests.
    missing = os.path.join(r.tmp, "missing.npy")
    for args in (mha + ["--input", missing, "--output", "-h"],
                 mha + ["--input", "-h", "--output", out],
                 mha + ["--input", "--help", "--output", out]):
        expect_error(r, args, [1], ["cannot open"], what="option value read as help: " + show(args))
    check(not os.path.exists(os.path.join(r.tmp, "-h")), "no file named -h was written")
    rc, so, se = r.run(mha + ["--input", missing, "--help"])
    check(rc == 0 and so.startswith("usage: attn forward"), "--help after options still prints help")
    # version takes no arguments; help takes a command name.
    expect_error(r, ["version", "--bogus"], [2], ["--bogus"])
    expect_error(r, ["--version", "extra"], [2], ["extra"])
    expect_error(r, ["help", "bogus"], [2], ["bogus"])
    rc, so, se = r.run(["help", "trace"])
    check(rc == 0 and so.startswith("usage: attn trace"), "attn help trace prints trace's usage")


# ---------------------------------------------------------------------------
# g. attn sdpa: one small case against float64, and every bad input
# ---------------------------------------------------------------------------

def sdpa_torch(q, k, v, dout, causal, window, softcap, sinks, scale):
    """out, lse and the gradients of sum(out * dout) in float64 autograd, for
    (B, H, T, D) q and (B, H_kv, S, D) k, v with bottom-right alignment."""
    q, k, v = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    s_t = torch.tensor(sinks, dtype=torch.float64, requires_grad=True)
    B, H, T, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    kk = k.repeat_interleave(H // Hkv, dim=1)
    vv = v.repeat_interleave(H // Hkv, dim=1)
    s = torch.einsum("bhtd,bhsd->bhts", q, kk) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(T).view(T, 1) + (S - T)
    j = torch.arange(S).view(1, S)
    hidden = torch.zeros(T, S, dtype=torch.bool)
    if causal:
        hidden |= j > pos
    left, right = window
    if left >= 0:
        hidden |= j < pos - left
    if right >= 0:
        hidden |= j > pos + right
    s = s.masked_fill(hidden, float("-inf"))
    # the sink: one more logit per head in each row's denominator, no value
    s = torch.cat([s, s_t.view(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)[..., :S]
    out = torch.einsum("bhts,bhsd->bhtd", p, vv)
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    return {"out": out.detach().numpy(), "lse": lse.detach().numpy(), "dq": q.grad.numpy(),
            "dk": k.grad.numpy(), "dv": v.grad.numpy(), "dsinks": s_t.grad.numpy()}


def test_sdpa(r, rng):
    nprng = np.random.default_rng(rng.getrandbits(32))
    B, H, Hkv, T, S, D, Dv = 2, 4, 2, 5, 7, 3, 2
    t = {"q": (B, H, T, D), "k": (B, Hkv, S, D), "v": (B, Hkv, S, Dv), "dout": (B, H, T, Dv)}
    data = {n: nprng.uniform(-1.5, 1.5, shape).astype(np.float32) for n, shape in t.items()}
    data["sinks"] = nprng.uniform(-1, 1, (H,)).astype(np.float32)
    f = {n: save(r, n + ".npy", a) for n, a in data.items()}
    out, lse, gdir = r.path("sdpa_o.npy"), r.path("sdpa_lse.npy"), r.path("sdpa_grads")
    window, softcap = (2, 1), 1.5
    args = ["sdpa", "--q", f["q"], "--k", f["k"], "--v", f["v"], "--output", out, "--lse", lse,
            "--causal", "--window", "%d,%d" % window, "--softcap", softcap, "--sinks", f["sinks"],
            "--grad-output", f["dout"], "--grad-dir", gdir]
    rc, so, se = r.run(args)
    label = "attn sdpa GQA %d/%d, T %d, S %d, Dv %d, causal, window %s, softcap, sinks" % (
        H, Hkv, T, S, Dv, window)
    if check(rc == 0 and so == "" and se == "", label + ": exits 0 silently",
             "%s\n      rc=%s stderr=%r" % (show(args), rc, se[:400])):
        want = sdpa_torch(data["q"], data["k"], data["v"], data["dout"], True, window, softcap,
                          data["sinks"], float(np.float32(1 / np.sqrt(D))))
        got = {"out": np.load(out), "lse": np.load(lse)}
        for n in ("dq", "dk", "dv", "dsinks"):
            got[n] = np.load(os.path.join(gdir, n + ".npy"))
        for n, w in want.items():
            ok = got[n].shape == w.shape and got[n].dtype == np.float32
            err = rel_l2(got[n], w) if ok else float("nan")
            check(ok and err <= KERNELS_TOL, label + ": %s matches float64 torch" % n,
                  "shape %s (want %s), relative L2 %.3g" % (got[n].shape, w.shape, err))

    # --dropout without --seed is allowed: Philox keyed by the default seed 123.
    base = ["sdpa", "--q", f["q"], "--k", f["k"], "--v", f["v"]]
    outs = []
    for extra in ([], ["--seed", "123"]):
        o = r.path("sdpa_drop.npy")
        rc, so, se = r.run(base + ["--output", o, "--dropout", "0.5"] + extra)
        if check(rc == 0 and se == "", "attn sdpa --dropout 0.5 %s exits 0" % " ".join(extra), se):
            outs.append(np.load(o))
    if len(outs) == 2:
        check(np.array_equal(outs[0], outs[1]), "attn sdpa --dropout: the default seed is 123")
    rc, so, se = r.run(base + ["--output", r.path("sdpa_seed.npy"), "--seed", "5"])
    check(rc == 0 and se.startswith("attn: note:") and se.count("\n") == 1,
          "attn sdpa --seed without --dropout: one note, exit 0", "rc=%s stderr=%r" % (rc, se))

    # Bad inputs: one line, exit 2 for usage (1 where the library refuses or a
    # file cannot be read, as for every command), no output file.
    never = r.path("never.npy")
    ok_args = base + ["--output", never]
    missing = os.path.join(r.tmp, "does_not_exist.npy")
    q3 = save(r, "q3.npy", data["q"][0])  # (H, T, D): a packed layout without cu_seqlens
    q_h3 = save(r, "q_h3.npy", data["q"][:, :3])  # 3 heads over 2 KV heads
    k_d4 = save(r, "k_d4.npy", np.zeros((B, Hkv, S, 4), np.float32))
    v_s6 = save(r, "v_s6.npy", np.zeros((B, Hkv, 6, Dv), np.float32))
    k_b1 = save(r, "k_b1.npy", data["k"][:1])
    v_b1 = save(r, "v_b1.npy", data["v"][:1])
    empty = save(r, "empty.npy", np.zeros((B, H, 0, D), np.float32))
    sinks3 = save(r, "sinks3.npy", data["sinks"][:3])
    # a float mask cut short: the float reader's cause, not "not an integer"
    mask_cut = r.path("mask_cut.npy")
    np.save(mask_cut, np.zeros((T, S), np.float32))
    with open(mask_cut, "r+b") as fh:
        fh.truncate(os.path.getsize(mask_cut) - 10)
    bias_nan = np.zeros((T, S), np.float32)
    bias_nan[2, 1] = np.nan
    bias_nan = save(r, "bias_nan.npy", bias_nan)
    sinks_nan = data["sinks"].copy()
    sinks_nan[1] = np.nan
    sinks_nan = save(r, "sinks_nan.npy", sinks_nan)
    sinks_ninf = data["sinks"].copy()
    sinks_ninf[2] = -np.inf
    sinks_ninf = save(r, "sinks_ninf.npy", sinks_ninf)
    bias_zero = save(r, "bias_zero.npy", np.zeros((T, S), np.float32))
    # packed: q (10, H, D), k (14, H_kv, D), v (14, H_kv, Dv)
    pq = save(r, "pq.npy", data["q"].transpose(0, 2, 1, 3).reshape(B * T, H, D))
    pk = save(r, "pk.npy", data["k"].transpose(0, 2, 1, 3).reshape(B * S, Hkv, D))
    pv = save(r, "pv.npy", data["v"].transpose(0, 2, 1, 3).reshape(B * S, Hkv, Dv))
    packed = ["sdpa", "--q", pq, "--k", pk, "--v", pv, "--output", never]

    def cu(name, values, dtype=np.int32):
        return save(r, name + ".npy", np.array(values, dtype))

    cu_q, cu_kv = cu("cu_q", [0, 5, 10]), cu("cu_kv", [0, 7, 14])
    rc, so, se = r.run(packed + ["--cu-seqlens-q", cu_q, "--cu-seqlens-kv", cu_kv, "--causal"])
    check(rc == 0 and se == "", "attn sdpa packed (--cu-seqlens-q/-kv) runs", se)
    bad = [
        (["sdpa", "--q", missing, "--k", f["k"], "--v", f["v"], "--output", never], [1],
         [missing, "cannot open"]),
        (base + ["--output", never, "--sinks", missing], [1], [missing, "cannot open"]),
        (packed + ["--cu-seqlens-q", missing, "--cu-seqlens-kv", cu_kv], [1],
         ["--cu-seqlens-q", missing, "cannot open"]),
        (packed + ["--cu-seqlens-q", r.tmp, "--cu-seqlens-kv", cu_kv], [1],
         ["--cu-seqlens-q", r.tmp, "read failed"]),
        (["sdpa", "--q", q3, "--k", f["k"], "--v", f["v"], "--output", never], [2],
         ["--q", "4 dimensions", "got 3"]),
        (packed + ["--cu-seqlens-q", cu_q, "--cu-seqlens-kv", cu_kv, "--k", f["k"]], [2],
         ["--k", "3 dimensions", "--cu-seqlens"]),
        (["sdpa", "--q", f["q"], "--k", k_d4, "--v", f["v"], "--output", never], [2],
         ["--k", "head_dim 4", "q's 3"]),
        (["sdpa", "--q", f["q"], "--k", f["k"], "--v", v_s6, "--output", never], [2],
         ["--v", "must match k's"]),
        (["sdpa", "--q", f["q"], "--k", k_b1, "--v", v_b1, "--output", never], [2],
         ["--k", "batch 1", "q's 2"]),
        (["sdpa", "--q", empty, "--k", f["k"], "--v", f["v"], "--output", never], [2],
         ["--q", "empty"]),
        (["sdpa", "--q", q_h3, "--k", f["k"], "--v", f["v"], "--output", never], [1],
         ["kv_heads (2) must divide heads (3)"]),
        (ok_args + ["--sinks", sinks3], [2], ["--sinks", "(3,)", "(4,)"]),
        (ok_args + ["--alibi", sinks3], [2], ["--alibi", "(3,)", "(4,)"]),
        (ok_args + ["--window", "-2,3"], [2], ["--window", "(-2, 3)"]),
        (ok_args + ["--window", "0,-5"], [2], ["--window", "(0, -5)"]),
        (ok_args + ["--window", "3"], [2], ["--window", "'3'"]),
        (ok_args + ["--window", "1,x"], [2], ["--window", "'1,x'"]),
        (ok_args + ["--softcap", "-1"], [2], ["--softcap", "'-1'"]),
        (ok_args + ["--softcap", "nan"], [2], ["--softcap", "'nan'"]),
        (ok_args + ["--softcap", "inf"], [2], ["--softcap", "'inf'"]),
        (ok_args + ["--softcap", "1e-46"], [1], ["softcap (1e-46)", "rounds to 0"]),
        (ok_args + ["--scale", "nan"], [2], ["--scale", "'nan'"]),
        (ok_args + ["--scale", "-inf"], [2], ["--scale", "'-inf'"]),
        (ok_args + ["--softcap", "1e39"], [1], ["softcap (1e+39)", "beyond float32's range"]),
        (ok_args + ["--mask", mask_cut], [1], ["--mask", mask_cut, "truncated"]),
        (ok_args + ["--bias", bias_nan], [1], ["--bias", bias_nan, "nan at (2, 1)"]),
        # per-head arrays named by option, file and head, not by the config's field
        (ok_args + ["--sinks", sinks_nan], [1],
         ["--sinks", "'%s' holds nan at (1,)" % sinks_nan, "must be finite"]),
        (ok_args + ["--sinks", sinks_ninf], [1], ["--sinks", "'%s' holds -inf at (2,)" % sinks_ninf]),
        (ok_args + ["--alibi", sinks_nan], [1], ["--alibi", "'%s' holds nan at (1,)" % sinks_nan]),
        # ALiBi moved into a chain beside --bias: the same message
        (ok_args + ["--alibi", sinks_nan, "--bias", bias_zero], [1],
         ["--alibi", "'%s' holds nan at (1,)" % sinks_nan]),
        (packed + ["--cu-seqlens-q", cu_q], [2], ["--cu-seqlens-q", "--cu-seqlens-kv", "together"]),
        (packed + ["--cu-seqlens-q", cu("cu_dec", [0, 6, 5, 10]),
                   "--cu-seqlens-kv", cu("cu_kv3", [0, 7, 7, 14])], [2], ["must not decrease"]),
        (packed + ["--cu-seqlens-q", cu("cu_start", [1, 5, 10]), "--cu-seqlens-kv", cu_kv], [2],
         ["--cu-seqlens-q", "start at 0"]),
        (packed + ["--cu-seqlens-q", cu("cu_end", [0, 5, 9]), "--cu-seqlens-kv", cu_kv], [2],
         ["--cu-seqlens-q", "last offset (9)", "(10)"]),
        (packed + ["--cu-seqlens-q", cu_q, "--cu-seqlens-kv", cu("cu_kv2", [0, 14])], [2],
         ["3 and 2"]),
        (packed + ["--cu-seqlens-q", cu("cu_2d", [[0, 5, 10]]), "--cu-seqlens-kv", cu_kv], [2],
         ["--cu-seqlens-q", "one-dimensional"]),
        (packed + ["--cu-seqlens-q", cu("cu_f", [0, 5, 10], np.float32), "--cu-seqlens-kv", cu_kv],
         [1], ["--cu-seqlens-q", "'<f4'", "not an integer"]),
        (packed + ["--cu-seqlens-q", cu("cu_big", [0, 5, 2 ** 40], np.int64),
                   "--cu-seqlens-kv", cu_kv], [1], ["--cu-seqlens-q", "(1099511627776)",
                                                    "does not fit int32"]),
        (ok_args + ["--grad-output", f["dout"]], [2], ["--grad-output", "--grad-dir", "together"]),
        (ok_args + ["--dropout", "1"], [2], ["--dropout", "'1'"]),
        (ok_args + ["--dropout", "-0.1"], [2], ["--dropout", "'-0.1'"]),
        (ok_args + ["--align", "middle"], [2], ["--align", "'middle'"]),
        (ok_args + ["--align", "top-left", "--q-offset", "2"], [2], ["--q-offset", "--align"]),
        (ok_args + ["--q-offset", "1.5"], [2], ["--q-offset", "'1.5'"]),
        # past the library's bound on positions: named as --q-offset, not as the
        # mask or the config field that reads it
        (ok_args + ["--q-offset", str(2 ** 62 + 1), "--chunk", "2"], [2],
         ["--q-offset", "+-2^62", "'%d'" % (2 ** 62 + 1)]),
        (ok_args + ["--q-offset", str(-2 ** 63)], [2], ["--q-offset", "'%d'" % -2 ** 63]),
        (ok_args + ["--threads", "0"], [2], ["--threads"]),
        (ok_args + ["--kernels", "bogus"], [2], ["--kernels", "'bogus'"]),
        (ok_args + ["--frobnicate", "1"], [2], ["unknown option", "--frobnicate"]),
        (base + ["--causal"], [2], ["--output", "required"]),
        (["sdpa", "--window"], [2], ["--window", "needs a value"]),
    ]
    for args, codes, fragments in bad:
        expect_error(r, args, codes, fragments, never)
    # A --grad-output of another shape: refused after the forward wrote --output.
    expect_error(r, ok_args + ["--grad-output", f["q"], "--grad-dir", r.path("g")], [2],
                 ["--grad-output", "(2, 4, 5, 3)", "(2, 4, 5, 2)"])
    rc, so, se = r.run(["sdpa", "--help"])
    check(rc == 0 and so.startswith("usage: attn sdpa") and "--cu-seqlens-q" in so,
          "attn sdpa --help")


# ---------------------------------------------------------------------------
# h. attn sdpa's programmable attention: block maps and score modifiers
# ---------------------------------------------------------------------------

def t5_bucket(rel, bidirectional, buckets, max_distance):
    """Hugging Face's T5Attention._relative_position_bucket of rel = kv - q
    (a long tensor), in float32 as there."""
    ret = torch.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        ret += (rel > 0).long() * buckets
        n = rel.abs()
    else:
        n = -torch.clamp(rel, max=0)
    max_exact = buckets // 2
    large = max_exact + (torch.log(n.float() / max_exact) / np.log(max_distance / max_exact)
                         * (buckets - max_exact)).to(torch.long)
    large = torch.clamp(large, max=buckets - 1)
    return ret + torch.where(n < max_exact, n, large)


def flex_torch(q, k, v, dout, scale, visible=None, additive=None, causal=False, softcap=0.0,
               alibi=None, bias=None, rel=None):
    """out, lse and the gradients of sum(out * dout) in float64 autograd for
    (B, H, T, D) q, k, v (bottom-right): s = softcap(q.k * scale) - alibi +
    bias + rel_table[h, bucket(j - i)] + additive, hidden where visible is
    False (broadcast) or causal hides; every row must see a key."""
    q, k, v = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (q, k, v))
    B, H, T, D = q.shape
    S = k.shape[2]
    pos = torch.arange(T).view(T, 1) + (S - T)
    j = torch.arange(S).view(1, S)
    s = torch.einsum("bhtd,bhsd->bhts", q, k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        s = s - torch.tensor(alibi, dtype=torch.float64).view(1, H, 1, 1) * (pos - j).abs()
    grads = {}
    if bias is not None:
        b_t = torch.tensor(bias, dtype=torch.float64, requires_grad=True)
        grads["dbias"] = b_t
        s = s + b_t
    if rel is not None and isinstance(rel[0], str):  # ("distance", table, C, signed)
        _, table, offset, signed = rel
        t_t = torch.tensor(table, dtype=torch.float64, requires_grad=True)
        grads["drel_bias_table"] = t_t
        i = torch.arange(T).view(T, 1)
        e = (j - i if signed else i - j) + offset  # negative from the row's end, as Python's
        s = s + t_t[:, e].view(1, H, T, S)
    elif rel is not None:
        table, bidirectional, max_distance = rel
        t_t = torch.tensor(table, dtype=torch.float64, requires_grad=True)
        grads["drel_bias_table"] = t_t
        bucket = t5_bucket(j - torch.arange(T).view(T, 1), bidirectional, table.shape[1],
                           max_distance)
        s = s + t_t[:, bucket].view(1, H, T, S)
    if additive is not None:
        s = s + torch.tensor(additive, dtype=torch.float64)
    hidden = torch.zeros(B, H, T, S, dtype=torch.bool)
    if visible is not None:
        hidden |= ~torch.tensor(np.broadcast_to(visible, (B, H, T, S)).copy())
    if causal:
        hidden |= j > pos
    s = s.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.einsum("bhts,bhsd->bhtd", torch.softmax(s, dim=-1), v)
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    want = {"out": out.detach().numpy(), "lse": lse.detach().numpy(), "dq": q.grad.numpy(),
            "dk": k.grad.numpy(), "dv": v.grad.numpy()}
    for n, t in grads.items():
        want[n] = t.grad.numpy()
    return want


def flex_case(r, label, files, extra, want):
    """attn sdpa on files' q, k, v with --grad-output against want (float64)."""
    out, lse, gdir = r.path("flex_o.npy"), r.path("flex_lse.npy"), r.path("flex_grads")
    args = ["sdpa", "--q", files["q"], "--k", files["k"], "--v", files["v"], "--output", out,
            "--lse", lse, "--grad-output", files["dout"], "--grad-dir", gdir] + extra
    rc, so, se = r.run(args)
    if not check(rc == 0 and so == "" and se == "", label + ": exits 0 silently",
                 "%s\n      rc=%s stderr=%r" % (show(args), rc, se[:400])):
        return
    got = {"out": np.load(out), "lse": np.load(lse)}
    for n in want:
        if n not in got:
            got[n] = np.load(os.path.join(gdir, n + ".npy"))
    for n, w in want.items():
        ok = got[n].shape == w.shape and got[n].dtype == np.float32
        err = rel_l2(got[n], w) if ok else float("nan")
        check(ok and err <= KERNELS_TOL, label + ": %s matches float64 torch" % n,
              "shape %s (want %s), relative L2 %.3g" % (got[n].shape, w.shape, err))


def random_runs(nprng, T, count):
    """Ids in count contiguous runs (documents) over T tokens."""
    cuts = sorted(nprng.choice(np.arange(1, T), count - 1, replace=False))
    return np.repeat(np.arange(count), np.diff([0] + list(cuts) + [T])).astype(np.int32)


def test_sdpa_flex(r, rng):
    nprng = np.random.default_rng(rng.getrandbits(32))
    B, H, T, D = 2, 2, 12, 4
    scale = float(np.float32(1 / np.sqrt(D)))

    def tensors(T, S):
        t = {"q": (B, H, T, D), "k": (B, H, S, D), "v": (B, H, S, D), "dout": (B, H, T, D)}
        data = {n: nprng.uniform(-1.5, 1.5, shape).astype(np.float32) for n, shape in t.items()}
        return data, {n: save(r, n + ".npy", a) for n, a in data.items()}

    data, f = tensors(T, T)
    d = (data["q"], data["k"], data["v"], data["dout"], scale)
    diag = np.eye(T, dtype=bool)
    # --mask bool, broadcast from (H, T, S) and (T, S); the diagonal kept, so
    # every row sees a key
    for shape in ((H, T, T), (T, T), (B, 1, T, T)):
        vis = (nprng.random(shape) < 0.5) | np.broadcast_to(diag, shape)
        dtype = rng.choice([np.bool_, np.uint8, np.int32])
        m = save(r, "mask_bool.npy", vis.astype(dtype))
        flex_case(r, "attn sdpa --mask %s %s" % (np.dtype(dtype).name, shape), f,
                  ["--mask", m, "--block-size", 16], flex_torch(*d, visible=vis))
    # --mask additive float: -inf hides, the finite values are added
    for shape in ((B, H, T, T), (1, T, T)):
        vals = nprng.uniform(-1, 1, shape).astype(np.float32)
        hide = (nprng.random(shape) < 0.4) & ~np.broadcast_to(diag, shape)
        vals[hide] = -np.inf
        m = save(r, "mask_add.npy", vals)
        flex_case(r, "attn sdpa --mask float additive %s --causal" % (shape,), f,
                  ["--mask", m, "--causal"],
                  flex_torch(*d, visible=~hide, additive=np.where(hide, 0, vals), causal=True))
    i, j = np.arange(T).reshape(T, 1), np.arange(T).reshape(1, T)
    prefix = rng.randrange(1, T)
    flex_case(r, "attn sdpa --prefix-lm %d" % prefix, f, ["--prefix-lm", prefix, "--block-size", 16],
              flex_torch(*d, visible=(j <= i) | (j < prefix)))
    ids = np.stack([random_runs(nprng, T, rng.randrange(2, 5)) for _ in range(B)])
    doc = save(r, "doc_ids.npy", ids)
    flex_case(r, "attn sdpa --doc-ids (B, T) --causal", f, ["--doc-ids", doc, "--causal"],
              flex_torch(*d, visible=ids[:, None, :, None] == ids[:, None, None, :],
                         causal=True))
    doc1 = save(r, "doc_ids1.npy", ids[0])
    chunk = rng.randrange(2, 6)
    flex_case(r, "attn sdpa --doc-ids (T,) --chunk %d" % chunk, f,
              ["--doc-ids", doc1, "--chunk", chunk],
              flex_torch(*d, visible=(ids[0][:, None] == ids[0][None, :]) & (i // chunk == j // chunk)))
    # --bias with its gradient, in a chain after --softcap and --alibi
    bshape = rng.choice([(B, H, T, T), (H, 1, T), (1, T, T)])
    bias = nprng.uniform(-1, 1, bshape).astype(np.float32)
    slopes = nprng.uniform(0.1, 0.5, (H,)).astype(np.float32)
    fb, fs = save(r, "bias.npy", bias), save(r, "slopes.npy", slopes)
    flex_case(r, "attn sdpa --bias %s --softcap 2 --alibi --causal" % (bshape,), f,
              ["--bias", fb, "--softcap", 2, "--alibi", fs, "--causal"],
              flex_torch(*d, softcap=2.0, alibi=slopes, bias=bias, causal=True))
    # T5's relative bias table with its gradient
    buckets, max_distance = rng.choice([(8, 16), (6, 10), (16, 32)])
    bidirectional = rng.random() < 0.5
    table = nprng.uniform(-1, 1, (H, buckets)).astype(np.float32)
    ft = save(r, "rel_table.npy", table)
    extra = ["--rel-bias-table", ft, "--rel-max-distance", max_distance] + (
        ["--rel-bidirectional"] if bidirectional else [])
    flex_case(r, "attn sdpa --rel-bias-table (%d, %d) max %d%s" % (
        H, buckets, max_distance, " bidirectional" if bidirectional else ""), f, extra,
        flex_torch(*d, rel=(table, bidirectional, max_distance)))
    # the table read by distance (--rel-offset), rows just long enough, some
    # indices negative (from the row's end), with its gradient
    signed = rng.random() < 0.5
    offset = rng.randrange(-T + 1, T)
    lo, hi = offset - (T - 1), offset + (T - 1)  # T = S here: either sign reaches these
    table = nprng.uniform(-1, 1, (H, max(-lo, hi + 1))).astype(np.float32)
    ft = save(r, "rel_distance.npy", table)
    flex_case(r, "attn sdpa --rel-bias-table (%d, %d) --rel-offset %d%s --causal" % (
        H, table.shape[1], offset, " --rel-signed" if signed else ""), f,
        ["--rel-bias-table", ft, "--rel-offset", offset, "--causal"] +
        (["--rel-signed"] if signed else []),
        flex_torch(*d, rel=("distance", table, offset, signed), causal=True))
    # --block-topk: per query block the key blocks kept (-1 padding), each
    # holding what --chunk leaves visible, with causal from the config
    T2, bs = 40, 16
    data2, f2 = tensors(T2, T2)
    d2 = (data2["q"], data2["k"], data2["v"], data2["dout"], scale)
    qb = (T2 + bs - 1) // bs
    topk = np.full((1, H, qb, 3), -1, np.int32)
    kept = np.zeros((1, H, qb, qb), bool)
    for h in range(H):
        for blk in range(qb):
            others = [x for x in range(qb) if x != blk and rng.random() < 0.5]
            chosen = [blk] + others
            rng.shuffle(chosen)
            slots = rng.sample(range(3), len(chosen))
            for slot, x in zip(slots, chosen):
                topk[0, h, blk, slot] = x
                kept[0, h, blk, x] = True
    ft = save(r, "topk.npy", topk)
    i2, j2 = np.arange(T2).reshape(T2, 1), np.arange(T2).reshape(1, T2)
    vis = kept[:, :, i2 // bs, j2 // bs] & (i2 // 12 == j2 // 12)
    flex_case(r, "attn sdpa --block-topk (1, %d, %d, 3) --chunk 12 --causal" % (H, qb), f2,
              ["--block-topk", ft, "--block-size", bs, "--chunk", 12, "--causal"],
              flex_torch(*d2, visible=vis, causal=True))

    # Refusals: one line naming the values, no output.
    never = r.path("never.npy")
    base = ["sdpa", "--q", f["q"], "--k", f["k"], "--v", f["v"], "--output", never]
    m = save(r, "mask_ok.npy", np.ones((T, T), bool))
    q5 = save(r, "q5.npy", data["q"][:, :, :5])
    nan_mask = save(r, "mask_nan.npy", np.where(diag, np.nan, 0).astype(np.float32))
    bad = [
        (base + ["--mask", m, "--block-topk", ft], [2], ["--mask", "--block-topk"]),
        (base + ["--mask", m, "--prefix-lm", "3"], [2], ["--mask", "--prefix-lm"]),
        (base + ["--mask", m, "--doc-ids", doc], [2], ["--mask", "--doc-ids"]),
        (base + ["--mask", m, "--chunk", "4"], [2], ["--mask", "--chunk"]),
        (["sdpa", "--q", q5, "--k", f["k"], "--v", f["v"], "--output", never, "--doc-ids", doc1],
         [2], ["--doc-ids", "T 5", "S 12"]),
        (base + ["--mask", save(r, "mask_bad.npy", np.ones((3, T, T), bool))], [2],
         ["--mask", "(3, 12, 12)", "(2, 2, 12, 12)"]),
        (base + ["--mask", save(r, "mask_5d.npy", np.ones((1, 1, 1, T, T), bool))], [2],
         ["--mask", "(1, 1, 1, 12, 12)"]),
        (base + ["--mask", nan_mask], [1], ["--mask", "'%s' holds nan at (0, 0)" % nan_mask]),
        # float64 past float32's range is named, not read as an infinity
        (base + ["--mask", save(r, "mask_big64.npy", np.where(diag, 1e39, 0.0))], [1],
         ["--mask", "element 0 (1e+39) is beyond float32's range"]),
        (base + ["--bias", save(r, "bias_min64.npy", np.full((T, T), np.finfo(np.float64).min))],
         [1], ["--bias", "(-1.79769e+308) is beyond float32's range"]),
        (base + ["--mask", save(r, "mask_u2.npy", np.ones((T, T), np.uint16))], [1],
         ["--mask", "dtype '<u2' is none of a mask's", "int8", "float64"]),
        (base + ["--bias", save(r, "bias_bad.npy", np.zeros((T, 5), np.float32))], [2],
         ["--bias", "(12, 5)", "(2, 2, 12, 12)"]),
        (base + ["--rel-bias-table", save(r, "t3.npy", np.zeros((3, 8), np.float32))], [2],
         ["--rel-bias-table", "(3, 8)", "(2, N)"]),
        (base + ["--rel-bias-table", save(r, "t8.npy", np.zeros((H, 8), np.float32)),
                 "--rel-buckets", "6"], [2], ["--rel-buckets 6", "8"]),
        (base + ["--rel-buckets", "8"], [2], ["--rel-buckets", "--rel-bias-table"]),
        (base + ["--rel-signed"], [2], ["--rel-signed", "--rel-offset"]),
        (base + ["--rel-offset", "2"], [2], ["--rel-offset", "--rel-bias-table"]),
        (base + ["--rel-bias-table", save(r, "t8e.npy", np.zeros((H, 8), np.float32)),
                 "--rel-offset", str(2 ** 62 + 1)], [2], ["--rel-offset", "+-2^62"]),
        (base + ["--rel-bias-table", save(r, "t8b.npy", np.zeros((H, 8), np.float32)),
                 "--rel-offset", "2", "--rel-max-distance", "9"], [2],
         ["--rel-offset", "--rel-max-distance"]),
        (base + ["--rel-bias-table", save(r, "t8d.npy", np.zeros((H, 8), np.float32)),
                 "--rel-max-distance", "4"], [1],
         ["(relative bias) max_distance 4 must exceed the 4 exact buckets of buckets 8"]),
        (base + ["--rel-bias-table", save(r, "t8c.npy", np.zeros((H, 2 * T - 2), np.float32)),
                 "--rel-offset", str(T - 1)], [1],
         ["(relative table) reads element", "of rows of %d" % (2 * T - 2)]),
        (base + ["--block-topk", save(r, "topk_bad.npy", np.zeros((1, H, 5, 2), np.int32))], [2],
         ["--block-topk", "(1, 2, 5, 2)", "QB 1"]),
        (base + ["--block-topk", save(r, "topk_f.npy", np.zeros((1, H, 1, 2), np.float32))], [1],
         ["--block-topk"]),
        # a key block out of range named where it sits in the file, padding and all
        (base + ["--block-topk", save(r, "topk_far.npy",
                                      np.array([[[[-1, 3]], [[0, -1]]]], np.int32))],
         [1], ["--block-topk", "holds 3 at [0, 0, 0, 1]", "key blocks 0 .. 0"]),
        (base + ["--block-size", "48"], [2], ["--block-size", "'48'"]),
        (base + ["--prefix-lm", "-1"], [2], ["--prefix-lm", "'-1'"]),
        (base + ["--prefix-lm", str(2 ** 62 + 1)], [2], ["--prefix-lm", "0 to 2^62"]),
        (base + ["--prefix-lm", "9" * 20], [2], ["--prefix-lm", "0 to 2^62", "9" * 20]),
        (base + ["--chunk", "0"], [2], ["--chunk", "'0'"]),
        (base + ["--chunk", str(2 ** 62 + 1)], [2], ["--chunk", "1 to 2^62"]),
        (base + ["--mask", os.path.join(r.tmp, "missing.npy")], [1], ["--mask", "missing.npy"]),
    ]
    for args, codes, fragments in bad:
        expect_error(r, args, codes, fragments, never)


def flex_varlen_case(r, label, lens_q, lens_kv, extra, nprng, H, D, visible=None,
                     causal=False, bias=None, rel=None, alibi=None):
    """attn sdpa --cu-seqlens with a map and modifiers in each sequence's own
    positions, against each sequence alone in float64 torch (flex_torch on
    its slice (b, :, :T_b, :S_b) of visible and bias), packed back."""
    cu_q, cu_kv = np.cumsum([0] + lens_q), np.cumsum([0] + lens_kv)
    tq, tk = int(cu_q[-1]), int(cu_kv[-1])
    data = {"q": (tq, H, D), "k": (tk, H, D), "v": (tk, H, D), "dout": (tq, H, D)}
    data = {n: nprng.uniform(-1.5, 1.5, shape).astype(np.float32) for n, shape in data.items()}
    files = {n: save(r, "vl_" + n + ".npy", a) for n, a in data.items()}
    fq = save(r, "vl_cu_q.npy", cu_q.astype(np.int32))
    fk = save(r, "vl_cu_kv.npy", cu_kv.astype(np.int32))
    scale = float(np.float32(1 / np.sqrt(D)))
    want = {"out": np.zeros((tq, H, D)), "lse": np.zeros((H, tq)), "dq": np.zeros((tq, H, D)),
            "dk": np.zeros((tk, H, D)), "dv": np.zeros((tk, H, D))}
    if bias is not None:
        want["dbias"] = np.zeros(bias.shape)
    if rel is not None:
        want["drel_bias_table"] = np.zeros(rel[0].shape)
    for b, (T, S) in enumerate(zip(lens_q, lens_kv)):
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_kv[b], cu_kv[b + 1])
        one = [data[n][rows].transpose(1, 0, 2)[None] for n, rows in
               (("q", rq), ("k", rk), ("v", rk), ("dout", rq))]
        vb = b if visible is not None and visible.shape[0] > 1 else 0
        vis = None if visible is None else visible[vb:vb + 1, :, :T, :S]
        bb = None if bias is None else bias[b:b + 1, :, :T, :S]
        w = flex_torch(*one, scale, visible=vis, causal=causal, bias=bb, rel=rel, alibi=alibi)
        want["out"][rq] = w["out"][0].transpose(1, 0, 2)
        want["lse"][:, rq] = w["lse"][0]
        want["dq"][rq] = w["dq"][0].transpose(1, 0, 2)
        want["dk"][rk] = w["dk"][0].transpose(1, 0, 2)
        want["dv"][rk] = w["dv"][0].transpose(1, 0, 2)
        if bias is not None:
            want["dbias"][b:b + 1, :, :T, :S] = w["dbias"]
        if rel is not None:
            want["drel_bias_table"] += w["drel_bias_table"]
    flex_case(r, label, files, ["--cu-seqlens-q", fq, "--cu-seqlens-kv", fk] + extra, want)
    return files, fq, fk


def test_sdpa_flex_varlen(r, rng):
    """Block maps and score modifiers with --cu-seqlens: in each sequence's
    own positions, (B, H, T, S) with T and S the longest lengths."""
    nprng = np.random.default_rng(rng.getrandbits(32))
    H, D = 2, 4
    # --doc-ids (B, T) and a per-sequence --bias with its gradient, causal
    # bottom-right per sequence (S >= T: every row sees its own key)
    lens_q, lens_kv = [5, 12, 7, 1], [9, 12, 7, 3]
    B, T = len(lens_q), 12
    ids = np.stack([random_runs(nprng, T, rng.randrange(2, 5)) for _ in range(B)])
    doc = save(r, "vl_doc.npy", ids)
    bias = nprng.uniform(-1, 1, (B, H, T, T)).astype(np.float32)
    fb = save(r, "vl_bias.npy", bias)
    files, fq, fk = flex_varlen_case(
        r, "attn sdpa --cu-seqlens --doc-ids (B, T) --bias (B, H, T, S) --causal", lens_q,
        lens_kv, ["--doc-ids", doc, "--bias", fb, "--causal", "--block-size", 16], nprng, H, D,
        visible=(ids[:, None, :, None] == ids[:, None, None, :]), causal=True, bias=bias)
    # a bool --mask (T, S) for every sequence, T5's table and ALiBi in the
    # chain (one offset: S - T is 4 in every sequence)
    lens_q, lens_kv = [5, 12, 7], [9, 16, 11]
    vis = nprng.random((12, 16)) < 0.5
    vis[:, 0] = True
    m = save(r, "vl_mask.npy", vis)
    buckets, max_distance = 8, 16
    table = nprng.uniform(-1, 1, (H, buckets)).astype(np.float32)
    slopes = nprng.uniform(0.1, 0.5, (H,)).astype(np.float32)
    ft, fs = save(r, "vl_table.npy", table), save(r, "vl_slopes.npy", slopes)
    flex_varlen_case(
        r, "attn sdpa --cu-seqlens --mask (T, S) --rel-bias-table --alibi", lens_q, lens_kv,
        ["--mask", m, "--rel-bias-table", ft, "--rel-max-distance", max_distance, "--alibi", fs],
        nprng, H, D, visible=vis[None, None], rel=(table, False, max_distance), alibi=slopes)
    # --chunk needs one offset: sequences whose S - T differ are refused
    never = r.path("never.npy")
    expect_error(r, ["sdpa", "--q", files["q"], "--k", files["k"], "--v", files["v"],
                     "--output", never, "--cu-seqlens-q", fq, "--cu-seqlens-kv", fk,
                     "--chunk", "4"], [2],
                 ["--chunk", "--cu-seqlens", "sequences 0 and 1", "S - T = 4 and 0"], never)


# ---------------------------------------------------------------------------
# i. attn mask: the drawing, the counts, the PNG
# ---------------------------------------------------------------------------

def read_png_rgb(path):
    """An 8-bit RGB, non-interlaced PNG as (height, width, 3) uint8 (the five
    filters decoded)."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "PNG signature"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        crc = int.from_bytes(data[pos + 8 + length:pos + 12 + length], "big")
        assert zlib.crc32(kind + body) == crc, "CRC of %r" % kind
        if kind == b"IHDR":
            ihdr = (int.from_bytes(body[0:4], "big"), int.from_bytes(body[4:8], "big"),
                    body[8], body[9], body[12])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, interlace = ihdr
    assert depth == 8 and colour == 2 and interlace == 0, ihdr
    raw, stride = zlib.decompress(idat), width * 3
    out = np.zeros((height, stride), np.int32)
    prev = np.zeros(stride, np.int32)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        cur = np.zeros(stride, np.int32)
        for x in range(stride):
            a = cur[x - 3] if x >= 3 else 0
            b, c = prev[x], (prev[x - 3] if x >= 3 else 0)
            if f == 0:
                p = 0
            elif f == 1:
                p = a
            elif f == 2:
                p = b
            elif f == 3:
                p = (a + b) // 2
            else:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[x] = (line[x] + p) & 0xFF
        out[y] = prev = cur
    return out.reshape(height, width, 3).astype(np.uint8)


def test_mask_command(r, rng):
    n, bs = rng.randrange(2, 7), rng.choice([16, 32])
    T = n * bs
    rc, so, se = r.run(["mask", "--q-len", T, "--causal", "--block-size", bs])
    drawing = "".join("#" * i + "~" + "." * (n - 1 - i) + "\n" for i in range(n))
    full, partial = n * (n - 1) // 2, n
    info = ("block %dx%d: %d full, %d partial, %d skipped of %d tiles (map batch 1, heads 1, "
            "%d x %d blocks), sparsity %.2f%%\n" % (bs, bs, full, partial, n * n - full - partial,
                                                     n * n, n, n, 100.0 * (n * n - full - partial) / (n * n)))
    check(rc == 0 and se == "" and so == drawing + info,
          "attn mask --q-len %d --causal --block-size %d: the drawing and the counts" % (T, bs),
          "rc=%s stdout=%r (want %r) stderr=%r" % (rc, so, drawing + info, se))
    # --doc-ids: a tile is full inside a document, skipped across two
    ids = random_runs(np.random.default_rng(rng.getrandbits(32)), T, 3)
    doc = save(r, "ids.npy", ids)
    rc, so, se = r.run(["mask", "--q-len", T, "--doc-ids", doc, "--block-size", bs])
    want = ""
    for qb in range(n):
        for kb in range(n):
            same = ids[qb * bs:(qb + 1) * bs, None] == ids[None, kb * bs:(kb + 1) * bs]
            want += "#" if same.all() else "~" if same.any() else "."
        want += "\n"
    check(rc == 0 and so.startswith(want), "attn mask --doc-ids: the drawing", "%r vs %r" % (so, want))
    # The PNG: its size from the layout, and each tile's colour.
    png = r.path("map.png")
    rc, so, se = r.run(["mask", "--q-len", T, "--causal", "--block-size", bs, "--png", png])
    if check(rc == 0 and so == "" and se.startswith("attn: wrote ") and png in se,
             "attn mask --png writes the image", "rc=%s stdout=%r stderr=%r" % (rc, so, se)):
        img = read_png_rgb(png)
        c = min(32, max(2, 512 // n))
        title = "T %d x S %d, block %dx%d, b 0 h 0, sparsity %.2f%%" % (
            T, T, bs, bs, 100.0 * (n * n - full - partial) / (n * n))
        width = 16 + max(n * c + 1, 6 * len(title) - 1)
        check(img.shape == (32 + n * c, width, 3), "attn mask --png: %dx%d pixels" % (width, 32 + n * c),
              "shape %s" % (img.shape,))
        colours = {"#": 40, "~": 150, ".": 255}
        ok = img.shape[0] == 32 + n * c and all(
            tuple(img[23 + qb * c + c // 2, 8 + kb * c + c // 2]) == (colours[ch],) * 3
            for qb, line in enumerate(drawing.split("\n")[:n]) for kb, ch in enumerate(line))
        check(ok, "attn mask --png: full tiles dark, partial grey, skipped white")
    never = r.path("never.png")
    for args, fragments in (
            (["mask"], ["--q-len", "required"]),
            (["mask", "--q-len", 8, "--b", 1], ["--b", "1", "--batch 1"]),
            (["mask", "--q-len", 8, "--mask", doc, "--chunk", 2], ["--mask", "--chunk"]),
            (["mask", "--q-len", 8, "--doc-ids", doc], ["--doc-ids", "(%d,)" % T, "(8,)"]),
            (["mask", "--q-len", 8, "--png", never, "--block-size", 8], ["--block-size", "'8'"]),
            # past the library's bound on positions: named as --offset, not --causal
            (["mask", "--q-len", 8, "--causal", "--offset", 2 ** 63 - 1, "--png", never],
             ["--offset", "+-2^62", "'%d'" % (2 ** 63 - 1)]),
            (["mask", "--q-len", 8, "--chunk", 2, "--offset", -2 ** 62 - 1],
             ["--offset", "'%d'" % (-2 ** 62 - 1)]),
            # refused before the map is built (lengths of billions took minutes and gigabytes)
            (["mask", "--q-len", 2 ** 31], ["--show", "--q-len 2147483648", "33554432 x 33554432",
                                             "a larger --block-size (up to 256)"]),
            (["mask", "--q-len", 2 ** 31, "--window", "0,0", "--png", never],
             ["--png", "--q-len 2147483648", "16384-pixel"]),
            # at the largest blocks, only shorter lengths draw
            (["mask", "--q-len", 2 ** 31, "--block-size", 256],
             ["--show", "8388608 x 8388608", "shorter --q-len and --kv-len"])):
        expect_error(r, args, [2], fragments, never)
    # a float mask is checked alike with the closed forms drawn into it
    bad = np.zeros((8, 8), np.float32)
    for value, name in ((np.inf, "inf"), (np.nan, "nan")):
        bad[1, 2] = value
        f = save(r, "mask_%s.npy" % name, bad)
        for extra in ([], ["--causal"], ["--window", "1,1"]):
            expect_error(r, ["mask", "--q-len", 8, "--mask", f, "--block-size", 16] + extra, [1],
                         ["--mask", "'%s' holds %s at (1, 2)" % (f, name)])
    # a failed print leaves the PNG as it was
    if os.path.exists("/dev/full"):
        with open(png, "wb") as old:
            old.write(b"OLD")
        with open("/dev/full", "w") as full:
            rc, _, se = r.run(["mask", "--q-len", T, "--causal", "--block-size", bs, "--show",
                               "--png", png], stdout=full)
        with open(png, "rb") as now:
            kept = now.read() == b"OLD"
        check(rc == 1 and "error writing to standard output" in se and kept,
              "attn mask --show --png > /dev/full: exit 1, the PNG unchanged",
              "rc=%s kept=%s stderr=%r" % (rc, kept, se[:300]))
    rc, so, se = r.run(["mask", "--help"])
    check(rc == 0 and so.startswith("usage: attn mask") and "--block-topk" in so, "attn mask --help")


# ---------------------------------------------------------------------------

def test_bench_pointer(r):
    """The bench command: the benchmark is attn-bench, a program of the build
    that is not installed; attn answers with where it is, as a usage error,
    and does not list bench among its commands."""
    for args in (["bench"], ["bench", "--section", "peak"], ["bench", "--help"],
                 ["help", "bench"]):
        expect_error(r, args, [2], ["attn-bench", "build/attn-bench", "not installed"])
    rc, so, se = r.run(["--help"])
    commands = re.findall(r"^  ([a-z]+) ", so.split("commands:")[-1], re.M)
    check(rc == 0 and "generate" in commands and "bench" not in commands,
          "attn --help lists its commands, bench not among them", repr(commands))


# The test groups in the order they print: (name, function of (runner, rng, options)).
GROUPS = [
    ("forward", lambda r, rng, o: test_forward(r, rng, o.cases)),
    ("bad_args", lambda r, rng, o: test_bad_args(r, rng)),
    ("help", lambda r, rng, o: test_help(r)),
    ("params", lambda r, rng, o: test_params(r)),
    ("trace", lambda r, rng, o: test_trace(r)),
    ("scale_edges", lambda r, rng, o: test_scale_edges(r, rng)),
    ("inapplicable_options", lambda r, rng, o: test_inapplicable_options(r, rng)),
    ("stdout_write_errors", lambda r, rng, o: test_stdout_write_errors(r)),
    ("trace_memory", lambda r, rng, o: test_trace_memory(r, o.sanitized)),
    ("small_defects", lambda r, rng, o: test_small_defects(r)),
    ("kernels", lambda r, rng, o: test_kernels(r, rng)),
    ("sdpa", lambda r, rng, o: test_sdpa(r, rng)),
    ("sdpa_flex", lambda r, rng, o: test_sdpa_flex(r, rng)),
    ("sdpa_flex_varlen", lambda r, rng, o: test_sdpa_flex_varlen(r, rng)),
    ("mask", lambda r, rng, o: test_mask_command(r, rng)),
    ("bench_pointer", lambda r, rng, o: test_bench_pointer(r)),
]


def start_worker(opts):
    """Each process (the main one, or a --jobs worker): options, one torch thread."""
    global VERBOSE
    VERBOSE = opts.verbose
    torch.set_num_threads(1)


def run_group(job):
    """Runs one group in its own temporary directory, with its own random
    stream (from the run seed and the group's name, so a group draws the same
    cases whichever process runs it and whatever else runs); returns its
    checks passed and failed, what it printed, and its wall time."""
    index, seed, opts = job
    global passed, failed
    passed = failed = 0
    name, body = GROUPS[index]
    printed = io.StringIO()
    tmp = tempfile.mkdtemp(prefix="attn_test_cli_%s_" % name)
    start = time.monotonic()
    try:
        with contextlib.redirect_stdout(printed):
            body(Runner(os.path.abspath(opts.attn), tmp, opts.wrapper.split()),
                 random.Random("%d/%s" % (seed, name)), opts)
    except Exception:  # a failure of its own, with what the group printed before it
        failed += 1
        printed.write("FAIL: group %s raised\n%s" % (name, traceback.format_exc()))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return passed, failed, printed.getvalue(), time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("attn", help="the attn executable")
    ap.add_argument("--seed", type=int, help="replay a run")
    ap.add_argument("--cases", type=int, default=6, help="random forward cases per module")
    ap.add_argument("--verbose", action="store_true", help="print every forward comparison")
    ap.add_argument("--sanitized", action="store_true",
                    help="attn is built with sanitizers: skip the memory measurement")
    ap.add_argument("--wrapper", default="",
                    help="run attn under this command, e.g. 'valgrind --error-exitcode=99 -q'")
    ap.add_argument("--jobs", type=int, default=1,
                    help="run the test groups in this many processes (CI's valgrind and "
                         "ThreadSanitizer runs, where each attn is slow)")
    ap.add_argument("--skip", default="",
                    help="groups not to run, comma-separated (CI's valgrind run skips the "
                         "argument parser's, which the fuzz_cli_args target covers)")
    opts = ap.parse_args()
    names = [name for name, _ in GROUPS]
    skip = [name for name in opts.skip.split(",") if name]
    unknown = [name for name in skip if name not in names]
    if unknown:
        ap.error("--skip: no group %s (groups: %s)" % (", ".join(unknown), ", ".join(names)))
    seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(2 ** 32)
    print("run seed: %d (replay: %s %s %s --seed %d)" % (seed, sys.executable, sys.argv[0], opts.attn, seed))
    sys.stdout.flush()
    start_worker(opts)
    if torch.backends.mkl.is_available():
        print("note: this torch has MKL; its dropout draws may differ from --bernoulli mt19937")
    work = [(index, seed, opts) for index in range(len(GROUPS)) if GROUPS[index][0] not in skip]
    total_passed = total_failed = 0
    if opts.jobs > 1:
        # spawn, not fork: a forked torch can hang in its thread pool.
        pool = multiprocessing.get_context("spawn").Pool(opts.jobs, start_worker, (opts,))
        results = pool.imap(run_group, work)
    else:
        pool, results = None, map(run_group, work)
    try:
        for (index, _, _), (p, f, printed, seconds) in zip(work, results):
            name = GROUPS[index][0]
            sys.stdout.write(printed)
            print("group %s: %d passed, %d failed, %.1f s" % (name, p, f, seconds))
            sys.stdout.flush()
            total_passed += p
            total_failed += f
    finally:
        if pool:
            pool.close()
            pool.join()
    if skip:
        print("skipped groups: %s" % ", ".join(skip))
    print("%d passed, %d failed" % (total_passed, total_failed))
    return 1 if total_failed else 0


if __name__ == "__main__":
    sys.exit(main())
