#!/usr/bin/python3
"""The book's chapter-4 attention classes against attn's modules.

    .venv/bin/python tests/conformance/test_book_modules.py LIBATTN_SO ATTN_CLI [--seed N]
                                                             [--cases N]

GroupedQueryAttention, MultiHeadLatentAttention and MultiHeadAttentionWithSWA
are loaded from the book's bonus code in ../shared/reference/llms-from-scratch
(gpt_with_kv_gqa.py, _mla.py, _swa.py; ATTN_BOOK_REFERENCE overrides the
folder; tiktoken, which they import, is stubbed when absent) and used as the
oracle, without their KV cache (use_cache=False). For fresh random
configurations and seeds each run (the run seed is printed; --seed replays),
covering num_kv_groups 1 (multi-query), between, and == num_heads; window 1,
< T, >= T and None; latent_dim None and explicit; qkv_bias on and off:

  1. weights: torch.manual_seed(s) + the class and attn_rng_manual_seed(s) +
     attn_X_new hold the same parameters, by name and order, bit for bit;
  2. eval mode: y, dx and every parameter's gradient against a float64
     autograd run of the class (attn's weights loaded, then .double()),
     within relative L2 1e-5, or twice PyTorch float32's own error on the
     same case where that is larger (an ill-conditioned case: printed). A
     key bias's gradient is zero in exact arithmetic (softmax ignores a shift
     shared by every key: W_key.bias, MLA's W_UK.bias): what float32 leaves
     there is rounding residue, measured against the norm of the largest
     gradient. A gradient below 1% of the largest one's norm (a near-cancellation:
     out_proj.weight with d_out 1) that misses the bound is measured
     against 1% of that norm instead (see compare(); printed);
  3. all of it on the reference kernels and on the fused ones (the ctx's
     auto kernels), at 1 and 2 threads, whose results must be bitwise equal;
  4. training mode with dropout: the class's nn.Dropout draws from PyTorch's
     generator after the constructor's draws, and attn in its mt19937 mode
     (Debian's torch's) draws the same mask: same bounds;
  5. a scale other than the default (the class has none: W_query and its
     bias scaled instead), and constructor errors naming the values;
  6. `attn forward` and `attn grad --module gqa|mla|swa` on one case each;
  7. the Python package's classes on one case each.
Prints a table of the largest errors per module, then "N passed, N failed".
"""
import argparse
import copy
import ctypes
import importlib.util
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import types
from ctypes import POINTER, Structure, c_bool, c_double, c_int, c_size_t, c_void_p

import numpy as np
import torch

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from attn_ctypes import (ATTN_BERNOULLI_MT19937, ATTN_KERNELS_AUTO,  # noqa: E402
                         ATTN_KERNELS_REFERENCE, Attn, f32)
from conformance import Results, first_diff, same_bits  # noqa: E402

TOL = 1e-5
SMALL = 1e-2  # a gradient below this of the largest is a near-cancellation
ATTN_BERNOULLI_PHILOX = 2
BOOK = os.environ.get("ATTN_BOOK_REFERENCE",
                      os.path.join(ROOT, "..", "shared", "reference", "llms-from-scratch"))


class GqaConfig(Structure):
    _fields_ = [("d_in", c_size_t), ("d_out", c_size_t), ("num_heads", c_size_t),
                ("num_kv_groups", c_size_t), ("dropout", c_double), ("qkv_bias", c_bool),
                ("scale", c_double)]


class MlaConfig(Structure):
    _fields_ = [("d_in", c_size_t), ("d_out", c_size_t), ("num_heads", c_size_t),
                ("latent_dim", c_size_t), ("dropout", c_double), ("qkv_bias", c_bool),
                ("scale", c_double)]


class SwaConfig(Structure):
    _fields_ = [("d_in", c_size_t), ("d_out", c_size_t), ("num_heads", c_size_t),
                ("sliding_window_size", c_size_t), ("dropout", c_double), ("qkv_bias", c_bool),
                ("scale", c_double)]


