"""Pretraining as the book's chapter 5 does it, over libattn's loop
(attn_pretrain_*, the same loop `attn pretrain` runs):

    import attn
    text = open("data/the-verdict.txt", encoding="utf-8").read()
    cfg = {"vocab_size": 50257, "context_length": 256, "emb_dim": 768, "n_heads": 12,
           "n_layers": 12, "drop_rate": 0.1, "qkv_bias": False}
    run = attn.pretrain(cfg, text, "data/gpt2-bpe", epochs=10, verbose=True)
    train_losses, val_losses, tokens_seen = run      # what train_model_simple returns
    run.save("model.safetensors")                    # attn generate --weights reads it

The weights are drawn as torch.manual_seed(seed); GPTModel(cfg) draws them,
then the same generator drives the loaders' shuffling and dropout, so the
losses are the book's for the same seed.
"""
import ctypes
import os
from collections.abc import Mapping
from ctypes import (POINTER, Structure, c_bool, c_char_p, c_double, c_int, c_int64, c_size_t,
                    c_uint64, c_void_p)

from ._args import as_choice, as_flag, as_index, as_number, as_str, as_utf8, show
from ._lib import Context, HandleOwner, encode_path, is_path, lib
from . import modules as _modules
from .lm import book_arch, book_window_stride
from .tokenizer import Tokenizer


class GptConfig(Structure):  # attn_gpt_config
    _fields_ = [("vocab_size", c_size_t), ("context_length", c_size_t), ("emb_dim", c_size_t),
                ("n_heads", c_size_t), ("n_layers", c_size_t), ("drop_rate", c_double),
                ("qkv_bias", c_bool), ("attention", c_int), ("n_kv_groups", c_size_t),
                ("latent_dim", c_size_t), ("sliding_window_size", c_size_t),
                ("sliding_window_stride", c_int64)]


# attn_gpt_attention: the book's GPTModel and chapter 4's bonus GPTs
GPT_MHA, GPT_GQA, GPT_MLA, GPT_SWA = 0, 1, 2, 3


class Llama3Config(Structure):  # attn_llama3_config
    _fields_ = [("vocab_size", c_size_t), ("context_length", c_size_t), ("emb_dim", c_size_t),
                ("n_heads", c_size_t), ("n_layers", c_size_t), ("hidden_dim", c_size_t),
                ("n_kv_groups", c_size_t), ("rope_base", c_double), ("rope_factor", c_double),
                ("rope_low_freq_factor", c_double), ("rope_high_freq_factor", c_double),
                ("rope_original_context_length", c_size_t)]


class PretrainOptions(Structure):  # attn_pretrain_options
    _fields_ = [("epochs", c_size_t), ("batch_size", c_size_t), ("max_length", c_size_t),
                ("stride", c_size_t), ("train_ratio", c_double), ("lr", c_double),
                ("weight_decay", c_double), ("eval_freq", c_size_t), ("eval_iter", c_size_t),
                ("start_context", c_char_p), ("sample_tokens", c_size_t)]


class PretrainEvent(Structure):  # attn_pretrain_event
    _fields_ = [("kind", c_int), ("epoch", c_size_t), ("step", c_size_t),
                ("steps_per_epoch", c_size_t), ("total_steps", c_size_t),
                ("tokens_seen", c_uint64), ("step_loss", c_double), ("train_loss", c_double),
                ("val_loss", c_double), ("sample", c_void_p), ("sample_length", c_size_t)]


STEP, EVAL, SAMPLE, DONE = 0, 1, 2, 3
_KINDS = {STEP: "step", EVAL: "eval", SAMPLE: "sample", DONE: "done"}
_BERNOULLI = {"mt19937": 0, "mkl": 1, "philox": 2}

