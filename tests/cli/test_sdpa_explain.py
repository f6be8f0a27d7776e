"""attn sdpa --explain: after each pass one line on stderr, the backends the
runner asked in order, why each declined and which ran on which kernels.
Ordinary float32 inputs run the fused kernels (on a fast ctx) with no
backend declining before them; a q . k past float32's range is declined
by the fused kernels and run by the reference, whose output then equals a
reference ctx's bit for bit; --kernels reference names why fused declines.
usage: test_sdpa_explain.py ATTN_CLI
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

cli = sys.argv[1]
passed = failed = 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what, detail)


def sdpa(d, q, *extra):
    r = subprocess.run([cli, "sdpa", "--q", q, "--k", f"{d}/k.npy", "--v", f"{d}/v.npy",
                        "--output", f"{d}/o.npy", "--explain", "--threads", "2", *extra],
                       capture_output=True, text=True)
    # the last line names the files written; the explain lines come before it
    wrote = r.stderr.splitlines()[-1:] or [""]
    check(r.returncode != 0 or wrote[0].startswith(f"attn: wrote {d}/o.npy ("),
          "the last line says what was written", r.stderr)
    r.stderr = "".join(r.stderr.splitlines(True)[:-1]) if r.returncode == 0 else r.stderr
    return r, np.load(f"{d}/o.npy") if r.returncode == 0 else None


rng = np.random.default_rng()
with tempfile.TemporaryDirectory() as d:
    for name, shape in (("q", (1, 4, 80, 32)), ("k", (1, 2, 80, 32)), ("v", (1, 2, 80, 32)),
                        ("do", (1, 4, 80, 32))):
        np.save(f"{d}/{name}.npy", rng.standard_normal(shape, dtype=np.float32))
    q = np.load(f"{d}/q.npy")
    q[0, 1, 7, 3] = 3e37
    np.save(f"{d}/qbig.npy", q)
    fast = os.environ.get("ATTN_KERNELS", "auto") != "reference"

    r, _ = sdpa(d, f"{d}/q.npy", "--causal", "--grad-output", f"{d}/do.npy", "--grad-dir",
                f"{d}/g")
    lines = r.stderr.splitlines()
    check(r.returncode == 0 and len(lines) == 2, "--explain: one line per pass", r.stderr)
    if fast and len(lines) == 2:
        for line, p in zip(lines, ("forward", "backward")):
            check(line.startswith(f"attn: sdpa {p}: fused [") and line.endswith("]: ran")
                  and "declined" not in line, f"the {p} runs fused first", line)

    r, out = sdpa(d, f"{d}/qbig.npy")
    r_ref, out_ref = sdpa(d, f"{d}/qbig.npy", "--kernels", "reference")
    check(r.returncode == 0 and r.stderr.rstrip().endswith("reference: ran"),
          "values past float32's range: the reference runs", r.stderr)
    if fast:
        check("fused [" in r.stderr and "declined (a non-finite input, or scores past" in
              r.stderr, "fused declines them, saying why", r.stderr)
    check(out is not None and out_ref is not None and
          out.tobytes() == out_ref.tobytes(), "with the reference's bits")
    check(r_ref.stderr.startswith("attn: sdpa forward: fused: declined (the ctx runs the "
                                  "reference kernels); fused16: declined (its kernels read "
                                  "bf16); decode: declined (K and V are dense); flex: declined "
                                  "(the ctx runs the reference kernels); reference: ran"),
          "--kernels reference", r_ref.stderr)

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
