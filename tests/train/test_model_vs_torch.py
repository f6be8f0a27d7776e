"""attn's small language model against its PyTorch twin (torch_lm.py).

For mha and gpt2 attention, with and without the MLP, qkv_bias on and off,
on fresh random sizes every run, on the reference kernels and on the fast
ones (AUTO):
  - construction: the same state_dict names, shapes and order; with the same
    seed the same weights (bit-identical, except nn.Embedding's normal_
    draws, within attn's documented randn closeness);
  - forward: logits and loss with attn's weights copied into PyTorch;
  - backward: every parameter's gradient against autograd;
  - dropout: in training mode with dropout > 0 and the same seed, the same
    masks, so the same loss and gradients;
  - eval mode and no-grad mode; save: the safetensors file read back with
    numpy and loaded into PyTorch.

Usage: test_model_vs_torch.py LIBATTN.so [--seed N]
"""
import argparse
import copy
import json
import os
import random
import struct
import sys
import tempfile

import numpy as np
import torch

from torch_lm import TinyLM, attn_config, load_from_attn
from train_ctypes import ATTN_KERNELS_AUTO, ATTN_KERNELS_REFERENCE, AttnError, AttnTrain

LOGIT_TOL = 2e-5      # max |attn - torch| / max(1, max |torch|)
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4      # per tensor: max |attn - torch| / max |torch|, the denominator at
GRAD_FLOOR = 1e-3     # least GRAD_FLOOR x the largest gradient of the model (W_key.bias's
                      # true gradient is 0: softmax ignores a constant added to a row)
RANDN_TOL = 1e-6      # attn_rng_randn vs torch's vectorised normal_
DROPOUT_NOISE = 8     # check_dropout: attn vs float64, in units of PyTorch float32's error


def rel_max(a, b, floor=0.0):
    return float(np.max(np.abs(a - b)) / max(1e-30, floor, float(np.max(np.abs(b)))))


def grad_errors(params, tm):
    """{name: relative gradient error} of attn's grads against torch's."""
    named = dict(tm.named_parameters())
    biggest = max(float(named[n].grad.abs().max()) for n, _, _ in params)
    return {n: rel_max(g, named[n].grad.numpy(), GRAD_FLOOR * biggest) for n, _, g in params}


def torch_grad_errors(tm, tm64):
    """{name: relative gradient error} of tm's (float32) grads against tm64's."""
    return grad_errors([(n, None, p.grad.double().numpy()) for n, p in tm.named_parameters()],
                       tm64)


