"""The Python package under hostile use: every answer is either the right
value (against float64 math written out here in torch, or the package's own
sequential results) or a clear exception naming the argument; never a wrong
value, a wrapped integer, a crash or a silent stop.

  - second derivatives through attn.torch raise, never return constants;
  - tensors the backward reads (cu_seqlens, alibi slopes) changed in place
    between forward and backward are caught by autograd;
  - integers and ids past C's types (ids >= 2**31, 2**32 + t, negative
    counts, floats for ints, int64 offsets past int32, int64 q/k/v) raise
    TypeError/ValueError naming the argument, in LanguageModel, Tokenizer,
    KVCache, modules and attn.torch;
  - generate's on_token: an exception is raised again after the call, None
    goes on, False stops;
  - messages: a missing config key, Tokenizer.encode(bytes), head_dim 0,
    supports() and the call agreeing (scale 1e39);
  - one LanguageModel, one module and one tokenizer shared by threads give
    the results of sequential calls;
  - a sweep: attn.torch (and patch()) on non-contiguous, flipped,
    overlapping (expand, stride 0), zero-size, wrong-dtype and
    requires_grad-mixed tensors, against float64 math; the package's other
    entry points with wrong types and extreme values;
  - scaled_dot_product_attention's flags and numbers of PyTorch's types
    only (a string is_causal or scale, a scale tensor that requires grad:
    PyTorch's TypeError);
  - where PyTorch answers, its answer: additive masks holding +inf or NaN
    (NaN rows), mask dtypes it refuses (its RuntimeError), functional's
    dropout_p=1.0 (zeros, and zero gradients), the modules' scale 0 and
    negative scales; None or a number for a path or a tokenizer is a
    TypeError naming the argument.
usage: test_hostile_python.py LIBATTN_SO   (torch >= 1.13)
"""
import os
import signal
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
if len(sys.argv) > 1:
    os.environ["ATTN_LIBRARY"] = sys.argv[1]
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attn  # noqa: E402
import attn.functional as AF  # noqa: E402
import attn.torch as AT  # noqa: E402

T0 = time.time()
TORCH_SDPA = getattr(F, "scaled_dot_product_attention", None)  # PyTorch's own (>= 2.0)
passed = failed = 0
tried = {}  # surface -> inputs tried


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)
        sys.stdout.flush()
    return cond


def count(surface, n=1):
    tried[surface] = tried.get(surface, 0) + n


def raises(fn, kinds, words, what, surface):
    """fn() raises one of kinds with every word in its message."""
    count(surface)
    try:
        result = fn()
    except kinds as err:
        msg = str(err)
        return check(all(w in msg for w in words), f"{what}: {type(err).__name__} {msg!r} "
                     f"lacks {words}")
    except Exception as err:  # noqa: BLE001 - any other kind is the failure reported
        return check(False, f"{what}: {type(err).__name__} {err!r}, not {kinds}")
    return check(False, f"{what}: no error (returned {type(result).__name__})")


def section(fn):
    """Runs one section; an unexpected exception is a failure, and the
    sections after it still run."""
    try:
        fn()
    except Exception:  # noqa: BLE001
        check(False, f"{fn.__name__} raised:\n{traceback.format_exc()}")
    return fn


def close(got, want, tol):
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape:
        return False
    if want.numel() == 0:
        return True
    return float((got - want).abs().max()) <= tol * max(1.0, float(want.abs().max()))


