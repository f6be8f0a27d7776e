#!/usr/bin/python3
"""Ctrl-C (SIGINT), SIGTERM and a second signal against the attn command:

    /usr/bin/python3 tests/cli/test_interrupt.py path/to/attn

Each case runs in a fresh temporary directory and leaves no `*.attn-tmp`
behind:
  a. attn pretrain (a small GPTModel on data/the-verdict.txt) with --save and
     --plot, SIGINT once its first loss line is out: it stops at the next
     event and exits 130 (it does not die of the signal), one stderr line
     says where, the run is saved, and --resume of that save prints the
     lines the uninterrupted run prints after them and ends with the same
     model, state and plot, byte for byte; --resume with --epochs no more
     than the saved run finished is refused naming both;
  b. the same with SIGTERM: exit 143;
  c. two SIGINTs, the second once the first has been delivered (the kernel
     no longer holds it pending, so the two are not merged into one): the
     process dies of SIGINT;
  d. attn sdpa (a command that does not poll) killed by SIGTERM in the
     middle of its computation, its output's temporary open: it dies of
     SIGTERM, the temporary is removed and the existing output is as it
     was; with --grad-dir, the directory it made is removed too;
  e. attn train, SIGINT between steps: exit 130, one stderr line, --save's
     existing file untouched; SIGTERM in the held-out evaluation after the
     last step: the model saved, the evaluation stopped, exit 143;
  f. attn generate --stream, SIGINT after its first tokens: exit 130, the
     line of ids written whole, one stderr line with their count;
  g. attn pretrain whose stdout's reader goes away after the first loss line
     (`| head -1`): SIGPIPE stops it as SIGINT does, exit 141, one stderr
     line, the run and the plot saved, no temporary left; with stderr on the
     same pipe (`2>&1 | head -1`) still exit 141, not death by the signal;
  h. attn generate --stream with SIGPIPE ignored and its reader gone: it
     stops at the next token and says the write failed, exit 1.
  i. attn sdpa with --lse a FIFO that no one reads: opening it waits for a
     reader, and SIGINT or SIGTERM ends that wait: it dies of the signal,
     --output's temporary is removed and its existing file is as it was.
  j. attn pretrain with --save a FIFO read once (at the start, when the
     command tries its outputs) and not again: the end-of-epoch save waits
     for a reader, and a second SIGINT (the first asks the run to stop where
     it can) ends that wait and the process.
Ends with "N passed, N failed".
"""
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(ROOT, "data")
CONFIG = ('{"vocab_size": 50257, "context_length": 32, "emb_dim": 64, "n_heads": 4, '
          '"n_layers": 2, "drop_rate": 0.1, "qkv_bias": false}')
TIMEOUT = 120

passed = failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s%s" % (what, ("\n      " + str(detail)) if detail else ""))
    return ok


def default_signals():
    # A shell's background job starts with SIGINT ignored, which attn keeps
    # ignored: the cases need the signals as a terminal delivers them.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)


