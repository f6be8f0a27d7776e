"""attn.pretrain (the Python binding of attn_pretrain_*) against `attn
pretrain`, whose lines pretrain_vs_book holds to the book's own run: on a
fresh seed each run, a small GPTModel, chapter 4's three bonus GPTModels
(n_kv_groups, latent_dim None, windows on every layer) and a small
Llama3Model on data/the-verdict.txt give, through Python, the command's printed lines
(verbose), the same history (train_model_simple's three lists), the same
samples and a saved model `attn generate` reads; resume= continues a saved
run to the history of the run never stopped; bad arguments raise naming
the value.

    test_pretrain_python.py LIBATTN ATTN_CLI [--seed N]
"""
import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "data")
GPT = {"vocab_size": 50257, "context_length": 32, "emb_dim": 64, "n_heads": 4, "n_layers": 2,
       "drop_rate": 0.1, "qkv_bias": False}
LLAMA = {"vocab_size": 50257, "context_length": 32, "emb_dim": 64, "n_heads": 4,
         "n_layers": 2, "hidden_dim": 128, "n_kv_groups": 2, "rope_base": 500000.0,
         "rope_freq": None}
# chapter 4's bonus GPTs (gpt_with_kv_gqa.py, _mla.py, _swa.py)
BONUS = [("GQA GPTModel", dict(GPT, n_kv_groups=2)),
         ("MLA GPTModel", dict(GPT, latent_dim=None)),
         ("SWA GPTModel", dict(GPT, sliding_window_size=8, sliding_window_stride=-1))]
OPTS = ["--epochs", "2", "--stride", "128", "--eval-freq", "5", "--eval-iter", "2"]
failed = 0


def check(cond, what):
    global failed
    if not cond:
        failed += 1
    print("ok  " if cond else "FAIL", what)


def output_lines(text):
    """text's lines, split at newlines only: a sample may hold a character
    str.splitlines() also splits at (the separators 0x1c-0x1e, NEL, LS)."""
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n") if text else []


