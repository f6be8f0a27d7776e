"""Scaled dot-product attention on NumPy arrays: attn_sdpa_forward and
attn_sdpa_backward of include/attn.h, every feature of attn_sdpa_config.

    import attn.functional as AF                 # or: from attn import functional
    out = AF.scaled_dot_product_attention(q, k, v, causal=True, window=(127, 0))
    out, lse = AF.scaled_dot_product_attention(q, k, v, return_lse=True)
    dq, dk, dv = AF.scaled_dot_product_attention_backward(dout, q, k, v, causal=True)

Layouts (float32; other float dtypes are converted):
    q (B, H, T, D), k (B, H_kv, S, D), v (B, H_kv, S, Dv) -> out (B, H, T, Dv),
    lse (B, H, T); H_kv divides H and query heads h*G .. h*G+G-1 share KV
    head h (G = H / H_kv: GQA; H_kv = 1: MQA).
    Packed variable-length batches (cu_seqlens_q and cu_seqlens_kv, B + 1
    int32 offsets each): q (total_q, H, D), k (total_kv, H_kv, D),
    v (total_kv, H_kv, Dv) -> out (total_q, H, Dv), lse (H, total_q).
Views with any positive strides whose last axis is contiguous (q[:, :, ::2],
x.transpose(0, 2, 1, 3), ...) are read in place, without a copy.

Score of query i and key j (pos_i = i + S - T, or i with align="top-left",
or i + q_offset):
    s = softcap * tanh(q_i . k_j * scale / softcap) - alibi_slopes[h] * |pos_i - j|
visible when j <= pos_i (causal) and pos_i - left <= j <= pos_i + right
(window=(left, right), -1 unbounded); the softmax runs over the visible keys
and, with sinks, the head's sink logit. A query that sees no key gives
zeros and lse -inf (with a sink: the sink), never NaN.

Every failure of the library raises attn.AttnError with its message.
"""
import ctypes
from ctypes import (POINTER, Structure, c_bool, c_double, c_float, c_int, c_int32, c_longlong,
                    c_size_t, c_uint64, c_void_p)

import numpy as np

from . import _lib
from ._args import (INT64_MAX, as_choice, as_flag, as_float32, as_index, as_number,
                    library_scale)
from ._lib import AttnError, CtxConfig, HandleOwner, ScoreMod, lib, status_name

__all__ = ["scaled_dot_product_attention", "scaled_dot_product_attention_backward",
           "SdpaConfig", "SdpaDropout"]

F32P = POINTER(c_float)
I32P = POINTER(c_int32)

ALIGN = {"bottom-right": 0, "top-left": 1}  # ATTN_ALIGN_*; ATTN_ALIGN_OFFSET = 2
ALIGN_OFFSET = 2
KERNELS = {"auto": 0, "reference": 1, "portable": 2, "avx2": 3, "avx512": 4}
BERNOULLI_PHILOX = 2


class SdpaConfig(Structure):
    """attn_sdpa_config, field for field (include/attn.h)."""
    _fields_ = [
        ("batch", c_size_t), ("heads", c_size_t), ("q_tokens", c_size_t),
        ("kv_tokens", c_size_t), ("head_dim", c_size_t),
        ("q_strides", c_size_t * 3), ("kv_strides", c_size_t * 3),
        ("out_strides", c_size_t * 3),
        ("scale", c_double),
        ("causal", c_bool),
        ("dropout", c_double),
        # since 0.2
        ("kv_heads", c_size_t),
        ("v_head_dim", c_size_t),
        ("v_strides", c_size_t * 3),
        ("align", c_int),
        ("q_offset", c_longlong),
        ("window", c_bool),
        ("window_left", c_longlong), ("window_right", c_longlong),
        ("softcap", c_double),
        ("alibi_slopes", F32P),
        ("sinks", F32P),
        ("sinks_grad", F32P),
        ("cu_seqlens_q", I32P), ("cu_seqlens_kv", I32P),
        # since 0.5: programmable attention (attn_block_mask *, attn_score_mod *)
        ("block_mask", c_void_p),
        ("score_mods", POINTER(ScoreMod)), ("score_mod_count", c_size_t),
    ]


class SdpaDropout(Structure):
    """attn_sdpa_dropout: what a forward's dropout drew from."""
    _fields_ = [("seed", c_uint64), ("offset", c_uint64)]