def start(attn, args, cwd):
    return subprocess.Popen([attn] + [str(a) for a in args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=default_signals)


def read_until(proc, pattern, timeout=TIMEOUT):
    """The bytes proc writes to stdout up to and including pattern's first
    match (or until it exits or timeout passes)."""
    out = b""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    while not re.search(pattern, out) and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out += chunk
    return out


def finish(proc, timeout=TIMEOUT):
    """(returncode, the rest of stdout, stderr)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return None, out, err + b"\n(timed out)"
    return proc.returncode, out, err


def reader_gone(proc):
    """Closes proc's stdout (its reader goes away) and waits for it: its
    stderr, or "(timed out)" after killing it."""
    proc.stdout.close()
    try:
        proc.wait(timeout=TIMEOUT)
        return proc.stderr.read().decode()
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "(timed out)"


def pending(pid, sig):
    """Whether sig waits undelivered for process pid or one of its threads."""
    bit = 1 << (sig - 1)
    paths = ["/proc/%d/status" % pid]
    try:
        paths += ["/proc/%d/task/%s/status" % (pid, t) for t in os.listdir("/proc/%d/task" % pid)]
    except OSError:
        return False
    for path in paths:
        try:
            text = open(path).read()
        except OSError:
            continue
        for key in ("ShdPnd", "SigPnd"):
            m = re.search(r"^%s:\s*([0-9a-f]+)" % key, text, flags=re.M)
            if m and int(m.group(1), 16) & bit:
                return True
    return False


def wait_delivered(proc, sig, timeout=10):
    deadline = time.monotonic() + timeout
    while proc.poll() is None and pending(proc.pid, sig) and time.monotonic() < deadline:
        time.sleep(0.001)


def temporaries(root):
    return sorted(os.path.relpath(os.path.join(folder, name), root)
                  for folder, _, names in os.walk(root) for name in names
                  if name.endswith(".attn-tmp"))


def wait_for_temporaries(proc, root, count, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while (proc.poll() is None and len(temporaries(root)) < count and
           time.monotonic() < deadline):
        time.sleep(0.005)
    return temporaries(root)


def read(path):
    with open(path, "rb") as f:
        return f.read()


def pretrain_args(work, save, plot, resume=None):
    """A small GPTModel's run (or, with resume, the continuation of the run
    saved there)."""
    cfg = os.path.join(work, "cfg.json")
    if not os.path.exists(cfg):
        with open(cfg, "w") as f:
            f.write(CONFIG)
    model = ["--resume", resume] if resume else ["--config", cfg]
    return (["pretrain"] + model + ["--text", os.path.join(DATA, "the-verdict.txt"),
             "--tokenizer", os.path.join(DATA, "gpt2-bpe"), "--epochs", "1", "--stride", "128",
             "--eval-freq", "5", "--eval-iter", "2", "--threads", "2", "--seed", "7",
             "--save", save, "--plot", plot])


def pretrain_cases(attn):
    with tempfile.TemporaryDirectory() as ref_dir:
        r = subprocess.run([attn] + pretrain_args(ref_dir, "full.safetensors", "full.png"),
                           cwd=ref_dir, capture_output=True, timeout=TIMEOUT,
                           preexec_fn=default_signals)
        if not check(r.returncode == 0, "pretrain: the uninterrupted run", r.stderr):
            return
        ref_out = r.stdout
        ref = {name: read(os.path.join(ref_dir, name))
               for name in ("full.safetensors", "full.safetensors.state", "full.png")}

    for sig, status in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        name = sig.name
        with tempfile.TemporaryDirectory() as work:
            proc = start(attn, pretrain_args(work, "m.safetensors", "p.png"), work)
            early = read_until(proc, rb"Step \d+\)[^\n]*\n")
            running = proc.poll() is None
            proc.send_signal(sig)
            rc, rest, err = finish(proc)
            out = early + rest
            check(running, "pretrain %s: still training when signalled" % name, early)
            check(rc == status, "pretrain %s: exits %d (not by the signal)" % (name, status),
                  "returncode %s; stderr %r" % (rc, err))
            lines = err.decode().splitlines()
            check(len(lines) == 1 and re.fullmatch(
                r"attn: pretrain: interrupted \(%s\) at epoch 1, step \d{6}; saved the run in "
                r"m\.safetensors: continue it with --resume m\.safetensors; plotted the losses "
                r"so far in p\.png" % name, lines[0]),
                "pretrain %s: one line saying where it stopped and what it saved" % name, err)
            check(temporaries(work) == [], "pretrain %s: no temporary left" % name,
                  temporaries(work))
            saved = all(os.path.exists(os.path.join(work, f))
                        for f in ("m.safetensors", "m.safetensors.state", "p.png"))
            check(saved, "pretrain %s: the run and the plot so far are saved" % name,
                  os.listdir(work))
            check(out != ref_out and ref_out.startswith(out),
                  "pretrain %s: stopped early, after the lines of the run never stopped" % name,
                  out)
            if sig != signal.SIGINT or not saved:
                continue
            r = subprocess.run([attn] + pretrain_args(work, "m.safetensors", "p.png",
                                                      resume="m.safetensors"),
                               cwd=work, capture_output=True, timeout=TIMEOUT,
                               preexec_fn=default_signals)
            check(r.returncode == 0, "pretrain: --resume of the interrupted run", r.stderr)
            check(out + r.stdout == ref_out,
                  "pretrain: the interrupted run and its resumption print the lines of the "
                  "run never stopped", (out + r.stdout, ref_out))
            for mine, theirs in (("m.safetensors", "full.safetensors"),
                                 ("m.safetensors.state", "full.safetensors.state"),
                                 ("p.png", "full.png")):
                check(read(os.path.join(work, mine)) == ref[theirs],
                      "pretrain: after --resume, %s is the uninterrupted run's %s byte for byte"
                      % (mine, theirs))
            # the saved run finished epoch 1: --epochs 1 again trains nothing
            before = read(os.path.join(work, "m.safetensors"))
            r = subprocess.run([attn] + pretrain_args(work, "m.safetensors", "p.png",
                                                      resume="m.safetensors"),
                               cwd=work, capture_output=True, text=True, timeout=TIMEOUT)
            check(r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1 and
                  "--epochs 1" in r.stderr and "finished 1 epoch" in r.stderr and
                  "--epochs 2 or more" in r.stderr,
                  "pretrain: --resume with --epochs no more than the saved run finished is "
                  "refused, naming both", (r.returncode, r.stdout, r.stderr))
            check(read(os.path.join(work, "m.safetensors")) == before and
                  temporaries(work) == [],
                  "pretrain: the refused --resume changes nothing")

    # Two signals: the first asks the run to stop; the second, sent once the
    # first is delivered, ends it at once.
    with tempfile.TemporaryDirectory() as work:
        proc = start(attn, pretrain_args(work, "m.safetensors", "p.png"), work)
        read_until(proc, rb"Step \d+\)[^\n]*\n")
        running = proc.poll() is None
        had_plot_temporary = any(".p.png." in t for t in temporaries(work))
        proc.send_signal(signal.SIGINT)
        wait_delivered(proc, signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        rc, _, err = finish(proc)
        check(running and had_plot_temporary,
              "pretrain twice: training with its --plot temporary open when signalled")
        check(rc == -signal.SIGINT, "pretrain twice: the second SIGINT kills it",
              "returncode %s; stderr %r" % (rc, err))
        check(temporaries(work) == [], "pretrain twice: no temporary left", temporaries(work))


def pipe_case(attn):
    """pretrain's stdout read by a reader that goes away (`attn pretrain ...
    | head -1`): the next line raises SIGPIPE, and the run stops and saves
    as for SIGINT, exit 141."""
    with tempfile.TemporaryDirectory() as work:
        proc = start(attn, pretrain_args(work, "m.safetensors", "p.png"), work)
        read_until(proc, rb"Step \d+\)[^\n]*\n")
        running = proc.poll() is None
        err = reader_gone(proc)
        check(running, "pretrain | head -1: training when its reader went")
        check(proc.returncode == 141, "pretrain | head -1: exits 141 (not by the signal)",
              "returncode %s; stderr %r" % (proc.returncode, err))
        check(re.fullmatch(r"attn: pretrain: interrupted \(SIGPIPE\) at epoch 1, step \d{6}; "
                           r"saved the run in m\.safetensors[^\n]*\n", err) is not None,
              "pretrain | head -1: one line saying where it stopped and what it saved", err)
        check(os.path.exists(os.path.join(work, "m.safetensors")) and
              os.path.exists(os.path.join(work, "p.png")),
              "pretrain | head -1: the run and the plot so far are saved", os.listdir(work))
        check(temporaries(work) == [], "pretrain | head -1: no temporary left",
              temporaries(work))
    # stderr on the same pipe (2>&1 | head -1): the stop's own line then
    # fails too, and the process still exits 141, not by the signal
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.Popen([attn] + pretrain_args(work, "m.safetensors", "p.png"), cwd=work,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                preexec_fn=default_signals)
        read_until(proc, rb"Step \d+\)[^\n]*\n")
        proc.stdout.close()
        try:
            proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        check(proc.returncode == 141, "pretrain 2>&1 | head -1: exits 141 (not by the signal)",
              "returncode %s" % proc.returncode)
        check(os.path.exists(os.path.join(work, "m.safetensors")) and
              temporaries(work) == [], "pretrain 2>&1 | head -1: the run saved, no temporary",
              os.listdir(work))


def sdpa_case(attn):
    with tempfile.TemporaryDirectory() as work:
        rng = np.random.default_rng(0)
        for name in "qkv":
            np.save(os.path.join(work, name + ".npy"),
                    rng.standard_normal((1, 4, 2048, 64), dtype=np.float32))
        old = b"the previous output, kept byte for byte\n"
        with open(os.path.join(work, "o.npy"), "wb") as f:
            f.write(old)
        # the double-accumulating kernels on one thread: seconds of work
        proc = start(attn, ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--output",
                            "o.npy", "--lse", "lse.npy", "--kernels", "reference",
                            "--threads", "1"], work)
        seen = wait_for_temporaries(proc, work, 2)
        running = proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        rc, _, err = finish(proc)
        check(running and len(seen) == 2,
              "sdpa: computing with its two temporaries open when signalled", seen)
        check(rc == -signal.SIGTERM, "sdpa: SIGTERM kills it (it does not poll)",
              "returncode %s; stderr %r" % (rc, err))
        check(temporaries(work) == [], "sdpa: no temporary left", temporaries(work))
        check(read(os.path.join(work, "o.npy")) == old and
              not os.path.exists(os.path.join(work, "lse.npy")),
              "sdpa: the outputs are as they were")
        # the gradients into a directory it makes: removed with the temporaries
        np.save(os.path.join(work, "do.npy"),
                rng.standard_normal((1, 4, 2048, 64), dtype=np.float32))
        proc = start(attn, ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--output",
                            "o2.npy", "--grad-output", "do.npy", "--grad-dir", "g", "--kernels",
                            "reference", "--threads", "1"], work)
        seen = wait_for_temporaries(proc, work, 4)
        running = proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        rc, _, err = finish(proc)
        check(running and len(seen) == 4 and rc == -signal.SIGTERM,
              "sdpa --grad-dir: computing with its temporaries open when signalled, killed",
              "seen %s; returncode %s; stderr %r" % (seen, rc, err))
        check(not os.path.exists(os.path.join(work, "g")) and
              not os.path.exists(os.path.join(work, "o2.npy")) and temporaries(work) == [],
              "sdpa --grad-dir: the directory it made is removed, nothing left",
              os.listdir(work))


def fifo_case(attn):
    with tempfile.TemporaryDirectory() as work:
        rng = np.random.default_rng(1)
        for name in "qkv":
            np.save(os.path.join(work, name + ".npy"),
                    rng.standard_normal((1, 2, 16, 8), dtype=np.float32))
        old = b"the previous output, kept byte for byte\n"
        with open(os.path.join(work, "o.npy"), "wb") as f:
            f.write(old)
        os.mkfifo(os.path.join(work, "lse.fifo"))
        for sig in (signal.SIGINT, signal.SIGTERM):
            proc = start(attn, ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy",
                                "--output", "o.npy", "--lse", "lse.fifo"], work)
            seen = wait_for_temporaries(proc, work, 1)
            time.sleep(0.2)  # into the open of the FIFO, which waits for a reader
            waiting = proc.poll() is None
            proc.send_signal(sig)
            rc, _, err = finish(proc, timeout=10)
            name = signal.Signals(sig).name
            check(waiting and len(seen) == 1,
                  "sdpa --lse FIFO: waiting for a reader, --output's temporary open", seen)
            check(rc == -sig, "sdpa --lse FIFO: %s ends the wait and the process" % name,
                  "returncode %s; stderr %r" % (rc, err))
            check(temporaries(work) == [] and read(os.path.join(work, "o.npy")) == old,
                  "sdpa --lse FIFO, %s: no temporary left, the output as it was" % name,
                  os.listdir(work))


def pretrain_fifo_case(attn):
    with tempfile.TemporaryDirectory() as work:
        fifo = os.path.join(work, "m.safetensors")
        os.mkfifo(fifo)
        reader = subprocess.Popen(["cat", fifo], stdout=subprocess.DEVNULL)
        args = pretrain_args(work, "m.safetensors", "p.png")
        proc = start(attn, args[:args.index("--plot")], work)
        reader.wait(timeout=TIMEOUT)  # the outputs' check opened and closed it
        # the sample line ends the epoch: the save comes next
        early = read_until(proc, rb"Every effort moves you[^\n]*\n")
        time.sleep(0.5)  # into the open of the FIFO, which waits for a reader
        waiting = proc.poll() is None
        for _ in range(2):
            proc.send_signal(signal.SIGINT)
            wait_delivered(proc, signal.SIGINT)
            time.sleep(0.2)
        rc, _, err = finish(proc, timeout=10)
        check(waiting, "pretrain --save FIFO: waiting in the save", early)
        check(rc == -signal.SIGINT, "pretrain --save FIFO: a second SIGINT ends the save's wait",
              "returncode %s; stderr %r" % (rc, err))


def train_case(attn):
    with tempfile.TemporaryDirectory() as work:
        old = b"weights saved before, kept byte for byte\n"
        with open(os.path.join(work, "w.safetensors"), "wb") as f:
            f.write(old)
        proc = start(attn, ["train", "--task", "copy", "--steps", "100000", "--log-every", "1",
                            "--threads", "1", "--save", "w.safetensors"], work)
        early = read_until(proc, rb"step 2/")
        running = proc.poll() is None
        proc.send_signal(signal.SIGINT)
        rc, _, err = finish(proc)
        check(running, "train: still training when signalled", early)
        check(rc == 130, "train: exits 130 (not by the signal)",
              "returncode %s; stderr %r" % (rc, err))
        lines = err.decode().splitlines()
        check(len(lines) == 1 and re.fullmatch(
            r"attn: train: interrupted \(SIGINT\) after step \d+ of 100000; nothing evaluated "
            r"or saved", lines[0]), "train: one line saying where it stopped", err)
        check(read(os.path.join(work, "w.safetensors")) == old and temporaries(work) == [],
              "train: --save's file is as it was, and no temporary is left")


def train_eval_case(attn):
    """A signal in the held-out evaluation after the last step: the trained
    model is saved, the evaluation stops at its next batch (exit 143, one
    line), where it went on for as long as --eval asked. The one step runs
    at the peak lr (a decay that reached 0 at the last step trained nothing
    in a run of one step)."""
    with tempfile.TemporaryDirectory() as work:
        proc = start(attn, ["train", "--steps", "1", "--eval", "1000000000000", "--threads",
                            "1", "--save", "w.safetensors"], work)
        early = read_until(proc, rb"step 1/1[^\n]*\n")
        running = proc.poll() is None
        time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        rc, rest, err = finish(proc, timeout=20)
        check(running and rc == 143, "train --eval 10^12: SIGTERM stops the evaluation, 143",
              "returncode %s; stderr %r" % (rc, err))
        check(re.fullmatch(r"attn: train: interrupted \(SIGTERM\) in the held-out evaluation "
                           r"after \d+ of 1000000000000 sequences; the trained model is saved\n",
                           err.decode()) is not None, "train --eval 10^12: one line", err)
        check(os.path.exists(os.path.join(work, "w.safetensors")) and b"saved" in rest and
              b"lr 1.00e-02" in early, "train --steps 1: step 1 at the peak lr, model saved",
              early + rest)


def train_long_case(attn):
    """A run of 10^15 steps: its progress line says the time left in days,
    not 0:00; SIGINT stops it."""
    with tempfile.TemporaryDirectory() as work:
        proc = start(attn, ["train", "--steps", "1000000000000000", "--log-every", "1000000",
                            "--threads", "1"], work)
        early = read_until(proc, rb"left [^\n]*\n")
        proc.send_signal(signal.SIGINT)
        rc, _, _ = finish(proc)
        check(re.search(rb"left [0-9.e+]+ days\n", early) is not None and rc == 130,
              "train of 10^15 steps: the time left in days", early)


def generate_case(attn):
    with tempfile.TemporaryDirectory() as work:
        cfg = os.path.join(work, "gen.json")
        with open(cfg, "w") as f:
            f.write('{"vocab_size": 50257, "context_length": 2048, "emb_dim": 256, '
                    '"n_heads": 4, "n_layers": 2, "drop_rate": 0.0, "qkv_bias": true}')
        proc = start(attn, ["generate", "--random-init", "1", "--config", cfg, "--prompt-ids",
                            "1,2,3", "--max-new-tokens", "2000", "--stream", "--threads", "1"],
                     work)
        early = read_until(proc, rb"\d+,\d+,")
        running = proc.poll() is None
        proc.send_signal(signal.SIGINT)
        rc, rest, err = finish(proc)
        out = (early + rest).decode()
        check(running, "generate: still writing tokens when signalled", out)
        check(rc == 130, "generate: exits 130 (not by the signal)",
              "returncode %s; stderr %r" % (rc, err))
        ids = out[:-1].split(",") if out.endswith("\n") else []
        complete = len(ids) > 1 and all(i.isdigit() for i in ids) and "\n" not in out[:-1]
        check(complete and len(ids) < 2000,
              "generate: one complete line of the ids written before it stopped", repr(out))
        lines = err.decode().splitlines()
        check(len(lines) == 1 and lines[0] == "attn: generate: interrupted (SIGINT) after %d new "
              "tokens" % len(ids), "generate: one line with the count of tokens", err)


def generate_pipe_case(attn):
    """generate --stream with SIGPIPE ignored (`trap '' PIPE`) and its reader
    gone: the first write that fails stops the run, one stderr line, exit 1."""
    def ignore_pipe():
        default_signals()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)

    with tempfile.TemporaryDirectory() as work:
        cfg = os.path.join(work, "gen.json")
        with open(cfg, "w") as f:
            f.write('{"vocab_size": 50257, "context_length": 4096, "emb_dim": 256, '
                    '"n_heads": 4, "n_layers": 2, "drop_rate": 0.0, "qkv_bias": true}')
        proc = subprocess.Popen([attn, "generate", "--random-init", "1", "--config", cfg,
                                 "--prompt-ids", "1,2,3", "--max-new-tokens", "4000", "--stream",
                                 "--threads", "1"], cwd=work, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=ignore_pipe)
        read_until(proc, rb"\d+,\d+,")
        running = proc.poll() is None
        t0 = time.monotonic()
        err = reader_gone(proc)
        # the 4000 tokens take tens of seconds on one thread; the stop is at
        # the next token
        check(running and time.monotonic() - t0 < 5,
              "generate | (reader gone), SIGPIPE ignored: stops at its next token",
              "%.1f s" % (time.monotonic() - t0))
        check(proc.returncode == 1 and
              re.fullmatch(r"attn: error writing to standard output[^\n]*\n", err) is not None,
              "generate | (reader gone), SIGPIPE ignored: exit 1, one line naming the write",
              "returncode %s; stderr %r" % (proc.returncode, err))


def main():
    attn = os.path.abspath(sys.argv[1])
    started = time.monotonic()
    pretrain_cases(attn)
    pipe_case(attn)
    sdpa_case(attn)
    fifo_case(attn)
    pretrain_fifo_case(attn)
    train_case(attn)
    train_eval_case(attn)
    train_long_case(attn)
    generate_case(attn)
    generate_pipe_case(attn)
    print("%d passed, %d failed (%.1f s)" % (passed, failed, time.monotonic() - started))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
