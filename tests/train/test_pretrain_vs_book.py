"""`attn pretrain` against the book's own chapter-5 training run
(llms-from-scratch 1.0.19: ch05.train_model_simple with the ch04 GPTModel,
ch02 create_dataloader_v1, tiktoken's gpt2 encoding built offline from
data/gpt2-bpe) on data/the-verdict.txt, on a fresh seed every run:

  1. a small GPTModel (emb 64, 2 layers, 4 heads, context 32, vocab 50257,
     drop_rate 0.1, no qkv_bias), windows of 32 tokens every 128, 3 epochs,
     eval_freq 5, eval_iter 2:
     every "Ep ..." line equal to the book's (a last digit may differ only
     where the book's loss is within LOSS_TOL of a rounding boundary), every
     loss of the run's history (read from its --save state file) within
     LOSS_TOL of the book's, every sample line equal (or, past a greedy
     near tie of the book's model, equal up to it);
  2. the saved model: PyTorch's load_state_dict(strict=True) takes it, and
     `attn generate --weights` gives generate_text_simple's greedy ids;
  3. resume: 2 epochs with --save, then --resume for the third print the
     3-epoch run's lines, and save the same weights, bit for bit;
  4. bad input through the CLI: a one-line error naming the value, a
     nonzero exit and no file left: text shorter than one window, an empty
     validation split, a tokenizer vocabulary that is not the model's, a
     --max-length past the context, --lr 0 / -1 / nan / inf, --save in a
     missing directory; and a loss that turns NaN mid-run (forced by
     resuming the 2-epoch checkpoint with --lr 1e30: the first step's
     update blows the weights up, the next loss is not finite) exits 1
     naming the step and leaves the checkpoint as it was; --resume with
     another --batch-size, --stride or --max-length than the checkpoint's
     is a usage error (exit 2) naming both values, nothing written;
  5. chapter 4's bonus GPTs (../shared/reference/llms-from-scratch, or
     $ATTN_BOOK_REFERENCE; skipped, saying so, where neither is there):
     gpt_with_kv_gqa.py with n_kv_groups 2,
     gpt_with_kv_mla.py with latent_dim 24, gpt_with_kv_swa.py with 3
     layers, windows of 8 on layers 0 and 2), the same run for 2 epochs
     with the script's GPTModel: every evaluation's losses within LOSS_TOL
     of the book's, the lines as in 1; the saved file in the script's
     load_state_dict(strict=True) and in attn generate (greedy, against
     generate_text_simple on the trained script model); 1 epoch + --resume
     for the second gives the same weights bit for bit.

    test_pretrain_vs_book.py ATTN_CLI [--seed N]     (or ATTN_TEST_SEED=N)
"""
import argparse
import contextlib
import copy
import io
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import types

import torch

from test_book_data import gpt2_tiktoken  # tiktoken's gpt2 from data/gpt2-bpe

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")
VERDICT = os.path.join(DATA, "the-verdict.txt")
BPE = os.path.join(DATA, "gpt2-bpe")

CFG = {"vocab_size": 50257, "context_length": 32, "emb_dim": 64, "n_heads": 4,
       "n_layers": 2, "drop_rate": 0.1, "qkv_bias": False}
EPOCHS, EVAL_FREQ, EVAL_ITER, BATCH, LR, WD = 3, 5, 2, 2, 0.0004, 0.1
# Windows of the context's 32 tokens every 128: a quarter of the text's
# tokens per epoch, 18 steps of it, which keeps the test's six epochs of
# a 50257-token head well under a minute (the loop and its draws are the
# same at any stride).
MAX_LENGTH, STRIDE = 32, 128
# The sample's start text names <|endoftext|>, which the book's
# text_to_token_ids encodes as the special token (allowed_special), as the
# training text's: the samples differ from the book's where it is encoded
# as plain text.
START = "Every effort moves<|endoftext|> you"
LOSS_TOL = 1e-4     # |attn - book| for every evaluated loss, float32 training against float32
BOOK_CH04 = os.environ.get("ATTN_BOOK_REFERENCE", os.path.join(
    os.path.dirname(ROOT), "shared", "reference", "llms-from-scratch"))
