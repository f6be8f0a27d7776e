#!/usr/bin/env python3
"""attn next to PyTorch 2.15 (its CPU flash attention), in one run.

    .venv-peers/bin/python bench/peers.py path/to/attn [--quick] [--runs N] [--threads LIST]

Run by `make bench-peers`, which first sets up PyTorch 2.15 from PyPI in a
virtualenv of its own (scripts/setup-bench-peers.sh). For each case it runs
`attn bench` (the attention and layer sections) and PyTorch on the same
shapes and thread counts, one after the other, and prints both with the
ratio attn / PyTorch (below 1: attn is faster):
  - attention: F.scaled_dot_product_attention, B=1 H=12 hd=64, T=S in
    {256, 1024, 4096, 16384} (--quick: up to 1024), causal and not; forward
    and forward+backward; with dropout p = 0.1 in training mode too, where
    PyTorch leaves its flash kernel for the math path;
  - layer: PyTorch's GPT-2-small attention layer written the usual way
    (one nn.Linear for q, k, v, SDPA, the output nn.Linear) next to attn's
    gpt2 module.
Times are medians of --runs runs after a warm-up.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

H, D, C = 12, 64, 768


def median_time(fn, runs):
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def torch_attention(T, causal, dropout, runs):
    q, k, v = (torch.randn(1, H, T, D) for _ in range(3))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    dout = torch.randn(1, H, T, D)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout)

    def fwd_bwd():
        for t in (qg, kg, vg):
            t.grad = None
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, dropout_p=dropout).backward(dout)

    r = 1 if T >= 16384 else runs
    return median_time(fwd, r), median_time(fwd_bwd, r)


class TorchLayer(torch.nn.Module):
    """GPT-2-small attention as people write it with SDPA."""

    def __init__(self):
        super().__init__()
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


def torch_layer(T, runs):
    m = TorchLayer()
    x = torch.randn(1, T, C)
    xg = x.clone().requires_grad_(True)
    dy = torch.randn(1, T, C)

    def fwd():
        with torch.no_grad():
            m(x)

    def fwd_bwd():
        m.zero_grad()
        xg.grad = None
        m(xg).backward(dy)

    r = 1 if T >= 16384 else runs
    return median_time(fwd, r), median_time(fwd_bwd, r)


def attn_tables(attn, threads, quick, runs):
    """{(section, T, mask, threads): (fwd_s, fwd_bwd_s)} parsed from attn bench."""
    args = [attn, "bench", "--threads", threads, "--runs", str(runs)] + (["--quick"] if quick else [])
    out = {}
    for section in ("attention", "layer"):
        p = subprocess.run(args + ["--section", section], stdout=subprocess.PIPE, text=True, check=True)
        for line in p.stdout.splitlines():
            if section == "attention":
                m = re.match(r"\s*(\d+) (causal|none)\s+(\d+) \|\s+([\d.]+)\s+[\d.]+\s+[\d.]+ \|\s+([\d.]+)", line)
                if m:
                    out[(section, int(m[1]), m[2], int(m[3]))] = (float(m[4]) / 1e3, float(m[5]) / 1e3)
                m = re.match(r"\s*(\d+) (causal|none)\s+(\d+) \|.*\|.*\|\s+([\d.]+)\s+([\d.]+) \|", line)
                if m:
                    f, fb = out[(section, int(m[1]), m[2], int(m[3]))]
                    out[("dropout", int(m[1]), m[2], int(m[3]))] = (f * float(m[4]), fb * float(m[5]))
            else:
                m = re.match(r"\s*(\d+)\s+(\d+) \|\s+([\d.]+) \|\s+([\d.]+) \|", line)
                if m:
                    out[(section, int(m[1]), "causal", int(m[2]))] = (float(m[3]) / 1e3, float(m[4]) / 1e3)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("attn")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", default="1,%d" % os.cpu_count())
    a = ap.parse_args()
    thread_counts = [int(t) for t in a.threads.split(",")]
    print("PyTorch %s (%s), flash attention for CPU: %s" % (
        torch.__version__, torch.__file__.rsplit("/", 2)[0],
        torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends.cpu, "get_cpu_capability") else "?"))
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    ours = attn_tables(os.path.abspath(a.attn), a.threads, a.quick, a.runs)
    tokens = [256, 1024] if a.quick else [256, 1024, 4096, 16384]
    print("\nattention, B=1 H=12 hd=64: median ms (attn / PyTorch)")
    print("%6s %-6s %3s | %22s | %22s | %26s" % ("T", "mask", "thr", "forward", "forward+backward",
                                                 "dropout 0.1 fwd+bwd"))
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for T in tokens:
            for causal in (True, False):
                mask = "causal" if causal else "none"
                key = ("attention", T, mask, threads)
                if key not in ours:
                    continue
                tf, tfb = torch_attention(T, causal, 0.0, a.runs)
                cells = []
                for (of, ofb), (pf, pfb) in [(ours[key], (tf, tfb))]:
                    cells.append("%8.1f %8.1f %4.2f" % (1e3 * of, 1e3 * pf, of / pf))
                    cells.append("%8.1f %8.1f %4.2f" % (1e3 * ofb, 1e3 * pfb, ofb / pfb))
                if T <= 4096:
                    _, dfb = torch_attention(T, causal, 0.1, a.runs)
                    odfb = ours[("dropout", T, mask, threads)][1]
                    cells.append("%8.1f %8.1f %6.3f" % (1e3 * odfb, 1e3 * dfb, odfb / dfb))
                else:
                    cells.append("%26s" % "-")
                print("%6d %-6s %3d | %s | %s | %s" % (T, mask, threads, cells[0], cells[1], cells[2]))
                sys.stdout.flush()
    print("\nGPT-2-small attention layer (projections included), B=1: median ms (attn / PyTorch)")
    print("%6s %3s | %22s | %22s" % ("T", "thr", "forward", "forward+backward"))
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for T in ([1024] if a.quick else [1024, 4096, 16384]):
            key = ("layer", T, "causal", threads)
            if key not in ours:
                continue
            tf, tfb = torch_layer(T, a.runs)
            of, ofb = ours[key]
            print("%6d %3d | %8.1f %8.1f %4.2f | %8.1f %8.1f %4.2f" % (
                T, threads, 1e3 * of, 1e3 * tf, of / tf, 1e3 * ofb, 1e3 * tfb, ofb / tfb))
            sys.stdout.flush()
    print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