def math_sdpa(q, k, v, causal=False, scale=None, gqa=False):
    """PyTorch's SDPA math in float64 (top-left causal), differentiable."""
    q, k, v = q.double(), k.double(), v.double()
    E = q.size(-1)
    s = (1.0 / E ** 0.5 if E else 1.0) if scale is None else scale
    if gqa and q.dim() == 4 and k.size(1) != q.size(1):
        k = k.repeat_interleave(q.size(1) // k.size(1), 1)
        v = v.repeat_interleave(q.size(1) // v.size(1), 1)
    scores = (q @ k.transpose(-2, -1)) * s
    if causal:
        L, S = q.size(-2), k.size(-2)
        keep = torch.ones(L, S, dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, -1) @ v


TINY = dict(vocab_size=300, context_length=24, emb_dim=16, n_heads=2, n_layers=2,
            qkv_bias=True)


def tiny_tokenizer(directory):
    """A tiktoken file of the 256 bytes (ranks 0..255): vocabulary 256 plus
    Llama 3's special tokens."""
    import base64
    path = os.path.join(directory, "bytes.tiktoken")
    with open(path, "w") as f:
        for i in range(256):
            f.write(f"{base64.b64encode(bytes([i])).decode()} {i}\n")
    return path


# ---- second derivatives ---------------------------------------------------------


@section
def second_order():
    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    out = AT.scaled_dot_product_attention(x, x, x)
    g, = torch.autograd.grad(out.sum(), x, create_graph=True)
    want_g, = torch.autograd.grad(math_sdpa(x, x, x).sum(), x)
    check(close(g, want_g, 1e-10), "create_graph=True: the first derivative is still right")
    raises(lambda: (out.sum() + (g ** 2).sum()).backward(), RuntimeError,
           ["not differentiable", "create_graph"], "a gradient penalty through attn", "autograd")
    # under patch(): the same call through F
    with AT.patched():
        out = F.scaled_dot_product_attention(x, x, x, is_causal=True)
        g, = torch.autograd.grad(out.sum(), x, create_graph=True)
    raises(lambda: torch.autograd.grad((g ** 2).sum(), x), RuntimeError,
           ["not differentiable"], "double backward under patch()", "autograd")
    # flash_attn_func, with an incoming gradient that needs a graph itself
    q = torch.randn(1, 5, 2, 4, dtype=torch.float64, requires_grad=True)
    out = AT.flash_attn_func(q, q, q, causal=True)
    w = torch.randn_like(out, requires_grad=True)
    g, = torch.autograd.grad(out, q, w, create_graph=True)
    raises(lambda: torch.autograd.grad(g.sum(), w), RuntimeError, ["not differentiable"],
           "flash_attn_func: differentiating its gradient", "autograd")
    # a batched incoming gradient (vmap over the backward) has no memory for
    # attn's kernels to read: an error that says so, and how to go on
    out = AT.scaled_dot_product_attention(x, x, x)
    rows = torch.eye(out.numel(), dtype=out.dtype).view(-1, *out.shape)
    raises(lambda: torch.autograd.grad(out, x, rows, is_grads_batched=True),
           NotImplementedError, ["is_grads_batched=True", "unbatched"],
           "autograd.grad(..., is_grads_batched=True) through attn", "autograd")
    raises(lambda: torch.autograd.functional.jacobian(
               lambda a: AT.flash_attn_func(a, a, a), q.detach(), vectorize=True),
           NotImplementedError, ["vectorize=False"], "jacobian(vectorize=True) of flash_attn_func",
           "autograd")
    # without create_graph nothing changes: the gradient is the math's
    x.grad = None
    AT.scaled_dot_product_attention(x, x, x).sum().backward()
    check(close(x.grad, want_g, 1e-10), "a plain backward: the math's gradient")


# ---- tensors the backward reads, changed in place ----------------------------------


@section
def saved_tensors():
    torch.manual_seed(1)
    q, k, v = (torch.randn(7, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    out = AT.flash_attn_varlen_func(q, k, v, cu, cu, 4, 4)
    cu[1] = 5
    raises(lambda: out.sum().backward(), RuntimeError, ["modified by an inplace operation"],
           "cu_seqlens changed between forward and backward", "autograd")
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 7], dtype=torch.int32)
    out = AT.flash_attn_varlen_func(q, k, v, cu, cu_k, 4, 4)
    cu_k[1] = 1
    raises(lambda: out.sum().backward(), RuntimeError, ["modified by an inplace operation"],
           "cu_seqlens_k changed between forward and backward", "autograd")
    slopes = torch.rand(2)
    out = AT.flash_attn_func(q[None].float(), k[None].float(), v[None].float(),
                             alibi_slopes=slopes)
    slopes.mul_(3)
    raises(lambda: out.sum().backward(), RuntimeError, ["modified by an inplace operation"],
           "alibi_slopes changed between forward and backward", "autograd")
    # an int64 cu_seqlens is converted: changing the caller's copy cannot
    # reach the backward, whose gradient stays the forward's
    cu64 = torch.tensor([0, 3, 7])
    q.grad = None
    AT.flash_attn_varlen_func(q, k, v, cu64, cu64, 4, 4).sum().backward()
    want = q.grad.clone()
    q.grad = None
    out = AT.flash_attn_varlen_func(q, k, v, cu64, cu64, 4, 4)
    cu64[1] = 5
    out.sum().backward()
    check(torch.equal(q.grad, want), "an int64 cu_seqlens changed after the forward: the "
          "backward uses the forward's offsets")


# ---- values that wrap ----------------------------------------------------------------


@section
def wrapping():
    lm = attn.LanguageModel(TINY, seed=3, num_threads=1)
    S = "LanguageModel"
    for ids, kind, word in (([1, 2**31], ValueError, "2147483648"),
                            ([1, 2**32 + 5], ValueError, "4294967301"),
                            (np.array([1, 2**32 + 5], np.int64), ValueError, "4294967301"),
                            ([1, -1], ValueError, "-1"),
                            ([1.0, 2.0], TypeError, "float"),
                            (np.array([1.7]), TypeError, "float"),
                            ([[1, 2], [3, 4]], ValueError, "(2, 2)"),
                            ([True, False], TypeError, "bool"),
                            ("12", TypeError, "str")):
        raises(lambda: lm.generate(ids, 2), kind, ["ids", word], f"generate ids {ids!r}", S)
    raises(lambda: lm.generate([1], 2, stop_tokens=[2**32 + 7]), ValueError,
           ["stop_tokens", "4294967303"], "stop_tokens 2**32 + 7", S)
    raises(lambda: lm.generate([1], 2, stop_tokens=[7.0]), TypeError, ["stop_tokens"],
           "stop_tokens of floats", S)
    for name, kw, word in (("max_new_tokens", dict(max_new_tokens=-3), "-3"),
                           ("max_new_tokens", dict(max_new_tokens=2.5), "2.5"),
                           ("top_k", dict(top_k=-2, temperature=1.0, seed=1), "-2"),
                           ("page_size", dict(page_size=-4, cache="paged"), "-4"),
                           ("seed", dict(seed=-1, temperature=1.0), "-1"),
                           ("temperature", dict(temperature=float("nan")), "nan"),
                           # inf is refused, so the range it gives is open there
                           ("temperature", dict(temperature=float("inf")), "[0.0, inf)"),
                           ("top_p", dict(top_p=2.0), "2.0")):
        args = dict(max_new_tokens=2)
        args.update(kw)
        raises(lambda: lm.generate([1, 2], **args), (TypeError, ValueError), [name, word],
               f"generate {kw}", S)
    raises(lambda: lm.new_cache(batch=-1, max_len=4), ValueError, ["batch", "-1"],
           "new_cache batch -1", S)
    raises(lambda: lm.new_cache(batch=1, max_len=4, page_size=-1, layout="paged"), ValueError,
           ["page_size", "-1"], "new_cache page_size -1", S)
    raises(lambda: lm.new_cache(batch=1, max_len=4, page_size=2**63, layout="paged"),
           attn.AttnError, ["page_size (9223372036854775808)"], "new_cache page_size 2**63", S)
    for kw, words in (({"dtype": None}, ["dtype is None"]), ({"dtype": ["f32"]}, ["dtype", "['f32']"]),
                      ({"layout": ["paged"]}, ["layout", "['paged']"]),
                      ({"k_dtype": "int2"}, ["k_dtype", "'int2'"])):
        raises(lambda: lm.new_cache(1, 4, **kw), ValueError, words, f"new_cache {kw}", S)
    raises(lambda: lm.forward(np.array([[1, 2**32 + 1]])), ValueError, ["ids", "4294967297"],
           "forward id 2**32 + 1", S)
    raises(lambda: lm.forward([[1, 2], [2**31]]), ValueError, ["ids[1]", "2147483648"],
           "forward ragged id 2**31", S)
    raises(lambda: lm.forward(np.ones((1, 2), np.float32)), TypeError, ["ids", "float32"],
           "forward float ids", S)
    cache = lm.new_cache(1, 8)
    raises(lambda: cache.length(seq=-1), ValueError, ["seq", "-1"], "cache.length(-1)", S)
    raises(lambda: cache.reset(seq=-1), ValueError, ["seq", "-1"], "cache.reset(-1)", S)
    raises(lambda: attn.LanguageModel(TINY, num_threads=-2), ValueError,
           ["num_threads", "-2"], "num_threads -2", S)
    # ids in range still go through, and the vocabulary is still the library's check
    check(list(lm.generate(np.array([1, 2], np.int64), 3)) == list(lm.generate([1, 2], 3)),
          "int64 and list prompts give the same tokens")
    raises(lambda: lm.generate([300], 2), attn.AttnError, ["300"], "id == vocab_size", S)

    with tempfile.TemporaryDirectory() as d:
        tok = attn.Tokenizer(tiny_tokenizer(d))
        T = "Tokenizer"
        check(tok.decode([72, 105]) == "Hi", "decode [72, 105]")
        raises(lambda: tok.decode([2**32 + 72]), ValueError, ["ids", "4294967368"],
               "decode 2**32 + 72", T)
        raises(lambda: tok.decode([-1]), ValueError, ["ids", "-1"], "decode -1", T)
        raises(lambda: tok.decode([72.0]), TypeError, ["ids"], "decode floats", T)
        raises(lambda: tok.decode(5), ValueError, ["ids"], "decode a bare int", T)
        raises(lambda: tok.decode([10**6]), attn.AttnError, ["1000000"], "decode past vocab", T)

    S = "attn.torch"
    q = torch.randn(7, 2, 4)
    big = torch.tensor([0, 3, 2**32 + 7])
    raises(lambda: AT.flash_attn_varlen_func(q, q, q, big, torch.tensor([0, 3, 7]), 4, 4),
           ValueError, ["cu_seqlens_q", "4294967303"], "int64 offsets past 2**32", S)
    raises(lambda: AT.flash_attn_varlen_func(q, q, q, torch.tensor([0., 3., 7.]),
                                             torch.tensor([0, 3, 7]), 4, 4),
           TypeError, ["cu_seqlens_q", "float"], "float offsets", S)
    raises(lambda: AT.flash_attn_varlen_func(q, q, q, torch.tensor([0, 3, 7]),
                                             torch.tensor([0, 3, 7]), -4, 4),
           ValueError, ["max_seqlen_q", "-4"], "max_seqlen_q -4", S)
    raises(lambda: AT.flash_attn_varlen_func(q, q, q, torch.tensor([0, 3, 7]),
                                             torch.tensor([0, 3, 7]), 4.5, 4),
           TypeError, ["max_seqlen_q"], "max_seqlen_q 4.5", S)
    qi = torch.randint(0, 5, (1, 3, 2, 4))
    raises(lambda: AT.flash_attn_func(qi, qi, qi), TypeError, ["int64"], "int64 q, k, v", S)
    raises(lambda: AT.flash_attn_func(q[None], q[None], q[None], window_size=(2.5, 0)),
           TypeError, ["window_size[0]"], "window_size of floats", S)
    raises(lambda: AT.flash_attn_func(q[None], q[None], q[None], dropout_p="0.1"), TypeError,
           ["dropout_p"], "dropout_p a str", S)

    M = "modules"
    for make, word in ((lambda: attn.MultiHeadAttention(4, 4, -8, 0.0, num_heads=2),
                        "context_length"),
                       (lambda: attn.MultiHeadAttention(4, 4, 8, 0.0, num_heads=-2),
                        "num_heads"),
                       (lambda: attn.MultiHeadAttention(4.0, 4, 8, 0.0, num_heads=2), "d_in"),
                       (lambda: attn.MultiHeadAttention(4, 4, 8, -0.5, num_heads=2), "dropout"),
                       (lambda: attn.GroupedQueryAttention(8, 8, 0.0, 4, -2), "num_kv_groups"),
                       (lambda: attn.CausalAttention(3, 2, 4, 0.0, qkv_bias="yes"), "qkv_bias"),
                       (lambda: attn.rand(-2, 3), "size[0]"),
                       (lambda: attn.set_num_threads(2.0), "n"),
                       (lambda: attn.manual_seed(2**64), "seed")):
        raises(make, (TypeError, ValueError), [word], f"module argument {word}", M)
    # past attn_ctx_config's limit of 4096 threads: refused where the count is
    # given, naming it and the limit, and the count in force kept
    threads = attn.get_num_threads()
    raises(lambda: attn.set_num_threads(4097), ValueError, ["set_num_threads", "4097", "4096"],
           "set_num_threads(4097)", M)
    check(attn.get_num_threads() == threads,
          f"a refused set_num_threads keeps {threads}: {attn.get_num_threads()}")
    raises(lambda: attn.LanguageModel(TINY, num_threads=4097), ValueError,
           ["num_threads", "4097", "4096"], "LanguageModel num_threads 4097", M)
    q = np.zeros((1, 2, 3, 4), np.float32)
    raises(lambda: AF.scaled_dot_product_attention(q, q, q, num_threads=4097), ValueError,
           ["num_threads", "4097", "4096"], "functional num_threads 4097", M)
    check(AF.scaled_dot_product_attention(q, q, q, num_threads=4096).shape == q.shape,
          "functional num_threads 4096 runs")


# ---- callbacks ----------------------------------------------------------------------------


@section
def callbacks():
    lm = attn.LanguageModel(TINY, seed=3, num_threads=1)
    S = "LanguageModel"
    want = list(lm.generate([5, 6], 6))
    check(len(want) == 6, f"6 greedy tokens: {want}")
    seen = []
    got = list(lm.generate([5, 6], 6, on_token=seen.append))  # returns None: goes on
    check(got == want and seen == want, f"on_token returning None goes on: {got}, saw {seen}")
    got = list(lm.generate([5, 6], 6, on_token=lambda t: len(seen) < 0))
    check(got == want[:1], f"on_token returning False stops after the first: {got}")
    got = list(lm.generate([5, 6], 6, on_token=lambda t: True))
    check(got == want, "on_token returning True goes on")
    # on_token may not call back into the model or the cache the run uses (the
    # run would go on with them changed); another model is fine
    cache = lm.new_cache(1, 16)
    for what, call in (("reset the cache", lambda t: cache.reset()),
                       ("generate again", lambda t: lm.generate([1], 2)),
                       ("forward on the cache", lambda t: lm.forward([[7]], cache=cache))):
        raises(lambda: lm.generate([5, 6], 6, cache=cache, on_token=call), RuntimeError,
               ["on_token callback", "may not call into them"], f"on_token that would {what}", S)
    other = attn.LanguageModel(TINY, seed=4, num_threads=1)
    got = list(lm.generate([5, 6], 6, on_token=lambda t: (other.generate([1], 2), None)[1]))
    check(got == want and list(lm.generate([5, 6], 6, cache=cache)) == want,
          "on_token may run another model; the model and cache work after a refusal")
    # Ctrl-C while the C call runs stops it and raises KeyboardInterrupt (it was
    # raised where ctypes enters the callback, printed, and the run went on)
    slow = attn.LanguageModel({"vocab_size": 2000, "context_length": 1024, "emb_dim": 256,
                               "n_heads": 4, "n_layers": 8}, seed=3, num_threads=1)
    # Python's own handler, as in a terminal (a job started in the background
    # without job control inherits SIGINT ignored)
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        slow.generate([1, 2, 3], 1000, on_token=lambda t: None)
        check(False, "Ctrl-C during generate: no KeyboardInterrupt")
    except KeyboardInterrupt:
        check(signal.getsignal(signal.SIGINT) is signal.default_int_handler,
              "Ctrl-C during generate: KeyboardInterrupt, Python's handler back")
    timer.join()
    signal.signal(signal.SIGINT, started_with)

    class Stop(Exception):
        pass

    calls = []

    def boom(token):
        calls.append(token)
        if len(calls) == 2:
            raise Stop(f"stop at {token}")
        return True

    count(S)
    try:
        lm.generate([5, 6], 6, on_token=boom)
        check(False, "an exception in on_token: generate returned")
    except Stop as err:
        frames = [f.name for f in traceback.extract_tb(err.__traceback__)]
        check("boom" in frames and len(calls) == 2,
              f"an exception in on_token is raised again, with its traceback: {frames}, "
              f"{len(calls)} calls")
    # a result whose truth raises (a numpy array of two values) stops the run likewise
    calls.clear()
    count(S)
    try:
        lm.generate([5, 6], 6, on_token=lambda t: calls.append(t) or np.array([1, 2]))
        check(False, "on_token's result without a truth value: generate returned")
    except ValueError as err:
        check("truth value" in str(err) and len(calls) == 1,
              f"on_token's result without a truth value is raised again: {err}, "
              f"{len(calls)} calls")
    raises(lambda: lm.generate([5, 6], 3, on_token=5), TypeError, ["on_token"],
           "on_token not callable", S)
    # the model still works after a callback raised
    check(list(lm.generate([5, 6], 6)) == want, "generate after a raising callback")


# ---- messages -----------------------------------------------------------------------------


@section
def messages():
    S = "LanguageModel"
    for key in ("vocab_size", "emb_dim", "n_layers"):
        cfg = dict(TINY)
        del cfg[key]
        raises(lambda: attn.LanguageModel(cfg), ValueError, ["config", key],
               f"config without {key}", S)
    cfg = dict(TINY, rope_base=500000.0, hidden_dim=32, n_kv_groups=1,
               rope_freq={"factor": 8.0})
    raises(lambda: attn.LanguageModel(cfg), ValueError, ["rope_freq", "low_freq_factor"],
           "rope_freq without its keys", S)
    # an empty dict or a false value is not None: not read as no scaling
    for empty, kinds, words in (({}, ValueError, ["rope_freq", "factor"]),
                                (0, TypeError, ["rope_freq", "expected a dict"]),
                                (dict(factor=0.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_context_length=8), ValueError,
                                 ["rope_freq", "factor", "must be positive"])):
        cfg = dict(TINY, rope_base=500000.0, hidden_dim=32, n_kv_groups=1, rope_freq=empty)
        raises(lambda: attn.LanguageModel(cfg), kinds, words, f"rope_freq {empty!r}", S)
    raises(lambda: attn.LanguageModel(dict(TINY, emb_dim="16")), TypeError,
           ["emb_dim"], "emb_dim a str", S)
    raises(lambda: attn.LanguageModel([1, 2]), TypeError, ["config"], "config a list", S)
    # a given epsilon of 0 is kept (PyTorch's LayerNorm(eps=0)), not replaced by 1e-5
    lm0 = attn.LanguageModel(dict(TINY, norm_eps=0.0), seed=3, num_threads=1)
    lm1 = attn.LanguageModel(TINY, seed=3, num_threads=1)
    count(S, 2)
    check(lm0.config["norm_eps"] == 0.0 and lm1.config["norm_eps"] in (0.0, 1e-5),
          f"norm_eps 0 kept: {lm0.config['norm_eps']!r}")
    ids = np.array([[1, 2, 3, 4]], np.int32)
    check(not np.array_equal(lm0.forward(ids), lm1.forward(ids)),
          "norm_eps 0 gives other logits than the default 1e-5")
    raises(lambda: attn.LanguageModel(dict(TINY, rope_base=0.0, hidden_dim=32, n_kv_groups=1)),
           ValueError, ["rope_base", "0"], "rope_base 0", S)
    # load is strict as load_state_dict(strict=True) is; strict=False ignores extras
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "lm.safetensors")
        lm1.save(path)
        tensors = attn.load_file(path)
        tensors["extra.weight"] = np.zeros(3, np.float32)
        attn.save_file(tensors, path)
        raises(lambda: attn.LanguageModel.load(path, config=TINY), attn.AttnError,
               ["extra.weight"], "an extra tensor, strict", S)
        loose = attn.LanguageModel.load(path, config=TINY, strict=False)
        count(S)
        check(np.array_equal(loose.forward(ids), lm1.forward(ids)),
              "strict=False loads the model's tensors and ignores the extra one")

    with tempfile.TemporaryDirectory() as d:
        tok = attn.Tokenizer(tiny_tokenizer(d))
        T = "Tokenizer"
        raises(lambda: tok.encode(b"Hi"), TypeError, ["encode", "str", "encode_bytes"],
               "encode(bytes)", T)
        raises(lambda: tok.encode(5), TypeError, ["encode", "str"], "encode(5)", T)
        # a lone surrogate has no UTF-8: named with its character index, as pretrain names it
        raises(lambda: tok.encode("Hi\ud800!"), ValueError,
               ["encode: text", "character 2", "U+D800"], "encode(lone surrogate)", T)
        raises(lambda: tok.encode_bytes("Hi"), TypeError, ["encode_bytes", "str"],
               "encode_bytes(str)", T)
        # an int is not a length of NULs, an int32 array's buffer not its values
        raises(lambda: tok.encode_bytes(5), TypeError, ["encode_bytes", "int"],
               "encode_bytes(5)", T)
        raises(lambda: tok.encode_bytes(np.array([72, 105], np.int32)), TypeError,
               ["encode_bytes", "4-byte items"], "encode_bytes(int32 array)", T)
        count(T, 1)
        check(tok.encode_bytes(np.array([72, 105], np.uint8)) == tok.encode_bytes(b"Hi")
              == tok.encode_bytes([72, 105]), "encode_bytes of uint8 values, a list, bytes")
        check(tok.encode("Hi") == [72, 105] and tok.encode_bytes(b"Hi") == [72, 105],
              "encode and encode_bytes of Hi")
        raises(lambda: attn.Tokenizer(os.path.join(d, "bytes.tiktoken\0x")), ValueError,
               ["NUL"], "a path with a NUL", T)

    S = "attn.torch"
    q = torch.randn(1, 2, 3, 0)
    v = torch.randn(1, 2, 3, 4)
    count(S)
    try:
        out = AT.scaled_dot_product_attention(q, q, v)
        check(close(out, v.double().mean(-2, keepdim=True).expand(1, 2, 3, 4), 1e-6),
              "head_dim 0: uniform weights (PyTorch's math path)")
    except Exception as err:  # noqa: BLE001
        check(False, f"head_dim 0: {type(err).__name__} {err}")
    # supports() and the call agree: what supports refuses goes to PyTorch
    x = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    for scale in (1e39, -1e39, 3.5e38, float("inf"), float("nan")):
        count(S)
        why = AT.supports(x, x, x, scale=scale)
        check(why is not None, f"supports(scale={scale}) says attn runs it")
        try:
            out = AT.scaled_dot_product_attention(x, x, x, scale=scale)
            # PyTorch's own answer, whatever it makes of a NaN scale
            want = (TORCH_SDPA(x, x, x, scale=scale) if TORCH_SDPA is not None
                    else math_sdpa(x, x, x, scale=scale))
            check(torch.equal(out.isnan(), want.isnan()) and close(out.nan_to_num(),
                                                                    want.nan_to_num(), 1e-12),
                  f"scale {scale}: PyTorch's answer")
        except Exception as err:  # noqa: BLE001
            check(False, f"scale {scale}: supports said {why!r} but the call raised {err!r}")
    for scale in (3.4e38, 1e-30, -2.0, 0.0):
        count(S)
        check(AT.supports(x, x, x, scale=scale) is None, f"supports(scale={scale})")
        check(close(AT.scaled_dot_product_attention(x, x, x, scale=scale),
                    math_sdpa(x, x, x, scale=scale), 1e-9), f"scale {scale} on attn")
    raises(lambda: AT.flash_attn_func(x.transpose(1, 2), x.transpose(1, 2), x.transpose(1, 2),
                                      softmax_scale=1e39),
           ValueError, ["softmax_scale"], "flash softmax_scale 1e39", S)


# ---- objects shared between threads ----------------------------------------------------------


def hammer(fn, inputs, rounds):
    """fn(x) for each x, sequentially, then from len(inputs) threads at once
    (rounds calls each); returns the calls that differed or raised."""
    want = [fn(x) for x in inputs]
    bad = []
    start = threading.Barrier(len(inputs))

    def worker(i):
        start.wait()
        for _ in range(rounds):
            try:
                got = fn(inputs[i])
            except Exception as err:  # noqa: BLE001
                bad.append(f"thread {i}: {err!r}")
                return
            if not np.array_equal(np.asarray(got), np.asarray(want[i])):
                d = np.abs(np.asarray(got, np.float64) - np.asarray(want[i], np.float64)).max()
                bad.append(f"thread {i}: differs by {d}")
                return
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return bad


@section
def threads():
    cfg = dict(TINY, emb_dim=64, n_heads=4, context_length=64)
    lm = attn.LanguageModel(cfg, seed=5, num_threads=1)
    r = np.random.default_rng(0)
    inputs = [r.integers(0, 300, (2, 48)).astype(np.int32) for _ in range(2)]
    count("threads")
    bad = hammer(lm.forward, inputs, 60)
    check(not bad, f"one LanguageModel, two threads: {bad[:2]}")
    count("threads")
    bad = hammer(lambda p: lm.generate(p, 8), [[1, 2, 3], [7, 8, 9, 10]], 20)
    check(not bad, f"one LanguageModel generating in two threads: {bad[:2]}")
    attn.manual_seed(0)
    mha = attn.MultiHeadAttention(32, 32, 64, 0.0, num_heads=4).eval()
    xs = [r.standard_normal((2, 64, 32)).astype(np.float32) for _ in range(2)]
    count("threads")
    bad = hammer(mha.forward, xs, 100)
    check(not bad, f"one MultiHeadAttention, two threads: {bad[:2]}")
    with tempfile.TemporaryDirectory() as d:
        tok = attn.Tokenizer(tiny_tokenizer(d))
        texts = ["hello world " * 200, "other text, longer " * 300]
        count("threads")
        bad = hammer(tok.encode, texts, 30)
        check(not bad, f"one Tokenizer, two threads: {bad[:2]}")


# ---- the sweep: attn.torch on every kind of tensor --------------------------------------------


def views(shape, dtype, g):
    """(description, tensor) pairs of shape: the ways a caller can hand a
    tensor over."""
    base = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    B, H, T, D = shape
    yield "contiguous", base
    bthd = torch.randn(B, T, H, D, generator=g, dtype=torch.float64).to(dtype)
    yield "transposed (B, T, H, D) storage", bthd.transpose(1, 2)
    yield "flipped tokens (flip copies: torch has no negative strides)", base.flip(2)
    yield "every other feature", torch.randn(B, H, T, 2 * D, generator=g,
                                             dtype=torch.float64).to(dtype)[..., ::2]
    yield "expanded batch (stride 0)", base[:1].expand(B, H, T, D)
    yield "expanded tokens (stride 0)", base[:, :, :1].expand(B, H, T, D)
    yield "overlapping rows (as_strided)", torch.randn(B * H * T + D, generator=g,
                                                       dtype=torch.float64).to(dtype).as_strided(
        (B, H, T, D), (H * T, T, 1, 1))
    yield "sliced heads", torch.randn(B, H + 2, T, D, generator=g,
                                      dtype=torch.float64).to(dtype)[:, 1:H + 1]


@section
def sweep_sdpa():
    S = "attn.torch sweep"
    g = torch.Generator().manual_seed(7)
    shapes = [(2, 2, 5, 4), (1, 3, 1, 8), (3, 1, 6, 2)]
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        for shape in shapes:
            vs = list(views(shape, dtype, g))
            for i, (qd, q) in enumerate(vs):
                kd, k = vs[(i + 3) % len(vs)]
                vd, v = vs[(i + 5) % len(vs)]
                for causal in (False, True):
                    for grads in ((True, True, True), (True, False, False), (False, False, True),
                                  (False, False, False)):
                        count(S)
                        what = f"{dtype} {shape} q {qd}, k {kd}, v {vd}, causal {causal}, " \
                               f"requires_grad {grads}"
                        # a detached view is a leaf with the view's strides (stride 0,
                        # overlapping rows and all) that can require grad itself
                        leaves = [t.detach().requires_grad_(r) for t, r in zip((q, k, v), grads)]
                        before = [t.clone() for t in leaves]
                        out = AT.scaled_dot_product_attention(*leaves, is_causal=causal)
                        want = math_sdpa(*[t.detach() for t in leaves], causal=causal)
                        check(close(out, want, tol), f"forward: {what}")
                        check(all(torch.equal(a, b) for a, b in zip(before, leaves)),
                              f"inputs unchanged: {what}")
                        if any(grads):
                            dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
                            out.backward(dout.to(out.dtype))
                            ref = [t.detach().double().requires_grad_(r)
                                   for t, r in zip(leaves, grads)]
                            math_sdpa(*ref, causal=causal).backward(dout)
                            for name, t, rt, r in zip("qkv", leaves, ref, grads):
                                if r:
                                    check(t.grad is not None and close(t.grad, rt.grad, tol * 10),
                                          f"d{name}: {what}")
    # strided views that require grad themselves (non-leaf views of a leaf)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        base = torch.randn(2, 7, 3, 8, generator=g, dtype=torch.float64).to(dtype)
        leaf = base.clone().requires_grad_(True)
        q = leaf.transpose(1, 2)[..., ::2]           # (2, 3, 7, 4), strided
        k = leaf.flip(1).transpose(1, 2)[..., 1::2]  # flipped tokens
        v = leaf[:1].expand(2, 7, 3, 8).transpose(1, 2)  # stride-0 batch
        count(S)
        out = AT.scaled_dot_product_attention(q, k, v, is_causal=True)
        dout = torch.randn(out.shape, generator=g, dtype=torch.float64)
        out.backward(dout.to(dtype))
        ref = base.double().clone().requires_grad_(True)
        math_sdpa(ref.transpose(1, 2)[..., ::2], ref.flip(1).transpose(1, 2)[..., 1::2],
                  ref[:1].expand(2, 7, 3, 8).transpose(1, 2), causal=True).backward(dout)
        check(close(out, math_sdpa(q.detach(), k.detach(), v.detach(), causal=True), tol),
              f"{dtype} views of one leaf: forward")
        check(close(leaf.grad, ref.grad, tol * 10), f"{dtype} views of one leaf: gradient")

    # zero sizes: PyTorch's answer (empty, or attention over nothing)
    for shape_q, shape_k in (((0, 2, 3, 4), (0, 2, 5, 4)), ((1, 0, 3, 4), (1, 0, 5, 4)),
                             ((1, 2, 0, 4), (1, 2, 5, 4))):
        count(S)
        q = torch.randn(shape_q, dtype=torch.float64)
        k = torch.randn(shape_k, dtype=torch.float64)
        out = AT.scaled_dot_product_attention(q, k, k)
        check(out.shape == math_sdpa(q, k, k).shape, f"zero-size {shape_q}: shape {out.shape}")
    count(S)
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    k = torch.randn(1, 2, 0, 4, dtype=torch.float64)
    out = AT.scaled_dot_product_attention(q, k, k)
    check(out.shape == (1, 2, 3, 4), f"no keys: shape {tuple(out.shape)}")

    # wrong dtypes, devices, ranks, shapes: PyTorch's own error or answer
    x = torch.randn(1, 2, 3, 4)
    for what, args in (("int64 q", (x.long(), x.long(), x.long())),
                       ("mixed dtypes", (x, x.double(), x)),
                       ("bool", (x > 0, x > 0, x > 0)),
                       ("rank 5", (x[None], x[None], x[None])),
                       ("key head_dim 3", (x, x[..., :3], x)),
                       ("complex", (x.to(torch.complex64),) * 3)):
        count(S)
        why = AT.supports(*args)
        check(why is not None, f"{what}: supports says attn runs it")
        try:
            out = AT.scaled_dot_product_attention(*args)
            # PyTorch ran it: a result of the query's dtype and the value's width
            check(out.dtype == args[0].dtype and out.shape[:-1] == args[0].shape[:-1],
                  f"{what}: PyTorch's result has dtype {out.dtype}, shape {tuple(out.shape)}")
        except (RuntimeError, TypeError, ValueError):
            pass  # PyTorch's own error
        except Exception as err:  # noqa: BLE001
            check(False, f"{what}: {err!r}")
    raises(lambda: AT.scaled_dot_product_attention(x, x, "v"), (TypeError, AttributeError,
                                                                 RuntimeError), [],
           "value a str", S)

    # patch(): F routed to attn, same answers, restored after
    count(S)
    q = torch.randn(2, 2, 5, 4, dtype=torch.float64)
    with AT.patched():
        check(AT.is_patched(), "patched() routes F")
        out = F.scaled_dot_product_attention(q, q.flip(2), q[..., ::1], is_causal=True)
    check(not AT.is_patched(), "patched() restores F")
    check(close(out, math_sdpa(q, q.flip(2), q, causal=True), 1e-10), "patched F: the math's")


@section
def sweep_flash():
    S = "attn.torch sweep"
    g = torch.Generator().manual_seed(11)

    def flash_math(q, k, v, causal):
        # (B, T, H, D) bottom-right causal through math_sdpa on (B, H, T, D)
        qh, kh, vh = (t.transpose(1, 2).double() for t in (q, k, v))
        T, Sk = qh.size(2), kh.size(2)
        s = (qh @ kh.transpose(-2, -1)) / q.size(-1) ** 0.5
        if causal:
            i = torch.arange(T)[:, None] + Sk - T
            s = s.masked_fill(torch.arange(Sk)[None, :] > i, float("-inf"))
        w = torch.softmax(s, -1).nan_to_num()
        return (w @ vh).transpose(1, 2)

    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 2e-5)):
        for T, Sk in ((4, 4), (3, 6), (1, 5)):
            for layout in ("contiguous", "flipped", "expanded"):
                count(S)
                q = torch.randn(2, T, 2, 4, generator=g, dtype=torch.float64).to(dtype)
                k = torch.randn(2, Sk, 2, 4, generator=g, dtype=torch.float64).to(dtype)
                v = torch.randn(2, Sk, 2, 4, generator=g, dtype=torch.float64).to(dtype)
                if layout == "flipped":
                    k, v = k.flip(1), v.flip(1)
                elif layout == "expanded":
                    k, v = k[:, :, :1].expand(2, Sk, 2, 4), v[:1].expand(2, Sk, 2, 4)
                for causal in (False, True):
                    out = AT.flash_attn_func(q, k, v, causal=causal)
                    check(close(out, flash_math(q, k, v, causal), tol),
                          f"flash {dtype} T {T} S {Sk} {layout} causal {causal}")
    x = torch.randn(1, 3, 2, 4)
    for what, call, kinds in (
            ("rank 3", lambda: AT.flash_attn_func(x[0], x[0], x[0]), ValueError),
            ("q a list", lambda: AT.flash_attn_func([1], x, x), ValueError),
            ("heads 2 vs 3", lambda: AT.flash_attn_func(x, torch.randn(1, 3, 3, 4),
                                                        torch.randn(1, 3, 3, 4)), ValueError),
            ("dropout 1.0", lambda: AT.flash_attn_func(x, x, x, dropout_p=1.0), ValueError),
            ("softcap -1", lambda: AT.flash_attn_func(x, x, x, softcap=-1.0), ValueError),
            ("softcap nan", lambda: AT.flash_attn_func(x, x, x, softcap=float("nan")),
             ValueError),
            ("window (1,)", lambda: AT.flash_attn_func(x, x, x, window_size=(1,)), ValueError),
            ("alibi (3,)", lambda: AT.flash_attn_func(x, x, x, alibi_slopes=torch.ones(3)),
             ValueError),
            ("block_table", lambda: AT.flash_attn_varlen_func(
                x[0], x[0], x[0], torch.tensor([0, 3]), torch.tensor([0, 3]), 3, 3,
                block_table=torch.zeros(1)), ValueError),
            ("offsets not ending at rows", lambda: AT.flash_attn_varlen_func(
                x[0], x[0], x[0], torch.tensor([0, 2]), torch.tensor([0, 3]), 3, 3),
             ValueError),
            ("offsets decreasing", lambda: AT.flash_attn_varlen_func(
                x[0], x[0], x[0], torch.tensor([0, 2, 1, 3]), torch.tensor([0, 1, 2, 3]), 3, 3),
             ValueError),
            ("max_seqlen too small", lambda: AT.flash_attn_varlen_func(
                x[0], x[0], x[0], torch.tensor([0, 3]), torch.tensor([0, 3]), 1, 3),
             ValueError),
            ("batches 1 vs 2", lambda: AT.flash_attn_func(x, x.expand(2, 3, 2, 4),
                                                          x.expand(2, 3, 2, 4)), ValueError)):
        raises(call, kinds, [], f"flash: {what}", S)
    # an empty batch is an empty result, as PyTorch's attention gives
    empty = AT.flash_attn_func(x[:0], x[:0], x[:0])
    check(empty.shape == (0, 3, 2, 4), f"flash: empty batch gives shape {tuple(empty.shape)}")


