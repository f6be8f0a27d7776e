"""The book's chapter-5 run, attn against PyTorch 2.15, in the same run.

    .venv-peers/bin/python bench/pretrain_peer.py ./build/attn [--threads 1,2]
        [--epochs 10] [--out FILE] [--plot FILE.png]

For each thread count, alternating: `attn pretrain` (GPT_CONFIG_124M with
context 256, the-verdict.txt, AdamW lr 0.0004 weight decay 0.1, batch 2,
eval_freq 5, eval_iter 5, seed 123: the book's notebook run) and the book's
own code (llms_from_scratch 1.0.19: ch04 GPTModel, ch02
create_dataloader_v1, ch05 train_model_simple) under PyTorch 2.15 in a
child process, each timed whole (wall clock from start to exit: model
init, data, training, evaluation and samples) with its peak resident
memory (the child's ru_maxrss). Then:
  - every printed loss of attn against PyTorch at the same thread count,
    and PyTorch at 1 thread against PyTorch at 2 (the peer's own spread);
  - each epoch's sample, token for token;
  - training throughput: tokens seen / wall, and 6 * params * tokens
    (forward + backward FLOPs of the training steps alone) / wall as a
    fraction of the machine's SGEMM (torch.mm of 2048^3 in float32, the
    same thread count, median of 5).
tiktoken's "gpt2" encoding is built offline from data/gpt2-bpe.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "data")
CFG = {"vocab_size": 50257, "context_length": 256, "emb_dim": 768, "n_heads": 12,
       "n_layers": 12, "drop_rate": 0.1, "qkv_bias": False}
LINE = re.compile(r"^Ep (\d+) \(Step (\d+)\): Train loss ([-\d.naif]+), Val loss ([-\d.naif]+)$")


def gpt2_encoding():
    """tiktoken's "gpt2" Encoding from encoder.json, with no download: the
    ranks are the ids, bytes decoded through GPT-2's byte-to-unicode map."""
    import tiktoken
    with open(os.path.join(DATA, "gpt2-bpe", "encoder.json"), encoding="utf-8") as f:
        encoder = json.load(f)
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
                 + list(range(ord("\xae"), ord("\xff") + 1)))
    chars, n = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    byte_of = {chr(c): b for b, c in zip(printable, chars)}
    ranks = {bytes(byte_of[ch] for ch in token): rank for token, rank in encoder.items()
             if token != "<|endoftext|>"}
    pattern = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    return tiktoken.Encoding(name="gpt2", pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": encoder["<|endoftext|>"]})


def plotting_stand_ins():
    """llms_from_scratch.ch05 imports matplotlib and tqdm at module level;
    this run never plots, so empty modules stand in where they are missing."""
    import importlib.machinery
    import types
    for name in ("matplotlib", "matplotlib.pyplot", "matplotlib.ticker", "tqdm"):
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None)  # torch probes specs
            stub.MaxNLocator = stub.tqdm = None
            sys.modules[name] = stub
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, stub)


def torch_child(threads, epochs):
    """The book's notebook run, printed as the book prints it."""
    import tiktoken
    import torch
    plotting_stand_ins()
    enc = gpt2_encoding()
    tiktoken.get_encoding = lambda name: enc  # create_dataloader_v1 asks for "gpt2"
    from llms_from_scratch.ch02 import create_dataloader_v1
    from llms_from_scratch.ch04 import GPTModel
    from llms_from_scratch.ch05 import train_model_simple
    torch.set_num_threads(threads)
    with open(os.path.join(DATA, "the-verdict.txt"), encoding="utf-8") as f:
        text = f.read()
    split = int(0.90 * len(text))
    torch.manual_seed(123)
    model = GPTModel(CFG)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0004, weight_decay=0.1)
    ctx = CFG["context_length"]
    train_loader = create_dataloader_v1(text[:split], batch_size=2, max_length=ctx, stride=ctx,
                                        drop_last=True, shuffle=True, num_workers=0)
    val_loader = create_dataloader_v1(text[split:], batch_size=2, max_length=ctx, stride=ctx,
                                      drop_last=False, shuffle=False, num_workers=0)
    train_model_simple(model, train_loader, val_loader, optimizer, "cpu", num_epochs=epochs,
                       eval_freq=5, eval_iter=5, start_context="Every effort moves you",
                       tokenizer=enc)


def sgemm_gflops(threads):
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.mm(a, b)
    times = []
    for _ in range(5):
        t = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - t)
    return 2 * 2048**3 / sorted(times)[2] / 1e9


def parse(lines):
    losses, samples = [], []
    for line in lines:
        m = LINE.match(line)
        if m:
            losses.append((int(m.group(1)), int(m.group(2)), float(m.group(3)),
                           float(m.group(4))))
        elif line.strip():
            samples.append(line)
    return losses, samples


