#!/usr/bin/env python3
"""attn forward|grad --context-parallel with ranks that disagree, or a bad input
on one rank only, launched MPMD (mpirun -np 1 A : -np 1 B, --tag-output): every
case must end with a non-zero exit, an error line from every rank (the same
message where the ranks disagree, naming both sides), no hang (each run under
a timeout) and no output file left behind. Then the same commands with every
rank alike must succeed, so that the cases cannot pass by failing everything.
Prints how many cases of each kind ran.

usage: test_mpi_hostile.py RUN_MPI_SH ATTN_OR_none
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

run_mpi, attn = sys.argv[1], sys.argv[2]
TIMEOUT = 60
failures = 0
counts = {}

if attn == "none":
    print("skipped: this build has no MPI (install Open MPI: scripts/install-deps.sh)")
    sys.exit(77)


def check(ok, what):
    global failures
    print(f"  {'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures += 1


def launch(ranks):
    """ranks: one argument list per rank (after `attn`). Returns (rc, lines per rank), rc None
    on a hang."""
    cmd = ["bash", run_mpi, "1", "--tag-output", attn, *ranks[0]]
    for args in ranks[1:]:
        cmd += [":", "-np", "1", attn, *args]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, {}
    lines = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = re.match(r"\[\d+,(\d+)\]<std(?:out|err)>:(.*)", line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return r.returncode, lines


def expect_failure(kind, what, ranks, needle=None, outputs=(), speakers=None):
    """Every rank (or those in speakers; "any": one rank at least) fails with an `attn:`
    line (each holding needle, when given); no hang; none of outputs exists."""
    counts[kind] = counts.get(kind, 0) + 1
    for path in outputs:
        if os.path.isdir(path):
            for f in os.listdir(path):
                os.remove(os.path.join(path, f))
            os.rmdir(path)
        elif os.path.exists(path):
            os.remove(path)
    rc, lines = launch(ranks)
    if rc is None:
        check(False, f"{what}: HANG (no exit within {TIMEOUT} s)")
        return
    errors = {k: [l for l in v if l.startswith("attn:")] for k, v in lines.items()}
    if speakers == "any":  # the first rank to refuse, whichever it is
        speakers = [k for k in range(len(ranks)) if errors.get(k)][:1] or [0]
    who = range(len(ranks)) if speakers is None else speakers
    every = all(errors.get(k) for k in who)
    said = every and (needle is None or all(any(needle in l for l in errors[k]) for k in who))
    left = [p for p in outputs if os.path.exists(p)]
    first = errors[who[0]][0] if errors.get(who[0]) else "(nothing)"
    check(rc != 0 and said and not left,
          f"{what}: exit {rc}, {'every rank said' if said else 'NOT every rank said'} "
          f"'{first.strip()[:150]}'{', left ' + str(left) if left else ''}")
    if not said:
        for k in range(len(ranks)):
            print(f"      rank {k}: {lines.get(k, [])[:4]}")


def swap(args, opt, value):
    """args with opt's value replaced."""
    i = args.index(opt)
    return [*args[:i + 1], value, *args[i + 2:]]


def expect_success(what, ranks, outputs):
    rc, lines = launch(ranks)
    ok = rc == 0 and all(os.path.exists(p) for p in outputs)
    check(ok, f"{what}: exit {rc}")
    if not ok:
        print(f"      {lines}")