@section
def sweep_other_entry_points():
    S = "functional"
    q = np.random.default_rng(1).standard_normal((1, 2, 3, 4)).astype(np.float32)
    # float64 past float32's range: named, not an infinity every output turns NaN from
    big = q.astype(np.float64)
    big[0, 1, 2, 3] = -1e300
    model = attn.modules.MultiHeadAttention(4, 4, 3, 0.0, 2)
    state = {k: np.asarray(v, np.float64) for k, v in model.state_dict().items()}
    state["W_query.weight"].flat[0] = 1e300
    for what, call in (("functional q", lambda: AF.scaled_dot_product_attention(big, q, q)),
                       ("functional sinks", lambda: AF.scaled_dot_product_attention(
                           q, q, q, sinks=np.array([0.0, 1e300]))),
                       ("module input", lambda: model(big[0])),
                       ("load_state_dict", lambda: model.load_state_dict(state)),
                       ("save_file", lambda: attn.save_file(
                           {"w": np.array([1.0, 1e300])},
                           os.path.join(tempfile.mkdtemp(), "w.safetensors")))):
        raises(call, ValueError, ["beyond float32's range", "e+300"], f"{what} of 1e300", S)
    for what, call, kinds in (
            ("int q", lambda: AF.scaled_dot_product_attention(q.astype(np.int64), q, q),
             TypeError),
            ("rank 3", lambda: AF.scaled_dot_product_attention(q[0], q[0], q[0]), ValueError),
            ("num_threads 0", lambda: AF.scaled_dot_product_attention(q, q, q, num_threads=0),
             ValueError),
            ("kernels bogus", lambda: AF.scaled_dot_product_attention(q, q, q, kernels="x"),
             ValueError),
            ("seed -1", lambda: AF.scaled_dot_product_attention(q, q, q, dropout_p=0.1,
                                                                 seed=-1), ValueError),
            ("dropout without seed", lambda: AF.scaled_dot_product_attention(q, q, q,
                                                                             dropout_p=0.5),
             ValueError),
            ("offsets past int32", lambda: AF.scaled_dot_product_attention(
                q[0].transpose(1, 0, 2), q[0].transpose(1, 0, 2), q[0].transpose(1, 0, 2),
                cu_seqlens_q=np.array([0, 2**32 + 3]), cu_seqlens_kv=np.array([0, 3])),
             ValueError),
            ("scale inf", lambda: AF.scaled_dot_product_attention(q, q, q, scale=float("inf")),
             attn.AttnError),
            ("align bogus", lambda: AF.scaled_dot_product_attention(q, q, q, align="x"),
             ValueError),
            ("q_offset 2**64 + 1", lambda: AF.scaled_dot_product_attention(
                q, q, q, causal=True, q_offset=2**64 + 1), ValueError),
            ("q_offset 1.5", lambda: AF.scaled_dot_product_attention(q, q, q, q_offset=1.5),
             TypeError),
            ("window 2**64", lambda: AF.scaled_dot_product_attention(q, q, q,
                                                                     window=(2**64, 0)),
             ValueError),
            ("window of floats", lambda: AF.scaled_dot_product_attention(q, q, q,
                                                                         window=(1.5, 0)),
             TypeError),
            ("q_offset 2**62 + 1", lambda: AF.scaled_dot_product_attention(
                q, q, q, causal=True, q_offset=2**62 + 1), attn.AttnError),
            ("num_threads True", lambda: AF.scaled_dot_product_attention(q, q, q,
                                                                         num_threads=True),
             TypeError)):
        raises(call, kinds, [], f"functional: {what}", S)
    # scale=0.0 is a zero scale (every score 0: the values' mean), as PyTorch's,
    # not the library's 0 for 1/sqrt(D)
    count(S)
    got = AF.scaled_dot_product_attention(q, q, q, scale=0.0)
    want = np.broadcast_to(q.mean(axis=2, keepdims=True), q.shape)
    check(np.abs(got - want).max() < 1e-6, f"functional scale=0.0: {np.abs(got - want).max()}")
    count(S)
    out = AF.scaled_dot_product_attention(q[:, :, ::-1], q, q)  # a negative stride: copied
    want = math_sdpa(torch.from_numpy(q[:, :, ::-1].copy()), torch.from_numpy(q),
                     torch.from_numpy(q))
    check(close(torch.from_numpy(out), want, 2e-5), "functional: a negative-stride view")

    S = "safetensors"
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.safetensors")
        for what, call, kinds in (
                ("a list", lambda: attn.save_file([np.ones(2)], p), TypeError),
                ("an int name", lambda: attn.save_file({1: np.ones(2)}, p), TypeError),
                ("a NUL in a name", lambda: attn.save_file({"a\0b": np.ones(2)}, p),
                 ValueError),
                ("a str tensor", lambda: attn.save_file({"a": "xyz"}, p), TypeError),
                ("metadata a list", lambda: attn.save_file({"a": np.ones(2)}, p, [1]),
                 TypeError),
                ("a NUL in the path", lambda: attn.save_file({"a": np.ones(2)}, p + "\0.x"),
                 ValueError),
                ("a missing file", lambda: attn.load_file(os.path.join(d, "none")),
                 attn.AttnError),
                ("a path of int", lambda: attn.load_file(5), TypeError)):
            raises(call, kinds, [], f"safetensors: {what}", S)
        check(not os.path.exists(p), "no file written under the path cut at its NUL")
        count(S)
        attn.save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3)}, p, {"k": "v"})
        back, meta = attn.load_file(p, with_metadata=True)
        check(np.array_equal(back["a"], np.arange(6).reshape(2, 3)) and meta == {"k": "v"},
              "safetensors round trip")

    S = "modules"
    attn.manual_seed(1)
    m = attn.CausalAttention(3, 2, 4, 0.0)
    for what, call, kinds in (
            ("x rank 4", lambda: m(np.zeros((1, 1, 2, 3), np.float32)), ValueError),
            ("x too long", lambda: m(np.zeros((1, 5, 3), np.float32)), attn.AttnError),
            ("x width 4", lambda: m(np.zeros((1, 2, 4), np.float32)), ValueError),
            ("x width 2", lambda: m(np.zeros((1, 2, 2), np.float32)), ValueError),
            # not real numbers: None would be NaN, strings parsed, complex cut
            ("x of None", lambda: m(np.array([[None] * 3] * 2)), TypeError),
            ("x of strings", lambda: m(np.full((1, 2, 3), "1.5")), TypeError),
            ("x complex", lambda: m(np.ones((1, 2, 3), np.complex64)), TypeError),
            ("load prefix int", lambda: m.load("x.safetensors", prefix=3), TypeError),
            ("backward first", lambda: attn.CausalAttention(3, 2, 4, 0.0).backward(
                np.zeros((1, 2, 2), np.float32)), RuntimeError),
            ("mask bogus", lambda: attn.CausalAttention(3, 2, 4, 0.0, mask="x"), ValueError),
            ("scale nan", lambda: attn.SelfAttention_v1(3, 2, scale=float("nan")), ValueError),
            ("scale 1e39", lambda: attn.SelfAttention_v1(3, 2, scale=1e39), attn.AttnError)):
        raises(call, kinds, [], f"modules: {what}", S)
    # train() and set_grad_enabled() take bools, as PyTorch's: bool("False")
    # is True, so a string would turn dropout (or the saved forward) on
    m.eval()
    for mode in ("False", 0, None):
        raises(lambda: m.train(mode), ValueError, ["training mode", repr(mode)],
               f"modules: train({mode!r})", S)
        raises(lambda: m.set_grad_enabled(mode), TypeError, ["enabled", repr(mode)],
               f"modules: set_grad_enabled({mode!r})", S)
    check(not m.training, "a refused train() leaves eval mode")
    check(m.train(np.bool_(True)).training and not m.train(False).training,
          "train() takes bool and numpy's bool")