def random_config(rng, attention, mlp):
    heads = rng.choice([1, 2, 4])
    return dict(vocab_size=rng.randint(3, 40), context_length=rng.randint(2, 12),
                d_model=heads * rng.randint(4 // heads, 6), n_layers=rng.randint(1, 3), n_heads=heads,
                attention=attention, mlp=mlp, dropout=0.0,
                qkv_bias=attention == "mha" and rng.random() < 0.5)


def random_batch(rng, np_rng, cfg):
    b, t = rng.randint(1, 3), rng.randint(1, cfg["context_length"])
    tokens = np_rng.integers(0, cfg["vocab_size"], (b, t)).astype(np.int32)
    targets = np_rng.integers(0, cfg["vocab_size"], (b, t)).astype(np.int32)
    targets[np_rng.random((b, t)) < 0.3] = -100
    targets[0, 0] = np_rng.integers(0, cfg["vocab_size"])  # at least one scored
    return tokens, targets


def check_case(lib, ctx, cfg, seed, rng, np_rng):
    attn_rng = lib.rng_new(ctx, seed)
    model = lib.model_new(ctx, attn_rng, **attn_config(cfg))
    try:
        params = lib.model_params(ctx, model)
        torch.manual_seed(seed)
        tm = TinyLM(cfg)
        # construction: names, order, shapes, weights
        tnamed = list(tm.named_parameters())
        assert [n for n, _ in tnamed] == [n for n, _, _ in params], (
            [n for n, _ in tnamed], [n for n, _, _ in params])
        worst_emb = 0.0
        for (name, data, grad), (_, tp) in zip(params, tnamed):
            assert data.shape == tuple(tp.shape), (name, data.shape, tuple(tp.shape))
            assert not grad.any(), "%s: grad not zero after construction" % name
            diff = float(np.max(np.abs(data - tp.detach().numpy())))
            if name.endswith("_emb.weight"):
                worst_emb = max(worst_emb, diff)
                assert diff <= RANDN_TOL, "%s differs from torch by %g" % (name, diff)
            else:
                assert diff == 0.0, "%s differs from torch by %g" % (name, diff)
        assert lib.lib.attn_model_num_scalars(model) == sum(p.numel() for p in tm.parameters())
        load_from_attn(tm, params)

        # forward and backward
        tokens, targets = random_batch(rng, np_rng, cfg)
        V = cfg["vocab_size"]
        lib.model_zero_grad(ctx, model)
        loss, logits = lib.model_forward(ctx, model, tokens, targets, V)
        lib.model_backward(ctx, model)
        tlogits, tloss = tm(torch.tensor(tokens, dtype=torch.long),
                            torch.tensor(targets, dtype=torch.long))
        tloss.backward()
        scale = max(1.0, float(tlogits.abs().max()))
        logit_err = float(np.max(np.abs(logits - tlogits.detach().numpy()))) / scale
        assert logit_err <= LOGIT_TOL, "logits differ by %g (relative)" % logit_err
        assert abs(loss - tloss.item()) <= LOSS_RTOL * abs(tloss.item()), (loss, tloss.item())
        errors = grad_errors(params, tm)
        for name, err in errors.items():
            assert err <= GRAD_RTOL, "%s gradient differs by %g (relative)" % (name, err)
        worst_grad = max(errors.values())

        # eval mode and no-grad: the same logits; no backward without grad
        lib.model_set_training(ctx, model, False)
        lib.check(lib.lib.attn_model_set_grad_enabled(model, False), ctx, "grad_enabled")
        _, logits2 = lib.model_forward(ctx, model, tokens, None, V)
        assert np.array_equal(logits, logits2), "eval/no-grad forward changed the logits"
        try:
            lib.model_backward(ctx, model)
            raise AssertionError("backward after a no-grad forward succeeded")
        except AttnError as e:
            assert "gradients enabled" in str(e), str(e)
        lib.check(lib.lib.attn_model_set_grad_enabled(model, True), ctx, "grad_enabled")
        lib.model_set_training(ctx, model, True)
        return logit_err, worst_grad, worst_emb
    finally:
        lib.lib.attn_model_free(model)
        lib.rng_free(attn_rng)


def check_dropout(lib, ctx, attention, mlp, seed, rng, np_rng):
    """Training mode, dropout 0.2: attn's rng and torch's global generator,
    seeded alike, draw the same masks in the same order."""
    cfg = random_config(rng, attention, mlp)
    cfg["dropout"] = 0.2
    init = lib.rng_new(ctx, seed)
    model = lib.model_new(ctx, init, **attn_config(cfg))
    drop_rng = lib.rng_new(ctx, seed + 1)
    try:
        params = lib.model_params(ctx, model)
        torch.manual_seed(seed)
        tm = TinyLM(cfg)
        load_from_attn(tm, params)
        tm64 = copy.deepcopy(tm).double()  # CPU dropout draws the same masks in float64
        tokens, targets = random_batch(rng, np_rng, cfg)
        loss, _ = lib.model_forward(ctx, model, tokens, targets, cfg["vocab_size"], rng=drop_rng)
        lib.model_backward(ctx, model)
        batch = (torch.tensor(tokens, dtype=torch.long), torch.tensor(targets, dtype=torch.long))
        for m in (tm64, tm):  # tm last: tloss is float32's
            torch.manual_seed(seed + 1)
            _, tloss = m(*batch)
            tloss.backward()
        assert abs(loss - tloss.item()) <= LOSS_RTOL * abs(tloss.item()), (
            "dropout: loss %r, torch %r" % (loss, tloss.item()))
        # Against PyTorch float32 within GRAD_RTOL, or else against float64
        # (the same masks) within DROPOUT_NOISE x PyTorch float32's largest
        # error there: some models lose 100x the usual to float32 rounding
        # under dropout (seed 584998472: d_model 4, 3 layers; PyTorch float32
        # up to 4.5e-5 from float64, attn's reference kernels 1.9e-4 in one
        # tensor, where over 16 other models they were 1.4-10x closer to
        # float64 than PyTorch). A wrong mask or scale is off by O(1).
        errors, errors64 = grad_errors(params, tm), grad_errors(params, tm64)
        torch_worst64 = max(torch_grad_errors(tm, tm64).values())
        name = max(errors, key=errors.get)
        worst = errors[name]
        for n, err in errors.items():
            ok = err <= GRAD_RTOL or errors64[n] <= max(GRAD_RTOL, DROPOUT_NOISE * torch_worst64)
            assert ok, ("dropout, %s: %s's gradient differs by %g; from float64 by %g, where "
                        "PyTorch float32 is within %g" % (cfg, n, err, errors64[n], torch_worst64))
        # the same forward without the rng fails, naming it
        try:
            lib.model_forward(ctx, model, tokens, targets, cfg["vocab_size"], rng=None)
            raise AssertionError("a dropout forward without an rng succeeded")
        except AttnError as e:
            assert "dropout_rng" in str(e), str(e)
        print("  dropout 0.2 %-4s mlp=%d: loss %.6f (torch %.6f), gradients within %.1e" % (
            attention, mlp, loss, tloss.item(), worst))
    finally:
        lib.lib.attn_model_free(model)
        lib.rng_free(init)
        lib.rng_free(drop_rng)


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0, "header length %d is not a multiple of 8" % n
    header = json.loads(blob[8:8 + n].decode())
    data = blob[8 + n:]
    meta = header.pop("__metadata__")
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        assert info["dtype"] == "F32"
        tensors[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"])
    assert max(i["data_offsets"][1] for i in header.values()) == len(data)
    return meta, header, tensors


def check_save(lib, ctx, seed, rng, np_rng):
    cfg = random_config(rng, "gpt2", True)
    init = lib.rng_new(ctx, seed)
    model = lib.model_new(ctx, init, **attn_config(cfg))
    try:
        params = lib.model_params(ctx, model)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "model.safetensors")
            lib.check(lib.lib.attn_model_save(model, path.encode()), ctx, "attn_model_save")
            meta, header, tensors = read_safetensors(path)
            # attn_model_load into a model drawn from another seed
            other_rng = lib.rng_new(ctx, seed + 1)
            other = lib.model_new(ctx, other_rng, **attn_config(cfg))
            try:
                lib.check(lib.lib.attn_model_load(other, path.encode()), ctx, "attn_model_load")
                for (name, a, _), (_, b, _) in zip(params, lib.model_params(ctx, other)):
                    assert np.array_equal(a, b), "attn_model_load: %s" % name
            finally:
                lib.lib.attn_model_free(other)
                lib.rng_free(other_rng)
            try:
                lib.check(lib.lib.attn_model_save(model, os.path.join(d, "no", "x").encode()),
                          ctx, "attn_model_save")
                raise AssertionError("saving into a missing directory succeeded")
            except AttnError as e:
                assert "cannot open" in str(e), str(e)
        assert meta["format"] == "attn-lm" and meta["attention"] == "gpt2", meta
        for k in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads"):
            assert int(meta[k]) == cfg[k], (k, meta[k], cfg[k])
        assert sorted(header) == sorted(n for n, _, _ in params), "tensor names"
        for name, data, _ in params:
            assert np.array_equal(tensors[name], data), name
        tm = TinyLM(cfg)
        tm.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()},
                           strict=False)
        tokens, _ = random_batch(rng, np_rng, cfg)
        _, logits = lib.model_forward(ctx, model, tokens, None, cfg["vocab_size"])
        tlogits, _ = tm(torch.tensor(tokens, dtype=torch.long))
        assert np.max(np.abs(logits - tlogits.detach().numpy())) <= LOGIT_TOL * max(
            1.0, float(tlogits.abs().max()))
        print("  save: %d tensors in safetensors, loaded into PyTorch, same logits" % len(tensors))
    finally:
        lib.lib.attn_model_free(model)
        lib.rng_free(init)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 31)
    print("test_model_vs_torch seed %d (replay with --seed %d)" % (seed, seed))
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    torch.set_num_threads(1)
    lib = AttnTrain(args.lib)
    for kernels in (ATTN_KERNELS_REFERENCE, ATTN_KERNELS_AUTO):
        ctx = lib.ctx_new(num_threads=2, kernels=kernels)
        print("%s kernels:" % lib.lib.attn_kernels_name(lib.lib.attn_ctx_kernels(ctx)).decode())
        try:
            for attention in ("mha", "gpt2"):
                for mlp in (False, True):
                    for _ in range(2):
                        cfg = random_config(rng, attention, mlp)
                        s = rng.randrange(2 ** 31)
                        logit_err, grad_err, emb_err = check_case(lib, ctx, cfg, s, rng, np_rng)
                        print("  %-4s mlp=%d qkv_bias=%d V=%-2d T=%-2d C=%-2d L=%d H=%d: logits "
                              "%.1e, grads %.1e, embedding init %.1e" % (
                                  attention, mlp, cfg["qkv_bias"], cfg["vocab_size"],
                                  cfg["context_length"], cfg["d_model"], cfg["n_layers"],
                                  cfg["n_heads"], logit_err, grad_err, emb_err))
            for attention in ("mha", "gpt2"):
                check_dropout(lib, ctx, attention, True, rng.randrange(2 ** 31), rng, np_rng)
            check_save(lib, ctx, rng.randrange(2 ** 31), rng, np_rng)
        finally:
            lib.ctx_free(ctx)
    print("model vs torch: all cases pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
