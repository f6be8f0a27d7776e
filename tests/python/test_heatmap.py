"""attn heatmap end to end: the weights it draws are PyTorch's, the PNG
decodes (a small PNG reader below: zlib and the five filters), has the
documented size, and its pixels follow the weights (the brightest cell is
where the weight is largest; brighter wherever the weight is larger; the
masked future is grey hatching); --head, --all-heads, .npy input,
--terminal and the usage errors.
usage: test_heatmap.py ATTN_CLI
"""
import os
import struct
import subprocess
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "conformance"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import seed_modules as S  # noqa: E402

cli = sys.argv[1]
tmp = tempfile.mkdtemp(prefix="attn_heatmap_")
passed = failed = 0
SENTENCE = "Your journey starts with one step"


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def run(*args):
    return subprocess.run([cli, "heatmap", *args], capture_output=True, text=True)


def read_png(path):
    """8-bit RGB, non-interlaced: (height, width, 3) uint8."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "PNG signature"
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"CRC of {kind}"
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = ihdr
    assert depth == 8 and colour == 2 and interlace == 0, ihdr
    raw = zlib.decompress(idat)
    stride = width * 3
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.int32)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        if f == 0:
            prev = line
            out[y] = line
            continue
        if f == 2:
            prev = (line + prev) & 0xFF
            out[y] = prev
            continue
        cur = np.zeros(stride, np.int32)
        for x in range(stride):
            a = cur[x - 3] if x >= 3 else 0
            b = prev[x]
            c = prev[x - 3] if x >= 3 else 0
            if f == 0:
                p = 0
            elif f == 1:
                p = a
            elif f == 2:
                p = b
            elif f == 3:
                p = (a + b) // 2
            else:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                p = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            cur[x] = (line[x] + p) & 0xFF
        out[y] = cur
        prev = cur
    return out.reshape(height, width, 3)


def layout(T, P, n, caption):
    """docs/cli.md's formulas; caption: the line naming the module, the batch element
    and the mode."""
    c = min(40, max(8, 480 // T))
    s = 2 if c >= 20 else 1
    L = 6 * s * n + 6
    A = 7 * s + 8
    C = 7 * s + 8
    cols = min(P, 4)
    rows = (P + cols - 1) // cols
    width = max(10 + cols * (L + T * c) + 16 * (cols - 1) + 16 + 14 + 4 + 30 * s + 10,
                10 + 6 * s * len(caption) + 10)
    height = 10 + C + rows * (A + L + T * c) + 16 * (rows - 1) + 10
    def cell_centre(p, i, j):
        col, row = p % cols, p // cols
        gx = 10 + col * (L + T * c + 16) + L
        gy = 10 + C + row * (A + L + T * c + 16) + A + L
        return gy + i * c + c // 2 - 1, gx + j * c + c // 2 - 1
    return width, height, cell_centre


def luminance(rgb):
    r, g, b = (float(v) for v in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def check_pixels(img, weights, T, n, causal, what, module, batch=0):
    P = weights.shape[0]
    width, height, centre = layout(T, P, n, f"{module}, batch {batch}, eval mode")
    check(img.shape == (height, width, 3), f"{what}: size {img.shape[1]}x{img.shape[0]}, "
          f"documented {width}x{height}")
    if img.shape != (height, width, 3):
        return
    lum, wts = [], []
    for p in range(P):
        for i in range(T):
            for j in range(T):
                px = img[centre(p, i, j)]
                if causal and j > i:
                    check(px[0] == px[1] == px[2] and px[0] >= 180, f"{what}: masked cell grey {px}")
                    continue
                check(not (px[0] == px[1] == px[2]), f"{what}: cell ({p},{i},{j}) coloured {px}")
                lum.append(luminance(px))
                wts.append(weights[p, i, j])
    lum, wts = np.array(lum), np.array(wts)
    check(wts[np.argmax(lum)] == wts.max(), f"{what}: the brightest cell holds the largest weight")
    vmax = wts.max()
    order_ok = all(lum[a] < lum[b] for a in range(len(wts)) for b in range(len(wts))
                   if wts[b] - wts[a] > 0.02 * vmax)
    check(order_ok, f"{what}: luminance rises with the weight")


def torch_causal_weights(seed, d_in, d_out, x):
    torch.manual_seed(seed)
    m = S.CausalAttention(d_in, d_out, x.shape[0], 0.0)
    with torch.no_grad():
        q, k = m.W_query(x), m.W_key(x)
        scores = (q @ k.T).masked_fill(torch.triu(torch.ones(6, 6), 1).bool(), -torch.inf)
        return torch.softmax(scores / d_out ** 0.5, dim=-1).numpy()


# 1. The seeds' sentence through CausalAttention(3, 2): torch's weights, drawn.
png, npy = os.path.join(tmp, "causal.png"), os.path.join(tmp, "causal.npy")
r = run("--module", "causal", "--d-out", "2", "--text", SENTENCE, "--output", png,
        "--save-weights", npy)
check(r.returncode == 0, f"causal heatmap: {r.stderr}")
inputs = torch.tensor([[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
                       [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]])
want = torch_causal_weights(123, 3, 2, inputs)
got = np.load(npy)
check(got.shape == (1, 6, 6) and np.abs(got[0] - want).max() <= 1e-6,
      f"drawn weights are torch's (max error {np.abs(got[0] - want).max():.2e})")
check_pixels(read_png(png), got, 6, len("journey"), True, "causal", "CausalAttention")
print(f"causal: {r.stdout.strip()}")

# 2. MultiHeadAttention, all heads and one head; GPT-2 with 4 heads.
png2, npy2 = os.path.join(tmp, "mha.png"), os.path.join(tmp, "mha.npy")
r = run("--module", "mha", "--heads", "2", "--d-out", "4", "--text", SENTENCE, "--all-heads",
        "--output", png2, "--save-weights", npy2, "--seed", "5")
check(r.returncode == 0, f"mha heatmap: {r.stderr}")
both = np.load(npy2)
check(both.shape == (2, 6, 6), f"two panels {both.shape}")
check_pixels(read_png(png2), both, 6, 7, True, "mha all heads", "MultiHeadAttention")
r = run("--module", "mha", "--heads", "2", "--d-out", "4", "--text", SENTENCE, "--head", "1",
        "--output", png2, "--save-weights", npy2, "--seed", "5")
check(r.returncode == 0 and np.array_equal(np.load(npy2)[0], both[1]), "--head 1 is panel 1")
check_pixels(read_png(png2), np.load(npy2), 6, 7, True, "mha head 1", "MultiHeadAttention")
words = "the quick brown fox jumps over the lazy dog while the cat sleeps"
r = run("--module", "gpt2", "--heads", "4", "--d-in", "32", "--text", words, "--output", png2,
        "--save-weights", npy2, "--seed", "7")
check(r.returncode == 0, f"gpt2 heatmap: {r.stderr}")
check_pixels(read_png(png2), np.load(npy2), 13, 6, True, "gpt2 4 heads", "CausalSelfAttention")
# one token: the caption is wider than the panel, and the image holds it whole
r = run("--module", "mha-wrapper", "--d-out", "4", "--text", "step", "--output", png2)
img = read_png(png2)
caption = "MultiHeadAttentionWrapper, batch 0, eval mode"
width, height, _ = layout(1, 1, 4, caption)
check(r.returncode == 0 and img.shape == (height, width, 3) and width == 20 + 12 * len(caption),
      f"one token: {img.shape[1]}x{img.shape[0]} holds the caption ({width}x{height})")
# the same word gets the same embedding: 'the' rows 0, 6 and 10 see the same keys as queries
# 3. .npy input (positions as labels), batch selection, a non-causal module.
x = np.random.default_rng(1).random((3, 20, 8), dtype=np.float32)
xin = os.path.join(tmp, "x.npy")
np.save(xin, x)
r = run("--module", "sa2", "--d-out", "4", "--input", xin, "--batch", "2", "--output", png2,
        "--save-weights", npy2)
check(r.returncode == 0, f"sa2 heatmap: {r.stderr}")
check_pixels(read_png(png2), np.load(npy2), 20, 2, False, "sa2 on .npy, batch 2",
             "SelfAttention_v2", batch=2)
torch.manual_seed(123)
sa2 = S.SelfAttention_v2(8, 4)
with torch.no_grad():
    xb = torch.from_numpy(x[2])
    w = torch.softmax((sa2.W_query(xb) @ sa2.W_key(xb).T) / 2.0, dim=-1).numpy()
check(np.abs(np.load(npy2)[0] - w).max() <= 1e-6, "sa2 weights of batch element 2 are torch's")

# 4. The terminal.
r = run("--module", "causal", "--d-out", "2", "--text", SENTENCE, "--terminal")
check(r.returncode == 0 and r.stdout.count("\x1b[48;2;") >= 36 and "journey" in r.stdout
      and "masked (future)" in r.stdout, "terminal drawing")
# a word's control bytes are not sent to the terminal: an escape in --text shows as '?'
r = run("--module", "causal", "--d-out", "2", "--text", "a\x1b[31mred b", "--terminal")
check(r.returncode == 0 and "a?[31mred " in r.stdout and "\x1b[31m" not in r.stdout,
      "terminal drawing: --text's escape bytes shown as '?'")

# 5. Usage errors.
for args, fragment in [
    (["--module", "causal", "--d-out", "2", "--text", "a b", "--input", xin, "--terminal"],
     "exactly one of --input and --text"),
    (["--module", "causal", "--d-out", "2", "--text", "a b"], "give --output FILE.png, --terminal"),
    (["--module", "mha", "--heads", "2", "--d-out", "4", "--text", SENTENCE, "--head", "2",
      "--terminal"], "--head: 2 is out of range: the module has 2 heads"),
    (["--module", "sa2", "--d-out", "4", "--input", xin, "--batch", "3", "--terminal"],
     "--batch: 3 is out of range: the input has 3 batch elements"),
    (["--module", "causal", "--d-out", "2", "--text", "   ", "--terminal"], "--text: no words"),
    (["--module", "mha", "--heads", "2", "--d-out", "4", "--text", "a", "--head", "0",
      "--all-heads", "--terminal"], "--head and --all-heads exclude each other"),
]:
    r = run(*args)
    check(r.returncode == 2 and fragment in r.stderr, f"{args}: rc {r.returncode}, {r.stderr!r}")
r = run("--module", "causal", "--d-out", "2", "--text", "a b", "--output", "/nonexistent/x.png")
check(r.returncode == 1 and "/nonexistent/x.png: cannot open for writing" in r.stderr, r.stderr)

for f in os.listdir(tmp):
    os.remove(os.path.join(tmp, f))
os.rmdir(tmp)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