# module -> (book file, class, attn config, C prefix, attn_module_kind, the
# bias whose gradient vanishes in exact arithmetic)
MODULES = {
    "gqa": ("gpt_with_kv_gqa.py", "GroupedQueryAttention", GqaConfig, "attn_gqa", 7,
            "W_key.bias"),
    "mla": ("gpt_with_kv_mla.py", "MultiHeadLatentAttention", MlaConfig, "attn_mla", 8,
            "W_UK.bias"),
    "swa": ("gpt_with_kv_swa.py", "MultiHeadAttentionWithSWA", SwaConfig, "attn_swa", 9,
            "W_key.bias"),
}
# kernels label -> ctx kernels
KERNELS = {"reference": ATTN_KERNELS_REFERENCE, "fused": ATTN_KERNELS_AUTO}


def load_book():
    """The three classes from the book's files (not copied into attn)."""
    if not os.path.isdir(BOOK):
        print("the book's reference code is not at %s (set ATTN_BOOK_REFERENCE)" % BOOK)
        sys.exit(77)
    try:
        import tiktoken  # noqa: F401  (the files import it at module level)
    except ImportError:
        sys.modules["tiktoken"] = types.ModuleType("tiktoken")
    classes = {}
    for kind, (fname, cls, *_) in MODULES.items():
        spec = importlib.util.spec_from_file_location("book_" + kind, os.path.join(BOOK, fname))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        classes[kind] = getattr(mod, cls)
    return classes


def declare(A):
    def fn(name, restype, *argtypes):
        f = getattr(A.lib, name)
        f.restype = restype
        f.argtypes = list(argtypes)
    for _, _, cfg, prefix, _, _ in MODULES.values():
        fn(prefix + "_new", c_int, c_void_p, POINTER(cfg), c_void_p, POINTER(c_void_p))
        fn(prefix + "_module", c_void_p, c_void_p)
        fn(prefix + "_forward", c_int, c_void_p, ctypes.POINTER(ctypes.c_float), c_size_t,
           c_size_t, ctypes.POINTER(ctypes.c_float), c_void_p)
        fn(prefix + "_backward", c_int, c_void_p, ctypes.POINTER(ctypes.c_float), c_size_t,
           c_size_t, ctypes.POINTER(ctypes.c_float))
        fn(prefix + "_free", None, c_void_p)


def rel_l2(ours, ref, floor=0.0):
    ref = np.asarray(ref, dtype=np.float64)
    diff = np.linalg.norm(np.asarray(ours, dtype=np.float64) - ref)
    return diff / max(np.linalg.norm(ref), floor, 1e-300)


