"""attn inside PyTorch: attn's fused CPU attention kernels as a drop-in
`scaled_dot_product_attention` and FlashAttention's `flash_attn_func` /
`flash_attn_varlen_func`, differentiable through torch.autograd.

    import attn.torch
    attn.torch.patch()      # F.scaled_dot_product_attention now runs attn where it can
    # or, for one block:  with attn.torch.patched(): ...
    # or, explicitly:     from attn.torch import scaled_dot_product_attention
    # flash-attn code:    from attn.torch import flash_attn_func, flash_attn_varlen_func

What runs on attn: CPU tensors of float32 (the fused kernels), float64 (the
reference kernels, all in double: for gradcheck) or bfloat16/float16 (attn's
16-bit calls, attn_sdpa_forward_16/backward_16: bf16 on AMX tiles where the
CPU has them, else on vdpbf16ps on AMD's cores or widened to float; out and
the gradients in the inputs' dtype, lse in float32), q, k, v of one dtype.
An attn_mask broadcastable to (B, H, T, S) runs on attn as a block map:
boolean (True: visible) through attn_block_mask_from_bool, additive through
attn_block_mask_from_additive (-inf hides) with its finite values added to
the scores as an ATTN_SCORE_BIAS modifier (its gradient reaches attn_mask
when it requires grad), where the library's attention applies block maps
(checked once per process). An additive mask holding +inf or NaN goes to
PyTorch, whose rows that see one are NaN; a mask whose dtype is not bool,
float32 or the query's raises PyTorch's RuntimeError on every path.
Importing this module asks the OS for AMX for the process
(attn_cpu_request_amx), as PyTorch's oneDNN does on its first bf16 call.
Everything else (CUDA tensors, ranks other than 3 and 4, an attn_mask with
is_causal, a call torch.jit.trace records or torch.compile traces) goes to
PyTorch's own SDPA (on torch < 2.0, which has none, to the same math written
out in torch).
supports(...) says which and why.

FlexAttention: flex_attention, create_block_mask, create_mask, BlockMask,
AuxRequest, AuxOutput, and_masks, or_masks, noop_mask and t5_relative_bucket
are attn.flex's (see there):
mask_mods and score_mods traced with torch.fx into attn's primitives.

Zero copies: the C library reads q, k, v through their data pointers and
(batch, token, head) element strides, so transposed and sliced views are
read in place. A tensor whose last axis is not contiguous, or whose
elements overlap (an expand() along tokens, heads or batch), is copied
once. scaled_dot_product_attention's output and gradients have PyTorch
2.15's strides: where its CPU flash kernel would run the call, out is laid
out as empty_like(query) (contiguous for contiguous inputs; for the usual
x.view(B, T, H, D).transpose(1, 2), (B, T, H, D) in memory, so
y.transpose(1, 2).reshape(B, T, C) copies nothing) and the gradients
(B, T, H, D) in memory; where it would take its math path (dropout, v's
head dim not q's, an attn_mask that requires grad or is 3-D with 4-D
tensors, a last axis not contiguous), out and the gradients are
contiguous, k's (B, H, E, S) in memory without GQA. The kernels write out
in that layout and each gradient in its input's, copied once where
PyTorch's differs; an incoming gradient with other strides than out's is
copied once. flash_attn_func's output is (B, T, H, D) and its gradients
have the inputs' strides.

Dropout (dropout_p > 0) draws attn's counter-based Philox mask inside the
kernels, keyed by a seed drawn from torch's default generator (so
torch.manual_seed makes it reproducible); the backward redraws the same mask
from the (seed, offset) the forward recorded. The mask is not PyTorch's (its
CPU math path draws a different stream): same distribution, other bits.

Threads: torch.get_num_threads() at the time of the call, at most 4096 (the
library's limit: a larger count runs as 4096, with the same bits). Each Python
thread has its own attn context, so calls from several threads run in
parallel.

Gradients: first derivatives only, as PyTorch's fused SDPA kernels. Under
create_graph=True the gradients come out right, and differentiating them
(a gradient penalty, double backward, MAML) raises a RuntimeError that
says attn has no second derivative; run such a model on PyTorch's SDPA
(unpatch(), or outside patched()). The tensors the backward reads (q, k,
v, cu_seqlens, alibi_slopes) are saved for backward: changing one in place
before backward() raises autograd's "modified by an inplace operation".
"""
import ctypes
import functools
import math
import threading
from ctypes import POINTER, c_int, c_uint64, c_void_p

import numpy as np
import torch
import torch.nn.functional as F
from torch.autograd import forward_ad

from . import _lib
from ._args import INT32_MAX, as_index, as_number, library_scale
from ._lib import (DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_F64, AttnError, CtxConfig,
                   HandleOwner, lib, status_name)
from .functional import BERNOULLI_PHILOX, KERNELS, SdpaConfig, SdpaDropout, kernels_supported

__all__ = ["scaled_dot_product_attention", "flash_attn_func", "flash_attn_varlen_func",
           "patch", "unpatch", "patched", "is_patched", "supports"]

ALIGN_BOTTOM_RIGHT, ALIGN_TOP_LEFT = 0, 1
_TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]
                       if x.isdigit())

# ---- the C entry points, with tensors as raw addresses ------------------------

_P = c_void_p
_CFG = POINTER(SdpaConfig)
_DROP = POINTER(SdpaDropout)
_FORWARD = ctypes.CFUNCTYPE(c_int, c_void_p, _CFG, _P, _P, _P, _P, _P, c_void_p, _DROP)
_BACKWARD = ctypes.CFUNCTYPE(c_int, c_void_p, _CFG, _P, _P, _P, _P, _P, _P, _P, _P, _P, _DROP)
# the 16-bit calls: the same with an attn_dtype after the config
_FORWARD16 = ctypes.CFUNCTYPE(c_int, c_void_p, _CFG, c_int, _P, _P, _P, _P, _P, c_void_p, _DROP)
_BACKWARD16 = ctypes.CFUNCTYPE(c_int, c_void_p, _CFG, c_int, _P, _P, _P, _P, _P, _P, _P, _P, _P,
                               _DROP)


def _bind(proto, name):
    return proto((name, lib)) if _lib.has(name) else None


_forward = {torch.float32: _bind(_FORWARD, "attn_sdpa_forward"),
            torch.float64: _bind(_FORWARD, "attn_sdpa_forward_f64")}
_backward = {torch.float32: _bind(_BACKWARD, "attn_sdpa_backward"),
             torch.float64: _bind(_BACKWARD, "attn_sdpa_backward_f64")}
# bfloat16 and float16 run the 16-bit calls with their attn_dtype
_DTYPE16 = {torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_F16}
_forward16 = _bind(_FORWARD16, "attn_sdpa_forward_16")
_backward16 = _bind(_BACKWARD16, "attn_sdpa_backward_16")
# the backward of a loss in lse as well: the dtype, then q, k, v, out, lse,
# dout, dlse, dq, dk, dv
_BACKWARD_DLSE = ctypes.CFUNCTYPE(c_int, c_void_p, _CFG, c_int, _P, _P, _P, _P, _P, _P, _P, _P,
                                  _P, _P, _DROP)
_backward_dlse = _bind(_BACKWARD_DLSE, "attn_sdpa_backward_dlse")
_DTYPE_CODE = {torch.float32: DTYPE_F32, torch.float64: DTYPE_F64, **_DTYPE16}


