"""attn_model_new_gpt against the book's GPTModel (llms-from-scratch 1.0.19,
llms_from_scratch.ch04, the class chapter 5 pretrains), through ctypes.

On fresh seeds every run, for qkv_bias off (the real vocabulary, 50257) and
on (a smaller one), emb 64, 2 layers, 4 heads, context 32:
  - init: torch.manual_seed(s); GPTModel(cfg) and attn from an rng seeded
    s hold the same state_dict: the same names in the same order, the
    same shapes, nn.Linear's weights bit for bit, the embeddings' normal_
    within attn_rng_randn's documented few ulps; both generators end in
    the same state;
  - eval mode: logits and the book's calc_loss_batch loss against a float64
    copy of the model (1e-5 relative), every parameter's gradient against
    autograd's (1e-5 relative L2);
  - training mode, drop_rate 0.1: the same dropout masks from the same
    generator state, so the same loss; then 3 AdamW steps as chapter 5
    takes them (lr 4e-4, weight_decay 0.1), each loss within 1e-5;
  - attn_model_save: the book's names, loaded by load_state_dict(strict=True)
    bit for bit and by attn_model_load; `attn generate --weights F` (its
    config from the file's metadata) gives generate_text_simple's greedy ids.
    The book's own state_dict loads with attn_model_load; without its mask
    buffers it is refused.

Usage: test_book_gpt.py LIBATTN.so ATTN_CLI [--seed N]
"""
import argparse
import copy
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

from llms_from_scratch.ch04 import GPTModel, generate_text_simple
from train_ctypes import (ATTN_KERNELS_AUTO, ATTN_KERNELS_REFERENCE, ATTN_OPTIMIZER_ADAMW,
                          AttnError, AttnTrain)

LOGIT_RTOL = 1e-5     # max |attn - float64| / max |float64|
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-5      # ||attn - float64|| / ||float64|| per tensor, the denominator at least
GRAD_FLOOR = 1e-3     # GRAD_FLOOR x the largest gradient norm (W_key.bias's true gradient is
                      # 0: softmax ignores a constant added to a row of scores)
RANDN_TOL = 1e-6      # attn_rng_randn vs torch's vectorised normal_ (attn.h)
TRAIN_LOSS_TOL = 1e-5  # |attn - torch| / max(1, |torch|), float32 against float32
GREEDY_TIE = 1e-4     # a greedy step may differ only where torch's top two are this close


def book_cfg(vocab, qkv_bias, drop_rate):
    return {"vocab_size": vocab, "context_length": 32, "emb_dim": 64, "n_heads": 4,
            "n_layers": 2, "drop_rate": drop_rate, "qkv_bias": qkv_bias}


def batch(np_rng, cfg, b=2):
    t = cfg["context_length"]
    x = np_rng.integers(0, cfg["vocab_size"], size=(b, t), dtype=np.int32)
    y = np_rng.integers(0, cfg["vocab_size"], size=(b, t), dtype=np.int32)
    return x, y


def calc_loss_batch(model, x, y):
    """The book's calc_loss_batch (ch05)."""
    logits = model(torch.tensor(x, dtype=torch.long))
    return F.cross_entropy(logits.flatten(0, 1), torch.tensor(y, dtype=torch.long).flatten()), logits


def make_pair(lib, ctx, cfg, seed):
    """(attn model, its init rng, the book's model) from the same seed."""
    torch.manual_seed(seed)
    tm = GPTModel(cfg)
    init = lib.rng_new(ctx, seed)
    m = lib.model_new_gpt(ctx, init, **cfg)
    return m, init, tm


def check_init(lib, ctx, m, init, tm):
    params = lib.model_params(ctx, m)
    sd = dict(tm.named_parameters())
    names = [n for n, _, _ in params]
    assert names == list(sd.keys()), "parameter names/order:\n%s\n%s" % (names, list(sd.keys()))
    worst = 0.0
    for name, data, _ in params:
        ref = sd[name].detach().numpy()
        assert data.shape == ref.shape, (name, data.shape, ref.shape)
        if name in ("tok_emb.weight", "pos_emb.weight"):
            diff = float(np.max(np.abs(data - ref)))
            assert diff <= RANDN_TOL, "%s differs from torch by %g" % (name, diff)
            worst = max(worst, diff)
        else:
            assert np.array_equal(data, ref), "%s is not bit-identical to torch's" % name
    # the same number of draws: the generators are in the same state
    after = lib.rng_rand(ctx, init, 8)
    assert np.array_equal(after, torch.rand(8).numpy()), "the generators drew differently"
    return worst


def grad_errors(params, tm64):
    named = dict(tm64.named_parameters())
    norms = {n: float(named[n].grad.norm()) for n, _, _ in params}
    floor = GRAD_FLOOR * max(norms.values())
    return {n: float(np.linalg.norm(g.astype(np.float64) - named[n].grad.numpy())) /
            max(norms[n], floor, 1e-30) for n, _, g in params}


