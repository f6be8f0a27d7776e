"""`attn train` end to end, on tiny runs: the output's format (plain lines
when stdout is not a terminal, the final accuracy line), reproducibility
(the same seed prints the same losses), --save (a safetensors file PyTorch's
twin loads, giving the CLI's own held-out numbers back), and every usage
error (exit 2, one line naming the value) and library error (exit 1).

Usage: test_train_cli.py ATTN_CLI
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

TINY = ["--context", "8", "--vocab", "8", "--d-model", "8", "--heads", "2", "--batch", "4",
        "--eval", "8", "--steps", "6"]

failures = []


def attn(cli, *args):
    p = subprocess.run([cli] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    return p.returncode, p.stdout, p.stderr


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED: " + what)


def losses(stdout):
    """The (step, loss, acc) columns of the progress lines (timings vary)."""
    return re.findall(r"^step (\d+)/\d+ loss (\S+) acc (\S+)", stdout, re.M)


def main():
    cli = sys.argv[1]
    rc, out, _ = attn(cli, "train", "--help")
    expect(rc == 0 and "induction" in out and "--save FILE" in out, "train --help")
    rc, out, _ = attn(cli, "--help")
    expect("train" in out, "attn --help lists train")

    # a tiny run, twice: plain lines, the same numbers
    rc, out, err = attn(cli, "train", "--task", "copy", "--log-every", "2", *TINY)
    expect(rc == 0, "tiny run exits 0 (%d: %s)" % (rc, err.strip()))
    expect("\r" not in out, "no carriage returns when stdout is a pipe")
    steps = losses(out)
    expect([s for s, _, _ in steps] == ["1", "2", "4", "6"], "progress lines at 1, 2, 4, 6: %s" % steps)
    expect(re.search(r"^held-out accuracy: \d+\.\d\d% \(answer tokens, 8 sequences\)$", out, re.M)
           is not None, "the final accuracy line")
    expect(re.search(r"^trained 6 steps in [0-9.]+ s", out, re.M) is not None, "the timing line")
    rc2, out2, _ = attn(cli, "train", "--task", "copy", "--log-every", "2", *TINY)
    expect(losses(out2) == steps, "the same seed gives the same losses")
    rc3, out3, _ = attn(cli, "train", "--task", "copy", "--log-every", "2", "--seed", "9", *TINY)
    expect(losses(out3) != steps, "another seed gives other losses")

    # on a terminal: one live line, rewritten with carriage returns
    master, slave = os.openpty()
    p = subprocess.Popen([cli, "train", "--task", "copy", *TINY], stdout=slave,
                         stderr=subprocess.PIPE)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO once the child has exited
            break
        if not data:
            break
        chunks.append(data)
    p.wait()
    os.close(master)
    tty = b"".join(chunks).decode()
    expect(p.returncode == 0 and tty.count("\rstep ") == 6 and "held-out accuracy:" in tty,
           "a terminal gets a live line: %r" % tty[-300:])

    # every option combination that changes the path through the code
    for extra in (["--optimizer", "sgd", "--momentum", "0.5"], ["--attention", "gpt2", "--mlp"],
                  ["--dropout", "0.1", "--mlp"], ["--clip", "0", "--warmup", "0"],
                  ["--task", "reverse"], ["--task", "sort"], ["--threads", "1"]):
        rc, out, err = attn(cli, "train", *TINY, *extra)
        expect(rc == 0 and "held-out accuracy:" in out, "run with %s (%s)" % (extra, err.strip()))

    # --save: safetensors with the config in its metadata
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.safetensors")
        rc, out, err = attn(cli, "train", *TINY, "--mlp", "--save", path)
        expect(rc == 0 and os.path.exists(path), "--save (%s)" % err.strip())
        if rc == 0:
            with open(path, "rb") as f:
                blob = f.read()
            (n,) = struct.unpack("<Q", blob[:8])
            header = json.loads(blob[8:8 + n])
            meta = header.pop("__metadata__")
            expect(meta.get("format") == "attn-lm" and meta.get("mlp") == "true" and
                   meta.get("d_model") == "8", "saved metadata %s" % meta)
            expect("blocks.1.mlp.proj.weight" in header and "head.weight" in header,
                   "saved tensor names")
            expect(re.search(r"^saved \d+ parameters to .*m\.safetensors \(safetensors\)$", out,
                             re.M) is not None, "the saved line")
        rc, _, err = attn(cli, "train", *TINY, "--save", os.path.join(d, "none", "m.st"))
        expect(rc == 1 and "--save" in err and "cannot open" in err, "unwritable --save: %s" % err)

    # a loss that turns non-finite: exit 1, one line spelling it as Python does ("nan",
    # never "-nan"), with a hint that names --lr alone only when nothing else was set
    for extra, hint in ((["--lr", "1e30"], "--lr"),
                        (["--optimizer", "sgd", "--momentum", "1e308"],
                         "--lr or other optimizer settings")):
        rc, _, err = attn(cli, "train", *TINY, *extra)
        expect(rc == 1 and re.fullmatch(r"attn: train: the loss is (nan|inf|-inf) at step \d+ "
                                        r"\(try a lower %s\)\n" % re.escape(hint), err),
               "non-finite loss with %s: rc %d, %r" % (extra, rc, err))

    # usage errors: exit 2, one line naming the value
    usage = [
        (["--task", "copies"], "--task: expected copy, reverse, sort or induction, got 'copies'"),
        (["--steps", "0"], "--steps: expected a positive integer, got '0'"),
        (["--layers", "-1"], "--layers: expected a positive integer"),
        (["--lr", "-0.1"], "--lr: expected a non-negative number, got '-0.1'"),
        (["--lr", "nan"], "--lr: expected a non-negative number"),
        (["--dropout", "1.5"], "--dropout: expected a probability in [0, 1], got '1.5'"),
        (["--dropout", "-0.5"], "--dropout: expected a probability in [0, 1], got '-0.5'"),
        # out of a double's range, not a negative number: named as the other commands name it
        (["--lr", "1e-400"], "--lr: '1e-400' is beyond the range of a double"),
        (["--clip", "1e999"], "--clip: '1e999' is beyond the range of a double"),
        (["--weight-decay", "-1e400"], "--weight-decay: '-1e400' is beyond the range of a double"),
        (["--optimizer", "adam"], "--optimizer: expected adamw or sgd, got 'adam'"),
        (["--attention", "sa1"], "--attention: expected mha or gpt2, got 'sa1'"),
        (["--momentum", "0.9"], "--momentum applies to --optimizer sgd only"),
        (["--steps", "10", "--warmup", "11"], "--warmup (11) exceeds --steps (10)"),
        (["--vocab", "10"], "vocab_size 10 has 9"),
        (["--frobnicate", "1"], "unknown option '--frobnicate'"),
        (["--seed"], "--seed needs a value"),
        # options no model has, as --warmup past --steps
        (["--heads", "3"], "d_model (32) must be divisible by n_heads (3)"),
        (["--d-model", "30", "--heads", "4"], "d_model (30) must be divisible by n_heads (4)"),
    ]
    for args, message in usage:
        rc, out, err = attn(cli, "train", *args)
        expect(rc == 2 and message in err and err.count("\n") == 1,
               "usage error %s: rc %d, %r" % (args, rc, err))

    if failures:
        print("%d failures" % len(failures))
        return 1
    print("attn train CLI: all checks pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
