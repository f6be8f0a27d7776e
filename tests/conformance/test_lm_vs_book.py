#!/usr/bin/python3
"""attn's language models (attn.LanguageModel over attn_lm_*) against the
book's GPT-2 and Llama 3 (llms-from-scratch 1.0.19, kv_cache/) and Hugging
Face's GPT2LMHeadModel / LlamaForCausalLM, in PyTorch float64.

    .venv/bin/python tests/conformance/test_lm_vs_book.py LIBATTN_SO [--seed N]
                                                          [--kernels auto,reference,...]

For fresh random configurations and seeds each run (the run seed is printed;
--seed replays), on each kernel set (each in a process of its own, as
ATTN_KERNELS chooses):
  1. weights: LanguageModel(cfg, seed) holds what torch.manual_seed(seed) +
     the book's constructor draws;
  2. no cache: logits of a random batch within relative L2 1e-5 of the book's
     model in float64 (the float32 weights saved by safetensors, loaded by
     attn through the Python package);
  3. with a cache: a prefill, then one-token steps (and a two-token step),
     every step's logits within 1e-5; contiguous and paged caches (page sizes
     1, 3, 16) give the same bits; a ragged batch (two prompts of different
     lengths, in one call, with and without cache) matches separate runs;
  4. errors: a forward past context_length, past the cache's max_len, a token
     outside the vocabulary, a cache of another model: clean AttnErrors;
  5. loading: the config from a dict, a JSON file of the book's cfg keys, a
     Hugging Face-style config.json (rope_scaling llama3 included), a
     directory, the shapes (GPT-2); saving writes the book's state_dict;
  6. Hugging Face: GPT2LMHeadModel (tied head, with and without the
     "transformer." prefix) and LlamaForCausalLM (tied and not) saved by
     save_pretrained, loaded by attn, logits within 1e-5 of transformers'.
Prints one line per check and "N passed, N failed".
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

TOL = 1e-5
results = {"passed": 0, "failed": 0}


def check(ok, what):
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    return ok


def rel_l2(got, want):
    import numpy as np
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def close(got, want, what, tol=TOL):
    err = rel_l2(got, want)
    return check(err <= tol, "%s: rel L2 %.2e" % (what, err))


def expect_error(fn, status, what):
    import attn
    try:
        fn()
    except attn.AttnError as e:
        return check(e.status == status and len(str(e)) > 10,
                     "%s -> %s: %s" % (what, e.status, e))
    return check(False, "%s: no error" % what)


# ---- configurations -----------------------------------------------------------

def gpt2_configs(r):
    base = {"vocab_size": 97, "context_length": 64, "emb_dim": 48, "n_heads": 4,
            "n_layers": 2, "drop_rate": 0.0}
    return [dict(base, qkv_bias=True), dict(base, qkv_bias=False),
            dict(base, emb_dim=r.choice([16, 32]), n_heads=r.choice([1, 2, 4]),
                 n_layers=r.choice([1, 3]), qkv_bias=r.choice([True, False]))]


def llama_configs(r):
    base = {"vocab_size": 101, "context_length": 128, "emb_dim": 64, "n_heads": 8,
            "n_layers": 2, "hidden_dim": 96}
    freq = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_context_length": 16}
    return [dict(base, n_kv_groups=2, rope_base=10000.0, rope_freq=None),
            dict(base, n_kv_groups=8, rope_base=500000.0, rope_freq=freq),
            dict(base, n_kv_groups=1, rope_base=500000.0, rope_freq=None),
            dict(base, n_kv_groups=2, rope_base=10000.0,
                 rope_freq=dict(freq, factor=r.choice([4.0, 32.0]),
                                original_context_length=r.choice([8, 32])))]


def lm_cfg(cfg):
    """The book cfg as attn's Python package takes it (no dtype, no None)."""
    return {k: v for k, v in cfg.items() if v is not None and k not in ("dtype", "drop_rate")}


# ---- the checks ------------------------------------------------------------------

def check_weights(O, cfg, seed, llama, name):
    import attn
    import numpy as np
    book = (O.book_llama3 if llama else O.book_gpt2)(cfg, seed)
    ours = attn.LanguageModel(lm_cfg(cfg), seed=seed).state_dict()
    theirs = {k: v.detach().numpy() for k, v in book.state_dict().items()}
    ok = list(ours) == list(theirs)
    worst = 0.0
    for k in theirs:
        if ok and ours[k].shape == theirs[k].shape:
            worst = max(worst, float(np.max(np.abs(ours[k] - theirs[k]))))
        else:
            ok = False
    # randn's libm log/sin/cos may differ from PyTorch's vector ones by ulps
    check(ok and worst <= 1e-5, "%s: weights after manual_seed(%d) equal the book's "
          "(names and order; largest difference %.1e)" % (name, seed, worst))