# Prototypes bound to the symbols here, so these declarations are ours alone.
_FORWARD = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(SdpaConfig), F32P, F32P, F32P, F32P, F32P,
                            c_void_p, POINTER(SdpaDropout))
_BACKWARD = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(SdpaConfig), F32P, F32P, F32P, F32P, F32P,
                             F32P, F32P, F32P, F32P, POINTER(SdpaDropout))
_CTX_NEW = ctypes.CFUNCTYPE(c_int, POINTER(CtxConfig), POINTER(c_void_p))
_RNG_NEW = ctypes.CFUNCTYPE(c_int, c_void_p, c_uint64, POINTER(c_void_p))
_RNG_SET = ctypes.CFUNCTYPE(c_int, c_void_p, c_int)
_FREE = ctypes.CFUNCTYPE(None, c_void_p)
_LAST_ERROR = ctypes.CFUNCTYPE(ctypes.c_char_p, c_void_p)


def _bind(proto, name):
    if not _lib.has(name):
        return None
    return proto((name, lib))


_sdpa_forward = _bind(_FORWARD, "attn_sdpa_forward")
_sdpa_backward = _bind(_BACKWARD, "attn_sdpa_backward")
_ctx_new = _bind(_CTX_NEW, "attn_ctx_new")
_ctx_free = _bind(_FREE, "attn_ctx_free")
_last_error = _bind(_LAST_ERROR, "attn_ctx_last_error")
_rng_new = _bind(_RNG_NEW, "attn_rng_new")
_rng_set_bernoulli = _bind(_RNG_SET, "attn_rng_set_bernoulli_method")
_rng_free = _bind(_FREE, "attn_rng_free")
_kernels_supported = _bind(ctypes.CFUNCTYPE(c_bool, c_int), "attn_kernels_supported")


def kernels_supported(kernels):
    """Whether this CPU (and build) runs the kernel set named kernels ("auto",
    "reference", "portable", "avx2", "avx512"): the names kernels= takes."""
    return bool(_kernels_supported(KERNELS[as_choice("kernels", kernels, KERNELS)]))


class _Ctx(HandleOwner):
    """An attn_ctx with a thread count and kernels, freed with the object."""

    def __init__(self, num_threads, kernels):
        num_threads = as_index("num_threads", num_threads, 1, _lib.MAX_THREADS)
        as_choice("kernels", kernels, KERNELS)
        self.handle = c_void_p()
        self.rng = c_void_p()
        cfg = CtxConfig(num_threads=int(num_threads), kernels=KERNELS[kernels])
        status = _ctx_new(ctypes.byref(cfg), ctypes.byref(self.handle))
        if status != 0:
            raise AttnError(status_name(status),
                            f"attn_ctx_new: num_threads {num_threads} with kernels {kernels!r} "
                            "is not accepted (does this CPU run them?)")

    def check(self, status, what):
        if status != 0:
            message = _last_error(self.handle).decode(errors="replace")
            raise AttnError(status_name(status), message or f"{what} failed with "
                            f"{status_name(status)}")

    def philox_rng(self, seed):
        self.check(_rng_new(self.handle, seed, ctypes.byref(self.rng)), "attn_rng_new")
        self.check(_rng_set_bernoulli(self.rng, BERNOULLI_PHILOX), "attn_rng_set_bernoulli_method")
        return self.rng

    def __del__(self):
        if getattr(self, "rng", None):
            _rng_free(self.rng)
            self.rng = None
        if getattr(self, "handle", None):
            _ctx_free(self.handle)
            self.handle = None


