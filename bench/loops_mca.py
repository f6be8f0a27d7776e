#!/usr/bin/env python3
"""The fused kernels' innermost loops, as llvm-mca models them on other cores.

Disassembles a libattn.so (objdump), finds each innermost loop (a backward
branch with no other branch inside) that holds at least --fmas 512-bit FMAs,
and prints llvm-mca's cycles per iteration for each CPU of --cpus, beside
what the loop holds: its instructions, FMAs, vbroadcastss and broadcast
({1to16}) operands. For the cores no machine here has (Zen 4: -mcpu=znver4
needs LLVM 17 or later, e.g. Debian's llvm-19 package), this is the count
that stands in for hardware counters; docs/performance.md says what it
found and how far it was checked.

usage: bench/loops_mca.py [--mca /usr/lib/llvm-19/bin/llvm-mca]
                          [--cpus skylake-avx512,znver4] [--fmas 24] build/libattn.so
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile


def functions(library):
    """{(name, start address): [(address, instruction text)]} of library."""
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", library], check=True,
                         capture_output=True, text=True).stdout
    funcs, current = {}, None
    for line in dis.split("\n"):
        head = re.match(r"([0-9a-f]+) <(\S+)>:", line)
        if head:
            current = (head.group(2), int(head.group(1), 16))
            funcs[current] = []
            continue
        ins = re.match(r"\s+([0-9a-f]+):\s+(.*)", line)
        if ins and current:
            funcs[current].append((int(ins.group(1), 16), re.sub(r"\s+#.*", "", ins.group(2).strip())))
    return funcs


def innermost_loops(instructions):
    """(first address, body without its branch) of each innermost loop."""
    at = {address: i for i, (address, _) in enumerate(instructions)}
    for i, (address, text) in enumerate(instructions):
        jump = re.match(r"j\w+\s+([0-9a-f]+)\b", text)
        if not jump or int(jump.group(1), 16) >= address or int(jump.group(1), 16) not in at:
            continue
        body = [t for _, t in instructions[at[int(jump.group(1), 16)]:i]]
        if not any(t.startswith("j") for t in body):
            yield int(jump.group(1), 16), body


def cycles(mca, cpu, body):
    with tempfile.NamedTemporaryFile("w", suffix=".s", delete=False) as f:
        f.write("\n".join(body) + "\n")
    try:
        out = subprocess.run([mca, "-mcpu=" + cpu, "-iterations=300", f.name],
                             capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    total = re.search(r"Total Cycles:\s+(\d+)", out)
    return int(total.group(1)) / 300 if total else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("library")
    ap.add_argument("--mca", default="/usr/lib/llvm-19/bin/llvm-mca")
    ap.add_argument("--cpus", default="skylake-avx512,znver4")
    ap.add_argument("--fmas", type=int, default=24, help="the fewest 512-bit FMAs a loop holds")
    opts = ap.parse_args()
    if not os.access(opts.mca, os.X_OK):
        sys.exit("no llvm-mca at %s (Debian: apt install llvm-19)" % opts.mca)
    cpus = opts.cpus.split(",")
    print("%-28s %10s %6s %5s %6s %7s  %s" % ("function", "loop", "instrs", "fmas", "bcast",
                                               "{1to16}", "  ".join("%s cycles" % c for c in cpus)))
    for (name, _), instructions in sorted(functions(opts.library).items(), key=lambda f: f[0][1]):
        for start, body in innermost_loops(instructions):
            fmas = sum(1 for t in body if re.match(r"vf\w*madd", t) and "zmm" in t)
            if fmas < opts.fmas:
                continue
            print("%-28s %10x %6d %5d %6d %7d  %s" % (
                name[:28], start, len(body) + 1, fmas, sum("vbroadcastss" in t for t in body),
                sum("{1to16}" in t for t in body),
                "  ".join("%*.1f" % (len(c) + 7, cycles(opts.mca, c, body)) for c in cpus)))


if __name__ == "__main__":
    main()
