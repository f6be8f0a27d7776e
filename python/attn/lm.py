"""The book's GPT-2 and Llama 3 as language models over libattn (attn.h's
attn_lm_*): loading, logits with or without a KV cache, and generation.

    import numpy as np, attn
    lm = attn.LanguageModel.load("gpt2/")             # model.safetensors + config.json
    logits = lm.forward(np.array([[15496, 11]], np.int32))   # (1, 2, vocab)
    cache = lm.new_cache(batch=1, max_len=64)
    lm.forward(prompt, cache=cache, last_only=True)   # prefill: (1, vocab)
    lm.forward(next_id, cache=cache, last_only=True)  # one step on
    ids = lm.generate(prompt_ids, max_new_tokens=20)  # greedy, cached

A config is a path to JSON (Hugging Face's config.json or the book's cfg
dict) or a dict of the book's cfg keys (vocab_size, context_length, emb_dim,
n_heads, n_layers, qkv_bias; Llama 3: hidden_dim, n_kv_groups, rope_base,
rope_freq {factor, low_freq_factor, high_freq_factor,
original_context_length}); without one a directory's config.json is read,
or a GPT-2 file's shapes give it.
"""
import contextlib
import ctypes
import signal
import threading
from collections import OrderedDict
from collections.abc import Mapping
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_double, c_int, c_int32, c_size_t,
                    c_void_p)

import numpy as np

from . import modules as _modules
from ._args import SIZE_MAX, as_choice, as_flag, as_ids, as_index, as_number, show
from ._lib import F32P, AttnError, Context, HandleOwner, Param, encode_path, is_path, lib

I32P = POINTER(c_int32)
SIZEP = POINTER(c_size_t)

ARCHS = {"gpt2": 1, "llama3": 2, "gpt-gqa": 3, "gpt-mla": 4}
# attn_dtype values a model's weights may take (attn_lm_config's weights_dtype)
WEIGHTS_DTYPES = {"f32": 0, "f16": 1, "bf16": 2}
# attn_lm_load_flags
LOAD_FILE_DTYPE, LOAD_NON_STRICT = 1, 2
LAYOUTS = {"contiguous": 0, "paged": 1}
# how a KV cache stores K and V (attn.h's attn_dtype numbers)
KV_DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "int8": 6, "fp8": 13, "int4": 15}


class LmConfig(Structure):  # attn_lm_config
    _fields_ = [("arch", c_int), ("vocab_size", c_size_t), ("context_length", c_size_t),
                ("emb_dim", c_size_t), ("n_heads", c_size_t), ("n_layers", c_size_t),
                ("n_kv_groups", c_size_t), ("hidden_dim", c_size_t), ("qkv_bias", c_bool),
                ("tie_embeddings", c_bool), ("norm_eps", c_double), ("rope_base", c_double),
                ("rope_factor", c_double), ("rope_low_freq_factor", c_double),
                ("rope_high_freq_factor", c_double),
                ("rope_original_context_length", c_size_t), ("weights_dtype", c_int),
                ("sliding_window_size", c_size_t), ("sliding_window_stride", c_size_t),
                ("latent_dim", c_size_t)]


class ForwardArgs(Structure):
    _c_structs_ = ("attn_lm_forward_args",)  # what tests/python/test_abi.py checks it against
    _fields_ = [("cache", c_void_p), ("tokens", I32P), ("batch", c_size_t), ("lens", SIZEP),
                ("tokens_per_seq", c_size_t), ("last_only", c_bool), ("logits", F32P)]


class Sampling(Structure):  # attn_sampling
    _fields_ = [("temperature", c_double), ("top_k", c_size_t), ("top_p", c_double)]


TOKEN_FN = CFUNCTYPE(c_bool, c_void_p, c_int32)


class GenerateArgs(Structure):  # attn_generate_args
    _fields_ = [("prompt", I32P), ("prompt_len", c_size_t), ("max_new_tokens", c_size_t),
                ("sampling", Sampling), ("rng", c_void_p), ("stop_tokens", I32P),
                ("num_stop_tokens", c_size_t), ("cache", c_void_p), ("on_token", TOKEN_FN),
                ("user", c_void_p), ("out", I32P), ("count", SIZEP)]