class Case:
    """One configuration of one class, with its seed, x and dy."""

    def __init__(self, book, kind, r, i, train, wide=False):
        self.kind, self.train, self.book = kind, train, book
        if wide:  # several blocks of the fused kernels' tiles
            H, hd = r.choice([2, 4, 8]), r.choice([8, 16, 32])
            self.d_in, self.B, self.T = r.randint(16, 96), r.randint(1, 2), r.randint(33, 96)
        else:
            H = r.choice([2, 3, 4, 6]) if kind == "gqa" else r.choice([1, 2, 3, 4])
            hd = r.randint(1, 8)
            self.d_in, self.B, self.T = r.randint(1, 24), r.randint(1, 3), r.randint(1, 20)
        self.H, self.d_out = H, H * hd
        self.bias = i % 2 == 1
        self.dropout = r.choice([0.1, 0.25, 0.5]) if train else r.choice([0.0, 0.0, 0.3])
        self.extra = None
        if kind == "gqa":  # num_kv_groups: 1 (MQA), == num_heads, or between
            divisors = [g for g in range(1, H + 1) if H % g == 0]
            self.extra = [1, H, r.choice(divisors)][i % 3]
        elif kind == "mla":  # latent_dim: the book's default or explicit
            self.extra = None if i % 2 == 0 else r.randint(1, 12)
        else:  # window: 1, < T, >= T, None
            pick = i % 4
            if pick == 1 and self.T < 3:
                self.T = r.randint(3, 20)
            self.extra = [1, r.randint(2, max(2, self.T - 1)), r.randint(self.T, self.T + 4),
                          None][pick]
        self.seed = r.randrange(1, 2 ** 63)
        gen = torch.Generator().manual_seed(r.randrange(1, 2 ** 63))
        self.x = torch.randn(self.B, self.T, self.d_in, generator=gen)
        self.dy = torch.randn(self.B, self.T, self.d_out, generator=gen)

    def desc(self):
        name = {"gqa": "kv_groups", "mla": "latent_dim", "swa": "window"}[self.kind]
        return "d_in=%d d_out=%d heads=%d %s=%s bias=%d p=%g B=%d T=%d seed=%d" % (
            self.d_in, self.d_out, self.H, name, self.extra, self.bias, self.dropout, self.B,
            self.T, self.seed)

    def ctor(self):
        """The book's class, drawing its weights from torch's generator."""
        cls = self.book[self.kind]
        if self.kind == "gqa":
            return cls(self.d_in, self.d_out, self.dropout, self.H, self.extra,
                       qkv_bias=self.bias)
        if self.kind == "mla":
            return cls(self.d_in, self.d_out, self.dropout, self.H, qkv_bias=self.bias,
                       latent_dim=self.extra)
        return cls(self.d_in, self.d_out, self.dropout, self.H, qkv_bias=self.bias,
                   sliding_window_size=self.extra)

    def config(self, scale=0.0):
        cfg = MODULES[self.kind][2]
        return cfg(self.d_in, self.d_out, self.H, self.extra or 0, self.dropout, self.bias, scale)

    def cli_args(self):
        args = ["--module", self.kind, "--d-out", str(self.d_out), "--heads", str(self.H),
                "--seed", str(self.seed)]
        if self.bias:
            args.append("--qkv-bias")
        if self.extra is not None:
            flag = {"gqa": "--kv-groups", "mla": "--latent-dim", "swa": "--window"}[self.kind]
            args += [flag, str(self.extra)]
        return args


def torch_run(case, weights, dtype, scale_query=None, jitter=None):
    """The class's (y, dx, {name: grad}) in dtype, holding attn's weights;
    dropout draws restart where attn's do (after the constructor's).
    jitter (a seed): x and dy each moved by one float32 ulp, up or down."""
    torch.manual_seed(case.seed)
    m = case.ctor()
    with torch.no_grad():
        for n, p in m.named_parameters():
            p.copy_(torch.from_numpy(weights[n]))
    m = m.to(dtype)
    if scale_query is not None:  # scores * f: W_query and its bias times f
        with torch.no_grad():
            for n, p in m.named_parameters():
                if n.startswith("W_query."):
                    p.mul_(scale_query)
    m.train(case.train)
    x, dy = case.x, case.dy
    if jitter is not None:
        g = np.random.default_rng(jitter)
        nudge = lambda a: torch.from_numpy(np.nextafter(
            a.numpy(), np.where(g.random(a.shape) < 0.5, -np.inf, np.inf).astype(np.float32)))
        x, dy = nudge(x), nudge(dy)
    x = x.to(dtype).clone().requires_grad_(True)
    y = m(x)
    y.backward(dy.to(dtype))
    grads = {n: p.grad.detach().numpy().copy() for n, p in m.named_parameters()}
    return y.detach().numpy(), x.grad.detach().numpy(), grads


