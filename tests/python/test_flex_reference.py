"""The reference backend on programmable attention (block masks and score
modifiers, attn.h) against PyTorch float64 autograd.

    test_flex_reference.py LIBATTN [SEED]

For each case (a block mask and a chain of score modifiers) and each
precision:
  attn     attn_sdpa_forward_f64 / _backward_f64 on float64 tensors, and
           attn_sdpa_forward / _backward on float32 tensors through a ctx of
           the reference kernels (ATTN_KERNELS_REFERENCE), out and lse of the
           forward fed to the backward.
  oracle   the dense masked softmax in float64 on the same inputs (float32
           ones widened exactly): s = q k^T * scale, the chain in torch,
           masked_fill(-inf) by the dense mask the block mask was built from
           (AND causal where the call is causal), softmax, a row that sees
           no key -> 0, @ v; out, lse and, by autograd for a random dout,
           dq, dk, dv and the gradients of the bias tensors and T5 tables.
           T5's buckets are Hugging Face's own T5Attention
           ._relative_position_bucket. A callback sees float copies of the
           scores (attn_score_tile), so the oracle rounds its input to
           float32 and runs the same float32 function on it.
Checked: relative L2 error (||x - oracle|| / ||oracle||) of every tensor
within 1e-10 for float64 (the float tensor_grad of a float64 problem: each
element the float64 sum rounded once, within half a float ulp), and within
1e-5 (or 2x PyTorch float32's own error on the same case) for float32; rows that see nothing give out 0 and
lse -inf in both; a wrong bucket, a wrong mask bit, a missing broadcast sum
changes a tensor far past these bounds.
Then the refusals of the public calls, each message checked for the values
it names (the runner's own: tests/unit/test_flex_runner.c).

Fresh random inputs each run; the seed is printed (argv[2] or ATTN_TEST_SEED
replays it).
"""
import ctypes
import math
import os
import random
import sys
from ctypes import CFUNCTYPE, POINTER, Structure, c_bool, c_double, c_float, c_int, c_int32, \
    c_int64, c_longlong, c_size_t, c_uint8, c_void_p

import numpy as np
import torch

sys.dont_write_bytecode = True
KERNELS_REFERENCE = 1
SCALE, SOFTCAP, ALIBI, BIAS, REL_BIAS, CALLBACK, REL_TABLE = 1, 2, 3, 4, 5, 6, 7
ERR_NULL, ERR_SHAPE, ERR_INVALID, ERR_UNSUPPORTED = None, None, None, None
F32P, I32P, F64P = POINTER(c_float), POINTER(c_int32), POINTER(c_double)


class CtxConfig(Structure):  # attn_ctx_config
    _fields_ = [("num_threads", c_size_t), ("trace", c_void_p), ("trace_user", c_void_p),
                ("kernels", c_int), ("trace_shapes_only", c_bool)]


class ScoreTile(Structure):  # attn_score_tile
    _fields_ = [("b", c_size_t), ("h", c_size_t), ("q0", c_size_t), ("kv0", c_size_t),
                ("rows", c_size_t), ("cols", c_size_t), ("ld", c_size_t), ("scores", F32P)]


SCORE_FN = CFUNCTYPE(c_int, c_void_p, POINTER(ScoreTile))
SCORE_GRAD_FN = CFUNCTYPE(c_int, c_void_p, POINTER(ScoreTile), F32P)


class ScoreMod(Structure):  # attn_score_mod
    _fields_ = [("kind", c_int), ("value", c_double), ("tensor", F32P), ("tensor_grad", F32P),
                ("strides", c_size_t * 4), ("offset", c_int64), ("signed_distance", c_bool),
                ("buckets", c_size_t), ("max_distance", c_size_t), ("bidirectional", c_bool),
                ("fn", SCORE_FN), ("grad_fn", SCORE_GRAD_FN), ("user", c_void_p)]


class BlockMaskConfig(Structure):  # attn_block_mask_config
    _fields_ = [("batch", c_size_t), ("heads", c_size_t), ("q_len", c_size_t),
                ("kv_len", c_size_t), ("block_q", c_size_t), ("block_kv", c_size_t)]