# chapter 4's bonus GPTs: (name, script, cfg)
VARIANTS = [("GQA", "gpt_with_kv_gqa.py", dict(CFG, n_kv_groups=2)),
            ("MLA", "gpt_with_kv_mla.py", dict(CFG, latent_dim=24)),
            ("SWA", "gpt_with_kv_swa.py", dict(CFG, n_layers=3, sliding_window_size=8,
                                               sliding_window_stride=1))]
VARIANT_EPOCHS = 2
GREEDY_TIE = 1e-4   # a sample may part from the book's only where its top-two logits are this close

FAILED = []


def output_lines(text):
    """text's lines, split at newlines only: a sample may hold a character
    str.splitlines() also splits at (the separators 0x1c-0x1e, NEL, LS)."""
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n") if text else []


def check(cond, what):
    if not cond:
        FAILED.append(what)
        print("FAIL:", what)


def stub_matplotlib():
    """llms_from_scratch.ch05 imports matplotlib for its plot, which this
    test does not draw (and the venv does not have)."""
    if "matplotlib" in sys.modules:
        return
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    mpl = types.ModuleType("matplotlib")
    plt = types.ModuleType("matplotlib.pyplot")
    ticker = types.ModuleType("matplotlib.ticker")
    ticker.MaxNLocator = object
    mpl.pyplot, mpl.ticker = plt, ticker
    sys.modules.update({"matplotlib": mpl, "matplotlib.pyplot": plt, "matplotlib.ticker": ticker})


def script_module(script):
    """A chapter-4 bonus script (gpt_with_kv_*.py) as a module."""
    import importlib.util
    path = os.path.join(BOOK_CH04, script)
    spec = importlib.util.spec_from_file_location(os.path.splitext(script)[0], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def book_run(seed, enc, cfg=CFG, gpt_model=None, epochs=EPOCHS):
    """The book's notebook cell, with this test's config: printed lines,
    the losses, the weights of each sample, the final model. gpt_model:
    the GPTModel class (ch04's by default)."""
    from llms_from_scratch import ch02, ch04, ch05
    ch02.tiktoken.get_encoding = lambda name: enc
    with open(VERDICT, "r", encoding="utf-8") as f:
        text = f.read()
    torch.manual_seed(seed)
    model = (gpt_model or ch04.GPTModel)(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    split = int(0.90 * len(text))
    train_loader = ch02.create_dataloader_v1(text[:split], batch_size=BATCH,
                                             max_length=MAX_LENGTH, stride=STRIDE, drop_last=True,
                                             shuffle=True, num_workers=0)
    val_loader = ch02.create_dataloader_v1(text[split:], batch_size=BATCH,
                                           max_length=MAX_LENGTH, stride=STRIDE, drop_last=False,
                                           shuffle=False, num_workers=0)
    # the weights each sample was drawn from, to look for a near tie only
    # where a sample differs (the book's sampling draws nothing: copying
    # changes no draw)
    snapshots = []
    original = ch05.generate_and_print_sample

    def sample_and_note(model, tokenizer, device, start_context):
        snapshots.append(copy.deepcopy(model.state_dict()))
        original(model, tokenizer, device, start_context)

    ch05.generate_and_print_sample = sample_and_note
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            train_losses, val_losses, tokens = ch05.train_model_simple(
                model, train_loader, val_loader, optimizer, "cpu", num_epochs=epochs,
                eval_freq=EVAL_FREQ, eval_iter=EVAL_ITER, start_context=START, tokenizer=enc)
    finally:
        ch05.generate_and_print_sample = original
    return output_lines(out.getvalue()), train_losses, val_losses, tokens, snapshots, model


def cli(attn, args, **kw):
    r = subprocess.run([attn, "pretrain"] + args, capture_output=True, **kw)
    # decoded by hand: text=True would read a sample's carriage return as a newline
    r.stdout, r.stderr = r.stdout.decode("utf-8"), r.stderr.decode("utf-8")
    return r


def history_from_state(path, n):
    """The run's (tokens_seen, train, val) history, the last block of the
    state file before its checksum: n, then n x (u64, f64, f64)."""
    data = open(path, "rb").read()
    block = data[-8 - 24 * n:-8]
    count = struct.unpack("<Q", data[-16 - 24 * n:-8 - 24 * n])[0]
    assert count == n, (count, n)
    return [struct.unpack("<Qdd", block[24 * i:24 * i + 24]) for i in range(n)]


def rounding_boundary_near(x, tol):
    """True when x is within tol of a value where %.3f changes."""
    scaled = x * 1000.0
    return abs(scaled - (int(scaled) + 0.5)) * 1e-3 <= tol or \
        abs(scaled - (int(scaled) - 0.5)) * 1e-3 <= tol


def near_tie_gap(state, ids, cfg=CFG, gpt_model=None):
    """The gap between the top two logits of the book's model (weights
    state) after ids: where greedy decoding could go either way."""
    from llms_from_scratch.ch04 import GPTModel
    m = (gpt_model or GPTModel)(cfg)
    m.load_state_dict(state)
    m.eval()
    with torch.no_grad():
        logits = m(torch.tensor([ids[-cfg["context_length"]:]]))[0, -1]
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def compare_lines(attn_lines, book_lines, train_losses, val_losses, snapshots, enc, cfg=CFG,
                  gpt_model=None):
    check(len(attn_lines) == len(book_lines),
          "attn printed %d lines, the book %d" % (len(attn_lines), len(book_lines)))
    k = s = 0
    for got, want in zip(attn_lines, book_lines):
        if want.startswith("Ep "):
            if got != want:
                # only a last digit, of a value the book has within LOSS_TOL of
                # a rounding boundary
                pattern = r"(Ep \d+ \(Step \d+\)): Train loss (\S+), Val loss (\S+)$"
                g, w = re.match(pattern, got), re.match(pattern, want)
                ok = bool(g and w and g.group(1) == w.group(1))
                for i, exact in ((2, train_losses[k]), (3, val_losses[k])):
                    if ok and g.group(i) != w.group(i):
                        ok = rounding_boundary_near(exact, LOSS_TOL)
                check(ok, "line %r, the book's %r (losses %.6f, %.6f)" %
                      (got, want, train_losses[k], val_losses[k]))
            k += 1
        else:
            if got != want:
                a = enc.encode(got, allowed_special={"<|endoftext|>"})
                b = enc.encode(want, allowed_special={"<|endoftext|>"})
                first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]),
                             min(len(a), len(b)))
                gap = near_tie_gap(snapshots[s], b[:first], cfg, gpt_model)
                check(gap < GREEDY_TIE,
                      "sample %d: %r, the book's %r (parting at token %d, top-2 gap %g)" %
                      (s, got, want, first, gap))
                if gap < GREEDY_TIE:
                    print("  (sample %d parts from the book's at a near tie, gap %g)" % (s, gap))
            s += 1


