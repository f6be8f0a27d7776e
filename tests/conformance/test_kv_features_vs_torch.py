#!/usr/bin/python3
"""attn_kv_cache_attend with softcap, ALiBi and sinks against PyTorch float64.

    /usr/bin/python3 tests/conformance/test_kv_features_vs_torch.py LIBATTN_SO [--seed N]

The oracle keeps every sequence's keys and values (float32 caches: exact)
and scores new token r of sequence s, at position p = length(s) + r,
against the positions max(0, p - W + 1) .. p it sees as attention_problem.h
says: s_j = c tanh(q . k_j * scale / c) - slope_h (p - j), then a softmax
over those scores and head h's sink, whose weight is dropped (gpt-oss's
sinks: torch.cat of the sink column, softmax, the column sliced off).
attn runs the steps (a prompt, which the fast kernels run fused, chunks,
single tokens, idle sequences; GQA; a window layer) with each modifier
alone and all three, on the reference ctx (within 5e-7: float32 rounding
of the output) and the fast one on 1 and 3 threads (within 1e-5, the same
bits on both).
Fresh random inputs each run; the seed is printed (--seed replays).
"""
import argparse
import ctypes
import os
import random
import sys
from ctypes import POINTER, c_int, c_size_t, c_void_p

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attn_ctypes import ATTN_KERNELS_AUTO, ATTN_KERNELS_REFERENCE, F32P, Attn, f32  # noqa: E402
from test_kv_cache_vs_torch import ATTN_KV_CONTIGUOUS, KvAttendArgs, KvCacheConfig  # noqa: E402


def oracle(q, keys, values, p0, window, scale, softcap, slopes, sinks):
    """Rows q (n, H, D) at positions p0 .. p0 + n - 1 against keys and values
    (L, KH, D) at positions 0 .. L - 1, float64: (n, H, D)."""
    n, H, _ = q.shape
    L, KH, _ = keys.shape
    k = keys.transpose(0, 1).repeat_interleave(H // KH, dim=0)    # (H, L, D)
    v = values.transpose(0, 1).repeat_interleave(H // KH, dim=0)
    s = q.transpose(0, 1) @ k.transpose(1, 2) * scale             # (H, n, L)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(p0, p0 + n, dtype=torch.float64)[:, None]
    dist = pos - torch.arange(L, dtype=torch.float64)[None, :]   # (n, L)
    if slopes is not None:
        s = s - slopes[:, None, None] * dist
    hidden = (dist < 0) | (dist >= window if window else torch.zeros_like(dist, dtype=torch.bool))
    s = s.masked_fill(hidden, -torch.inf)
    if sinks is not None:
        s = torch.cat([s, sinks[:, None, None].expand(H, n, 1)], dim=-1)
    w = torch.softmax(s, dim=-1)[..., :L]
    return (w @ v).transpose(0, 1)


def run_case(A, lib, r, ctxs, kv_heads, group, D, windows, steps, mods):
    H = kv_heads * group
    win = (c_size_t * len(windows))(*windows)
    caches = []
    for name, ctx, reference in ctxs:
        cfg = KvCacheConfig(len(windows), 2, kv_heads, D, 400, ATTN_KV_CONTIGUOUS, 0, 0, win, 0, 0)
        ptr = c_void_p()
        A.check(lib.attn_kv_cache_new(ctx, ctypes.byref(cfg), ctypes.byref(ptr)), ctx,
                "attn_kv_cache_new")
        caches.append((name, ctx, reference, ptr))
    softcap = mods.get("softcap", 0.0)
    slopes = mods.get("slopes")
    sinks = mods.get("sinks")
    scale = 0.1 + 0.3 * r.random()
    slopes_c = f32(slopes.numpy()) if slopes is not None else (None, None)
    sinks_c = f32(sinks.numpy()) if sinks is not None else (None, None)
    history = [[(torch.zeros(0, kv_heads, D, dtype=torch.float64),) * 2 for _ in range(2)]
               for _ in windows]
    worst = {True: 0.0, False: 0.0}
    ok = True
    for new_lens in steps:
        for layer, window in enumerate(windows):
            rows = sum(new_lens)
            q, k, v = (torch.randn(rows, h, D, dtype=torch.float64).float().double()
                       for h in (H, kv_heads, kv_heads))
            parts, at = [], 0
            for s, n in enumerate(new_lens):
                keys, values = history[layer][s]
                keys = torch.cat([keys, k[at:at + n]])
                values = torch.cat([values, v[at:at + n]])
                history[layer][s] = (keys, values)
                if n:
                    parts.append(oracle(q[at:at + n], keys, values, keys.shape[0] - n, window,
                                        scale, softcap, slopes, sinks))
                at += n
            want = torch.cat(parts).numpy() if parts else np.zeros((0, H, D))
            first = None
            for name, ctx, reference, ptr in caches:
                lens = (c_size_t * 2)(*new_lens)
                qa, qp = f32(q.numpy())
                _, kp = f32(k.numpy())
                _, vp = f32(v.numpy())
                out = np.empty(qa.shape, dtype=np.float32)
                args = KvAttendArgs(layer, lens, 0, H, scale, qp, kp, vp,
                                    out.ctypes.data_as(F32P), softcap, slopes_c[1], sinks_c[1])
                A.check(lib.attn_kv_cache_attend(ptr, ctypes.byref(args)), ctx, name)
                if rows:
                    worst[reference] = max(worst[reference], float(np.max(np.abs(out - want))))
                if not reference:
                    if first is not None and not np.array_equal(first, out):
                        print("FAIL: %s differs from the other fast ctx" % name)
                        ok = False
                    first = out
    ok = ok and worst[True] <= 5e-7 and worst[False] <= 1e-5
    print("%s kv_heads %d q_heads %d head_dim %d windows %s %s: worst |attn - torch| "
          "reference %.3g, fast %.3g" % ("ok  " if ok else "FAIL", kv_heads, H, D, windows,
                                         ", ".join(sorted(mods)) or "none", worst[True],
                                         worst[False]))
    for _, _, _, ptr in caches:
        lib.attn_kv_cache_free(ptr)
    return ok


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
    ok = True
    for kv_heads, group, D, prompt in ((2, 3, 32, 80), (1, 4, 64, 300)):
        H = kv_heads * group
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)],
                              dtype=torch.float32).double()
        sinks = (2 * torch.randn(H)).float().double()
        for mods in ({"softcap": 2.0 + 10 * r.random()}, {"slopes": slopes}, {"sinks": sinks},
                     {"softcap": 5.0, "slopes": slopes, "sinks": sinks}):
            if "softcap" in mods:
                mods["softcap"] = float(np.float32(mods["softcap"]))
            steps = [[prompt, r.randrange(1, 30)]]
            steps += [[r.choice([0, 1, 1, r.randrange(2, 12)]) for _ in range(2)]
                      for _ in range(8)]
            ok &= run_case(A, lib, r, ctxs, kv_heads, group, D, [0, 24], steps, mods)
    for _, ctx, _ in ctxs:
        A.ctx_free(ctx)
    print("kv_features_vs_torch: %s" % ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
