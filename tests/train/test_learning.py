"""A learning run of `attn train`: the held-out accuracy it prints must reach
a floor within the run's step budget (the steps are fixed; the time is only
reported).

Usage: test_learning.py ATTN_CLI MIN_ACCURACY_PERCENT [--random-seed] -- ARGS...
  ARGS go to `attn train`. With --random-seed, a fresh --seed is drawn and
  printed (replay: add --seed N to ARGS instead).
"""
import random
import re
import subprocess
import sys
import time


def main():
    argv = sys.argv[1:]
    if "--" not in argv or len(argv) < 3:
        print(__doc__)
        return 2
    split = argv.index("--")
    own, args = argv[:split], argv[split + 1:]
    cli, floor = own[0], float(own[1])
    if "--random-seed" in own:
        seed = random.SystemRandom().randrange(1, 2 ** 31)
        args += ["--seed", str(seed)]
        print("seed %d (replay: attn train %s)" % (seed, " ".join(args)))
    command = [cli, "train"] + args
    print("$ " + " ".join(command), flush=True)
    start = time.time()
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.time() - start
    print(proc.stdout, end="")
    if proc.returncode != 0:
        print("FAILED: attn train exited with %d" % proc.returncode)
        return 1
    m = re.search(r"^held-out accuracy: ([0-9.]+)% \(answer tokens", proc.stdout, re.M)
    steps = re.search(r"^trained (\d+) steps", proc.stdout, re.M)
    if not m or not steps:
        print("FAILED: no 'held-out accuracy' / 'trained N steps' line")
        return 1
    accuracy = float(m.group(1))
    print("%s: %s steps, held-out accuracy %.2f%% (floor %.2f%%), wall %.1f s" % (
        "PASS" if accuracy >= floor else "FAILED", steps.group(1), accuracy, floor, wall))
    return 0 if accuracy >= floor else 1


if __name__ == "__main__":
    sys.exit(main())