with tempfile.TemporaryDirectory() as tmp:
    rng = np.random.default_rng(18)
    x = os.path.join(tmp, "x.npy")
    np.save(x, rng.standard_normal((2, 19, 24)).astype(np.float32))
    dy = os.path.join(tmp, "dy.npy")
    np.save(dy, rng.standard_normal((2, 19, 24)).astype(np.float32))
    y = os.path.join(tmp, "y.npy")
    g = os.path.join(tmp, "g")
    # MultiHeadAttention 24 -> 24, 4 heads: its state_dict, as two files that differ
    def save_file(tensors, path):
        """A safetensors file: the header's length, its JSON, the float32 data."""
        header, at = {}, 0
        for name, t in tensors.items():
            header[name] = {"dtype": "F32", "shape": list(t.shape),
                            "data_offsets": [at, at + t.nbytes]}
            at += t.nbytes
        text = json.dumps(header).encode()
        with open(path, "wb") as f:
            f.write(len(text).to_bytes(8, "little") + text)
            for t in tensors.values():
                f.write(np.ascontiguousarray(t, "<f4").tobytes())

    def weights(seed, shape=(24, 24)):
        r = np.random.default_rng(seed)
        tensors = {n: (r.standard_normal(shape) * 0.2).astype(np.float32)
                   for n in ("W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight")}
        tensors["out_proj.bias"] = (r.standard_normal(24) * 0.1).astype(np.float32)
        path = os.path.join(tmp, f"w{seed}_{shape[0]}.safetensors")
        save_file(tensors, path)
        return path

    w1, w2, w_bad_shape = weights(1), weights(2), weights(3, (24, 12))
    w_corrupt = os.path.join(tmp, "corrupt.safetensors")
    with open(w1, "rb") as f, open(w_corrupt, "wb") as out:
        out.write(f.read()[:100])
    base = ["--module", "mha", "--heads", "4", "--d-out", "24", "--input", x, "--threads", "1"]
    fwd = ["forward", *base, "--output", y]
    grad = ["grad", *base, "--grad-output", dy, "--out", g]

    print("ranks alike succeed")
    for mode in ("ring", "zigzag", "ulysses"):
        expect_success(f"forward {mode}", [fwd + ["--context-parallel", mode]] * 2, [y])
        expect_success(f"grad {mode}", [grad + ["--context-parallel", mode]] * 2, [g])
    expect_success("forward with the same weights file", [fwd + ["--context-parallel", "ring",
                                                                 "--weights", w1]] * 2, [y])

    print("a rank without --context-parallel")
    # (mpirun stops the job once the rank without it exits: rank 0 speaks)
    expect_failure("launch", "forward : forward --context-parallel ring",
                   [fwd, fwd + ["--context-parallel", "ring"]],
                   "started as one of 2 processes", [y], speakers=[0])
    # (both refuse at once, and mpirun stops the job when the first exits:
    # whichever that is speaks)
    expect_failure("launch", "forward : forward (no rank has it)", [fwd, fwd],
                   "without --context-parallel", [y], speakers="any")

    print("ranks that disagree on the mode or the command")
    modes = ("ring", "zigzag", "ulysses")
    for a in modes:
        for b in modes:
            if a != b:
                expect_failure("mode", f"forward {a} : {b}",
                               [fwd + ["--context-parallel", a], fwd + ["--context-parallel", b]],
                               f"the ranks disagree on the mode: rank 0 {a}, rank 1 {b}", [y])
    for mode in modes:
        expect_failure("command", f"forward : grad ({mode})",
                       [fwd + ["--context-parallel", mode], grad + ["--context-parallel", mode]],
                       "the ranks disagree on the call: rank 0 attn forward, rank 1 attn grad",
                       [y, g])
        expect_failure("command", f"grad : forward ({mode})",
                       [grad + ["--context-parallel", mode], fwd + ["--context-parallel", mode]],
                       "the ranks disagree on the call: rank 0 attn grad, rank 1 attn forward",
                       [y, g])

    # (the agreement does not depend on the mode: every option on ring, the
    # library's own checks on each mode)
    print("ranks that disagree on an option")
    options = [  # option, rank 1's extra arguments, the message
        ("--seed", ["--seed", "5"], "disagree on --seed: rank 0 123, rank 1 5"),
        ("--heads", ["--heads", "2"], "disagree on --heads: rank 0 4, rank 1 2"),
        ("--d-out", ["--d-out", "32"], "disagree on --d-out: rank 0 24, rank 1 32"),
        ("--qkv-bias", ["--qkv-bias"], "disagree on --qkv-bias: rank 0 0, rank 1 1"),
        ("--scale", ["--scale", "0.25"], "disagree on --scale: rank 0 0, rank 1 0.25"),
        ("--mask", ["--mask", "none"], "disagree on --mask"),
        ("--dropout", ["--dropout", "0.1"], "disagree on --dropout: rank 0 0, rank 1 0.10000000000000001"),
        ("--train", ["--train"], "disagree on --train: rank 0 0, rank 1 1"),
        ("--context", ["--context", "64"], "disagree on --context: rank 0 0, rank 1 64"),
        ("--d-in", ["--d-in", "24"], "disagree on --d-in: rank 0 0, rank 1 24"),
        ("--bernoulli", ["--bernoulli", "philox"], "disagree on --bernoulli"),
        ("--module", ["--module", "gpt2"], "disagree on --module: rank 0 mha, rank 1 gpt2"),
        ("--weights on one rank", ["--weights", w1], "disagree on --weights (given): rank 0 0, rank 1 1"),
    ]
    a = fwd + ["--context-parallel", "ring"]
    for name, extra, needle in options:
        b = [*a, *extra] if name != "--module" else \
            ["forward", "--module", "gpt2", "--heads", "4", "--input", x, "--threads", "1",
             "--output", y, "--context-parallel", "ring"]
        expect_failure("option", f"{name} (ring)", [a, b], needle, [y])
    for mode in modes:
        a = grad + ["--context-parallel", mode]
        expect_failure("option", f"grad --seed ({mode})", [a, [*a, "--seed", "9"]],
                       "disagree on --seed: rank 0 123, rank 1 9", [g])
        # different weights files: the option agrees, the library's checksum does not
        a = fwd + ["--context-parallel", mode]
        expect_failure("weights", f"two weights files ({mode})",
                       [a + ["--weights", w1], a + ["--weights", w2]],
                       "disagree on the weights' checksum", [y])

    print("a bad input on one rank only")
    for mode in modes:
        a = fwd + ["--context-parallel", mode]
        missing = os.path.join(tmp, "missing.safetensors")
        expect_failure("bad file", f"rank 1 cannot open its weights ({mode})",
                       [a + ["--weights", w1], a + ["--weights", missing]], None, [y])
        expect_failure("bad file", f"rank 1's weights file is truncated ({mode})",
                       [a + ["--weights", w1], a + ["--weights", w_corrupt]], None, [y])
        expect_failure("bad file", f"rank 1's weights have the wrong shape ({mode})",
                       [a + ["--weights", w1], a + ["--weights", w_bad_shape]], None, [y])
        expect_failure("bad file", f"rank 0 cannot open the input ({mode})",
                       [swap(a, "--input", os.path.join(tmp, "nope.npy")), a], None, [y])
        bad = os.path.join(tmp, "bad4d.npy")
        np.save(bad, np.zeros((1, 2, 3, 24), np.float32))
        expect_failure("bad shape", f"rank 0's input is 4-D ({mode})",
                       [swap(a, "--input", bad), a],
                       None, [y])
        expect_failure("bad shape", f"rank 0's --grad-output has the wrong shape ({mode})",
                       [swap(grad + ["--context-parallel", mode], "--grad-output", bad),
                        grad + ["--context-parallel", mode]],
                       None, [g])
        expect_failure("bad file", f"rank 0 cannot write the output ({mode})",
                       [swap(a, "--output", os.path.join(tmp, "no", "dir", "y.npy")), a], None, [])
        # refused while parsing, before MPI starts: mpirun stops the other rank
        expect_failure("bad value", f"rank 1's --scale is nan ({mode})",
                       [a, [*a, "--scale", "nan"]], "--scale: expected a finite number", [y],
                       speakers=[1])
        expect_failure("bad value", f"rank 1's --threads is 0 ({mode})",
                       [a, [*a, "--threads", "0"]], "--threads: expected a positive", [y],
                       speakers=[1])
        expect_failure("bad value", f"rank 1's --context is shorter than T ({mode})",
                       [[*a, "--context", "8"], [*a, "--context", "8"]], None, [y])

print("cases per kind: " + ", ".join(f"{k} {v}" for k, v in counts.items())
      + f"; {sum(counts.values())} in all")
print("all checks passed" if not failures else f"FAILED: {failures}")
sys.exit(1 if failures else 0)
