"""attn's optimizers against torch.optim, step by step, on random tensors.

For every option of SGD (momentum, dampening, nesterov, weight_decay) and
AdamW (betas, eps, weight_decay, amsgrad off and on): the same initial
parameters and the same random gradients at every step go to torch.optim
(foreach=False, the single-tensor path PyTorch runs for CPU tensors) and to
attn_optimizer_step; after every step the parameters must agree to MAX_ULPS
units in the last place (on this project's machines they are bit-identical;
the count is printed). attn's AdamW is PyTorch 2's, whose first moment is
exp_avg.lerp_(grad, 1 - beta1): against a PyTorch that updates it so, the
moments (exp_avg, exp_avg_sq, max_exp_avg_sq) must be bit-identical after
every step. Its parameters go through the square root of exp_avg_sq, which
PyTorch 2.15's CPU build (MKL's vectorised sqrt) rounds to within 1 ulp,
not correctly as attn and PyTorch 1.13 do (about 15% of float32 inputs
differ), so the parameters agree within ADAMW_ULPS or, for values near 0,
ADAMW_STEP_RTOL x lr per step taken; PyTorch 1.13's AdamW, whose first
moment is mul_(beta1).add_(grad), is held to the same bound.
test_train's committed steps hold attn to PyTorch 2.15's moments bit for bit
where only 1.13 is installed.
clip_grad_norm_: the total norm and the clipped gradients (see test_clip).

Usage: test_optim_vs_torch.py LIBATTN.so [--seed N]
"""
import argparse
import ctypes
import importlib
import inspect
import random
import sys

import numpy as np
import torch

from train_ctypes import ATTN_OPTIMIZER_ADAMW, ATTN_OPTIMIZER_SGD, AttnTrain

MAX_ULPS = 2
ADAMW_ULPS = 4
ADAMW_STEP_RTOL = 2.0 ** -20
STEPS = 25
CLIP_RTOL = 1e-6

SGD_CASES = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.05, momentum=0.9, nesterov=True),
    dict(lr=0.05, momentum=0.8, weight_decay=0.01),
    dict(lr=0.02, momentum=0.9, nesterov=True, weight_decay=1e-3),
    dict(lr=0.1, weight_decay=0.1),
]
ADAMW_CASES = [
    dict(),
    dict(lr=1e-2, amsgrad=True),
    dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
    dict(lr=1e-3, weight_decay=0.0),
    dict(lr=5e-3, betas=(0.5, 0.9), weight_decay=0.05, amsgrad=True),
]


def adamw_lerps():
    """Whether this torch's AdamW step updates the first moment with lerp_, as
    attn's does (PyTorch 2's adam.py; 1.13's adamw.py has mul_ and add_)."""
    module = importlib.import_module(torch.optim.AdamW.step.__module__)
    return "exp_avg.lerp_(grad" in inspect.getsource(module)


def ulps(a, b):
    """Units in the last place between float32 arrays (0 where bit-identical)."""
    def ordered(x):
        i = x.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)
    return np.abs(ordered(a) - ordered(b))


def random_shapes(rng):
    shapes = [(rng.randint(1, 40), rng.randint(1, 40)), (rng.randint(1, 70),),
              (rng.randint(1, 9),), (rng.randint(30, 50), rng.randint(1, 6))]
    rng.shuffle(shapes)
    return shapes


def run_case(lib, ctx, kind, opts, rng, np_rng):
    shapes = random_shapes(rng)
    init = [np_rng.standard_normal(s).astype(np.float32) for s in shapes]
    # attn side: numpy arrays the library updates in place
    arrays = [("p%d" % i, x.copy(), np.zeros_like(x)) for i, x in enumerate(init)]
    table = lib.param_array(arrays)
    # torch side
    tparams = [torch.nn.Parameter(torch.tensor(x.copy())) for x in init]
    if kind == ATTN_OPTIMIZER_SGD:
        topt = torch.optim.SGD(tparams, foreach=False, **opts)
        attn_opts = dict(opts)
    else:
        topt = torch.optim.AdamW(tparams, foreach=False, **opts)
        attn_opts = {k: v for k, v in opts.items() if k != "betas"}
        if "betas" in opts:
            attn_opts["beta1"], attn_opts["beta2"] = opts["betas"]
    opt = lib.optimizer_new(ctx, table, kind, **attn_opts)
    worst, identical, total = 0, 0, 0
    adamw = kind == ATTN_OPTIMIZER_ADAMW
    lerps = adamw and adamw_lerps()
    state = (ctypes.c_float * max(1, lib.lib.attn_optimizer_state_size(opt)))()
    try:
        for step in range(STEPS):
            scale = 10.0 ** rng.uniform(-3, 1)
            for (_, _, grad), tp in zip(arrays, tparams):
                g = (np_rng.standard_normal(grad.shape) * scale).astype(np.float32)
                g[np_rng.random(grad.shape) < 0.1] = 0.0  # some exact zeros
                grad[...] = g
                tp.grad = torch.tensor(g.copy())
            topt.step()
            lib.optimizer_step(ctx, opt)
            if lerps:
                check_moments(lib, opt, state, topt, tparams, opts, step)
            for (name, data, _), tp in zip(arrays, tparams):
                d = ulps(data, tp.detach().numpy())
                worst = max(worst, int(d.max()))
                identical += int((d == 0).sum())
                total += d.size
                if adamw:  # the square root's rounding (see the top)
                    near = np.abs(data - tp.detach().numpy()) <= (
                        ADAMW_STEP_RTOL * opts.get("lr", 1e-3) * (step + 1))
                    d = np.where(near, 0, np.maximum(d - ADAMW_ULPS, 0))
                if d.max() > (0 if adamw else MAX_ULPS):
                    i = int(d.argmax())
                    raise AssertionError("%s step %d, %s[%d]: attn %r, torch %r (%d ulps)" % (
                        describe(kind, opts), step + 1, name, i, data.flat[i],
                        tp.detach().numpy().flat[i], d.flat[i]))
    finally:
        lib.lib.attn_optimizer_free(opt)
    print("  %-66s %d steps, bit-identical %d/%d, worst %d ulps" % (
        describe(kind, opts), STEPS, identical, total, worst))
    return identical, total


