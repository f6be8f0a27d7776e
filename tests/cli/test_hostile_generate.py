"""attn generate against hostile inputs: files, configs, tokenizers and flags.

Every input is made here, in a temporary directory (safetensors written by
hand, so that no library is needed and any byte can be wrong). For each:
  - a refusal: exit status 1 or 2 (not a signal, not 0), a one-line error
    on stderr naming the value at fault, within the timeout, nothing on
    stdout, and nothing written (the run's directory is as it was);
  - where the input is valid (the controls, --non-strict, --stats): exit 0
    and the output checked.
The groups of cases, each marked in the code:
  layers a file does not hold (a tensor renamed to layer 999999999, a
  config of 10^9 layers, --random-init of 10^9 layers), extra tensors
  (strict by default, --non-strict warns), zeros in configs (rope_theta 0
  refused, rms_norm_eps 0 kept), late errors (a tokenizer smaller than the
  vocabulary, the given prompt length, a huge --max-new-tokens), --prompt
  naming <|endoftext|>, a file of attn train --save, and --stats' times.
  python3 test_hostile_generate.py path/to/attn
"""
import base64
import json
import os
import random
import re
import struct
import subprocess
import sys
import tempfile

ATTN = os.path.abspath(sys.argv[1])
TIMEOUT = float(os.environ.get("HOSTILE_TIMEOUT", "60"))
failures = []
counts = {}


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


# ---- files -----------------------------------------------------------------------

def safetensors(path, tensors, metadata=None, dtype="F32"):
    """tensors: name -> (shape, list of floats) written as dtype (F32, or
    I32 for a wrong one)."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        shape, values = tensors[name]
        code = "<%d%s" % (len(values), "i" if dtype == "I32" else "f")
        blob = struct.pack(code, *([int(v) for v in values] if dtype == "I32" else values))
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(blob)]}
        blobs.append(blob)
        at += len(blob)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def gpt2_tensors(V=11, T=8, C=64, L=1, seed=0):
    """The book's GPT-2 state_dict (untied, qkv_bias) of random values."""
    rnd = random.Random(seed)

    def t(*shape):
        n = 1
        for d in shape:
            n *= d
        return (shape, [rnd.uniform(-0.5, 0.5) for _ in range(n)])

    out = {"tok_emb.weight": t(V, C), "pos_emb.weight": t(T, C),
           "final_norm.scale": t(C), "final_norm.shift": t(C), "out_head.weight": t(V, C)}
    for i in range(L):
        b = "trf_blocks.%d." % i
        for w in ("W_query", "W_key", "W_value"):
            out[b + "att.%s.weight" % w] = t(C, C)
            out[b + "att.%s.bias" % w] = t(C)
        out[b + "att.out_proj.weight"] = t(C, C)
        out[b + "att.out_proj.bias"] = t(C)
        out[b + "ff.layers.0.weight"] = t(4 * C, C)
        out[b + "ff.layers.0.bias"] = t(4 * C)
        out[b + "ff.layers.2.weight"] = t(C, 4 * C)
        out[b + "ff.layers.2.bias"] = t(C)
        for n in ("norm1", "norm2"):
            out[b + n + ".scale"] = t(C)
            out[b + n + ".shift"] = t(C)
    return out


def book_cfg(**over):
    cfg = {"vocab_size": 11, "context_length": 8, "emb_dim": 64, "n_heads": 4, "n_layers": 1,
           "qkv_bias": True}
    cfg.update(over)
    return cfg


def llama_hf_cfg(**over):
    cfg = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
           "vocab_size": 11, "intermediate_size": 24, "max_position_embeddings": 8}
    cfg.update(over)
    return cfg


# ---- running ----------------------------------------------------------------------

def listing(d):
    return sorted((root, tuple(sorted(files))) for root, _, files in os.walk(d))


def run(args, cwd):
    before = listing(cwd)
    try:
        p = subprocess.run([ATTN, "generate"] + args, cwd=cwd, capture_output=True, text=True,
                           timeout=TIMEOUT, errors="replace")
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = None, "", "(timed out after %d s)" % TIMEOUT
    return rc, out, err, listing(cwd) == before