# AMX's tile state for this process (the bf16 kernels' fastest path on Intel):
# what torch's own bf16 kernels ask for too; a no-op where there is no AMX.
if _lib.has("attn_cpu_request_amx"):
    lib.attn_cpu_request_amx.restype = c_int
    lib.attn_cpu_request_amx()


def _with_dtype(fn, code):
    """A 16-bit call with its attn_dtype bound: called as the float ones."""
    return lambda handle, cfg, *tensors: fn(handle, cfg, code, *tensors)


if _forward16 is not None and _backward16 is not None:
    for _dtype, _code in _DTYPE16.items():
        _forward[_dtype] = _with_dtype(_forward16, _code)
        _backward[_dtype] = _with_dtype(_backward16, _code)
_ctx_new = _bind(ctypes.CFUNCTYPE(c_int, POINTER(CtxConfig), POINTER(c_void_p)), "attn_ctx_new")
_ctx_free = _bind(ctypes.CFUNCTYPE(None, c_void_p), "attn_ctx_free")
_last_error = _bind(ctypes.CFUNCTYPE(ctypes.c_char_p, c_void_p), "attn_ctx_last_error")
_rng_new = _bind(ctypes.CFUNCTYPE(c_int, c_void_p, c_uint64, POINTER(c_void_p)), "attn_rng_new")
_rng_seed = _bind(ctypes.CFUNCTYPE(c_int, c_void_p, c_uint64), "attn_rng_manual_seed")
_rng_set = _bind(ctypes.CFUNCTYPE(c_int, c_void_p, c_int), "attn_rng_set_bernoulli_method")
_rng_free = _bind(ctypes.CFUNCTYPE(None, c_void_p), "attn_rng_free")

_KERNELS = "auto"  # set_kernels()


class _Ctx(HandleOwner):
    """An attn_ctx (and a Philox rng) for one thread count; one per Python
    thread, since a ctx runs one call at a time."""

    def __init__(self, threads, kernels):
        self.handle = c_void_p()
        self.rng = c_void_p()
        cfg = CtxConfig(num_threads=threads, kernels=KERNELS[kernels])
        status = _ctx_new(ctypes.byref(cfg), ctypes.byref(self.handle))
        if status != 0:
            raise AttnError(status_name(status), f"attn_ctx_new: num_threads {threads} with "
                            f"kernels {kernels!r} is not accepted")
        self.check(_rng_new(self.handle, 0, ctypes.byref(self.rng)), "attn_rng_new")
        self.check(_rng_set(self.rng, BERNOULLI_PHILOX), "attn_rng_set_bernoulli_method")

    def check(self, status, what):
        if status != 0:
            message = _last_error(self.handle).decode(errors="replace")
            raise AttnError(status_name(status), message or f"{what} failed with "
                            f"{status_name(status)}")

    def __del__(self):
        if getattr(self, "rng", None) and _rng_free:
            _rng_free(self.rng)
            self.rng = None
        if getattr(self, "handle", None) and _ctx_free:
            _ctx_free(self.handle)
            self.handle = None


_local = threading.local()


def _context():
    # torch takes any count; the library refuses more than MAX_THREADS, and
    # its results do not depend on the count
    threads = min(torch.get_num_threads(), _lib.MAX_THREADS)
    cache = getattr(_local, "ctxs", None)
    if cache is None:
        cache = _local.ctxs = {}
    key = (threads, _KERNELS)
    c = cache.get(key)
    if c is None:
        c = cache[key] = _Ctx(threads, _KERNELS)
    return c


def set_kernels(kernels):
    """Which float32 kernels attn.torch runs: "auto" (the default: the
    fastest this CPU has), "reference", "portable", "avx2", "avx512".
    float64 always runs the reference kernels."""
    global _KERNELS
    if kernels not in KERNELS:
        raise ValueError(f"kernels: expected one of {', '.join(KERNELS)}, got {kernels!r}")
    if not kernels_supported(kernels):
        # refused here: every later call's context would be refused instead
        raise ValueError(f"kernels: this CPU (or this libattn's build) does not run "
                         f"{kernels!r}; attn.kernels_supported() says which do")
    _KERNELS = kernels


# ---- tensors as the C library reads them ------------------------------------------


def _no_overlap(sizes, strides):
    """True when no two elements share memory (dims of size 1 ignored)."""
    dims = sorted((s, n) for n, s in zip(sizes, strides) if n > 1)
    span = 1
    for s, n in dims:
        if s < span:
            return False
        span = s * n
    return True


def _readable(t):
    """t itself when the C library can read it through strides (last axis
    contiguous, no overlapping elements), else one contiguous copy."""
    if (t.stride(-1) == 1 or t.size(-1) == 1) and _no_overlap(t.shape, t.stride()):
        return t
    return t.contiguous()


def _bth(t, b, tok, h):
    """(batch, token, head) element strides of dims b, tok, h of t (None: the
    dim is absent). Dims of size 1 get stride 1: never stepped, and never
    three zeros, which the library reads as 'contiguous'."""
    return _bth_of(t.shape, t.stride(), b, tok, h)


def _bth_of(sizes, strides, b, tok, h):
    """_bth of a tensor of these sizes and strides."""
    return [1 if d is None or sizes[d] == 1 else strides[d] for d in (b, tok, h)]


class _Spec:
    """Everything of a call but the tensors: the attn_sdpa_config without
    its pointers, built once per call."""
    __slots__ = ("layout", "causal", "align", "scale", "dropout", "window", "softcap",
                 "alibi", "cu_q", "cu_kv", "max_q", "max_kv", "block_mask", "chain",
                 "out_strides", "grad_strides")

    def __init__(self, layout, causal=False, align=ALIGN_BOTTOM_RIGHT, scale=None, dropout=0.0,
                 window=None, softcap=0.0, alibi=None, cu_q=None, cu_kv=None, max_q=0,
                 max_kv=0, block_mask=None, chain=None, out_strides=None, grad_strides=None):
        self.layout = layout  # "bhtd" (SDPA), "bthd" (flash), "varlen" (total, H, D)
        self.causal, self.align, self.scale, self.dropout = causal, align, scale, dropout
        self.window, self.softcap, self.alibi = window, softcap, alibi
        self.cu_q, self.cu_kv, self.max_q, self.max_kv = cu_q, cu_kv, max_q, max_kv
        # programmable attention: a flex.BlockMask and a flex._Chain of score
        # mods, whose tensors travel beside q, k, v as autograd inputs
        self.block_mask, self.chain = block_mask, chain
        # "bhtd" only: out's strides (None: (B, T, H, Dv) in memory) and those
        # of the gradients of q, k, v (None: each its input's)
        self.out_strides, self.grad_strides = out_strides, grad_strides

    def mod_tensors(self):
        return list(self.chain.tensors) if self.chain is not None else []

    def with_tensors(self, cu_q, cu_kv, alibi):
        """This spec reading the given cu_seqlens and alibi tensors (the
        saved ones, in the backward)."""
        other = _Spec(self.layout)
        for name in self.__slots__:
            setattr(other, name, getattr(self, name))
        other.cu_q, other.cu_kv, other.alibi = cu_q, cu_kv, alibi
        return other