@section
def functional_backward_inputs():
    # the backward takes q, k, v and grad_out as the forward takes q, k, v:
    # real floats that float32 holds, never cast blindly (an int q refused by
    # the forward, a string parsed, a complex value cut to its real part,
    # 1e300 made inf and every gradient NaN)
    S = "functional backward"
    g = np.random.default_rng(2)
    q, k, v, do = (g.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(4))
    B = AF.scaled_dot_product_attention_backward
    big = q.astype(np.float64)
    big[0, 1, 2, 3] = 1e300
    for what, call, kinds, words in (
            ("q of 1e300", lambda: B(do, big, k, v), ValueError,
             ["q", "beyond float32's range", "e+300"]),
            ("grad_out of 1e300", lambda: B(big, q, k, v), ValueError,
             ["grad_out", "beyond float32's range", "e+300"]),
            ("int q", lambda: B(do, q.astype(np.int64), k, v), TypeError, ["q", "int64"]),
            ("str k", lambda: B(do, q, k.astype(str), v), TypeError, ["k", "dtype"]),
            ("complex v", lambda: B(do, q, k, v.astype(np.complex64)), TypeError,
             ["v", "complex64"]),
            ("complex grad_out", lambda: B(do.astype(np.complex64), q, k, v), TypeError,
             ["grad_out", "complex64"]),
            ("str grad_out", lambda: B(do.astype(str), q, k, v), TypeError,
             ["grad_out", "dtype"]),
            ("bool grad_out", lambda: B(do > 0, q, k, v), TypeError, ["grad_out", "bool"]),
            ("grad_out of None", lambda: B(np.full(do.shape, None), q, k, v), TypeError,
             ["grad_out", "object"])):
        raises(call, kinds, words, f"functional backward: {what}", S)
    # float64 and float16 inputs that float32 holds, and views, are taken: the
    # gradients of their float32 contiguous copies, against autograd's float64
    tq, tk, tv = (torch.from_numpy(a.astype(np.float64)).requires_grad_() for a in (q, k, v))
    math_sdpa(tq, tk, tv, causal=True).backward(torch.from_numpy(do.astype(np.float64)))
    want = [t.grad for t in (tq, tk, tv)]
    for what, args in (("float64", (do.astype(np.float64), q.astype(np.float64), k, v)),
                       ("views", (do[:, ::-1][:, ::-1], np.asfortranarray(q), k, v))):
        count(S)
        got = B(*args, causal=True, align="top-left")
        check(all(close(torch.from_numpy(a), b, 2e-5) for a, b in zip(got, want)),
              f"functional backward of {what}: the float32 gradients")