class KvCacheConfig(Structure):  # attn_kv_cache_config
    _fields_ = [("num_layers", c_size_t), ("batch", c_size_t), ("kv_heads", c_size_t),
                ("head_dim", c_size_t), ("max_len", c_size_t), ("layout", c_int),
                ("page_size", c_size_t), ("num_pages", c_size_t), ("windows", SIZEP),
                ("k_dtype", c_int), ("v_dtype", c_int), ("values_are_keys", ctypes.c_bool)]


_SIGNATURES = {
    "attn_lm_new": (c_int, c_void_p, POINTER(LmConfig), c_void_p, POINTER(c_void_p)),
    "attn_lm_load": (c_int, c_void_p, ctypes.c_char_p, ctypes.c_char_p, POINTER(LmConfig),
                     POINTER(c_void_p)),
    "attn_lm_load_as": (c_int, c_void_p, ctypes.c_char_p, ctypes.c_char_p, POINTER(LmConfig),
                        c_int, POINTER(c_void_p)),
    "attn_lm_load_ex": (c_int, c_void_p, ctypes.c_char_p, ctypes.c_char_p, POINTER(LmConfig),
                        c_int, ctypes.c_uint, POINTER(c_void_p)),
    "attn_lm_param_data": (c_int, c_void_p, c_size_t, POINTER(c_int), POINTER(c_void_p)),
    "attn_lm_weight_bytes": (c_size_t, c_void_p),
    "attn_lm_save": (c_int, c_void_p, ctypes.c_char_p),
    "attn_lm_free": (None, c_void_p),
    "attn_lm_get_config": (LmConfig, c_void_p),
    "attn_lm_set_matmul_dtype": (c_int, c_void_p, c_int),
    "attn_lm_get_matmul_dtype": (c_int, c_void_p),
    "attn_lm_param_count": (c_size_t, c_void_p),
    "attn_lm_param_at": (c_int, c_void_p, c_size_t, POINTER(Param)),
    "attn_lm_cache_new": (c_int, c_void_p, c_size_t, c_size_t, c_int, c_size_t,
                          POINTER(c_void_p)),
    "attn_lm_forward": (c_int, c_void_p, POINTER(ForwardArgs)),
    "attn_lm_generate": (c_int, c_void_p, POINTER(GenerateArgs)),
    "attn_kv_cache_free": (None, c_void_p),
    "attn_kv_cache_get_config": (KvCacheConfig, c_void_p),
    "attn_kv_cache_reset": (c_int, c_void_p),
    "attn_kv_cache_reset_sequence": (c_int, c_void_p, c_size_t),
    "attn_kv_cache_length": (c_int, c_void_p, c_size_t, c_size_t, SIZEP),
    "attn_kv_cache_bytes": (c_size_t, c_void_p),
    "attn_kv_cache_token_bytes": (c_size_t, c_void_p),
    "attn_lm_cache_config": (c_int, c_void_p, c_size_t, c_size_t, POINTER(KvCacheConfig)),
    "attn_kv_cache_new": (c_int, c_void_p, POINTER(KvCacheConfig), POINTER(c_void_p)),
}
for _name, (_restype, *_argtypes) in _SIGNATURES.items():
    _fn = getattr(lib, _name, None)
    if _fn is not None:
        _fn.restype = _restype
        _fn.argtypes = _argtypes


_REQUIRED = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers")
_ROPE_FREQ = ("factor", "low_freq_factor", "high_freq_factor", "original_context_length")


def book_window_stride(stride, limit, within):
    """The book's cfg['sliding_window_stride'] K (K windowed layers then one
    without; 0 none; negative every layer) of a cfg with a window: an
    integer, or a float of one (the script's int(stride) takes 2.0), at
    most limit (said as within) in size."""
    if stride is None:
        raise ValueError("config['sliding_window_size'] needs config['sliding_window_stride'] "
                         "(the book's K: K windowed layers then one without; 0 none; "
                         "negative every layer)")
    name = "config['sliding_window_stride']"
    k = (stride if isinstance(stride, int) and not isinstance(stride, bool)
         else as_number(name, stride))
    if k != int(k) or abs(k) > limit:
        raise ValueError(f"{name}: {stride!r} is not an integer {within}")
    return int(k)


