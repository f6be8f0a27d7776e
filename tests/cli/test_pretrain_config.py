#!/usr/bin/python3
"""attn pretrain --config: the dropout rates come from the config's top
level, read as the library reads the rest of the config (the last of
duplicate keys, as Python's json.load), never from a nested object:

    /usr/bin/python3 tests/cli/test_pretrain_config.py path/to/attn

Each config trains a tiny GPTModel for one epoch with --save; the rate it
trained with is the checkpoint's "drop_rate" metadata:
  a. the book's cfg with {"extra": {"drop_rate": 0.9}} and a top-level
     drop_rate 0.0: 0.0;
  b. the book's cfg with drop_rate twice at the top level, 0.9 then 0.0,
     and n_heads twice, 4 then 2: 0.0 and 2 heads, the last of each;
  c. GPT-2's config with resid_pdrop 0.5 (and attn_pdrop, embd_pdrop) only
     in a nested object: GPT2Config's default 0.1;
  d. a string drop_rate nested, a number at the top level: trains.
Ends with "N passed, N failed".
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")

passed = failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s%s" % (what, ("\n      " + detail) if detail else ""))
    return ok


def metadata(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)).get("__metadata__", {})


def pretrain(attn, cfg, text, save):
    """One epoch of attn pretrain on cfg, saved to save."""
    return subprocess.run([attn, "pretrain", "--config", cfg, "--text", text,
                           "--tokenizer", os.path.join(DATA, "gpt2-bpe"), "--epochs", "1",
                           "--max-length", "8", "--stride", "8", "--sample", "",
                           "--threads", "1", "--save", save],
                          capture_output=True, text=True, timeout=120)


def main():
    attn = os.path.abspath(sys.argv[1])
    book = '"vocab_size": 50257, "context_length": 8, "emb_dim": 8, "n_layers": 1, ' \
           '"qkv_bias": false'
    gpt2 = '"vocab_size": 50257, "n_positions": 8, "n_embd": 8, "n_head": 2, "n_layer": 1'
    cases = [
        ("nested drop_rate", '{%s, "n_heads": 2, "extra": {"drop_rate": 0.9}, '
                             '"drop_rate": 0.0}' % book, 0.0, "2"),
        ("duplicate keys", '{%s, "drop_rate": 0.9, "n_heads": 4, "drop_rate": 0.0, '
                           '"n_heads": 2}' % book, 0.0, "2"),
        ("GPT-2 rates nested", '{%s, "task_specific_params": {"resid_pdrop": 0.5, '
                               '"attn_pdrop": 0.5, "embd_pdrop": 0.5}}' % gpt2, 0.1, "2"),
        ("nested string", '{"extra": {"drop_rate": "0.9"}, %s, "n_heads": 2, '
                          '"drop_rate": 0.25}' % book, 0.25, "2"),
    ]
    with tempfile.TemporaryDirectory() as work:
        text = os.path.join(work, "text.txt")
        with open(os.path.join(DATA, "the-verdict.txt"), encoding="utf-8") as f:
            head = f.read()[:3000]
        with open(text, "w", encoding="utf-8") as f:
            f.write(head)
        for i, (what, config, rate, heads) in enumerate(cases):
            cfg = os.path.join(work, "cfg%d.json" % i)
            with open(cfg, "w") as f:
                f.write(config)
            save = os.path.join(work, "m%d.safetensors" % i)
            r = pretrain(attn, cfg, text, save)
            if not check(r.returncode == 0 and os.path.exists(save), "%s: trains" % what,
                         "rc=%s stderr=%r" % (r.returncode, r.stderr[:300])):
                continue
            meta = metadata(save)
            check(float(meta.get("drop_rate", "nan")) == rate,
                  "%s: drop_rate %s, not %s" % (what, rate, meta.get("drop_rate")))
            check(meta.get("n_heads") == heads,
                  "%s: n_heads %s, not %s" % (what, heads, meta.get("n_heads")))
        # chapter 4's bonus GPTs generate but do not pretrain: refused by name,
        # not trained as the plain GPTModel with their keys dropped
        variants = [("GQA", '{%s, "n_heads": 2, "drop_rate": 0.0, "n_kv_groups": 1}' % book,
                     "grouped-query attention"),
                    ("MLA", '{%s, "n_heads": 2, "drop_rate": 0.0, "latent_dim": 4}' % book,
                     "latent attention"),
                    ("SWA", '{%s, "n_heads": 2, "drop_rate": 0.0, "sliding_window_size": 3, '
                            '"sliding_window_stride": 1}' % book, "sliding windows")]
        for i, (what, config, named) in enumerate(variants):
            cfg = os.path.join(work, "variant%d.json" % i)
            with open(cfg, "w") as f:
                f.write(config)
            save = os.path.join(work, "v%d.safetensors" % i)
            r = pretrain(attn, cfg, text, save)
            check(r.returncode == 2 and named in r.stderr and not os.path.exists(save),
                  "%s: refused naming %s" % (what, named),
                  "rc=%s stderr=%r" % (r.returncode, r.stderr[:300]))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