class SdpaConfig(Structure):  # attn_sdpa_config
    _fields_ = [
        ("batch", c_size_t), ("heads", c_size_t), ("q_tokens", c_size_t),
        ("kv_tokens", c_size_t), ("head_dim", c_size_t),
        ("q_strides", c_size_t * 3), ("kv_strides", c_size_t * 3),
        ("out_strides", c_size_t * 3), ("scale", c_double), ("causal", c_bool),
        ("dropout", c_double),
        ("kv_heads", c_size_t), ("v_head_dim", c_size_t), ("v_strides", c_size_t * 3),
        ("align", c_int), ("q_offset", c_longlong), ("window", c_bool),
        ("window_left", c_longlong), ("window_right", c_longlong), ("softcap", c_double),
        ("alibi_slopes", F32P), ("sinks", F32P), ("sinks_grad", F32P),
        ("cu_seqlens_q", I32P), ("cu_seqlens_kv", I32P),
        ("block_mask", c_void_p), ("score_mods", POINTER(ScoreMod)),
        ("score_mod_count", c_size_t)]


def fptr(t, kind=c_float):
    return ctypes.cast(ctypes.c_void_p(t.data_ptr()), POINTER(kind))


class Lib:
    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(path)
        lib.attn_ctx_new.argtypes = [POINTER(CtxConfig), POINTER(c_void_p)]
        lib.attn_ctx_free.argtypes = [c_void_p]
        lib.attn_ctx_last_error.restype = ctypes.c_char_p
        lib.attn_ctx_last_error.argtypes = [c_void_p]
        for name, real in (("attn_sdpa_forward", c_float), ("attn_sdpa_forward_f64", c_double)):
            getattr(lib, name).argtypes = [c_void_p, POINTER(SdpaConfig)] + \
                [POINTER(real)] * 5 + [c_void_p, c_void_p]
        for name, real in (("attn_sdpa_backward", c_float), ("attn_sdpa_backward_f64", c_double)):
            getattr(lib, name).argtypes = [c_void_p, POINTER(SdpaConfig)] + \
                [POINTER(real)] * 9 + [c_void_p]
        lib.attn_block_mask_from_bool.argtypes = [c_void_p, POINTER(BlockMaskConfig),
                                                  POINTER(c_uint8), POINTER(c_size_t),
                                                  POINTER(c_void_p)]
        lib.attn_block_mask_from_additive.argtypes = [c_void_p, POINTER(BlockMaskConfig), F32P,
                                                      POINTER(c_size_t), POINTER(c_void_p)]
        lib.attn_block_mask_free.argtypes = [c_void_p]
        lib.attn_status_name.restype = ctypes.c_char_p
        # the reference: float64 always; float32 on a ctx of the reference kernels
        self.ctx = self.new_ctx(2, KERNELS_REFERENCE)

    def new_ctx(self, threads, kernels):
        ctx = c_void_p()
        self.check(self.lib.attn_ctx_new(ctypes.byref(CtxConfig(num_threads=threads,
                                                                kernels=kernels)),
                                         ctypes.byref(ctx)), "attn_ctx_new", None)
        return ctx

    def error(self, ctx=None):
        return self.lib.attn_ctx_last_error(ctx or self.ctx).decode()

    def check(self, status, what, ctx=-1):
        if status:
            raise RuntimeError(f"{what}: status {status}: "
                               f"{self.error(None if ctx == -1 else ctx) if ctx else ''}")


FAILURES = []


def expect(ok, message):
    if not ok:
        FAILURES.append(message)
        print("FAIL: " + message)


def rel(x, truth):
    x, truth = x.double(), truth.double()
    norm = truth.norm()
    if norm == 0:
        return float(x.norm())
    return float((x - truth).norm() / norm)


# ---- Hugging Face's T5 buckets (the oracle of REL_BIAS) ---------------------

def t5_bucket_fn():
    from transformers.models.t5.modeling_t5 import T5Attention
    return T5Attention._relative_position_bucket


# ---- a case: shapes, a mask, a chain ---------------------------------------

class Case:
    """B, H, HKV, T, S, D; mask: (B|1, H|1, T, S) bool; strides of the mask
    as attn reads it; mods: a list of dicts (the chain); causal."""

    def __init__(self, name, B, H, HKV, T, S, D, causal=False, block=(0, 0)):
        self.name, self.B, self.H, self.HKV, self.T, self.S, self.D = name, B, H, HKV, T, S, D
        self.causal, self.block = causal, block
        self.mask = None          # dense bool the block mask was built from
        self.mask_source = None   # ("bool", uint8 tensor, strides, mb, mh) | ("additive", ...)
        self.mods = []

    def visible(self):
        """(B, H, T, S) bool: the block mask AND causal (top? bottom-right)."""
        B, H, T, S = self.B, self.H, self.T, self.S
        vis = torch.ones(B, H, T, S, dtype=torch.bool)
        if self.mask is not None:
            vis = vis & self.mask.expand(B, H, T, S)
        if self.causal:
            i = torch.arange(T).view(T, 1)
            j = torch.arange(S).view(1, S)
            vis = vis & (j <= i + (S - T))  # attn's default align: bottom-right
        return vis