def refused(kind, args, fragment, cwd):
    """A refusal: status 1 or 2, one line on stderr holding fragment,
    nothing on stdout, nothing written."""
    counts[kind] = counts.get(kind, 0) + 1
    rc, out, err, untouched = run(args, cwd)
    lines = [l for l in err.splitlines() if l.strip()]
    what = "%s: attn generate %s -> rc %s, stderr %r" % (kind, " ".join(args)[:160], rc,
                                                          err[:400])
    check(rc in (1, 2), what + " (want exit 1 or 2)")
    check(len(lines) == 1, what + " (want a one-line error)")
    check(fragment in err, what + " (want %r in it)" % fragment)
    check(out == "", what + " (want nothing on stdout, got %r)" % out[:200])
    check(untouched, what + " (wrote into its directory)")


def succeeded(args, cwd):
    rc, out, err, untouched = run(args, cwd)
    check(rc == 0, "attn generate %s -> rc %s, stderr %r" % (" ".join(args)[:160], rc, err[:400]))
    check(untouched, "attn generate %s wrote into its directory" % " ".join(args)[:160])
    return out, err


def main():
    tmp = tempfile.mkdtemp(prefix="hostile_generate_")
    files = os.path.join(tmp, "in")
    cwd = os.path.join(tmp, "run")
    os.makedirs(files)
    os.makedirs(cwd)

    def f(name):
        return os.path.join(files, name)

    def write_json(name, obj):
        with open(f(name), "w") as fh:
            fh.write(obj if isinstance(obj, str) else json.dumps(obj))
        return f(name)

    gen = ["--prompt-ids", "1,2,3", "--max-new-tokens", "4"]

    # the controls: a 1-layer file with and without its config generates
    one = gpt2_tensors(L=1)
    safetensors(f("one.safetensors"), one)
    cfg1 = write_json("one.json", book_cfg())
    out, _ = succeeded(["--weights", f("one.safetensors")] + gen, cwd)
    check(re.fullmatch(r"\d+,\d+,\d+,\d+\n", out), "control: 4 ids, got %r" % out)
    out_cfg, _ = succeeded(["--weights", f("one.safetensors"), "--config", cfg1] + gen, cwd)

    # ---- layers the file does not hold
    renamed = dict(one)
    renamed["trf_blocks.999999999.att.W_query.weight"] = renamed.pop(
        "trf_blocks.0.att.W_query.weight")
    safetensors(f("renamed.safetensors"), renamed)
    refused("layers", ["--weights", f("renamed.safetensors")] + gen,
            "'trf_blocks.0.att.W_query.weight'", cwd)
    huge = write_json("huge_layers.json", book_cfg(n_layers=1000000000))
    refused("layers", ["--weights", f("one.safetensors"), "--config", huge] + gen,
            "'trf_blocks.1.att.W_query.weight'", cwd)
    tiny_huge = write_json("tiny_huge.json", book_cfg(emb_dim=2, n_heads=1,
                                                      n_layers=1000000000))
    refused("layers", ["--random-init", "1", "--config", tiny_huge] + gen,
            "past this machine's memory", cwd)
    refused("layers", ["--random-init", "1", "--config", write_json(
        "huge_llama.json", llama_hf_cfg(num_hidden_layers=1 << 40))] + gen,
        "n_layers (1099511627776)", cwd)
    refused("layers", ["--weights", f("one.safetensors"), "--config", write_json(
        "overflow.json", book_cfg(n_layers=1 << 62))] + gen, "trf_blocks.1.", cwd)

    # ---- extra tensors
    safetensors(f("two.safetensors"), gpt2_tensors(L=2, seed=1))
    refused("strict", ["--weights", f("two.safetensors"), "--config", cfg1] + gen,
            "holds 16 tensors the GPT-2 model of n_layers 1 does not use", cwd)
    out, err = succeeded(["--weights", f("two.safetensors"), "--config", cfg1, "--non-strict"]
                         + gen, cwd)
    check(re.fullmatch(r"\d+,\d+,\d+,\d+\n", out), "--non-strict: 4 ids, got %r" % out)
    check(err.count("\n") == 1 and "warning: --non-strict" in err and "trf_blocks.1." in err
          and "and 13 more" in err, "--non-strict warns once, naming the tensors: %r" % err)
    extra = dict(one)
    extra["something.else"] = ((2,), [1.0, 2.0])
    safetensors(f("extra.safetensors"), extra)
    refused("strict", ["--weights", f("extra.safetensors")] + gen, "'something.else'", cwd)
    refused("flags", ["--random-init", "1", "--preset", "gpt2-tiny", "--non-strict"] + gen,
            "--non-strict", cwd)

    # ---- zeros in configs
    refused("config", ["--random-init", "1", "--config", write_json(
        "theta0.json", llama_hf_cfg(rope_theta=0))] + gen, '"rope_theta" (0)', cwd)
    base0 = write_json("base0.json", book_cfg(hidden_dim=24, rope_base=0, qkv_bias=False))
    refused("config", ["--random-init", "1", "--config", base0] + gen, '"rope_base" (0)', cwd)
    succeeded(["--random-init", "1", "--config", write_json(
        "eps0.json", llama_hf_cfg(rms_norm_eps=0))] + gen, cwd)
    eps0, _ = succeeded(["--weights", f("one.safetensors"), "--config", write_json(
        "book_eps0.json", book_cfg(norm_eps=0))] + gen, cwd)
    eps5, _ = succeeded(["--weights", f("one.safetensors"), "--config", write_json(
        "book_eps5.json", book_cfg(norm_eps=1e-5))] + gen, cwd)
    check(eps5 == out_cfg, "norm_eps 1e-5 written is the default: %r vs %r" % (eps5, out_cfg))

    # ---- late or misleading errors
    ranks = "".join("%s %d\n" % (base64.b64encode(bytes([b])).decode(), b) for b in range(256))
    tok = write_json("small.tiktoken", ranks)
    refused("late", ["--random-init", "1", "--preset", "gpt2-tiny", "--tokenizer", tok] + gen,
            "has 512 tokens, fewer than the model's vocab_size 50257", cwd)
    long_prompt = ",".join(["1"] * 30000)
    refused("late", ["--weights", f("one.safetensors"), "--prompt-ids", long_prompt,
                     "--max-new-tokens", "4"], "the prompt (30000 tokens, cut to its last 8)", cwd)
    refused("late", ["--weights", f("one.safetensors"), "--prompt-ids", "1,2,3",
                     "--max-new-tokens", "18446744073709551615"],
            "do not fit the model's context_length 8: at most 6 new tokens do", cwd)
    refused("late", ["--random-init", "1", "--preset", "gpt2-tiny", "--prompt-ids", "1",
                     "--max-new-tokens", "4611686018427387904"], "context_length 256", cwd)

    # ---- --prompt as the book's text_to_token_ids encodes it: <|endoftext|> is GPT-2's
    # special token (tiktoken's allowed_special), so "Hello<|endoftext|>" is 15496, 50256
    gpt2_bpe = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "data", "gpt2-bpe")
    _, err = succeeded(["--random-init", "1", "--preset", "gpt2-tiny", "--tokenizer", gpt2_bpe,
                        "--prompt", "Hello<|endoftext|>", "--max-new-tokens", "1", "--stats"],
                       cwd)
    check("prompt 2 tokens" in err, "--prompt 'Hello<|endoftext|>' is 2 tokens: %r" % err)
    # a tokenizer without that token (a tiktoken file: Llama 3's specials) reads it as text
    _, err = succeeded(["--random-init", "1", "--config", write_json(
        "v512.json", llama_hf_cfg(vocab_size=512)), "--tokenizer", tok, "--prompt",
        "a<|endoftext|>", "--max-new-tokens", "1", "--stats"], cwd)
    check("prompt 14 tokens" in err, "tiktoken: --prompt 'a<|endoftext|>' is 14 bytes: %r" % err)

    # ---- a file of attn train --save
    trained = f("trained.safetensors")
    p = subprocess.run([ATTN, "train", "--steps", "1", "--eval", "1", "--layers", "1",
                        "--d-model", "8", "--heads", "2", "--context", "8", "--vocab", "8",
                        "--batch", "2", "--threads", "1", "--save", trained],
                       capture_output=True, text=True, timeout=TIMEOUT)
    check(p.returncode == 0 and os.path.exists(trained), "attn train --save: %r" % p.stderr)
    refused("train", ["--weights", trained] + gen, "attn train --save", cwd)

    # ---- broken files
    data = open(f("one.safetensors"), "rb").read()
    for name, blob in [("empty", b""), ("short", data[:5]), ("header_cut", data[:40]),
                       ("data_cut", data[:len(data) // 2]), ("huge_header",
                        struct.pack("<Q", 1 << 62) + data[8:]), ("not_json",
                        struct.pack("<Q", 8) + b"notjson!"), ("zeros", bytes(4096))]:
        with open(f(name + ".safetensors"), "wb") as fh:
            fh.write(blob)
        refused("file", ["--weights", f(name + ".safetensors")] + gen, "safetensors", cwd)
    safetensors(f("i32.safetensors"), one, dtype="I32")
    refused("file", ["--weights", f("i32.safetensors")] + gen, "I32", cwd)
    shaped = dict(one)
    shaped["trf_blocks.0.att.W_query.weight"] = ((64, 65), [0.0] * (64 * 65))
    safetensors(f("shape.safetensors"), shaped)
    refused("file", ["--weights", f("shape.safetensors")] + gen,
            "'trf_blocks.0.att.W_query.weight' is (64, 65), the config needs (64, 64)", cwd)
    no_emb = {k: v for k, v in one.items() if k != "tok_emb.weight"}
    safetensors(f("no_emb.safetensors"), no_emb)
    refused("file", ["--weights", f("no_emb.safetensors")] + gen, "no token embedding", cwd)
    os.makedirs(f("empty_dir"))
    refused("file", ["--weights", f("empty_dir")] + gen, "model.safetensors", cwd)
    refused("file", ["--weights", f("missing.safetensors")] + gen, "missing.safetensors", cwd)
    # a device seeks to an end of 0 bytes: named as what it is, not as a 0-byte file
    refused("file", ["--weights", "/dev/zero"] + gen, "/dev/zero: not a regular file", cwd)

    # ---- configs: missing keys, wrong types, negative, zero, huge
    w1 = ["--weights", f("one.safetensors"), "--config"]
    bad_configs = [
        ("no_layers", {k: v for k, v in book_cfg().items() if k != "n_layers"},
         'has no "n_layers"'),
        ("neg_heads", book_cfg(n_heads=-4), '"n_heads" (-4) must be a whole number'),
        ("zero_heads", book_cfg(n_heads=0), "n_heads (0)"),
        ("str_layers", book_cfg(n_layers="1"),
         '"n_layers" must be a non-negative integer, not a string'),
        ("frac_vocab", book_cfg(vocab_size=11.5), '"vocab_size" (11.5) must be a whole number'),
        # 2^64 - 1 as written reads as 2^64: the message says the value is as read
        ("vocab_2_64", book_cfg(vocab_size=2 ** 64 - 1),
         '"vocab_size" (1.8446744073709552e+19 as read: past 2^53 a number keeps 17 digits)'),
        ("heads_3", book_cfg(n_heads=3), "n_heads (3) must divide emb_dim (64)"),
        ("huge_emb", book_cfg(emb_dim=1 << 40, n_heads=1), "emb_dim (1099511627776)"),
        ("huge_vocab", book_cfg(vocab_size=1 << 40), "vocab_size (1099511627776)"),
        ("neg_eps", book_cfg(norm_eps=-1e-5), '"norm_eps" (-1e-05)'),
        ("eps_str", book_cfg(norm_eps="x"), '"norm_eps" must be a number'),
        ("bias_str", book_cfg(qkv_bias="yes"), '"qkv_bias" must be true or false'),
        ("array", [1, 2], "is not a JSON object"),
        ("no_keys", {"a": 1}, "neither the book's cfg keys"),
        ("broken", '{"vocab_size": 11,', "one.json" if False else "broken.json"),
        ("llama_cfg", llama_hf_cfg(), "the config is Llama 3's"),
    ]
    for name, cfg, fragment in bad_configs:
        refused("config", w1 + [write_json(name + ".json", cfg)] + gen, fragment, cwd)
    # a config that cannot be read is --config's, not --weights'
    refused("config", w1 + [os.path.join(tmp, "no_such.json")] + gen,
            "--config: " + os.path.join(tmp, "no_such.json"), cwd)
    # an endless file is refused at the JSON reader's bound, not read until memory ends
    refused("config", w1 + ["/dev/zero"] + gen, "/dev/zero: more than 16777216 bytes", cwd)
    for name, cfg, fragment in [
            ("r_theta_neg", llama_hf_cfg(rope_theta=-1), '"rope_theta" (-1)'),
            # named by the file's keys, as attn_lm_load names them
            ("r_heads0", llama_hf_cfg(num_attention_heads=0), "num_attention_heads (0)"),
            ("r_kv3", llama_hf_cfg(num_key_value_heads=3), "num_key_value_heads (3)"),
            ("r_scaling", llama_hf_cfg(rope_scaling={"rope_type": "yarn"}), '"yarn"'),
            ("r_layers_neg", llama_hf_cfg(num_hidden_layers=-1),
             '"num_hidden_layers" (-1) must be a whole number from 0 to 2^64 - 1')]:
        refused("config", ["--random-init", "1", "--config", write_json(name + ".json", cfg)]
                + gen, fragment, cwd)

    # ---- --model: the architecture the weights, or --random-init's config, must have
    gqa_cfg = write_json("gqa.json", book_cfg(n_kv_groups=2))
    mla_cfg = write_json("mla.json", book_cfg(latent_dim=None))
    for cfg, arch, model in [(gqa_cfg, "gpt-gqa", "gpt-mla"), (gqa_cfg, "gpt-gqa", "gpt2"),
                             (mla_cfg, "gpt-mla", "gpt-gqa"), (mla_cfg, "gpt-mla", "llama3"),
                             (cfg1, "gpt2", "gpt-gqa")]:
        refused("model", ["--random-init", "1", "--config", cfg, "--model", model] + gen,
                "--model: the config '%s' is %s's, not %s" % (cfg, arch, model), cwd)
        out, _ = succeeded(["--random-init", "1", "--config", cfg, "--model", arch] + gen, cwd)
        check(re.fullmatch(r"\d+,\d+,\d+,\d+\n", out), "--model %s: 4 ids, got %r" % (arch, out))
    refused("model", ["--weights", f("one.safetensors"), "--model", "gpt-mla"] + gen,
            "--model: the weights in '%s' are gpt2, not gpt-mla" % f("one.safetensors"), cwd)
    # gpt-mla caches one latent a token, read as keys and values: one type for both
    refused("model", ["--random-init", "1", "--config", mla_cfg, "--k-dtype", "int8",
                      "--v-dtype", "bf16"] + gen,
            "--k-dtype int8, --v-dtype bf16: this model caches one latent a token", cwd)
    # its cache's head_dim is the latent's (24 here, its heads' 16): named as such
    refused("model", ["--random-init", "1", "--config",
                      write_json("mla24.json", book_cfg(latent_dim=24)), "--kv-dtype", "int4"]
            + gen, "--kv-dtype: attn_kv_cache_new: k_dtype I4 stores groups of 32 elements; "
            "head_dim 24 is not a multiple of 32 (this model caches its latent: one KV head of "
            "latent_dim 24)", cwd)
    out, err = succeeded(["--random-init", "1", "--config", mla_cfg, "--kv-dtype", "int8",
                          "--stats"] + gen, cwd)
    check("kv cache %d bytes/token (the latent in int8, read as K and V" % (16 + 4) in err
          and "kv cache int8 (latent): near-exact (mean KL 2.7e-08 on the trained "
              "chapter-5-sized model with latent attention" in err,
          "gpt-mla --kv-dtype int8: the latent's bytes alone and its class, got %r" % err[:400])

    # ---- flags
    base = ["--random-init", "1", "--preset", "gpt2-tiny"]
    bad_flags = [
        (["--temperature", "nan"], "--temperature"), (["--temperature", "-1"], "--temperature"),
        (["--temperature", "inf"], "--temperature"), (["--top-p", "2"], "--top-p"),
        (["--top-k", "-1"], "--top-k"), (["--page-size", "0"], "--page-size"),
        (["--threads", "0"], "--threads"), (["--weights-dtype", "f8"], "--weights-dtype"),
        (["--matmul-dtype", "f16"], "--matmul-dtype: expected f32 or bf16, got 'f16'"),
        # bf16 products need bf16 weights: refused naming the model's dtype
        (["--matmul-dtype", "bf16"], "--matmul-dtype: attn_lm_set_matmul_dtype: BF16 products "
                                     "need bf16 weights; the model holds F32"),
        (["--kv-dtype", "bogus"], "--kv-dtype"), (["--cache", "bogus"], "--cache"),
        (["--model", "bert"], "--model"), (["--seed", "-1"], "--seed"),
        (["--stop-ids", "a"], "--stop-ids"), (["--kernels", "sse9"], "--kernels"),
        # an id past the vocabulary could never stop the run
        (["--stop-ids", "3,50257"], "--stop-ids: 50257 is not a token id"),
        # the cache's refusals name the option behind them
        (["--k-dtype", "int4", "--v-dtype", "f32"], "--k-dtype: attn_kv_cache_new: k_dtype I4"),
        (["--v-dtype", "int4"], "--v-dtype: attn_kv_cache_new: v_dtype I4"),
        (["--kv-dtype", "int4"], "--kv-dtype: attn_kv_cache_new"),
        (["--cache", "paged", "--page-size", "1099511627776"], "--page-size: attn_kv_cache_new"),
    ]
    for extra_args, fragment in bad_flags:
        refused("flags", base + gen + extra_args, fragment, cwd)
    for ids, fragment in [("", "--prompt-ids"), ("1,,2", "--prompt-ids"),
                          ("2147483648", "--prompt-ids"), ("-1", "--prompt-ids"),
                          ("50257", "prompt[0] = 50257")]:
        refused("flags", base + ["--prompt-ids", ids, "--max-new-tokens", "1"], fragment, cwd)
    for n, fragment in [("-1", "--max-new-tokens"), ("18446744073709551616", "--max-new-tokens"),
                        ("1e3", "--max-new-tokens")]:
        refused("flags", base + ["--prompt-ids", "1", "--max-new-tokens", n], fragment, cwd)
    refused("flags", base + ["--prompt-ids", "1"], "--max-new-tokens", cwd)
    refused("flags", ["--preset", "gpt2-tiny"] + gen, "--random-init", cwd)

    # ---- --stats reports the load, the first token and tokens/s
    out, err = succeeded(["--random-init", "1", "--preset", "gpt2-small", "--prompt-ids",
                          "1,2,3", "--max-new-tokens", "6", "--stats", "--threads", "2"], cwd)
    load = re.search(r"load ([0-9.]+) ms, weights f32 ([0-9.]+) MiB", err)
    first = re.search(r"time to first token ([0-9.]+) ms", err)
    rate = re.search(r"([0-9.]+) ms per token after \(([0-9.]+) tokens/s\)", err)
    check(load and float(load.group(1)) > 0 and abs(float(load.group(2)) - 474.7) < 1,
          "--stats: load time > 0 and gpt2-small's 474.7 MiB (tied): %r" % err)
    check(first and float(first.group(1)) > 0, "--stats: time to first token > 0: %r" % err)
    check(rate and float(rate.group(1)) > 0 and
          abs(float(rate.group(2)) * float(rate.group(1)) - 1000) < 10,
          "--stats: tokens/s = 1000 / ms per token: %r" % err)
    check(re.fullmatch(r"(\d+,){5}\d+\n", out), "--stats: 6 ids on stdout: %r" % out)
    # bf16 products on bf16 weights: said by --stats, and ids written
    out, err = succeeded(base + ["--prompt-ids", "1,2,3", "--max-new-tokens", "4",
                                 "--weights-dtype", "bf16", "--matmul-dtype", "bf16", "--stats"],
                         cwd)
    check("weights bf16" in err and "products on bf16 inputs" in err,
          "--matmul-dtype bf16 --stats: %r" % err)
    check(re.fullmatch(r"(\d+,){3}\d+\n", out), "--matmul-dtype bf16: 4 ids on stdout: %r" % out)

    total = sum(counts.values())
    print("hostile inputs refused: %d (%s)" % (
        total, ", ".join("%s %d" % kv for kv in sorted(counts.items()))))
    for root, dirs, names in os.walk(tmp, topdown=False):
        for n in names:
            os.unlink(os.path.join(root, n))
        for d in dirs:
            os.rmdir(os.path.join(root, d))
    os.rmdir(tmp)
    if failures:
        print("%d of the checks failed" % len(failures))
        return 1
    print("all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