@section
def functional_flags():
    # causal and return_lse are True or False (0 or 1): bool("False") is True,
    # so a string or any nonzero number would run the causal mask unasked
    S = "functional flags"
    q = np.random.default_rng(3).standard_normal((1, 2, 3, 4)).astype(np.float32)
    F_ = AF.scaled_dot_product_attention
    for name in ("causal", "return_lse"):
        for value in ("False", 2, None, 0.0):
            raises(lambda: F_(q, q, q, **{name: value}), TypeError, [name, repr(value)],
                   f"functional: {name}={value!r}", S)
            if name == "causal":
                raises(lambda: AF.scaled_dot_product_attention_backward(q, q, q, q,
                                                                        causal=value),
                       TypeError, ["causal", repr(value)],
                       f"functional backward: causal={value!r}", S)
    count(S)
    plain, causal = (math_sdpa(*(torch.from_numpy(q),) * 3, causal=c) for c in (False, True))
    check(close(torch.from_numpy(F_(q, q, q, causal=np.bool_(False))), plain, 2e-5)
          and close(torch.from_numpy(F_(q, q, q, causal=1)), causal, 2e-5)
          and isinstance(F_(q, q, q, return_lse=np.bool_(True)), tuple),
          "functional: NumPy's bools and 0/1 are taken as flags")


@section
def functional_per_head():
    # sinks and alibi_slopes hold real numbers: strings are not parsed, a
    # complex slope is not cut to its real part, bools are not 0 and 1
    S = "functional per head"
    q = np.random.default_rng(4).standard_normal((1, 2, 3, 4)).astype(np.float32)
    for name in ("sinks", "alibi_slopes"):
        for what, value, dtype in (("strings", np.array(["0.5", "1"]), "<U3"),
                                   ("complex", np.array([0.5 + 1j, 1]), "complex128"),
                                   ("bools", [True, False], "bool"),
                                   ("None", [None, None], "object")):
            raises(lambda: AF.scaled_dot_product_attention(q, q, q, **{name: value}), TypeError,
                   [name, dtype], f"functional: {name} of {what}", S)
            raises(lambda: AF.scaled_dot_product_attention_backward(q, q, q, q,
                                                                    **{name: value}),
                   TypeError, [name, dtype], f"functional backward: {name} of {what}", S)
    # ints and float64 are numbers: the result of their float32 values
    count(S)
    want = AF.scaled_dot_product_attention(q, q, q, alibi_slopes=np.array([1, 2], np.float32),
                                           sinks=np.array([0.5, -1], np.float32))
    got = AF.scaled_dot_product_attention(q, q, q, alibi_slopes=[1, 2], sinks=[0.5, -1.0])
    check(np.array_equal(got, want), "functional: int and float64 per-head values")