def bias_index(B, H, T, S, strides):
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(H).view(1, H, 1, 1)
    i = torch.arange(T).view(1, 1, T, 1)
    j = torch.arange(S).view(1, 1, 1, S)
    return b * strides[0] + h * strides[1] + i * strides[2] + j * strides[3]


def callback_f32(t, b, h, i, j):
    """The CALLBACK modifier on float32 scores t at (b, h, i, j): float32
    arithmetic, the same in numpy (attn's tiles) and torch (the oracle)."""
    return t * np.float32(0.75) + (0.01 * (j - i) + 0.1 * h + 0.05 * b).astype(np.float32)


def oracle_chain(case, x, mods, leaves, bucket_fn):
    """The chain in torch on x (B, H, T, S) float64 (float32 for torch's
    own float32 run); leaves: the mods' differentiable tensors."""
    B, H, T, S = case.B, case.H, case.T, case.S
    i = torch.arange(T).view(T, 1)
    j = torch.arange(S).view(1, S)
    s = x
    for m, leaf in zip(mods, leaves):
        kind = m["kind"]
        if kind == SCALE:
            s = s * m["value"]
        elif kind == SOFTCAP:
            s = m["value"] * torch.tanh(s / m["value"])
        elif kind == ALIBI:
            slopes = leaf.view(1, H, 1, 1)
            dist = (j - i - m.get("offset", 0)).to(s.dtype)
            s = s + slopes * dist if m.get("signed", False) else s - slopes * dist.abs()
        elif kind == BIAS:
            idx = bias_index(B, H, T, S, m["strides"])
            s = s + leaf.view(-1)[idx]
        elif kind == REL_BIAS:
            buckets = bucket_fn(j - i, bidirectional=m["bidirectional"],
                                num_buckets=m["buckets"], max_distance=m["max_distance"])
            s = s + leaf[:, buckets].unsqueeze(0)
        elif kind == REL_TABLE:
            # leaf[h, e], e = i - j + offset (j - i + offset signed), as PyTorch's
            # indexing reads it: a negative e from the row's end
            e = (j - i if m.get("signed", False) else i - j) + m.get("offset", 0)
            s = s + leaf[:, e].unsqueeze(0)
        elif kind == CALLBACK:
            t = s.float()
            b_ = torch.arange(B).view(B, 1, 1, 1)
            h_ = torch.arange(H).view(1, H, 1, 1)
            off = (0.01 * (j - i).double() + 0.1 * h_.double() + 0.05 * b_.double()).float()
            s = (t * 0.75 + off).to(x.dtype)
    return s


def oracle(case, q, k, v, dout, dtype):
    """out, lse, dq, dk, dv, [grads of the mods' tensors] in dtype by autograd
    on the dense masked softmax; q (B, T, H, D) as attn's layout."""
    B, H, HKV, T, S, D = case.B, case.H, case.HKV, case.T, case.S, case.D
    q, k, v = (t.detach().to(dtype).permute(0, 2, 1, 3).clone().requires_grad_()
               for t in (q, k, v))
    leaves = []
    for m in case.mods:
        if m["kind"] in (BIAS, REL_BIAS, REL_TABLE):
            leaves.append(m["tensor"].detach().to(dtype).clone().requires_grad_())
        elif m["kind"] == ALIBI:
            leaves.append(m["tensor"].detach().to(dtype))
        else:
            leaves.append(None)
    g = H // HKV
    kk, vv = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    x = (q @ kk.transpose(-2, -1)) * (1.0 / math.sqrt(D))
    s = oracle_chain(case, x, case.mods, leaves, case.bucket_fn)
    vis = case.visible()
    any_row = vis.any(-1, keepdim=True)
    masked = s.masked_fill(~vis, float("-inf"))
    lse = torch.logsumexp(masked, -1)
    p = torch.softmax(torch.where(any_row, masked, torch.zeros_like(masked)), -1) * any_row
    out = p @ vv
    out.backward(dout.to(dtype).permute(0, 2, 1, 3))
    grads = [leaf.grad for leaf in leaves if leaf is not None and leaf.requires_grad]
    return (out.detach().permute(0, 2, 1, 3), lse.detach(), q.grad.permute(0, 2, 1, 3),
            k.grad.permute(0, 2, 1, 3), v.grad.permute(0, 2, 1, 3), grads)