class Lib:
    """attn through ctypes, with one ctx per (kernels, threads)."""

    def __init__(self, path):
        self.A = Attn(path)
        declare(self.A)
        self.ctxs = {(k, n): self.A.ctx_new(num_threads=n, kernels=v)
                     for k, v in KERNELS.items() for n in (1, 2)}

    def new(self, ctx, case, rng, scale=0.0):
        A, prefix = self.A, MODULES[case.kind][3]
        h = c_void_p()
        A.check(getattr(A.lib, prefix + "_new")(ctx, ctypes.byref(case.config(scale)), rng,
                                                 ctypes.byref(h)), ctx, prefix + "_new")
        return h, c_void_p(getattr(A.lib, prefix + "_module")(h))

    def run(self, case, kernels="reference", threads=1, typed=False, scale=0.0,
            bernoulli=ATTN_BERNOULLI_MT19937):
        """attn's (weights, y, dx, grads) for the case."""
        A, ctx = self.A, self.ctxs[(kernels, threads)]
        prefix = MODULES[case.kind][3]
        rng = A.rng_new(ctx, case.seed, bernoulli)
        h, m = self.new(ctx, case, rng, scale)
        try:
            A.module_set_training(ctx, m, case.train)
            weights = dict(A.module_params(ctx, m))
            names = [n for n, _ in A.module_params(ctx, m)]
            if typed:
                x, xp = f32(case.x.numpy())
                y, yp = f32(np.empty((case.B, case.T, case.d_out), np.float32))
                A.check(getattr(A.lib, prefix + "_forward")(h, xp, case.B, case.T, yp,
                                                             rng if case.train else None),
                        ctx, prefix + "_forward")
            else:
                y = A.module_forward(ctx, m, case.x.numpy(), rng if case.train else None)
            dx = A.module_backward(ctx, m, case.dy.numpy(), typed=(prefix, h) if typed else None)
            grads = dict(A.module_grads(ctx, m))
            kind = A.lib.attn_module_get_kind(m)
            cls = A.lib.attn_module_class_name(m).decode()
        finally:
            A.module_free(m)
            A.rng_free(rng)
        return dict(weights=weights, names=names, y=y, dx=dx, grads=grads, kind=kind, cls=cls)


def torch_f32(case, weights):
    """PyTorch float32's runs: on x and dy, then twice on x and dy each
    moved by one ulp (see compare)."""
    return [torch_run(case, weights, torch.float32, jitter=j)
            for j in (None, case.seed % 2 ** 32, case.seed % 2 ** 32 + 1)]


def compare(res, group, label, ours, ref64, ref32s, vanishing):
    """Checks y, dx and every gradient of ours against float64; returns the
    problems found.

    The bound is TOL, or twice PyTorch float32's own error where that is
    larger: on an ill-conditioned tensor, one run's error is partly luck (a
    sum whose terms cancel keeps or loses a digit by the rounding of the
    last term), so the error that counts is the largest of three float32
    runs: on x and dy, and on x and dy moved by one ulp each (inputs within
    float32's own rounding of them, on which PyTorch is just as right). The
    table quotes the first.

    A gradient that is a near-cancellation (out_proj.weight with d_out 1: one
    sum over the rows of dy times context; W_query's with one head of width
    1: sums of softmax-gradient rows that sum to zero) is small against the
    float32 rounding of the terms it sums, in any float32 implementation:
    PyTorch's own error there is luck, and twice it is no bound. Such a
    tensor (float64 norm below SMALL of the largest gradient's) that misses
    the bound is measured against SMALL times that largest norm, its error
    in the units of the whole backward (the fused kernels' bound in
    test_fast_vs_reference.py). Printed when it happens."""
    problems = []
    largest = max(np.linalg.norm(ref64[1]), max((np.linalg.norm(g) for g in ref64[2].values()),
                                                 default=0.0))
    pairs = [("y", ours["y"], ref64[0], [r[0] for r in ref32s], 0.0),
             ("dx", ours["dx"], ref64[1], [r[1] for r in ref32s], 0.0)]
    for n in ref64[2]:
        # zero in exact arithmetic: its rounding residue, in units of the
        # whole backward
        floor = largest if n == vanishing else 0.0
        pairs.append((n, ours["grads"].get(n), ref64[2][n], [r[2][n] for r in ref32s], floor))
    res.note(group, n=1)
    if sorted(ours["grads"]) != sorted(ref64[2]):
        problems.append("gradient names: ours %s torch %s" % (sorted(ours["grads"]),
                                                              sorted(ref64[2])))
    for n, o, r64, r32s, floor in pairs:
        if o is None:
            continue
        e, e32 = rel_l2(o, r64, floor), max(rel_l2(r32, r64, floor) for r32 in r32s)
        first32 = rel_l2(r32s[0], r64, floor)
        if n != "y" and not e <= max(TOL, 2 * e32):
            small = max(SMALL * largest, floor)
            if max(np.linalg.norm(r64), floor) < small:
                print("near-cancelling gradient: %s %s (norm %.3g, largest %.3g): rel L2 %.3g, "
                      "torch float32 %.3g; against %g of the largest: %.3g" % (
                          label, n, np.linalg.norm(r64), largest, e, e32, SMALL,
                          rel_l2(o, r64, small)))
                e, e32 = rel_l2(o, r64, small), max(rel_l2(r32, r64, small) for r32 in r32s)
                first32 = rel_l2(r32s[0], r64, small)
        key = "fwd" if n == "y" else "grad"
        res.note(group, **{key: e, key + "_torch32": first32})
        if not e <= max(TOL, 2 * e32):
            problems.append("%s: rel L2 %.3g vs float64 (torch float32 %.3g)" % (n, e, e32))
        elif e > TOL:
            print("ill-conditioned: %s %s: rel L2 %.3g, torch float32 %.3g" % (label, n, e, e32))
    return problems


