#!/usr/bin/python3
"""The attn commands that write files, under hostile paths and inputs:

    /usr/bin/python3 tests/cli/test_hostile_outputs.py path/to/attn

Every bad case must exit non-zero with one stderr line "attn: ..." naming the
value at fault, and leave the working directory exactly as it was: no output
written, no existing file changed, no temporary left, no directory made.
  a. bad output paths: a directory, a missing parent, a file where the
     gradient directory should be, an unwritable place (/proc), /dev/full,
     the same file named twice (by two spellings too), an output that is an
     input;
  b. bad inputs, checked before anything is written: truncated, wrong
     dtype, wrong rank, huge or broken headers, Fortran order, 0-d, empty
     files, gradients of the wrong shape; bad safetensors weights; a FIFO
     as weights, tokenizer or checkpoint, refused without waiting for a
     writer;
  c. a file size limit (RLIMIT_FSIZE, SIGXFSZ at its default as a shell
     leaves it) in the middle of each command's write: the previous files
     stay byte for byte;
  d. stdout on /dev/full (every write to it fails) for each command that
     prints and writes files (train, heatmap, mask, pretrain), and stdout
     closed (`>&-`): exit 1, the one line "attn: error writing to standard
     output...", no file written or changed.
Then the good runs: each command writes what it says on its one "attn:
wrote" line (forward, grad, sdpa), and leaves no temporary; --output
/dev/stdout appends to the file of a shell's >> (and a refused run leaves
it as it was), --output /dev/stdin is refused.
Ends with "N passed, N failed" and the number of cases per surface.
"""
import base64
import collections
import hashlib
import io
import os
import resource
import stat
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")

passed = failed = 0
counts = collections.Counter()


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
        print("FAIL: %s%s" % (what, ("\n      " + detail) if detail else ""))
    return ok