# ---- running attn ------------------------------------------------------------

def build_block_mask(L, case):
    if case.mask_source is None:
        return None
    kind, data, strides, mb, mh = case.mask_source
    cfg = BlockMaskConfig(batch=mb, heads=mh, q_len=case.T, kv_len=case.S,
                          block_q=case.block[0], block_kv=case.block[1])
    st = (c_size_t * 4)(*strides)
    out = c_void_p()
    if kind == "bool":
        L.check(L.lib.attn_block_mask_from_bool(L.ctx, ctypes.byref(cfg), fptr(data, c_uint8),
                                                st, ctypes.byref(out)), "attn_block_mask_from_bool")
    else:
        L.check(L.lib.attn_block_mask_from_additive(L.ctx, ctypes.byref(cfg), fptr(data), st,
                                                    ctypes.byref(out)),
                "attn_block_mask_from_additive")
    return out


def c_mods(case, keep):
    """The chain as attn_score_mod structs; keep holds what must outlive the
    calls (callbacks, tensors); returns (array, grads by mod index)."""
    arr = (ScoreMod * len(case.mods))()
    grads = {}
    for n, m in enumerate(case.mods):
        c = arr[n]
        c.kind = m["kind"]
        c.value = m.get("value", 0.0)
        if "tensor" in m:
            t = m["tensor"].float().contiguous()
            keep.append(t)
            c.tensor = fptr(t)
            if m["kind"] in (BIAS, REL_BIAS, REL_TABLE) and m.get("grad", True):
                g = torch.full_like(t, float("nan"))  # written where read; checked below
                keep.append(g)
                c.tensor_grad = fptr(g)
                grads[n] = g
        if m["kind"] == BIAS:
            c.strides = (c_size_t * 4)(*m["strides"])
        c.offset = m.get("offset", 0)
        c.signed_distance = m.get("signed", False)
        c.buckets = m.get("buckets", 0)
        c.max_distance = m.get("max_distance", 0)
        c.bidirectional = m.get("bidirectional", False)
        if m["kind"] == CALLBACK:
            c.fn, c.grad_fn = CALLBACK_FN, CALLBACK_GRAD_FN
    return arr, grads


def tile_arrays(tile, grad=None):
    t = tile.contents
    n = t.rows * t.ld
    scores = np.ctypeslib.as_array(t.scores, shape=(n,)).reshape(t.rows, t.ld)[:, :t.cols]
    g = None
    if grad:
        g = np.ctypeslib.as_array(grad, shape=(n,)).reshape(t.rows, t.ld)[:, :t.cols]
    i = (t.q0 + np.arange(t.rows)).reshape(-1, 1).astype(np.float64)
    j = (t.kv0 + np.arange(t.cols)).reshape(1, -1).astype(np.float64)
    return t, scores, g, i, j


@SCORE_FN
def CALLBACK_FN(user, tile):
    t, scores, _, i, j = tile_arrays(tile)
    scores[...] = callback_f32(scores, float(t.b), float(t.h), i, j)
    return 0


@SCORE_GRAD_FN
def CALLBACK_GRAD_FN(user, tile, grad):
    _, _, g, _, _ = tile_arrays(tile, grad)
    g[...] = g * np.float32(0.75)
    return 0


def run_attn(L, case, q, k, v, dout, f64):
    B, H, HKV, T, S, D = case.B, case.H, case.HKV, case.T, case.S, case.D
    keep = []
    mask = build_block_mask(L, case)
    mods, grads = c_mods(case, keep)
    cfg = SdpaConfig(batch=B, heads=H, kv_heads=HKV, q_tokens=T, kv_tokens=S, head_dim=D,
                     causal=case.causal, block_mask=mask, score_mods=mods,
                     score_mod_count=len(case.mods))
    real, sfx = (c_double, "_f64") if f64 else (c_float, "")
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=q.dtype)
    try:
        L.check(getattr(L.lib, "attn_sdpa_forward" + sfx)(
            L.ctx, ctypes.byref(cfg), fptr(q, real), fptr(k, real), fptr(v, real),
            fptr(out, real), fptr(lse, real), None, None), "attn_sdpa_forward" + sfx)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        L.check(getattr(L.lib, "attn_sdpa_backward" + sfx)(
            L.ctx, ctypes.byref(cfg), fptr(q, real), fptr(k, real), fptr(v, real),
            fptr(out, real), fptr(lse, real), fptr(dout, real), fptr(dq, real), fptr(dk, real),
            fptr(dv, real), None), "attn_sdpa_backward" + sfx)
    finally:
        if mask is not None:
            L.lib.attn_block_mask_free(mask)
    return out, lse, dq, dk, dv, [grads[n] for n in sorted(grads)]