def _config(spec, q, k, v, mod_tensors=(), mod_grads=None):
    """The attn_sdpa_config of q, k, v (and of the out _alloc_out gives);
    its score mods read mod_tensors (the chain's, or the saved copies) and
    write mod_grads (None: no gradient). The config keeps the mods' array
    alive as long as itself."""
    c = SdpaConfig()
    if spec.layout == "bhtd":
        B, H, T, D = q.shape
        Hkv, S, Dv = k.size(1), k.size(2), v.size(3)
        c.q_strides[:] = _bth(q, 0, 2, 1)
        c.kv_strides[:] = _bth(k, 0, 2, 1)
        c.v_strides[:] = _bth(v, 0, 2, 1)
        c.out_strides[:] = ([T * H * Dv, H * Dv, Dv] if spec.out_strides is None else
                            _bth_of((B, H, T, Dv), spec.out_strides, 0, 2, 1))
    elif spec.layout == "bthd":
        B, T, H, D = q.shape
        S, Hkv, Dv = k.size(1), k.size(2), v.size(3)
        c.q_strides[:] = _bth(q, 0, 1, 2)
        c.kv_strides[:] = _bth(k, 0, 1, 2)
        c.v_strides[:] = _bth(v, 0, 1, 2)
        c.out_strides[:] = [T * H * Dv, H * Dv, Dv]
    else:  # varlen: (total, H, D), batch stride ignored
        H, D, Hkv, Dv = q.size(1), q.size(2), k.size(1), v.size(2)
        B, T, S = spec.cu_q.numel() - 1, spec.max_q, spec.max_kv
        c.q_strides[:] = [0] + _bth(q, None, 0, 1)[1:]
        c.kv_strides[:] = [0] + _bth(k, None, 0, 1)[1:]
        c.v_strides[:] = [0] + _bth(v, None, 0, 1)[1:]
        c.out_strides[:] = [0, H * Dv, Dv]
        c.cu_seqlens_q = ctypes.cast(spec.cu_q.data_ptr(), c.cu_seqlens_q.__class__)
        c.cu_seqlens_kv = ctypes.cast(spec.cu_kv.data_ptr(), c.cu_seqlens_kv.__class__)
    c.batch, c.heads, c.kv_heads, c.q_tokens, c.kv_tokens = B, H, Hkv, T, S
    c.head_dim, c.v_head_dim = D, Dv
    c.scale = library_scale(spec.scale)
    c.causal = spec.causal
    c.align = spec.align
    c.dropout = spec.dropout
    if spec.window is not None:
        c.window, c.window_left, c.window_right = True, spec.window[0], spec.window[1]
    c.softcap = spec.softcap
    if spec.alibi is not None:
        c.alibi_slopes = ctypes.cast(spec.alibi.data_ptr(), c.alibi_slopes.__class__)
    if spec.block_mask is not None:
        c.block_mask = spec.block_mask.handle
    if spec.chain is not None and spec.chain.entries:
        c.mods_array = spec.chain.structs(mod_tensors, mod_grads)
        c.score_mods = ctypes.cast(c.mods_array, c.score_mods.__class__)
        c.score_mod_count = len(spec.chain.entries)
    return c


def _alloc_out(spec, q, v, dtype):
    """out in the layout _config describes, as the caller sees it, and lse
    (float32 for the 16-bit dtypes)."""
    lse_dtype = torch.float32 if dtype in _DTYPE16 else dtype
    if spec.layout == "bhtd":
        B, H, T, _ = q.shape
        Dv = v.size(3)
        # (B, T, H, Dv) in memory unless the spec says, (B, H, T, Dv) in shape:
        # a tensor of its own, not a view (autograd refuses in-place ops on a
        # custom Function's views)
        strides = spec.out_strides or (T * H * Dv, Dv, H * Dv, 1)
        out = torch.empty_strided((B, H, T, Dv), strides, dtype=dtype)
        lse = torch.empty(B, H, T, dtype=lse_dtype)
    elif spec.layout == "bthd":
        B, T, H, _ = q.shape
        out = torch.empty(B, T, H, v.size(3), dtype=dtype)
        lse = torch.empty(B, H, T, dtype=lse_dtype)
    else:
        total, H, _ = q.shape
        out = torch.empty(total, H, v.size(2), dtype=dtype)
        lse = torch.empty(H, total, dtype=lse_dtype)
    return out, lse


def _run_forward(spec, q, k, v, want_lse, mod_tensors=()):
    """(out, lse or None, drawn or None) of attn on q, k, v."""
    ctx = _context()
    cfg = _config(spec, q, k, v, mod_tensors)
    out, lse = _alloc_out(spec, q, v, q.dtype)
    if not want_lse:
        lse = None
    drawn, rng = None, None
    if spec.dropout > 0.0:
        drawn = SdpaDropout()
        seed = int(torch.randint(0, 2 ** 62, (), dtype=torch.int64).item())
        ctx.check(_rng_seed(ctx.rng, seed), "attn_rng_manual_seed")
        rng = ctx.rng
    fn = _forward.get(q.dtype)
    if fn is None:
        raise AttnError("ATTN_ERR_NOT_FOUND", f"this libattn ({_lib.path}) has no {q.dtype} "
                        "attn_sdpa_forward")
    ctx.check(fn(ctx.handle, ctypes.byref(cfg), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                 out.data_ptr(), lse.data_ptr() if lse is not None else None, rng,
                 ctypes.byref(drawn) if drawn is not None else None), "attn_sdpa_forward")
    return out, lse, drawn


def _like(t):
    """An uninitialised tensor with t's shape and strides (the gradient of t
    is written with t's strides)."""
    if t.is_contiguous():
        return torch.empty(t.shape, dtype=t.dtype)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)


def _with_strides(t, strides):
    """t, or a copy of it with these strides."""
    if t.stride() == tuple(strides):
        return t
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype)
    out.copy_(t)
    return out


_NOT_TWICE = ("attn.torch: the backward of attn's attention is not differentiable (attn has "
              "no second derivative), so a graph through its gradients (create_graph=True: "
              "gradient penalties, double backward) cannot be built; run that model on "
              "PyTorch's SDPA (attn.torch.unpatch(), or outside patched())")


class _NoSecondDerivative(torch.autograd.Function):
    """The first n tensors (gradients attn computed), returned tied to the
    rest (what they depend on: q, k, v, dout) through a node whose own
    backward raises: differentiating them reaches it, from .backward() and
    from autograd.grad(..., inputs) alike."""

    @staticmethod
    def forward(ctx, n, *tensors):
        return tuple(t.clone() for t in tensors[:n])

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(_NOT_TWICE)


def _once_differentiable(backward):
    """backward run without recording a graph. Under create_graph=True its
    gradients depend on q, k, v (and dout), but attn has no second
    derivative: they are returned tied to those through
    _NoSecondDerivative, so a second derivative is an error, never a
    silent zero. (torch's once_differentiable looks only at dout, which
    out.sum() leaves constant, and would return constants.)"""
    @functools.wraps(backward)
    def run(ctx, *grads):
        with torch.no_grad():
            outputs = backward(ctx, *grads)
        if not torch.is_grad_enabled():
            return outputs
        depends = [t for t in list(ctx.saved_tensors) + list(grads)
                   if isinstance(t, torch.Tensor) and t.requires_grad]
        if not depends:
            return outputs
        where = [i for i, t in enumerate(outputs) if isinstance(t, torch.Tensor)]
        tied = _NoSecondDerivative.apply(len(where), *[outputs[i] for i in where], *depends)
        if isinstance(tied, torch.Tensor):
            tied = (tied,)
        outputs = list(outputs)
        for i, t in zip(where, tied):
            outputs[i] = t
        return tuple(outputs)
    return run


_BATCHED_GRADS = ("attn.torch: the backward of attn's attention got an incoming gradient with no "
                  "memory of its own, a batched one (autograd.grad(..., is_grads_batched=True), "
                  "jacobian(vectorize=True) or another vmap over the backward); attn's kernels "
                  "read memory, so run it unbatched (is_grads_batched=False, vectorize=False) "
                  "or on PyTorch's SDPA (attn.torch.unpatch(), or outside patched())")


