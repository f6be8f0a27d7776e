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
    gpt2 module;
  - attn.torch: the attention cases through the PyTorch binding
    (attn.torch.scaled_dot_product_attention, torch tensors in and out,
    autograd for the backward) next to the same attn_sdpa_forward/_backward
    calls made directly on the same tensors (preallocated outputs, no
    autograd: the C API's own time), and PyTorch's SDPA with dropout 0.1:
    the binding's overhead, and what it gains over PyTorch in training.
    The two attn columns run alternately, run by run (--runs, at least 5).
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

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


def binding_setup(attn):
    """Imports attn.torch on the libattn beside the attn binary."""
    lib = os.path.join(os.path.dirname(os.path.abspath(attn)), "libattn.so")
    os.environ.setdefault("ATTN_LIBRARY", lib)
    import attn.torch as AT
    return AT


def alternate(fns, runs):
    """Medians of runs runs of each of fns, run alternately after a warm-up:
    [(wall seconds, process CPU seconds)] per fn. CPU time (all the
    process's threads) is what the binding adds even on a loaded machine,
    where wall times of single runs swing by tens of percent."""
    for fn in fns:
        fn()
    wall = [[] for _ in fns]
    cpu = [[] for _ in fns]
    for _ in range(runs):
        for w, c, fn in zip(wall, cpu, fns):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            w.append(time.perf_counter() - t0)
            c.append(time.process_time() - c0)
    return [(statistics.median(w), statistics.median(c)) for w, c in zip(wall, cpu)]


def binding_attention(AT, T, causal, dropout, runs):
    """Medians (wall, CPU) of the C API and of attn.torch, forward and
    forward+backward, and PyTorch's SDPA forward+backward (T <= 4096; None
    beyond), all alternating: the C API called through ctypes on
    preallocated torch tensors, the binding and PyTorch as a user calls them."""
    import ctypes
    q, k, v = (torch.randn(1, H, T, D) for _ in range(3))
    dout = torch.randn(1, H, T, D)
    spec = AT._Spec("bhtd", causal=causal, align=AT.ALIGN_TOP_LEFT, dropout=dropout)
    c = AT._context()
    cfg = AT._config(spec, q, k, v)
    out, lse = AT._alloc_out(spec, q, v, torch.float32)
    dout_c = torch.empty_like(out).copy_(dout)
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    drawn = AT.SdpaDropout()
    fwd_c, bwd_c = AT._forward[torch.float32], AT._backward[torch.float32]
    rng = c.rng if dropout > 0 else None
    dptr = ctypes.byref(drawn) if dropout > 0 else None

    def c_fwd(lse_ptr):
        c.check(fwd_c(c.handle, ctypes.byref(cfg), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                      out.data_ptr(), lse_ptr, rng, dptr), "forward")

    def c_fwd_bwd():
        c_fwd(lse.data_ptr())
        c.check(bwd_c(c.handle, ctypes.byref(cfg), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                      out.data_ptr(), lse.data_ptr(), dout_c.data_ptr(), dq.data_ptr(),
                      dk.data_ptr(), dv.data_ptr(), dptr), "backward")

    def b_fwd():
        with torch.no_grad():
            AT.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout)

    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

    def b_fwd_bwd():
        for t in (qg, kg, vg):
            t.grad = None
        AT.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                        dropout_p=dropout).backward(dout)

    def p_fwd_bwd():
        for t in (qg, kg, vg):
            t.grad = None
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                       dropout_p=dropout).backward(dout)

    r = max(1, runs if T < 16384 else 1)
    fwd = alternate([lambda: c_fwd(None), b_fwd], r)
    fb = alternate([c_fwd_bwd, b_fwd_bwd] + ([p_fwd_bwd] if T <= 4096 else []), r)
    return fwd[0], fwd[1], fb[0], fb[1], (fb[2] if T <= 4096 else None)


def binding_tables(a, thread_counts, tokens):
    AT = binding_setup(a.attn)
    runs = max(5, a.runs)
    print("\nattn.torch (the PyTorch binding), B=1 H=12 hd=64, fp32: median ms of %d runs, "
          "the columns of a row alternating run by run" % runs)
    print("  C: attn_sdpa_forward/_backward on the same torch tensors (ctypes, preallocated); "
          "torch: attn.torch.scaled_dot_product_attention (+ .backward()); PyTorch: its "
          "F.scaled_dot_product_attention (+ .backward())")
    print("  +%: the binding over the C API in wall time / in process CPU time; "
          "x: PyTorch / attn.torch, wall")
    print("%6s %-6s %3s %4s | %31s | %31s | %15s" % (
        "T", "mask", "thr", "drop", "forward: C   torch  +%wall +%cpu",
        "fwd+bwd: C   torch  +%wall +%cpu", "PyTorch f+b   x"))
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for T in tokens:
            for causal in (True, False):
                for dropout in (0.0, 0.1):
                    cf, bf, cfb, bfb, pfb = binding_attention(AT, T, causal, dropout, runs)
                    peer = ("%9.1f %5.2f" % (1e3 * pfb[0], pfb[0] / bfb[0])) if pfb else "%15s" % "-"
                    print("%6d %-6s %3d %4.1f | %7.1f %7.1f %+6.1f %+6.1f | %7.1f %7.1f %+6.1f %+6.1f | %s" % (
                        T, "causal" if causal else "none", threads, dropout,
                        1e3 * cf[0], 1e3 * bf[0], 100 * (bf[0] / cf[0] - 1), 100 * (bf[1] / cf[1] - 1),
                        1e3 * cfb[0], 1e3 * bfb[0], 100 * (bfb[0] / cfb[0] - 1),
                        100 * (bfb[1] / cfb[1] - 1), peer))
                    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("attn")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", default="1,%d" % os.cpu_count())
    ap.add_argument("--only-binding", action="store_true",
                    help="run the attn.torch table only")
    ap.add_argument("--tokens", default=None, help="T values of the attn.torch table")
    a = ap.parse_args()
    thread_counts = [int(t) for t in a.threads.split(",")]
    print("PyTorch %s (%s), flash attention for CPU: %s" % (
        torch.__version__, torch.__file__.rsplit("/", 2)[0],
        torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends.cpu, "get_cpu_capability") else "?"))
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())
    if a.only_binding:
        binding_tables(a, thread_counts, [int(t) for t in (a.tokens or "1024,4096").split(",")])
        print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())
        return
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
    binding_tables(a, thread_counts, [int(t) for t in a.tokens.split(",")] if a.tokens else
                   ([1024] if a.quick else [1024, 4096]))
    print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
