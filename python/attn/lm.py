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
import ctypes
from collections import OrderedDict
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_double, c_int, c_int32, c_size_t,
                    c_void_p)

import numpy as np

from . import modules as _modules
from ._lib import F32P, AttnError, Context, Param, encode_path, lib

I32P = POINTER(c_int32)
SIZEP = POINTER(c_size_t)

ARCHS = {"gpt2": 1, "llama3": 2}
# attn_dtype values a model's weights may take (attn_lm_config's weights_dtype)
WEIGHTS_DTYPES = {"f32": 0, "f16": 1, "bf16": 2}
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
                ("rope_original_context_length", c_size_t), ("weights_dtype", c_int)]


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
                ("k_dtype", c_int), ("v_dtype", c_int)]


_SIGNATURES = {
    "attn_lm_new": (c_int, c_void_p, POINTER(LmConfig), c_void_p, POINTER(c_void_p)),
    "attn_lm_load": (c_int, c_void_p, ctypes.c_char_p, ctypes.c_char_p, POINTER(LmConfig),
                     POINTER(c_void_p)),
    "attn_lm_load_as": (c_int, c_void_p, ctypes.c_char_p, ctypes.c_char_p, POINTER(LmConfig),
                        c_int, POINTER(c_void_p)),
    "attn_lm_param_data": (c_int, c_void_p, c_size_t, POINTER(c_int), POINTER(c_void_p)),
    "attn_lm_weight_bytes": (c_size_t, c_void_p),
    "attn_lm_save": (c_int, c_void_p, ctypes.c_char_p),
    "attn_lm_free": (None, c_void_p),
    "attn_lm_get_config": (LmConfig, c_void_p),
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


def config_struct(cfg):
    """An attn_lm_config from the book's cfg dict (Llama 3 when it has
    hidden_dim, n_kv_groups or rope_base; "arch" may say "gpt2" or "llama3")."""
    llama = any(k in cfg for k in ("hidden_dim", "n_kv_groups", "rope_base"))
    arch = cfg.get("arch", "llama3" if llama else "gpt2")
    if arch not in ARCHS:
        raise ValueError(f"config: arch must be one of {', '.join(ARCHS)}, got {arch!r}")
    dtype = cfg.get("weights_dtype", "f32")
    if dtype not in WEIGHTS_DTYPES:
        raise ValueError(f"config: weights_dtype must be one of {', '.join(WEIGHTS_DTYPES)}, "
                         f"got {dtype!r}")
    c = LmConfig(arch=ARCHS[arch], vocab_size=int(cfg["vocab_size"]),
                 context_length=int(cfg["context_length"]), emb_dim=int(cfg["emb_dim"]),
                 n_heads=int(cfg["n_heads"]), n_layers=int(cfg["n_layers"]),
                 n_kv_groups=int(cfg.get("n_kv_groups", 0)),
                 hidden_dim=int(cfg.get("hidden_dim", 0)),
                 qkv_bias=bool(cfg.get("qkv_bias", False)),
                 tie_embeddings=bool(cfg.get("tie_embeddings", False)),
                 norm_eps=float(cfg.get("norm_eps", 0.0)),
                 rope_base=float(cfg.get("rope_base", 0.0)),
                 weights_dtype=WEIGHTS_DTYPES[dtype])
    freq = cfg.get("rope_freq")
    if freq:
        c.rope_factor = float(freq["factor"])
        c.rope_low_freq_factor = float(freq["low_freq_factor"])
        c.rope_high_freq_factor = float(freq["high_freq_factor"])
        c.rope_original_context_length = int(freq["original_context_length"])
    return c


def config_dict(c):
    """The book's cfg dict of an attn_lm_config."""
    d = {"arch": "gpt2" if c.arch == 1 else "llama3", "vocab_size": c.vocab_size,
         "context_length": c.context_length, "emb_dim": c.emb_dim, "n_heads": c.n_heads,
         "n_layers": c.n_layers, "qkv_bias": bool(c.qkv_bias),
         "tie_embeddings": bool(c.tie_embeddings), "norm_eps": c.norm_eps}
    names = {v: k for k, v in WEIGHTS_DTYPES.items()}
    if c.weights_dtype != 0:
        d["weights_dtype"] = names.get(c.weights_dtype, str(c.weights_dtype))
    if c.arch == 2:
        d.update(hidden_dim=c.hidden_dim, n_kv_groups=c.n_kv_groups, rope_base=c.rope_base)
        if c.rope_factor > 0:
            d["rope_freq"] = {"factor": c.rope_factor, "low_freq_factor": c.rope_low_freq_factor,
                              "high_freq_factor": c.rope_high_freq_factor,
                              "original_context_length": c.rope_original_context_length}
    return d


def _kv_dtype_name(number):
    return next((name for name, n in KV_DTYPES.items() if n == number), "?")


class KVCache:
    """An attn_kv_cache made by LanguageModel.new_cache."""

    def __init__(self, handle, ctx):
        self._handle = handle
        self._ctx = ctx

    @property
    def handle(self):
        return self._handle

    def config(self):
        c = lib.attn_kv_cache_get_config(self._handle)
        return {"num_layers": c.num_layers, "batch": c.batch, "kv_heads": c.kv_heads,
                "head_dim": c.head_dim, "max_len": c.max_len,
                "layout": "paged" if c.layout == 1 else "contiguous",
                "page_size": c.page_size, "num_pages": c.num_pages,
                "k_dtype": _kv_dtype_name(c.k_dtype), "v_dtype": _kv_dtype_name(c.v_dtype)}

    def length(self, seq=0, layer=0):
        n = c_size_t()
        self._ctx.check(lib.attn_kv_cache_length(self._handle, layer, seq, ctypes.byref(n)))
        return n.value

    def reset(self, seq=None):
        if seq is None:
            self._ctx.check(lib.attn_kv_cache_reset(self._handle))
        else:
            self._ctx.check(lib.attn_kv_cache_reset_sequence(self._handle, seq))

    def nbytes(self):
        return lib.attn_kv_cache_bytes(self._handle)

    def token_bytes(self):
        """Bytes one token of one sequence takes: all layers, K and V, scales included."""
        return lib.attn_kv_cache_token_bytes(self._handle)

    def __del__(self):
        if getattr(self, "_handle", None):
            lib.attn_kv_cache_free(self._handle)
            self._handle = None


class LanguageModel:
    """The book's GPTModel or Llama3Model (inference), over libattn."""

    def __init__(self, config, seed=None, num_threads=None):
        """A model of config (the book's cfg dict) with weights drawn as the
        book's constructor draws them after torch.manual_seed(seed), or zeros
        when seed is None."""
        self._ctx = Context(num_threads or _modules.get_num_threads())
        self._handle = c_void_p()
        rng = None
        if seed is not None:
            rng = _modules._Generator(seed)
        cfg = config_struct(config)
        self._ctx.check(lib.attn_lm_new(self._ctx.handle, ctypes.byref(cfg),
                                        rng.handle if rng else None,
                                        ctypes.byref(self._handle)))

    @classmethod
    def load(cls, path, config=None, num_threads=None, weights_dtype=None):
        """A model from a safetensors file or a save_pretrained directory; config
        is None, a JSON path, or the book's cfg dict. weights_dtype: "f32",
        "bf16" or "f16" for the linear layers and the embedding in memory
        (None: the file's; see attn_lm_load_as for what is refused)."""
        if weights_dtype is not None and weights_dtype not in WEIGHTS_DTYPES:
            raise ValueError(f"load: weights_dtype must be one of {', '.join(WEIGHTS_DTYPES)}, "
                             f"got {weights_dtype!r}")
        self = cls.__new__(cls)
        self._ctx = Context(num_threads or _modules.get_num_threads())
        self._handle = c_void_p()
        cfg_struct, cfg_path = None, None
        if isinstance(config, dict):
            cfg_struct = ctypes.byref(config_struct(config))
        elif config is not None:
            cfg_path = encode_path(config)
        if weights_dtype is None:
            self._ctx.check(lib.attn_lm_load(self._ctx.handle, encode_path(path), cfg_path,
                                             cfg_struct, ctypes.byref(self._handle)))
        else:
            self._ctx.check(lib.attn_lm_load_as(self._ctx.handle, encode_path(path), cfg_path,
                                                cfg_struct, WEIGHTS_DTYPES[weights_dtype],
                                                ctypes.byref(self._handle)))
        return self

    def __del__(self):
        if getattr(self, "_handle", None):
            lib.attn_lm_free(self._handle)
            self._handle = None

    @property
    def config(self):
        return config_dict(lib.attn_lm_get_config(self._handle))

    @property
    def weight_bytes(self):
        """Bytes the parameters take in memory."""
        return lib.attn_lm_weight_bytes(self._handle)

    def save(self, path):
        """The book's state_dict names, float32 safetensors (16-bit weights
        widened, exactly)."""
        self._ctx.check(lib.attn_lm_save(self._handle, encode_path(path)))

    def state_dict(self):
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
        """A KV cache for this model: dtype (or k_dtype and v_dtype apart) is how it
        stores K and V: "f32", "bf16", "f16", "fp8" (e4m3), "int8" or "int4"."""
        if layout not in LAYOUTS:
            raise ValueError(f"new_cache: layout must be one of {', '.join(LAYOUTS)}, "
                             f"got {layout!r}")
        for name, value in (("dtype", dtype), ("k_dtype", k_dtype), ("v_dtype", v_dtype)):
            if value is not None and value not in KV_DTYPES:
                raise ValueError(f"new_cache: {name} must be one of {', '.join(KV_DTYPES)}, "
                                 f"got {value!r}")
        cfg = KvCacheConfig()
        self._ctx.check(lib.attn_lm_cache_config(self._handle, batch, max_len, ctypes.byref(cfg)))
        cfg.layout, cfg.page_size = LAYOUTS[layout], page_size
        cfg.k_dtype = KV_DTYPES[k_dtype if k_dtype is not None else dtype]
        cfg.v_dtype = KV_DTYPES[v_dtype if v_dtype is not None else dtype]
        handle = c_void_p()
        self._ctx.check(lib.attn_kv_cache_new(self._ctx.handle, ctypes.byref(cfg),
                                              ctypes.byref(handle)))
        return KVCache(handle, self._ctx)

    def forward(self, ids, cache=None, last_only=False):
        """Logits of ids: a (batch, n) int array -> (batch, n, vocab), or with
        last_only (batch, vocab); a list of 1-D arrays (a ragged batch) -> a
        list of (n_i, vocab) arrays, or with last_only (batch, vocab)."""
        vocab = lib.attn_lm_get_config(self._handle).vocab_size
        ragged = isinstance(ids, (list, tuple))
        if ragged:
            seqs = [np.ascontiguousarray(s, dtype=np.int32).reshape(-1) for s in ids]
            lens = np.array([len(s) for s in seqs], dtype=np.uintp)
            tokens = np.ascontiguousarray(np.concatenate(seqs) if seqs else
                                          np.zeros(0, np.int32), dtype=np.int32)
            batch, rows = len(seqs), int(lens.sum())
        else:
            arr = np.asarray(ids)
            if arr.ndim == 1:
                arr = arr[None, :]
            if arr.ndim != 2:
                raise ValueError(f"forward: ids must be (batch, n), got shape {arr.shape}")
            tokens = np.ascontiguousarray(arr, dtype=np.int32)
            batch, n = tokens.shape
            lens, rows = None, batch * n
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
        """New token ids after the prompt ids (1-D): the book's generate with
        its KV cache (cache "contiguous" or "paged", or a KVCache to reuse).
        seed: the sampling generator's (torch.manual_seed), needed when
        temperature > 0. on_token(id) -> bool, when given, is called per
        token; returning False stops."""
        prompt = np.ascontiguousarray(np.asarray(ids).reshape(-1), dtype=np.int32)
        stops = np.ascontiguousarray(np.asarray(stop_tokens, dtype=np.int32).reshape(-1))
        out = np.zeros(max(int(max_new_tokens), 1), dtype=np.int32)
        count = c_size_t()
        rng = _modules._Generator(seed if seed is not None else 0) if temperature > 0 else None
        if isinstance(cache, KVCache):
            kv = cache
        else:
            kv = self.new_cache(1, min(len(prompt) + int(max_new_tokens),
                                       self.config["context_length"]), cache, page_size)
        callback = TOKEN_FN(lambda _user, token: bool(on_token(int(token)))) if on_token \
            else TOKEN_FN()
        args = GenerateArgs(prompt=prompt.ctypes.data_as(I32P), prompt_len=len(prompt),
                            max_new_tokens=int(max_new_tokens),
                            sampling=Sampling(float(temperature), int(top_k), float(top_p)),
                            rng=rng.handle if rng else None,
                            stop_tokens=stops.ctypes.data_as(I32P) if len(stops) else None,
                            num_stop_tokens=len(stops), cache=kv.handle, on_token=callback,
                            user=None, out=out.ctypes.data_as(I32P),
                            count=ctypes.pointer(count))
        self._ctx.check(lib.attn_lm_generate(self._handle, ctypes.byref(args)))
        return out[:count.value].copy()


__all__ = ["LanguageModel", "KVCache", "AttnError"]