_SIGNATURES = {
    "attn_model_new_gpt": (c_int, c_void_p, POINTER(GptConfig), c_void_p, POINTER(c_void_p)),
    "attn_model_new_llama3": (c_int, c_void_p, POINTER(Llama3Config), c_void_p,
                              POINTER(c_void_p)),
    "attn_model_free": (None, c_void_p),
    "attn_pretrain_defaults": (PretrainOptions,),
    "attn_pretrain_new": (c_int, c_void_p, c_void_p, c_void_p, c_char_p, c_size_t,
                          POINTER(PretrainOptions), c_void_p, POINTER(c_void_p)),
    "attn_pretrain_next": (c_int, c_void_p, POINTER(PretrainEvent)),
    "attn_pretrain_history": (c_int, c_void_p, POINTER(c_size_t), POINTER(POINTER(c_uint64)),
                              POINTER(POINTER(c_double)), POINTER(POINTER(c_double))),
    "attn_pretrain_save": (c_int, c_void_p, c_char_p),
    "attn_pretrain_resume": (c_int, c_void_p, c_char_p),
    "attn_pretrain_free": (None, c_void_p),
    "attn_rng_new": (c_int, c_void_p, c_uint64, POINTER(c_void_p)),
    "attn_rng_free": (None, c_void_p),
    "attn_rng_set_bernoulli_method": (c_int, c_void_p, c_int),
}
for _name, (_restype, *_argtypes) in _SIGNATURES.items():
    _fn = getattr(lib, _name, None)
    if _fn is not None:
        _fn.restype = _restype
        _fn.argtypes = _argtypes

_GPT_KEYS = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers")


_ROPE_FREQ = ("factor", "low_freq_factor", "high_freq_factor", "original_context_length")


def _llama3_config(cfg):
    """attn_llama3_config from the book's Llama 3 cfg dict (float32; dtype,
    if given, must be torch.float32 or "float32")."""
    missing = [k for k in _GPT_KEYS + ("hidden_dim",) if k not in cfg]
    if missing:
        raise ValueError(f"config: missing key(s) {', '.join(missing)}; the book's Llama 3 "
                         f"cfg needs {', '.join(_GPT_KEYS + ('hidden_dim',))}")
    dtype = cfg.get("dtype")
    if dtype is not None and str(dtype) not in ("float32", "torch.float32"):
        raise ValueError(f"config['dtype']: pretraining runs in float32, got {dtype!r}")
    c = Llama3Config(**{k: as_index(f"config['{k}']", cfg[k], 1)
                        for k in _GPT_KEYS + ("hidden_dim",)})
    # LanguageModel(cfg) gives such a cfg its window; the book's Llama3Model has none
    window = cfg.get("sliding_window_size")
    if window is not None and book_window_stride(cfg.get("sliding_window_stride"), 2**53,
                                                 "within 2**53") != 0:
        raise ValueError(f"config['sliding_window_size']: {window!r} with Llama 3's keys; the "
                         f"book's Llama3Model has no sliding window")
    c.n_kv_groups = as_index("config['n_kv_groups']", cfg.get("n_kv_groups", c.n_heads), 1)
    c.rope_base = as_number("config['rope_base']", cfg.get("rope_base", 500000.0), 0.0,
                            lo_open=True)
    freq = cfg.get("rope_freq")
    if freq is not None:  # None is no scaling; {} or 0 is not the book's dict
        if not isinstance(freq, Mapping):
            raise TypeError(f"config['rope_freq']: expected a dict, got {type(freq).__name__}")
        missing = [k for k in _ROPE_FREQ if k not in freq]
        if missing:
            raise ValueError(f"config['rope_freq']: missing key(s) {', '.join(missing)}")
        c.rope_factor = as_number("config['rope_freq']['factor']", freq["factor"], 0.0,
                                  lo_open=True)
        c.rope_low_freq_factor = as_number("config['rope_freq']['low_freq_factor']",
                                           freq["low_freq_factor"], 0.0)
        c.rope_high_freq_factor = as_number("config['rope_freq']['high_freq_factor']",
                                            freq["high_freq_factor"], 0.0)
        c.rope_original_context_length = as_index(
            "config['rope_freq']['original_context_length']", freq["original_context_length"], 1)
    return c