def check_generate(attn, weights, book_state, enc, cfg=CFG, gpt_model=None):
    """The saved model in PyTorch (strict) and in `attn generate`."""
    from safetensors.torch import load_file
    from llms_from_scratch.ch04 import GPTModel, generate_text_simple
    m = (gpt_model or GPTModel)(cfg)
    state = load_file(weights)
    missing = m.load_state_dict(state, strict=True)
    check(not missing.missing_keys and not missing.unexpected_keys, "strict load")
    drift = max(float((state[k] - book_state[k]).abs().max()) for k in state)
    m.eval()
    prompt = enc.encode(START, allowed_special={"<|endoftext|>"})
    new = 20
    with torch.no_grad():
        want = generate_text_simple(m, torch.tensor([prompt]), new, cfg["context_length"])[0]
    want = want[len(prompt):].tolist()
    r = subprocess.run([attn, "generate", "--weights", weights, "--prompt-ids",
                        ",".join(map(str, prompt)), "--max-new-tokens", str(new),
                        "--threads", "2"], capture_output=True, text=True)
    check(r.returncode == 0, "attn generate: %s" % r.stderr.strip())
    got = [int(v) for v in r.stdout.strip().splitlines()[-1].split(",")] if r.returncode == 0 else []
    for i in range(min(len(got), len(want))):
        if got[i] != want[i]:
            with torch.no_grad():
                logits = m(torch.tensor([(prompt + want[:i])[-cfg["context_length"]:]]))[0, -1]
            top = torch.topk(logits, 2).values
            gap = float(top[0] - top[1])
            check(gap < GREEDY_TIE, "attn generate token %d: %d, generate_text_simple %d "
                  "(top-2 gap %g)" % (i, got[i], want[i], gap))
            got, want = got[:i], want[:i]
            break
    check(got == want, "attn generate %s, generate_text_simple %s" % (got, want))
    return drift