def check_case(lib, res, r, case):
    mode = "train" if case.train else "eval"
    label = "%s %s %s" % (case.kind, mode, case.desc())
    ref = lib.run(case, "reference", 1)
    # 1. weights: same names, order and bits as the class after the same seed
    torch.manual_seed(case.seed)
    tm = case.ctor()
    tw = [(n, p.detach().numpy()) for n, p in tm.state_dict().items()]
    same = [n for n, _ in tw] == ref["names"] and all(
        same_bits(ref["weights"][n], w) for n, w in tw)
    res.check(same, "%s weights after the same seed: %s" % (case.kind, case.desc()),
              "" if same else "names %s vs %s; %s" % (
                  ref["names"], [n for n, _ in tw],
                  "; ".join(first_diff(ref["weights"].get(n, np.zeros(0)), w) for n, w in tw)))
    res.check(ref["kind"] == MODULES[case.kind][4] and ref["cls"] == MODULES[case.kind][1],
              "%s kind %d, class name %s" % (case.kind, ref["kind"], ref["cls"]))
    t64 = torch_run(case, ref["weights"], torch.float64)
    t32 = torch_f32(case, ref["weights"])
    vanishing = MODULES[case.kind][5] if case.bias else None
    # 2, 3. both kernel sets at 1 and 2 threads; the thread counts agree bitwise
    for kernels in KERNELS:
        one = ref if kernels == "reference" else lib.run(case, kernels, 1, typed=r.random() < 0.5)
        two = lib.run(case, kernels, 2, typed=r.random() < 0.5)
        group = "%s %s %s" % (case.kind, mode, kernels)
        for threads, out in ((1, one), (2, two)):
            problems = compare(res, group, label, out, t64, t32, vanishing)
            res.check(not problems, "%s %s threads=%d: %s" % (group, "y, dx, grads", threads,
                                                             case.desc()),
                      "; ".join(problems)[:800])
        res.check(same_run(one, two), "%s bitwise equal on 1 and 2 threads" % group)
    if case.train:
        check_philox(lib, res, case)


def same_run(a, b):
    return same_bits(a["y"], b["y"]) and same_bits(a["dx"], b["dx"]) and all(
        same_bits(a["grads"][n], b["grads"][n]) for n in a["grads"])


def check_philox(lib, res, case):
    """Philox dropout (no PyTorch CPU counterpart): drawn inside the fused
    kernels and drawn again by their backward, kept as bits by the reference
    ones; the two must agree, and differ from the eval-mode output."""
    ref = lib.run(case, "reference", 1, bernoulli=ATTN_BERNOULLI_PHILOX)
    one = lib.run(case, "fused", 1, bernoulli=ATTN_BERNOULLI_PHILOX)
    two = lib.run(case, "fused", 2, bernoulli=ATTN_BERNOULLI_PHILOX)
    names = sorted(ref["grads"])
    flat = lambda o: np.concatenate([o["dx"].ravel()] + [o["grads"][n].ravel() for n in names])
    e_fwd, e_bwd = rel_l2(one["y"], ref["y"]), rel_l2(flat(one), flat(ref))
    eval_case = copy.copy(case)
    eval_case.train = False
    dropped = case.dropout == 0 or not np.array_equal(ref["y"], lib.run(eval_case)["y"])
    res.note("%s philox: fused vs ref" % case.kind, n=1, fwd=e_fwd, grad=e_bwd)
    res.check(e_fwd <= TOL and e_bwd <= TOL and same_run(one, two) and dropped,
              "%s train philox: fused (1, 2 threads) vs reference: %s" % (case.kind, case.desc()),
              "rel L2 y %.3g, dx and grads %.3g%s%s" % (
                  e_fwd, e_bwd, "" if same_run(one, two) else "; threads differ",
                  "" if dropped else "; no dropout applied"))


