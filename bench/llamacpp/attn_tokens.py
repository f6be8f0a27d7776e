"""Decode speed of `attn generate` in blocks, from one run: the tokens are
timed as `--stream` prints them, so that the prompt (a deep context) is
prefilled once and several blocks of new tokens after it give a median.

    python attn_tokens.py --blocks R --block N -- ATTN generate ... --stream

Runs the command with --max-new-tokens 1 + R*N appended, takes the arrival
time of each new token on stdout, and prints one line

    tg tok_s=<median over the R blocks of N / block seconds> blocks=<each, comma separated>

The first new token ends the prefill and is not counted; block b is the N
tokens after it, so its context is the prompt plus 1 + b*N tokens.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, required=True)
    p.add_argument("--block", type=int, required=True)
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = [c for c in a.command if c != "--"]
    cmd += ["--max-new-tokens", str(1 + a.blocks * a.block)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, bufsize=0)
    fd = proc.stdout.fileno()
    text, times = b"", []
    while True:
        chunk = os.read(fd, 65536)
        now = time.perf_counter()
        if not chunk:
            break
        text += chunk
        # attn generate --stream writes "id" then ",id" per token, flushed
        # whole; the closing newline adds none.
        count = len(text.strip().split(b",")) if text.strip() else 0
        times += [now] * (count - len(times))
    if proc.wait() != 0:
        sys.exit(f"attn_tokens.py: {cmd[0]} exited {proc.returncode}")
    want = 1 + a.blocks * a.block
    if len(times) != want:
        sys.exit(f"attn_tokens.py: {len(times)} tokens, not {want} (a stop token?)")
    rates = [a.block / (times[(b + 1) * a.block] - times[b * a.block]) for b in range(a.blocks)]
    print("tg tok_s=%.3f blocks=%s" % (statistics.median(rates),
                                        ",".join("%.3f" % r for r in rates)))


if __name__ == "__main__":
    main()