def _has_storage(t):
    """False for a tensor with no memory of its own (vmap's batched tensors,
    which autograd hands a backward under is_grads_batched=True)."""
    try:
        t.data_ptr()
    except RuntimeError:
        return False
    return True


class _Attention(torch.autograd.Function):
    """out (and lse) = attn(q, k, v); the backward is attn_sdpa_backward.

    Every tensor the backward reads (q, k, v, out, lse and the spec's
    cu_seqlens and alibi slopes) goes through save_for_backward, so an
    in-place change to one of them between the forward and the backward
    is caught by autograd's version counter, not differentiated silently."""

    @staticmethod
    def forward(ctx, q, k, v, spec, return_lse, cu_q, cu_kv, alibi, *mod_tensors):
        out, lse, drawn = _run_forward(spec, q, k, v, True, mod_tensors)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_kv, alibi, *mod_tensors)
        ctx.spec, ctx.drawn = spec, drawn
        if return_lse:
            return out, lse
        return out

    @staticmethod
    @_once_differentiable
    def backward(ctx, dout, dlse=None):
        if not all(_has_storage(g) for g in (dout, dlse) if g is not None):
            raise NotImplementedError(_BATCHED_GRADS)
        q, k, v, out, lse, cu_q, cu_kv, alibi, *mod_tensors = ctx.saved_tensors
        spec = ctx.spec.with_tensors(cu_q, cu_kv, alibi)
        # A saved-tensor hook (save_on_cpu(pin_memory=True), an offloading
        # pack/unpack) may hand back copies in other layouts than the
        # forward's: q, k and v are read through their own strides, but the
        # config reads out (and dout) in the layout _alloc_out gives and lse
        # contiguous, so copies in another layout are put back in those.
        q, k, v = _readable(q), _readable(k), _readable(v)
        laid_out, _ = _alloc_out(spec, q, v, out.dtype)
        if out.stride() != laid_out.stride():
            laid_out.copy_(out)
            out = laid_out
        lse = lse.contiguous()
        if dout is None:
            dout = torch.zeros_like(out)
        if dout.dtype != out.dtype:
            dout = dout.to(out.dtype)
        if dout.stride() != out.stride():
            d = _like(out)
            d.copy_(dout)
            dout = d
        dq, dk, dv = _like(q), _like(k), _like(v)
        # the score mods' tensors that want a gradient (a bias, a T5 table):
        # zeros, as the backward adds what broadcast elements receive
        mod_grads = [torch.zeros_like(t) if want else None
                     for t, want in zip(mod_tensors, ctx.needs_input_grad[8:])]
        c = _context()
        cfg = _config(spec, q, k, v, mod_tensors, mod_grads)
        drawn = ctypes.byref(ctx.drawn) if ctx.drawn is not None else None
        if dlse is not None and bool(torch.any(dlse != 0)):
            # a loss that reads lse too (a z-loss, merged chunks): each
            # score's gradient gains dlse_i P_ij
            if _backward_dlse is None:
                raise RuntimeError("attn: this libattn has no attn_sdpa_backward_dlse, which "
                                   "a loss in lse needs; rebuild it")
            dlse = dlse.to(lse.dtype).contiguous()
            c.check(_backward_dlse(c.handle, ctypes.byref(cfg), _DTYPE_CODE[q.dtype],
                                   q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                   lse.data_ptr(), dout.data_ptr(), dlse.data_ptr(),
                                   dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), drawn),
                    "attn_sdpa_backward_dlse")
        else:
            c.check(_backward[q.dtype](c.handle, ctypes.byref(cfg), q.data_ptr(), k.data_ptr(),
                                       v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                                       dout.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                       dv.data_ptr(), drawn),
                    "attn_sdpa_backward")
        if spec.grad_strides is not None:
            # the kernels write each gradient in its input's layout
            dq, dk, dv = (_with_strides(g, st) for g, st in zip((dq, dk, dv), spec.grad_strides))
        return (dq, dk, dv, None, None, None, None, None, *mod_grads)


_is_functorch_wrapped = getattr(getattr(torch._C, "_functorch", None),
                                "is_functorch_wrapped_tensor", None)


def _transform_problem(tensors):
    """Why attn cannot run tensors that a torch transform holds, or None:
    forward-mode AD's dual tensors (attn has no jvp, and would drop the
    tangent), torch.func's wrapped tensors (vmap, grad, jvp: no storage to
    hand the library), nested tensors and other tensor subclasses (their
    sizes or storage are not a plain strided tensor's), and torch.jit.trace
    (and torch.onnx.export, which traces): the trace would record the output's
    torch.empty and not the library call that fills it, so running the trace
    would return uninitialised memory."""
    if torch.jit.is_tracing():
        return "torch.jit.trace records the call, and it cannot see attn's kernels"
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if t.is_nested:
            return "a nested (jagged) tensor"
        if type(t) not in (torch.Tensor, torch.nn.Parameter):
            return f"a tensor subclass ({type(t).__name__})"
        if _is_functorch_wrapped is not None and _is_functorch_wrapped(t):
            return "a torch.func transform (vmap, grad, jvp) holds the tensors"
        if forward_ad.unpack_dual(t).tangent is not None:
            return "forward-mode AD (a dual tensor): attn has no jvp"
    return None


def _compiling():
    """True while torch.compile (TorchDynamo) traces the call: it records
    torch ops into a graph, and attn's kernels, called through ctypes, are
    none; PyTorch's SDPA is one it can compile."""
    compiler = getattr(torch, "compiler", None)
    is_compiling = getattr(compiler, "is_compiling", None)
    return bool(is_compiling()) if is_compiling is not None else False


def _autocast_problem():
    """Why attn does not run a call under CPU autocast, or None: PyTorch casts
    its inputs to the autocast dtype there, and its output has that dtype."""
    on = (torch.is_autocast_enabled("cpu") if _TORCH_VERSION >= (2, 4)
          else torch.is_autocast_cpu_enabled())
    return "CPU autocast is on (PyTorch casts the call to its dtype)" if on else None


def _attend(spec, q, k, v, return_lse=False):
    """Runs spec on q, k, v: through autograd when a gradient is wanted."""
    why = _transform_problem((q, k, v, *spec.mod_tensors()))
    if why is not None:
        raise NotImplementedError(f"attn.torch: {why}; use PyTorch's own attention there")
    q, k, v = _readable(q), _readable(k), _readable(v)
    mods = spec.mod_tensors()
    if torch.is_grad_enabled() and any(t.requires_grad for t in [q, k, v, *mods]):
        return _Attention.apply(q, k, v, spec, return_lse, spec.cu_q, spec.cu_kv, spec.alibi,
                                *mods)
    out, lse, _ = _run_forward(spec, q, k, v, return_lse, mods)
    return (out, lse) if return_lse else out


# ---- PyTorch's scaled_dot_product_attention ---------------------------------------

_torch_sdpa = getattr(F, "scaled_dot_product_attention", None)  # PyTorch's own (>= 2.0)