def check_scale(lib, res, book, r):
    """A non-default scale c: the class's scores / sqrt(hd) times f =
    c sqrt(hd), which W_query (and its bias) times f gives."""
    for i, kind in enumerate(MODULES):
        case = Case(book, kind, r, i + 1, False)
        hd = case.d_out // case.H
        c = r.uniform(0.05, 2.0)
        f = c * math.sqrt(hd)
        out = lib.run(case, "reference", 1, scale=c)
        t64 = torch_run(case, out["weights"], torch.float64, scale_query=f)
        t32 = torch_run(case, out["weights"], torch.float32, scale_query=f)
        e, e32 = rel_l2(out["y"], t64[0]), rel_l2(t32[0], t64[0])
        res.check(e <= max(TOL, 2 * e32), "%s scale=%.4g: forward vs the class with W_query * %.4g"
                  % (kind, c, f), "rel L2 %.3g (torch float32 %.3g)" % (e, e32))
        # the default, given explicitly as 1/sqrt(hd), is the same module
        default = lib.run(case, "reference", 1)
        explicit = lib.run(case, "reference", 1, scale=1.0 / math.sqrt(hd))
        res.check(same_bits(default["y"], explicit["y"]),
                  "%s scale 0 and 1/sqrt(head_dim) give the same bits" % kind)


def check_errors(lib, res, book):
    A = lib.A
    ctx = lib.ctxs[("reference", 1)]
    rng = A.rng_new(ctx, 1)
    bad = [
        ("gqa", GqaConfig(8, 8, 4, 3, 0.0, False, 0.0), "num_heads (4) must be divisible by "
         "num_kv_groups (3)"),
        ("gqa", GqaConfig(8, 8, 4, 0, 0.0, False, 0.0), "num_kv_groups must be positive"),
        ("gqa", GqaConfig(8, 6, 4, 2, 0.0, False, 0.0), "d_out (6) must be divisible by "
         "num_heads (4)"),
        ("mla", MlaConfig(0, 8, 2, 0, 0.0, False, 0.0), "d_in must be positive"),
        ("mla", MlaConfig(8, 8, 0, 0, 0.0, False, 0.0), "num_heads must be positive"),
        ("swa", SwaConfig(8, 8, 2, 3, 1.5, False, 0.0), "dropout (1.5)"),
        ("swa", SwaConfig(8, 8, 2, 3, 0.0, False, float("inf")), "scale (inf)"),
    ]
    for kind, cfg, want in bad:
        prefix = MODULES[kind][3]
        h = c_void_p(1)
        st = getattr(A.lib, prefix + "_new")(ctx, ctypes.byref(cfg), rng, ctypes.byref(h))
        msg = A.lib.attn_ctx_last_error(ctx).decode()
        res.check(st != 0 and not h.value and want in msg and MODULES[kind][1] in msg,
                  "%s_new refuses: %s" % (prefix, msg))
    # a backward before any forward
    case = Case(book, "gqa", random.Random(1), 0, False)
    h, m = lib.new(ctx, case, rng)
    dy, dyp = f32(np.ones((1, 2, case.d_out)))
    dx, dxp = f32(np.ones((1, 2, case.d_in)))
    st = A.lib.attn_module_backward(m, dyp, 1, 2, dxp)
    msg = A.lib.attn_ctx_last_error(ctx).decode()
    res.check(st != 0 and "no forward" in msg, "GroupedQueryAttention backward before forward: "
              + msg)
    # training mode with dropout needs an rng
    A.module_set_training(ctx, m, True)
    x, xp = f32(np.ones((1, 2, case.d_in)))
    y, yp = f32(np.empty((1, 2, case.d_out)))
    if case.dropout > 0:
        st = A.lib.attn_module_forward(m, xp, 1, 2, yp, None)
        res.check(st != 0, "training-mode dropout without an rng is refused")
    A.module_free(m)
    A.rng_free(rng)