def check_eval(lib, ctx, m, tm, np_rng, cfg):
    """Eval-mode logits, loss and gradients against float64."""
    tm64 = copy.deepcopy(tm).double()
    tm64.eval()
    lib.model_set_training(ctx, m, False)
    x, y = batch(np_rng, cfg)
    lib.model_zero_grad(ctx, m)
    loss, logits = lib.model_forward(ctx, m, x, y, cfg["vocab_size"])
    lib.model_backward(ctx, m)
    loss64, logits64 = calc_loss_batch(tm64, x, y)
    loss64.backward()
    logits64 = logits64.detach().numpy()
    logit_err = float(np.max(np.abs(logits - logits64)) / np.max(np.abs(logits64)))
    loss_err = abs(loss - float(loss64)) / abs(float(loss64))
    assert logit_err <= LOGIT_RTOL, "logits differ from float64 by %g" % logit_err
    assert loss_err <= LOSS_RTOL, "loss %r vs float64 %r" % (loss, float(loss64))
    errs = grad_errors(lib.model_params(ctx, m), tm64)
    worst = max(errs, key=errs.get)
    assert errs[worst] <= GRAD_RTOL, "gradient of %s: relative L2 error %g" % (worst, errs[worst])
    return logit_err, loss_err, errs[worst]


def check_training(lib, ctx, cfg, seed, drop_seed, np_rng):
    """drop_rate > 0: one forward with the same masks, then 3 AdamW steps.
    Returns the trained attn model and its rng (the caller frees them)."""
    m, init, tm = make_pair(lib, ctx, cfg, seed)
    drop = lib.rng_new(ctx, drop_seed)
    torch.manual_seed(drop_seed)
    table, count = lib.model_param_table(ctx, m)
    opt = lib.optimizer_new(ctx, table, ATTN_OPTIMIZER_ADAMW, count=count, lr=4e-4,
                            weight_decay=0.1)
    topt = torch.optim.AdamW(tm.parameters(), lr=4e-4, weight_decay=0.1)
    lib.model_set_training(ctx, m, True)
    tm.train()
    losses = []
    try:
        for step in range(3):
            x, y = batch(np_rng, cfg)
            lib.model_zero_grad(ctx, m)
            loss, _ = lib.model_forward(ctx, m, x, y, cfg["vocab_size"], rng=drop, logits=False)
            lib.model_backward(ctx, m)
            lib.optimizer_step(ctx, opt)
            topt.zero_grad()
            tloss, _ = calc_loss_batch(tm, x, y)
            tloss.backward()
            topt.step()
            tloss = float(tloss)
            diff = abs(loss - tloss) / max(1.0, abs(tloss))
            assert diff <= TRAIN_LOSS_TOL, "step %d: loss %r, PyTorch's %r" % (step, loss, tloss)
            losses.append((loss, tloss))
        # the masks drew the same number of values on both sides
        assert np.array_equal(lib.rng_rand(ctx, drop, 4), torch.rand(4).numpy()), \
            "the dropout generators drew differently"
    finally:
        lib.lib.attn_optimizer_free(opt)
        lib.rng_free(drop)
        lib.rng_free(init)
    return m, losses


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode())
    data = blob[8 + n:]
    meta = header.pop("__metadata__")
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        assert info["dtype"] == "F32", (name, info["dtype"])
        tensors[name] = np.frombuffer(data[begin:end], dtype="<f4").reshape(info["shape"])
    return meta, tensors