def _math_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    """PyTorch's SDPA semantics written out in torch (its math path): the
    fallback on torch < 2.0, which has no F.scaled_dot_product_attention.
    It refuses what PyTorch 2's refuses, and a row whose every key is
    hidden gives 0, as PyTorch 2's does."""
    L, S = query.size(-2), key.size(-2)
    if attn_mask is not None and is_causal:
        raise RuntimeError("scaled_dot_product_attention: attn_mask should not be set when "
                           "is_causal=True (give the causal mask in attn_mask)")
    if attn_mask is not None and _mask_rank_refused(attn_mask, query):
        raise IndexError(f"scaled_dot_product_attention: attn_mask of {attn_mask.dim()} "
                         f"dimensions with 4-D queries: PyTorch takes 2 to 4 there")
    if attn_mask is not None:
        scores_shape = tuple(query.shape[:-1]) + (S,)
        try:
            fits = torch.broadcast_shapes(tuple(attn_mask.shape), scores_shape) == scores_shape
        except RuntimeError:
            fits = False
        if not fits:
            raise RuntimeError(f"scaled_dot_product_attention: attn_mask of shape "
                               f"{tuple(attn_mask.shape)} does not broadcast to the scores' "
                               f"shape {scores_shape}")
    if scale is None:
        # head_dim 0: every score is an empty sum, 0 at any scale (PyTorch's
        # math path gets the same zeros); 1/sqrt(0) would divide by zero
        scale = 1.0 / math.sqrt(query.size(-1)) if query.size(-1) else 1.0
    if enable_gqa and key.dim() >= 3 and key.size(-3) != query.size(-3):
        g = query.size(-3) // key.size(-3)
        key = key.repeat_interleave(g, -3)
        value = value.repeat_interleave(g, -3)
    scores = (query @ key.transpose(-2, -1)) * scale
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask
    # a row that sees no key: weights 0, not the NaN of softmax over -inf
    hidden = (scores == float("-inf")).all(dim=-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(hidden, 0.0), dim=-1).masked_fill(hidden, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p, training=True)
    return weights @ value


def _pytorch_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False):
    """PyTorch's own SDPA, with only the keywords this torch knows."""
    if _torch_sdpa is None:
        return _math_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    kw = {}
    if scale is not None:
        kw["scale"] = scale
    if enable_gqa:
        if _TORCH_VERSION < (2, 5):
            return _math_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, True)
        kw["enable_gqa"] = True
    return _torch_sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                       is_causal=is_causal, **kw)


# The largest |scale| that rounds to a finite float32 (FLT_MAX plus half an
# ulp rounds to infinity): the library refuses the rest, so they go to PyTorch.
_SCALE_LIMIT = float.fromhex("0x1.ffffffp127")


def _scale_problem(scale):
    """Why the library would refuse this scale, or None."""
    if scale is None:
        return None
    scale = float(scale)  # a NumPy float32 would compare with the limit in float32
    if not math.isfinite(scale):
        return f"scale {scale} is not finite"
    if abs(scale) >= _SCALE_LIMIT:
        return f"scale {scale} is beyond float32's range"
    return None