def snapshot(root):
    """{relative path: (kind, size, sha1)} of everything under root."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            out[os.path.relpath(os.path.join(folder, name), root)] = ("dir", 0, "")
        for name in files:
            path = os.path.join(folder, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):  # a FIFO, a link: not read
                out[os.path.relpath(path, root)] = ("other", 0, os.readlink(path)
                                                    if os.path.islink(path) else "")
                continue
            with open(path, "rb") as f:
                data = f.read()
            out[os.path.relpath(path, root)] = ("file", len(data), hashlib.sha1(data).hexdigest())
    return out


def limit(size):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
    return apply


class Runner:
    def __init__(self, attn, work):
        self.attn, self.work = attn, work

    def run(self, args, file_limit=None, timeout=60):
        """The finished run; one past timeout is killed, and has returncode
        None and stderr "(timed out)"."""
        try:
            return subprocess.run([self.attn] + [str(a) for a in args], cwd=self.work,
                                  capture_output=True, text=True, timeout=timeout,
                                  preexec_fn=limit(file_limit) if file_limit else None)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(args, None, "", "(timed out)")

    def bad(self, surface, args, names, rc=None, file_limit=None, timeout=60):
        """args must fail, saying so on one line that contains every one of
        names, and change nothing under the working directory."""
        counts[surface] += 1
        before = snapshot(self.work)
        r = self.run(args, file_limit, timeout)
        after = snapshot(self.work)
        label = "attn " + " ".join(str(a) for a in args)
        lines = r.stderr.splitlines()
        ok_rc = r.returncode in ((1, 2) if rc is None else (rc,))
        check(ok_rc and len(lines) == 1 and lines[0].startswith("attn: ")
              and all(n in lines[0] for n in names),
              "%s: exits %s with one line naming %s" % (label, rc or "1 or 2", names),
              "rc=%s stderr=%r" % (r.returncode, r.stderr[:500]))
        changed = sorted(set(before.items()) ^ set(after.items()))
        check(not changed, "%s: changes nothing" % label, "changed: %r" % changed[:6])
        check(r.stdout == "" or args[0] == "train", "%s: nothing on stdout" % label,
              r.stdout[:200])

    def bad_stdout(self, surface, args, closed=False):
        """args with stdout on /dev/full (closed: no stdout at all, as `>&-`
        leaves it) must fail (exit 1) on the one line saying so, and change
        nothing under the working directory."""
        counts[surface] += 1
        before = snapshot(self.work)
        with open("/dev/full", "w") as full:
            r = subprocess.run([self.attn] + [str(a) for a in args], cwd=self.work,
                               stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                               preexec_fn=(lambda: os.close(1)) if closed else None)
        after = snapshot(self.work)
        label = "attn %s %s" % (" ".join(str(a) for a in args), ">&-" if closed else
                                "> /dev/full")
        lines = r.stderr.splitlines()
        check(r.returncode == 1 and len(lines) == 1
              and lines[0].startswith("attn: error writing to standard output"),
              "%s: exits 1 with one line naming standard output" % label,
              "rc=%s stderr=%r" % (r.returncode, r.stderr[:500]))
        changed = sorted(set(before.items()) ^ set(after.items()))
        check(not changed, "%s: changes nothing" % label, "changed: %r" % changed[:6])


def save(path, array):
    np.save(path, np.ascontiguousarray(array, dtype=np.float32))


def npy_bytes(header, data=b"", version=(1, 0)):
    """A .npy image with the given header text (padded to 64 bytes)."""
    header = header.encode("latin1")
    size_bytes = 2 if version[0] == 1 else 4
    total = 6 + 2 + size_bytes + len(header) + 1
    header += b" " * ((64 - total % 64) % 64) + b"\n"
    fmt = "<H" if size_bytes == 2 else "<I"
    return b"\x93NUMPY" + bytes(version) + struct.pack(fmt, len(header)) + header + data


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def safetensors_bytes(header, data=b""):
    h = header.encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


def main():
    attn = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory() as work:
        r = Runner(attn, work)
        rng = np.random.default_rng(5)
        B, H, T, D = 1, 2, 64, 32
        for name in ("q", "k", "v", "do"):
            save(os.path.join(work, name + ".npy"), rng.standard_normal((B, H, T, D)))
        save(os.path.join(work, "x.npy"), rng.standard_normal((2, 5, 8)))
        save(os.path.join(work, "dy.npy"), rng.standard_normal((2, 5, 8)))
        save(os.path.join(work, "dy_bad.npy"), rng.standard_normal((2, 5, 7)))
        save(os.path.join(work, "do_bad.npy"), rng.standard_normal((B, H, T, D - 1)))
        # outputs of an earlier run, which every failure must leave alone
        save(os.path.join(work, "o.npy"), rng.standard_normal((B, H, T, D)))
        save(os.path.join(work, "lse.npy"), rng.standard_normal((B, H, T)))
        os.mkdir(os.path.join(work, "g"))
        for name in ("dq", "dk", "dv"):
            save(os.path.join(work, "g", name + ".npy"), rng.standard_normal((B, H, T, D)))
        write(os.path.join(work, "afile"), b"not a directory\n")
        os.mkdir(os.path.join(work, "adir"))
        sdpa = ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy"]
        fwd = ["forward", "--module", "mha", "--d-in", "8", "--d-out", "8", "--heads", "2",
               "--input", "x.npy"]
        grad = ["grad", "--module", "mha", "--d-in", "8", "--d-out", "8", "--heads", "2",
                "--input", "x.npy"]

        # a. output paths
        for surface, base, out_opt in (("sdpa paths", sdpa, "--output"),
                                       ("forward paths", fwd, "--output")):
            r.bad(surface, base + [out_opt, "adir"], ["adir", "is a directory"], rc=1)
            r.bad(surface, base + [out_opt, "missing/o.npy"],
                  ["missing/o.npy", "No such file or directory"], rc=1)
            r.bad(surface, base + [out_opt, "afile/o.npy"], ["afile/o.npy", "Not a directory"],
                  rc=1)
            r.bad(surface, base + [out_opt, "/proc/attn_o.npy"], ["/proc/attn_o.npy"], rc=1)
            r.bad(surface, base + [out_opt, ""], ["%s: the path is empty" % out_opt], rc=2)
        r.bad("forward paths", fwd + ["--output", "x.npy"], ["--output", "x.npy", "--input"],
              rc=2)
        r.bad("forward paths", fwd + ["--output", "./x.npy"], ["./x.npy", "--input"], rc=2)
        if os.path.exists("/dev/full"):
            r.bad("sdpa paths", sdpa + ["--output", "/dev/full"], ["/dev/full", "No space"],
                  rc=1)
            r.bad("sdpa paths", sdpa + ["--output", "o.npy", "--lse", "/dev/full"],
                  ["--lse", "/dev/full"], rc=1)
            r.bad("forward paths", fwd + ["--output", "/dev/full"], ["/dev/full"], rc=1)
            r.bad("grad paths", grad + ["--grad-output", "dy.npy", "--out", "/dev/full"],
                  ["--out", "/dev/full", "not a directory"], rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "o.npy", "--lse", "o.npy"],
              ["--lse", "o.npy", "--output"], rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "o.npy", "--lse", "./o.npy"],
              ["--lse", "./o.npy", "--output"], rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "new.npy", "--lse", "adir/../new.npy"],
              ["--lse", "adir/../new.npy"], rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "g/dq.npy", "--grad-output", "do.npy",
                                    "--grad-dir", "g"], ["--grad-dir", "g/dq.npy"], rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "q.npy"], ["--output", "q.npy", "--q"], rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "o.npy", "--lse", "v.npy"], ["--lse", "--v"],
              rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "o.npy", "--grad-output", "g/dq.npy",
                                    "--grad-dir", "g"], ["g/dq.npy", "--grad-output"], rc=2)
        os.symlink("q.npy", os.path.join(work, "qlink.npy"))
        r.bad("sdpa paths", sdpa + ["--output", "qlink.npy"], ["qlink.npy", "--q"], rc=2)
        os.link(os.path.join(work, "k.npy"), os.path.join(work, "khard.npy"))
        r.bad("sdpa paths", sdpa + ["--output", "khard.npy"], ["khard.npy", "--k"], rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "o.npy", "--grad-output", "do.npy",
                                    "--grad-dir", "afile"], ["--grad-dir", "afile"], rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "o.npy", "--grad-output", "do.npy",
                                    "--grad-dir", "missing/g"], ["--grad-dir", "missing/g"],
              rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "o.npy", "--grad-output", "do_bad.npy",
                                    "--grad-dir", "newg"], ["--grad-output", "(1, 2, 64, 31)"],
              rc=2)
        r.bad("sdpa paths", sdpa + ["--output", "o.npy", "--lse", "lse.npy", "--grad-output",
                                    "missing.npy", "--grad-dir", "newg"],
              ["--grad-output", "missing.npy"], rc=1)
        r.bad("grad paths", grad + ["--grad-output", "dy_bad.npy", "--out", "newg"],
              ["--grad-output", "(2, 5, 7)"], rc=2)
        r.bad("grad paths", grad + ["--grad-output", "dy.npy", "--out", "afile"],
              ["--out", "afile"], rc=2)
        r.bad("grad paths", grad + ["--grad-output", "dy.npy", "--out", "missing/g"],
              ["--out", "missing/g"], rc=2)
        r.bad("grad paths", ["grad", "--module", "mha", "--d-in", "8", "--d-out", "8",
                             "--heads", "2", "--input", "g/input.npy", "--grad-output",
                             "dy.npy", "--out", "g"], ["g/input.npy"], rc=1)
        save(os.path.join(work, "g", "input.npy"), rng.standard_normal((2, 5, 8)))
        r.bad("grad paths", ["grad", "--module", "mha", "--d-in", "8", "--d-out", "8",
                             "--heads", "2", "--input", "g/input.npy", "--grad-output",
                             "dy.npy", "--out", "g"], ["--out", "g/input.npy", "--input"],
              rc=2)
        os.remove(os.path.join(work, "g", "input.npy"))
        r.bad("train paths", ["train", "--steps", "1", "--save", "adir"],
              ["--save", "adir", "is a directory"], rc=1)
        r.bad("train paths", ["train", "--steps", "1", "--save", "missing/m.safetensors"],
              ["--save", "missing/m.safetensors"], rc=1)

        hm = ["heatmap", "--module", "mha", "--d-in", "8", "--d-out", "8", "--heads", "2",
              "--input", "x.npy"]
        r.bad("heatmap paths", hm + ["--output", "adir"], ["adir"], rc=1)
        r.bad("heatmap paths", hm + ["--terminal", "--save-weights", "missing/w.npy"],
              ["--save-weights", "missing/w.npy"], rc=1)
        r.bad("heatmap paths", hm + ["--terminal", "--save-weights", "x.npy"],
              ["--save-weights", "x.npy", "--input"], rc=2)
        r.bad("heatmap paths", hm + ["--output", "h.npy", "--save-weights", "h.npy"],
              ["h.npy"], rc=2)
        if r.run(hm + ["--output", "probe.png"]).returncode == 0:  # built with libpng
            os.remove(os.path.join(work, "probe.png"))
            write(os.path.join(work, "old.png"), b"an earlier image" * 1000)
            r.bad("heatmap paths", hm + ["--output", "old.png", "--save-weights", "w.npy"],
                  ["old.png", "File too large"], rc=1, file_limit=1024)
            r.bad("heatmap paths", hm + ["--output", "/dev/full", "--save-weights", "w.npy"],
                  ["/dev/full"], rc=1)

        # b. bad inputs: each named, nothing written
        f4 = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }"
        cases = {
            "truncated.npy": npy_bytes(f4 % "(1, 2, 64, 32)", b"\0" * 100),
            "i2.npy": npy_bytes("{'descr': '<i2', 'fortran_order': False, "
                                "'shape': (1, 2, 64, 32), }", b"\0" * 8192),
            "c8.npy": npy_bytes("{'descr': '<c8', 'fortran_order': False, "
                                "'shape': (1, 2, 64, 32), }", b"\0" * 32768),
            "rank3.npy": npy_bytes(f4 % "(2, 64, 32)", b"\0" * 16384),
            "scalar.npy": npy_bytes(f4 % "()", b"\0" * 4),
            "fortran.npy": npy_bytes("{'descr': '<f4', 'fortran_order': True, "
                                     "'shape': (1, 2, 64, 32), }", b"\0" * 16384),
            "empty.npy": b"",
            "magic.npy": b"\x93NUMPZ\x01\x00" + b"\0" * 100,
            "hugeheader.npy": b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{",
            "longheader.npy": npy_bytes(f4 % "(1, 2, 64, 32)" + " " * 70000, b"",
                                        version=(2, 0)),
            "hugeshape.npy": npy_bytes(f4 % "(99999999999, 99999999999, 99999999999, 2)"),
            "notdict.npy": npy_bytes("[1, 2, 3]", b"\0" * 16),
            "dupkey.npy": npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                                    "'shape': (1, 2, 64, 32), }", b"\0" * 32768),
            "zeros.npy": npy_bytes(f4 % "(1, 2, 0, 32)"),
            "badshape.npy": npy_bytes(f4 % "(1, 2, -64, 32)"),
        }
        for name, data in cases.items():
            write(os.path.join(work, name), data)
        for name in cases:
            for opt in ("--q", "--k", "--v"):
                args = ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy"]
                args[args.index(opt) + 1] = name
                r.bad("sdpa inputs", args + ["--output", "o.npy", "--lse", "lse.npy"],
                      [opt])
            r.bad("sdpa inputs", sdpa + ["--output", "o.npy", "--grad-output", name,
                                         "--grad-dir", "newg"], ["--grad-output"])
            r.bad("forward inputs", ["forward", "--module", "mha", "--d-in", "8", "--d-out",
                                     "8", "--heads", "2", "--input", name, "--output",
                                     "o.npy"], ["input"])
            r.bad("grad inputs", grad + ["--grad-output", name, "--out", "g"],
                  ["--grad-output"])
        sfx = {
            "trunc.safetensors": safetensors_bytes('{"a":{"dtype":"F32","shape":[4],'
                                                   '"data_offsets":[0,16]}}', b"\0" * 8),
            "hugelen.safetensors": struct.pack("<Q", 2 ** 63) + b"{}",
            "notjson.safetensors": safetensors_bytes("{nope"),
            "i32.safetensors": safetensors_bytes('{"W_query.weight":{"dtype":"I32","shape":'
                                                 '[8,8],"data_offsets":[0,256]}}',
                                                 b"\0" * 256),
            "empty.safetensors": b"",
            "missing.safetensors": safetensors_bytes("{}"),
        }
        for name, data in sfx.items():
            write(os.path.join(work, name), data)
            r.bad("forward weights", fwd + ["--output", "o.npy", "--weights", name], [name])
        # a FIFO where a file read by its size belongs: refused at once, not
        # after waiting for a writer that never comes
        os.mkfifo(os.path.join(work, "in.fifo"))
        r.bad("fifo inputs", fwd + ["--output", "o.npy", "--weights", "in.fifo"],
              ["--weights", "in.fifo", "not a regular file"], rc=1, timeout=10)
        r.bad("fifo inputs", ["generate", "--weights", "in.fifo", "--prompt-ids", "1,2",
                              "--max-new-tokens", "2"],
              ["--weights", "in.fifo", "not a regular file"], rc=1, timeout=10)
        r.bad("fifo inputs", ["generate", "--random-init", "1", "--preset", "gpt2-tiny",
                              "--prompt", "abc", "--tokenizer", "in.fifo",
                              "--max-new-tokens", "1"],
              ["--tokenizer", "in.fifo", "not a regular file"], rc=1, timeout=10)
        r.bad("fifo inputs", ["pretrain", "--resume", "in.fifo", "--text",
                              os.path.join(DATA, "the-verdict.txt"), "--tokenizer",
                              os.path.join(DATA, "gpt2-bpe")],
              ["--resume", "in.fifo", "not a regular file"], rc=1, timeout=10)
        os.remove(os.path.join(work, "in.fifo"))
        # several --text files are joined with <|endoftext|>: a tokenizer without that
        # token (a tiktoken file's, Llama 3's) is refused for it, not for a name no file holds
        write(os.path.join(work, "bytes.tiktoken"), b"".join(
            base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256)))
        write(os.path.join(work, "a.txt"), b"one two three " * 40)
        write(os.path.join(work, "v512.json"), b'{"vocab_size": 512, "context_length": 8, '
              b'"emb_dim": 8, "n_heads": 2, "n_layers": 1, "drop_rate": 0.0, "qkv_bias": false}')
        r.bad("pretrain inputs", ["pretrain", "--config", "v512.json", "--text", "a.txt",
                                  "a.txt", "--tokenizer", "bytes.tiktoken"],
              ["--text: 2 files are joined with <|endoftext|>", "bytes.tiktoken"], rc=2)

        # c. size limits: the earlier outputs survive byte for byte
        big = ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy"]
        r.bad("size limit", big + ["--output", "o.npy"], ["o.npy", "File too large"], rc=1,
              file_limit=8192)
        r.bad("size limit", big + ["--output", "o.npy", "--lse", "lse.npy", "--grad-output",
                                   "do.npy", "--grad-dir", "g"], ["File too large"], rc=1,
              file_limit=8192)
        r.bad("size limit", big + ["--output", "o.npy", "--lse", "lse.npy", "--grad-output",
                                   "do.npy", "--grad-dir", "newg"], ["File too large"], rc=1,
              file_limit=8192)
        # the output and lse fit under the limit, the first gradient does not: the
        # files written before it must not change either
        save(os.path.join(work, "v1.npy"), rng.standard_normal((B, H, T, 1)))
        save(os.path.join(work, "do1.npy"), rng.standard_normal((B, H, T, 1)))
        r.bad("size limit", ["sdpa", "--q", "q.npy", "--k", "k.npy", "--v", "v1.npy",
                             "--output", "o.npy", "--lse", "lse.npy", "--grad-output",
                             "do1.npy", "--grad-dir", "g"], ["g/dq.npy", "File too large"],
              rc=1, file_limit=4096)
        r.bad("size limit", fwd + ["--output", "o.npy"], ["o.npy", "File too large"], rc=1,
              file_limit=200)
        r.bad("size limit", grad + ["--grad-output", "dy.npy", "--out", "g"],
              ["File too large"], rc=1, file_limit=200)
        save(os.path.join(work, "old.safetensors"), np.zeros(1))  # any earlier bytes
        r.bad("size limit", ["train", "--steps", "1", "--save", "old.safetensors"],
              ["--save", "old.safetensors", "File too large"], rc=1, file_limit=4096)

        # d. stdout that fails: the files stay out of place, the old ones as they were
        if os.path.exists("/dev/full"):
            png = r.run(hm + ["--output", "probe.png"]).returncode == 0
            if png:
                os.remove(os.path.join(work, "probe.png"))
            r.bad_stdout("stdout", ["train", "--steps", "2", "--eval", "4", "--save",
                                    "tr.safetensors"])
            r.bad_stdout("stdout", ["train", "--steps", "2", "--eval", "4", "--save",
                                    "old.safetensors"])
            # each case its own names: a file one left would hide the next one's
            r.bad_stdout("stdout", hm + ["--terminal", "--save-weights", "hw1.npy"])
            # a drawing past stdio's buffer: the write fails while it prints
            r.bad_stdout("stdout", ["heatmap", "--module", "mha", "--d-in", "8", "--d-out",
                                    "8", "--heads", "2", "--text", " ".join(["w"] * 40),
                                    "--terminal", "--save-weights", "hw2.npy"])
            if png:
                r.bad_stdout("stdout", hm + ["--output", "hm3.png", "--save-weights",
                                             "hw3.npy"])
                r.bad_stdout("stdout", hm + ["--output", "hm4.png", "--terminal",
                                             "--save-weights", "hw4.npy"])
                r.bad_stdout("stdout", ["mask", "--q-len", "64", "--show", "--png", "m.png"])
            text = os.path.join(work, "text.txt")
            with open(os.path.join(DATA, "the-verdict.txt"), encoding="utf-8") as f:
                write(text, f.read()[:3000].encode())
            cfg = os.path.join(work, "cfg.json")
            write(cfg, b'{"vocab_size": 50257, "context_length": 8, "emb_dim": 8, '
                       b'"n_heads": 2, "n_layers": 1, "drop_rate": 0.0, "qkv_bias": false}')
            r.bad_stdout("stdout", ["pretrain", "--config", cfg, "--text", text, "--tokenizer",
                                    os.path.join(DATA, "gpt2-bpe"), "--epochs", "2",
                                    "--max-length", "8", "--stride", "8", "--save", "p.st"]
                         + (["--plot", "p.png"] if png else []))
            # stdout closed: the first file opened must not take its number, or
            # what is printed lands in an output (the plot, the checkpoint)
            r.bad_stdout("stdout", ["pretrain", "--config", cfg, "--text", text, "--tokenizer",
                                    os.path.join(DATA, "gpt2-bpe"), "--epochs", "2",
                                    "--max-length", "8", "--stride", "8", "--save", "pc.st"]
                         + (["--plot", "pc.png"] if png else []), closed=True)
            r.bad_stdout("stdout", ["train", "--steps", "2", "--eval", "4", "--save",
                                    "old.safetensors"], closed=True)
            r.bad_stdout("stdout", hm + ["--terminal", "--save-weights", "hw5.npy"],
                         closed=True)

        # the good runs: what the line says is there, nothing else is
        before = set(os.listdir(work))
        res = r.run(sdpa + ["--output", "o2.npy", "--lse", "lse2.npy", "--grad-output",
                            "do.npy", "--grad-dir", "g2"])
        want = ("attn: wrote o2.npy (1x2x64x32 float32), lse2.npy (1x2x64 float32), "
                "g2/dq.npy (1x2x64x32 float32), g2/dk.npy (1x2x64x32 float32), "
                "g2/dv.npy (1x2x64x32 float32)\n")
        check(res.returncode == 0 and res.stderr == want, "sdpa says what it wrote",
              "rc=%s stderr=%r" % (res.returncode, res.stderr))
        check(set(os.listdir(work)) - before == {"o2.npy", "lse2.npy", "g2"}
              and sorted(os.listdir(os.path.join(work, "g2"))) == ["dk.npy", "dq.npy",
                                                                    "dv.npy"],
              "sdpa wrote those files and no temporary", repr(sorted(os.listdir(work))))
        o2 = os.path.join(work, "o2.npy")
        check(os.path.exists(o2) and np.load(o2).shape == (1, 2, 64, 32), "o2.npy loads")
        res = r.run(fwd + ["--output", "y.npy"])
        check(res.returncode == 0 and res.stderr == "attn: wrote y.npy (2x5x8 float32)\n",
              "forward says what it wrote", res.stderr)
        res = r.run(grad + ["--grad-output", "dy.npy", "--out", "gg"])
        names = ["output", "input", "W_query.weight", "W_key.weight", "W_value.weight",
                 "out_proj.weight", "out_proj.bias"]
        check(res.returncode == 0 and res.stderr.count("\n") == 1
              and all("gg/%s.npy" % n in res.stderr for n in names)
              and sorted(os.listdir(os.path.join(work, "gg"))) == sorted(n + ".npy"
                                                                         for n in names),
              "grad says what it wrote, and wrote only that", res.stderr)
        # a directory given with its trailing slash is joined without "//"
        res = r.run(grad + ["--grad-output", "dy.npy", "--out", "gg3/"])
        check(res.returncode == 0 and "//" not in res.stderr
              and all("gg3/%s.npy" % n in res.stderr for n in names),
              "grad --out DIR/ names its files DIR/NAME.npy", res.stderr)
        # --output /dev/stdout on a file the shell appends to (>>): written
        # after the file's bytes, which stay; a refused run leaves them alone;
        # /dev/stdin, the file < reads, is refused and stays as it was
        log = os.path.join(work, "log.txt")
        for args, rc in ((sdpa, 0), (["sdpa", "--q", "missing.npy", "--k", "k.npy", "--v",
                                      "v.npy"], 1)):
            write(log, b"keep me\n")
            with open(log, "ab") as f:
                res = subprocess.run([attn] + args + ["--output", "/dev/stdout"], cwd=work,
                                     stdout=f, stderr=subprocess.PIPE, timeout=60)
            with open(log, "rb") as f:
                data = f.read()
            check(res.returncode == rc and data.startswith(b"keep me\n")
                  and (rc or np.load(io.BytesIO(data[8:])).shape == (1, 2, 64, 32))
                  and (not rc or data == b"keep me\n"),
                  "attn %s --output /dev/stdout >> log: exits %d, log's bytes kept"
                  % (" ".join(args), rc), "rc=%s log=%r" % (res.returncode, data[:40]))
        with open(log, "rb") as f:
            res = subprocess.run([attn] + sdpa + ["--output", "/dev/stdin"], cwd=work,
                                 stdin=f, capture_output=True, timeout=60)
        with open(log, "rb") as f:
            data2 = f.read()
        check(res.returncode == 1 and b"/dev/stdin" in res.stderr and data2 == data,
              "attn sdpa --output /dev/stdin < log: refused, log as it was",
              "rc=%s stderr=%r" % (res.returncode, res.stderr))
        leftovers = [n for _, _, files in os.walk(work) for n in files if "attn-tmp" in n]
        check(not leftovers, "no temporary anywhere", repr(leftovers))

    print("cases per surface: " + ", ".join("%s %d" % kv for kv in sorted(counts.items())))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