def write_safetensors(path, tensors):
    """safetensors.torch.save_file's layout for float32 tensors, no metadata."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        b = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def check_torch_file(lib, ctx, cfg, seed, d):
    """The book's own state_dict (its masks included) into attn_model_load;
    without the masks it is refused by name."""
    torch.manual_seed(seed + 2)
    tm = GPTModel(cfg)
    sd = {k: v.detach().numpy() for k, v in tm.state_dict().items()}
    path = os.path.join(d, "book.safetensors")
    write_safetensors(path, sd)
    init = lib.rng_new(ctx, seed)
    m = lib.model_new_gpt(ctx, init, **cfg)
    try:
        lib.check(lib.lib.attn_model_load(m, path.encode()), ctx, "attn_model_load(book)")
        for name, data, _ in lib.model_params(ctx, m):
            assert np.array_equal(data, sd[name]), "loaded from the book's file: %s" % name
        nomask = os.path.join(d, "nomask.safetensors")
        write_safetensors(nomask, {k: v for k, v in sd.items() if not k.endswith(".att.mask")})
        try:
            lib.check(lib.lib.attn_model_load(m, nomask.encode()), ctx, "attn_model_load")
            raise AssertionError("a file without the mask buffers loaded")
        except AttnError as e:
            assert "mask" in str(e), str(e)
    finally:
        lib.lib.attn_model_free(m)
        lib.rng_free(init)


def check_save_generate(lib, ctx, m, cfg, cli, seed, np_rng):
    params = lib.model_params(ctx, m)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        lib.check(lib.lib.attn_model_save(m, path.encode()), ctx, "attn_model_save")
        meta, tensors = read_safetensors(path)
        assert meta["format"] == "attn-gpt", meta
        for k in ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers"):
            assert int(meta[k]) == cfg[k], (k, meta[k], cfg[k])
        assert float(meta["drop_rate"]) == cfg["drop_rate"], meta
        assert meta["qkv_bias"] == ("true" if cfg["qkv_bias"] else "false"), meta
        tm = GPTModel(cfg)
        tm.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in tensors.items()},
                           strict=True)
        sd = tm.state_dict()
        for name, data, _ in params:
            assert np.array_equal(sd[name].numpy(), data), "saved %s" % name

        # attn_model_load into a model drawn from another seed
        other_rng = lib.rng_new(ctx, seed + 1)
        other = lib.model_new_gpt(ctx, other_rng, **cfg)
        try:
            lib.check(lib.lib.attn_model_load(other, path.encode()), ctx, "attn_model_load")
            for (name, a, _), (_, b, _) in zip(params, lib.model_params(ctx, other)):
                assert np.array_equal(a, b), "attn_model_load: %s" % name
        finally:
            lib.lib.attn_model_free(other)
            lib.rng_free(other_rng)
        # ... and not into one of other heads: the shapes alone would allow it
        wrong = dict(cfg, n_heads=2)
        wrong_rng = lib.rng_new(ctx, seed)
        wrong_model = lib.model_new_gpt(ctx, wrong_rng, **wrong)
        try:
            lib.check(lib.lib.attn_model_load(wrong_model, path.encode()), ctx, "attn_model_load")
            raise AssertionError("a 4-head file loaded into a 2-head model")
        except AttnError as e:
            assert "n_heads 4" in str(e), str(e)
        finally:
            lib.lib.attn_model_free(wrong_model)
            lib.rng_free(wrong_rng)

        check_torch_file(lib, ctx, cfg, seed, d)

        # attn generate, greedy, against the book's generate_text_simple
        tm.eval()
        prompt = [int(v) for v in np_rng.integers(0, cfg["vocab_size"], size=6)]
        new = 5
        out = subprocess.run([cli, "generate", "--weights", path, "--prompt-ids",
                              ",".join(map(str, prompt)), "--max-new-tokens", str(new),
                              "--threads", "2"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        got = [int(v) for v in out.stdout.strip().splitlines()[-1].split(",")]
        idx = generate_text_simple(tm, torch.tensor([prompt]), new, cfg["context_length"])
        want = idx[0, len(prompt):].tolist()
        assert len(got) == new, (got, want)
        for i in range(new):
            if got[i] == want[i]:
                continue
            with torch.no_grad():
                logits = tm.double()(torch.tensor([prompt + want[:i]]))[0, -1]
            top = torch.topk(logits, 2).values
            gap = float(top[0] - top[1])
            assert gap < GREEDY_TIE, "greedy token %d: attn %d, the book %d (top-2 gap %g)" % (
                i, got[i], want[i], gap)
            print("    (greedy step %d is a near tie, gap %g: the rest is not compared)"
                  % (i, gap))
            break
        return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("cli")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 31)
    print("test_book_gpt seed %d (replay with --seed %d)" % (seed, seed))
    rng = random.Random(seed)
    np_rng = np.random.default_rng(seed)
    torch.set_num_threads(1)
    lib = AttnTrain(args.lib)
    for vocab, qkv_bias in ((50257, False), (rng.randrange(500, 2000), True)):
        for kernels in (ATTN_KERNELS_REFERENCE, ATTN_KERNELS_AUTO):
            ctx = lib.ctx_new(num_threads=2, kernels=kernels)
            kname = lib.lib.attn_kernels_name(lib.lib.attn_ctx_kernels(ctx)).decode()
            try:
                cfg = book_cfg(vocab, qkv_bias, 0.1)
                m, init, tm = make_pair(lib, ctx, cfg, rng.randrange(2 ** 31))
                try:
                    emb = check_init(lib, ctx, m, init, tm)
                    logit_err, loss_err, grad_err = check_eval(lib, ctx, m, tm, np_rng, cfg)
                finally:
                    lib.lib.attn_model_free(m)
                    lib.rng_free(init)
                print("  %s V=%d qkv_bias=%d: init bitwise (embeddings within %.1e); eval "
                      "logits %.1e, loss %.1e, grads %.1e" % (kname, vocab, qkv_bias, emb,
                                                             logit_err, loss_err, grad_err))
                if kernels == ATTN_KERNELS_REFERENCE:
                    continue
                s = rng.randrange(2 ** 31)
                m, losses = check_training(lib, ctx, cfg, s, rng.randrange(2 ** 31), np_rng)
                try:
                    print("  %s drop_rate 0.1, 3 AdamW steps: losses %s" % (
                        kname, ", ".join("%.6f/%.6f" % p for p in losses)))
                    got = check_save_generate(lib, ctx, m, cfg, args.cli, s, np_rng)
                    print("  saved, loaded strictly into GPTModel and attn_model_load; attn "
                          "generate %s" % got)
                finally:
                    lib.lib.attn_model_free(m)
            finally:
                lib.ctx_free(ctx)
    print("book GPTModel vs attn: all cases pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