def book_arch(cfg):
    """The model a book's cfg dict describes, by its keys, as the C config
    readers tell them: llama3 with hidden_dim or rope_base, else gpt-mla with
    latent_dim, gpt-gqa with n_kv_groups, else gpt2."""
    if any(k in cfg for k in ("hidden_dim", "rope_base")):
        return "llama3"
    return "gpt-mla" if "latent_dim" in cfg else "gpt-gqa" if "n_kv_groups" in cfg else "gpt2"


def config_struct(cfg):
    """An attn_lm_config from the book's cfg dict (Llama 3 when it has
    hidden_dim or rope_base, else the GPT with MultiHeadLatentAttention of
    gpt_with_kv_mla.py when it has latent_dim (None: the module's default),
    or with GroupedQueryAttention of gpt_with_kv_gqa.py when it has
    n_kv_groups, else GPT-2; "arch" may say "gpt2", "gpt-gqa", "gpt-mla" or
    "llama3"; gpt_with_kv_swa.py's sliding_window_size and
    sliding_window_stride give layers a window)."""
    if not isinstance(cfg, Mapping):
        raise TypeError(f"config: expected a dict of the book's cfg keys (or a JSON path), "
                        f"got {type(cfg).__name__}")
    missing = [k for k in _REQUIRED if k not in cfg]
    if missing:
        raise ValueError(f"config: missing key(s) {', '.join(missing)}; the book's cfg needs "
                         f"{', '.join(_REQUIRED)}")
    arch = as_choice("config['arch']", cfg.get("arch", book_arch(cfg)), ARCHS)
    # told by its keys, the model reads only its own, as the C reader of the
    # same cfg in a JSON file does (latent_dim wins over n_kv_groups)
    by_keys = "arch" not in cfg
    groups_key = not by_keys or arch in ("gpt-gqa", "llama3")
    latent_key = not by_keys or arch == "gpt-mla"
    dtype = as_choice("config['weights_dtype']", cfg.get("weights_dtype", "f32"),
                      WEIGHTS_DTYPES)

    def size(key, default=None, where=cfg, prefix="config"):
        value = where[key] if default is None else where.get(key, default)
        return as_index(f"{prefix}['{key}']", value, 0, SIZE_MAX)

    def number(key, where=cfg, prefix="config"):
        return as_number(f"{prefix}['{key}']", where.get(key, 0.0), 0.0)

    c = LmConfig(arch=ARCHS[arch], vocab_size=size("vocab_size"),
                 context_length=size("context_length"), emb_dim=size("emb_dim"),
                 n_heads=size("n_heads"), n_layers=size("n_layers"),
                 # None is left out, one a head, as the C reader takes null
                 n_kv_groups=(size("n_kv_groups", 0)
                              if groups_key and cfg.get("n_kv_groups") is not None else 0),
                 hidden_dim=size("hidden_dim", 0),
                 qkv_bias=as_flag("config['qkv_bias']", cfg.get("qkv_bias", False)),
                 tie_embeddings=as_flag("config['tie_embeddings']",
                                      cfg.get("tie_embeddings", False)),
                 norm_eps=number("norm_eps"), rope_base=number("rope_base"),
                 weights_dtype=WEIGHTS_DTYPES[dtype],
                 latent_dim=0 if cfg.get("latent_dim") is None or not latent_key
                 else size("latent_dim"))
    if latent_key and cfg.get("latent_dim") is not None and c.latent_dim == 0:
        raise ValueError("config['latent_dim']: 0 is a latent of no width; leave it out (or "
                         "None) for the module's max(16, emb_dim // 8)")
    window, stride = cfg.get("sliding_window_size"), cfg.get("sliding_window_stride")
    if window is not None:
        c.sliding_window_size = size("sliding_window_size")
        if c.sliding_window_size == 0:
            raise ValueError("config['sliding_window_size']: 0 holds no position; leave it "
                             "out (or None) for no window")
        k = book_window_stride(stride, SIZE_MAX, "in size_t's range")
        if k == 0:
            c.sliding_window_size = 0
        c.sliding_window_stride = int(k) if k > 0 else 0
    elif stride is not None:
        raise ValueError("config['sliding_window_stride'] without config['sliding_window_size']")
    # A given 0 is kept: the C config reads +0.0 as "not given" (1e-5) and
    # -0.0 (ATTN_LM_EPS_ZERO) as exactly 0; RoPE's 0^x has no meaning.
    if "norm_eps" in cfg and c.norm_eps == 0.0:
        c.norm_eps = -0.0
    if groups_key and cfg.get("n_kv_groups") is not None and c.n_kv_groups == 0:
        raise ValueError("config['n_kv_groups']: 0 holds no head; give a count that divides "
                         "n_heads, or leave it out for one a head")
    if "rope_base" in cfg and c.rope_base == 0.0:
        raise ValueError("config['rope_base']: 0 gives RoPE no frequencies; leave it out "
                         "for Llama 3's 500000")
    freq = cfg.get("rope_freq")
    if freq is not None:  # None is no scaling; {} or 0 is not the book's dict
        if not isinstance(freq, Mapping):
            raise TypeError(f"config['rope_freq']: expected a dict, got {type(freq).__name__}")
        missing = [k for k in _ROPE_FREQ if k not in freq]
        if missing:
            raise ValueError(f"config['rope_freq']: missing key(s) {', '.join(missing)}; it "
                             f"needs {', '.join(_ROPE_FREQ)}")
        rf = "config['rope_freq']"
        c.rope_factor = number("factor", freq, rf)
        if not c.rope_factor > 0.0:
            raise ValueError(f"{rf}['factor']: {c.rope_factor} must be positive (None, not a "
                             "dict, is no scaling)")
        c.rope_low_freq_factor = number("low_freq_factor", freq, rf)
        c.rope_high_freq_factor = number("high_freq_factor", freq, rf)
        c.rope_original_context_length = size("original_context_length", None, freq, rf)
    return c


