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
Chapter 4's bonus GPTs train as their scripts' GPTModel: each cfg below
trains one epoch, its checkpoint's metadata holds the variant's keys as the
cfg has them (latent_dim None as null, the stride's sign kept), its tensors
are the script's state_dict (GQA's out_proj without bias, MLA's W_DKV, no
mask buffers, which only ch04's GPTModel keeps), and `attn generate
--weights` runs it; a cfg with windows and n_kv_groups, and n_kv_groups that
do not divide n_heads, are refused naming the values, nothing saved; so is a
Llama 3 cfg with a window (attn generate --config would window the model the
book's Llama3Model trains without one), n_kv_groups null, named as null, and a
stride that is not an integer, named with its value or type. --resume of the
SWA checkpoint with its window edited in the metadata is refused, naming the
window the state saved; the unedited checkpoint resumes.
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


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def metadata(path):
    return header(path).get("__metadata__", {})


def tensor_names(path):
    return sorted(k for k in header(path) if k != "__metadata__")


def pretrain(attn, cfg, text, save):
    """One epoch of attn pretrain on cfg, saved to save."""
    return subprocess.run([attn, "pretrain", "--config", cfg, "--text", text,
                           "--tokenizer", os.path.join(DATA, "gpt2-bpe"), "--epochs", "1",
                           "--max-length", "8", "--stride", "8", "--sample", "",
                           "--threads", "1", "--save", save],
                          capture_output=True, text=True, timeout=120)


def pretrain_config(attn, work, tag, config, text):
    """attn pretrain on the config text written to work/tag.json, saving to
    work/tag.safetensors: (the run, the save path)."""
    cfg = os.path.join(work, tag + ".json")
    with open(cfg, "w") as f:
        f.write(config)
    save = os.path.join(work, tag + ".safetensors")
    return pretrain(attn, cfg, text, save), save


def trained(r, save, what):
    """Whether run r trained and saved (a failed check otherwise)."""
    return check(r.returncode == 0 and os.path.exists(save), "%s: trains" % what,
                 "rc=%s stderr=%r" % (r.returncode, r.stderr[:300]))


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
            r, save = pretrain_config(attn, work, "m%d" % i, config, text)
            if not trained(r, save, what):
                continue
            meta = metadata(save)
            check(float(meta.get("drop_rate", "nan")) == rate,
                  "%s: drop_rate %s, not %s" % (what, rate, meta.get("drop_rate")))
            check(meta.get("n_heads") == heads,
                  "%s: n_heads %s, not %s" % (what, heads, meta.get("n_heads")))
        # chapter 4's bonus GPTs: (what, extra cfg keys, metadata they save as,
        # a tensor the script's state_dict has, one it has not)
        base = '{%s, "n_heads": 2, "drop_rate": 0.0' % book
        variants = [
            ("GQA", '"n_kv_groups": 1', {"n_kv_groups": "1"}, "trf_blocks.0.att.W_key.weight",
             "trf_blocks.0.att.out_proj.bias"),
            ("MLA", '"latent_dim": 4', {"latent_dim": "4"}, "trf_blocks.0.att.W_DKV.weight",
             "trf_blocks.0.att.W_key.weight"),
            ("MLA None", '"latent_dim": null', {"latent_dim": "null"},
             "trf_blocks.0.att.W_UV.weight", "trf_blocks.0.att.mask"),
            ("SWA", '"sliding_window_size": 3, "sliding_window_stride": 1',
             {"sliding_window_size": "3", "sliding_window_stride": "1"},
             "trf_blocks.0.att.out_proj.bias", "trf_blocks.0.att.mask"),
            ("SWA every layer", '"sliding_window_size": 3, "sliding_window_stride": -1',
             {"sliding_window_size": "3", "sliding_window_stride": "-1"},
             "trf_blocks.0.att.W_key.weight", "trf_blocks.0.att.mask"),
            ("SWA no layer", '"sliding_window_size": 3, "sliding_window_stride": 0',
             {"sliding_window_size": "3", "sliding_window_stride": "0"},
             "trf_blocks.0.att.W_key.weight", "trf_blocks.0.att.mask")]
        for i, (what, keys, meta_want, has, lacks) in enumerate(variants):
            r, save = pretrain_config(attn, work, "v%d" % i, '%s, %s}' % (base, keys), text)
            if not trained(r, save, what):
                continue
            meta = metadata(save)
            got = {k: meta.get(k) for k in meta_want}
            check(got == meta_want and meta.get("format") == "attn-gpt",
                  "%s: metadata %s, not %s" % (what, got, meta_want))
            names = tensor_names(save)
            check(has in names and lacks not in names,
                  "%s: tensors %s should hold %s and not %s" % (what, names, has, lacks))
            g = subprocess.run([attn, "generate", "--weights", save, "--prompt-ids", "1,2,3",
                                "--max-new-tokens", "3", "--threads", "1"],
                               capture_output=True, text=True, timeout=120)
            check(g.returncode == 0 and len(g.stdout.strip().splitlines()[-1].split(",")) >= 3,
                  "%s: attn generate --weights" % what,
                  "rc=%s stderr=%r" % (g.returncode, g.stderr[:300]))
        # --resume makes the model as the checkpoint's metadata says: a window
        # edited there (the same length, the tensors in place) agrees with
        # the tensors and the state's hash of them; the state keeps the
        # run's and refuses it by name (before, the run went on windowed
        # otherwise). The unedited pair resumes.
        swa = os.path.join(work, "v3.safetensors")
        if os.path.exists(swa):
            with open(swa, "rb") as f:
                raw = f.read()
            edited = raw.replace(b'"sliding_window_size":"3"', b'"sliding_window_size":"2"', 1)
            check(edited != raw, "SWA: the metadata holds sliding_window_size \"3\"")
            copy = os.path.join(work, "edited.safetensors")
            with open(copy, "wb") as f:
                f.write(edited)
            with open(swa + ".state", "rb") as f, open(copy + ".state", "wb") as g:
                g.write(f.read())
            for path, code, named in [
                    (copy, 2, "saved with sliding_window_size 3, this run's model has 2"),
                    (swa, 0, "")]:
                r = subprocess.run([attn, "pretrain", "--resume", path, "--text", text,
                                    "--tokenizer", os.path.join(DATA, "gpt2-bpe"),
                                    "--epochs", "2", "--max-length", "8", "--stride", "8",
                                    "--sample", "", "--threads", "1"],
                                   capture_output=True, text=True, timeout=120)
                check(r.returncode == code and named in r.stderr and
                      (code == 0 or len(r.stderr.strip().splitlines()) == 1),
                      "SWA: --resume %s: exit %d naming %r" % (os.path.basename(path), code,
                                                                 named),
                      "rc=%s stderr=%r" % (r.returncode, r.stderr[:300]))
        plain = os.path.join(work, "m0.safetensors")
        if os.path.exists(plain):
            check("trf_blocks.0.att.mask" in tensor_names(plain),
                  "ch04's GPTModel keeps its mask buffer", str(tensor_names(plain)))
        refused = [("windows with n_kv_groups", '"n_kv_groups": 1, "sliding_window_size": 3, '
                                                '"sliding_window_stride": 1', 2,
                    "sliding windows and n_kv_groups"),
                   ("n_kv_groups not dividing n_heads", '"n_kv_groups": 3', 1,
                    "n_kv_groups (3) must divide n_heads (2) (the config read from"),
                   ("n_kv_groups null", '"n_kv_groups": null', 2,
                    "\"n_kv_groups\": null; gpt_with_kv_gqa.py's GroupedQueryAttention needs"),
                   ("a stride of 1.5", '"sliding_window_size": 3, "sliding_window_stride": 1.5',
                    1, '"sliding_window_stride" (1.5) must be a whole number'),
                   ("a stride past 2^53", '"sliding_window_size": 3, '
                                          '"sliding_window_stride": 36028797018963968', 1,
                    '"sliding_window_stride" (36028797018963968) must be a whole number'),
                   ("a stride as a string", '"sliding_window_size": 3, '
                                            '"sliding_window_stride": "1"', 1,
                    '"sliding_window_stride" must be an integer, not a string'),
                   ("windows with Llama 3's keys", '"hidden_dim": 16, "sliding_window_size": 3, '
                                                   '"sliding_window_stride": 1', 2,
                    "sliding_window_size (3) and Llama 3's keys")]
        for i, (what, keys, code, named) in enumerate(refused):
            r, save = pretrain_config(attn, work, "r%d" % i, '%s, %s}' % (base, keys), text)
            check(r.returncode == code and named in r.stderr and
                  len(r.stderr.strip().splitlines()) == 1 and not os.path.exists(save),
                  "%s: refused naming %r" % (what, named),
                  "rc=%s stderr=%r" % (r.returncode, r.stderr[:300]))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