def check_moments(lib, opt, state, topt, tparams, opts, step):
    """attn's AdamW state (per parameter exp_avg, exp_avg_sq and, with amsgrad,
    max_exp_avg_sq) bit-identical to torch's."""
    steps = ctypes.c_size_t()
    n = len(state)
    lib.lib.attn_optimizer_get_state(opt, state, n, ctypes.byref(steps))
    got = np.frombuffer(state, np.float32)
    keys = ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if opts.get("amsgrad") else [])
    at = 0
    for i, tp in enumerate(tparams):
        for key in keys:
            want = topt.state[tp][key].numpy().ravel()
            mine = got[at:at + want.size]
            at += want.size
            d = ulps(mine, want)
            if d.max() > 0:
                k = int(d.argmax())
                raise AssertionError("AdamW(%s) step %d, p%d's %s[%d]: attn %r, torch %r" % (
                    opts, step + 1, i, key, k, mine[k], want[k]))


def describe(kind, opts):
    name = "SGD" if kind == ATTN_OPTIMIZER_SGD else "AdamW"
    return "%s(%s)" % (name, ", ".join("%s=%s" % kv for kv in opts.items()))


def test_clip(lib, ctx, rng, np_rng):
    """clip_grad_norm_: the total norm agrees with PyTorch's within CLIP_RTOL
    (attn sums the squares in double, PyTorch in float32 in its own order, so
    the last bits can differ), and the gradients are exactly g * coef with
    PyTorch's formula applied to attn's total, hence within CLIP_RTOL of
    PyTorch's too."""
    from torch.nn.utils import clip_grad_norm_
    for factor in (0.3, 1.0, 3.0, 0.0):
        shapes = random_shapes(rng)
        grads = [(np_rng.standard_normal(s) * 10.0 ** rng.uniform(-2, 1)).astype(np.float32)
                 for s in shapes]
        arrays = [("p%d" % i, np.zeros_like(g), g.copy()) for i, g in enumerate(grads)]
        table = lib.param_array(arrays)
        tparams = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads]
        for tp, g in zip(tparams, grads):
            tp.grad = torch.tensor(g.copy())
        true_norm = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))
        max_norm = factor * true_norm
        ttotal = clip_grad_norm_(tparams, max_norm).item()
        total = lib.clip_grad_norm(ctx, table, max_norm)
        assert abs(total - ttotal) <= CLIP_RTOL * ttotal, "clip total norm: attn %r, torch %r" % (
            total, ttotal)
        # PyTorch's formula on attn's total: (1 / (total + 1e-6)) * max_norm, clamped at 1
        coef = np.float32(1.0) / (np.float32(total) + np.float32(1e-6)) * np.float32(max_norm)
        coef = min(coef, np.float32(1.0))
        worst_formula = max(int(ulps(g, orig * coef).max()) for (_, _, g), orig in zip(arrays, grads))
        assert worst_formula == 0, "clip: grads are not g * coef (%d ulps)" % worst_formula
        worst = 0.0
        for (_, _, g), tp in zip(arrays, tparams):
            tg = tp.grad.numpy()
            scale = float(np.max(np.abs(tg)))
            err = float(np.max(np.abs(g - tg))) / scale if scale > 0 else float(np.max(np.abs(g)))
            worst = max(worst, err)
        assert worst <= CLIP_RTOL, "clip_grad_norm_(max_norm=%r): grads differ by %g" % (
            max_norm, worst)
        print("  clip_grad_norm_(max_norm = %.2f x norm): total %.7g (torch %.7g, %d ulps), "
              "grads within %.1e of torch's" % (factor, total, ttotal,
                                                 int(ulps(np.float32(total), np.float32(ttotal))),
                                                 worst))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 31)
    print("test_optim_vs_torch seed %d (replay with --seed %d), torch %s, AdamW %s" % (
        seed, seed, torch.__version__, "lerp: moments bit-identical" if adamw_lerps()
        else "mul_ and add_"))
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    torch.set_num_threads(1)
    lib = AttnTrain(args.lib)
    ctx = lib.ctx_new(num_threads=2)
    identical = total = 0
    try:
        for opts in SGD_CASES:
            i, t = run_case(lib, ctx, ATTN_OPTIMIZER_SGD, opts, rng, np_rng)
            identical, total = identical + i, total + t
        for opts in ADAMW_CASES:
            i, t = run_case(lib, ctx, ATTN_OPTIMIZER_ADAMW, opts, rng, np_rng)
            identical, total = identical + i, total + t
        test_clip(lib, ctx, rng, np_rng)
    finally:
        lib.ctx_free(ctx)
    print("optimizers vs torch.optim: %d of %d parameter values bit-identical over all steps"
          % (identical, total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
