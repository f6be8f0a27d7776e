#!/usr/bin/python3
"""Times one GPT-2-small attention layer (C=768, 12 heads, causal) forward and
forward+backward: `attn forward` / `attn grad` as whole processes, and
PyTorch (this python's torch: Debian's 1.13, CPU float32) running the seed's
CausalSelfAttention in the same run, on the same threads.

    /usr/bin/python3 bench/gpt2_layer_grad.py path/to/attn [--tokens 1024] [--runs 3] [--threads N]

Prints the median wall time of each (attn's includes process start, reading
the .npy input and writing the outputs: a few ms), and the ratios.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "conformance"))
from seed_modules import CausalSelfAttention, GPTConfig  # noqa: E402


def median_time(fn, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("attn")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    C, H, T = 768, 12, a.tokens
    torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, T, C)).astype(np.float32)
    dy = rng.standard_normal((1, T, C)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        xp, dyp = os.path.join(tmp, "x.npy"), os.path.join(tmp, "dy.npy")
        np.save(xp, x)
        np.save(dyp, dy)
        common = ["--module", "gpt2", "--heads", str(H), "--input", xp, "--threads", str(a.threads)]
        fwd = [a.attn, "forward"] + common + ["--output", os.path.join(tmp, "y.npy")]
        grad = [a.attn, "grad"] + common + ["--grad-output", dyp, "--out", os.path.join(tmp, "g")]
        attn_fwd = median_time(lambda: subprocess.run(fwd, check=True), a.runs)
        attn_grad = median_time(lambda: subprocess.run(grad, check=True), a.runs)

    torch.manual_seed(123)
    m = CausalSelfAttention(GPTConfig(C, H, T))
    xt, dyt = torch.from_numpy(x), torch.from_numpy(dy)

    def torch_fwd():
        with torch.no_grad():
            m(xt)

    def torch_grad():
        m.zero_grad()
        xg = xt.clone().requires_grad_(True)
        m(xg).backward(dyt)

    torch_fwd()
    torch_grad()  # warm up
    t_fwd = median_time(torch_fwd, a.runs)
    t_grad = median_time(torch_grad, a.runs)
    print("GPT-2-small attention layer, B=1 T=%d C=%d heads=%d, %d threads, median of %d runs"
          % (T, C, H, a.threads, a.runs))
    print("torch %s (%s)" % (torch.__version__, torch.__file__))
    print("%-22s %12s %16s" % ("", "forward", "forward+backward"))
    print("%-22s %10.3f s %14.3f s" % ("attn (whole process)", attn_fwd, attn_grad))
    print("%-22s %10.3f s %14.3f s" % ("torch (in process)", t_fwd, t_grad))
    print("%-22s %11.1fx %15.1fx" % ("attn / torch", attn_fwd / t_fwd, attn_grad / t_grad))


if __name__ == "__main__":
    main()
