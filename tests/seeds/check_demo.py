"""Runs `attn demo` and checks that every tensor the seeds print appears in
its output character for character.

usage: check_demo.py ATTN_BINARY EXPECTED_PRINTS
"""
import subprocess
import sys


def expected_blocks(path):
    text = open(path, encoding="utf-8").read()
    body = "\n".join(l for l in text.split("\n") if not l.startswith("#"))
    return [b.strip("\n") for b in body.split("\n\n") if b.strip()]


def main():
    attn, expected_path = sys.argv[1], sys.argv[2]
    run = subprocess.run([attn, "demo"], capture_output=True, text=True, timeout=120)
    passed = failed = 0
    if run.returncode != 0:
        print(f"attn demo exited {run.returncode}: {run.stderr}")
        failed += 1
    for block in expected_blocks(expected_path):
        if block in run.stdout:
            passed += 1
        else:
            failed += 1
            print("not in the demo's output:\n" + block + "\n")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
