#!/usr/bin/python3
"""Compares attn's tensor printing with PyTorch's print(tensor), byte for byte.

    /usr/bin/python3 tests/conformance/test_print_vs_torch.py PRINT_DRIVER [SEED] [COUNT]

PRINT_DRIVER is the built tests/conformance/print_driver.c. Each run draws
fresh random tensors (ranks 0-4; shapes that wrap lines, summarize, or are
empty; values that select int mode, sci mode, fixed mode; inf/-inf/nan,
negative zero, subnormals, rounding ties, and mixes), plus a fixed list of
edge cases, feeds each to the driver as raw little-endian float32, and
compares its stdout with str(t) + "\\n". Prints each mismatch, then
"N passed, N failed"; exits 1 on any failure. Pass SEED to replay a run.
"""
import os
import re
import subprocess
import sys

import numpy as np
import torch

DEFAULT_COUNT = 600


def expected(shape, arr):
    if arr.size == 0:
        # torch.empty also takes empty shapes too large for numpy
        return str(torch.empty(shape, dtype=torch.float32)) + "\n"
    return str(torch.from_numpy(arr)) + "\n"


def run_driver(driver, shape, arr):
    args = [driver, str(len(shape))] + [str(d) for d in shape]
    raw = np.array(arr, dtype="<f4", order="C").tobytes()
    proc = subprocess.run(args, input=raw, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        return None, "driver exited %d: %s" % (proc.returncode, proc.stderr.decode(errors="replace"))
    return proc.stdout.decode(errors="replace"), None


# ---- shapes ----

def random_shape(rng):
    kind = rng.choice(["small", "small", "wrap", "summarize", "empty", "one"])
    rank = int(rng.integers(0, 5))
    if kind == "small" or rank == 0:
        return tuple(int(rng.integers(1, 8)) for _ in range(rank))
    if kind == "one":
        return tuple(int(rng.choice([1, 1, 2, 7])) for _ in range(rank))
    if kind == "wrap":
        # a long last dim, total size under the summarization threshold
        last = int(rng.integers(8, 200))
        outer = [int(rng.integers(1, 4)) for _ in range(rank - 1)]
        while np.prod(outer + [last]) > 1000:
            last = max(1, last // 2)
        return tuple(outer + [last])
    if kind == "summarize":
        while True:
            if rank == 1:
                shape = (int(rng.integers(1001, 6000)),)
            else:
                shape = tuple(int(rng.choice([rng.integers(1, 8), rng.integers(7, 40)]))
                              for _ in range(rank))
            n = int(np.prod(shape))
            if 1000 < n <= 200000:
                return shape
            if n <= 1000:
                # grow the largest dim until past the threshold
                big = int(np.argmax(shape))
                s = list(shape)
                s[big] = s[big] * (1000 // n + 1)
                if np.prod(s) <= 200000:
                    return tuple(s)
    # empty: at least one zero dim
    shape = [int(rng.integers(0, 5)) for _ in range(rank)]
    shape[int(rng.integers(0, rank))] = 0
    return tuple(shape)


# ---- values ----

def random_values(rng, n):
    kind = rng.choice([
        "randn", "randn", "uniform", "int_small", "int_wide", "int_huge",
        "scaled", "tiny", "mixed_scale", "ties", "zeros", "subnormal", "extreme",
        "halves", "boundary",
    ])
    if kind == "randn":
        v = rng.standard_normal(n)
    elif kind == "uniform":
        v = rng.uniform(0, 2, n)
    elif kind == "int_small":
        v = rng.integers(-9, 10, n).astype(np.float64)
    elif kind == "int_wide":
        v = rng.integers(-5000, 5000, n).astype(np.float64)
    elif kind == "int_huge":
        v = np.round(rng.standard_normal(n) * 10.0 ** rng.integers(3, 12))
    elif kind == "scaled":
        v = rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 12)
    elif kind == "tiny":
        v = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, -3)
    elif kind == "mixed_scale":
        v = rng.standard_normal(n) * 10.0 ** rng.uniform(-6, 9, n)
    elif kind == "ties":
        # decimal ties for "{:.4f}" / "{:.4e}" (float32 rarely hits them exactly)
        v = (rng.integers(-20000, 20000, n) + 0.5) / 10000.0
    elif kind == "zeros":
        v = np.zeros(n)
    elif kind == "subnormal":
        v = rng.standard_normal(n) * 1e-42
    elif kind == "extreme":
        v = rng.choice([3.4e38, -3.4e38, 1.17549435e-38, 1e-45, 1.0, 65504.0], n)
    elif kind == "halves":
        v = rng.integers(-20, 20, n) / 2.0
    else:  # near the sci-mode boundaries: max 1e8, min 1e-4, ratio 1000
        v = rng.choice([1e8, 1.0000001e8, 99999992.0, 1e-4, 0.99999e-4, 1.0001e-4,
                        0.1, 100.0, 100.01, 1000.0, 1.0, 0.001, 0.0011], n)
    v = v.astype(np.float32)
    # sprinkle specials
    if n and rng.random() < 0.4:
        k = int(rng.integers(1, max(2, n // 5) + 1))
        idx = rng.integers(0, n, k)
        v[idx] = rng.choice(np.array([np.inf, -np.inf, np.nan, -0.0, 0.0,
                                      -np.nan], dtype=np.float32), k)
    if n and rng.random() < 0.15:
        v[:] = rng.choice(np.array([np.inf, -np.inf, np.nan, -0.0, 0.0], dtype=np.float32), n)
    if n and rng.random() < 0.15:
        mask = rng.random(n) < 0.5
        v[mask] = -0.0
    return v


def fixed_cases():
    f = np.float32
    inf, nan = np.inf, np.nan
    cases = [
        np.array([0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865], f),
        np.array(1.0, f),
        np.array(-0.0, f),
        np.array(nan, f),
        np.array(-inf, f),
        np.array(1e-5, f),
        np.array(123456789.0, f),
        np.zeros(0, f),
        np.zeros((0, 3), f),
        np.zeros((2, 0, 3), f),
        np.zeros((0, 1), f),
        np.zeros((3, 0), f),
        np.array([0.0, inf, -inf, nan], f),
        np.array([-0.0, 0.0], f),
        np.array([-0.0, 1.0, 2.0], f),
        np.array([-0.0, 0.5], f),
        np.array([0.2899, -inf], f),
        np.array([[0.2899, -inf], [-inf, -inf]], f),
        np.array([1e8, 1.0], f),
        np.array([1e8, 1e6], f),
        np.array([1.5e8, 1e6], f),
        np.array([1e-4, 1e-1], f),
        np.array([1000.0, 1.0], f),
        np.array([1001.0, 1.0], f),
        np.array([1000.5, 1.0], f),
        np.arange(2000, dtype=f),
        np.arange(1001, dtype=f),
        np.arange(1000, dtype=f),
        np.arange(7 * 11 * 13, dtype=f).reshape(7, 11, 13) / 7,
        np.arange(2 * 6 * 2, dtype=f).reshape(2, 6, 2) / 3,
        np.arange(100, dtype=f) / 3,
        np.full((6, 6), 2.0, f),
    ]
    big = np.arange(3 * 4 * 5 * 20, dtype=f).reshape(3, 4, 5, 20)
    cases.append(big)
    cases.append(-big / 1e5)
    cases = [(a.shape, a) for a in cases]
    # empty tensors whose "size=(...)" suffix sits around the 80-column limit
    for extra in range(0, 8):
        shape = (0, 10 ** 15, 10 ** 15, 10 ** 15) + ((10 ** extra,) if extra else ())
        cases.append((shape, np.zeros(0, f)))
    for digits in range(10, 19):
        shape = (2, 0, 10 ** digits, 10 ** digits, 7, 10 ** 9)
        cases.append((shape, np.zeros(0, f)))
    return cases


def main():
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    driver = sys.argv[1]
    seed = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else \
        int.from_bytes(os.urandom(8), "little")
    count = int(sys.argv[3]) if len(sys.argv) > 3 else DEFAULT_COUNT
    print("seed %d" % seed)
    rng = np.random.default_rng(seed)

    cases = fixed_cases()
    for _ in range(count):
        shape = random_shape(rng)
        n = int(np.prod(shape)) if shape else 1
        cases.append((shape, random_values(rng, n).reshape(shape)))

    passed = failed = 0
    coverage = dict.fromkeys(["summarized", "sci", "int", "fixed", "nonfinite", "-0",
                              "empty", "wrapped", "rank0", "rank3+"], 0)
    for i, (shape, arr) in enumerate(cases):
        shape = tuple(int(d) for d in shape)
        arr = np.array(arr, dtype=np.float32, order="C")
        want = expected(shape, arr)
        coverage["summarized"] += "..." in want
        coverage["sci"] += bool(re.search(r"\de[+-]\d", want))
        coverage["int"] += bool(re.search(r"\d\.(?!\d)", want))
        coverage["fixed"] += bool(re.search(r"\d\.\d{4}(?!e)", want))
        coverage["nonfinite"] += "inf" in want or "nan" in want
        coverage["-0"] += bool(re.search(r"-0\.(0000)?(?!\d)", want))
        coverage["empty"] += "[]" in want
        coverage["wrapped"] += len(shape) == 1 and "\n " in want
        coverage["rank0"] += len(shape) == 0
        coverage["rank3+"] += len(shape) >= 3
        got, err = run_driver(driver, shape, arr)
        if got == want:
            passed += 1
            continue
        failed += 1
        if failed <= 20:
            print("MISMATCH case %d shape %s" % (i, shape))
            if err:
                print("  " + err)
            else:
                print("--- torch:\n%s--- attn:\n%s---" % (want, got))
    print("coverage: " + ", ".join("%s %d" % kv for kv in coverage.items()))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