def cli_lines(cli, cfg, seed, tmp, extra=()):
    path = os.path.join(tmp, "cfg.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    r = subprocess.run([cli, "pretrain", "--config", path, "--text",
                        os.path.join(DATA, "the-verdict.txt"), "--tokenizer",
                        os.path.join(DATA, "gpt2-bpe"), "--seed", str(seed), "--threads", "2",
                        *OPTS, *extra], capture_output=True)
    if r.returncode != 0:
        sys.exit("attn pretrain failed: " + r.stderr.decode("utf-8", "replace"))
    # decoded by hand: text=True would read a sample's carriage return as a newline
    return output_lines(r.stdout.decode("utf-8"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("cli")
    ap.add_argument("--seed", type=int)
    a = ap.parse_args()
    os.environ["ATTN_LIBRARY"] = a.lib
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import attn

    seed = a.seed if a.seed is not None else \
        int(os.environ.get("ATTN_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    print("seed", seed, "(--seed or ATTN_TEST_SEED to repeat)")
    with open(os.path.join(DATA, "the-verdict.txt"), encoding="utf-8") as f:
        text = f.read()
    kw = dict(epochs=2, stride=128, eval_freq=5, eval_iter=2, seed=seed, num_threads=2)
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in [("GPTModel", GPT)] + BONUS + [("Llama3Model", LLAMA)]:
            want = cli_lines(a.cli, cfg, seed, tmp)
            out, events = io.StringIO(), []
            with contextlib.redirect_stdout(out):
                run = attn.pretrain(cfg, text, os.path.join(DATA, "gpt2-bpe"), verbose=True,
                                    on_event=events.append, **kw)
            got = output_lines(out.getvalue())
            check(got == want, f"{name}: attn.pretrain prints attn pretrain's {len(want)} lines")
            train, val, tokens = run
            evals = [line for line in want if line.startswith("Ep ")]
            shown = ["Ep %d (Step %06d): Train loss %.3f, Val loss %.3f" %
                     (e["epoch"], e["step"], e["train_loss"], e["val_loss"])
                     for e in events if e["kind"] == "eval"]
            check(shown == evals and len(train) == len(evals) == len(val) == len(tokens),
                  f"{name}: the history has one entry per printed evaluation ({len(evals)})")
            check(["%.3f" % x for x in train] == [line.split()[6].rstrip(",") for line in evals],
                  f"{name}: train_losses are the printed ones")
            steps = [e for e in events if e["kind"] == "step"]
            check(tokens == [e["tokens_seen"] for e in events if e["kind"] == "eval"] and
                  steps[-1]["tokens_seen"] == len(steps) * 2 * 32,
                  f"{name}: tokens_seen counts 2 x 32 tokens a step ({len(steps)} steps)")
            check(run.samples == [line for line in want if not line.startswith("Ep ")] or
                  [s.replace("\n", " ") for s in run.samples] ==
                  [line for line in want if not line.startswith("Ep ")],
                  f"{name}: the samples")
            check(len(run.epochs_seen) == len(train) and run.epochs_seen[-1] == 2.0,
                  f"{name}: epochs_seen is linspace(0, epochs, n)")

            saved = os.path.join(tmp, name + ".safetensors")
            one = attn.pretrain(cfg, text, os.path.join(DATA, "gpt2-bpe"),
                                **dict(kw, epochs=1))
            one.save(saved)
            check(os.path.exists(saved) and os.path.exists(saved + ".state"),
                  f"{name}: save writes the model and its .state")
            resumed = attn.pretrain(cfg, text, os.path.join(DATA, "gpt2-bpe"), resume=saved,
                                    **kw)
            check(list(resumed) == list(run),
                  f"{name}: 1 epoch + resume= gives the 2-epoch history, bit for bit")
            # a run resumed past its epochs would train nothing; one with another
            # dropout rate would draw other masks than the run it continues
            tries = [(dict(kw, epochs=1), "has finished 1 epoch, so it trains nothing")]
            if "drop_rate" in cfg:
                tries.append((dict(kw), "drop_rate"))
            for i, (args, words) in enumerate(tries):
                c = dict(cfg, drop_rate=cfg["drop_rate"] + 0.05) if i else cfg
                try:
                    attn.pretrain(c, text, os.path.join(DATA, "gpt2-bpe"), resume=saved, **args)
                    err = None
                except (ValueError, attn.AttnError) as e:
                    err = str(e)
                check(err is not None and words in err,
                      f"{name}: resume= refused ({words}): {err!r}")
            r = subprocess.run([a.cli, "generate", "--weights", saved, "--prompt-ids",
                                "6109,3626,6100,345", "--max-new-tokens", "5"],
                               capture_output=True, text=True)
            check(r.returncode == 0 and len(r.stdout.strip().split(",")) == 5,
                  f"{name}: attn generate reads the saved model")

    bpe = os.path.join(DATA, "gpt2-bpe")
    for args, kind, words in ((dict(lr=0.0), ValueError, "lr"),
                              (dict(lr=float("nan")), ValueError, "lr"),
                              (dict(epochs=-1), ValueError, "epochs"),
                              (dict(batch_size=1.5), TypeError, "batch_size"),
                              (dict(bernoulli="urandom"), ValueError, "bernoulli"),
                              # a NUL would end the C string there (it sampled from less)
                              (dict(start_context="Every\0 effort"), ValueError,
                               "NUL at character 5"),
                              (dict(start_context="Every \ud800"), ValueError,
                               "character 6 is a lone surrogate (U+D800)"),
                              # UTF-8 holds no surrogate (it trained on CESU-8 bytes)
                              (dict(text=text[:100] + "\udfff" + text[100:]), ValueError,
                               "character 100 is a lone surrogate (U+DFFF)")):
        try:
            args = dict(args)
            attn.pretrain(GPT, args.pop("text", text), bpe, **args)
            check(False, f"{args} raises {kind.__name__}")
        except kind as err:
            check(words in str(err), f"{args}: {kind.__name__} naming {words}: {err}")
    for cfg, kind, words in ((dict(GPT, n_kv_groups=3), attn.AttnError,
                              "n_kv_groups (3) must be a positive divisor of n_heads (4)"),
                             (dict(GPT, n_kv_groups=0), ValueError, "config['n_kv_groups']"),
                             (dict(GPT, latent_dim=0), ValueError, "config['latent_dim']"),
                             (dict(GPT, sliding_window_stride=1), ValueError,
                              "sliding_window_stride'] without"),
                             (dict(GPT, sliding_window_size=4), ValueError,
                              "needs config['sliding_window_stride']"),
                             (dict(GPT, sliding_window_size=4, sliding_window_stride=1,
                                   latent_dim=8), ValueError, "one or the other"),
                             (dict(LLAMA, sliding_window_size=4, sliding_window_stride=1),
                              ValueError, "no sliding window")):
        try:
            attn.pretrain(cfg, text, bpe, epochs=0)
            check(False, f"{cfg} raises {kind.__name__}")
        except kind as err:
            check(words in str(err), f"{cfg}: {kind.__name__} naming {words}: {err}")
    try:
        attn.pretrain(GPT, "too short", bpe)
        check(False, "a text shorter than a window raises")
    except attn.AttnError as err:
        check("windows" in str(err) and "32" in str(err), f"a short text: {err}")
    try:
        attn.pretrain(dict(GPT, vocab_size=50000), text, bpe)
        check(False, "a tokenizer of another vocabulary raises")
    except attn.AttnError as err:
        check("50000" in str(err) and "50257" in str(err), f"a vocabulary mismatch: {err}")
    print("%d failed" % failed)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