@section
def object_ids():
    # ids in an object array (Python ints past int64 make one) are checked by
    # value, as the same ids in a list: integers run, one out of range is a
    # ValueError naming it, ragged rows are named as such
    S = "object ids"
    lm = attn.LanguageModel(TINY, seed=3, num_threads=1)
    with tempfile.TemporaryDirectory() as d:
        tok = attn.Tokenizer(tiny_tokenizer(d))
    count(S, 3)
    check(np.array_equal(lm.generate(np.array([1, 2, 3], dtype=object), 3),
                         lm.generate([1, 2, 3], 3)), "generate: an object array of ids")
    check(np.array_equal(lm.forward(np.array([[1, 2], [3, 4]], dtype=object)),
                         lm.forward(np.array([[1, 2], [3, 4]]))), "forward: an object array")
    check(tok.decode(np.array([104, 105], dtype=object)) == "hi", "decode: an object array")
    for what, call, kind, words in (
            ("generate", lambda: lm.generate(np.array([1, 2**64]), 2), ValueError,
             ["ids[1]", "18446744073709551616", "out of range"]),
            ("forward", lambda: lm.forward(np.array([[1, 2**64]])), ValueError,
             ["ids[1]", "18446744073709551616", "out of range"]),
            ("stop_tokens", lambda: lm.generate([1], 2, stop_tokens=np.array([2**64])),
             ValueError, ["stop_tokens[0]", "18446744073709551616"]),
            ("generate ragged", lambda: lm.generate(np.array([[1, 2], [3]], dtype=object), 2),
             ValueError, ["ids", "rectangular"]),
            ("forward ragged", lambda: lm.forward(np.array([[1, 2], [3]], dtype=object)),
             ValueError, ["ids", "rectangular"]),
            ("forward of floats", lambda: lm.forward(np.array([[1, 2.5]], dtype=object)),
             TypeError, ["ids[1]", "2.5"]),
            ("generate, ints NumPy holds as floats", lambda: lm.generate([2**63, 1], 2),
             ValueError, ["ids[0]", "9223372036854775808", "out of range"])):
        raises(call, kind, words, f"{what}: object ids", S)
    # an object array of sequences is ragged whatever its count of ids
    for what, cells in (("[1, 2] and []", ([1, 2], [])), ("[1] and array([2])",
                                                         ([1], np.array([2])))):
        ragged = np.empty(2, dtype=object)
        ragged[0], ragged[1] = cells
        raises(lambda: lm.generate(ragged, 2), ValueError, ["ids", "rectangular"],
               f"generate: an object array holding {what}", S)


@section
def unhashable_choices():
    # a name chosen from a list (a dropout stream, kernels, a mask, an
    # alignment): a list or a dict there is a ValueError naming the argument
    # and the value, as a wrong string is, not hashing's bare TypeError
    S = "choices"
    q = np.ones((1, 1, 2, 4), np.float32)
    for value in ([], {"a": 1}):
        for what, call, name in (
                ("set_bernoulli", lambda: attn.set_bernoulli(value), "set_bernoulli"),
                ("kernels_supported", lambda: attn.kernels_supported(value), "kernels"),
                ("functional kernels", lambda: AF.scaled_dot_product_attention(
                    q, q, q, kernels=value), "kernels"),
                ("functional align", lambda: AF.scaled_dot_product_attention(
                    q, q, q, align=value), "align"),
                ("module mask", lambda: attn.CausalAttention(4, 4, 6, 0.0, mask=value), "mask")):
            raises(call, ValueError, [name, repr(value)], f"{what}({value!r})", S)
    count(S)
    check(attn.kernels_supported("reference") and attn.kernels_supported("auto"),
          "kernels_supported of the names")


@section
def pretrain_flags():
    # the book's cfg built with NumPy (qkv_bias a numpy bool) is the cfg of
    # Python's bool, as LanguageModel takes it; a string is still refused
    S = "pretrain"
    cfg = dict(TINY, vocab_size=512)
    with tempfile.TemporaryDirectory() as d:
        tok = attn.Tokenizer(tiny_tokenizer(d))
        models = []
        for i, flag in enumerate((True, np.bool_(True))):
            count(S)
            run = attn.pretrain(dict(cfg, qkv_bias=flag), "some text " * 40, tok, epochs=0,
                                num_threads=1)
            run.save(os.path.join(d, f"m{i}.safetensors"))
            models.append(attn.load_file(os.path.join(d, f"m{i}.safetensors")))
        check(list(models[0]) == list(models[1]) and "trf_blocks.0.att.W_query.bias" in models[1]
              and all(np.array_equal(models[0][k], models[1][k]) for k in models[0]),
              "pretrain: qkv_bias=np.bool_(True) is qkv_bias=True")
        for value in ("False", 2):
            raises(lambda: attn.pretrain(dict(cfg, qkv_bias=value), "some text " * 40, tok,
                                         epochs=0, num_threads=1), TypeError,
                   ["qkv_bias", repr(value)], f"pretrain: qkv_bias={value!r}", S)


@section
def functional_window():
    # window is a pair (left, right): a bare number, a dict or a nested list
    # is a ValueError naming window and the value (len() of a number, or a
    # dict's window[0], raised bare TypeError and KeyError)
    S = "functional window"
    q = np.random.default_rng(6).standard_normal((1, 1, 4, 4)).astype(np.float32)
    for value in (3, 3.5, {1: 2, 3: 4}, [[1, 0]], (1, 0, 0), ((1, 2), 3)):
        raises(lambda: AF.scaled_dot_product_attention(q, q, q, window=value), ValueError,
               ["window", repr(value)], f"functional: window={value!r}", S)
    count(S)
    check(np.array_equal(AF.scaled_dot_product_attention(q, q, q, window=np.array([1, 0])),
                         AF.scaled_dot_product_attention(q, q, q, window=(1, 0))),
          "functional: a window of a NumPy pair")


# ---- where PyTorch answers, attn answers the same ------------------------------------


def same(got, want, tol):
    """close() where want is a number, NaN exactly where want is NaN."""
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape or not torch.equal(got.isnan(), want.isnan()):
        return False
    keep = ~want.isnan()
    return close(got[keep], want[keep], tol)


def torch_weights(q, k, scale, mask=None, causal=False):
    """softmax(q k^T * scale + mask) in float64, written out in torch."""
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    if causal:
        L, Sk = q.size(-2), k.size(-2)
        s = s.masked_fill(~torch.ones(L, Sk, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, -1)


@section
def additive_mask_inf():
    # score + inf makes the row's softmax NaN in PyTorch (inf - inf), and
    # NaN does the same: those rows (and the gradients through them) are
    # NaN, every other row is the masked attention
    S = "attn.torch masks"
    g = torch.Generator().manual_seed(5)
    for bad in (float("inf"), float("nan")):
        q = torch.randn(2, 2, 4, 8, generator=g)
        k = torch.randn(2, 2, 5, 8, generator=g)
        v = torch.randn(2, 2, 5, 8, generator=g)
        mask = torch.randn(4, 5, generator=g)
        mask[0, 3] = float("-inf")
        mask[2, 1] = bad
        dout = torch.randn(2, 2, 4, 8, generator=g)
        count(S)
        try:
            leaves = [t.clone().requires_grad_(True) for t in (q, k, v, mask)]
            out = AT.scaled_dot_product_attention(*leaves[:3], attn_mask=leaves[3])
            out.backward(dout)
        except Exception as err:  # noqa: BLE001
            check(False, f"additive mask holding {bad}: raised {err!r}")
            continue
        ref = [t.double().requires_grad_(True) for t in (q, k, v, mask)]
        if TORCH_SDPA is not None:
            want = TORCH_SDPA(*ref[:3], attn_mask=ref[3])
        else:  # torch < 2.0: PyTorch's math path, written out
            want = torch_weights(ref[0], ref[1], 8 ** -0.5, ref[3]) @ ref[2]
        want.backward(dout.double())
        check(bool(out[:, :, 2].isnan().all()) and not bool(out[:, :, [0, 1, 3]].isnan().any()),
              f"mask holding {bad}: the row that sees it is NaN, the others numbers")
        check(same(out, want, 2e-5), f"mask holding {bad}: PyTorch's output")
        for name, a, b in zip("q k v attn_mask".split(), leaves, ref):
            check(same(a.grad, b.grad, 2e-5), f"mask holding {bad}: PyTorch's d{name}")
    # a finite additive mask still runs on attn where the library applies maps
    count(S)
    x = torch.randn(1, 2, 4, 8, generator=g)
    check((AT.supports(x, x, x, attn_mask=torch.zeros(4, 4)) is None) == AT._runs_block_maps(),
          "a finite additive mask: attn's, where the library applies block maps")


@section
def mask_shapes_and_hidden_rows():
    # PyTorch 2 refuses an attn_mask that does not broadcast to the scores,
    # and one beside is_causal; a row whose every key is hidden gives 0
    # (torch < 2.0: attn's written-out math path does the same)
    S = "attn.torch masks"
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=g), torch.randn(1, 2, 7, 4, generator=g),
               torch.randn(1, 2, 7, 4, generator=g))
    words = [] if TORCH_SDPA is not None else ["attn_mask"]
    for mask in (torch.ones(2, 1, 6, 7, dtype=torch.bool), torch.zeros(1, 1, 1, 6, 7),
                 torch.ones(3, 6, 7, dtype=torch.bool), torch.zeros(6, 8)):
        raises(lambda: AT.scaled_dot_product_attention(q, k, v, attn_mask=mask), RuntimeError,
               words + ([str(tuple(mask.shape))] if words else []),
               f"attn_mask of shape {tuple(mask.shape)} for scores (1, 2, 6, 7)", S)
    raises(lambda: AT.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(
        6, 7, dtype=torch.bool), is_causal=True), RuntimeError, words, "attn_mask with is_causal",
        S)
    # a 0-D or 1-D mask: PyTorch 2 raises IndexError with 4-D queries (it reads the
    # mask's last two dimensions) and runs it with 3-D ones, as attn.torch does
    for mask in (torch.arange(7) < 5, torch.randn(7, generator=g), torch.tensor(True)):
        raises(lambda: AT.scaled_dot_product_attention(q, k, v, attn_mask=mask), IndexError,
               [], f"a {mask.dim()}-D attn_mask with 4-D queries", S)
        count(S)
        check(AT.supports(q, k, v, attn_mask=mask) is not None,
              f"supports() passes a {mask.dim()}-D attn_mask with 4-D queries")
        additive = (torch.zeros(7).masked_fill(~mask, float("-inf"))
                    if mask.dtype == torch.bool else mask)
        want = torch_weights(q[0], k[0], 0.5, additive) @ v[0].double()
        count(S)
        check(close(AT.scaled_dot_product_attention(q[0], k[0], v[0], attn_mask=mask), want,
                    1e-5), f"a {mask.dim()}-D attn_mask with 3-D queries runs")
    for dtype in (torch.float64, torch.float32):
        for kind in ("additive", "bool"):
            qq, kk, vv = (t.to(dtype).requires_grad_(True) for t in (q, k, v))
            mask = torch.zeros(6, 7, dtype=dtype)
            mask[2] = float("-inf")
            mask[4, :3] = float("-inf")
            m = mask if kind == "additive" else torch.isfinite(mask)
            count(S)
            out = AT.scaled_dot_product_attention(qq, kk, vv, attn_mask=m)
            out.backward(torch.ones_like(out))
            want = torch_weights(q.double(), k.double(), 0.5, mask.double()) @ v.double()
            check(bool((out[:, :, 2] == 0).all()) and
                  all(bool(torch.isfinite(t.grad).all()) for t in (qq, kk, vv)),
                  f"{dtype} {kind} mask, a row that sees no key: out 0, finite gradients")
            check(close(out, want.nan_to_num(0.0), 1e-5), f"{dtype} {kind} mask: the masked "
                  f"attention elsewhere")


