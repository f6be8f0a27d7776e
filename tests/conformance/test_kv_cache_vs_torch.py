#!/usr/bin/python3
"""attn_kv_cache_attend against the book's attention with a KV cache, in
PyTorch float64.

    /usr/bin/python3 tests/conformance/test_kv_cache_vs_torch.py LIBATTN_SO [--seed N]

The oracle is the cache logic of the book's ch04 bonus code
(gpt_with_kv_swa.py's MultiHeadAttentionWithSWA.forward(use_cache=True),
with gpt_with_kv_gqa.py's repeat_interleave for grouped KV heads): keys and
values concatenated onto the cache, a window layer keeping W + T - 1 keys
for attention and W in its cache, absolute positions, the mask (diff < 0) |
(diff >= W), softmax(scores / sqrt(head_dim)). Its q, k and v are random
(the projections are outside the cache). One book module per sequence (the
book's cache is the same length for the whole batch), fed the same steps
as one ragged attn batch: prompts, idle sequences, decode steps and short
chunks, a chunk longer than the window.

attn runs each step on contiguous and paged caches (random page sizes), on
the reference kernels (within 1e-6: float32 rounding of the output) and the
fast ones (within 3e-5), on 1 and 3 threads; the layouts agree bit for bit.
Caches of other element types (attn.h: bf16, f16, fp8 e4m3, int8, int4,
for K and V apart) are held to the same oracle fed K and V as those
formats read back, coded here from attn.h's description (numpy float32
arithmetic, e4m3 by the nearest of its values): every new row attends
with its stored form, except a prompt into an empty cache on the fast
kernels, which attends in float32 and keeps its stored form.
Fresh random inputs each run; the seed is printed (--seed replays).
"""
import argparse
import ctypes
import os
import random
import sys
from ctypes import POINTER, Structure, c_double, c_float, c_int, c_size_t, c_void_p

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_ctypes import (ATTN_KERNELS_AUTO, ATTN_KERNELS_REFERENCE, F32P, Attn,  # noqa: E402
                         f32)

ATTN_KV_CONTIGUOUS, ATTN_KV_PAGED = 0, 1


class KvCacheConfig(Structure):
    _fields_ = [("num_layers", c_size_t), ("batch", c_size_t), ("kv_heads", c_size_t),
                ("head_dim", c_size_t), ("max_len", c_size_t), ("layout", c_int),
                ("page_size", c_size_t), ("num_pages", c_size_t),
                ("windows", POINTER(c_size_t)), ("k_dtype", c_int), ("v_dtype", c_int),
                ("values_are_keys", ctypes.c_bool)]


class KvAttendArgs(Structure):
    _fields_ = [("layer", c_size_t), ("new_lens", POINTER(c_size_t)), ("new_tokens", c_size_t),
                ("q_heads", c_size_t), ("scale", c_double), ("q", F32P), ("k_new", F32P),
                ("v_new", F32P), ("out", F32P), ("softcap", c_float), ("alibi_slopes", F32P),
                ("sinks", F32P), ("block_mask", c_void_p)]


class BookCachedAttention:
    """MultiHeadAttentionWithSWA.forward(use_cache=True) from q, k, v
    (b, T, heads, D) after the projections, float64, GQA by repeat_interleave."""

    def __init__(self, window):
        self.window = window
        self.cache_k = self.cache_v = None
        self.ptr_current_pos = 0

    def forward(self, queries, keys_new, values_new, keys_kept=None, values_kept=None):
        """keys_kept, values_kept: what the cache keeps of the new rows when
        it is not what they attend with (a quantised cache)."""
        num_tokens = queries.shape[1]
        old_len = 0 if self.cache_k is None else self.cache_k.size(1)
        kept_k = keys_new if keys_kept is None else keys_kept
        kept_v = values_new if values_kept is None else values_kept
        if self.cache_k is None:
            combined_k, combined_v = keys_new, values_new
            stored_k, stored_v = kept_k, kept_v
        else:
            combined_k = torch.cat([self.cache_k, keys_new], dim=1)
            combined_v = torch.cat([self.cache_v, values_new], dim=1)
            stored_k = torch.cat([self.cache_k, kept_k], dim=1)
            stored_v = torch.cat([self.cache_v, kept_v], dim=1)
        keys, values = combined_k, combined_v
        if self.window is not None:
            attn_keep = min(keys.size(1), self.window + num_tokens - 1)
            keys, values = keys[:, -attn_keep:], values[:, -attn_keep:]
            cache_keep = min(combined_k.size(1), self.window)
            self.cache_k, self.cache_v = stored_k[:, -cache_keep:], stored_v[:, -cache_keep:]
        else:
            self.cache_k, self.cache_v = stored_k, stored_v
        dropped = combined_k.size(1) - keys.size(1)
        k_start = (self.ptr_current_pos - old_len) + dropped
        q_start = self.ptr_current_pos

        group = queries.shape[2] // keys.shape[2]
        keys = keys.transpose(1, 2).repeat_interleave(group, dim=1)
        values = values.transpose(1, 2).repeat_interleave(group, dim=1)
        queries = queries.transpose(1, 2)
        attn_scores = queries @ keys.transpose(2, 3)
        num_tokens_K = keys.shape[-2]
        q_positions = torch.arange(q_start, q_start + num_tokens, dtype=torch.long)
        k_positions = torch.arange(k_start, k_start + num_tokens_K, dtype=torch.long)
        W = num_tokens_K + 1 if self.window is None else int(self.window)
        diff = q_positions.unsqueeze(-1) - k_positions.unsqueeze(0)
        mask_bool = (diff < 0) | (diff >= W)
        self.ptr_current_pos += num_tokens
        attn_scores.masked_fill_(mask_bool, -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return (attn_weights @ values).transpose(1, 2)  # (b, T, heads, D)


# attn_dtype's numbers of the KV cache's element types (attn.h)
KV_DTYPES = {"f32": 0, "f16": 1, "bf16": 2, "int8": 6, "fp8": 13, "int4": 15}


def e4m3_values():
    """The finite non-negative fp8 e4m3 values, by code 0..126."""
    vals = []
    for code in range(127):
        e, m = code >> 3, code & 7
        vals.append(m * 2.0 ** -9 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8))
    return np.array(vals)