def _floats(name, a, rank, contiguous=False):
    """a as a float32 array of the given rank that C can read through
    (b, t, h)-style element strides: the array itself when its strides allow
    (and contiguous is false), else a contiguous copy. Returns (array,
    element strides)."""
    a = np.asarray(a)
    if a.ndim != rank:
        raise ValueError(f"{name}: expected {rank} dimensions, got shape {a.shape}")
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name}: expected a float array, got dtype {a.dtype}")
    a = as_float32(name, a)
    if 0 in a.shape:
        raise ValueError(f"{name}: empty shape {a.shape}")
    ok = a.strides[-1] == 4 or a.shape[-1] == 1
    strides = []
    for n, s in zip(a.shape, a.strides):
        if n == 1:
            strides.append(1)  # never stepped: any positive value
        elif s <= 0 or s % 4:
            ok = False
        else:
            strides.append(s // 4)
    if not ok or contiguous:
        a = np.ascontiguousarray(a)
        strides = [s // 4 if n > 1 else 1 for n, s in zip(a.shape, a.strides)]
    return a, strides


def _ptr(a):
    return None if a is None else ctypes.cast(a.ctypes.data, F32P)


def _per_head(name, a, heads):
    if a is None:
        return None
    a = np.asarray(a)
    # real numbers only: astype would parse strings, make None NaN, cut a
    # complex value to its real part and read bools as 0 and 1
    if a.dtype.kind not in "fiu":
        raise TypeError(f"{name}: expected real numbers, got dtype {a.dtype}")
    a = np.ascontiguousarray(as_float32(name, a))
    if a.shape != (heads,):
        raise ValueError(f"{name}: expected shape ({heads},), one per query head, got {a.shape}")
    return a


def _offsets(name, cu, rows):
    cu = np.asarray(cu)
    if cu.ndim != 1 or cu.size < 2 or not np.issubdtype(cu.dtype, np.integer):
        raise ValueError(f"{name}: expected B + 1 >= 2 integer offsets, got shape {cu.shape} "
                         f"dtype {cu.dtype}")
    if cu.min() < np.iinfo(np.int32).min or cu.max() > np.iinfo(np.int32).max:
        raise ValueError(f"{name}: offsets beyond int32")
    if int(cu[-1]) != rows or int(cu[0]) < 0:
        # the library reads rows cu[0] .. cu[B]: they must be the tensor's
        raise ValueError(f"{name}: offsets must run from 0 to the {rows} rows of the tensor, "
                         f"got {int(cu[0])} .. {int(cu[-1])}")
    return np.ascontiguousarray(cu, dtype=np.int32)


class _Problem:
    """The arrays and the attn_sdpa_config of one call."""

    def __init__(self, q, k, v, causal, scale, window, softcap, alibi_slopes, sinks,
                 cu_seqlens_q, cu_seqlens_kv, align, q_offset, dropout_p, contiguous=False):
        packed = cu_seqlens_q is not None or cu_seqlens_kv is not None
        if packed and (cu_seqlens_q is None or cu_seqlens_kv is None):
            raise ValueError("cu_seqlens_q and cu_seqlens_kv go together")
        rank = 3 if packed else 4
        self.q, qs = _floats("q", q, rank, contiguous)
        self.k, ks = _floats("k", k, rank, contiguous)
        self.v, vs = _floats("v", v, rank, contiguous)
        q, k, v = self.q, self.k, self.v
        D, Dv = q.shape[-1], v.shape[-1]
        H, Hkv = q.shape[-2 if packed else 1], k.shape[-2 if packed else 1]
        if k.shape[-1] != D:
            raise ValueError(f"k: head_dim {k.shape[-1]} does not match q's {D}")
        if v.shape[:-1] != k.shape[:-1]:
            raise ValueError(f"v: shape {v.shape} must match k's {k.shape} in all but the "
                             "last dimension")
        c = SdpaConfig(heads=H, kv_heads=Hkv, head_dim=D, v_head_dim=Dv)
        if packed:
            self.cu_q = _offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0])
            self.cu_kv = _offsets("cu_seqlens_kv", cu_seqlens_kv, k.shape[0])
            if self.cu_q.size != self.cu_kv.size:
                raise ValueError(f"cu_seqlens_q ({self.cu_q.size}) and cu_seqlens_kv "
                                 f"({self.cu_kv.size}) must have the same length, B + 1")
            c.batch = self.cu_q.size - 1
            c.q_tokens = max(0, int(np.diff(self.cu_q).max()))
            c.kv_tokens = max(0, int(np.diff(self.cu_kv).max()))
            c.cu_seqlens_q = self.cu_q.ctypes.data_as(I32P)
            c.cu_seqlens_kv = self.cu_kv.ctypes.data_as(I32P)
            # (total, H, D): (b, t, h) strides, b ignored
            c.q_strides[:] = [0, qs[0], qs[1]]
            c.kv_strides[:] = [0, ks[0], ks[1]]
            c.v_strides[:] = [0, vs[0], vs[1]]
            self.out_shape = (q.shape[0], H, Dv)
            self.lse_shape = (H, q.shape[0])
            c.out_strides[:] = [0, H * Dv, Dv]
        else:
            B, T, S = q.shape[0], q.shape[2], k.shape[2]
            if k.shape[0] != B:
                raise ValueError(f"k: batch {k.shape[0]} does not match q's {B}")
            c.batch, c.q_tokens, c.kv_tokens = B, T, S
            # (B, H, T, D): (b, t, h) = strides of axes 0, 2, 1
            c.q_strides[:] = [qs[0], qs[2], qs[1]]
            c.kv_strides[:] = [ks[0], ks[2], ks[1]]
            c.v_strides[:] = [vs[0], vs[2], vs[1]]
            self.out_shape = (B, H, T, Dv)
            self.lse_shape = (B, H, T)
            c.out_strides[:] = [H * T * Dv, Dv, T * Dv]
        # the library checks the ranges; here only what ctypes would wrap or
        # truncate (a float offset, an integer past long long)
        c.scale = library_scale(None if scale is None else as_number("scale", scale,
                                                                      finite=False))
        c.causal = as_flag("causal", causal)  # bool("False") would be causal
        c.dropout = as_number("dropout_p", dropout_p, finite=False)
        # dropout_p = 1 drops every weight, which PyTorch takes (out and the
        # gradients are zeros) and the library refuses (it scales the kept
        # weights by 1 / (1 - p)): the call runs undropped and its results
        # are multiplied by 0, so a NaN from the inputs stays NaN, as there
        self.drop_all = c.dropout == 1.0
        if self.drop_all:
            c.dropout = 0.0
        if q_offset is not None:
            c.align = ALIGN_OFFSET
            c.q_offset = as_index("q_offset", q_offset, -INT64_MAX - 1, INT64_MAX)
        elif isinstance(align, str) and align in ALIGN:  # a list is unhashable
            c.align = ALIGN[align]
        else:
            raise ValueError(f"align: expected 'bottom-right' or 'top-left' (or q_offset=N), "
                             f"got {align!r}")
        if window is not None:
            try:  # len(3), or np.ndim of ((1, 2), 3), would raise bare
                pair = np.ndim(window) == 1 and len(window) == 2
            except (TypeError, ValueError):
                pair = False
            if not pair:
                raise ValueError(f"window: expected (left, right), got {window!r}")
            c.window = True
            c.window_left = as_index("window[0]", window[0], -INT64_MAX - 1, INT64_MAX)
            c.window_right = as_index("window[1]", window[1], -INT64_MAX - 1, INT64_MAX)
        c.softcap = as_number("softcap", softcap, finite=False)
        self.alibi = _per_head("alibi_slopes", alibi_slopes, H)
        self.sinks = _per_head("sinks", sinks, H)
        c.alibi_slopes = _ptr(self.alibi)
        c.sinks = _ptr(self.sinks)
        self.cfg = c