def supports(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
    """None when attn runs this scaled_dot_product_attention call, else why
    it goes to PyTorch. The same checks decide the call: what supports()
    passes, attn runs, and what the library would refuse it does not pass."""
    ts = (query, key, value)
    if not all(isinstance(t, torch.Tensor) for t in ts):
        return "query, key and value are not all tensors"
    if _compiling():
        return "torch.compile traces the call (attn's kernels are not torch ops it can compile)"
    if any(t.device.type != "cpu" for t in ts):
        return "not on the CPU"
    if query.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return (f"dtype {query.dtype} (attn runs float32, bfloat16, float16, and float64 on "
                "its reference kernels)")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return "query, key and value differ in dtype"
    if _forward.get(query.dtype) is None:
        return f"this libattn has no {query.dtype} attention"
    if query.dim() not in (3, 4) or key.dim() != query.dim() or value.dim() != query.dim():
        return f"ranks {query.dim()}, {key.dim()}, {value.dim()} (attn takes 3 or 4)"
    if any(t.numel() == 0 for t in ts):
        return "an empty tensor"
    if query.size(0) != key.size(0) or key.shape[:-1] != value.shape[:-1]:
        return (f"shapes do not match: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                f"value {tuple(value.shape)}")
    if query.size(-1) != key.size(-1):
        return "query and key differ in head_dim"
    if query.dim() == 4 and key.size(1) != query.size(1):
        if not enable_gqa:
            return "key has other heads than query and enable_gqa is off"
        if query.size(1) % key.size(1):
            return "key's heads do not divide query's"
    if not 0.0 <= dropout_p < 1.0:
        return f"dropout_p {dropout_p} is not in [0, 1)"
    why = _transform_problem((query, key, value, attn_mask)) or _autocast_problem()
    if why is not None:
        return why
    if attn_mask is not None:
        why = _mask_problem(attn_mask, query, key, is_causal)
        if why is not None:
            return why
    return _scale_problem(scale)


def _mask_shape(attn_mask, query, key):
    """attn_mask's shape as 4-D (B or 1, H or 1, T or 1, S or 1), or None
    where it does not broadcast to the scores (B, H, T, S)."""
    if query.dim() == 3:  # (B, T, E): the mask broadcasts to (B, T, S), heads inserted
        target = (query.size(0), query.size(1), key.size(1))
        if attn_mask.dim() > 3:
            return None
        shape = (1,) * (3 - attn_mask.dim()) + tuple(attn_mask.shape)
        shape = (shape[0], 1, shape[1], shape[2])
        target = (target[0], 1, target[1], target[2])
    else:
        target = (query.size(0), query.size(1), query.size(2), key.size(2))
        if attn_mask.dim() > 4:
            return None
        shape = (1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape)
    if any(n not in (1, t) for n, t in zip(shape, target)):
        return None
    return shape


def _mask_problem(attn_mask, query, key, is_causal):
    """Why attn does not run this attn_mask, or None."""
    if not isinstance(attn_mask, torch.Tensor):
        return "attn_mask is not a tensor"
    if attn_mask.device.type != "cpu":
        return "attn_mask is not on the CPU"
    if attn_mask.dtype != torch.bool and not attn_mask.dtype.is_floating_point:
        return f"attn_mask of dtype {attn_mask.dtype} (attn takes bool or floating point)"
    if is_causal:
        return "attn_mask with is_causal (PyTorch refuses the pair)"
    if _mask_dtype_refused(attn_mask, query):
        return (f"attn_mask of dtype {attn_mask.dtype} with {query.dtype} queries (PyTorch "
                "refuses the pair)")
    if attn_mask.dtype != torch.bool and query.dtype == torch.float64:
        # the library reads an additive mask's values in float32: a float64
        # call (gradcheck) would lose their low bits
        return "a float additive attn_mask with float64 queries"
    if _mask_rank_refused(attn_mask, query):
        return (f"attn_mask of {attn_mask.dim()} dimensions with 4-D queries (PyTorch refuses "
                "it)")
    if attn_mask.numel() == 0 or _mask_shape(attn_mask, query, key) is None:
        return (f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to the "
                "scores")
    if not _runs_block_maps():
        return "attn_mask is given and this libattn runs no block map (no flex backend)"
    if attn_mask.dtype != torch.bool and not bool((attn_mask.detach() < math.inf).all()):
        # score + inf (or NaN) makes its row's softmax NaN in PyTorch, and its
        # gradients; the library's additive masks take -inf and finite values
        # only, so PyTorch runs the call and its NaN rows are the answer
        return "an additive attn_mask holding +inf or NaN (its rows are NaN in PyTorch)"
    return None


def _mask_rank_refused(attn_mask, query):
    """Whether PyTorch 2's SDPA refuses attn_mask's rank: with 4-D queries
    it reads the mask's last two dimensions, and a 0-D or 1-D mask raises
    IndexError there (3-D queries take any rank that broadcasts)."""
    return query.dim() == 4 and attn_mask.dim() < 2


def _mask_dtype_refused(attn_mask, query):
    """Whether PyTorch's SDPA refuses attn_mask's dtype with query's: it
    takes bool, float32 or query's dtype."""
    return (isinstance(attn_mask, torch.Tensor) and isinstance(query, torch.Tensor)
            and attn_mask.dtype not in (torch.bool, torch.float32, query.dtype))


def _check_mask_dtype(attn_mask, query):
    """PyTorch's RuntimeError for an attn_mask dtype it refuses, raised on
    every path: its own SDPA raises it, the torch < 2.0 math and attn's
    kernels would run the call."""
    if _mask_dtype_refused(attn_mask, query):
        raise RuntimeError(f"scaled_dot_product_attention: expected attn_mask dtype to be bool "
                           f"or float or to match query dtype, but got attn_mask.dtype "
                           f"{attn_mask.dtype} and query.dtype {query.dtype}")


def _type_name(value):
    """value's type as PyTorch's messages name it: numpy.bool, not bool
    (NumPy's scalar types share Python's names)."""
    t = type(value)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"


def _check_sdpa_args(dropout_p, is_causal, scale, enable_gqa):
    """PyTorch's TypeError for the arguments its SDPA's parser refuses, raised
    on every path: attn reads them with float() and bool(), which would take
    is_causal="no" as True, parse scale="0.5", and take a scale tensor that
    requires grad as a constant, its gradient silently lost."""
    for name, value in (("dropout_p", dropout_p), ("scale", scale)):
        if name == "scale" and value is None:
            continue
        # a float as PyTorch takes it: a Python or NumPy scalar, or a 0-d
        # tensor whose gradient nobody wants
        number = isinstance(value, (bool, int, float, np.number, np.bool_)) or (
            isinstance(value, torch.Tensor) and value.dim() == 0 and not value.requires_grad)
        if not number:
            what = ("Tensor that requires grad" if isinstance(value, torch.Tensor)
                    and value.requires_grad else _type_name(value))
            raise TypeError(f"scaled_dot_product_attention(): argument '{name}' must be float, "
                            f"not {what}")
    for name, value in (("is_causal", is_causal), ("enable_gqa", enable_gqa)):
        if not isinstance(value, bool):
            raise TypeError(f"scaled_dot_product_attention(): argument '{name}' must be bool, "
                            f"not {_type_name(value)}")


@functools.lru_cache(maxsize=None)
def _runs_block_maps():
    """Whether this libattn's attention applies a block map and a bias: one
    query against three keys of equal scores, the middle one hidden and the
    first raised by log 3, must weigh the values 3 : 0 : 1. Asked once per
    process; where the library's kernels ignore maps it fails, and masks go
    to PyTorch."""
    if not _lib.has("attn_block_mask_from_additive") or _forward.get(torch.float32) is None:
        return False
    try:
        additive = torch.tensor([math.log(3.0), float("-inf"), 0.0]).view(1, 1, 1, 3)
        bm, chain = _mask_spec(additive, (1, 1, 1, 3), 1, 1, 1, 3)
        q = torch.ones(1, 1, 1, 1)
        k = torch.zeros(1, 1, 3, 1)
        v = torch.tensor([1.0, 2.0, 4.0]).view(1, 1, 3, 1)
        out, _, _ = _run_forward(_Spec("bhtd", block_mask=bm, chain=chain), q, k, v, False,
                                 chain.tensors)
        return abs(float(out) - 1.75) < 1e-5
    except AttnError:
        return False


def _mask_spec(attn_mask, shape, B, H, T, S):
    """The block map and (additive) bias of attn_mask, of 4-D shape (from
    _mask_shape), for scores (B, H, T, S)."""
    from . import flex
    ctx = _context()
    block = (64, 64)
    if attn_mask.dtype == torch.bool:
        # a mask broadcast over batch or heads is one map for them all
        keep = attn_mask.reshape(shape).expand(shape[0], shape[1], T, S)
        return flex._from_bool(ctx, keep, block, None, None), None
    # additive: -inf hides, the finite values join the scores as a bias
    # (float32, as the library reads it; its gradient flows back to attn_mask)
    values = attn_mask.to(torch.float32).contiguous().reshape(shape)
    strides = [0 if values.size(d) == 1 else values.stride(d) for d in range(4)]
    cfg = _lib.BlockMaskConfig(batch=shape[0], heads=shape[1], q_len=T, kv_len=S,
                               block_q=block[0], block_kv=block[1])
    handle = c_void_p()
    ctx.check(lib.attn_block_mask_from_additive(
        ctx.handle, ctypes.byref(cfg), ctypes.cast(values.data_ptr(), _lib.F32P),
        (ctypes.c_size_t * 4)(*strides), ctypes.byref(handle)), "attn_block_mask_from_additive")
    bm = flex.BlockMask(handle, (shape[0], shape[1], T, S), block, None, None)
    return bm, flex._Chain.bias(values, strides)


def _contiguous_strides(sizes):
    strides, step = [], 1
    for n in reversed(sizes):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _permuted_strides(sizes, order):
    """Strides of a dense tensor of these sizes whose dims lie in memory in
    this order, outermost first (torch.empty_permuted's)."""
    strides = [0] * len(sizes)
    for d, st in zip(order, _contiguous_strides([sizes[d] for d in order])):
        strides[d] = st
    return tuple(strides)


def _sdpa_strides(query, key, value, attn_mask, dropout_p):
    """The strides PyTorch's CPU SDPA gives its output and the gradients of
    query, key and value, as (out, (dq, dk, dv)), for these tensors as the
    caller gave them (rank 3 or 4). Its flash kernel, which runs a call
    with head dims alike, no dropout, a mask that wants no gradient (and is
    not 3-D with 4-D tensors) and each last axis contiguous, allocates out
    as empty_like(query) and the
    gradients (B, T, H, D) in memory, a 3-D call's (N, L, E) read as
    (1, N, L, E); its math path returns them from matmuls: contiguous, but
    key's (B, H, E, S) in memory when no heads are shared."""
    Dv = value.size(-1)
    out_shape = tuple(query.shape[:-1]) + (Dv,)
    flash = (dropout_p == 0.0 and query.size(-1) == Dv
             and all(t.stride(-1) == 1 for t in (query, key, value))
             and not (attn_mask is not None and (attn_mask.requires_grad or
                                                 (query.dim() == 4 and attn_mask.dim() == 3))))
    if flash:
        out = torch.empty_like(query, device="meta").stride()
        # (B, T, H, D) in memory: a 4-D (B, H, T, D) in the order 0, 2, 1, 3;
        # a 3-D (N, L, E), PyTorch's (1, N, L, E), in the order 1, 0, 2
        order = (0, 2, 1, 3) if query.dim() == 4 else (1, 0, 2)
        grads = tuple(_permuted_strides(tuple(t.shape), order) for t in (query, key, value))
        return out, grads
    shared = query.dim() == 4 and key.size(1) != query.size(1)
    k_order = tuple(range(key.dim() - 2)) + (key.dim() - 1, key.dim() - 2)
    dk = _contiguous_strides(key.shape) if shared else _permuted_strides(tuple(key.shape),
                                                                        k_order)
    return _contiguous_strides(out_shape), (_contiguous_strides(query.shape), dk,
                                            _contiguous_strides(value.shape))


def _unsqueezed_strides(strides):
    """3-D strides as those of the 4-D view unsqueeze(1) gives, whose dim 1
    (of size 1) is never stepped."""
    return (strides[0], strides[1]) + tuple(strides[1:])


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention, on attn's kernels
    where attn supports the call (see supports()), PyTorch's elsewhere.

    query (B, H, T, E), key (B, H_kv, S, E), value (B, H_kv, S, Ev) (or
    without the head axis) -> (B, H, T, Ev). is_causal: query i sees keys
    j <= i (top-left, as PyTorch, when T != S). scale: None is 1/sqrt(E).
    enable_gqa: H_kv divides H, query heads h*G .. h*G+G-1 read KV head h.
    dropout_p > 0 drops weights (call it with 0 in eval mode, as
    nn.Module code does with `self.dropout if self.training else 0`).
    First derivatives only: differentiating the gradients again
    (create_graph=True) raises, as PyTorch's fused kernels do.
    """
    _check_sdpa_args(dropout_p, is_causal, scale, enable_gqa)
    _check_mask_dtype(attn_mask, query)
    if supports(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
        return _pytorch_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale,
                             enable_gqa)
    out_strides, grad_strides = _sdpa_strides(query, key, value, attn_mask, dropout_p)
    squeeze = query.dim() == 3
    if squeeze:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        out_strides = _unsqueezed_strides(out_strides)
        grad_strides = tuple(_unsqueezed_strides(st) for st in grad_strides)
    block_mask, chain = None, None
    if attn_mask is not None:
        shape = _mask_shape(attn_mask, query.squeeze(1) if squeeze else query,
                            key.squeeze(1) if squeeze else key)
        block_mask, chain = _mask_spec(attn_mask, shape, query.size(0), query.size(1),
                                       query.size(2), key.size(2))
    spec = _Spec("bhtd", causal=bool(is_causal), align=ALIGN_TOP_LEFT,
                 scale=None if scale is None else float(scale), dropout=float(dropout_p),
                 block_mask=block_mask, chain=chain, out_strides=out_strides,
                 grad_strides=grad_strides)
    out = _attend(spec, query, key, value)
    return out.squeeze(1) if squeeze else out


# ---- flash-attn's interface --------------------------------------------------------


def _flash_spec(layout, q, H, dropout_p, softmax_scale, causal, window_size, softcap,
                alibi_slopes, **kw):
    if window_size is None:
        window_size = (-1, -1)
    if len(window_size) != 2:
        raise ValueError(f"window_size: expected (left, right), got {window_size!r}")
    left, right = (as_index(f"window_size[{i}]", x, -2**62, 2**62)
                   for i, x in enumerate(window_size))
    window = None if (left < 0 and right < 0) else (max(left, -1), max(right, -1))
    alibi = None
    if alibi_slopes is not None:
        a = alibi_slopes.detach()
        if a.dim() == 2:
            if not bool((a == a[:1]).all()):
                raise ValueError("alibi_slopes: per-batch slopes (B, H) that differ between "
                                 "batch elements are not supported; give (H,)")
            a = a[0]
        if a.shape != (H,):
            raise ValueError(f"alibi_slopes: expected shape ({H},) or (B, {H}), got "
                             f"{tuple(alibi_slopes.shape)}")
        alibi = a.to(device="cpu", dtype=torch.float32).contiguous()
        if not bool(torch.isfinite(alibi).all()):
            raise ValueError(f"alibi_slopes: expected finite slopes, got {alibi.tolist()}")
    dropout_p = as_number("dropout_p", dropout_p, 0.0, 1.0, hi_open=True)
    softcap = as_number("softcap", softcap, 0.0, _SCALE_LIMIT, hi_open=True)
    if softmax_scale is not None:
        softmax_scale = as_number("softmax_scale", softmax_scale, -_SCALE_LIMIT, _SCALE_LIMIT,
                                  lo_open=True, hi_open=True)
    return _Spec(layout, causal=bool(causal), align=ALIGN_BOTTOM_RIGHT, scale=softmax_scale,
                 dropout=dropout_p, window=window, softcap=softcap, alibi=alibi, **kw)


def _flash_tensors(q, k, v, rank):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != rank:
            raise ValueError(f"{name}: expected a {rank}-D tensor, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
        if t.device.type != "cpu":
            raise ValueError(f"{name}: attn runs on the CPU; {name} is on {t.device}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"q, k, v: attention takes floating-point tensors, got {q.dtype}")
    if q.size(-1) != k.size(-1) or k.shape[:-1] != v.shape[:-1] or \
            (rank == 4 and q.size(0) != k.size(0)):
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "do not match" + (" (batch sizes differ)" if rank == 4 and
                                           q.size(0) != k.size(0) else ""))
    if q.size(-1) == 0 or v.size(-1) == 0:
        raise ValueError(f"q, k, v: head dims must be positive, got q {tuple(q.shape)}, "
                         f"v {tuple(v.shape)}")
    if k.size(-2) == 0 or q.size(-2) % k.size(-2):
        raise ValueError(f"k's heads ({k.size(-2)}) must divide q's ({q.size(-2)})")
    dtype = q.dtype
    if _forward.get(dtype) is None:
        # a libattn without the 16-bit calls: computed in float32 (a copy)
        q, k, v = q.float(), k.float(), v.float()
    return q, k, v, dtype


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=True,
                    return_attn_probs=False):
    """flash_attn.flash_attn_func on attn's CPU kernels.

    q (B, T, H, D), k (B, S, H_kv, D), v (B, S, H_kv, Dv) -> out (B, T, H, Dv);
    with return_attn_probs: (out, softmax_lse (B, H, T) float32, None).
    causal is bottom-right (query i sits at key i + S - T), window_size
    (left, right) with -1 unbounded, softcap > 0 caps the scores, alibi_slopes
    (H,) or (B, H) with equal rows, float32. float16/bfloat16 inputs run
    attn's 16-bit calls (float sums, out rounded once to their dtype).
    Always deterministic.
    """
    q, k, v, dtype = _flash_tensors(q, k, v, 4)
    spec = _flash_spec("bthd", q, q.size(2), dropout_p, softmax_scale, causal, window_size,
                       softcap, alibi_slopes)
    if q.size(0) == 0 or q.size(1) == 0 or k.size(1) == 0:
        B, T, H = q.shape[:3]
        return _finish(_no_rows_or_keys(q, k, v, (B, H, T), return_attn_probs), dtype,
                       return_attn_probs)
    return _finish(_attend(spec, q, k, v, return_lse=return_attn_probs), dtype,
                   return_attn_probs)


def _no_rows_or_keys(q, k, v, lse_shape, return_lse):
    """An attention with no query rows or no keys, which the library's calls
    take as NULL tensors: out zeros (a row that sees no key outputs 0) and
    lse -inf, joined to q, k and v's graph so that their gradients are zeros."""
    anchor = sum(t.reshape(-1)[:0].sum() for t in (q, k, v))
    out = q.new_zeros(q.shape[:-1] + (v.size(-1),)) + anchor
    if not return_lse:
        return out
    return out, torch.full(lse_shape, -math.inf, dtype=torch.float32) + anchor.float()


def _finish(result, dtype, return_attn_probs):
    if return_attn_probs:
        out, lse = result
        return out.to(dtype), lse.float(), None
    return result.to(dtype)


def _cu(name, cu, rows):
    if not isinstance(cu, torch.Tensor) or cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name}: expected a 1-D tensor of B + 1 >= 2 offsets")
    if cu.dtype.is_floating_point or cu.dtype.is_complex or cu.dtype == torch.bool:
        raise TypeError(f"{name}: offsets are integers, got dtype {cu.dtype}")
    cu = cu.detach().to(device="cpu")
    low, high = int(cu.min()), int(cu.max())
    if low < 0 or high > INT32_MAX:
        # the library reads int32: past it an offset would wrap
        raise ValueError(f"{name}: offsets must be in [0, {INT32_MAX}], got {low} .. {high}")
    cu = cu.to(dtype=torch.int32).contiguous()
    if int(cu[0]) != 0 or int(cu[-1]) != rows:
        raise ValueError(f"{name}: offsets must run from 0 to the {rows} rows of the tensor, "
                         f"got {int(cu[0])} .. {int(cu[-1])}")
    return cu


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=True, return_attn_probs=False, block_table=None,
                           block_mask=None, score_mod=None):
    """flash_attn.flash_attn_varlen_func on attn's CPU kernels: packed
    sequences, sequence b being rows cu_seqlens[b] .. cu_seqlens[b + 1] of
    q (total_q, H, D), k (total_k, H_kv, D), v (total_k, H_kv, Dv) ->
    out (total_q, H, Dv); with return_attn_probs (out, softmax_lse (H, total_q),
    None). max_seqlen_q / _k must be at least the longest sequence. Options
    as flash_attn_func; block_table (paged KV) is not supported.

    block_mask (attn.torch.create_block_mask) and score_mod (flex_attention's)
    are attn's additions, in each sequence's own positions: sequence b's
    query i and key j are the mask's (b, h, i, j) (its B 1 or the number of
    sequences, its Q_LEN and KV_LEN at least the longest sequence's) and
    score_mod's (b, h, q_idx=i, kv_idx=j); a captured tensor is indexed
    alike, up to (B, H, max_seqlen_q, max_seqlen_k). A mask made with B 1
    (or H 1) whose mask_mod reads b (h) gives each sequence (head) its own
    blocks. With score_mod, softcap and alibi_slopes go into it.
    """
    if block_table is not None:
        raise ValueError("block_table: paged KV caches are not supported by attn")
    q, k, v, dtype = _flash_tensors(q, k, v, 3)
    cu_q = _cu("cu_seqlens_q", cu_seqlens_q, q.size(0))
    cu_kv = _cu("cu_seqlens_k", cu_seqlens_k, k.size(0))
    if cu_q.numel() != cu_kv.numel():
        raise ValueError(f"cu_seqlens_q ({cu_q.numel()}) and cu_seqlens_k ({cu_kv.numel()}) "
                         "must have the same length, B + 1")
    given_q = as_index("max_seqlen_q", max_seqlen_q, 0, INT32_MAX)
    given_kv = as_index("max_seqlen_k", max_seqlen_k, 0, INT32_MAX)
    for name, cu, given in (("q", cu_q, given_q), ("k", cu_kv, given_kv)):
        lengths = cu[1:] - cu[:-1]
        if bool((lengths < 0).any()):
            b = int((lengths < 0).nonzero()[0])
            raise ValueError(f"cu_seqlens_{name}: offsets must not decrease, got "
                             f"cu_seqlens_{name}[{b}] = {int(cu[b])} > "
                             f"cu_seqlens_{name}[{b + 1}] = {int(cu[b + 1])}")
        if int(lengths.max()) > given:
            raise ValueError(f"max_seqlen_{name}: {given} is less than the longest sequence "
                             f"of cu_seqlens_{name} ({int(lengths.max())} tokens)")
    max_q, max_kv = max(1, given_q), max(1, given_kv)
    chain = None
    if block_mask is not None or score_mod is not None:
        from . import flex
        if block_mask is not None and not isinstance(block_mask, flex.BlockMask):
            raise TypeError("flash_attn_varlen_func: block_mask must be a BlockMask "
                            "(create_block_mask)")
        if block_mask is not None:
            # a map made for one sequence (head) whose mask_mod reads b (h):
            # each sequence's (head's) own blocks
            block_mask = block_mask._for_call(cu_q.numel() - 1, q.size(1),
                                              "flash_attn_varlen_func", pytorch_classes=False)
        if score_mod is not None:
            if softcap or alibi_slopes is not None:
                raise ValueError("flash_attn_varlen_func: score_mod with softcap or "
                                 "alibi_slopes: write them in score_mod, where their order is "
                                 "said")
            mods = flex._trace_score(score_mod)
            if any(m["kind"] == "mask" for m in mods):
                raise ValueError("flash_attn_varlen_func: a score_mod that masks with "
                                 "torch.where: write the condition in a block_mask's mask_mod")
            q, mods = flex._head_factors(q, mods, 1, q.size(1), "flash_attn_varlen_func")
            chain = flex._Chain(mods, cu_q.numel() - 1, q.size(1), max_q, max_kv) \
                if mods else None
        if not _runs_block_maps():
            raise AttnError("ATTN_ERR_UNSUPPORTED",
                            f"flash_attn_varlen_func: this libattn ({_lib.path}) runs no "
                            "attention with a block map and score modifiers (no flex backend)")
    spec = _flash_spec("varlen", q, q.size(1), dropout_p, softmax_scale, causal, window_size,
                       softcap, alibi_slopes, cu_q=cu_q, cu_kv=cu_kv, max_q=max_q,
                       max_kv=max_kv, block_mask=block_mask, chain=chain)
    if q.size(0) == 0 or k.size(0) == 0:
        return _finish(_no_rows_or_keys(q, k, v, (q.size(1), q.size(0)), return_attn_probs),
                       dtype, return_attn_probs)
    return _finish(_attend(spec, q, k, v, return_lse=return_attn_probs), dtype,
                   return_attn_probs)