def bad_inputs(attn, d, cfg_path, ckpt):
    text = os.path.join(d, "in.txt")
    out = os.path.join(d, "out")
    os.mkdir(out)
    with open(VERDICT, "r", encoding="utf-8") as f:
        verdict = f.read()

    def refused(args, pattern, code=None, what=""):
        before = sorted(os.listdir(out))
        r = cli(attn, ["--config", cfg_path, "--tokenizer", BPE, "--save",
                       os.path.join(out, "ck.safetensors")] + args)
        err = r.stderr.strip()
        check(r.returncode != 0 and (code is None or r.returncode == code),
              "%s: exit %d (%s)" % (what, r.returncode, err))
        check(len(err.splitlines()) == 1 and re.search(pattern, err),
              "%s: the error %r should match %r" % (what, err, pattern))
        check(r.stdout == "", "%s: printed %r" % (what, r.stdout[:200]))
        check(sorted(os.listdir(out)) == before, "%s: left %s" % (what, os.listdir(out)))
        print("  %-28s exit %d: %s" % (what, r.returncode, err))

    with open(text, "w") as f:
        f.write("Every effort moves you.")
    refused(["--text", text], r"training text.* 4 tokens.*max_length 32", 2,
            "text shorter than a window")
    with open(text, "w") as f:
        f.write(verdict[:400])
    refused(["--text", text], r"validation text.*\d+ tokens.*max_length 32", 2,
            "empty validation split")
    refused(["--text", VERDICT, "--max-length", "33"], r"max_length 33.*context_length 32", 2,
            "--max-length past the context")
    for lr in ("0", "-1", "nan", "inf"):
        refused(["--text", VERDICT, "--lr", lr], r"--lr.*'%s'" % re.escape(lr), 2, "--lr %s" % lr)
    # text Python's open(encoding="utf-8") refuses: a Latin-1 byte, a surrogate
    for name, blob, at in (("latin1.txt", b"hello caf\xe9 world", 9),
                           ("surrogate.txt", b"ok \xed\xa0\x80 ok", 3)):
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(blob * 200)
        refused(["--text", path], r"'%s' is not UTF-8: byte %d" % (re.escape(path), at), 2,
                "--text not UTF-8 (%s)" % name)
    # a directory: the reason named
    refused(["--text", d], r"cannot read '%s': Is a directory" % re.escape(d), 2,
            "--text a directory")
    # a dropout rate that is not a number, not read as 0
    cfg_bad = os.path.join(d, "cfg_drop.json")
    with open(cfg_bad, "w") as f:
        json.dump(dict(CFG, drop_rate="0.1"), f)
    refused(["--text", VERDICT, "--config", cfg_bad], r'"drop_rate" in .* must be a number', 2,
            "drop_rate a string")
    # the book's cfg reads drop_rate (no default); GPT-2's three rates are one here
    cfg_bad = os.path.join(d, "cfg_nodrop.json")
    with open(cfg_bad, "w") as f:
        json.dump({k: v for k, v in CFG.items() if k != "drop_rate"}, f)
    refused(["--text", VERDICT, "--config", cfg_bad], r'has no "drop_rate"', 2,
            "the book's cfg without drop_rate")
    hf = {"vocab_size": 50257, "n_positions": 32, "n_embd": 64, "n_head": 4, "n_layer": 2,
          "resid_pdrop": 0.1, "attn_pdrop": 0.0}
    cfg_bad = os.path.join(d, "cfg_hf_pdrop.json")
    with open(cfg_bad, "w") as f:
        json.dump(hf, f)
    refused(["--text", VERDICT, "--config", cfg_bad],
            r"attn_pdrop 0 differs from resid_pdrop 0\.1", 2, "GPT-2's attn_pdrop apart")
    # the outputs are none of the inputs: the config, the tokenizer's files, --plot's file
    refused(["--text", VERDICT, "--save", cfg_path], r"--save: .* is the input --config", 2,
            "--save onto --config")
    bpe_copy = os.path.join(d, "bpe")  # a copy: a regression must not spoil the real files
    shutil.copytree(BPE, bpe_copy)
    refused(["--text", VERDICT, "--tokenizer", bpe_copy, "--save",
             os.path.join(bpe_copy, "encoder.json")],
            r"--save: .* is the input --tokenizer", 2, "--save onto the tokenizer")
    png = os.path.join(out, "same.png")
    refused(["--text", VERDICT, "--save", png, "--plot", png], r"--plot: .* is also written by "
            r"--save", 2, "--plot onto --save")
    refused(["--text", VERDICT, "--epochs", "0", "--plot", os.path.join(out, "p.png")],
            r"--plot: --epochs 0 trains nothing to plot", 2, "--plot with --epochs 0")
    small = os.path.join(d, "vocab.json")
    with open(small, "w") as f:
        json.dump(dict(CFG, vocab_size=50000), f)
    r = cli(attn, ["--config", small, "--tokenizer", BPE, "--text", VERDICT])
    check(r.returncode == 2 and re.search(r"50257.*50000", r.stderr),
          "vocabulary mismatch: exit %d %r" % (r.returncode, r.stderr))
    print("  %-28s exit %d: %s" % ("tokenizer vocab mismatch", r.returncode, r.stderr.strip()))
    missing = os.path.join(d, "no", "such", "ck.safetensors")
    r = cli(attn, ["--config", cfg_path, "--tokenizer", BPE, "--text", VERDICT, "--save",
                   missing])
    check(r.returncode == 1 and "ck.safetensors" in r.stderr and
          len(r.stderr.strip().splitlines()) == 1 and not os.path.exists(os.path.join(d, "no")),
          "--save in a missing directory: exit %d %r" % (r.returncode, r.stderr))
    print("  %-28s exit %d: %s" % ("--save, missing directory", r.returncode, r.stderr.strip()))

    # NaN mid-run: the 2-epoch checkpoint resumed with an absurd lr
    nan_ck = os.path.join(out, "nan.safetensors")
    shutil.copy(ckpt, nan_ck)
    shutil.copy(ckpt + ".state", nan_ck + ".state")
    before = {p: open(os.path.join(out, p), "rb").read() for p in os.listdir(out)}
    r = cli(attn, ["--resume", nan_ck, "--tokenizer", BPE, "--text", VERDICT, "--epochs", "3",
                   "--eval-iter", str(EVAL_ITER), "--max-length", str(MAX_LENGTH), "--stride",
                   str(STRIDE), "--lr", "1e30", "--save", nan_ck])
    err = r.stderr.strip()
    check(r.returncode == 1 and re.fullmatch(r"attn: pretrain: step \d+: loss is (nan|inf|-inf)",
                                             err), "NaN mid-run: exit %d %r" % (r.returncode, err))
    after = {p: open(os.path.join(out, p), "rb").read() for p in os.listdir(out)}
    check(after == before, "NaN mid-run: the checkpoint changed (%s)" % sorted(after))
    print("  %-28s exit %d: %s" % ("loss NaN mid-run", r.returncode, err))

    # a checkpoint of other --batch-size, --stride or --max-length values: a
    # usage error (exit 2) naming the value and the checkpoint's, nothing written
    other = os.path.join(out, "other.safetensors")
    for flag, value, name, saved in (("--batch-size", "3", "batch_size", BATCH),
                                     ("--stride", "64", "stride", STRIDE),
                                     ("--max-length", "16", "max_length", MAX_LENGTH)):
        args = {"--batch-size": str(BATCH), "--stride": str(STRIDE),
                "--max-length": str(MAX_LENGTH)}
        args[flag] = value
        r = cli(attn, ["--resume", nan_ck, "--tokenizer", BPE, "--text", VERDICT, "--epochs",
                       "3", "--eval-iter", str(EVAL_ITER), "--save", other] +
                [a for kv in args.items() for a in kv])
        err = r.stderr.strip()
        check(r.returncode == 2 and len(err.splitlines()) == 1 and
              re.search(r"^attn: --resume: .*the checkpoint's %s is %d, this run's %s$" %
                        (name, saved, value), err) is not None and r.stdout == "",
              "--resume with %s %s: exit %d %r" % (flag, value, r.returncode, err))
        after = {p: open(os.path.join(out, p), "rb").read() for p in os.listdir(out)}
        check(after == before, "--resume with %s %s: files changed (%s)" %
              (flag, value, sorted(after)))
        print("  %-28s exit %d: %s" % ("--resume, other " + flag, r.returncode, err))

    # the resumed checkpoint's two files are inputs: no output but --save FILE
    # of --resume FILE itself replaces them
    png_link = os.path.join(out, "ck-link.png")
    os.symlink(os.path.basename(nan_ck), png_link)
    for extra, pattern, what in (
            (["--plot", png_link], r"--plot: .* is the input --resume's model", "--plot onto "
             "--resume"),
            (["--save", nan_ck + ".state"], r"--save: .* is the input --resume's state",
             "--save onto --resume's state")):
        r = cli(attn, ["--resume", nan_ck, "--tokenizer", BPE, "--text", VERDICT, "--epochs",
                       "3", "--eval-iter", str(EVAL_ITER), "--max-length", str(MAX_LENGTH),
                       "--stride", str(STRIDE)] + extra)
        err = r.stderr.strip()
        check(r.returncode == 2 and re.search(pattern, err) is not None,
              "%s: exit %d %r" % (what, r.returncode, err))
        after = {p: open(os.path.join(out, p), "rb").read() for p in os.listdir(out)}
        check(after == dict(before, **{"ck-link.png": before[os.path.basename(nan_ck)]}),
              "%s: the checkpoint changed" % what)
        print("  %-28s exit %d: %s" % (what, r.returncode, err))
    os.remove(png_link)