@section
def mask_dtypes():
    # PyTorch takes an attn_mask of bool, float32 or the query's dtype and
    # raises RuntimeError naming both dtypes for any other
    S = "attn.torch masks"
    x = torch.randn(1, 2, 3, 4)
    for mask_dtype, q_dtype in ((torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                (torch.float64, torch.float32), (torch.float16, torch.bfloat16)):
        q = x.to(q_dtype)
        mask = torch.zeros(3, 3, dtype=mask_dtype)
        if TORCH_SDPA is not None:
            try:
                TORCH_SDPA(q, q, q, attn_mask=mask)
                kind = None
            except Exception as err:  # noqa: BLE001
                kind = type(err)
            count(S)
            check(kind in (None, RuntimeError), f"PyTorch refuses with {kind}")
        names = [str(mask_dtype).split(".")[-1], str(q_dtype).split(".")[-1]]
        raises(lambda: AT.scaled_dot_product_attention(q, q, q, attn_mask=mask), RuntimeError,
               names, f"attn_mask {mask_dtype} with {q_dtype} queries", S)
        count(S)
        check(AT.supports(q, q, q, attn_mask=mask) is not None,
              f"supports() does not pass a {mask_dtype} mask with {q_dtype} queries")
    # float32 masks go with any query dtype, and a mask of the query's dtype
    for mask_dtype, q_dtype in ((torch.float32, torch.bfloat16), (torch.float32, torch.float64),
                                (torch.float16, torch.float16)):
        q = x.to(q_dtype)
        mask = torch.randn(3, 3).to(mask_dtype)
        count(S)
        want = torch_weights(q, q, 0.5, mask) @ q.double()
        got = AT.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        check(got.dtype == q_dtype and close(got, want, 2e-2),
              f"attn_mask {mask_dtype} with {q_dtype} queries runs")
    # a float32 mask's gradient with 16-bit queries is float32's (PyTorch's
    # within 1e-6 of float64), not carried from the 16-bit out's rounding
    for q_dtype in (torch.bfloat16, torch.float16):
        gen = torch.Generator().manual_seed(5)
        q, k, v, dout = (torch.randn(2, 2, 9, 16, generator=gen).to(q_dtype) for _ in range(4))
        mask = torch.randn(9, 9, generator=gen).requires_grad_()
        want_mask = mask.detach().double().requires_grad_()
        want = torch_weights(q, k, 0.25, want_mask) @ v.double()
        want.backward(dout.double())
        got = AT.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        got.backward(dout)
        count(S)
        error = float((mask.grad.double() - want_mask.grad).norm() / want_mask.grad.norm())
        check(got.dtype == q_dtype and mask.grad.dtype == torch.float32 and error <= 1e-5,
              f"float32 attn_mask's gradient with {q_dtype} queries: relative error {error:.3g}")
        # the same through flash_attn_varlen_func's score_mod, a captured bias
        bias = torch.randn(1, 2, 9, 9, generator=gen).requires_grad_()
        want_bias = bias.detach().double().requires_grad_()
        pq, pk, pv, pd = (t[0].transpose(0, 1).contiguous() for t in (q, k, v, dout))
        want = torch_weights(q[0], k[0], 0.25, want_bias[0]) @ v[0].double()
        want.backward(dout[0].double())
        cu = torch.tensor([0, 9], dtype=torch.int32)
        got = AT.flash_attn_varlen_func(
            pq, pk, pv, cu, cu, 9, 9,
            score_mod=lambda score, b, h, qi, ki: score + bias[b, h, qi, ki])
        got.backward(pd)
        count(S)
        error = float((bias.grad.double() - want_bias.grad).norm() / want_bias.grad.norm())
        check(got.dtype == q_dtype and error <= 1e-5,
              f"a score_mod's captured float32 bias with {q_dtype} queries: gradient relative "
              f"error {error:.3g}")


@section
def dropout_one():
    # dropout_p = 1 drops every weight: PyTorch's output and gradients are
    # zeros (F.dropout(p=1) multiplies by 0); attn.functional gives the same
    S = "functional dropout"
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 2, 5, 4)).astype(np.float32) for _ in range(3))
    dout = rng.standard_normal((2, 2, 5, 4)).astype(np.float32)
    for causal in (False, True):
        ref = [torch.from_numpy(a).requires_grad_(True) for a in (q, k, v)]
        if TORCH_SDPA is not None:
            want = TORCH_SDPA(*ref, dropout_p=1.0, is_causal=causal)
        else:
            w = torch_weights(ref[0], ref[1], 0.5, causal=causal).float()
            want = F.dropout(w, 1.0, training=True) @ ref[2]
        want.backward(torch.from_numpy(dout))
        count(S)
        try:
            out, lse = AF.scaled_dot_product_attention(q, k, v, causal=causal, dropout_p=1.0,
                                                       seed=1, return_lse=True)
            grads = AF.scaled_dot_product_attention_backward(dout, q, k, v, causal=causal,
                                                             dropout_p=1.0, seed=1)
        except Exception as err:  # noqa: BLE001
            check(False, f"dropout_p=1.0 causal={causal}: raised {err!r}")
            continue
        check(torch.equal(torch.from_numpy(out), want.detach()),
              f"dropout_p=1.0 causal={causal}: PyTorch's output (zeros)")
        for name, got, leaf in zip("qkv", grads, ref):
            check(torch.equal(torch.from_numpy(got), leaf.grad),
                  f"dropout_p=1.0 causal={causal}: PyTorch's d{name} (zeros)")
        # lse is the softmax's, which dropout does not touch
        _, lse0 = AF.scaled_dot_product_attention(q, k, v, causal=causal, return_lse=True)
        check(np.abs(lse - lse0).max() <= 1e-6, f"dropout_p=1.0 causal={causal}: the lse")
    raises(lambda: AF.scaled_dot_product_attention(q, k, v, dropout_p=1.5, seed=1),
           attn.AttnError, ["dropout"], "dropout_p 1.5", S)


@section
def load_drops_forward():
    # weights loaded after a forward: the forward's activations belong to
    # the old weights, so backward is refused until a new forward (PyTorch
    # raises for weights changed in place since the forward); load_state_dict
    # moves the parameters to a new version, which the backward names
    S = "load after forward"
    attn.manual_seed(2)
    m = attn.MultiHeadAttention(4, 4, 5, 0.0, 2)
    x = np.random.default_rng(5).standard_normal((1, 5, 4)).astype(np.float32)
    dy = np.ones((1, 5, 4), np.float32)
    state = {k: v * 2 for k, v in m.state_dict().items() if k != "mask"}
    m(x)
    m.load_state_dict(state)
    raises(lambda: m.backward(dy), RuntimeError,
           ["parameter W_query.weight was modified after the forward",
            "(version 0 at the forward, 1 now)"], "load_state_dict", S)
    m(x)
    m.load_state_dict(m.state_dict())  # the same values: the forward's weights still
    check(np.all(np.isfinite(m.backward(dy))), "load_state_dict of the same values")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.safetensors")
        m.save(path)
        m(x)
        m.load(path)
        raises(lambda: m.backward(dy), RuntimeError, ["no forward"], "load", S)
        g = attn.CausalSelfAttention(4, 2, 5)
        g.save_hf(path)
        y = g(x)
        g.load_hf(path)
        raises(lambda: g.backward(np.ones_like(y)), RuntimeError, ["no forward"], "load_hf", S)
    m(x)  # a new forward differentiates the loaded weights
    count(S)
    check(np.all(np.isfinite(m.backward(dy))), "a new forward's backward")


@section
def module_scales():
    # the modules' scale= takes what PyTorch's SDPA scale and attn.functional
    # take: 0 a zero scale (uniform weights), negative values as given
    S = "modules scale"
    x = np.random.default_rng(4).standard_normal((2, 4, 3)).astype(np.float32)
    xt = torch.from_numpy(x).double()
    for scale in (0.0, -0.0, -1.0, 0.7):
        attn.manual_seed(1)
        m = attn.SelfAttention_v1(3, 2, scale=scale)
        w = {n: torch.from_numpy(a).double() for n, a in m.state_dict().items()}
        qx, kx, vx = xt @ w["W_query"], xt @ w["W_key"], xt @ w["W_value"]
        if TORCH_SDPA is not None:
            want = TORCH_SDPA(qx, kx, vx, scale=scale)
        else:
            want = torch_weights(qx, kx, scale) @ vx
        count(S)
        check(close(torch.from_numpy(m(x)), want, 2e-6), f"SelfAttention_v1 scale={scale}")
        m = attn.CausalAttention(3, 2, 4, 0.0, scale=scale)
        w = {n: torch.from_numpy(a).double() for n, a in m.state_dict().items()}
        qx, kx, vx = (xt @ w[f"W_{n}.weight"].T for n in ("query", "key", "value"))
        if TORCH_SDPA is not None:
            # a boolean mask, not is_causal: PyTorch's fused CPU kernel
            # (2.15) gives NaN rows for is_causal with a scale <= 0, where its
            # math path and masked calls give the masked mean
            tril = torch.ones(4, 4, dtype=torch.bool).tril()
            want = TORCH_SDPA(qx, kx, vx, scale=scale, attn_mask=tril)
        else:
            want = torch_weights(qx, kx, scale, causal=True) @ vx
        count(S)
        check(close(torch.from_numpy(m(x)), want, 2e-6), f"CausalAttention scale={scale}")
    attn.manual_seed(1)
    count(S)
    check(np.array_equal(attn.MultiHeadAttention(3, 4, 4, 0.0, 2, scale=None)(x),
                         (attn.manual_seed(1), attn.MultiHeadAttention(3, 4, 4, 0.0, 2))[1](x)),
          "scale=None is the default 1/sqrt(head_dim)")


@section
def sdpa_argument_types():
    # scaled_dot_product_attention takes PyTorch's argument types: a truthy
    # string is not is_causal=True, a string is not a scale, and a scale
    # tensor that requires grad is refused, never a constant whose gradient
    # is silently lost; the TypeError names the argument as PyTorch's does
    S = "attn.torch sdpa argument types"
    x = torch.randn(1, 2, 3, 4)
    for kw in (dict(is_causal="no"), dict(is_causal=None), dict(is_causal=1),
               dict(enable_gqa="no"), dict(enable_gqa=np.bool_(True)), dict(scale="0.5"),
               dict(scale=torch.tensor([0.5])), dict(scale=torch.tensor(0.5, requires_grad=True)),
               dict(dropout_p=None), dict(dropout_p="0.1")):
        (name, value), = kw.items()
        raises(lambda: AT.scaled_dot_product_attention(x, x, x, **kw), TypeError,
               [f"'{name}'"], f"sdpa {name}={value!r}", S)
        with AT.patched():
            raises(lambda: F.scaled_dot_product_attention(x, x, x, **kw), TypeError,
                   [f"'{name}'"], f"patched sdpa {name}={value!r}", S)
    # what PyTorch takes still runs: Python and NumPy scalars, 0-d tensors
    want = math_sdpa(x.double(), x.double(), x.double(), scale=0.5)
    for scale in (0.5, np.float32(0.5), torch.tensor(0.5)):
        count(S)
        check(close(AT.scaled_dot_product_attention(x, x, x, scale=scale, dropout_p=0), want,
                    1e-5), f"sdpa scale={scale!r}")