# ---- patching torch.nn.functional ------------------------------------------------------

_MISSING = object()
_saved = []  # the attribute each patch() replaced, innermost last


def is_patched():
    """True while F.scaled_dot_product_attention is attn's."""
    return getattr(F, "scaled_dot_product_attention", None) is scaled_dot_product_attention


def patch():
    """Routes torch.nn.functional.scaled_dot_product_attention to attn (on
    torch < 2.0, which has none, adds it). Calls attn does not support go to
    PyTorch's. Undo with unpatch(); patched() is the same as a context
    manager."""
    _saved.append(getattr(F, "scaled_dot_product_attention", _MISSING))
    F.scaled_dot_product_attention = scaled_dot_product_attention


def unpatch():
    """Undoes the last patch(); without one, restores PyTorch's own."""
    previous = _saved.pop() if _saved else (_torch_sdpa or _MISSING)
    if previous is _MISSING:
        if hasattr(F, "scaled_dot_product_attention"):
            del F.scaled_dot_product_attention
    else:
        F.scaled_dot_product_attention = previous


class patched:
    """with attn.torch.patched(): ... runs F.scaled_dot_product_attention
    on attn inside the block."""

    def __enter__(self):
        patch()
        return self

    def __exit__(self, *exc):
        unpatch()
        return False


# ---- PyTorch's FlexAttention (attn.flex) ---------------------------------------------

from .flex import (AuxOutput, AuxRequest, BlockMask, and_masks,  # noqa: E402
                   create_block_mask, create_mask, flex_attention, noop_mask, or_masks,
                   t5_relative_bucket)

__all__ += ["flex_attention", "create_block_mask", "create_mask", "BlockMask", "AuxRequest",
            "AuxOutput", "and_masks", "or_masks", "noop_mask", "t5_relative_bucket"]