def _gpt_config(cfg, arch):
    """attn_gpt_config from the book's cfg dict (GPT_CONFIG_124M's keys), or
    from a chapter-4 bonus GPT's (arch "gpt-gqa": n_kv_groups; "gpt-mla":
    latent_dim, None for the module's max(16, emb_dim // 8); sliding_window_size
    with sliding_window_stride: gpt_with_kv_swa.py's)."""
    missing = [k for k in _GPT_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"config: missing key(s) {', '.join(missing)}; the book's GPT cfg "
                         f"needs {', '.join(_GPT_KEYS)} (drop_rate and qkv_bias optional)")
    qkv_bias = as_flag("config['qkv_bias']", cfg.get("qkv_bias", False))
    c = GptConfig(**{k: as_index(f"config['{k}']", cfg[k], 1) for k in _GPT_KEYS},
                  drop_rate=as_number("config['drop_rate']", cfg.get("drop_rate", 0.0),
                                      0.0, 1.0),
                  qkv_bias=qkv_bias)
    window, stride = cfg.get("sliding_window_size"), cfg.get("sliding_window_stride")
    if window is None and stride is not None:
        raise ValueError("config['sliding_window_stride'] without config['sliding_window_size']")
    if window is not None and arch != "gpt2":
        raise ValueError(f"config: sliding_window_size with "
                         f"{'n_kv_groups' if arch == 'gpt-gqa' else 'latent_dim'}: the book's "
                         f"bonus GPTs have one or the other (gpt_with_kv_swa.py's "
                         f"MultiHeadAttentionWithSWA)")
    if arch == "gpt-gqa":
        c.attention = GPT_GQA
        c.n_kv_groups = as_index("config['n_kv_groups']", cfg["n_kv_groups"], 1, c.n_heads)
    elif arch == "gpt-mla":
        c.attention = GPT_MLA
        latent = cfg["latent_dim"]
        c.latent_dim = 0 if latent is None else as_index("config['latent_dim']", latent, 1)
    elif window is not None:
        c.attention = GPT_SWA
        c.sliding_window_size = as_index("config['sliding_window_size']", window, 1)
        # read as LanguageModel reads it, within the C field's int64
        c.sliding_window_stride = book_window_stride(stride, 2**53, "within 2**53")
    return c


class Pretraining(HandleOwner):
    """A finished (or stopped) run: its history and its model.

    Iterating gives (train_losses, val_losses, tokens_seen), as the book's
    train_model_simple returns them (a resumed run's saved part included);
    .samples holds the greedy sample of each epoch this call ran;
    .epochs_seen is the book's torch.linspace(0, epochs, len(train_losses))
    for plot_losses."""

    def __init__(self, ctx, model, rng, run, epochs, tokenizer):
        self._ctx, self._model, self._rng, self._run = ctx, model, rng, run
        self._tokenizer = tokenizer  # the run reads it while it lives
        self.epochs = epochs
        self.train_losses, self.val_losses, self.tokens_seen = [], [], []
        self.samples = []

    @property
    def epochs_seen(self):
        n = len(self.train_losses)
        if n == 1:
            return [0.0]
        return [self.epochs * i / (n - 1) for i in range(n)]

    def __iter__(self):
        return iter((self.train_losses, self.val_losses, self.tokens_seen))

    def save(self, path):
        """The model as a safetensors file under the book's state_dict names
        (attn generate --weights and LanguageModel.load read it), and the
        run's state beside it, from which resume= continues."""
        path = encode_path("save: path", path)
        with self._ctx.lock:
            self._ctx.check(lib.attn_pretrain_save(self._run, path), "attn_pretrain_save")

    def __del__(self):
        run, model, rng = (getattr(self, n, None) for n in ("_run", "_model", "_rng"))
        if run:
            lib.attn_pretrain_free(run)
        if model:
            lib.attn_model_free(model)
        if rng:
            lib.attn_rng_free(rng)
        self._run = self._model = self._rng = None