def config_dict(c):
    """The book's cfg dict of an attn_lm_config."""
    arch = next((name for name, n in ARCHS.items() if n == c.arch), str(c.arch))
    d = {"arch": arch, "vocab_size": c.vocab_size,
         "context_length": c.context_length, "emb_dim": c.emb_dim, "n_heads": c.n_heads,
         "n_layers": c.n_layers, "qkv_bias": bool(c.qkv_bias),
         "tie_embeddings": bool(c.tie_embeddings), "norm_eps": c.norm_eps}
    names = {v: k for k, v in WEIGHTS_DTYPES.items()}
    if c.weights_dtype != 0:
        d["weights_dtype"] = names.get(c.weights_dtype, str(c.weights_dtype))
    if c.arch == ARCHS["gpt-gqa"]:
        d["n_kv_groups"] = c.n_kv_groups
    if c.arch == ARCHS["gpt-mla"]:
        d["latent_dim"] = c.latent_dim
    if c.sliding_window_size:
        d["sliding_window_size"] = c.sliding_window_size
        d["sliding_window_stride"] = c.sliding_window_stride or -1
    if c.arch == ARCHS["llama3"]:
        d.update(hidden_dim=c.hidden_dim, n_kv_groups=c.n_kv_groups, rope_base=c.rope_base)
        if c.rope_factor > 0:
            d["rope_freq"] = {"factor": c.rope_factor, "low_freq_factor": c.rope_low_freq_factor,
                              "high_freq_factor": c.rope_high_freq_factor,
                              "original_context_length": c.rope_original_context_length}
    return d


def _kv_dtype_name(number):
    return next((name for name, n in KV_DTYPES.items() if n == number), "?")


@contextlib.contextmanager
def _holding(*locks):
    """Each distinct lock held, taken in one order (by id) whatever the
    caller's, so that two calls wanting the same two locks cannot each hold
    one and wait for the other."""
    with contextlib.ExitStack() as stack:
        for lock in sorted({id(x): x for x in locks}.values(), key=id):
            stack.enter_context(lock)
        yield