@section
def paths_and_handles():
    # a None or a number where a path or a tokenizer belongs: a TypeError
    # naming the argument, never os.fsencode's or ctypes' bare one
    S = "paths"
    m = attn.CausalAttention(3, 2, 4, 0.0)
    lm = attn.LanguageModel(TINY, seed=3, num_threads=1)
    with tempfile.TemporaryDirectory() as d:
        tok = tiny_tokenizer(d)
        for what, call, words in (
                ("Tokenizer(None)", lambda: attn.Tokenizer(None), ["Tokenizer", "path", "None"]),
                ("load_file(None)", lambda: attn.load_file(None), ["load_file", "path", "None"]),
                ("load_file(5)", lambda: attn.load_file(5), ["load_file", "path", "5"]),
                ("save_file(path None)", lambda: attn.save_file({"a": np.ones(2)}, None),
                 ["save_file", "path"]),
                ("module.save(None)", lambda: m.save(None), ["save", "path", "None"]),
                ("module.load(None)", lambda: m.load(None), ["load", "path", "None"]),
                ("LanguageModel.load(None)", lambda: attn.LanguageModel.load(None),
                 ["load", "path", "None"]),
                ("LanguageModel.load(config=3)", lambda: attn.LanguageModel.load(
                    os.path.join(d, "x"), config=3), ["load", "config", "3"]),
                ("LanguageModel.save(None)", lambda: lm.save(None), ["save", "path", "None"]),
                ("pretrain(tokenizer None)", lambda: attn.pretrain(
                    dict(TINY, vocab_size=512), "some text " * 40, None),
                 ["pretrain", "tokenizer", "None"]),
                ("pretrain(tokenizer 3)", lambda: attn.pretrain(
                    dict(TINY, vocab_size=512), "some text " * 40, 3),
                 ["pretrain", "tokenizer", "3"]),
                ("pretrain(resume=5)", lambda: attn.pretrain(
                    dict(TINY, vocab_size=512), "some text " * 40, tok, resume=5),
                 ["pretrain", "resume", "5"]),
                ("pretrain(on_event=5)", lambda: attn.pretrain(
                    dict(TINY, vocab_size=512), "some text " * 40, tok, epochs=0,
                    on_event=5), ["pretrain", "on_event", "5"])):
            raises(call, TypeError, words, what, S)
        run = attn.pretrain(dict(TINY, vocab_size=512), "some text " * 40, tok, epochs=0,
                            num_threads=1)
        raises(lambda: run.save(None), TypeError, ["save", "path", "None"],
               "Pretraining.save(None)", S)


@section
def copies():
    # an object that owns a libattn handle frees it when it goes: a copy
    # sharing it would free it twice (a crash at the next call, or at exit),
    # so copy.copy, copy.deepcopy and pickle raise TypeError naming the class
    import copy
    import gc
    import pickle
    S = "copies"
    lm = attn.LanguageModel(TINY, seed=3, num_threads=1)
    cache = lm.new_cache(max_len=16)
    m = attn.CausalAttention(3, 2, 4, 0.0)
    bm = attn.flex.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 32, 32,
                                     BLOCK_SIZE=16) if AT._runs_block_maps() else None
    with tempfile.TemporaryDirectory() as d:
        tok = attn.Tokenizer(tiny_tokenizer(d))
        for obj in (lm, cache, m, tok) + ((bm,) if bm is not None else ()):
            name = type(obj).__name__
            for what, call in (("copy.copy", copy.copy), ("copy.deepcopy", copy.deepcopy),
                               ("pickle.dumps", pickle.dumps)):
                raises(lambda: call(obj), TypeError, ["cannot", name], f"{what}({name})", S)
        gc.collect()
        count(S)
        got = lm.generate([1, 2, 3], 4, cache=cache)
        check(len(got) == 4 and tok.encode("ab") == tok.encode("ab"),
              "the originals still work after the refused copies")
    # a flag is True or False, not any truthy value ("False" is a str)
    for value in ("False", 7, None):
        raises(lambda: lm.forward(np.array([[1, 2]]), last_only=value), TypeError,
               ["last_only"], f"forward(last_only={value!r})", S)
    # an explicit 0 KV groups holds no head: refused, not read as "one a head"
    raises(lambda: attn.LanguageModel(dict(TINY, hidden_dim=16, n_kv_groups=0), seed=1),
           ValueError, ["n_kv_groups", "0"], "n_kv_groups 0", S)
    # the chapter-4 variants' keys: read as the book's GPTModel reads them, or
    # refused by name
    swa = dict(TINY, sliding_window_size=3, sliding_window_stride=-1)
    got = attn.LanguageModel(swa, seed=1).config
    check(got["sliding_window_size"] == 3 and got["sliding_window_stride"] == -1,
          "a negative stride (every layer) comes back as the book writes it: %r" % (got,))
    got = attn.LanguageModel(dict(swa, sliding_window_stride=0), seed=1).config
    check("sliding_window_size" not in got, "a stride of 0 is the book's no window: %r" % (got,))
    raises(lambda: attn.LanguageModel(dict(TINY, sliding_window_size=3), seed=1), ValueError,
           ["sliding_window_stride"], "a window without its stride", S)
    raises(lambda: attn.LanguageModel(dict(TINY, sliding_window_stride=2), seed=1), ValueError,
           ["sliding_window_stride", "without"], "a stride without its window", S)
    raises(lambda: attn.LanguageModel(dict(swa, sliding_window_stride=1.5), seed=1), ValueError,
           ["sliding_window_stride", "1.5"], "a stride of 1.5", S)
    raises(lambda: attn.LanguageModel(dict(TINY, latent_dim=0), seed=1), ValueError,
           ["latent_dim", "0"], "latent_dim 0", S)
    got = attn.LanguageModel(dict(TINY, latent_dim=None), seed=1).config
    check(got["arch"] == "gpt-mla" and got["latent_dim"] == 16,
          "latent_dim None is the module's max(16, emb_dim // 8): %r" % (got,))
    # keys of two variants at once: the model the keys name reads its own only,
    # as attn generate --config and attn.pretrain read the same cfg
    got = attn.LanguageModel(dict(TINY, latent_dim=4, n_kv_groups=1), seed=1).config
    check(got["arch"] == "gpt-mla" and got["latent_dim"] == 4 and "n_kv_groups" not in got,
          "latent_dim with n_kv_groups 1 is gpt_with_kv_mla.py's model: %r" % (got,))
    got = attn.LanguageModel(dict(TINY, qkv_bias=False, hidden_dim=32, n_kv_groups=1,
                                  latent_dim=4), seed=1).config
    check(got["arch"] == "llama3" and got["n_kv_groups"] == 1 and "latent_dim" not in got,
          "Llama 3's keys with latent_dim are the Llama3Model: %r" % (got,))
    raises(lambda: attn.LanguageModel(dict(TINY, arch="gpt-mla", latent_dim=4, n_kv_groups=1),
                                      seed=1), attn.AttnError, ["n_kv_groups (1)"],
           "an explicit arch gpt-mla with n_kv_groups 1", S)
    # n_kv_groups None is one KV head a head, as attn generate --config reads a null
    got = attn.LanguageModel(dict(TINY, n_kv_groups=None), seed=1).config
    check(got["arch"] == "gpt-gqa" and got["n_kv_groups"] == TINY["n_heads"],
          "n_kv_groups None is one KV head a head: %r" % (got,))
    # its cache holds the latent once, read as K and V: one type, two refused
    mla = attn.LanguageModel(dict(TINY, latent_dim=None), seed=1)
    c = mla.new_cache(dtype="int8").config()
    check(c["values_are_keys"] and c["kv_heads"] == 1 and c["head_dim"] == 16 and
          c["k_dtype"] == c["v_dtype"] == "int8", "gpt-mla's cache: %r" % (c,))
    raises(lambda: mla.new_cache(k_dtype="int8"), ValueError,
           ["k_dtype 'int8'", "v_dtype 'f32'", "one type"], "gpt-mla k_dtype alone", S)
    # int4 stores groups of 32: a latent of 16 is refused naming it as the cfg does
    raises(lambda: mla.new_cache(dtype="int4"), attn.AttnError,
           ["groups of 32", "latent_dim 16"], "gpt-mla int4 cache of latent_dim 16", S)
    # ... which pretrain too: their keys read as the LanguageModel reads them
    # (a config taken gets as far as the tokenizer, None here), a bad value
    # refused naming it
    for extra in ({"latent_dim": 4}, {"latent_dim": None}, {"n_kv_groups": 1},
                  {"sliding_window_size": 3, "sliding_window_stride": -2},
                  {"sliding_window_size": 3, "sliding_window_stride": 2.0}):
        raises(lambda: attn.pretrain(dict(TINY, drop_rate=0.0, **extra), "some text " * 40,
                                     None, epochs=0),
               TypeError, ["tokenizer"], f"pretrain with {extra}", S)
    for extra, kind, words in (
            ({"sliding_window_size": 3, "sliding_window_stride": 1.5}, ValueError,
             ["sliding_window_stride", "1.5"]),
            ({"sliding_window_size": 3, "sliding_window_stride": 2**60}, ValueError,
             ["sliding_window_stride", str(2**60)]),
            ({"sliding_window_size": 3, "sliding_window_stride": True}, TypeError,
             ["sliding_window_stride", "True"]),
            ({"sliding_window_size": 0, "sliding_window_stride": 1}, ValueError,
             ["sliding_window_size", "0"]),
            ({"sliding_window_stride": 1}, ValueError, ["sliding_window_stride", "without"]),
            ({"latent_dim": "4"}, TypeError, ["latent_dim", "'4'"]),
            ({"n_kv_groups": 3}, ValueError, ["n_kv_groups", "3"]),
            ({"n_kv_groups": 1, "sliding_window_size": 3, "sliding_window_stride": 1},
             ValueError, ["sliding_window_size", "n_kv_groups"])):
        raises(lambda: attn.pretrain(dict(TINY, drop_rate=0.0, **extra), "some text " * 40,
                                     None, epochs=0),
               kind, words, f"pretrain with {extra}", S)


print(f"{passed} passed, {failed} failed in {time.time() - T0:.1f} s")
print("inputs tried per surface: " + ", ".join(f"{k} {v}" for k, v in sorted(tried.items())))
sys.exit(1 if failed else 0)