def compare(case, what, got, truth, bound, torch32=None):
    err = rel(got, truth)
    limit = bound if torch32 is None else max(bound, 2 * rel(torch32, truth))
    print(f"  {case.name:<28} {what:<12} rel err {err:.2e} (bound {limit:.1e})")
    expect(err <= limit, f"{case.name}: {what} rel err {err:.3e} > {limit:.1e}")


def check_rounded_once(case, what, got, truth):
    """tensor_grad is float: a float64 problem sums in double and rounds
    once, so each element is within half a float ulp of the exact sum
    (plus 1e-10 of the largest for the sums' own rounding)."""
    truth = truth.reshape(-1).double()
    got = got.reshape(-1).double()
    half_ulp = torch.tensor(np.spacing(np.abs(truth.float().numpy())), dtype=torch.float64) / 2
    slack = half_ulp + 1e-10 * float(truth.abs().max())
    worst = float(((got - truth).abs() / slack).max())
    print(f"  {case.name:<28} {what:<12} worst |err| / (half ulp + 1e-10 max) {worst:.2f}")
    expect(worst <= 1.0, f"{case.name}: {what} is not the float64 sum rounded once "
                          f"(worst {worst:.3g} x half an ulp)")


def check_case(L, case, seed_gen):
    vis = case.visible()
    empty = ~vis.any(-1)  # (B, H, T)
    for f64 in (True, False):
        dtype = torch.float64 if f64 else torch.float32
        g = torch.Generator().manual_seed(seed_gen.randrange(2 ** 62))
        B, H, HKV, T, S, D = case.B, case.H, case.HKV, case.T, case.S, case.D
        q = torch.randn(B, T, H, D, generator=g, dtype=torch.float64).to(dtype)
        k = torch.randn(B, S, HKV, D, generator=g, dtype=torch.float64).to(dtype)
        v = torch.randn(B, S, HKV, D, generator=g, dtype=torch.float64).to(dtype)
        dout = torch.randn(B, T, H, D, generator=g, dtype=torch.float64).to(dtype)
        got = run_attn(L, case, q, k, v, dout, f64)
        truth = oracle(case, q, k, v, dout, torch.float64)
        t32 = None if f64 else oracle(case, q, k, v, dout, torch.float32)
        tag = "f64" if f64 else "f32"
        bound = 1e-10 if f64 else 1e-5
        out, lse = got[0], got[1]
        # rows that see nothing: out exactly 0, lse -inf
        rows_out = out.permute(0, 2, 1, 3)[empty]
        expect(bool((rows_out == 0).all()), f"{case.name} {tag}: an empty row's out is not 0")
        expect(bool(torch.isneginf(lse[empty]).all()),
               f"{case.name} {tag}: an empty row's lse is not -inf")
        expect(bool(torch.isfinite(lse[~empty]).all()),
               f"{case.name} {tag}: a row that sees keys has a non-finite lse")
        if int(empty.sum()):
            print(f"  {case.name:<28} {tag} {int(empty.sum())} empty rows: out 0, lse -inf")
        names = ["out", "lse", "dq", "dk", "dv"]
        for n, name in enumerate(names):
            a, b_ = got[n], truth[n]
            if name == "lse":
                a, b_ = a[~empty], b_[~empty]
            compare(case, f"{tag} {name}", a, b_, bound,
                    None if t32 is None else (t32[n][~empty] if name == "lse" else t32[n]))
        mods_with_grad = [m for m in case.mods if m["kind"] in (BIAS, REL_BIAS, REL_TABLE)]
        for n, (m, a, b_) in enumerate(zip(mods_with_grad, got[5], truth[5])):
            name = "bias" if m["kind"] == BIAS else "table"
            if m["kind"] == BIAS:
                # elements no (b, h, i, j) reads stay as they were (NaN here)
                idx = bias_index(case.B, case.H, case.T, case.S, m["strides"]).unique()
                untouched = torch.ones(a.numel(), dtype=torch.bool)
                untouched[idx] = False
                expect(bool(torch.isnan(a.view(-1)[untouched]).all()),
                       f"{case.name} {tag}: bias grad written where no score reads the bias")
                a, b_ = a.view(-1)[idx], b_.view(-1)[idx]
            if f64:
                check_rounded_once(case, f"{tag} d{name}{n}", a, b_)
                continue
            compare(case, f"{tag} d{name}{n}", a, b_, bound,
                    None if t32 is None else t32[5][n].reshape(-1)[idx]
                    if m["kind"] == BIAS else t32[5][n])