def pretrain_args(cfg_path, seed):
    """attn pretrain's options of every run here but --save and --epochs."""
    return ["--config", cfg_path, "--tokenizer", BPE, "--text", VERDICT,
            "--eval-iter", str(EVAL_ITER), "--eval-freq", str(EVAL_FREQ),
            "--max-length", str(MAX_LENGTH), "--stride", str(STRIDE),
            "--seed", str(seed), "--threads", "2", "--sample", START]


def variant_runs(attn, d, seed, enc):
    """Chapter 4's bonus GPTs trained by attn pretrain and by the book's
    loop on the script's GPTModel, from the same seed."""
    if not os.path.isdir(BOOK_CH04):
        # as book_modules_vs_torch: the scripts are not on PyPI; test_train,
        # cli_pretrain_config and pretrain_python still train the variants
        print("SKIP chapter 4's bonus GPTs: their scripts are not in %s (ATTN_BOOK_REFERENCE "
              "names llms-from-scratch's ch04 scripts: gpt_with_kv_gqa.py, ...)" % BOOK_CH04)
        return
    for name, script, cfg in VARIANTS:
        gpt_model = script_module(script).GPTModel
        cfg_path = os.path.join(d, "cfg_%s.json" % name)
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        common = pretrain_args(cfg_path, seed)
        full = os.path.join(d, "%s.safetensors" % name)
        p_full = subprocess.Popen([attn, "pretrain"] + common +
                                  ["--epochs", str(VARIANT_EPOCHS), "--save", full],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        book_lines, train_losses, val_losses, tokens, snapshots, model = book_run(
            seed, enc, cfg, gpt_model, VARIANT_EPOCHS)
        out, err = (text.decode("utf-8") for text in p_full.communicate())
        check(p_full.returncode == 0, "%s: attn pretrain: exit %d %s" %
              (name, p_full.returncode, err))
        if p_full.returncode != 0:
            continue
        attn_lines = output_lines(out)
        compare_lines(attn_lines, book_lines, train_losses, val_losses, snapshots, enc, cfg,
                      gpt_model)
        hist = history_from_state(full + ".state", len(train_losses))
        worst = 0.0
        for i, (t, a_train, a_val) in enumerate(hist):
            check(t == tokens[i], "%s: eval %d: tokens seen %d, the book's %d" %
                  (name, i, t, tokens[i]))
            worst = max(worst, abs(a_train - train_losses[i]), abs(a_val - val_losses[i]))
        check(worst <= LOSS_TOL, "%s: the losses part from the book's by %.3g" % (name, worst))
        drift = check_generate(attn, full, model.state_dict(), enc, cfg, gpt_model)

        first = os.path.join(d, "%s-first.safetensors" % name)
        resumed = os.path.join(d, "%s-resumed.safetensors" % name)
        r1 = cli(attn, common + ["--epochs", "1", "--save", first])
        r2 = cli(attn, ["--resume", first] + common[2:] +
                 ["--epochs", str(VARIANT_EPOCHS), "--save", resumed])
        check(r1.returncode == 0 and r2.returncode == 0,
              "%s: 1 epoch + resume: exit %d, %d: %s %s" % (name, r1.returncode, r2.returncode,
                                                           r1.stderr, r2.stderr))
        check(output_lines(r1.stdout) + output_lines(r2.stdout) == attn_lines,
              "%s: 1 epoch + resume printed other lines than %d epochs" % (name, VARIANT_EPOCHS))
        check(os.path.exists(resumed) and
              open(resumed, "rb").read() == open(full, "rb").read(),
              "%s: the resumed run's weights differ" % name)
        print("  %s (%s): %d lines, %d evaluations within %.2g of the book's; the saved model "
              "in load_state_dict(strict=True) and attn generate (weights within %.2g); "
              "resume bit for bit" % (name, script, len(attn_lines), len(hist), worst, drift))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cli")
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed
    if seed is None and os.environ.get("ATTN_TEST_SEED"):
        seed = int(os.environ["ATTN_TEST_SEED"])
    if seed is None:
        seed = random.SystemRandom().randrange(2 ** 31)
    print("test_pretrain_vs_book seed %d (replay with --seed %d or ATTN_TEST_SEED=%d)"
          % (seed, seed, seed))
    torch.set_num_threads(1)
    stub_matplotlib()
    enc = gpt2_tiktoken()
    attn = args.cli

    d = tempfile.mkdtemp(prefix="attn_pretrain_")
    try:
        cfg_path = os.path.join(d, "cfg.json")
        with open(cfg_path, "w") as f:
            json.dump(CFG, f)
        common = pretrain_args(cfg_path, seed)
        full = os.path.join(d, "full.safetensors")
        first = os.path.join(d, "first.safetensors")
        resumed = os.path.join(d, "resumed.safetensors")
        # the attn runs, started first so they overlap the book's
        p_full = subprocess.Popen([attn, "pretrain"] + common + ["--epochs", "3", "--save", full],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        book_lines, train_losses, val_losses, tokens, snapshots, model = book_run(seed, enc)
        out, err = (text.decode("utf-8") for text in p_full.communicate())
        check(p_full.returncode == 0, "attn pretrain: exit %d %s" % (p_full.returncode, err))
        check(err == "", "stderr (not a terminal) should be empty: %r" % err[:200])
        attn_lines = output_lines(out)
        compare_lines(attn_lines, book_lines, train_losses, val_losses, snapshots, enc)
        hist = history_from_state(full + ".state", len(train_losses))
        worst = 0.0
        for i, (t, a_train, a_val) in enumerate(hist):
            check(t == tokens[i], "eval %d: tokens seen %d, the book's %d" % (i, t, tokens[i]))
            worst = max(worst, abs(a_train - train_losses[i]), abs(a_val - val_losses[i]))
        check(worst <= LOSS_TOL, "the losses part from the book's by %.3g" % worst)
        print("  3 epochs: %d lines as the book prints them; the %d evaluations' losses within "
              "%.2g of the book's" % (len(attn_lines), len(hist), worst))
        for line in book_lines[:2] + [l for l in book_lines if not l.startswith("Ep ")][-1:]:
            print("    " + line)

        drift = check_generate(attn, full, model.state_dict(), enc)
        print("  the saved model: load_state_dict(strict=True); attn generate's greedy ids "
              "= generate_text_simple's (weights within %.2g of the book's run)" % drift)

        r1 = cli(attn, common + ["--epochs", "2", "--save", first])
        r2 = cli(attn, ["--resume", first] + common[2:] + ["--epochs", "3", "--save", resumed])
        check(r1.returncode == 0 and r2.returncode == 0,
              "2 epochs + resume: exit %d, %d: %s %s" % (r1.returncode, r2.returncode,
                                                         r1.stderr, r2.stderr))
        split_lines = output_lines(r1.stdout) + output_lines(r2.stdout)
        check(split_lines == attn_lines, "2 epochs + resume printed other lines than 3 epochs")
        check(open(resumed, "rb").read() == open(full, "rb").read(),
              "the resumed run's weights differ from the 3-epoch run's")
        check(open(resumed + ".state", "rb").read() == open(full + ".state", "rb").read(),
              "the resumed run's state differs from the 3-epoch run's")
        print("  2 epochs + --resume for the third: the same %d lines, weights and state "
              "bit for bit" % len(split_lines))

        bad_inputs(attn, d, cfg_path, first)
        variant_runs(attn, d, seed, enc)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if FAILED:
        print("%d checks failed (seed %d)" % (len(FAILED), seed))
        return 1
    print("attn pretrain vs the book: all cases pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
