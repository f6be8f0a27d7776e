"""Trains the book's chapter-5 GPTModel, in a small cfg (common.CFG), on
the-verdict, as the book's gpt_train.py does (AdamW, weight decay 0.1,
batch 2, windows of context_length tokens at stride context_length, 90/10
split, torch.manual_seed(123)) but with lr 1e-3, twice the book's, so that
a few epochs on two cores bring the loss well down; and saves it for attn:
the book's state_dict names in safetensors
(build/kv_accuracy/verdict-gpt.safetensors) and its cfg as JSON beside it. kv_accuracy.py measures the KV cache types
on it; its next-token distributions are peaked, which is what gives the
KL divergences there a meaning.

    ATTN_LIBRARY=build/libattn.so .venv/bin/python bench/kv_accuracy/train_verdict.py

The same torch build and thread count (--threads) give the same weights
run after run. At the end attn loads the file and its logits on a
validation window are checked against PyTorch's (eval mode).

--arch mla trains the same model with chapter 4's latent attention instead
(gpt_with_kv_mla.py's GPTModel, common.MLA_CFG), into
build/kv_accuracy/verdict-gpt-mla.safetensors: kv_accuracy.py --model mla
measures its latent cache's types.
"""
import argparse
import os
import sys
import time
import types

import numpy as np
import torch

import common

try:
    import tiktoken  # noqa: F401  (previous_chapters imports it; the tokenizer here is attn's)
except ImportError:
    sys.modules["tiktoken"] = types.ModuleType("tiktoken")
sys.path.insert(0, os.path.join(common.BOOK, "ch05"))
from previous_chapters import GPTDatasetV1, GPTModel  # noqa: E402


class BookTokenizer:
    """tiktoken's encode(text, allowed_special=...) over attn's tokenizer
    (the-verdict holds no special token)."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, allowed_special=()):
        return self.tok.encode(text)


def loss_over(model, loader):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            logits = model(x)
            total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
            count += 1
    model.train()
    return total / max(count, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arch", choices=("gpt", "mla"), default="gpt")
    ap.add_argument("--out", help="default: build/kv_accuracy/verdict-gpt[-mla].safetensors")
    args = ap.parse_args()
    if args.out is None:
        args.out = common.MLA_WEIGHTS if args.arch == "mla" else common.WEIGHTS

    torch.set_num_threads(args.threads)
    torch.manual_seed(123)
    cfg = common.MLA_CFG if args.arch == "mla" else common.CFG
    tok = BookTokenizer(common.tokenizer())
    train_text, val_text = common.text_splits()
    ctx = cfg["context_length"]
    train_set = GPTDatasetV1(train_text, tok, ctx, ctx)
    val_set = GPTDatasetV1(val_text, tok, ctx, ctx)
    train_loader = torch.utils.data.DataLoader(
        train_set, batch_size=2, shuffle=True, drop_last=True,
        generator=torch.Generator().manual_seed(123))
    val_loader = torch.utils.data.DataLoader(val_set, batch_size=2, shuffle=False)

    if args.arch == "mla":
        sys.path.insert(0, common.BOOK)
        from gpt_with_kv_mla import GPTModel as MlaGPTModel
        model = MlaGPTModel(cfg)
    else:
        model = GPTModel(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    print("train: %d windows, validation: %d windows of %d tokens; %d parameters"
          % (len(train_set), len(val_set), ctx, sum(p.numel() for p in model.parameters())))
    print("epoch 0: train loss %.3f, validation loss %.3f"
          % (loss_over(model, train_loader), loss_over(model, val_loader)))
    start = time.time()
    for epoch in range(1, args.epochs + 1):
        for x, y in train_loader:
            optimizer.zero_grad()
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            loss.backward()
            optimizer.step()
        if epoch % 3 == 0 or epoch == args.epochs:
            print("epoch %d: train loss %.3f, validation loss %.3f (%.0f s)"
                  % (epoch, loss_over(model, train_loader), loss_over(model, val_loader),
                     time.time() - start), flush=True)

    # the book's state_dict less the causal-mask buffers (constants, not weights)
    from safetensors.torch import save_file
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not k.endswith(".mask")}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(state, args.out)
    config_path = os.path.splitext(args.out)[0] + ".json"
    common.write_config(config_path, cfg)
    print("saved %s and %s" % (args.out, config_path))

    # attn's logits of the saved file against PyTorch's on a validation window
    attn = common.import_attn()
    model.eval()
    ids = val_set.input_ids[0][None, :]
    with torch.no_grad():
        want = model(ids).numpy()
    got = attn.LanguageModel.load(args.out, config=config_path).forward(ids.numpy().astype(np.int32))
    err = float(np.abs(got - want).max())
    scale = float(np.abs(want).max())
    same_top1 = float((got.argmax(-1) == want.argmax(-1)).mean())
    print("attn vs PyTorch on %d validation tokens: max |logit diff| %.2e (max |logit| %.1f), "
          "argmax equal at %.1f%% of positions" % (ids.shape[1], err, scale, 100 * same_top1))
    if err > 1e-3 * max(scale, 1.0):
        sys.exit("attn's logits differ from PyTorch's: the saved model is not the trained one")


if __name__ == "__main__":
    main()