class KVCache(HandleOwner):
    """An attn_kv_cache made by LanguageModel.new_cache.

    Threads: the cache shares the context and lock of the model that made
    it: its attention runs on that context's threads and workspace, so a
    model given the cache holds that lock too (another model's included),
    and calls on the cache and on that model run one at a time; share it
    between threads freely, knowing that the calls then interleave in an
    unspecified order."""

    def __init__(self, handle, ctx):
        self._handle = handle
        self._ctx = ctx
        self._lock = ctx.lock

    @property
    def handle(self):
        return self._handle

    def config(self):
        with self._lock:
            c = lib.attn_kv_cache_get_config(self._handle)
        return {"num_layers": c.num_layers, "batch": c.batch, "kv_heads": c.kv_heads,
                "head_dim": c.head_dim, "max_len": c.max_len,
                "layout": "paged" if c.layout == 1 else "contiguous",
                "page_size": c.page_size, "num_pages": c.num_pages,
                "k_dtype": _kv_dtype_name(c.k_dtype), "v_dtype": _kv_dtype_name(c.v_dtype),
                "values_are_keys": bool(c.values_are_keys)}

    def length(self, seq=0, layer=0):
        seq, layer = as_index("seq", seq, 0, SIZE_MAX), as_index("layer", layer, 0, SIZE_MAX)
        n = c_size_t()
        with self._lock:
            self._ctx.check(lib.attn_kv_cache_length(self._handle, layer, seq, ctypes.byref(n)))
        return n.value

    def reset(self, seq=None):
        with self._lock:
            if seq is None:
                self._ctx.check(lib.attn_kv_cache_reset(self._handle))
            else:
                self._ctx.check(lib.attn_kv_cache_reset_sequence(
                    self._handle, as_index("seq", seq, 0, SIZE_MAX)))

    def nbytes(self):
        with self._lock:
            return lib.attn_kv_cache_bytes(self._handle)

    def token_bytes(self):
        """Bytes one token of one sequence takes: all layers, K and V, scales included."""
        with self._lock:
            return lib.attn_kv_cache_token_bytes(self._handle)

    def __del__(self):
        if getattr(self, "_handle", None):
            lib.attn_kv_cache_free(self._handle)
            self._handle = None


class _TokenCallback:
    """on_token as the C callback: the rule is that returning False (or
    any false value but None) stops, None continues; an exception stops the
    run and is kept, to be raised once attn_lm_generate has returned (an
    exception cannot cross the C frames, and ctypes would print it and
    return 0, a silent stop)."""

    def __init__(self, on_token):
        self.on_token = on_token
        self.error = None
        self.interrupted = False
        self.c_function = TOKEN_FN(self._call)

    def run(self, call):
        """call() (the C call that calls back) with Ctrl-C noted rather than
        raised, in the main thread where Python's own handler is set: raised
        where the callback is entered, a KeyboardInterrupt would escape its
        try, and ctypes would print it and go on. The next token stops the
        run, and the KeyboardInterrupt is raised once the call returns."""
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
            return call()

        def note(_signum, _frame):
            self.interrupted = True
        previous = signal.signal(signal.SIGINT, note)
        try:
            status = call()
        finally:
            signal.signal(signal.SIGINT, previous)
        if self.interrupted and self.error is None:
            self.error = KeyboardInterrupt()
        return status

    def _call(self, _user, token):
        try:
            if self.interrupted:
                self.error = KeyboardInterrupt()
                return False
            result = self.on_token(int(token))
            # bool() of the result may raise too (a numpy array of several values)
            return result is None or bool(result)
        except BaseException as err:  # KeyboardInterrupt too: it stops the run
            self.error = err
            return False