def _book_line(event):
    if event["kind"] == "eval":
        return (f"Ep {event['epoch']} (Step {event['step']:06d}): "
                f"Train loss {event['train_loss']:.3f}, Val loss {event['val_loss']:.3f}")
    if event["kind"] == "sample":
        return event["sample"].replace("\n", " ")
    return None


def pretrain(config, text, tokenizer, *, epochs=10, batch_size=2, lr=0.0004, weight_decay=0.1,
             eval_freq=5, eval_iter=5, seed=123, start_context="Every effort moves you",
             sample_tokens=50, max_length=None, stride=None, train_ratio=0.9,
             bernoulli="mt19937", num_threads=None, resume=None, on_event=None, verbose=False):
    """Trains the book's GPTModel(config) (or Llama3Model(config), when config
    has Llama 3's keys hidden_dim or rope_base; or chapter 4's bonus GPTModel
    of gpt_with_kv_gqa.py, gpt_with_kv_mla.py or gpt_with_kv_swa.py, when it
    has n_kv_groups, latent_dim or sliding_window_size) on text as
    chapter 5 does
    (train_model_simple with AdamW, evaluate_model every eval_freq steps
    over eval_iter batches, a greedy sample after each epoch) and returns
    a Pretraining.

    config: the book's cfg dict. text: the whole text (a str), split 90/10
    at train_ratio's character as gpt_train.py splits it. tokenizer: an
    attn.Tokenizer or the path of GPT-2's BPE files. bernoulli: how dropout
    draws its masks ("mt19937": PyTorch builds without MKL; see
    attn.set_bernoulli). resume: a file written by Pretraining.save whose
    run this one continues (the same config, text and options). on_event
    (optional) is called with a dict per event (kind "step", "eval",
    "sample"); verbose prints the book's lines."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config: expected the book's cfg dict, got {type(config).__name__}")
    arch = book_arch(config)
    llama = arch == "llama3"
    mcfg = _llama3_config(config) if llama else _gpt_config(config, arch)
    text = as_utf8("pretrain: text", text)
    if not isinstance(tokenizer, Tokenizer):
        if not is_path(tokenizer):
            raise TypeError(f"pretrain: tokenizer: expected an attn.Tokenizer or the path of "
                            f"GPT-2's BPE files, got {show(tokenizer)}")
        tokenizer = Tokenizer(tokenizer)
    if resume is not None:
        resume = encode_path("pretrain: resume", resume)
    if on_event is not None and not callable(on_event):
        raise TypeError(f"pretrain: on_event: expected a callable or None, got {show(on_event)}")
    opts = lib.attn_pretrain_defaults()
    opts.epochs = as_index("epochs", epochs, 0)
    opts.batch_size = as_index("batch_size", batch_size, 1)
    opts.max_length = 0 if max_length is None else as_index("max_length", max_length, 1)
    opts.stride = 0 if stride is None else as_index("stride", stride, 1)
    opts.train_ratio = as_number("train_ratio", train_ratio, 0.0, 1.0)
    opts.lr = as_number("lr", lr, 0.0, lo_open=True)
    opts.weight_decay = as_number("weight_decay", weight_decay, 0.0)
    opts.eval_freq = as_index("eval_freq", eval_freq, 1)
    opts.eval_iter = as_index("eval_iter", eval_iter, 1)
    context = as_str("start_context", start_context)
    if "\0" in context:  # the C string would end there
        raise ValueError(f"pretrain: start_context holds a NUL at character "
                         f"{context.index(chr(0))}")
    try:
        context = context.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"pretrain: start_context: character {err.start} is a lone surrogate "
                         f"(U+{ord(context[err.start]):04X}), which UTF-8 cannot encode") from None
    opts.start_context = context
    opts.sample_tokens = as_index("sample_tokens", sample_tokens, 0)
    seed = as_index("seed", seed, 0, 2**64 - 1)
    method = _BERNOULLI[as_choice("bernoulli", bernoulli, _BERNOULLI)]
    ctx = Context(_modules.get_num_threads() if num_threads is None else num_threads)

    rng, model, run = c_void_p(), c_void_p(), c_void_p()
    with ctx.lock:
        ctx.check(lib.attn_rng_new(ctx.handle, seed, ctypes.byref(rng)), "attn_rng_new")
    result = Pretraining(ctx, None, rng, None, opts.epochs, tokenizer)
    with ctx.lock:
        ctx.check(lib.attn_rng_set_bernoulli_method(rng, method))
        new = lib.attn_model_new_llama3 if llama else lib.attn_model_new_gpt
        ctx.check(new(ctx.handle, ctypes.byref(mcfg), rng, ctypes.byref(model)),
                  "attn_model_new_llama3" if llama else "attn_model_new_gpt")
        result._model = model
        with tokenizer._lock:
            ctx.check(lib.attn_pretrain_new(ctx.handle, model, tokenizer._handle, text, len(text),
                                            ctypes.byref(opts), rng, ctypes.byref(run)),
                      "attn_pretrain_new")
        result._run = run
        if resume is not None:
            ctx.check(lib.attn_pretrain_resume(run, resume), "attn_pretrain_resume")

    ev = PretrainEvent()
    first = True
    while True:
        with ctx.lock, tokenizer._lock:
            ctx.check(lib.attn_pretrain_next(run, ctypes.byref(ev)), "attn_pretrain_next")
            event = {"kind": _KINDS.get(ev.kind, str(ev.kind)), "epoch": ev.epoch,
                     "step": ev.step, "steps_per_epoch": ev.steps_per_epoch,
                     "total_steps": ev.total_steps, "tokens_seen": ev.tokens_seen}
            if ev.kind == STEP:
                event["loss"] = ev.step_loss
            elif ev.kind == EVAL:
                event.update(train_loss=ev.train_loss, val_loss=ev.val_loss)
            elif ev.kind == SAMPLE:
                raw = ctypes.string_at(ev.sample, ev.sample_length) if ev.sample_length else b""
                event["sample"] = raw.decode("utf-8", errors="replace")
        if first and resume is not None and (ev.kind == DONE or ev.epoch > opts.epochs):
            # past epochs already (DONE carries the epochs finished; the
            # others, the epoch under way): the call would train nothing
            finished = ev.epoch if ev.kind == DONE else ev.epoch - 1
            raise ValueError(f"pretrain: epochs {opts.epochs}: the run saved in "
                             f"'{os.fsdecode(resume)}' has finished {finished} epoch"
                             f"{'' if finished == 1 else 's'}, so it trains nothing: give "
                             f"epochs {finished + 1} or more")
        first = False
        if ev.kind == DONE:
            break
        if ev.kind == SAMPLE:
            result.samples.append(event["sample"])
        if verbose:
            line = _book_line(event)
            if line is not None:
                print(line, flush=True)
        if on_event is not None:
            on_event(event)
    # the whole history, a resumed run's saved part included
    n, tokens = c_size_t(), POINTER(c_uint64)()
    train, val = POINTER(c_double)(), POINTER(c_double)()
    with ctx.lock:
        ctx.check(lib.attn_pretrain_history(run, ctypes.byref(n), ctypes.byref(tokens),
                                            ctypes.byref(train), ctypes.byref(val)),
                  "attn_pretrain_history")
        result.train_losses = [train[i] for i in range(n.value)]
        result.val_losses = [val[i] for i in range(n.value)]
        result.tokens_seen = [int(tokens[i]) for i in range(n.value)]
    return result


__all__ = ["pretrain", "Pretraining"]
