"""Optimizer parity through the small model: attn and PyTorch train the same
model (attn's initial weights copied into the PyTorch twin, torch_lm.py) on
the same batches (attn_task_batch, induction) with the same
hyper-parameters, and must report the same loss at every one of the first 50
steps (relative 1e-4):
  - SGD with momentum 0.9 (torch.optim.SGD, foreach=False);
  - AdamW with its defaults but lr, and clip_grad_norm_(1.0) before each step;
each on the reference kernels (the oracle) and on the kernels `attn train`
runs (AUTO: the fastest this CPU has). Prints the tables (step, PyTorch
loss, attn loss, relative difference).

Usage: test_train_parity.py LIBATTN.so [--seed N] [--steps N]
"""
import argparse
import random
import sys

import numpy as np
import torch

from torch_lm import TinyLM, attn_config, load_from_attn
from train_ctypes import (ATTN_KERNELS_AUTO, ATTN_KERNELS_REFERENCE, ATTN_OPTIMIZER_ADAMW,
                          ATTN_OPTIMIZER_SGD, AttnTrain)

LOSS_RTOL = 1e-4
CONFIG = dict(vocab_size=16, context_length=16, d_model=32, n_layers=2, n_heads=4,
              attention="mha", mlp=True, dropout=0.0, qkv_bias=False)
BATCH = 16

RUNS = [
    ("SGD(lr=0.05, momentum=0.9)", ATTN_OPTIMIZER_SGD, dict(lr=0.05, momentum=0.9), None),
    ("AdamW(lr=3e-3), clip_grad_norm_(1.0)", ATTN_OPTIMIZER_ADAMW, dict(lr=3e-3), 1.0),
]


def run(lib, ctx, title, kind, opts, clip, seed, steps):
    init = lib.rng_new(ctx, seed)
    data = lib.rng_new(ctx, seed + 1)
    model = lib.model_new(ctx, init, **attn_config(CONFIG))
    opt = None
    try:
        params = lib.model_params(ctx, model)
        tm = TinyLM(CONFIG)
        load_from_attn(tm, params)
        table, count = lib.model_param_table(ctx, model)
        opt = lib.optimizer_new(ctx, table, kind, count=count, **opts)
        if kind == ATTN_OPTIMIZER_SGD:
            topt = torch.optim.SGD(tm.parameters(), foreach=False, **opts)
        else:
            topt = torch.optim.AdamW(tm.parameters(), foreach=False, **opts)
        rows = []
        print("%s, %s kernels, %d steps (batch %d, induction, %s)" % (
            title, kernels_name(lib, ctx), steps, BATCH, CONFIG))
        print("  step  PyTorch loss   attn loss      relative diff")
        for step in range(1, steps + 1):
            tokens, targets, _ = lib.task_batch(ctx, "induction", CONFIG["vocab_size"],
                                                CONFIG["context_length"], data, BATCH)
            # attn
            lib.model_zero_grad(ctx, model)
            loss, _ = lib.model_forward(ctx, model, tokens, targets, CONFIG["vocab_size"],
                                        logits=False)
            lib.model_backward(ctx, model)
            if clip is not None:
                lib.clip_grad_norm(ctx, table, clip, count=count)
            lib.optimizer_step(ctx, opt)
            # PyTorch
            topt.zero_grad(set_to_none=False)
            _, tloss = tm(torch.tensor(tokens, dtype=torch.long),
                          torch.tensor(targets, dtype=torch.long))
            tloss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(tm.parameters(), clip)
            topt.step()
            rel = abs(loss - tloss.item()) / abs(tloss.item())
            rows.append((step, tloss.item(), loss, rel))
            print("  %4d  %.8f     %.8f     %.2e" % rows[-1])
            assert rel <= LOSS_RTOL, "%s step %d: attn loss %r, torch %r (relative %.2e)" % (
                title, step, loss, tloss.item(), rel)
        named = dict(tm.named_parameters())
        worst = max(float(np.max(np.abs(d - named[n].detach().numpy())) /
                          max(1e-30, float(named[n].detach().abs().max())))
                    for n, d, _ in lib.model_params(ctx, model))
        print("  after %d steps: loss %.4f -> %.4f; parameters within %.1e (relative)" % (
            steps, rows[0][2], rows[-1][2], worst))
        return rows
    finally:
        if opt is not None:
            lib.lib.attn_optimizer_free(opt)
        lib.lib.attn_model_free(model)
        lib.rng_free(init)
        lib.rng_free(data)


def kernels_name(lib, ctx):
    return lib.lib.attn_kernels_name(lib.lib.attn_ctx_kernels(ctx)).decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 31)
    print("test_train_parity seed %d (replay with --seed %d)" % (seed, seed))
    torch.set_num_threads(1)
    lib = AttnTrain(args.lib)
    for kernels in (ATTN_KERNELS_REFERENCE, ATTN_KERNELS_AUTO):
        ctx = lib.ctx_new(num_threads=2, kernels=kernels)
        try:
            for title, kind, opts, clip in RUNS:
                run(lib, ctx, title, kind, opts, clip, seed, args.steps)
        finally:
            lib.ctx_free(ctx)
    print("optimizer parity through the model: every step within %g" % LOSS_RTOL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