def forward_checks(O, cfg, seed, llama, name, r, tmp):
    import attn
    import numpy as np
    model = (O.book_llama3 if llama else O.book_gpt2)(cfg, seed)
    O.randomize_book_norms(model, seed)
    path = os.path.join(tmp, "%s.safetensors" % name)
    O.save_book(model, path)
    ref = O.Reference(model)
    lm = attn.LanguageModel.load(path, config=lm_cfg(cfg))
    V, ctx = cfg["vocab_size"], cfg["context_length"]

    # no cache
    B, T = 2, r.randint(3, min(ctx, 24))
    ids = np.array([[r.randrange(V) for _ in range(T)] for _ in range(B)], dtype=np.int32)
    want = ref.logits(ids)
    close(lm.forward(ids), want, "%s: no cache, B=%d T=%d" % (name, B, T))
    close(lm.forward(ids, last_only=True), want[:, -1], "%s: no cache, last_only" % name)

    # cache: prefill, one-token steps, a two-token step
    P = r.randint(1, 12)
    prompt = ids[:, :min(P, T)]
    steps = [np.array([[r.randrange(V)] for _ in range(B)], dtype=np.int32) for _ in range(6)]
    steps.append(np.array([[r.randrange(V), r.randrange(V)] for _ in range(B)], np.int32))
    steps.append(np.array([[r.randrange(V)] for _ in range(B)], dtype=np.int32))
    want_steps = ref.cached_steps(prompt, steps)
    runs = {}
    for layout, page in [("contiguous", 16), ("paged", 1), ("paged", 3), ("paged", 16)]:
        cache = lm.new_cache(batch=B, max_len=min(ctx, 40), layout=layout, page_size=page)
        got = [lm.forward(prompt, cache=cache)]
        got += [lm.forward(s, cache=cache) for s in steps]
        runs[(layout, page)] = got
        if layout == "contiguous":
            worst = max(rel_l2(g, w) for g, w in zip(got, want_steps))
            check(worst <= TOL, "%s: cache, prefill %d + %d steps, every step's logits: worst "
                  "rel L2 %.2e" % (name, prompt.shape[1], len(steps), worst))
            check(cache.length(0) == prompt.shape[1] + sum(s.shape[1] for s in steps),
                  "%s: cache length %d after the steps" % (name, cache.length(0)))
    base = runs[("contiguous", 16)]
    for key, got in runs.items():
        if key[0] == "paged":
            same = all(np.array_equal(g, b) for g, b in zip(got, base))
            check(same, "%s: paged (page_size %d) logits bitwise equal to contiguous"
                  % (name, key[1]))

    # caches of other element types: the same steps, logits near the float32
    # cache's (not equal: the keys and values are rounded), sizes by attn.h's formats
    head_dim = lm.new_cache(1, 4).config()["head_dim"]
    for kind in ("bf16", "int8", "int4", "fp8"):
        if kind == "int4" and head_dim % 32:
            expect_error(lambda: lm.new_cache(1, 4, k_dtype="int4"), "ATTN_ERR_SHAPE",
                         "%s: an int4 cache of head_dim %d" % (name, head_dim))
            continue
        cache = lm.new_cache(batch=B, max_len=min(ctx, 40), k_dtype=kind, v_dtype="f16")
        got = [lm.forward(prompt, cache=cache)] + [lm.forward(s, cache=cache) for s in steps]
        worst = max(rel_l2(g, b) for g, b in zip(got, base))
        check(0 < worst <= 0.05, "%s: K %s / V f16 cache: every step's logits within rel L2 "
              "%.2e of the float32 cache's" % (name, kind, worst))
        cfg_c = cache.config()
        heads_bytes = {"bf16": 2 * cfg_c["head_dim"], "int8": cfg_c["head_dim"] + 4,
                       "int4": cfg_c["head_dim"] // 2 + 4 * (cfg_c["head_dim"] // 32),
                       "fp8": cfg_c["head_dim"] + 4}[kind] + 2 * cfg_c["head_dim"]
        check(cfg_c["k_dtype"] == kind and cache.token_bytes() ==
              cfg_c["num_layers"] * cfg_c["kv_heads"] * heads_bytes,
              "%s: K %s / V f16 cache: %d bytes per token" % (name, kind, cache.token_bytes()))

    # ragged batch: two prompts of different lengths, one call, vs separate runs
    la, lb = r.randint(1, 6), r.randint(7, 14)
    pa = np.array([r.randrange(V) for _ in range(la)], np.int32)
    pb = np.array([r.randrange(V) for _ in range(lb)], np.int32)
    got = lm.forward([pa, pb])
    ok = (close(got[0], lm.forward(pa[None])[0], "%s: ragged (%d, %d) no cache, sequence 0 "
                "vs alone" % (name, la, lb), 1e-6) and
          close(got[1], lm.forward(pb[None])[0], "%s: ragged no cache, sequence 1 vs alone"
                % name, 1e-6))
    close(got[1], ref.logits(pb[None])[0], "%s: ragged sequence 1 vs the book" % name)
    last = lm.forward([pa, np.zeros(0, np.int32), pb], last_only=True)
    check(np.array_equal(last[1], np.zeros(V, np.float32)) and
          rel_l2(last[2], got[1][-1]) <= 1e-6,
          "%s: last_only with an empty sequence: zeros there, the others' last rows" % name)
    cache = lm.new_cache(batch=2, max_len=32, layout="paged", page_size=4)
    ca, cb = lm.new_cache(1, 32), lm.new_cache(1, 32)
    g2 = lm.forward([pa, pb], cache=cache, last_only=True)
    ga = lm.forward(pa[None], cache=ca, last_only=True)
    gb = lm.forward(pb[None], cache=cb, last_only=True)
    worst = max(rel_l2(g2[0], ga[0]), rel_l2(g2[1], gb[0]))
    for _ in range(3):
        ta, tb = r.randrange(V), r.randrange(V)
        g2 = lm.forward([np.array([ta], np.int32), np.array([tb], np.int32)], cache=cache,
                        last_only=True)
        ga = lm.forward(np.array([[ta]], np.int32), cache=ca, last_only=True)
        gb = lm.forward(np.array([[tb]], np.int32), cache=cb, last_only=True)
        worst = max(worst, rel_l2(g2[0], ga[0]), rel_l2(g2[1], gb[0]))
    check(worst <= 1e-6, "%s: ragged batch with a cache (prefill %d and %d, 3 steps) vs "
          "separate caches: worst rel L2 %.2e" % (name, la, lb, worst))

    # generate (attn_lm_generate through the binding): greedy, as a loop of
    # cached forwards, and each token an argmax of the book's logits (within
    # float32's rounding of near-ties)
    gp = ids[0, :min(4, T)]
    n_new = 6
    tokens = lm.generate(gp, n_new, cache=r.choice(["contiguous", "paged"]), page_size=3)
    cache = lm.new_cache(1, len(gp) + n_new)
    logits = lm.forward(gp[None], cache=cache, last_only=True)
    mine = []
    for _ in range(n_new):
        mine.append(int(np.argmax(logits[0])))
        logits = lm.forward(np.array([[mine[-1]]], np.int32), cache=cache, last_only=True)
    seq = list(gp) + list(tokens)
    book = ref.logits(np.array([seq], np.int32))[0]
    near_max = all(book[len(gp) - 1 + i, t] >= book[len(gp) - 1 + i].max() -
                   1e-5 * np.abs(book[len(gp) - 1 + i]).max() for i, t in enumerate(tokens))
    check(list(tokens) == mine and near_max,
          "%s: generate greedy %s = the cached argmax loop, each the book's argmax"
          % (name, list(tokens)))
    stop = int(next((t for t in tokens if t != tokens[0]), tokens[0]))
    seen = []
    cut = lm.generate(gp, n_new, stop_tokens=[stop], on_token=lambda t: seen.append(t) or True)
    check(list(cut) == list(tokens[:list(tokens).index(stop)]) and seen == list(cut),
          "%s: generate stops before stop token %d; on_token saw %s" % (name, stop, seen))
    sampled = [list(lm.generate(gp, n_new, temperature=0.8, top_k=5, seed=7)) for _ in range(2)]
    check(sampled[0] == sampled[1] and len(sampled[0]) == n_new,
          "%s: sampling with a seed repeats: %s" % (name, sampled[0]))

    # errors
    expect_error(lambda: lm.forward(np.zeros((1, ctx + 1), np.int32)), "ATTN_ERR_OVERFLOW",
                 "%s: %d tokens without cache (context_length %d)" % (name, ctx + 1, ctx))
    small = lm.new_cache(batch=1, max_len=4)
    lm.forward(np.zeros((1, 3), np.int32), cache=small)
    expect_error(lambda: lm.forward(np.zeros((1, 2), np.int32), cache=small),
                 "ATTN_ERR_OVERFLOW", "%s: 3 + 2 tokens into a cache of max_len 4" % name)
    check(small.length(0) == 3, "%s: the failed step appended nothing" % name)
    expect_error(lambda: lm.forward(np.array([[V]], np.int32)), "ATTN_ERR_INVALID",
                 "%s: token %d (vocab %d)" % (name, V, V))
    expect_error(lambda: lm.forward(np.zeros((2, 1), np.int32), cache=small),
                 "ATTN_ERR_SHAPE", "%s: a batch of 2 with a cache of batch 1" % name)
    expect_error(lambda: lm.new_cache(batch=1, max_len=ctx + 1), "ATTN_ERR_INVALID",
                 "%s: a cache longer than context_length" % name)

    # a cache lent to another model runs on its maker's context: the borrower
    # holds the maker's lock too, so the maker's calls on another thread do
    # not share its workspace (they crashed); both threads' logits exact
    other = attn.LanguageModel.load(path, config=lm_cfg(cfg))
    own, lent = lm.new_cache(1, 16, dtype="int8"), lm.new_cache(1, 16, dtype="int8")
    seq = ids[:1, :min(T, 8)]

    def steps(model, cache):
        cache.reset()
        out = [model.forward(seq, cache=cache, last_only=True)]
        for t in range(6):
            out.append(model.forward(np.array([[t]], np.int32), cache=cache, last_only=True))
        return np.concatenate(out)

    alone = steps(lm, own)
    results = {"maker": [], "borrower": []}

    def loop(key, model, cache):
        for _ in range(40):
            results[key].append(steps(model, cache))

    threads = [threading.Thread(target=loop, args=("maker", lm, own)),
               threading.Thread(target=loop, args=("borrower", other, lent))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(all(np.array_equal(x, alone) for key in results for x in results[key]) and
          len(results["maker"]) == len(results["borrower"]) == 40,
          "%s: a cache lent to another model, both used from two threads: the same logits"
          % name)
    del lent
    freed = lm.new_cache(1, 16)
    freed.__del__()
    try:
        other.forward(seq, cache=freed)
        check(False, "%s: a freed cache: no error" % name)
    except ValueError as err:
        check("freed" in str(err), "%s: a freed cache: %s" % (name, err))

    # saving: the book's state_dict, loadable by load_state_dict(strict=True)
    from safetensors.torch import load_file
    saved = os.path.join(tmp, "%s.saved.safetensors" % name)
    lm.save(saved)
    sd = load_file(saved)
    orig = model.state_dict()
    same = sorted(sd) == sorted(orig) and all(
        np.array_equal(sd[k].numpy(), orig[k].detach().numpy()) for k in orig)
    fresh = (O.book_llama3 if llama else O.book_gpt2)(cfg, seed + 1)
    fresh.load_state_dict(sd, strict=True)
    check(same, "%s: attn_lm_save writes the book's state_dict, bit for bit" % name)
    return lm, model, path, ref, ids


def loading_checks(O, cfg, llama, name, path, ref, ids, tmp):
    import attn
    want = ref.logits(ids)
    # the book's cfg keys in a JSON file
    cfg_path = os.path.join(tmp, "%s.book.json" % name)
    O.write_json(O.json_cfg(cfg), cfg_path)
    close(attn.LanguageModel.load(path, config=cfg_path).forward(ids), want,
          "%s: config from the book's cfg keys in JSON" % name)
    # a directory: model.safetensors + config.json
    d = os.path.join(tmp, name + ".dir")
    os.makedirs(d, exist_ok=True)
    os.replace(path, os.path.join(d, "model.safetensors"))
    O.write_json(O.json_cfg(cfg), os.path.join(d, "config.json"))
    close(attn.LanguageModel.load(d).forward(ids), want,
          "%s: a directory (model.safetensors + config.json)" % name)
    os.replace(os.path.join(d, "model.safetensors"), path)
    if llama:
        # Hugging Face's LlamaConfig keys with rope_scaling llama3
        hf = {"model_type": "llama", "hidden_size": cfg["emb_dim"],
              "num_attention_heads": cfg["n_heads"], "num_key_value_heads": cfg["n_kv_groups"],
              "intermediate_size": cfg["hidden_dim"], "num_hidden_layers": cfg["n_layers"],
              "max_position_embeddings": cfg["context_length"], "vocab_size": cfg["vocab_size"],
              "rope_theta": cfg["rope_base"], "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "attention_bias": False}
        if cfg.get("rope_freq"):
            f = cfg["rope_freq"]
            hf["rope_scaling"] = {"rope_type": "llama3", "factor": f["factor"],
                                  "low_freq_factor": f["low_freq_factor"],
                                  "high_freq_factor": f["high_freq_factor"],
                                  "original_max_position_embeddings":
                                      f["original_context_length"]}
        hf_path = os.path.join(tmp, "%s.hf.json" % name)
        O.write_json(hf, hf_path)
        close(attn.LanguageModel.load(path, config=hf_path).forward(ids), want,
              "%s: config from Hugging Face's LlamaConfig keys%s" %
              (name, " with rope_scaling llama3" if cfg.get("rope_freq") else ""))
        expect_error(lambda: attn.LanguageModel.load(path), "ATTN_ERR_INVALID",
                     "%s: a Llama file without a config" % name)
    elif cfg["emb_dim"] % 64 != 0:
        expect_error(lambda: attn.LanguageModel.load(path), "ATTN_ERR_INVALID",
                     "%s: GPT-2 without a config, emb_dim %d not a multiple of 64"
                     % (name, cfg["emb_dim"]))
    # half-precision files (bf16, f16) load, held in their dtype (the
    # default), against the book's model holding the rounded weights; held
    # as f32 instead, the same logits bit for bit
    import numpy as np
    import torch
    from safetensors.torch import load_file, save_file
    # an F64 file: rounded to nearest float32 (the book's model on tensor.float()),
    # and one holding a finite value past float32's range refused by name (as
    # an infinity it turned every logit NaN)
    wide64 = {k: v.to(torch.float64) for k, v in load_file(path).items()}
    f64_path = os.path.join(tmp, "%s.f64.safetensors" % name)
    save_file(wide64, f64_path)
    close(attn.LanguageModel.load(f64_path, config=lm_cfg(cfg)).forward(ids), want,
          "%s: an F64 file" % name)
    victim = sorted(wide64)[len(wide64) // 2]
    at = random.randrange(wide64[victim].numel())
    wide64[victim].view(-1)[at] = -1e300
    save_file(wide64, f64_path)
    expect_error(lambda: attn.LanguageModel.load(f64_path, config=lm_cfg(cfg)),
                 "ATTN_ERR_INVALID", "%s: an F64 file holding -1e300" % name)
    try:
        attn.LanguageModel.load(f64_path, config=lm_cfg(cfg))
    except attn.AttnError as err:
        check("tensor '%s' (F64) holds -1.0000000000000001e+300 at element %d, past float32's "
              "range" % (victim, at) in str(err), "%s: the F64 refusal names it: %s" % (name, err))
    for dtype in (torch.bfloat16, torch.float16):
        short = {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
        half = {k: v.to(dtype) for k, v in load_file(path).items()}
        half_path = os.path.join(tmp, "%s.%s.safetensors" % (name, str(dtype)[6:]))
        save_file(half, half_path)
        rounded = (O.book_llama3 if llama else O.book_gpt2)(cfg, 0)
        rounded.load_state_dict({k: v.float() for k, v in half.items()})
        lm16 = attn.LanguageModel.load(half_path, config=lm_cfg(cfg))
        logits16 = lm16.forward(ids)
        close(logits16, O.Reference(rounded).logits(ids), "%s: a %s file" % (name, short))
        check(lm16.config.get("weights_dtype") == short,
              "%s: a %s file is held in %s" % (name, short, short))
        wide = attn.LanguageModel.load(half_path, config=lm_cfg(cfg), weights_dtype="f32")
        check(np.array_equal(logits16, wide.forward(ids)),
              "%s: a %s file held in %s and in f32: the same logits" % (name, short, short))
        ours = lm16.state_dict()
        check(all(np.array_equal(ours[k], v.float().numpy()) for k, v in half.items()
                  if k in ours),
              "%s: a %s model's state_dict is the file's tensors, widened" % (name, short))
        check(lm16.weight_bytes < 0.6 * wide.weight_bytes,
              "%s: %s weights take %d bytes, f32 %d" % (name, short, lm16.weight_bytes,
                                                         wide.weight_bytes))
        if dtype == torch.bfloat16:
            bf16_products(O, name, lm16, rounded, ids, logits16)
        else:
            expect_error(lambda: setattr(lm16, "matmul_dtype", "bf16"), "ATTN_ERR_INVALID",
                         "%s: bf16 products on f16 weights" % name)
    bad = dict(cfg, emb_dim=cfg["emb_dim"] * 2)
    expect_error(lambda: attn.LanguageModel.load(path, config=lm_cfg(bad)), "ATTN_ERR_SHAPE",
                 "%s: a config whose emb_dim the tensors do not have" % name)


def bf16_products(O, name, lm16, rounded, ids, exact):
    """matmul_dtype "bf16": every linear layer's input rounded to bf16 (the
    rows of a prompt, past the matrix-vector kernels, and one token a step
    on a cache), against the float64 model that rounds them so."""
    import numpy as np
    import torch
    lm16.matmul_dtype = "bf16"
    check(lm16.matmul_dtype == "bf16", "%s: matmul_dtype reads back bf16" % name)
    oracle = O.Reference(rounded).round_linear_inputs(torch.bfloat16)
    want = oracle.logits(ids)
    moved = rel_l2(exact, want)
    # attn's float32 activations and the oracle's float64 ones fall on the
    # two sides of a bf16 rounding boundary now and then, and each such
    # element moves the logits as the rounding itself does: a few of them
    # among thousands put attn well inside the distance the rounding moves
    # the logits (0.2 of it at most, seen over many seeds), where a path
    # that skipped the rounding would be all of it away
    err = rel_l2(lm16.forward(ids), want)
    check(err <= 0.4 * moved, "%s: bf16 products, no cache: rel L2 %.2e from the float64 model "
          "rounding the linear inputs to bf16, %.2f of the %.2e the rounding moves the logits"
          % (name, err, err / moved, moved))
    B, T = ids.shape
    cache = lm16.new_cache(batch=B, max_len=T)
    steps = [lm16.forward(ids[:, t:t + 1], cache=cache) for t in range(T)]
    err = rel_l2(np.concatenate(steps, axis=1), want)
    check(err <= 0.4 * moved, "%s: bf16 products, one token a step on a cache: rel L2 %.2e, "
          "%.2f of the rounding's" % (name, err, err / moved))
    lm16.matmul_dtype = "f32"
    check(np.array_equal(lm16.forward(ids), exact), "%s: matmul_dtype f32 again: the exact "
          "logits, bit for bit" % name)
    try:
        lm16.matmul_dtype = "f16"
        check(False, "%s: matmul_dtype f16: no error" % name)
    except ValueError as e:
        check("matmul_dtype" in str(e), "%s: matmul_dtype f16 -> ValueError: %s" % (name, e))


def gpt2_from_shapes(O, r, tmp):
    import attn
    import numpy as np
    cfg = {"vocab_size": 53, "context_length": 32, "emb_dim": 64, "n_heads": 1, "n_layers": 2,
           "drop_rate": 0.0, "qkv_bias": r.choice([True, False])}
    seed = r.randrange(1 << 30)
    model = O.book_gpt2(cfg, seed)
    path = os.path.join(tmp, "shapes.safetensors")
    O.save_book(model, path)
    ids = np.array([[r.randrange(53) for _ in range(9)]], np.int32)
    lm = attn.LanguageModel.load(path)
    c = lm.config
    check(c["n_heads"] == 1 and c["n_layers"] == 2 and c["qkv_bias"] == cfg["qkv_bias"] and
          c["context_length"] == 32, "gpt2 config from the shapes: %s" % c)
    close(lm.forward(ids), O.Reference(model).logits(ids), "gpt2 from the shapes alone")


def hf_checks(O, r, tmp):
    import attn
    import numpy as np
    cfg = {"vocab_size": 97, "context_length": 64, "emb_dim": 48, "n_heads": 4, "n_layers": 2}
    for tie in (True, False):
        seed = r.randrange(1 << 30)
        d = os.path.join(tmp, "hf_gpt2_%d" % tie)
        model = O.hf_gpt2(cfg, seed, d, tie=tie)
        ids = np.array([[r.randrange(97) for _ in range(11)] for _ in range(2)], np.int32)
        want = O.hf_logits(model, ids)
        lm = attn.LanguageModel.load(d)
        close(lm.forward(ids), want, "GPT2LMHeadModel (tie_word_embeddings %s, files %s) "
              "from save_pretrained" % (tie, ",".join(O.files_in(d))))
        check(lm.config["tie_embeddings"] == tie, "GPT2LMHeadModel: tied %s read" % tie)
        cache = lm.new_cache(2, 20, "paged", 4)
        got = np.concatenate([lm.forward(ids[:, :5], cache=cache)] +
                             [lm.forward(ids[:, t:t + 1], cache=cache) for t in range(5, 11)],
                             axis=1)
        close(got, want, "GPT2LMHeadModel: prefill 5 + 6 cached steps")
    # without the "transformer." prefix (GPT2Model-style names) and without config
    from safetensors.numpy import load_file, save_file
    tensors = load_file(os.path.join(d, "model.safetensors"))
    bare = {k[len("transformer."):] if k.startswith("transformer.") else k: v
            for k, v in tensors.items()}
    bare_path = os.path.join(tmp, "bare.safetensors")
    save_file(bare, bare_path)
    close(attn.LanguageModel.load(bare_path, config=os.path.join(d, "config.json")).forward(ids),
          want, "GPT-2 names without the 'transformer.' prefix")

    cfg = {"vocab_size": 101, "context_length": 128, "emb_dim": 64, "n_heads": 8,
           "n_layers": 2, "hidden_dim": 96}
    for tie, kv, base in ((False, 2, 500000.0), (True, 8, 10000.0), (False, 1, 10000.0)):
        seed = r.randrange(1 << 30)
        d = os.path.join(tmp, "hf_llama_%d_%d" % (tie, kv))
        model = O.hf_llama(dict(cfg, n_kv_groups=kv, rope_base=base), seed, d, tie=tie)
        ids = np.array([[r.randrange(101) for _ in range(13)] for _ in range(2)], np.int32)
        want = O.hf_logits(model, ids)
        lm = attn.LanguageModel.load(d)
        close(lm.forward(ids), want, "LlamaForCausalLM (kv heads %d, theta %g, tied %s) from "
              "save_pretrained" % (kv, base, tie))
        cache = lm.new_cache(2, 20)
        got = np.concatenate([lm.forward(ids[:, :6], cache=cache)] +
                             [lm.forward(ids[:, t:t + 1], cache=cache) for t in range(6, 13)],
                             axis=1)
        close(got, want, "LlamaForCausalLM: prefill 6 + 7 cached steps")

    # a sharded checkpoint (what save_pretrained writes for a large model):
    # the index read, each tensor from its shard, the same logits; from the
    # directory and from the index itself
    sharded = os.path.join(tmp, "hf_llama_sharded")
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="16KB")
    shards = sorted(f for f in os.listdir(sharded) if f.endswith(".safetensors"))
    index_path = os.path.join(sharded, "model.safetensors.index.json")
    check(len(shards) > 2 and os.path.exists(index_path),
          "save_pretrained sharded the model: %s" % shards)
    close(attn.LanguageModel.load(sharded).forward(ids), want,
          "LlamaForCausalLM in %d shards, from its directory" % len(shards))
    close(attn.LanguageModel.load(index_path).forward(ids), want,
          "LlamaForCausalLM in %d shards, from its index" % len(shards))
    # one shard file open at a time: 16 shards under a limit of 12 descriptors
    import resource
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (12, 12)); "
            "import attn; attn.LanguageModel.load(sys.argv[1]); print('loaded')")
    limited = subprocess.run([sys.executable, "-c", code, sharded], capture_output=True,
                             text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    check(limited.returncode == 0 and "loaded" in limited.stdout,
          "16 shards load under 12 open files: %s" %
          (limited.stdout + limited.stderr).strip()[-300:])
    # indexes that name what is not there, or reach outside their directory
    import json
    with open(index_path) as f:
        index = json.load(f)
    names = sorted(index["weight_map"])
    moved, other = names[0], next(n for n in names if index["weight_map"][n] !=
                                  index["weight_map"][names[0]])
    save_file({"model.norm.weight": np.ones(64, np.float32),
               "extra.weight": np.zeros(2, np.float32)}, os.path.join(sharded, "extra.safetensors"))
    bad_maps = (
        ({moved: "model-missing.safetensors"}, "model-missing.safetensors: cannot open"),
        ({moved: index["weight_map"][other]}, "which holds no such tensor"),
        ({moved: "../" + index["weight_map"][moved]}, "must be the name of a file beside"),
        ({"extra.weight": "extra.safetensors"}, "'model.norm.weight' is in two shards"))
    for change, said in bad_maps:
        O.write_json(dict(index, weight_map=dict(index["weight_map"], **change)), index_path)
        try:
            attn.LanguageModel.load(sharded)
            check(False, "an index mapping %s: no error" % change)
        except attn.AttnError as err:
            check(said in str(err), "an index mapping %s refused: %s" % (change, err))
    # a key given twice: the last mapping counts, as in Python's json (and transformers)
    text = json.dumps(index)
    wrong = json.dumps({moved: index["weight_map"][other]})[1:-1]
    with open(index_path, "w") as f:
        f.write(text.replace('"weight_map": {', '"weight_map": {' + wrong + ", ", 1))
    close(attn.LanguageModel.load(sharded).forward(ids), want,
          "an index naming %s twice, the last right" % moved)
    O.write_json(index, index_path)

    # config flags that change the arithmetic, at other than the book's values:
    # refused by name (they were read past, and the logits differed from HF's)
    import json
    gpt2_dir, llama_dir = os.path.join(tmp, "hf_gpt2_0"), d
    for where, key, value in ((gpt2_dir, "scale_attn_weights", False),
                              (gpt2_dir, "scale_attn_by_inverse_layer_idx", True),
                              (llama_dir, "hidden_act", "gelu")):
        with open(os.path.join(where, "config.json")) as f:
            hf = json.load(f)
        hf[key] = value
        bad = os.path.join(tmp, "bad_%s" % key)
        os.makedirs(bad, exist_ok=True)
        O.write_json(hf, os.path.join(bad, "config.json"))
        try:
            attn.LanguageModel.load(os.path.join(where, "model.safetensors"),
                                    config=os.path.join(bad, "config.json"))
            check(False, "config %s %s: no error" % (key, json.dumps(value)))
        except attn.AttnError as err:
            check(err.status == "ATTN_ERR_INVALID" and key in str(err) and
                  json.dumps(value).strip('"') in str(err),
                  "config %s %s refused: %s" % (key, json.dumps(value), err))

    # other models' configs over the same tensor names: a feature the book's
    # models lack is refused by name, never run without it (Mistral's window
    # loaded as Llama and attended past it; a value of the wrong type was
    # read as absent)
    def with_config(where, changes, name):
        with open(os.path.join(where, "config.json")) as f:
            hf = json.load(f)
        for key, value in changes.items():
            if value is KeyError:
                hf.pop(key, None)
            else:
                hf[key] = value
        path = os.path.join(tmp, "cfg_%s.json" % name)
        O.write_json(hf, path)
        return attn.LanguageModel.load(os.path.join(where, "model.safetensors"), config=path)

    ctx_len = 128
    refused = (
        (llama_dir, {"model_type": "mistral", "sliding_window": 8}, "sliding_window 8"),
        (llama_dir, {"model_type": "mistral", "sliding_window": KeyError}, "sliding_window 4096"),
        # transformers' Mistral reads no use_sliding_window (Qwen2's key)
        (llama_dir, {"model_type": "mistral", "sliding_window": 8, "use_sliding_window": False},
         "sliding_window 8"),
        (llama_dir, {"model_type": "gemma"}, 'model_type "gemma"'),
        (llama_dir, {"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        (llama_dir, {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        (llama_dir, {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        (llama_dir, {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
         'rope_parameters of type "yarn"'),
        (llama_dir, {"hidden_act": 3}, '"hidden_act" must be a string'),
        (llama_dir, {"hidden_act": None}, '"hidden_act" must be a string'),
        (gpt2_dir, {"activation_function": {"relu": 1}}, '"activation_function" must be a string'),
        (gpt2_dir, {"model_type": "gptj"}, 'model_type "gptj"'),
    )
    for i, (where, changes, said) in enumerate(refused):
        if "max_position_embeddings" in json.load(open(os.path.join(where, "config.json"))):
            changes = dict(changes, max_position_embeddings=max(ctx_len, 8192))
        try:
            with_config(where, changes, "refused%d" % i)
            check(False, "config %s: no error" % changes)
        except attn.AttnError as err:
            check(said in str(err), "config %s refused: %s" % (changes, err))
    # accepted as Llama: Mistral without a window, or with one that covers the
    # context, and Llama with any; transformers 5's rope_parameters, read as rope_theta and
    # rope_scaling are (the same logits as the older keys; other than without)
    ids = np.array([[r.randrange(101) for _ in range(40)]], np.int32)
    plain = with_config(llama_dir, {}, "plain").forward(ids)
    # (a null window is no window, at any context; Llama reads no window)
    for i, changes in enumerate(({"model_type": "mistral", "sliding_window": None,
                                  "max_position_embeddings": 32768},
                                 {"model_type": "mistral", "sliding_window": 128},
                                 {"model_type": "llama", "sliding_window": 4},
                                 {"sliding_window": 4},
                                 {"rope_parameters": {"rope_type": "default",
                                                      "rope_theta": 10000.0}})):
        close(with_config(llama_dir, changes, "same%d" % i).forward(ids), plain,
              "config %s: the plain model's logits" % changes)
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    v4 = with_config(llama_dir, {"rope_theta": 500000.0,
                                 "rope_scaling": dict(scaling, rope_type="llama3")}, "v4")
    v5 = with_config(llama_dir, {"rope_theta": KeyError, "rope_scaling": KeyError,
                                 "rope_parameters": dict(scaling, rope_type="llama3",
                                                         rope_theta=500000.0)}, "v5")
    check(np.array_equal(v4.forward(ids), v5.forward(ids)) and
          not np.allclose(v4.forward(ids), plain),
          "rope_parameters (llama3, theta 5e5): the logits of rope_theta + rope_scaling")


def run_single(seed, kernels):
    import numpy as np  # noqa: F401
    import lm_oracle as O
    r = random.Random(seed)
    print("kernels %s, seed %d" % (kernels, seed), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for i, cfg in enumerate(gpt2_configs(r)):
            s = r.randrange(1 << 30)
            name = "gpt2[%d] emb=%d heads=%d layers=%d bias=%s seed=%d" % (
                i, cfg["emb_dim"], cfg["n_heads"], cfg["n_layers"], cfg["qkv_bias"], s)
            if i == 0:
                check_weights(O, cfg, s, False, name)
            lm, model, path, ref, ids = forward_checks(O, cfg, s, False, name, r, tmp)
            if i == 0:
                loading_checks(O, cfg, False, name, path, ref, ids, tmp)
        for i, cfg in enumerate(llama_configs(r)):
            s = r.randrange(1 << 30)
            name = "llama3[%d] kv=%d base=%g scaling=%s seed=%d" % (
                i, cfg["n_kv_groups"], cfg["rope_base"],
                cfg["rope_freq"]["factor"] if cfg["rope_freq"] else None, s)
            if i == 0:
                check_weights(O, cfg, s, True, name)
            lm, model, path, ref, ids = forward_checks(O, cfg, s, True, name, r, tmp)
            if i in (0, 1):
                loading_checks(O, cfg, True, name, path, ref, ids, tmp)
        gpt2_from_shapes(O, r, tmp)
        hf_checks(O, r, tmp)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--kernels", default=None,
                    help="comma-separated kernel sets (default: every one the CPU runs)")
    ap.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ["ATTN_LIBRARY"] = args.lib
    if args.single:
        if args.seed is None:
            args.seed = int.from_bytes(os.urandom(4), "little")
        run_single(args.seed, os.environ.get("ATTN_KERNELS", "auto"))
        print("%d passed, %d failed" % (results["passed"], results["failed"]))
        return 1 if results["failed"] else 0
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print("run seed %d (replay with --seed %d)" % (seed, seed), flush=True)
    import attn  # noqa: F401  (fails early when the library cannot load)
    from attn._lib import lib
    kernels = args.kernels.split(",") if args.kernels else [
        k for k, v in (("auto", 0), ("reference", 1), ("portable", 2), ("avx2", 3),
                       ("avx512", 4)) if v == 0 or lib.attn_kernels_supported(v)]
    failed = 0
    for k in kernels:
        env = dict(os.environ)
        if k == "auto":
            env.pop("ATTN_KERNELS", None)
        else:
            env["ATTN_KERNELS"] = k
        rc = subprocess.call([sys.executable, "-W", "ignore", os.path.abspath(__file__),
                              args.lib, "--seed", str(seed), "--single"], env=env)
        failed += rc != 0
    print("kernel sets: %d passed, %d failed" % (len(kernels) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