E4M3 = e4m3_values()


def e4m3_nearest(y):
    """y (float32, |y| <= 448) to the nearest e4m3 value, ties to the even code."""
    a = np.minimum(np.abs(y.astype(np.float64)), 448.0)
    hi = np.clip(np.searchsorted(E4M3, a), 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    d_lo, d_hi = a - E4M3[lo], E4M3[hi] - a
    pick = np.where(d_hi < d_lo, hi, np.where(d_lo < d_hi, lo, np.where(hi % 2 == 0, hi, lo)))
    return np.sign(y) * E4M3[pick]


def scaled_codes(x32, top, group):
    """attn.h's scaled formats: per group of elements s = amax / top and
    codes of x * (top / amax), in float32 as the format says."""
    xs = x32.reshape(-1, group)
    amax = np.max(np.abs(xs), axis=1, keepdims=True).astype(np.float32)
    safe = np.where(amax > 0, amax, np.float32(1))
    inv = np.where(amax > 0, np.float32(top) / safe, np.float32(0)).astype(np.float32)
    return (xs * inv).astype(np.float32), (amax / np.float32(top)).astype(np.float32)


def stored(x, kind):
    """x (float64 holding float32 values, (..., D)) as a cache of element
    type kind reads it back, by the formats of attn.h."""
    if kind == "f32":
        return x
    if kind == "bf16":
        return x.float().to(torch.bfloat16).double()
    if kind == "f16":
        return x.float().half().double()
    x32 = x.numpy().astype(np.float32)
    top, group = {"int8": (127, x.shape[-1]), "fp8": (448, x.shape[-1]), "int4": (7, 32)}[kind]
    y, scale = scaled_codes(x32, top, group)
    codes = e4m3_nearest(y) if kind == "fp8" else np.clip(np.rint(y), -top, top)
    return torch.from_numpy((scale.astype(np.float64) * codes).reshape(x.shape))


class Cache:
    def __init__(self, A, lib, ctx, cfg):
        self.lib, self.ctx = lib, ctx
        self.ptr = c_void_p()
        A.check(lib.attn_kv_cache_new(ctx, ctypes.byref(cfg), ctypes.byref(self.ptr)), ctx,
                "attn_kv_cache_new")

    def attend(self, A, layer, new_lens, q_heads, q, k, v):
        lens = (c_size_t * len(new_lens))(*new_lens)
        q, qp = f32(q)
        k, kp = f32(k)
        v, vp = f32(v)
        out = np.empty(q.shape, dtype=np.float32)
        args = KvAttendArgs(layer, lens, 0, q_heads, 0.0, qp, kp, vp, out.ctypes.data_as(F32P))
        A.check(self.lib.attn_kv_cache_attend(self.ptr, ctypes.byref(args)), self.ctx,
                "attn_kv_cache_attend")
        return out


def run_case(A, lib, r, ctxs, case):
    kv_heads, group, D, windows, batch, steps, k_type, v_type = case
    H = kv_heads * group
    max_len = 400
    win = (c_size_t * len(windows))(*[w or 0 for w in windows])
    caches = []
    for name, ctx, reference in ctxs:
        for layout, page in ((ATTN_KV_CONTIGUOUS, 0), (ATTN_KV_PAGED, r.choice([1, 3, 8, 16]))):
            cfg = KvCacheConfig(len(windows), batch, kv_heads, D, max_len, layout, page, 0, win,
                                KV_DTYPES[k_type], KV_DTYPES[v_type])
            caches.append(("%s/%s" % (name, "paged%d" % page if layout else "contiguous"),
                           reference, Cache(A, lib, ctx, cfg)))
    # the oracle of the reference ctx and of the fast ones: they differ in a
    # prompt into an empty cache, which the fast kernels attend in float32
    books = {ref: [[BookCachedAttention(w) for _ in range(batch)] for w in windows]
             for ref in (True, False)}
    worst = {True: 0.0, False: 0.0}
    for new_lens in steps:
        for layer in range(len(windows)):
            rows = sum(new_lens)
            q = torch.randn(rows, H, D, dtype=torch.float64)
            k = torch.randn(rows, kv_heads, D, dtype=torch.float64)
            v = torch.randn(rows, kv_heads, D, dtype=torch.float64)
            # the float32 inputs attn receives are the oracle's inputs too
            q, k, v = (t.float().double() for t in (q, k, v))
            kq, vq = stored(k, k_type), stored(v, v_type)
            want = {}
            for ref in (True, False):
                parts, at = [], 0
                for s, n in enumerate(new_lens):
                    if n:
                        book = books[ref][layer][s]
                        sl = slice(at, at + n)
                        if not ref and book.ptr_current_pos == 0 and n >= 64:
                            y = book.forward(q[None, sl], k[None, sl], v[None, sl],
                                             kq[None, sl], vq[None, sl])
                        else:
                            y = book.forward(q[None, sl], kq[None, sl], vq[None, sl])
                        parts.append(y[0])
                    at += n
                want[ref] = torch.cat(parts).numpy() if parts else np.zeros((0, H, D))
            outs = {}
            for name, reference, cache in caches:
                got = cache.attend(A, layer, new_lens, H, q.numpy(), k.numpy(), v.numpy())
                err = float(np.max(np.abs(got - want[reference]))) if rows else 0.0
                worst[reference] = max(worst[reference], err)
                kernels = name.split("/")[0]
                if kernels in outs and not np.array_equal(outs[kernels][1], got):
                    print("FAIL: %s differs from %s" % (name, outs[kernels][0]))
                    return False
                outs.setdefault(kernels, (name, got))
    ok = worst[True] <= 1e-6 and worst[False] <= 3e-5
    print("%s kv_heads %d q_heads %d head_dim %d windows %s batch %d K %s V %s: worst "
          "|attn - torch| reference %.3g, fast %.3g" % (
              "ok  " if ok else "FAIL", kv_heads, H, D, windows, batch, k_type, v_type,
              worst[True], worst[False]))
    for _, _, cache in caches:
        lib.attn_kv_cache_free(cache.ptr)
    return ok


def random_steps(r, batch, long_prompt):
    steps = [[long_prompt if s == 0 else r.randrange(0, 30) for s in range(batch)]]
    for _ in range(10):
        steps.append([r.choice([0, 1, 1, 1, r.randrange(2, 12)]) for _ in range(batch)])
    steps.append([1] * batch)
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--seed", type=int)
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    print("seed %d (--seed to repeat)" % seed)
    r = random.Random(seed)
    torch.manual_seed(seed)
    A = Attn(a.lib)
    lib = A.lib
    lib.attn_kv_cache_new.restype = c_int
    lib.attn_kv_cache_new.argtypes = [c_void_p, POINTER(KvCacheConfig), POINTER(c_void_p)]
    lib.attn_kv_cache_attend.restype = c_int
    lib.attn_kv_cache_attend.argtypes = [c_void_p, POINTER(KvAttendArgs)]
    lib.attn_kv_cache_free.restype = None
    lib.attn_kv_cache_free.argtypes = [c_void_p]
    ctxs = [("reference", A.ctx_new(1, ATTN_KERNELS_REFERENCE), True),
            ("fast1", A.ctx_new(1, ATTN_KERNELS_AUTO), False),
            ("fast3", A.ctx_new(3, ATTN_KERNELS_AUTO), False)]
    cases = [
        # (kv_heads, group, head_dim, windows per layer, batch, steps)
        (2, 2, 16, [None, 8], 3, random_steps(r, 3, 100)),   # GQA, a prompt through the fused path
        (1, 4, 32, [None, 5], 2, random_steps(r, 2, 40)),    # MQA, a window shorter than chunks
        (4, 1, 64, [20, None], 1, random_steps(r, 1, 300)),  # MHA, one long sequence
        (8, 4, 128, [None], 1, random_steps(r, 1, 350)),     # Llama 3 8B's heads
    ]
    cases = [c + ("f32", "f32") for c in cases]
    # quantised caches: K and V of each type, two pairs drawn at random each run
    types = list(KV_DTYPES)
    pairs = [("bf16", "f16"), ("int8", "int4"), ("fp8", "int8"), ("int4", "fp8")]
    pairs += [(r.choice(types), r.choice(types)) for _ in range(2)]
    shapes = [(2, 2, 32, [None, 8], 2, 80), (1, 4, 64, [None], 1, 100), (2, 4, 128, [12], 2, 30)]
    for i, (kt, vt) in enumerate(pairs):
        kvh, grp, D, windows, batch, prompt = shapes[i % len(shapes)]
        cases.append((kvh, grp, D, windows, batch, random_steps(r, batch, prompt), kt, vt))
    ok = all([run_case(A, lib, r, ctxs, c) for c in cases])
    for _, ctx, _ in ctxs:
        A.ctx_free(ctx)
    print("kv_cache_vs_torch: %s" % ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