def npy_load(path):
    return np.load(path).astype(np.float64)


def check_cli(res, book, cli, r):
    for i, kind in enumerate(MODULES):
        case = Case(book, kind, r, i, False)
        with tempfile.TemporaryDirectory() as tmp:
            xp, dyp = os.path.join(tmp, "x.npy"), os.path.join(tmp, "dy.npy")
            np.save(xp, case.x.numpy())
            np.save(dyp, case.dy.numpy())
            common = case.cli_args() + ["--kernels", "reference", "--threads", "1"]
            yp = os.path.join(tmp, "y.npy")
            fwd = subprocess.run([cli, "forward"] + common + ["--input", xp, "--output", yp],
                                 capture_output=True, text=True)
            out = os.path.join(tmp, "grads")
            grd = subprocess.run([cli, "grad"] + common + ["--input", xp, "--grad-output", dyp,
                                                            "--out", out],
                                 capture_output=True, text=True)
            if fwd.returncode or grd.returncode:
                res.check(False, "attn forward/grad --module %s %s" % (kind, case.desc()),
                          (fwd.stderr + grd.stderr).strip()[:400])
                continue
            torch.manual_seed(case.seed)
            weights = {n: p.detach().numpy() for n, p in case.ctor().state_dict().items()}
            t64 = torch_run(case, weights, torch.float64)
            t32 = torch_f32(case, weights)
            ours = {"y": npy_load(yp), "dx": npy_load(os.path.join(out, "input.npy")),
                    "grads": {n: npy_load(os.path.join(out, n + ".npy")) for n in weights}}
            problems = compare(res, "%s cli" % kind, "cli " + kind, ours, t64, t32,
                               MODULES[kind][5] if case.bias else None)
            same = np.array_equal(npy_load(os.path.join(out, "output.npy")), ours["y"])
            res.check(not problems and same, "attn forward and grad %s" % " ".join(case.cli_args()),
                      "; ".join(problems) + ("" if same else "; grad's output.npy differs from "
                                             "forward's"))
    # an option the class does not take
    for kind, opt in (("gqa", "--window"), ("swa", "--kv-groups"), ("mla", "--context"),
                      ("gqa", "--mask")):
        p = subprocess.run([cli, "forward", "--module", kind, opt,
                            "neg-inf" if opt == "--mask" else "2", "--input", "x.npy",
                            "--output", "y.npy"], capture_output=True, text=True)
        res.check(p.returncode == 2 and "does not apply to --module " + kind in p.stderr,
                  "attn forward --module %s %s is a usage error" % (kind, opt),
                  p.stderr.strip())
    h = subprocess.run([cli, "forward", "--help"], capture_output=True, text=True)
    res.check(h.returncode == 0 and all(s in h.stdout for s in ("gqa|mla|swa", "--kv-groups",
                                                                "--latent-dim", "--window")),
              "attn forward --help lists gqa, mla, swa and their options")