def peak_rss_mib(cmd):
    """Runs cmd and returns (stdout lines, wall s, peak RSS MiB) via wait4."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out_chunks = []
    while True:
        chunk = p.stdout.read(65536)
        if not chunk:
            break
        out_chunks.append(chunk)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"pretrain_peer: {' '.join(cmd[:3])} ... failed ({p.returncode}):\n"
                 f"{err.decode(errors='replace')[-2000:]}")
    return b"".join(out_chunks).decode().splitlines(), wall, usage.ru_maxrss / 1024


def train_tokens(epochs):
    """Tokens the training steps see: epochs x full batches of 2 windows."""
    with open(os.path.join(DATA, "the-verdict.txt"), encoding="utf-8") as f:
        text = f.read()
    ids = gpt2_encoding().encode(text[:int(0.90 * len(text))])
    ctx = CFG["context_length"]
    windows = len(range(0, len(ids) - ctx, ctx))
    return epochs * (windows // 2) * 2 * ctx


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("attn")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--out")
    ap.add_argument("--plot", help="attn's first run also draws its loss plot here (PNG)")
    ap.add_argument("--torch-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--sgemm-child", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_child:
        torch_child(a.torch_child, a.epochs)
        return
    if a.sgemm_child:
        print(sgemm_gflops(a.sgemm_child))
        return

    import torch
    from llms_from_scratch.ch04 import GPTModel
    torch.manual_seed(123)
    params = sum(p.numel() for p in GPTModel(CFG).parameters())
    report = [f"# bench/pretrain_peer.py {a.attn}: the book's 124M run, {a.epochs} epochs",
              f"# torch {torch.__version__}; params {params}; "
              f"cpu {cpu_model()}; threads {a.threads}"]
    results = {}
    for threads in [int(t) for t in a.threads.split(",")]:
        attn_cmd = [a.attn, "pretrain", "--preset", "gpt2-small", "--text",
                    os.path.join(DATA, "the-verdict.txt"), "--tokenizer",
                    os.path.join(DATA, "gpt2-bpe"), "--epochs", str(a.epochs),
                    "--threads", str(threads), "--seed", "123"]
        if a.plot and threads == int(a.threads.split(",")[0]):
            attn_cmd += ["--plot", a.plot]
        torch_cmd = [sys.executable, os.path.abspath(__file__), a.attn,
                     "--torch-child", str(threads), "--epochs", str(a.epochs)]
        for name, cmd in (("attn", attn_cmd), ("torch", torch_cmd)):
            lines, wall, rss = peak_rss_mib(cmd)
            results[(name, threads)] = (parse(lines), wall, rss)
        gemm = float(subprocess.run([sys.executable, os.path.abspath(__file__), a.attn,
                                     "--sgemm-child", str(threads)], capture_output=True,
                                    text=True, check=True).stdout)
        (la, sa), wa, ra = results[("attn", threads)]
        (lt, st), wt, rt = results[("torch", threads)]
        diffs = [max(abs(x[2] - y[2]), abs(x[3] - y[3])) for x, y in zip(la, lt)]
        same_samples = sum(x == y for x, y in zip(sa, st))
        tokens = train_tokens(a.epochs)
        report += [
            f"threads {threads}: wall attn {wa:.1f} s, torch {wt:.1f} s: torch/attn "
            f"{wt / wa:.2f}x; peak RSS attn {ra:.0f} MiB, torch {rt:.0f} MiB",
            f"  losses: {len(la)} printed lines (torch {len(lt)}); max |attn - torch| "
            f"{max(diffs) if diffs else float('nan'):.4f}; samples identical "
            f"{same_samples}/{len(st)}",
            f"  training tokens {tokens}: attn {tokens / wa:.0f} tok/s, torch {tokens / wt:.0f} "
            f"tok/s; 6*params*tokens / wall: attn {6 * params * tokens / wa / 1e9:.1f} GFLOP/s "
            f"= {6 * params * tokens / wa / 1e9 / gemm:.2f} of SGEMM ({gemm:.0f} GFLOP/s, "
            f"torch.mm 2048^3)"]
    threads = sorted({t for _, t in results})
    if len(threads) >= 2:
        (l1, s1), _, _ = results[("torch", threads[0])]
        (l2, s2), _, _ = results[("torch", threads[1])]
        d = [max(abs(x[2] - y[2]), abs(x[3] - y[3])) for x, y in zip(l1, l2)]
        report.append(f"torch {threads[0]} vs {threads[1]} threads: max |diff| "
                      f"{max(d) if d else float('nan'):.4f}; samples identical "
                      f"{sum(x == y for x, y in zip(s1, s2))}/{len(s1)}")
    for (name, t), ((losses, samples), _, _) in sorted(results.items()):
        report.append(f"## {name}, {t} thread(s)")
        report += [f"Ep {e} (Step {s:06d}): Train loss {tr:.3f}, Val loss {va:.3f}"
                   for e, s, tr, va in losses]
        report += samples
    text = "\n".join(report) + "\n"
    print(text, end="")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