def _drop_all(*arrays):
    """The arrays times 0, in place (what dropout_p = 1 leaves): +0 where
    they are finite, NaN where they are NaN or infinite, as PyTorch's
    weights * 0 gives."""
    for a in arrays:
        a *= 0.0
        a += 0.0  # -0.0 to +0.0


def _seed_for(dropout_p, seed):
    if dropout_p and seed is None:
        raise ValueError("dropout_p > 0 needs a seed (the Philox key of the mask): the forward "
                         "and the backward draw the same mask from the same seed")
    return None if seed is None else as_index("seed", seed, 0, 2**64 - 1)


def _forward(p, ctx, seed):
    if _sdpa_forward is None:
        raise AttnError("ATTN_ERR_NOT_FOUND",
                        f"this libattn ({_lib.path}) has no attn_sdpa_forward")
    out = np.empty(p.out_shape, np.float32)
    lse = np.empty(p.lse_shape, np.float32)
    drawn = SdpaDropout()
    rng = ctx.philox_rng(seed) if p.cfg.dropout > 0 else None
    ctx.check(_sdpa_forward(ctx.handle, ctypes.byref(p.cfg), _ptr(p.q), _ptr(p.k), _ptr(p.v),
                            _ptr(out), _ptr(lse), rng, ctypes.byref(drawn)),
              "attn_sdpa_forward")
    return out, lse, drawn