class LanguageModel(HandleOwner):
    """The book's GPTModel or Llama3Model (inference), over libattn.

    Threads: one model runs one call at a time. Calls from several threads
    on the same model (and on its caches) wait for each other, through a
    lock the model holds; the C library lets the GIL go, so different
    models run in parallel."""

    def __init__(self, config, seed=None, num_threads=None):
        """A model of config (the book's cfg dict) with weights drawn as the
        book's constructor draws them after torch.manual_seed(seed), or zeros
        when seed is None."""
        cfg = config_struct(config)
        if seed is not None:
            seed = as_index("seed", seed, 0, 2**64 - 1)
        self._ctx = Context(_modules.get_num_threads() if num_threads is None else num_threads)
        self._lock = self._ctx.lock
        self._handle = c_void_p()
        rng = None
        if seed is not None:
            rng = _modules._Generator(seed)
        self._ctx.check(lib.attn_lm_new(self._ctx.handle, ctypes.byref(cfg),
                                        rng.handle if rng else None,
                                        ctypes.byref(self._handle)))

    @classmethod
    def load(cls, path, config=None, num_threads=None, weights_dtype=None, strict=True):
        """A model from a safetensors file or a save_pretrained directory; config
        is None, a JSON path, or the book's cfg dict. weights_dtype: "f32",
        "bf16" or "f16" for the linear layers and the embedding in memory
        (None: the file's; see attn_lm_load_as for what is refused). strict,
        as load_state_dict's: a file holding tensors the model does not use
        is refused, naming them; strict=False ignores them (a missing tensor
        is refused either way)."""
        if weights_dtype is not None:
            as_choice("load: weights_dtype", weights_dtype, WEIGHTS_DTYPES)
        cfg_struct, cfg_path = None, None
        if isinstance(config, Mapping):
            cfg_struct = ctypes.byref(config_struct(config))
        elif config is not None:
            if not is_path(config):
                raise TypeError(f"load: config: expected None, the path of a config.json or "
                                f"the book's cfg dict, got {show(config)}")
            cfg_path = encode_path("load: config", config)
        path = encode_path("load: path", path)
        self = cls.__new__(cls)
        self._ctx = Context(_modules.get_num_threads() if num_threads is None else num_threads)
        self._lock = self._ctx.lock
        self._handle = c_void_p()
        flags = (LOAD_FILE_DTYPE if weights_dtype is None else 0) | \
            (0 if as_flag("load: strict", strict) else LOAD_NON_STRICT)
        self._ctx.check(lib.attn_lm_load_ex(self._ctx.handle, path, cfg_path, cfg_struct,
                                            WEIGHTS_DTYPES[weights_dtype or "f32"], flags,
                                            ctypes.byref(self._handle)))
        return self

    def __del__(self):
        if getattr(self, "_handle", None):
            lib.attn_lm_free(self._handle)
            self._handle = None

    @property
    def config(self):
        with self._lock:
            return config_dict(lib.attn_lm_get_config(self._handle))

    @property
    def matmul_dtype(self):
        """The dtype the linear layers' products take the activations in:
        "f32" (the default: only the float32 sums round) or "bf16" (a model
        of bf16 weights: the activations rounded to bf16, the products on
        the CPU's bf16 instructions; attn_lm_set_matmul_dtype)."""
        with self._lock:
            number = lib.attn_lm_get_matmul_dtype(self._handle)
        return {v: k for k, v in WEIGHTS_DTYPES.items()}.get(number, str(number))

    @matmul_dtype.setter
    def matmul_dtype(self, dtype):
        number = WEIGHTS_DTYPES[as_choice("matmul_dtype", dtype, ("f32", "bf16"))]
        with self._lock:
            self._ctx.check(lib.attn_lm_set_matmul_dtype(self._handle, number))

    @property
    def weight_bytes(self):
        """Bytes the parameters take in memory."""
        with self._lock:
            return lib.attn_lm_weight_bytes(self._handle)

    def save(self, path):
        """The book's state_dict names, float32 safetensors (16-bit weights
        widened, exactly)."""
        path = encode_path("save: path", path)
        with self._lock:
            self._ctx.check(lib.attn_lm_save(self._handle, path))

    def state_dict(self):
        with self._lock:
            return self._state_dict()

    def _state_dict(self):
        out = OrderedDict()
        for i in range(lib.attn_lm_param_count(self._handle)):
            p = Param()
            self._ctx.check(lib.attn_lm_param_at(self._handle, i, ctypes.byref(p)))
            shape = tuple(p.shape[:p.ndim])
            if p.data:
                out[p.name.decode()] = np.ctypeslib.as_array(p.data, shape=(p.numel,)).reshape(
                    shape).copy()
                continue
            # a 16-bit tensor: its bits, widened to float32 (exact)
            dtype, data = c_int(), c_void_p()
            self._ctx.check(lib.attn_lm_param_data(self._handle, i, ctypes.byref(dtype),
                                                   ctypes.byref(data)))
            bits = np.ctypeslib.as_array(ctypes.cast(data, POINTER(ctypes.c_uint16)),
                                         shape=(p.numel,))
            if dtype.value == WEIGHTS_DTYPES["bf16"]:
                wide = (bits.astype(np.uint32) << 16).view(np.float32)
            else:
                wide = bits.view(np.float16).astype(np.float32)
            out[p.name.decode()] = wide.reshape(shape).copy()
        return out

    def new_cache(self, batch=1, max_len=0, layout="contiguous", page_size=16, dtype="f32",
                  k_dtype=None, v_dtype=None):
        """A KV cache for this model: dtype is how it stores K and V: "f32", "bf16",
        "f16", "fp8" (e4m3), "int8" or "int4"; k_dtype or v_dtype, where given, is
        that side's instead (dtype None: both given). A gpt-mla model caches its
        latent, one array read as K and as V: one type (ValueError otherwise)."""
        batch = as_index("batch", batch, 0, SIZE_MAX)
        max_len = as_index("max_len", max_len, 0, SIZE_MAX)
        page_size = as_index("page_size", page_size, 0, SIZE_MAX)
        as_choice("new_cache: layout", layout, LAYOUTS)
        for name, value in (("dtype", dtype), ("k_dtype", k_dtype), ("v_dtype", v_dtype)):
            if value is not None:
                as_choice(f"new_cache: {name}", value, KV_DTYPES)
        if dtype is None and (k_dtype is None or v_dtype is None):
            raise ValueError("new_cache: dtype is None: give it, or both k_dtype and v_dtype")
        cfg = KvCacheConfig()
        handle = c_void_p()
        with self._lock:
            self._ctx.check(lib.attn_lm_cache_config(self._handle, batch, max_len,
                                                     ctypes.byref(cfg)))
            cfg.layout, cfg.page_size = LAYOUTS[layout], page_size
            k_name = k_dtype if k_dtype is not None else dtype
            v_name = v_dtype if v_dtype is not None else dtype
            if cfg.values_are_keys and k_name != v_name:
                raise ValueError(f"new_cache: k_dtype {k_name!r}, v_dtype {v_name!r}: this "
                                 "model caches one latent a token, read as keys and as "
                                 "values: give one type (dtype)")
            cfg.k_dtype, cfg.v_dtype = KV_DTYPES[k_name], KV_DTYPES[v_name]
            try:
                self._ctx.check(lib.attn_kv_cache_new(self._ctx.handle, ctypes.byref(cfg),
                                                      ctypes.byref(handle)))
            except AttnError as err:
                if not cfg.values_are_keys:
                    raise
                # the cache's head_dim is then the latent's, which the cfg names latent_dim
                raise AttnError(err.status, f"{err} (this model caches its latent: one KV "
                                f"head of latent_dim {cfg.head_dim})") from None
        return KVCache(handle, self._ctx)

    def forward(self, ids, cache=None, last_only=False):
        """Logits of ids: a (batch, n) int array -> (batch, n, vocab), or with
        last_only (batch, vocab); a list of 1-D arrays (a ragged batch) -> a
        list of (n_i, vocab) arrays, or with last_only (batch, vocab).
        Ids are integers in [0, vocab_size): others raise (ValueError past
        int32, TypeError for floats, AttnError for the rest)."""
        if isinstance(cache, KVCache) and cache.handle is None:
            raise ValueError("cache: this KVCache was freed")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache: expected a KVCache (LanguageModel.new_cache), got "
                            f"{type(cache).__name__}")
        last_only = as_flag("forward: last_only", last_only)
        ragged = isinstance(ids, (list, tuple))
        if ragged:
            # each sequence 1-D (a bare id: a sequence of one)
            seqs = [as_ids(f"ids[{i}]", [s] if np.ndim(s) == 0 else s)
                    for i, s in enumerate(ids)]
            lens = np.array([len(s) for s in seqs], dtype=np.uintp)
            tokens = np.ascontiguousarray(np.concatenate(seqs) if seqs else
                                          np.zeros(0, np.int32), dtype=np.int32)
            batch, rows = len(seqs), int(lens.sum())
        else:
            tokens = as_ids("ids", ids, ndim=2 if np.ndim(ids) != 1 else 1)
            if tokens.ndim == 1:
                tokens = tokens[None, :]
            batch, n = tokens.shape
            lens, rows = None, batch * n
        with _holding(self._lock, *([cache._lock] if cache is not None else [])):
            vocab = lib.attn_lm_get_config(self._handle).vocab_size
            out_rows = batch if last_only else rows
            logits = np.empty((max(out_rows, 0), vocab), dtype=np.float32)
            args = ForwardArgs(cache=cache.handle if cache is not None else None,
                               tokens=tokens.ctypes.data_as(I32P), batch=batch,
                               lens=lens.ctypes.data_as(SIZEP) if lens is not None else None,
                               tokens_per_seq=0 if ragged else tokens.shape[1],
                               last_only=bool(last_only), logits=logits.ctypes.data_as(F32P))
            self._ctx.check(lib.attn_lm_forward(self._handle, ctypes.byref(args)))
        if last_only:
            return logits
        if ragged:
            return np.split(logits, np.cumsum(lens)[:-1].astype(np.intp))
        return logits.reshape(batch, tokens.shape[1], vocab)

    def generate(self, ids, max_new_tokens, temperature=0.0, top_k=0, top_p=0.0, seed=None,
                 stop_tokens=(), cache="contiguous", page_size=16, on_token=None):
        """New token ids after the prompt ids (a 1-D sequence of ints): the
        book's generate with its KV cache (cache "contiguous" or "paged", or
        a KVCache to reuse). seed: the sampling generator's
        (torch.manual_seed) when temperature > 0; None draws from seed 0, so
        that a run repeats.

        on_token(id), when given, is called with each new token as it is
        chosen. Return False to stop there; None (no return) or True goes
        on. An exception raised in on_token stops the generation and is
        raised again, with its traceback, once the call returns.

        Ids, stop_tokens, max_new_tokens, top_k, page_size and seed are
        integers (TypeError for floats and bools, ValueError when negative
        or past int32 for ids)."""
        prompt = as_ids("ids", ids)
        stops = as_ids("stop_tokens", stop_tokens)
        max_new_tokens = as_index("max_new_tokens", max_new_tokens)
        top_k = as_index("top_k", top_k, 0, SIZE_MAX)
        page_size = as_index("page_size", page_size, 0, SIZE_MAX)
        temperature = as_number("temperature", temperature, 0.0)
        top_p = as_number("top_p", top_p, 0.0, 1.0)
        if seed is not None:
            seed = as_index("seed", seed, 0, 2**64 - 1)
        if on_token is not None and not callable(on_token):
            raise TypeError(f"on_token: expected a callable, got {type(on_token).__name__}")
        if isinstance(cache, KVCache) and cache.handle is None:
            raise ValueError("cache: this KVCache was freed")
        if not isinstance(cache, (KVCache, str)):
            raise TypeError(f"cache: expected 'contiguous', 'paged' or a KVCache, got "
                            f"{type(cache).__name__}")
        callback = _TokenCallback(on_token) if on_token is not None else None
        count = c_size_t()
        rng = _modules._Generator(seed if seed is not None else 0) if temperature > 0 else None
        locks = [self._lock, *([cache._lock] if isinstance(cache, KVCache) else [])]
        with _holding(*locks):
            context_length = lib.attn_lm_get_config(self._handle).context_length
            # the library refuses, before writing any, more new tokens than
            # the context holds; out holds what it can write
            out = np.zeros(max(1, min(max_new_tokens, context_length)), dtype=np.int32)
            if isinstance(cache, KVCache):
                kv = cache
            else:
                kv = self.new_cache(1, min(len(prompt) + max_new_tokens, context_length),
                                    cache, page_size)
            args = GenerateArgs(prompt=prompt.ctypes.data_as(I32P), prompt_len=len(prompt),
                                max_new_tokens=max_new_tokens,
                                sampling=Sampling(temperature, top_k, top_p),
                                rng=rng.handle if rng else None,
                                stop_tokens=stops.ctypes.data_as(I32P) if len(stops) else None,
                                num_stop_tokens=len(stops), cache=kv.handle,
                                on_token=callback.c_function if callback else TOKEN_FN(),
                                user=None, out=out.ctypes.data_as(I32P),
                                count=ctypes.pointer(count))
            for lock in locks:  # on_token may not call back into them
                lock.in_callback_call = callback is not None
            try:
                def call():
                    return lib.attn_lm_generate(self._handle, ctypes.byref(args))
                status = callback.run(call) if callback else call()
            finally:
                for lock in locks:
                    lock.in_callback_call = False
            if callback is not None and callback.error is not None:
                raise callback.error
            self._ctx.check(status)
        return out[:count.value].copy()


__all__ = ["LanguageModel", "KVCache", "AttnError"]
