"""Loading libattn and declaring its C API (include/attn.h) for ctypes.

The library is looked for, in order:
  1. the path in the ATTN_LIBRARY environment variable;
  2. libattn.so bundled in this package (what `pip install ./python` builds);
  3. the system's libattn (ctypes.util.find_library, after `cmake --install`).
The first whose attn_abi_version() is ABI_VERSION is used: the structures
below mirror attn.h of that ABI, and a library of another ABI would read
them wrongly (docs/abi.md), so it is passed over, and named in the
ImportError when no library fits.
"""
import ctypes
import ctypes.util
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char_p, c_double, c_float, c_int,
                    c_int32, c_int64, c_size_t, c_uint8, c_uint64, c_void_p)

from ._args import as_index, show

# attn.h's ATTN_ABI_VERSION that the structures below mirror.
ABI_VERSION = 7

F32P = POINTER(c_float)
I32P = POINTER(c_int32)
I64P = POINTER(c_int64)
MAX_DIMS = 8  # ATTN_SAFETENSORS_MAX_DIMS
# attn_dtype values of the calls that take one (attn_sdpa_forward_16,
# attn_gemm_16, attn_sdpa_backward_dlse)
DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_F64 = 0, 1, 2, 3


class AttnError(RuntimeError):
    """A libattn call failed. .status is the attn_status name ("ATTN_ERR_SHAPE")
    and str(err) the library's message, which names the values at fault."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


# attn_ctx_config's num_threads limit: attn_ctx_new refuses more.
MAX_THREADS = 4096


class CtxConfig(Structure):
    _fields_ = [("num_threads", c_size_t), ("trace", c_void_p), ("trace_user", c_void_p),
                ("kernels", c_int), ("trace_shapes_only", c_bool)]


class Param(Structure):
    _fields_ = [("name", c_char_p), ("data", F32P), ("grad", F32P), ("ndim", c_size_t),
                ("shape", c_size_t * 2), ("numel", c_size_t)]


class ModuleConfig(Structure):  # attn_module_config
    _fields_ = [("d_in", c_size_t), ("d_out", c_size_t), ("context_length", c_size_t),
                ("num_heads", c_size_t), ("num_kv_groups", c_size_t), ("latent_dim", c_size_t),
                ("sliding_window_size", c_size_t), ("dropout", c_double), ("qkv_bias", c_bool),
                ("scale", c_double), ("mask", c_int)]


class NamedTensor(Structure):
    _fields_ = [("name", c_char_p), ("data", F32P), ("ndim", c_size_t),
                ("shape", c_size_t * MAX_DIMS)]


class MetadataEntry(Structure):
    _fields_ = [("key", c_char_p), ("value", c_char_p)]


class SafetensorsInfo(Structure):
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("ndim", c_size_t),
                ("shape", c_size_t * MAX_DIMS), ("numel", c_size_t), ("data_begin", c_size_t),
                ("data_end", c_size_t), ("index", c_size_t)]


# ---- programmable attention: masks, block maps, score modifiers (attn.h) ----

class BlockMaskConfig(Structure):  # attn_block_mask_config
    _fields_ = [("batch", c_size_t), ("heads", c_size_t), ("q_len", c_size_t),
                ("kv_len", c_size_t), ("block_q", c_size_t), ("block_kv", c_size_t)]


class BlockMaskInfo(Structure):  # attn_block_mask_info
    _fields_ = [("config", BlockMaskConfig), ("q_blocks", c_size_t), ("kv_blocks", c_size_t),
                ("full_blocks", c_size_t), ("partial_blocks", c_size_t), ("sparsity", c_double),
                ("row_intervals", c_bool)]


class ScoreTile(Structure):  # attn_score_tile
    _fields_ = [("b", c_size_t), ("h", c_size_t), ("q0", c_size_t), ("kv0", c_size_t),
                ("rows", c_size_t), ("cols", c_size_t), ("ld", c_size_t), ("scores", F32P)]


# attn_score_mod_kind
(SCORE_SCALE, SCORE_SOFTCAP, SCORE_ALIBI, SCORE_BIAS, SCORE_REL_BIAS, SCORE_CALLBACK,
 SCORE_REL_TABLE) = range(1, 8)
# attn_score_fn, attn_score_grad_fn, attn_mask_fn
ScoreFn = CFUNCTYPE(c_int, c_void_p, POINTER(ScoreTile))
ScoreGradFn = CFUNCTYPE(c_int, c_void_p, POINTER(ScoreTile), F32P)
MaskFn = CFUNCTYPE(c_int, c_void_p, c_size_t, c_size_t, c_size_t, c_size_t)


class ScoreMod(Structure):  # attn_score_mod
    _fields_ = [("kind", c_int), ("value", c_double), ("tensor", F32P), ("tensor_grad", F32P),
                ("strides", c_size_t * 4), ("offset", c_int64), ("signed_distance", c_bool),
                ("buckets", c_size_t), ("max_distance", c_size_t), ("bidirectional", c_bool),
                ("fn", ScoreFn), ("grad_fn", ScoreGradFn), ("user", c_void_p)]


def _candidates():
    env = os.environ.get("ATTN_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for name in sorted(os.listdir(here)):
        if name.startswith("libattn.so") or name in ("libattn.dylib", "attn.dll"):
            yield os.path.join(here, name)
    found = ctypes.util.find_library("attn")
    if found:
        yield found


def abi_mismatch(handle):
    """Why the loaded library handle does not fit this package, or None if it does."""
    abi_fn = getattr(handle, "attn_abi_version", None)
    version_fn = getattr(handle, "attn_version", None)
    version = "unknown"
    if version_fn is not None:
        version_fn.restype = c_char_p
        version_fn.argtypes = []
        version = (version_fn() or b"").decode(errors="replace")
    if abi_fn is None:
        if version_fn is None:
            return "it is not libattn (no attn_version)"
        return (f"libattn {version} has no attn_abi_version (libattn before 0.4); "
                f"this package needs ABI {ABI_VERSION}")
    abi_fn.restype = c_int
    abi_fn.argtypes = []
    abi = abi_fn()
    if abi != ABI_VERSION:
        return (f"libattn {version} has ABI version {abi}; this package needs ABI "
                f"{ABI_VERSION} (libattn 0.{ABI_VERSION}.x), whose structures it mirrors")
    return None


def _load():
    tried = []
    for path in _candidates():
        try:
            handle = ctypes.CDLL(path)
        except OSError as err:
            tried.append(f"{path}: {err}")
            continue
        why = abi_mismatch(handle)
        if why is None:
            return handle, path
        tried.append(f"{path}: {why}")
    raise ImportError(
        "attn: cannot find a libattn of ABI version %d. Build it with `pip install ./python` "
        "from the attn repository, install it with `cmake --install build`, or set "
        "ATTN_LIBRARY to the path of libattn.so" % ABI_VERSION
        + ("; tried " + "; ".join(tried) if tried else ""))


lib, path = _load()

_SIGNATURES = {
    "attn_version": (c_char_p,),
    "attn_abi_version": (c_int,),
    "attn_status_name": (c_char_p, c_int),
    "attn_ctx_new": (c_int, POINTER(CtxConfig), POINTER(c_void_p)),
    "attn_ctx_free": (None, c_void_p),
    "attn_ctx_last_error": (c_char_p, c_void_p),
    "attn_rng_new": (c_int, c_void_p, c_uint64, POINTER(c_void_p)),
    "attn_rng_free": (None, c_void_p),
    "attn_rng_manual_seed": (c_int, c_void_p, c_uint64),
    "attn_rng_set_bernoulli_method": (c_int, c_void_p, c_int),
    "attn_rng_rand": (c_int, c_void_p, F32P, c_size_t),
    "attn_rng_randn": (c_int, c_void_p, F32P, c_size_t),
    "attn_module_kind_from_name": (c_int, c_void_p, c_char_p, POINTER(c_int)),
    "attn_module_new": (c_int, c_void_p, c_int, POINTER(ModuleConfig), c_void_p,
                        POINTER(c_void_p)),
    "attn_module_class_name": (c_char_p, c_void_p),
    "attn_module_d_in": (c_size_t, c_void_p),
    "attn_module_d_out": (c_size_t, c_void_p),
    "attn_module_param_count": (c_size_t, c_void_p),
    "attn_module_num_scalars": (c_size_t, c_void_p),
    "attn_module_param_at": (c_int, c_void_p, c_size_t, POINTER(Param)),
    "attn_module_set_training": (c_int, c_void_p, c_bool),
    "attn_module_training": (c_bool, c_void_p),
    "attn_module_forward": (c_int, c_void_p, F32P, c_size_t, c_size_t, F32P, c_void_p),
    "attn_module_free": (None, c_void_p),
    # Training (present once the library implements backward).
    "attn_module_backward": (c_int, c_void_p, F32P, c_size_t, c_size_t, F32P),
    "attn_module_zero_grad": (c_int, c_void_p),
    "attn_module_set_grad_enabled": (c_int, c_void_p, c_bool),
    "attn_module_grad_enabled": (c_bool, c_void_p),
    # safetensors
    "attn_dtype_name": (c_char_p, c_int),
    "attn_safetensors_write": (c_int, c_void_p, c_char_p, POINTER(NamedTensor), c_size_t,
                               POINTER(MetadataEntry), c_size_t),
    "attn_safetensors_open": (c_int, c_void_p, c_char_p, POINTER(c_void_p)),
    "attn_safetensors_free": (None, c_void_p),
    "attn_safetensors_count": (c_size_t, c_void_p),
    "attn_safetensors_info_at": (c_int, c_void_p, c_size_t, POINTER(SafetensorsInfo)),
    "attn_safetensors_load": (c_int, c_void_p, c_size_t, F32P, c_size_t),
    "attn_safetensors_metadata_count": (c_size_t, c_void_p),
    "attn_safetensors_metadata_at": (c_int, c_void_p, c_size_t, POINTER(MetadataEntry)),
    "attn_safetensors_save_module": (c_int, c_void_p, c_void_p, c_char_p),
    "attn_safetensors_load_module": (c_int, c_void_p, c_void_p, c_char_p, c_char_p),
    "attn_gpt2_load_hf": (c_int, c_void_p, c_void_p, c_char_p, c_size_t),
    "attn_gpt2_save_hf": (c_int, c_void_p, c_void_p, c_char_p, c_size_t),
    # programmable attention: mask descriptions (attn_mask *) ...
    "attn_mask_new_all": (c_int, c_void_p, POINTER(c_void_p)),
    "attn_mask_new_causal": (c_int, c_void_p, c_int64, POINTER(c_void_p)),
    "attn_mask_new_window": (c_int, c_void_p, c_int64, c_int64, c_int64, POINTER(c_void_p)),
    "attn_mask_new_chunked": (c_int, c_void_p, c_size_t, c_int64, POINTER(c_void_p)),
    "attn_mask_new_prefix_lm": (c_int, c_void_p, I64P, c_size_t, POINTER(c_void_p)),
    "attn_mask_new_document": (c_int, c_void_p, I32P, I32P, c_size_t, c_size_t, c_size_t,
                               POINTER(c_void_p)),
    "attn_mask_new_global": (c_int, c_void_p, c_size_t, POINTER(c_void_p)),
    "attn_mask_new_kv_length": (c_int, c_void_p, I64P, c_size_t, POINTER(c_void_p)),
    "attn_mask_new_and": (c_int, c_void_p, c_void_p, c_void_p, POINTER(c_void_p)),
    "attn_mask_new_or": (c_int, c_void_p, c_void_p, c_void_p, POINTER(c_void_p)),
    "attn_mask_new_not": (c_int, c_void_p, c_void_p, POINTER(c_void_p)),
    "attn_mask_free": (None, c_void_p),
    "attn_mask_visible": (c_int, c_void_p, c_void_p, c_size_t, c_size_t, c_size_t, c_size_t,
                          POINTER(c_bool)),
    # ... and block maps (attn_block_mask *)
    "attn_block_mask_from_mask": (c_int, c_void_p, POINTER(BlockMaskConfig), c_void_p,
                                  POINTER(c_void_p)),
    "attn_block_mask_from_bool": (c_int, c_void_p, POINTER(BlockMaskConfig), POINTER(c_uint8),
                                  POINTER(c_size_t), POINTER(c_void_p)),
    "attn_block_mask_from_additive": (c_int, c_void_p, POINTER(BlockMaskConfig), F32P,
                                      POINTER(c_size_t), POINTER(c_void_p)),
    "attn_block_mask_from_fn": (c_int, c_void_p, POINTER(BlockMaskConfig), MaskFn, c_void_p,
                                POINTER(c_void_p)),
    "attn_block_mask_from_kv_blocks": (c_int, c_void_p, POINTER(BlockMaskConfig), I32P, I32P,
                                       c_size_t, I32P, I32P, c_size_t, c_void_p,
                                       POINTER(c_void_p)),
    "attn_block_mask_free": (None, c_void_p),
    "attn_block_mask_get_info": (c_int, c_void_p, POINTER(BlockMaskInfo)),
    "attn_block_mask_to_string": (c_int, c_void_p, c_size_t, c_size_t, c_char_p, c_size_t,
                                  POINTER(c_size_t)),
}

for _name, (_restype, *_argtypes) in _SIGNATURES.items():
    _fn = getattr(lib, _name, None)
    if _fn is not None:
        _fn.restype = _restype
        _fn.argtypes = _argtypes


def has(name):
    """True when the loaded libattn exports name (e.g. attn_module_backward)."""
    return getattr(lib, name, None) is not None


def status_name(status):
    return lib.attn_status_name(status).decode()


class CallLock:
    """A ctx's lock: re-entrant on its thread (a method may call another of
    the same object), but refused while a C call holding it runs a Python
    callback (generate's on_token): the callback would change the model or
    cache under the call, which goes on with them."""

    def __init__(self):
        self._lock = threading.RLock()
        self.in_callback_call = False

    def __enter__(self):
        self._lock.acquire()
        if self.in_callback_call:
            self._lock.release()
            raise RuntimeError("attn: a generate() on this model or cache is running its "
                               "on_token callback, which may not call into them (use another "
                               "model or cache, or act after generate returns)")
        return self

    def __exit__(self, *exc):
        self._lock.release()


class HandleOwner:
    """An object that owns a libattn handle, freed when the object goes: a
    copy would share the handle and free it twice (a crash), so copying and
    pickling raise TypeError."""

    def _refuse(self, what):
        raise TypeError(f"cannot {what} a {type(self).__name__}: it owns a libattn handle, "
                        f"which a copy would free twice")

    def __copy__(self):
        self._refuse("copy")

    def __deepcopy__(self, memo):
        self._refuse("deep-copy")

    def __reduce_ex__(self, protocol):
        self._refuse("pickle")


class Context(HandleOwner):
    """An attn_ctx: thread count and the last error message.

    A ctx runs one call at a time, and its last error belongs to the call
    that failed, so every call on the ctx, or on an object made with it,
    runs holding .lock, the error message read before it is let go. ctypes
    lets the GIL go around each C call: objects with other contexts run in
    parallel."""

    def __init__(self, num_threads=1):
        num_threads = as_index("num_threads", num_threads, 1, MAX_THREADS)
        self.lock = CallLock()
        handle = c_void_p()
        status = lib.attn_ctx_new(CtxConfig(num_threads=num_threads), ctypes.byref(handle))
        if status != 0:
            raise AttnError(status_name(status),
                            f"attn_ctx_new: num_threads {num_threads} is not accepted")
        self.handle = handle

    def check(self, status, what=None):
        if status != 0:
            message = lib.attn_ctx_last_error(self.handle).decode(errors="replace")
            if not message:
                message = f"{what or 'attn'} failed with {status_name(status)}"
            raise AttnError(status_name(status), message)

    def __del__(self):
        if getattr(self, "handle", None):
            lib.attn_ctx_free(self.handle)
            self.handle = None


def is_path(value):
    """Whether value is what open() takes as a path: str, bytes or os.PathLike."""
    return isinstance(value, (str, bytes, os.PathLike))


def encode_path(name, path):
    """path (str, bytes or os.PathLike) as the bytes C opens. Anything else
    (None, a number) is a TypeError naming the argument, where ctypes or
    os.fsencode would raise without it; a NUL inside would cut the path
    short in C, so it is refused, as open() refuses it."""
    if not is_path(path):
        raise TypeError(f"{name}: expected a path (str, bytes or os.PathLike), got "
                        f"{show(path)}")
    data = os.fsencode(path)
    if b"\0" in data:
        raise ValueError(f"{name}: embedded NUL character in {path!r}")
    return data