def check_python(res, book, libpath, r):
    os.environ["ATTN_LIBRARY"] = libpath
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import attn
    for i, kind in enumerate(MODULES):
        case = Case(book, kind, r, i + 1, False)
        attn.manual_seed(case.seed)
        if kind == "gqa":
            m = attn.GroupedQueryAttention(case.d_in, case.d_out, case.dropout, case.H,
                                           case.extra, qkv_bias=case.bias)
        elif kind == "mla":
            m = attn.MultiHeadLatentAttention(case.d_in, case.d_out, case.dropout, case.H,
                                              qkv_bias=case.bias, latent_dim=case.extra)
        else:
            m = attn.MultiHeadAttentionWithSWA(case.d_in, case.d_out, case.dropout, case.H,
                                               qkv_bias=case.bias,
                                               sliding_window_size=case.extra)
        torch.manual_seed(case.seed)
        tw = {n: p.detach().numpy() for n, p in case.ctor().state_dict().items()}
        sd = m.state_dict()
        same = list(sd) == list(tw) and all(same_bits(sd[n], tw[n]) for n in tw)
        m.eval()
        ours = {"y": m(case.x.numpy()), "dx": m.backward(case.dy.numpy()), "grads": m.grads()}
        t64 = torch_run(case, tw, torch.float64)
        t32 = torch_f32(case, tw)
        problems = compare(res, "%s python" % kind, "python " + kind, ours, t64, t32,
                           MODULES[kind][5] if case.bias else None)
        res.check(same and not problems, "attn.%s %s" % (type(m).__name__, case.desc()),
                  ("" if same else "weights differ; ") + "; ".join(problems))
        # safetensors: save, load into one built from another seed
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, kind + ".safetensors")
            m.save(path)
            attn.manual_seed(case.seed + 1)
            other = type(m)(case.d_in, case.d_out, case.dropout, case.H,
                            **({"num_kv_groups": case.extra} if kind == "gqa" else
                               {"latent_dim": case.extra} if kind == "mla" else
                               {"sliding_window_size": case.extra}), qkv_bias=case.bias)
            other.load(path)
            back = other.state_dict()
        res.check(list(back) == list(sd) and all(same_bits(back[n], sd[n]) for n in sd),
                  "attn.%s save/load (safetensors) round trip" % type(m).__name__)
    try:
        attn.MultiHeadAttentionWithSWA(4, 4, 0.0, 2, sliding_window_size=0)
        refused = False
    except ValueError:
        refused = True
    res.check(refused, "attn.MultiHeadAttentionWithSWA refuses sliding_window_size=0")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib")
    ap.add_argument("cli")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--cases", type=int, default=6, help="eval-mode cases per module")
    args = ap.parse_args()
    run_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print("run seed %d (replay with --seed %d)" % (run_seed, run_seed))
    r = random.Random(run_seed)
    torch.set_num_threads(1)
    book = load_book()
    lib = Lib(args.lib)
    res = Results()
    t0 = time.time()
    for kind in MODULES:
        for i in range(max(args.cases, 4)):  # at least one of each kv_groups/window/latent pick
            check_case(lib, res, r, Case(book, kind, r, i, False))
        for i in range(max(args.cases // 2, 2)):
            check_case(lib, res, r, Case(book, kind, r, i, True))
        for i in range(2):  # longer sequences, wider heads
            check_case(lib, res, r, Case(book, kind, r, r.randrange(4), i == 1, wide=True))
    check_scale(lib, res, book, r)
    check_errors(lib, res, book)
    check_cli(res, book, args.cli, r)
    check_python(res, book, args.lib, r)
    print()
    print("largest relative L2 error vs PyTorch float64 autograd (y; dx and every gradient):")
    print("  %-26s %5s %10s %12s %10s %12s" % ("module mode kernels", "n", "y", "torch f32 y",
                                             "grads", "torch f32 g"))
    cell = lambda v, k, w: ("%*.3g" % (w, v[k])) if k in v else "%*s" % (w, "-")
    for g, v in res.maxerr.items():
        print("  %-26s %5d %s %s %s %s" % (g, v.get("n", 0), cell(v, "fwd", 10),
                                           cell(v, "fwd_torch32", 12), cell(v, "grad", 10),
                                           cell(v, "grad_torch32", 12)))
    print("elapsed %.1f s, run seed %d" % (time.time() - t0, run_seed))
    if res.failures:
        print("failures:")
        for f in res.failures:
            print("  " + f)
    print("%d passed, %d failed" % (res.passed, res.failed))
    for c in lib.ctxs.values():
        lib.A.ctx_free(c)
    return 1 if res.failed else 0


if __name__ == "__main__":
    sys.exit(main())