# ---- the cases ----------------------------------------------------------------

def make_cases(rnd, bucket_fn):
    def randn(*shape):
        return torch.tensor(np.random.default_rng(rnd.randrange(2 ** 62))
                            .standard_normal(shape), dtype=torch.float32)

    def uniform(*shape):
        return torch.tensor(np.random.default_rng(rnd.randrange(2 ** 62)).random(shape))

    cases = []

    # dense random (B, H, T, S) mask, partial tiles (T, S not multiples of 16),
    # a few rows hidden whole; softcap after a scale
    c = Case("dense mask, scale+softcap", 2, 2, 2, 37, 45, 8, block=(16, 16))
    m = uniform(2, 2, 37, 45) < 0.6
    m[0, 1, 5] = False
    m[1, 0, 30:] = False
    c.mask = m
    c.mask_source = ("bool", m.to(torch.uint8).contiguous(), (2 * 37 * 45, 37 * 45, 45, 1), 2, 2)
    c.mods = [{"kind": SCALE, "value": 0.7}, {"kind": SOFTCAP, "value": 2.5}]
    cases.append(c)

    # key padding (B, S) broadcast over heads and queries (strides 0), one
    # sequence of length 0; GQA; ALiBi both forms
    B, T, S = 3, 20, 33
    lengths = [33, 17, 0]
    pad = torch.tensor([[j < n for j in range(S)] for n in lengths])
    c = Case("padding, GQA, alibi", B, 4, 2, T, S, 16, block=(16, 32))
    c.mask = pad.view(B, 1, 1, S)
    c.mask_source = ("bool", pad.to(torch.uint8).contiguous(), (S, 0, 0, 1), B, 1)
    c.mods = [{"kind": ALIBI, "tensor": uniform(4).float() * 0.5, "offset": 3},
              {"kind": ALIBI, "tensor": uniform(4).float() * 0.3, "offset": -2, "signed": True}]
    cases.append(c)

    # a (1, H, T, S) mask broadcast over the batch, ANDed with causal;
    # biases broadcast (over b; over h and i) with their gradients summed
    B, H, T, S = 2, 3, 24, 40
    hm = uniform(H, T, S) < 0.7
    c = Case("head mask+causal, biases", B, H, H, T, S, 8, causal=True, block=(16, 16))
    c.mask = hm.view(1, H, T, S)
    c.mask_source = ("bool", hm.to(torch.uint8).contiguous(), (0, T * S, S, 1), 1, H)
    c.mods = [{"kind": BIAS, "tensor": randn(H, T, S), "strides": (0, T * S, S, 1)},
              {"kind": SCALE, "value": 1.3},
              {"kind": BIAS, "tensor": randn(B, S), "strides": (S, 0, 0, 1)}]
    cases.append(c)

    # an additive mask: -inf hides, the finite values added by a BIAS over
    # the same tensor (its gradient too); a strided bias with gaps
    B, H, T, S = 2, 2, 19, 27
    add = randn(B, H, T, S)
    add[uniform(B, H, T, S) < 0.3] = float("-inf")
    add[1, 1, 4] = float("-inf")
    c = Case("additive mask as bias", B, H, H, T, S, 8, block=(16, 16))
    c.mask = torch.isfinite(add)
    c.mask_source = ("additive", add.contiguous(), (H * T * S, T * S, S, 1), B, H)
    finite = torch.where(torch.isfinite(add), add, torch.zeros_like(add))
    c.mods = [{"kind": BIAS, "tensor": finite, "strides": (H * T * S, T * S, S, 1)},
              {"kind": BIAS, "tensor": randn(2 * S + 3), "strides": (0, 0, 0, 2)}]
    cases.append(c)

    # T5's relative bias, bidirectional with the default shape of buckets
    # (16 halves, max_exact 8, max_distance 128 / 2): lengths past 64 reach
    # every bucket edge (8, 16, 32, 64) and the cap; softcap after it
    T = S = 72
    c = Case("T5 bidirectional", 1, 2, 2, T, S, 8)
    c.mods = [{"kind": REL_BIAS, "tensor": randn(2, 32), "buckets": 32, "max_distance": 64,
               "bidirectional": True},
              {"kind": SOFTCAP, "value": 4.0}]
    cases.append(c)

    # T5 unidirectional (the decoder's), causal, with a dense mask
    B, H, T, S = 1, 2, 50, 50
    dm = uniform(B, H, T, S) < 0.8
    c = Case("T5 causal, dense mask", B, H, 1, T, S, 8, causal=True, block=(32, 16))
    c.mask = dm
    c.mask_source = ("bool", dm.to(torch.uint8).contiguous(), (H * T * S, T * S, S, 1), B, H)
    c.mods = [{"kind": REL_BIAS, "tensor": randn(H, 12), "buckets": 12, "max_distance": 20,
               "bidirectional": False}]
    cases.append(c)

    # relative tables read directly: table[h, i - j + offset] (negative indices
    # from the row's end, as PyTorch's), and table[h, j - i + offset] under a
    # causal dense mask, each row just long enough
    B, H, T, S = 2, 3, 29, 41
    off = rnd.randint(-10, 10)
    n = max(S - 1 - off, T + off)
    c = Case("relative table", B, H, H, T, S, 8)
    c.mods = [{"kind": SCALE, "value": 0.8},
              {"kind": REL_TABLE, "tensor": randn(H, n), "buckets": n, "offset": off}]
    cases.append(c)
    B, H, T, S = 1, 2, 40, 40
    dm = uniform(B, H, T, S) < 0.85
    off = rnd.randint(-5, 5)
    n = max(T - 1 - off, S + off)
    c = Case("relative table kv - q, causal, dense mask", B, H, 1, T, S, 8, causal=True,
             block=(16, 32))
    c.mask = dm
    c.mask_source = ("bool", dm.to(torch.uint8).contiguous(), (H * T * S, T * S, S, 1), B, H)
    c.mods = [{"kind": REL_TABLE, "tensor": randn(H, n), "buckets": n, "offset": off,
               "signed": True},
              {"kind": SOFTCAP, "value": 6.0}]
    cases.append(c)

    # a Python callback between a scale and a softcap (float tiles)
    B, H, T, S = 2, 2, 21, 30
    dm = uniform(B, 1, T, S) < 0.7
    c = Case("callback chain", B, H, H, T, S, 8, block=(16, 16))
    c.mask = dm
    c.mask_source = ("bool", dm.to(torch.uint8).contiguous(), (T * S, 0, S, 1), B, 1)
    c.mods = [{"kind": SCALE, "value": 0.9}, {"kind": CALLBACK}, {"kind": SOFTCAP, "value": 3.0}]
    cases.append(c)

    # everything at once
    B, H, T, S = 2, 2, 33, 35
    dm = uniform(B, H, T, S) < 0.75
    c = Case("whole chain", B, H, 1, T, S, 8, causal=True, block=(16, 16))
    c.mask = dm
    c.mask_source = ("bool", dm.to(torch.uint8).contiguous(), (H * T * S, T * S, S, 1), B, H)
    c.mods = [{"kind": SCALE, "value": 1.1},
              {"kind": ALIBI, "tensor": uniform(H).float() * 0.2, "offset": 0},
              {"kind": BIAS, "tensor": randn(T, S), "strides": (0, 0, S, 1)},
              {"kind": REL_BIAS, "tensor": randn(H, 8), "buckets": 8, "max_distance": 16,
               "bidirectional": True},
              {"kind": CALLBACK},
              {"kind": SOFTCAP, "value": 5.0}]
    cases.append(c)
    for c in cases:
        c.bucket_fn = bucket_fn
    return cases