def scaled_dot_product_attention(q, k, v, *, causal=False, scale=None, window=None,
                                 softcap=0.0, alibi_slopes=None, sinks=None, cu_seqlens_q=None,
                                 cu_seqlens_kv=None, align="bottom-right", q_offset=None,
                                 dropout_p=0.0, seed=None, return_lse=False, num_threads=1,
                                 kernels="auto"):
    """Attention of q over k, v (layouts in the module's docstring).

    causal: hide key j from query i when j > pos_i. align: "bottom-right"
    (pos_i = i + S - T, FlashAttention's, the default) or "top-left"
    (pos_i = i, PyTorch's is_causal); q_offset=N: pos_i = i + N.
    scale: None is 1/sqrt(D). window=(left, right): FlashAttention-2's
    window_size, -1 unbounded. softcap: > 0 caps the scores (Gemma 2).
    alibi_slopes, sinks: (H,) floats. dropout_p > 0 draws the Philox mask
    keyed by seed (required then); dropout_p = 1 drops every weight: out
    and the backward's gradients are zeros, as PyTorch's. num_threads and
    kernels ("auto", "reference", "portable", "avx2", "avx512") choose how
    it runs; the result is bitwise the same for any num_threads.
    Returns out, or (out, lse) with return_lse.
    """
    p = _Problem(q, k, v, causal, scale, window, softcap, alibi_slopes, sinks, cu_seqlens_q,
                 cu_seqlens_kv, align, q_offset, dropout_p)
    seed = _seed_for(dropout_p, seed)
    return_lse = as_flag("return_lse", return_lse)
    out, lse, _ = _forward(p, _Ctx(num_threads, kernels), seed)
    if p.drop_all:
        _drop_all(out)
    return (out, lse) if return_lse else out


def scaled_dot_product_attention_backward(grad_out, q, k, v, *, causal=False, scale=None,
                                          window=None, softcap=0.0, alibi_slopes=None,
                                          sinks=None, cu_seqlens_q=None, cu_seqlens_kv=None,
                                          align="bottom-right", q_offset=None, dropout_p=0.0,
                                          seed=None, num_threads=1, kernels="auto"):
    """The gradients of sum(out * grad_out) for the attention that
    scaled_dot_product_attention computes with the same arguments (the same
    seed draws the same dropout mask): runs the forward, then the backward.

    grad_out has out's shape. Returns (dq, dk, dv), shaped as q, k, v, or
    (dq, dk, dv, dsinks) when sinks is given.
    """
    # dq, dk, dv are written with q's, k's and v's strides: run on contiguous
    # copies (views are copied), so the gradients come out contiguous
    p = _Problem(q, k, v, causal, scale, window, softcap, alibi_slopes, sinks, cu_seqlens_q,
                 cu_seqlens_kv, align, q_offset, dropout_p, contiguous=True)
    seed = _seed_for(dropout_p, seed)
    # grad_out as q, k and v: real floats that float32 holds, never cast blindly
    # (a string parsed, a complex value cut to its real part, 1e300 made inf)
    dout = np.asarray(grad_out)
    if not np.issubdtype(dout.dtype, np.floating):
        raise TypeError(f"grad_out: expected a float array, got dtype {dout.dtype}")
    dout = np.ascontiguousarray(as_float32("grad_out", dout))
    if dout.shape != p.out_shape:
        raise ValueError(f"grad_out: shape {dout.shape} does not match the output's "
                         f"{p.out_shape}")
    if _sdpa_backward is None:
        raise AttnError("ATTN_ERR_NOT_FOUND",
                        f"this libattn ({_lib.path}) has no attn_sdpa_backward")
    ctx = _Ctx(num_threads, kernels)
    out, lse, drawn = _forward(p, ctx, seed)
    dq = np.empty(p.q.shape, np.float32)
    dk = np.empty(p.k.shape, np.float32)
    dv = np.empty(p.v.shape, np.float32)
    dsinks = np.empty(p.sinks.shape, np.float32) if p.sinks is not None else None
    p.cfg.sinks_grad = _ptr(dsinks)
    ctx.check(_sdpa_backward(ctx.handle, ctypes.byref(p.cfg), _ptr(p.q), _ptr(p.k), _ptr(p.v),
                             _ptr(out), _ptr(lse), _ptr(dout), _ptr(dq), _ptr(dk), _ptr(dv),
                             ctypes.byref(drawn) if p.cfg.dropout > 0 else None),
              "attn_sdpa_backward")
    grads = (dq, dk, dv, dsinks) if dsinks is not None else (dq, dk, dv)
    if p.drop_all:
        _drop_all(*grads)
    return grads