# ---- refusals ----------------------------------------------------------------

def check_refusals(L, rnd):
    B, H, T, S, D = 2, 2, 8, 8, 4
    q = torch.randn(B, T, H, D)
    out, lse = torch.empty_like(q), torch.empty(B, H, T)
    slopes = torch.rand(H)

    def forward(cfg):
        return L.lib.attn_sdpa_forward(L.ctx, ctypes.byref(cfg), fptr(q), fptr(q), fptr(q),
                                       fptr(out), fptr(lse), None, None)

    def refused(what, status, needles):
        msg = L.error()
        ok = status != 0 and all(n in msg for n in needles)
        print(f"  refused: {what}: {msg}")
        expect(ok, f"{what}: status {status}, message {msg!r} lacks {needles}")

    mods = (ScoreMod * 1)(ScoreMod(kind=SCALE, value=2.0))
    refused("chain with softcap",
            forward(SdpaConfig(batch=B, heads=H, q_tokens=T, kv_tokens=S, head_dim=D,
                               softcap=7.5, score_mods=mods, score_mod_count=1)),
            ["score_mods (1)", "softcap (7.5)"])
    refused("chain with alibi_slopes",
            forward(SdpaConfig(batch=B, heads=H, q_tokens=T, kv_tokens=S, head_dim=D,
                               alibi_slopes=fptr(slopes), score_mods=mods, score_mod_count=1)),
            ["score_mods (1)", "alibi_slopes (set)"])
    # a block mask of other lengths, another batch
    m = torch.ones(3, 1, 6, 8, dtype=torch.uint8)
    bm = c_void_p()
    L.check(L.lib.attn_block_mask_from_bool(
        L.ctx, ctypes.byref(BlockMaskConfig(batch=3, heads=1, q_len=6, kv_len=8)), fptr(m, c_uint8),
        (c_size_t * 4)(48, 0, 8, 1), ctypes.byref(bm)), "attn_block_mask_from_bool")
    try:
        refused("block mask of other shape",
                forward(SdpaConfig(batch=B, heads=H, q_tokens=T, kv_tokens=S, head_dim=D,
                                   block_mask=bm)),
                ["(batch 3, heads 1, q 6, kv 8)", "(2, 2, 8, 8)"])
    finally:
        L.lib.attn_block_mask_free(bm)
    # a relative table one element short of what the lengths reach
    table = torch.randn(H, T + S - 2)
    rel = (ScoreMod * 1)(ScoreMod(kind=REL_TABLE, tensor=fptr(table), buckets=T + S - 2,
                                  offset=S - 1))
    refused("a relative table too short",
            forward(SdpaConfig(batch=B, heads=H, q_tokens=T, kv_tokens=S, head_dim=D,
                               score_mods=rel, score_mod_count=1)),
            ["attn_sdpa_forward", "score_mods[0] (relative table) reads element",
             f"{T + S - 2} of rows of {T + S - 2}"])
    # a callback without grad_fn: the forward runs, the backward is refused
    cb = (ScoreMod * 1)(ScoreMod(kind=CALLBACK, fn=CALLBACK_FN))
    cfg = SdpaConfig(batch=B, heads=H, q_tokens=T, kv_tokens=S, head_dim=D, score_mods=cb,
                     score_mod_count=1)
    expect(forward(cfg) == 0, f"a callback without grad_fn: forward failed: {L.error()}")
    # dk and dv held by names: a temporary's memory may go to the next one, and the call then
    # (rightly) refuses outputs that overlap before it looks at the callback
    dq, dk, dv = torch.empty_like(q), torch.empty_like(q), torch.empty_like(q)
    status = L.lib.attn_sdpa_backward(L.ctx, ctypes.byref(cfg), fptr(q), fptr(q), fptr(q),
                                      fptr(out), fptr(lse), fptr(q), fptr(dq), fptr(dk),
                                      fptr(dv), None)
    refused("backward of a callback without grad_fn", status,
            ["attn_sdpa_backward", "score_mods[0] (callback) has no grad_fn"])

    # a callback that fails: ATTN_ERR_INVALID naming the modifier and the tile
    @SCORE_FN
    def failing(user, tile):
        return 1 if tile.contents.q0 == 5 and tile.contents.h == 1 else 0
    fail_mods = (ScoreMod * 2)(ScoreMod(kind=SCALE, value=1.0),
                               ScoreMod(kind=CALLBACK, fn=failing))
    cfg = SdpaConfig(batch=B, heads=H, q_tokens=T, kv_tokens=S, head_dim=D,
                     score_mods=fail_mods, score_mod_count=2)
    refused("a failing callback", forward(cfg),
            ["attn_sdpa_forward", "score_mods[1] (callback)", "head 1", "queries 5..5",
             "returned 1"])


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: test_flex_reference.py LIBATTN [SEED]")
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else int(
        os.environ.get("ATTN_TEST_SEED", random.SystemRandom().randrange(2 ** 31)))
    print(f"seed {seed} (replay: test_flex_reference.py LIBATTN {seed})")
    rnd = random.Random(seed)
    torch.manual_seed(seed)
    L = Lib(sys.argv[1])
    bucket_fn = t5_bucket_fn()
    for case in make_cases(rnd, bucket_fn):
        print(case.name)
        check_case(L, case, rnd)
    print("refusals")
    check_refusals(L, rnd)
    L.lib.attn_ctx_free(L.ctx)
    if FAILURES:
        print(f"{len(FAILURES)} failures (seed {seed})")
        sys.exit(1)
    print("all passed")


if __name__ == "__main__":
    main()
