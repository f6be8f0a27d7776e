"""attn.torch's FlexAttention API (python/attn/flex.py) against PyTorch math.

Part (a), the tracer and the block maps, runs on any libattn of this ABI:
  - mask_mods (causal with offsets, windows in their abs forms, chunks,
    prefix-LM, documents, key padding, global tokens, and_masks / or_masks
    / & | ~ of them) are recognised as attn's primitives, and the traced
    description evaluated on the (B, H, T, S) index grid equals the
    mask_mod itself called on it, with fresh random parameters;
  - score_mods (scales, softcaps, captured biases indexed by any subset of
    b, h, q_idx, kv_idx, ALiBi in both forms, relative tables indexed by
    q_idx - kv_idx + c or kv_idx - q_idx + c (negative indices from the
    end, as PyTorch reads them; past the end an IndexError), T5 buckets,
    chains) become
    the chain of attn_score_mod entries that, applied in torch to random
    scores, equals the score_mod applied to them; t5_relative_bucket
    equals T5's bucketing written out element by element;
  - what is not recognised: a mask_mod falls back to the dense grid, a
    score_mod raises ValueError naming the operation, a mask_mod that
    raises propagates naming create_block_mask, one whose result does
    not broadcast to the grid or that reads per-batch lengths past their
    end raises naming the shapes;
  - create_block_mask's BlockMask: to_string() and sparsity() equal a
    Python classification of the mask's tiles; from_kv_blocks likewise;
    the C map freed with the object.
Part (b), end to end, needs attention that applies block maps and score
modifiers (the flex backend); where the library has none it is skipped
with "needs the flex backend" (and fails where the library has the mask
descriptions but its attention ignores maps): flex_attention and SDPA's
attn_mask (bool and additive) against a float64 torch oracle (dense masked
softmax under autograd): out, lse, dq, dk, dv and the captured bias's and
the additive mask's gradients within 1e-5 relative L2 in float32,
gradcheck in float64, GQA, maps made for one sequence or head (B=1, H=1)
whose mask_mod reads b or h on a call of more (the call's own map, as
PyTorch's eager kernels; refused, naming the block, where its compiled
ones would differ), fully masked rows (zeros, lse -inf), NaN or +inf
in an additive mask (PyTorch's answer: NaN rows), and maps from the mask
descriptions equal to the dense ones; flash_attn_varlen_func with a
block_mask and a score_mod over packed sequences (in each sequence's own
positions, a map longer than the longest) against each sequence alone in
float64 torch, out, lse and the gradients (a per-sequence bias's, T5's
table) within 1e-5; dq of a relative table's and T5's bias that ask for
their gradient, on q and k sharing a large component, within 2x PyTorch
float32's error against float64 (the median of 8 cases; the forward runs
on the fused kernels there, the backward on the flex ones); W_key's
gradient of q, k, v = x W on rows sharing one large component, through a
relative table with its gradient and a block mask of a window and global
keys (one pass and two), within 0.5x PyTorch float32's (median of 8).

usage: test_flex_python.py LIBATTN_SO   (seed: ATTN_TEST_SEED, else random)
"""
import gc
import math
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if len(sys.argv) > 1:
    os.environ["ATTN_LIBRARY"] = sys.argv[1]
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402

import attn  # noqa: E402
import attn.torch as AT  # noqa: E402
from attn import _lib, flex  # noqa: E402

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)
        sys.stdout.flush()


seed = int(os.environ.get("ATTN_TEST_SEED", int.from_bytes(os.urandom(4), "little") % 100000))
print(f"attn {attn.__version__} from {_lib.path}; torch {torch.__version__}; seed {seed}")
torch.manual_seed(seed)
rng = random.Random(seed)
torch.set_num_threads(2)


def grid(B, H, T, S):
    return (torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1),
            torch.arange(T).view(1, 1, T, 1), torch.arange(S).view(1, 1, 1, S))


def dense(mask_mod, B, H, T, S):
    return torch.as_tensor(mask_mod(*grid(B, H, T, S))).to(torch.bool).expand(B, H, T, S)


# ---- (a) mask_mods: traced description == the function on the grid -------------------


def mask_cases(B, H, T, S):
    """(name, mask_mod, the _Mask class the tracer must find or None: any)."""
    c = rng.randint(-5, 5)
    W = rng.randint(0, 9)
    C = rng.randint(1, 12)
    P = rng.randint(0, S)
    G = rng.randint(0, 6)
    doc = torch.sort(torch.randint(0, 4, (max(T, S),)))[0]
    docb = torch.sort(torch.randint(0, 4, (B, max(T, S))), dim=1)[0]
    lengths = torch.randint(0, S + 1, (B,))
    prefix = torch.randint(0, S + 1, (B,))
    p0 = torch.tensor(P)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding(b, h, q_idx, kv_idx):
        return q_idx - kv_idx <= W

    cases = [
        ("causal", causal, flex._Band),
        ("causal offset", lambda b, h, q_idx, kv_idx: q_idx + c >= kv_idx, flex._Band),
        ("kv <= q + c", lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + c, flex._Band),
        ("anti-causal", lambda b, h, q_idx, kv_idx: kv_idx > q_idx, flex._Band),
        ("diagonal", lambda b, h, q_idx, kv_idx: q_idx == kv_idx + c, flex._Band),
        ("off-diagonal", lambda b, h, q_idx, kv_idx: q_idx != kv_idx, None),
        ("causal window", lambda b, h, q_idx, kv_idx: (q_idx - kv_idx <= W) & (q_idx >= kv_idx),
         flex._Band),
        ("abs window", lambda b, h, q_idx, kv_idx: abs(q_idx - kv_idx) <= W, flex._Band),
        ("abs window strict", lambda b, h, q_idx, kv_idx: (kv_idx - q_idx + c).abs() < W + 1,
         flex._Band),
        ("torch.abs outside", lambda b, h, q_idx, kv_idx: torch.abs(q_idx - kv_idx) > W, None),
        ("chunked", lambda b, h, q_idx, kv_idx: q_idx // C == kv_idx // C, flex._Chunk),
        ("chunked offset", lambda b, h, q_idx, kv_idx: (q_idx + abs(c)) // C == kv_idx // C,
         flex._Chunk),
        ("chunked causal", flex.and_masks(causal, lambda b, h, q_idx, kv_idx:
                                           q_idx // C == kv_idx // C), None),
        ("prefix int", lambda b, h, q_idx, kv_idx: (kv_idx < P) | (q_idx >= kv_idx),
         flex._Prefix),
        ("prefix 0-d tensor", lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) | (kv_idx < p0),
         flex._Prefix),
        ("prefix[b]", lambda b, h, q_idx, kv_idx: (kv_idx <= prefix[b]) | (q_idx >= kv_idx),
         flex._Prefix),
        ("document", lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx], flex._Doc),
        ("document[b]", lambda b, h, q_idx, kv_idx: docb[b, q_idx] == docb[b, kv_idx],
         flex._Doc),
        ("document causal", flex.and_masks(causal, lambda b, h, q_idx, kv_idx:
                                            doc[q_idx] == doc[kv_idx]), None),
        ("key padding", lambda b, h, q_idx, kv_idx: kv_idx < lengths[b], flex._KvLess),
        ("kv >= c", lambda b, h, q_idx, kv_idx: kv_idx >= abs(c), None),
        ("global", lambda b, h, q_idx, kv_idx: (q_idx < G) | (kv_idx < G), flex._Global),
        ("global | sliding", flex.or_masks(lambda b, h, q_idx, kv_idx: (q_idx < G) |
                                           (kv_idx < G), flex.and_masks(causal, sliding)), None),
        ("not causal", lambda b, h, q_idx, kv_idx: ~(q_idx >= kv_idx), None),
        ("noop", flex.noop_mask, flex._All),
        ("and_masks()", flex.and_masks(), flex._All),
        ("logical_and", lambda b, h, q_idx, kv_idx: torch.logical_and(q_idx >= kv_idx,
                                                                       kv_idx >= q_idx - W),
         flex._Band),
    ]
    return cases


B, H, T, S = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 70), rng.randint(1, 70)
print(f"mask grid (B, H, T, S) = ({B}, {H}, {T}, {S})")
g = flex._Grid(B, H, T, S)
for name, fn, kind in mask_cases(B, H, T, S):
    d = flex._trace_mask(fn)
    check(d is not None, f"mask {name}: recognised")
    if d is None:
        continue
    check(kind is None or isinstance(d, kind), f"mask {name}: {d!r} is a {kind}")
    got = d.evaluate(g).expand(B, H, T, S)
    want = dense(fn, B, H, T, S)
    check(torch.equal(got, want), f"mask {name} ({d!r}): {int((got != want).sum())} of "
          f"{got.numel()} elements differ from the mask_mod")

# not recognised: the dense grid, the same map
W2 = rng.randint(2, 5)


def striped(b, h, q_idx, kv_idx):
    return (q_idx * 3 + kv_idx) % W2 == 0


def per_head(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx + h


check(flex._trace_mask(striped) is None, "striped mask: not recognised")
check(flex._trace_mask(per_head) is None, "per-head mask: not recognised")


def boom(b, h, q_idx, kv_idx):
    raise KeyError("boom in the mask")


try:
    flex.create_block_mask(boom, 1, 1, 8, 8, BLOCK_SIZE=16)
    check(False, "a raising mask_mod: no error")
except KeyError as err:
    check("create_block_mask" in str(err) and "boom in the mask" in str(err),
          f"a raising mask_mod: message {err}")

# a mask_mod's result must be bool, as PyTorch's: a float or an integer's truth
# would hide a mistake (NaN reads as True)
for what, fn in (("float", lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx).float() * float("nan")),
                 ("integer", lambda b, h, q_idx, kv_idx: q_idx - kv_idx)):
    try:
        flex.create_block_mask(fn, 1, 1, 8, 8, BLOCK_SIZE=16)
        check(False, f"a mask_mod returning {what}: no error")
    except TypeError as err:
        check("torch.bool" in str(err) and "create_block_mask" in str(err),
              f"a mask_mod returning {what}: message {err}")
# sizes as NumPy or 0-d torch integers, as PyTorch takes them; not floats
n = rng.randint(17, 40)
check(flex.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None,
                             torch.tensor(n), torch.tensor(n + 1), BLOCK_SIZE=16).shape ==
      (1, 1, n, n + 1), "create_block_mask: Q_LEN and KV_LEN as 0-d tensors")
try:
    flex.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, float(n), n)
    check(False, "create_block_mask: a float Q_LEN: no error")
except ValueError as err:
    check(f"got {float(n)} (float)" in str(err), f"create_block_mask: a float Q_LEN: {err}")
# a result that does not broadcast to the grid, and per-batch lengths fewer than
# the batch (PyTorch's lengths[b] would raise): errors naming the shapes
try:
    flex.create_block_mask(lambda b, h, q_idx, kv_idx: torch.ones(5, dtype=torch.bool), 1, 2,
                           8, 8, BLOCK_SIZE=16)
    check(False, "a mask_mod of the wrong shape: no error")
except ValueError as err:
    check("shape (5,)" in str(err) and "(1, 2, 8, 8)" in str(err),
          f"a mask_mod of the wrong shape: message {err}")
short = torch.tensor([3, 5])
for what, fn in (("key lengths", lambda b, h, q_idx, kv_idx: kv_idx < short[b]),
                 ("prefix lengths", lambda b, h, q_idx, kv_idx: (kv_idx <= q_idx) |
                  (kv_idx < short[b]))):
    try:
        flex.create_block_mask(fn, 3, 1, 8, 8, BLOCK_SIZE=16)
        check(False, f"{what} for fewer sequences than B: no error")
    except IndexError as err:
        check("2 values for a batch of 3" in str(err),
              f"{what} for fewer sequences than B: message {err}")

# document ids of one sequence read by b for a batch of two: PyTorch's doc[1] raises
doc1 = torch.tensor([[0] * 8 + [1] * 8])
try:
    flex.create_block_mask(lambda b, h, q_idx, kv_idx: doc1[b, q_idx] == doc1[b, kv_idx], 2,
                           None, 16, 16, BLOCK_SIZE=16)
    check(False, "document ids of one sequence indexed by b for two: no error")
except IndexError as err:
    check("(1, 16)" in str(err) and "batch of 2" in str(err),
          f"document ids of one sequence indexed by b for two: {err}")
try:  # a tensor not on the CPU: refused by its device, not read through a null pointer
    on_meta = torch.zeros(16, dtype=torch.int64, device="meta")
    flex.create_block_mask(lambda b, h, q_idx, kv_idx: on_meta[q_idx] == on_meta[kv_idx], 1,
                           None, 16, 16, BLOCK_SIZE=16)
    check(False, "document ids on the meta device: no error")
except ValueError as err:
    check("on meta" in str(err), f"document ids on the meta device: {err}")


# ---- (a) create_block_mask: drawing and sparsity from a Python classification ---------


def python_drawing(keep, bq, bkv):
    """{(b, h): drawing}, sparsity of the (B, H, T, S) bool keep."""
    B, H, T, S = keep.shape
    qb, kb = -(-T // bq), -(-S // bkv)
    drawings, used = {}, 0
    for b in range(B):
        for h in range(H):
            lines = []
            for i in range(qb):
                row = ""
                for j in range(kb):
                    tile = keep[b, h, i * bq:(i + 1) * bq, j * bkv:(j + 1) * bkv]
                    n = int(tile.sum())
                    row += "." if n == 0 else "#" if n == tile.numel() else "~"
                    used += n > 0
                lines.append(row + "\n")
            drawings[(b, h)] = "".join(lines)
    return drawings, 100.0 * (1.0 - used / (B * H * qb * kb))


def check_map(bm, keep, what, listed=None):
    """listed: a from_kv_blocks map's listed blocks (B, H, query blocks, key
    blocks), which its sparsity counts as PyTorch's does, a partial block
    that its mask_mod leaves empty too (drawn '.': the kernels skip it)."""
    bq, bkv = bm.BLOCK_SIZE
    drawings, sparsity = python_drawing(keep, bq, bkv)
    if listed is not None:
        sparsity = 100.0 * (1.0 - int(listed.sum()) / listed.numel())
        check(torch.equal(bm.to_dense(), listed.to(torch.int32)),
              f"{what}: to_dense {bm.to_dense().tolist()} vs the listed blocks "
              f"{listed.int().tolist()}")
    check(tuple(bm.shape) == tuple(keep.shape), f"{what}: shape {bm.shape}")
    for (b, h), want in drawings.items():
        got = bm._draw(b, h)
        check(got == want, f"{what}: drawing of ({b}, {h}):\n{got}want\n{want}")
    check(abs(bm.sparsity() - sparsity) < 1e-9, f"{what}: sparsity {bm.sparsity()} vs "
          f"{sparsity}")
    text = bm.to_string(limit=2)
    first = [f"b={b}, h={h}\n" + drawings[(b, h)] for (b, h) in list(drawings)[:2]]
    check(text.startswith("".join(first)), f"{what}: to_string {text!r}")
    check(f"{bm.sparsity():.2f}%" in repr(bm), f"{what}: repr {repr(bm)!r}")


T2, S2 = rng.randint(20, 300), rng.randint(20, 300)
for name, fn, _ in mask_cases(2, 2, T2, S2)[::3] + [("striped", striped, None),
                                                      ("per-head", per_head, None)]:
    for Bm, Hm in ((None, None), (2, 2)):
        bs = rng.choice([16, 32, 64, 128, (16, 64), (128, 32)])
        bm = flex.create_block_mask(fn, Bm, Hm, T2, S2, BLOCK_SIZE=bs)
        keep = dense(fn, Bm or 1, Hm or 1, T2, S2)
        check_map(bm, keep, f"create_block_mask {name} B={Bm} BLOCK_SIZE={bs}")
# PyTorch's keyword forms (torch.ge(q, other=kv), q.ge(other=kv)) trace as their positional
# ones and give the same maps
for what, fn, same in (("torch.ge(q_idx, other=kv_idx)",
                        lambda b, h, q_idx, kv_idx: torch.ge(q_idx, other=kv_idx),
                        lambda b, h, q_idx, kv_idx: q_idx >= kv_idx),
                       ("q_idx.ge(other=kv_idx)",
                        lambda b, h, q_idx, kv_idx: q_idx.ge(other=kv_idx),
                        lambda b, h, q_idx, kv_idx: q_idx >= kv_idx),
                       ("torch.abs(input=q_idx - kv_idx) <= 3",
                        lambda b, h, q_idx, kv_idx: torch.abs(input=q_idx - kv_idx) <= 3,
                        lambda b, h, q_idx, kv_idx: torch.abs(q_idx - kv_idx) <= 3)):
    try:
        traced = flex._trace_mask(fn)
        check(traced is not None and repr(traced) == repr(flex._trace_mask(same)),
              f"{what}: traced as {traced!r}")
        check_map(flex.create_block_mask(fn, None, None, T2, S2, BLOCK_SIZE=16),
                  dense(fn, 1, 1, T2, S2), what)
    except Exception as err:  # the tracer raised on a keyword argument
        check(False, f"{what}: {type(err).__name__}: {err}")
lens2 = torch.tensor([T2 // 3, T2])
# B (H) None with a mask_mod that reads b (h): b = 0's (h = 0's) map, as
# PyTorch's; a call of two sequences and heads runs the map of its own (2, 2)
# where every (b, h)'s blocks are full and empty where that map's are (what
# PyTorch's eager and compiled kernels then both give), and is refused
# naming the block elsewhere
for Bm, Hm, fn, index in ((None, 2, lambda b, h, q_idx, kv_idx: kv_idx < lens2[b], "b"),
                          (2, None, per_head, "h")):
    what = f"a mask_mod that reads {index} with its size None"
    bm = flex.create_block_mask(fn, Bm, Hm, T2, T2, BLOCK_SIZE=rng.choice([16, 64, 128]))
    check_map(bm, dense(fn, Bm or 1, Hm or 1, T2, T2), f"{what}: the map of {index} = 0")
    full = dense(fn, 2, 2, T2, T2)
    mine, _ = python_drawing(dense(fn, Bm or 1, Hm or 1, T2, T2), *bm.BLOCK_SIZE)
    real, _ = python_drawing(full, *bm.BLOCK_SIZE)
    agree = all(c == "~" or c == w for (b, h), d in real.items()
                for c, w in zip(mine[(b if Bm else 0, h if Hm else 0)], d))
    try:
        call = bm._for_call(2, 2)
        check(agree, f"{what}: a call of (2, 2) past its blocks: no error")
        check_map(call, full, f"{what}: the map of a call of (2, 2)")
    except ValueError as err:
        check(not agree and "pass create_block_mask the call's " + index.upper() in str(err),
              f"{what}: a call of (2, 2): {err}")

# the library's tree limits (4096 nodes, 256 deep; each combinator copies its
# operands, so a mask ANDed with itself doubles): a traced description past
# them is drawn over the grid, one within them lowers
docs12 = torch.randint(0, 3, (T2,)).sort().values
leaf = flex._trace_mask(lambda b, h, q_idx, kv_idx: docs12[q_idx] == docs12[kv_idx])
tree = leaf
for levels in range(1, 13):
    tree = flex._Combine("and", tree, tree)
    check(flex._lowers(tree) == (levels <= 11), f"{2 ** (levels + 1) - 1} nodes: lowered "
          f"{flex._lowers(tree)}")
    if levels == 11:
        ctx = flex._attn_torch()._context()
        flex.lib.attn_mask_free(tree.lower(ctx, flex._Grid(1, 1, T2, T2)))  # 4095: accepted
chain = leaf
for depth in range(2, 258):
    chain = flex._Combine("not", chain)
check(not flex._lowers(chain) and flex._lowers(chain.parts[0]), "257 deep: not lowered; 256 is")

# the C map freed with the object
bm = flex.create_block_mask(mask_cases(1, 1, 8, 8)[0][1], None, None, 40, 40, BLOCK_SIZE=16)
fin = bm._finalizer
del bm
gc.collect()
check(not fin.alive, "BlockMask: the C map freed with the object")

# from_kv_blocks: random lists, partial blocks cut by a mask_mod
Bk, Hk, QB, KB, bq = 2, 2, rng.randint(1, 5), rng.randint(1, 6), 16
perm = torch.stack([torch.stack([torch.randperm(KB) for _ in range(Hk * QB)])
                    for _ in range(Bk)]).view(Bk, Hk, QB, KB)
num = torch.randint(0, KB + 1, (Bk, Hk, QB))
full_num = torch.stack([torch.randint(0, int(KB - n) + 1, ()) for n in num.view(-1)]).view(
    Bk, Hk, QB)
kv_indices = perm.to(torch.int32)
full_indices = torch.zeros_like(kv_indices)
for idx in range(Bk * Hk * QB):
    n, f = int(num.view(-1)[idx]), int(full_num.view(-1)[idx])
    row = perm.view(-1, KB)[idx]
    full_indices.view(-1, KB)[idx, :f] = row[n:n + f].to(torch.int32)
W3 = rng.randint(0, 20)


def band(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx).abs() <= W3


for mm in (None, band, striped):
    bm = flex.BlockMask.from_kv_blocks(num, kv_indices, full_num, full_indices, BLOCK_SIZE=bq,
                                       mask_mod=mm)
    T3, S3 = QB * bq, KB * bq
    keep = torch.zeros(Bk, Hk, T3, S3, dtype=torch.bool)
    listed = torch.zeros(Bk, Hk, QB, KB, dtype=torch.bool)
    inside = dense(mm, Bk, Hk, T3, S3) if mm else torch.ones(Bk, Hk, T3, S3, dtype=torch.bool)
    for b in range(Bk):
        for h in range(Hk):
            for i in range(QB):
                rows = slice(i * bq, (i + 1) * bq)
                for e in range(int(num[b, h, i])):
                    j = int(kv_indices[b, h, i, e])
                    keep[b, h, rows, j * bq:(j + 1) * bq] = inside[b, h, rows, j * bq:(j + 1) * bq]
                    listed[b, h, i, j] = True
                for e in range(int(full_num[b, h, i])):
                    j = int(full_indices[b, h, i, e])
                    keep[b, h, rows, j * bq:(j + 1) * bq] = True
                    listed[b, h, i, j] = True
    check_map(bm, keep, f"from_kv_blocks mask_mod={getattr(mm, '__name__', None)}", listed)
# a partial block listed where the mask_mod shows no key is still listed:
# PyTorch's to_dense() and sparsity() count it (the kernels skip it)
one = torch.ones(1, 1, 1, dtype=torch.int32)
bm = flex.BlockMask.from_kv_blocks(one * 2, torch.tensor([[[[0, 1]]]], dtype=torch.int32),
                                   BLOCK_SIZE=16, mask_mod=lambda b, h, q, kv: q >= kv)
check(bm.to_dense().tolist() == [[[[1, 1]]]] and bm.sparsity() == 0.0,
      f"from_kv_blocks, a listed block the mask_mod empties: to_dense "
      f"{bm.to_dense().tolist()}, sparsity {bm.sparsity()} (PyTorch: [[[[1, 1]]]], 0.0)")
# seq_lengths past the lists' query blocks, or not two ints >= 0, and list
# values past int32, refused by name (the lists were read past their end, and
# the values cast silently); query blocks past Q_LEN are never read, as in
# PyTorch: a shorter Q_LEN gives the lists' first rows
for lengths, error, words in [((QB * bq + 1, KB * bq), ValueError,
                               f"needs {QB + 1} query blocks of {bq}, the lists have {QB}"),
                              ((QB * bq + 0.5, KB * bq), TypeError, "must be two ints"),
                              ((-1, KB * bq), ValueError, "must be >= 0"),
                              ((QB * bq,), TypeError, "must be two ints")]:
    try:
        flex.BlockMask.from_kv_blocks(num, kv_indices, BLOCK_SIZE=bq, seq_lengths=lengths)
        check(False, f"from_kv_blocks seq_lengths {lengths}: no error")
    except error as err:
        check(words in str(err), f"from_kv_blocks seq_lengths {lengths}: {err}")
if QB > 1:
    bm = flex.BlockMask.from_kv_blocks(num, kv_indices, BLOCK_SIZE=bq,
                                       seq_lengths=(bq, KB * bq))
    first = flex.BlockMask.from_kv_blocks(num[:, :, :1], kv_indices[:, :, :1], BLOCK_SIZE=bq)
    check(bm.to_string() == first.to_string(), "from_kv_blocks: Q_LEN of one block of several")
for name, big in (("kv_indices", kv_indices.to(torch.int64)), ("kv_num_blocks", num.clone())):
    big.view(-1)[0] = 2 ** 32 + rng.randint(0, 9)
    lists = (big, kv_indices) if name == "kv_num_blocks" else (num, big)
    try:
        flex.BlockMask.from_kv_blocks(*lists, BLOCK_SIZE=bq)
        check(False, f"from_kv_blocks {name} past int32: no error")
    except ValueError as err:
        check(f"{name} holds {int(big.view(-1)[0])}, past int32" in str(err),
              f"from_kv_blocks {name} past int32: {err}")
# an index constant past int64 is PyTorch's error on the grid (its tensors
# refuse it), not a description whose offset ctypes wrapped
huge = 2 ** 64 + rng.randint(0, 9)
for what, fn in (("q - kv <= c", lambda b, h, q, kv: q - kv <= huge),
                 ("q + c >= kv", lambda b, h, q, kv: q + huge >= kv),
                 ("q // c", lambda b, h, q, kv: q // huge == kv // huge),
                 ("q - kv <= 2^63", lambda b, h, q, kv: q - kv <= 2 ** 63)):
    check(flex._trace_mask(fn) is None, f"a mask_mod {what} past int64: not traced")
try:
    ramp = torch.rand(3)
    flex._trace_score(lambda s, b, h, q, kv: s - ramp[h] * abs(q - kv + huge))
    check(False, "a score_mod with an index constant past int64: no error")
except ValueError as err:
    check(f"the integer {huge}, past int64" in str(err), f"a score_mod past int64: {err}")
# bounds past the library's +-2^62 that a mask_mod may hold for "no limit"
# (sys.maxsize as a window, a chunk, global tokens) bound nothing there: the
# map is the grid's, not a refusal naming a value ctypes wrapped
T4, S4 = rng.randint(20, 90), rng.randint(20, 90)
for what, fn in (("q - kv <= maxsize", lambda b, h, q, kv: q - kv <= sys.maxsize),
                 ("causal, q - kv <= maxsize",
                  lambda b, h, q, kv: (q >= kv) & (q - kv <= sys.maxsize)),
                 ("|q - kv| <= maxsize", lambda b, h, q, kv: (q - kv).abs() <= sys.maxsize),
                 ("-2^62 <= kv - q <= 2^62",
                  lambda b, h, q, kv: (kv - q <= 2 ** 62) & (kv - q >= -2 ** 62)),
                 ("kv - q >= 2^62 + 7", lambda b, h, q, kv: kv - q >= 2 ** 62 + 7),
                 ("global 2^62 + 1", lambda b, h, q, kv: (q < 2 ** 62 + 1) | (kv < 2 ** 62 + 1)),
                 ("q // maxsize", lambda b, h, q, kv: q // sys.maxsize == kv // sys.maxsize),
                 ("(q + 2^62 - 3) // (2^62 + 1)",
                  lambda b, h, q, kv: (q + 2 ** 62 - 3) // (2 ** 62 + 1) == kv // (2 ** 62 + 1)),
                 ("(q - 5) // maxsize",
                  lambda b, h, q, kv: (q - 5) // sys.maxsize == kv // sys.maxsize)):
    check(flex._trace_mask(fn) is not None, f"a mask_mod {what}: traced")
    try:
        bm = flex.create_block_mask(fn, None, None, T4, S4, BLOCK_SIZE=16)
        check_map(bm, dense(fn, 1, 1, T4, S4), f"a mask_mod {what}")
    except Exception as err:  # noqa: BLE001
        check(False, f"a mask_mod {what}: {type(err).__name__}: {err}")
# a closed-form mask of sizes past memory is refused by the library, naming
# them, before any index grid is made (aranges of 2^40 would fail in torch)
for Bh, Hh in ((2 ** 40, 2 ** 40), (2 ** 40, 1)):
    try:
        flex.create_block_mask(band, Bh, Hh, 4096, 4096)
        check(False, f"create_block_mask B={Bh} H={Hh}: no error")
    except _lib.AttnError as err:
        check(f"({Bh}, {Hh}, 4096, 4096)" in str(err), f"create_block_mask B={Bh}: {err}")
    except Exception as err:  # noqa: BLE001
        check(False, f"create_block_mask B={Bh} H={Hh}: {type(err).__name__}: {err}")
# block lists the library refuses (a count past max or negative, a block
# listed twice, partial and full) are refused, by name, whatever the
# mask_mod: one the tracer does not recognise draws its partial blocks out
# densely, and must not pass over the lists


def modular(b, h, q_idx, kv_idx):
    return q_idx % 3 == kv_idx % 3


check(flex._trace_mask(modular) is None, "from_kv_blocks: modular is drawn densely")
one = torch.ones(1, 1, 1, dtype=torch.int32)
pair = torch.tensor([0, 1], dtype=torch.int32).view(1, 1, 1, 2)
for what, lists, words in (
        ("a block listed twice", (one * 2, torch.zeros_like(pair)), "listed twice"),
        ("a count past max", (one * 3, pair), "(3) must be 0 .. max (2)"),
        ("a negative count", (-one, pair), "(-1) must be 0 .. max (2)"),
        ("a block partial and full", (one, pair, one, pair[..., :1]), "partial and full")):
    for mm in (None, band, modular):
        name = getattr(mm, "__name__", None)
        try:
            flex.BlockMask.from_kv_blocks(*lists, BLOCK_SIZE=16, mask_mod=mm)
            check(False, f"from_kv_blocks {what}, mask_mod={name}: no error")
        except _lib.AttnError as err:
            check(words in str(err), f"from_kv_blocks {what}, mask_mod={name}: {err}")


# ---- (a) score_mods: the traced chain == the function on random scores ----------------


def t5_bucket_reference(rel, bidirectional, num_buckets, max_distance):
    """T5's _relative_position_bucket for one integer, written out."""
    ret = 0
    if bidirectional:
        num_buckets //= 2
        if rel > 0:
            ret += num_buckets
        n = abs(rel)
    else:
        n = max(-rel, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    v = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                        * (num_buckets - max_exact))
    return ret + min(v, num_buckets - 1)


for bidirectional in (True, False):
    nb, md = rng.choice([8, 16, 32]), rng.choice([20, 64, 128])
    rel = torch.randint(-300, 300, (400,))
    got = flex.t5_relative_bucket(rel, bidirectional, nb, md)
    want = torch.tensor([t5_bucket_reference(int(r), bidirectional, nb, md) for r in rel])
    check(torch.equal(got, want), f"t5_relative_bucket bidirectional={bidirectional} "
          f"buckets {nb} max_distance {md}")

B, H, T, S = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 40), rng.randint(1, 40)
print(f"score grid (B, H, T, S) = ({B}, {H}, {T}, {S})")
cap = rng.uniform(5, 50)
c = rng.uniform(0.2, 3.0)
off = rng.randint(-4, 4)
nb, md = 32, rng.choice([20, 64, 128])
bias_bhqk = torch.randn(B, H, T, S)
bias_hqk = torch.randn(H, T, S)
bias_qk = torch.randn(T, S)
bias_h = torch.randn(H)
bias_k = torch.randn(S)
bias_b1k = torch.randn(B, 1, S)  # (b, h broadcast, kv)
slopes = torch.rand(H)
table = torch.randn(H, nb)
table_t = torch.randn(nb, H)
# relative tables: every q - kv + (S - 1) (or kv - q + (T - 1)) in range; a
# row of max(T, S) + 1 read by q - kv itself, negative ones from its end
rel_qk = torch.randn(H, T + S - 1)
rel_kq_t = torch.randn(T + S - 1, H)
rel_wrap = torch.randn(max(T, S) + 1)
SOFT, SCALE, BIAS, ALIBI, REL, RELT = (_lib.SCORE_SOFTCAP, _lib.SCORE_SCALE, _lib.SCORE_BIAS,
                                       _lib.SCORE_ALIBI, _lib.SCORE_REL_BIAS,
                                       _lib.SCORE_REL_TABLE)
score_cases = [
    ("scale", lambda s, b, h, q, kv: s * c, [SCALE]),
    ("divide", lambda s, b, h, q, kv: s / c, [SCALE]),
    ("scale left", lambda s, b, h, q, kv: c * s, [SCALE]),
    ("softcap", lambda s, b, h, q, kv: cap * torch.tanh(s / cap), [SOFT]),
    ("softcap right", lambda s, b, h, q, kv: torch.tanh(s / cap) * cap, [SOFT]),
    # tanh is odd: -c tanh(s / -c) is the softcap c, which PyTorch runs too
    ("softcap negative", lambda s, b, h, q, kv: -cap * torch.tanh(s / -cap), [SOFT]),
    ("tanh", lambda s, b, h, q, kv: torch.tanh(s), [SOFT]),
    ("bias[b, h, q, kv]", lambda s, b, h, q, kv: s + bias_bhqk[b, h, q, kv], [BIAS]),
    ("bias[h, q, kv]", lambda s, b, h, q, kv: s + bias_hqk[h, q, kv], [BIAS]),
    # chained indexing traces as one index (on the grid's broadcast aranges
    # torch reads it otherwise: its oracle is the one-index form)
    ("bias[h][q][kv]", lambda s, b, h, q, kv: s + bias_hqk[h][q][kv], [BIAS],
     lambda s, b, h, q, kv: s + bias_hqk[h, q, kv]),
    ("bias[q, kv]", lambda s, b, h, q, kv: bias_qk[q, kv] + s, [BIAS]),
    ("bias[h]", lambda s, b, h, q, kv: s + bias_h[h], [BIAS]),
    ("bias[kv]", lambda s, b, h, q, kv: s - bias_k[kv], [BIAS]),
    ("bias[b, 0, kv]", lambda s, b, h, q, kv: s + bias_b1k[b, 0 * h, kv], None),
    ("0.5 * bias", lambda s, b, h, q, kv: s + 0.5 * bias_hqk[h, q, kv], [BIAS]),
    ("constant", lambda s, b, h, q, kv: s + 1.5, [BIAS]),
    ("alibi signed", lambda s, b, h, q, kv: s + slopes[h] * (kv - q), [ALIBI]),
    ("alibi abs", lambda s, b, h, q, kv: s - slopes[h] * abs(q - kv), [ALIBI]),
    ("alibi abs offset", lambda s, b, h, q, kv: s - slopes[h] * torch.abs(kv - q + off),
     [ALIBI]),
    ("alibi signed offset", lambda s, b, h, q, kv: s + (q - kv + off) * slopes[h], [ALIBI]),
    ("t5", lambda s, b, h, q, kv: s + table[h, flex.t5_relative_bucket(kv - q, True, nb, md)],
     [REL]),
    ("t5 one-way", lambda s, b, h, q, kv: s + table[h, AT.t5_relative_bucket(
        kv - q, bidirectional=False, num_buckets=nb, max_distance=md)], [REL]),
    ("t5 [bucket, h]", lambda s, b, h, q, kv: s + table_t[flex.t5_relative_bucket(
        kv - q, True, nb, md), h], [REL]),
    ("table[h, q - kv + S - 1]", lambda s, b, h, q, kv: s + rel_qk[h, q - kv + S - 1], [RELT]),
    ("table[kv - q + T - 1, h]", lambda s, b, h, q, kv: s + rel_kq_t[kv - q + (T - 1), h],
     [RELT]),
    ("table[q - kv] from the end", lambda s, b, h, q, kv: s - 0.5 * rel_wrap[q - kv], [RELT]),
    ("chain", lambda s, b, h, q, kv: cap * torch.tanh((s * c + bias_hqk[h, q, kv]) / cap)
     - slopes[h] * abs(q - kv), [SCALE, BIAS, SOFT, ALIBI]),
]
scores = torch.randn(B, H, T, S, dtype=torch.float64) * 4
bg = grid(B, H, T, S)
for name, fn, kinds, *oracle_fn in score_cases:
    try:
        mods = flex._trace_score(fn)
    except ValueError as err:
        check(False, f"score_mod {name}: {err}")
        continue
    chain = flex._Chain(mods, B, H, T, S)
    got_kinds = [e[0]["kind"] for e in chain.entries]
    check(kinds is None or got_kinds == kinds, f"score_mod {name}: kinds {got_kinds} vs {kinds}")
    check(all(e[0]["value"] > 0 for e in chain.entries if e[0]["kind"] == SOFT),
          f"score_mod {name}: softcaps > 0, as the library takes them")
    got = chain.evaluate(scores, flex._Grid(B, H, T, S))
    want = (oracle_fn[0] if oracle_fn else fn)(scores, *bg).expand(B, H, T, S)
    err = float((got - want).abs().max()) / max(1.0, float(want.abs().max()))
    check(err < 1e-6, f"score_mod {name}: chain {got_kinds} differs by {err}")

for name, fn, op in [
        ("sin", lambda s, b, h, q, kv: torch.sin(s), "sin"),
        ("score * score", lambda s, b, h, q, kv: s * s, "mul"),
        # a factor per head runs on the query: not after another modifier
        ("per-head scale after a bias", lambda s, b, h, q, kv: (s + 1.0) * slopes[h], "mul"),
        ("where after which the score changes", lambda s, b, h, q, kv: torch.tanh(
            torch.where(q >= kv, s, -float("inf"))), "tanh of where"),
        ("where", lambda s, b, h, q, kv: torch.where(q >= kv, s, s - 1.0), "where"),
        ("exp", lambda s, b, h, q, kv: s + torch.exp(bias_qk[q, kv]), "exp")]:
    try:
        flex._trace_score(fn)
        check(False, f"score_mod {name}: no error")
    except ValueError as err:
        check(op in str(err), f"score_mod {name}: message names {op}: {err}")
try:
    flex.t5_relative_bucket(torch.arange(5), False, 32, 16)
    check(False, "t5_relative_bucket with max_distance within the exact buckets: no error")
except ValueError as err:
    check("max_distance" in str(err), f"t5_relative_bucket: {err}")
# the same arguments inside a score_mod are refused as they are eagerly, before
# attn's kernels read the table at the buckets they give (max_distance at or
# below the exact buckets, of the wrong type, num_buckets too few)
t5_table = torch.randn(H, 4096)
for kwargs, error, words in [
        ({"num_buckets": 4096, "max_distance": 1024}, ValueError, "past the 1024 exact ones"),
        ({"num_buckets": 32, "max_distance": 8}, ValueError, "past the 8 exact ones"),
        ({"num_buckets": 32, "max_distance": 2.5}, TypeError, "max_distance 2.5 must be an int"),
        ({"num_buckets": -1, "max_distance": 128}, ValueError, "num_buckets -1"),
        ({"num_buckets": 2, "max_distance": 128}, ValueError, "num_buckets in 4 ..")]:
    try:
        flex._trace_score(lambda s, b, h, q, kv, kw=kwargs: s + t5_table[
            h, flex.t5_relative_bucket(kv - q, True, **kw)])
        check(False, f"a traced t5_relative_bucket with {kwargs}: no error")
    except error as err:
        check(words in str(err) and "cannot be traced" not in str(err),
              f"a traced t5_relative_bucket with {kwargs}: {err}")
try:  # PyTorch's indexing would raise: every q - kv + T + S is past the row's end
    flex._Chain(flex._trace_score(lambda s, b, h, q, kv: s + rel_qk[h, q - kv + T + S]),
                B, H, T, S)
    check(False, "a relative table read past its end: no error")
except IndexError as err:
    check("out of range" in str(err) and f"+ {T + S} " in str(err),
          f"a relative table read past its end: {err}")
try:  # fewer heads than read: PyTorch's indexing would raise
    flex._Chain(flex._trace_score(lambda s, b, h, q, kv: s + rel_qk[:H - 1][h, q - kv + S - 1]),
                B, H, T, S)
    check(False, "a relative table of fewer heads: no error")
except IndexError as err:
    check(f"reads head {H - 1} of a relative table of shape ({H - 1}, " in str(err),
          f"a relative table of fewer heads: {err}")


def branchy(s, b, h, q, kv):
    if s > 0:
        return s
    return s * 2


try:
    flex._trace_score(branchy)
    check(False, "score_mod with control flow: no error")
except ValueError as err:
    check("cannot be traced" in str(err), f"score_mod with control flow: {err}")
# a rounding division is not a scale: refused by name, never run as s / c
try:
    flex._trace_score(lambda s, b, h, q, kv: torch.div(s, 0.25, rounding_mode="floor"))
    check(False, "score_mod torch.div(..., rounding_mode='floor'): no error")
except ValueError as err:
    check("rounding_mode='floor'" in str(err), f"score_mod with a rounding division: {err}")
# keyword forms trace as their positional ones
for what, fn, same in (("torch.mul(s, other=2)", lambda s, b, h, q, kv: torch.mul(s, other=2),
                        lambda s, b, h, q, kv: s * 2),
                       ("torch.tanh(input=s / 3) * 3",
                        lambda s, b, h, q, kv: torch.tanh(input=s / 3) * 3,
                        lambda s, b, h, q, kv: torch.tanh(s / 3) * 3)):
    try:
        check(repr(flex._trace_score(fn)) == repr(flex._trace_score(same)), f"{what}: traced")
    except Exception as err:
        check(False, f"{what}: {type(err).__name__}: {err}")
# captured tensors off the CPU or complex: refused by name
for what, t, kind in (("on the meta device", torch.zeros(T, S, device="meta"), ValueError),
                      ("complex", torch.zeros(T, S, dtype=torch.complex64), TypeError)):
    try:
        flex._Chain(flex._trace_score(lambda s, b, h, q, kv: s + t[q, kv]), B, H, T, S)
        check(False, f"a captured bias {what}: no error")
    except kind as err:
        check(f"({T}, {S})" in str(err) and ("meta" in str(err) or "complex" in str(err)),
              f"a captured bias {what}: {err}")


# ---- (b) end to end against float64 torch ------------------------------------------------

NEEDS = "needs the flex backend"
has_masks = _lib.has("attn_mask_new_all")
runs = AT._runs_block_maps()
if not runs:
    if has_masks:
        check(False, "the library has mask descriptions but its attention ignores block maps "
              "and score modifiers (the flex probe failed)")
    print(f"SKIP end-to-end: {NEEDS}")


def oracle(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """Attention in float64 torch with autograd: (out, lse)."""
    B, H, T, D = q.shape
    S = k.size(2)
    if k.size(1) != H:
        k = k.repeat_interleave(H // k.size(1), 1)
        v = v.repeat_interleave(H // v.size(1), 1)
    s = (q.double() @ k.double().transpose(-1, -2)) * (scale if scale is not None
                                                        else 1 / math.sqrt(D))
    gr = grid(B, H, T, S)
    if score_mod is not None:
        s = score_mod(s, *gr)
    if mask_mod is not None:
        s = s.masked_fill(~dense(mask_mod, B, H, T, S), float("-inf"))
    lse = torch.logsumexp(s, -1)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    p = torch.exp(s - safe.unsqueeze(-1))
    return p @ v.double(), lse


def rel_l2(got, want):
    got, want = got.detach().double(), want.detach().double()
    fin = torch.isfinite(want)
    if not torch.equal(fin, torch.isfinite(got)) or not torch.equal(got[~fin], want[~fin]):
        return float("inf")
    return float((got[fin] - want[fin]).norm()) / max(float(want[fin].norm()), 1e-30)


def end_to_end(name, B, H, Hkv, T, S, D, score_mod_of, mask_mod, Bm=None, Hm=None,
               scale=None, bias_shape=None, block_size=None, block_mask=None):
    """block_mask: the call's map where given, mask_mod then the oracle's mask."""
    bias = torch.randn(*bias_shape) if bias_shape else None
    q = torch.randn(B, H, T, D, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, requires_grad=True)
    v = torch.randn(B, Hkv, S, D, requires_grad=True)
    dout, dlse = torch.randn(B, H, T, D), torch.randn(B, H, T)
    ba = bias.clone().requires_grad_() if bias is not None else None
    bo = bias.clone().requires_grad_() if bias is not None else None
    bm = block_mask or (flex.create_block_mask(mask_mod, Bm, Hm, T, S,
                                               BLOCK_SIZE=block_size or rng.choice([16, 32, 64]))
                        if mask_mod is not None else None)
    out, lse = flex.flex_attention(q, k, v, score_mod=score_mod_of(ba) if score_mod_of else None,
                                   block_mask=bm, scale=scale, enable_gqa=Hkv != H,
                                   return_lse=True)
    # a loss in lse as well (a z-loss): its gradient flows back through it
    ((out * dout).sum() + (lse.nan_to_num(neginf=0.0) * dlse).sum()).backward()
    got = [out, lse, q.grad, k.grad, v.grad] + ([ba.grad] if ba is not None else [])
    qo, ko, vo = (t.detach().double().requires_grad_() for t in (q, k, v))
    want_out, want_lse = oracle(qo, ko, vo, score_mod_of(bo) if score_mod_of else None,
                                mask_mod, scale)
    ((want_out * dout.double()).sum() +
     (want_lse.nan_to_num(neginf=0.0) * dlse.double()).sum()).backward()
    want = [want_out, want_lse, qo.grad, ko.grad, vo.grad] + ([bo.grad] if bo is not None
                                                             else [])
    check(lse.dtype == torch.float32, f"{name}: lse is float32")
    for label, a, w in zip(["out", "lse", "dq", "dk", "dv", "dbias"], got, want):
        e = rel_l2(a, w)
        check(e < 1e-5, f"{name}: {label} relative L2 error {e}")


def row_bias_case():
    """A bias of one element per head, the same for every query and key:
    each element's gradient sums B x T x S terms (2 x 1024 x 1024 here),
    which one float add a term would lose 1e-5 of. A softcap after it keeps
    the gradient from being 0 (a bias constant along a row otherwise
    changes no weight)."""
    B, H, T, D = 2, 4, 1024, 16
    q, k = torch.randn(B, H, T, D) * 2, torch.randn(B, H, T, D) * 2
    v, dout = torch.randn(B, H, T, D), torch.randn(B, H, T, D)
    bias = torch.randn(H)

    def mod(b_):
        return lambda s, b, h, qi, ki: 5.0 * torch.tanh((s + b_[h]) / 5.0)

    ba = bias.clone().requires_grad_()
    (flex.flex_attention(q, k, v, score_mod=mod(ba)) * dout).sum().backward()
    bo = bias.double().requires_grad_()
    want, _ = oracle(q.double(), k.double(), v.double(), mod(bo))
    (want * dout.double()).sum().backward()
    # the sums are in double; what is left is each dS term's own float
    # rounding (1e-6 typically, 6e-6 at worst over many seeds): the bound is
    # the exactness asked of every gradient, 1e-5
    e = rel_l2(ba.grad, bo.grad)
    check(e < 1e-5, f"a bias per head, broadcast over queries and keys: dbias relative L2 {e}")


def one_map_for_many_cases():
    """A map made for one sequence (B=1) or head (H=1) whose mask_mod reads
    b (h), on a call of more: PyTorch tests the elements with the real b
    (h), the eager kernels every one, the compiled ones those of b = 0's
    partial blocks. Where each sequence's blocks are classed as b = 0's, or
    hide no more, both give the dense oracle's answer, and so does attn; a
    sequence that shows keys in a block b = 0's map skips is refused, naming
    the block."""
    T = 200
    prefix = torch.tensor([5, 40])
    lens = torch.tensor([50, 55, 60])

    def plm(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) | (kv_idx < prefix[b])

    def plm_even(b, h, q_idx, kv_idx):  # not recognised: drawn on the index grid
        return (q_idx >= kv_idx) | ((kv_idx < prefix[b]) & (kv_idx % 2 == 0))

    def padded(b, h, q_idx, kv_idx):
        return kv_idx < lens[h]

    for name, fn, Bm, Hm in (("a prefix per sequence", plm, 1, None),
                             ("a prefix per sequence, drawn", plm_even, 1, 1),
                             ("a key length per head", padded, None, 1)):
        end_to_end(f"{name}, a map made for one", 2, 3, 3, T, T, 16, None, fn, Bm=Bm, Hm=Hm,
                   block_size=64)
    # block lists of one sequence, (1, 1, 4 query blocks of 64): the call
    # runs them for every sequence, their partial blocks cut by the mask_mod
    # at the real b (PyTorch's eager and compiled kernels alike)
    num = torch.tensor([[[1, 1, 1, 2]]], dtype=torch.int32)
    idx = torch.tensor([[[[0, 0], [1, 0], [2, 0], [0, 3]]]], dtype=torch.int32)
    fnum = torch.tensor([[[0, 1, 0, 1]]], dtype=torch.int32)
    fidx = torch.tensor([[[[0, 0], [0, 0], [0, 0], [2, 0]]]], dtype=torch.int32)
    full = torch.zeros(T, T, dtype=torch.bool)
    part = torch.zeros(T, T, dtype=torch.bool)
    for qb, kbs in enumerate(([0], [1], [2], [0, 3])):
        for kb in kbs:
            part[qb * 64:(qb + 1) * 64, kb * 64:(kb + 1) * 64] = True
    full[64:128, 0:64] = full[192:, 128:192] = True
    for fn in (plm, plm_even):
        bm = flex.BlockMask.from_kv_blocks(num, idx, fnum, fidx, BLOCK_SIZE=64, mask_mod=fn,
                                           seq_lengths=(T, T))
        end_to_end(f"block lists of one sequence, {fn.__name__}", 2, 3, 3, T, T, 16, None,
                   lambda b, h, q_idx, kv_idx, fn=fn: full[q_idx, kv_idx] |
                   (part[q_idx, kv_idx] & fn(b, h, q_idx, kv_idx)), block_mask=bm)
    prefix[1] = 150  # b = 1 sees keys of key block 1 in query block 0, which b = 0 skips
    q = torch.randn(2, 3, T, 16)
    for fn in (plm, plm_even):
        try:
            flex.flex_attention(q, q, q, block_mask=flex.create_block_mask(fn, 1, None, T, T,
                                                                           BLOCK_SIZE=64))
            check(False, f"{fn.__name__}: b = 1 past b = 0's blocks: no error")
        except ValueError as err:
            check("(b, h) = (1, 0) shows keys in key block 1 of query block 0" in str(err) and
                  "pass create_block_mask the call's B" in str(err),
                  f"{fn.__name__}: b = 1 past b = 0's blocks: {err}")


def empty_rows_with_dlse():
    """Rows that see no key (by the mask, in a partial tile and in a whole
    query block, and by a score_mod's -inf), under a loss that reads lse
    itself, -inf there: PyTorch 2.15's flex_attention (its eager kernels
    under autograd) gives them out 0 and lse -inf, and their lse's gradient
    reaches nothing (dq 0 in those rows, dk and dv from the other rows
    alone), never NaN. float32 and float64, GQA and not."""
    T = 45

    def mask(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx != 1) & ((q_idx < 16) | (q_idx >= 32)) & \
            (kv_idx % 3 != 1)

    def where(s, b, h, q_idx, kv_idx):
        return torch.where(q_idx == 40, float("-inf"), s)

    bm = flex.create_block_mask(mask, None, None, T, T, BLOCK_SIZE=16)
    for dtype, Hkv in ((torch.float32, 4), (torch.float32, 2), (torch.float64, 2)):
        q = torch.randn(2, 4, T, 8, dtype=dtype, requires_grad=True)
        k, v = (torch.randn(2, Hkv, T, 8, dtype=dtype, requires_grad=True) for _ in range(2))
        dout, dlse = torch.randn(2, 4, T, 8, dtype=dtype), torch.randn(2, 4, T, dtype=dtype)
        out, lse = flex.flex_attention(q, k, v, score_mod=where, block_mask=bm,
                                       enable_gqa=Hkv != 4, return_lse=True)
        ((out * dout).sum() + (lse * dlse).sum()).backward()
        qo, ko, vo = (t.detach().double().requires_grad_() for t in (q, k, v))
        s = qo @ ko.repeat_interleave(4 // Hkv, 1).transpose(-1, -2) / math.sqrt(8)
        s = where(s, *grid(2, 4, T, T)).masked_fill(~dense(mask, 2, 4, T, T), float("-inf"))
        empty = torch.isneginf(s).all(-1)
        s = s.masked_fill(empty.unsqueeze(-1), 0.0)
        want_lse = torch.logsumexp(s, -1).masked_fill(empty, float("-inf"))
        want = (s.softmax(-1) @ vo.repeat_interleave(4 // Hkv, 1)).masked_fill(
            empty.unsqueeze(-1), 0.0)
        ((want * dout.double()).sum() +
         (want_lse.masked_fill(empty, 0.0) * dlse.double()).sum()).backward()
        name = f"rows that see no key, a loss in lse ({dtype}, {Hkv} KV heads)"
        check(bool(empty[:, :, [1, 16, 31, 40]].all()) and int(empty.sum()) == 2 * 4 * 18,
              f"{name}: the oracle's empty rows")
        check(bool((out.detach()[empty] == 0).all()) and bool(torch.isneginf(lse[empty]).all()),
              f"{name}: out 0 and lse -inf")
        check(bool((q.grad[empty] == 0).all()), f"{name}: dq 0 in those rows")
        for label, a, w in (("out", out, want), ("lse", lse, want_lse), ("dq", q.grad, qo.grad),
                            ("dk", k.grad, ko.grad), ("dv", v.grad, vo.grad)):
            e = rel_l2(a, w)
            check(e < 1e-5, f"{name}: {label} relative L2 error {e}")


def check_median_ratio(what, ratios, bound):
    """Prints the median (and range) of the ratios of attn's error to
    PyTorch float32's, and checks the median below bound."""
    ratios = sorted(ratios)
    median = ratios[len(ratios) // 2]
    print(f"{what}: median {median:.2f} (min {ratios[0]:.2f}, max {ratios[-1]:.2f})")
    check(median < bound, f"{what}: median {median:.2f}, bound {bound}")


def shared_relative_bias_case(cases=8, T=128, D=64, c=40.0):
    """A relative table's or T5's bias whose gradient is asked, on q and k
    sharing a large component (c along one direction: scores near
    c^2 / sqrt(D) = 200 that differ by a few units): the forward runs on
    the fused kernels, the backward on the flex kernels, whose weights
    round otherwise and so sum to 1 only within a few roundings of the
    scores. delta's mismatch with them, resid_i, reaches dq_i as resid_i
    sum_j P_ij k_j (|k| ~ c) unless the row takes the consistent delta
    (about 7x PyTorch float32's error without it: docs/exactness.md). The
    median over the cases of attn's dq error against float64 over PyTorch
    float32's must stay within 2."""
    H = 2
    mods = {
        "relative table": (lambda t: (lambda s, b, h, q, kv: s + t[h, q - kv + T - 1]),
                           (H, 2 * T - 1)),
        "t5 bias": (lambda t: (lambda s, b, h, q, kv: s + t[h, flex.t5_relative_bucket(
            kv - q, True, 32, 128)]), (H, 32)),
    }
    for name, (mod, shape) in mods.items():
        ratios = []
        for _ in range(cases):
            u = torch.randn(D)
            u /= u.norm()
            q = torch.randn(1, H, T, D) + c * u
            k = torch.randn(1, H, T, D) + c * u
            v, dout, table = torch.randn(1, H, T, D), torch.randn(1, H, T, D), torch.randn(*shape)
            grads = {}
            for which, dtype in (("attn", torch.float32), ("torch", torch.float32),
                                 ("float64", torch.float64)):
                qq, kk, vv, tt = (x.to(dtype).clone().requires_grad_() for x in (q, k, v, table))
                if which == "attn":
                    out = flex.flex_attention(qq, kk, vv, score_mod=mod(tt))
                else:
                    s = mod(tt)((qq @ kk.transpose(-1, -2)) / math.sqrt(D), *grid(1, H, T, T))
                    out = torch.softmax(s, -1) @ vv
                (out * dout.to(dtype)).sum().backward()
                grads[which] = qq.grad
            ratios.append(rel_l2(grads["attn"], grads["float64"]) /
                          max(rel_l2(grads["torch"], grads["float64"]), 1e-30))
        check_median_ratio(f"shared component, {name} with its gradient: dq error / PyTorch "
                           "float32's", ratios, 2.0)


def shared_key_weight_case(cases=8, T=128, D=16, d_in=64):
    """W_key's gradient of q = x Wq, k = x Wk, v = x Wv on rows x = 30 x0 +
    1e-3 n (one large component every key shares), through a relative
    table that asks for its gradient (forward fused, backward flex: the
    two passes) and a block mask of a window and global keys (not an
    interval per row: flex both ways, one pass with 4 heads, two with 2).
    delta's mismatch with
    the tiles' own P and dP, resid_i, reaches the keys' dk unless they give
    back the transpose of dq's mean-key estimate: their sum is then scale
    sum_i resid_i q_i off, which x^T dk carries whole (x0 times it) while
    the true gradient is made of the keys' small differences. The median
    over the cases of attn's W_key error against float64 over PyTorch
    float32's must stay within 0.5 (with it: below 0.01; without: 2-3 for
    the table, 1.5-2.7 for the mask)."""
    globals_, window = rng.randint(1, 12), rng.randint(8, 40)

    def window_and_globals(b, h, q_idx, kv_idx):
        return (kv_idx < globals_) | ((q_idx >= kv_idx) & (q_idx - kv_idx < window))

    ii, jj = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
    for name, H, with_table in (("relative table, 2 heads", 2, True),
                                ("relative table, 4 heads", 4, True),
                                ("window and global keys, 2 heads", 2, False),
                                ("window and global keys, 4 heads", 4, False)):
        ratios = []
        for _ in range(cases):
            x = (30 * torch.randn(1, 1, d_in, dtype=torch.float64) +
                 1e-3 * torch.randn(1, T, d_in, dtype=torch.float64))
            ws = [(torch.rand(d_in, H * D, dtype=torch.float64) * 2 - 1) / math.sqrt(d_in)
                  for _ in range(3)]
            dy = torch.randn(1, H, T, D, dtype=torch.float64)
            table = torch.randn(H, 2 * T - 1, dtype=torch.float64)
            grads = {}
            for which, dtype in (("attn", torch.float32), ("torch", torch.float32),
                                 ("float64", torch.float64)):
                wq, wk, wv = (w.to(dtype).clone().requires_grad_() for w in ws)
                tt = table.to(dtype).clone().requires_grad_()
                q, k, v = ((x.to(dtype) @ w).view(1, T, H, D).transpose(1, 2)
                           for w in (wq, wk, wv))
                if which == "attn" and with_table:
                    out = flex.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki:
                                              s + tt[h, qi - ki + T - 1])
                elif which == "attn":
                    bm = flex.create_block_mask(window_and_globals, None, None, T, T,
                                                BLOCK_SIZE=16)
                    out = flex.flex_attention(q, k, v, block_mask=bm)
                else:
                    s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
                    if with_table:
                        s = s + tt[:, ii - jj + T - 1].unsqueeze(0)
                    else:
                        s = s.masked_fill(~window_and_globals(0, 0, ii, jj), float("-inf"))
                    out = torch.softmax(s, -1) @ v
                (out * dy.to(dtype)).sum().backward()
                grads[which] = wk.grad
            ratios.append(rel_l2(grads["attn"], grads["float64"]) /
                          max(rel_l2(grads["torch"], grads["float64"]), 1e-30))
        check_median_ratio(f"shared component, {name}: W_key error / PyTorch float32's",
                           ratios, 0.5)


if runs:
    W = rng.randint(1, 20)
    alibi_slopes = torch.rand(3)
    doc = torch.sort(torch.randint(0, 5, (96,)))[0]
    temperature = torch.rand(4) + 0.5

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    cases = [
        ("causal", None, causal, {}),
        ("sliding window", None, lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) &
         (q_idx - kv_idx <= W), {}),
        ("document", None, lambda b, h, q_idx, kv_idx: doc[q_idx] == doc[kv_idx], {}),
        ("striped (dense)", None, striped, {"Bm": 2, "Hm": 3}),
        ("softcap + bias", lambda bias: (lambda s, b, h, q, kv: 20.0 * torch.tanh(
            (s + bias[h, q, kv]) / 20.0)), causal, {"bias_shape": (3, 70, 90)}),
        ("alibi", lambda bias: (lambda s, b, h, q, kv: s - alibi_slopes[h] * abs(q - kv)),
         None, {}),
        # a number's slope, on either side; an integer multiple; slopes of
        # more heads than read (PyTorch's indexing reads the first H)
        ("alibi, a number slope", lambda bias: (lambda s, b, h, q, kv: s + 0.3 * (kv - q)),
         causal, {}),
        ("alibi, slope after", lambda bias: (lambda s, b, h, q, kv: s + (kv - q + 2) * 0.25),
         None, {}),
        ("alibi, 2 (kv - q)", lambda bias: (lambda s, b, h, q, kv: s + 2 * (q - kv) / 7),
         None, {}),
        ("alibi, slopes of more heads", lambda bias: (
            lambda s, b, h, q, kv: s + torch.linspace(0.1, 0.8, 8)[h] * (kv - q)), None, {}),
        ("key bias, broadcast", lambda bias: (lambda s, b, h, q, kv: s * 0.5 + bias[kv]),
         lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + 20, {"bias_shape": (90,),
                                                             "Bm": 2, "Hm": 3}),
        ("t5 bias", lambda bias: (lambda s, b, h, q, kv: s + bias[h, flex.t5_relative_bucket(
            kv - q, True, 32, 64)]), None, {"bias_shape": (3, 32)}),
        ("relative table", lambda bias: (lambda s, b, h, q, kv: s + bias[h, q - kv + 89]),
         None, {"bias_shape": (3, 159)}),
        # tables of more heads (and T5's of more buckets) than read, as PyTorch
        # indexes them: the rows past H get zero gradients
        ("relative table of more heads", lambda bias: (
            lambda s, b, h, q, kv: s + bias[h, q - kv + 89]), None, {"bias_shape": (5, 159)}),
        ("t5 bias of more heads", lambda bias: (lambda s, b, h, q, kv: s + bias[
            h, flex.t5_relative_bucket(kv - q, False, 16, 40)]), None, {"bias_shape": (4, 20)}),
        ("relative table from the end, causal", lambda bias: (
            lambda s, b, h, q, kv: s + bias[kv - q]), lambda b, h, q_idx, kv_idx:
         kv_idx <= q_idx + 20, {"bias_shape": (91,)}),
        # a mask written in the score_mod, as PyTorch's FlexAttention
        # examples often write causal: where(mask, score, -inf), alone, after
        # a softcap, with -inf first, and joined with a block_mask (one per
        # head, one that broadcasts, one evaluated densely)
        ("where causal", lambda bias: (lambda s, b, h, q, kv: torch.where(
            q >= kv, s, -float("inf"))), None, {}),
        ("where document after softcap", lambda bias: (lambda s, b, h, q, kv: torch.where(
            doc[q] == doc[kv], 30.0 * torch.tanh(s / 30.0), -float("inf"))), None, {}),
        ("where -inf first, with a bias", lambda bias: (lambda s, b, h, q, kv: torch.where(
            q - kv > W, -float("inf"), s + bias[h, kv])), None, {"bias_shape": (3, 90)}),
        ("where and a block mask", lambda bias: (lambda s, b, h, q, kv: torch.where(
            (kv < 8) | (q >= kv), s, -float("inf"))), lambda b, h, q_idx, kv_idx:
         q_idx - kv_idx < 40, {"Bm": 2, "Hm": 3}),
        ("where and a broadcast block mask", lambda bias: (lambda s, b, h, q, kv: torch.where(
            (kv < 8) | (q - kv < 30), s, -float("inf"))), causal, {}),
        ("where and a block mask of B = H = 1", lambda bias: (
            lambda s, b, h, q, kv: torch.where(kv < q + 3, s, -float("inf"))), causal,
         {"Bm": 1, "Hm": 1}),
        ("where and a dense block mask", lambda bias: (lambda s, b, h, q, kv: torch.where(
            q >= kv, s, -float("inf"))), striped, {"Bm": 2, "Hm": 3}),
        # a where-mask the tracer does not take apart (a condition in h, a
        # remainder): drawn from the score_mod over the index grid
        ("where of a condition in h", lambda bias: (lambda s, b, h, q, kv: torch.where(
            q + 8 * h >= kv, s * 0.5, -float("inf"))), None, {}),
        ("where of a remainder, a block mask", lambda bias: (
            lambda s, b, h, q, kv: torch.where((q - kv) % 3 == 0, s, -float("inf"))), causal,
         {}),
        # a factor per head (a temperature), multiplied or divided, with its
        # gradient, before other modifiers
        ("a factor per head", lambda bias: (lambda s, b, h, q, kv: s * bias[h]), causal,
         {"bias_shape": (3,)}),
        ("a divisor per head, then ALiBi", lambda bias: (
            lambda s, b, h, q, kv: 0.5 * s / temperature[h] + 0.1 * (kv - q)), None, {}),
    ]
    try:
        shared_relative_bias_case()
    except _lib.AttnError as err:
        check(err.status == "ATTN_ERR_UNSUPPORTED", f"a shared component's relative bias: {err}")
    try:
        shared_key_weight_case()
    except _lib.AttnError as err:
        check(err.status == "ATTN_ERR_UNSUPPORTED", f"a shared component's W_key: {err}")
    try:
        row_bias_case()
    except _lib.AttnError as err:
        check(err.status == "ATTN_ERR_UNSUPPORTED", f"a bias per head: {err}")
    try:
        one_map_for_many_cases()
    except _lib.AttnError as err:
        check(err.status == "ATTN_ERR_UNSUPPORTED", f"a map made for one sequence: {err}")
    for name, smod, mmod, kw in cases:
        try:
            end_to_end(name, 2, 3, 3, 70, 90, 16, smod, mmod, **kw)
        except _lib.AttnError as err:
            if err.status == "ATTN_ERR_UNSUPPORTED":
                print(f"SKIP {name}: {NEEDS} ({err})")
            else:
                check(False, f"{name}: {err}")
    try:
        end_to_end("gqa causal", 1, 4, 2, 33, 47, 8, None, causal)
        # a row that sees no key: zeros and lse -inf
        q = torch.randn(1, 2, 20, 8)
        none_mask = flex.create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx < q_idx, None,
                                           None, 20, 20, BLOCK_SIZE=16)
        out, lse = flex.flex_attention(q, q, q, block_mask=none_mask, return_lse=True)
        check(bool((out[:, :, 0] == 0).all()) and bool(torch.isneginf(lse[:, :, 0]).all()),
              "a row that sees no key: zeros and lse -inf")
        check(not bool(torch.isnan(out).any()), "no NaN")
        empty_rows_with_dlse()
        # a mask the same for every head, given with B and H set (as PyTorch's
        # examples often build it): the fixed features' row intervals, as the
        # broadcast map gets, and the same numbers as it
        Tc = 75
        q, k, v = (torch.randn(2, 3, Tc, 16) for _ in range(3))
        every_head = flex.create_block_mask(causal, 2, 3, Tc, Tc, BLOCK_SIZE=16)
        shared = flex.create_block_mask(causal, None, None, Tc, Tc, BLOCK_SIZE=16)
        every_head_dense = flex.create_block_mask(lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx) &
                                                  (h >= 0), 2, 3, Tc, Tc, BLOCK_SIZE=16)
        check(every_head.info().row_intervals and every_head_dense.info().row_intervals,
              "a head-independent map built per head has row intervals")
        check(not flex.create_block_mask(per_head, 1, 3, Tc, Tc, BLOCK_SIZE=16)
              .info().row_intervals, "a map that differs by head has none")
        # a captured tensor's dim of 1 indexed past 0 is out of bounds, as
        # PyTorch's indexing raises, not broadcast to every head
        thin = torch.randn(1, Tc, Tc)
        try:
            flex.flex_attention(q, k, v, score_mod=lambda s, b, h, q_idx, kv_idx:
                                s + thin[h, q_idx, kv_idx])
            check(False, "a bias of one head indexed by h up to 2: no error")
        except IndexError as err:
            check("(1, 75, 75) is indexed by h up to 2 along its dim 0 of size 1" in str(err),
                  f"a bias of one head indexed by h: {err}")
        softcap = lambda s, b, h, q_idx, kv_idx: 20 * torch.tanh(s / 20)  # noqa: E731
        want = flex.flex_attention(q, k, v, score_mod=softcap, block_mask=shared)
        for bm in (every_head, every_head_dense):
            check(torch.equal(flex.flex_attention(q, k, v, score_mod=softcap, block_mask=bm),
                              want), "per-head copies of one mask: the broadcast map's outputs")
        # float64: gradcheck, with a captured bias
        q = torch.randn(1, 2, 6, 4, dtype=torch.float64, requires_grad=True)
        k = torch.randn(1, 2, 7, 4, dtype=torch.float64, requires_grad=True)
        v = torch.randn(1, 2, 7, 4, dtype=torch.float64, requires_grad=True)
        bm = flex.create_block_mask(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + 1, None,
                                    None, 6, 7, BLOCK_SIZE=16)
        check(torch.autograd.gradcheck(
            lambda q, k, v: flex.flex_attention(q, k, v, block_mask=bm), (q, k, v)),
            "gradcheck float64 with a block mask")
        out, lse = flex.flex_attention(q, k, v, block_mask=bm, return_lse=True)
        check(lse.dtype == torch.float64, f"float64 calls give lse in float64, not {lse.dtype}")
        check(torch.autograd.gradcheck(
            lambda q, k, v: flex.flex_attention(q, k, v, block_mask=bm, return_lse=True),
            (q, k, v)), "gradcheck float64 of out and lse")
        # SDPA's attn_mask: bool and additive, against the math path in float64
        Bs, Hs, Ts, Ss = 2, 3, 37, 53
        q = torch.randn(Bs, Hs, Ts, 16, requires_grad=True)
        k = torch.randn(Bs, Hs, Ss, 16, requires_grad=True)
        v = torch.randn(Bs, Hs, Ss, 16, requires_grad=True)
        for mask in (torch.rand(Bs, 1, Ts, Ss) > 0.3, torch.rand(Bs, 1, 1, Ss) > 0.3,
                     torch.randn(Hs, Ts, Ss).masked_fill(torch.rand(Hs, Ts, Ss) < 0.3,
                                                         float("-inf")).requires_grad_()):
            check(AT.supports(q, k, v, attn_mask=mask) is None, "attn_mask runs on attn")
            for t in (q, k, v):
                t.grad = None
            out = AT.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            dout = torch.randn_like(out)
            (out * dout).sum().backward()
            got = [out, q.grad, k.grad, v.grad]
            if mask.requires_grad:
                got.append(mask.grad)
            qo, ko, vo = (t.detach().double().requires_grad_() for t in (q, k, v))
            mo = mask.detach().double().requires_grad_() if mask.requires_grad else mask
            want_out = AT._math_sdpa(qo, ko, vo, attn_mask=mo)
            (want_out * dout.double()).sum().backward()
            want = [want_out, qo.grad, ko.grad, vo.grad] + ([mo.grad] if mask.requires_grad
                                                             else [])
            for label, a, w in zip(["out", "dq", "dk", "dv", "dmask"], got, want):
                e = rel_l2(a, torch.nan_to_num(w) if label == "dmask" else w)
                check(e < 1e-5, f"SDPA attn_mask {mask.dtype}: {label} relative L2 {e}")
        # NaN or +inf in an additive mask: PyTorch's answer, the rows that
        # see one NaN (the library's block maps refuse both)
        for value in (float("nan"), float("inf")):
            bad = torch.zeros(Ts, Ss)
            row = rng.randrange(Ts)
            bad[row, rng.randrange(Ss)] = value
            check(AT.supports(q, k, v, attn_mask=bad) is not None,
                  f"{value} in an additive mask goes to PyTorch")
            with torch.no_grad():
                out = AT.scaled_dot_product_attention(q, k, v, attn_mask=bad)
                want = AT._math_sdpa(q.double(), k.double(), v.double(), attn_mask=bad.double())
            check(bool(out[:, :, row].isnan().all()) and torch.equal(out.isnan(), want.isnan())
                  and rel_l2(out.nan_to_num(), want.nan_to_num()) < 1e-5,
                  f"{value} in an additive mask: PyTorch's answer, row {row} NaN")
        # the mask descriptions' maps equal the dense ones
        if has_masks:
            for name, fn, _ in mask_cases(2, 2, 90, 77):
                d = flex._trace_mask(fn)
                bm = flex.create_block_mask(fn, 2, 2, 90, 77, BLOCK_SIZE=16)
                check(d is None or bm.description is not None, f"{name}: described")
                check_map(bm, dense(fn, 2, 2, 90, 77), f"described map {name}")
    except _lib.AttnError as err:
        if err.status == "ATTN_ERR_UNSUPPORTED":
            print(f"SKIP: {NEEDS} ({err})")
        else:
            check(False, f"end to end: {err}")


def varlen_end_to_end(name, lens_q, lens_kv, H, D, mask_mod, Bm, score_mod_of, bias_shape):
    """flash_attn_varlen_func with a block_mask and a score_mod in each
    sequence's own positions against each sequence alone in float64 torch."""
    B, Tm, Sm = len(lens_q), max(lens_q), max(lens_kv)
    cu_q = torch.tensor([0] + lens_q).cumsum(0).to(torch.int32)
    cu_kv = torch.tensor([0] + lens_kv).cumsum(0).to(torch.int32)
    tq, tk = int(cu_q[-1]), int(cu_kv[-1])
    q = torch.randn(tq, H, D, requires_grad=True)
    k = torch.randn(tk, H, D, requires_grad=True)
    v = torch.randn(tk, H, D, requires_grad=True)
    dout = torch.randn(tq, H, D)
    bias = torch.randn(*bias_shape) if bias_shape else None
    ba = bias.clone().requires_grad_() if bias is not None else None
    bo = bias.clone().requires_grad_() if bias is not None else None
    # the map one block longer than the longest sequence: what lies past is not read
    bm = flex.create_block_mask(mask_mod, Bm, None, Tm + 16, Sm + 16, BLOCK_SIZE=16) \
        if mask_mod is not None else None
    out, lse, _ = AT.flash_attn_varlen_func(
        q, k, v, cu_q, cu_kv, Tm, Sm, block_mask=bm, return_attn_probs=True,
        score_mod=score_mod_of(ba) if score_mod_of else None)
    (out * dout).sum().backward()
    qo, ko, vo = (t.detach().double().requires_grad_() for t in (q, k, v))
    want_out, want_lse = [], []
    for b in range(B):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_kv[b]), int(cu_kv[b + 1]))
        one = [t[r].transpose(0, 1)[None] for t, r in ((qo, rq), (ko, rk), (vo, rk))]
        smod = score_mod_of(bo) if score_mod_of else None
        # the score_mod and mask_mod of sequence b at batch index 0 (a map made
        # with B 1 too: its mask_mod at each sequence's own b)
        o, l = oracle(*one, (lambda s, bb, h, qi, kv: smod(s, bb + b, h, qi, kv))
                      if smod else None,
                      (lambda bb, h, qi, kv: mask_mod(bb + b, h, qi, kv))
                      if mask_mod else None)
        want_out.append(o[0].transpose(0, 1))
        want_lse.append(l[0])
    want_out, want_lse = torch.cat(want_out), torch.cat(want_lse, 1)
    (want_out * dout.double()).sum().backward()
    got = [out, lse, q.grad, k.grad, v.grad] + ([ba.grad] if ba is not None else [])
    want = [want_out, want_lse, qo.grad, ko.grad, vo.grad] + ([bo.grad] if bo is not None
                                                             else [])
    for label, a, w in zip(["out", "lse", "dq", "dk", "dv", "dbias"], got, want):
        e = rel_l2(a, w)
        check(e < 1e-5, f"varlen {name}: {label} relative L2 error {e}")


if runs:
    # packed sequences (flash_attn_varlen_func): the map and the score_mod in
    # each sequence's own positions
    lens_q, lens_kv, H = [5, 40, 17, 1], [9, 40, 30, 6], 2
    prefix = torch.tensor([3, 0, 12, 1])
    varlen_cases = [
        ("prefix-LM per sequence + bias", lambda b, h, q_idx, kv_idx:
         (kv_idx <= q_idx + 4) | (kv_idx < prefix[b]), 4,
         lambda bias: (lambda s, b, h, q, kv: s + bias[b, h, q, kv]), (4, H, 40, 40)),
        ("causal (one map) + softcap + T5", lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + 5, 1,
         lambda bias: (lambda s, b, h, q, kv: 5.0 * torch.tanh(s / 5.0) + bias[
             h, flex.t5_relative_bucket(kv - q, True, 16, 32)]), (H, 16)),
        # a map made with B 1 and H None whose mask_mod reads b and h: each
        # sequence and head its own blocks, not b = 0's and h = 0's
        ("prefix per sequence, offset per head (one map)", lambda b, h, q_idx, kv_idx:
         (kv_idx <= q_idx + 3 * h) | (kv_idx < prefix[b]), 1, None, None),
    ]
    for name, mmod, Bm, smod, shape in varlen_cases:
        try:
            varlen_end_to_end(name, lens_q, lens_kv, H, 8, mmod, Bm, smod, shape)
        except _lib.AttnError as err:
            check(err.status == "ATTN_ERR_UNSUPPORTED", f"varlen {name}: {err}")
            print(f"SKIP varlen {name}: {NEEDS} ({err})")

    # empty calls: no query, no batch, no key (a query that sees no key gives
    # zeros and lse -inf); gradients of the inputs' shapes, zeros
    for shape_q, shape_kv in (((2, 3, 0, 8), (2, 3, 5, 8)), ((0, 3, 4, 8), (0, 3, 5, 8)),
                              ((2, 3, 4, 8), (2, 3, 0, 8))):
        q = torch.randn(*shape_q, requires_grad=True)
        k, v = (torch.randn(*shape_kv, requires_grad=True) for _ in range(2))
        out, lse = flex.flex_attention(q, k, v, return_lse=True)
        out.sum().backward()
        check(out.shape == shape_q and not out.any() and lse.shape == shape_q[:3] and
              bool((lse == -math.inf).all()) and q.grad.shape == q.shape and
              k.grad.shape == k.shape and not k.grad.any(),
              f"empty flex_attention {shape_q} x {shape_kv}: {tuple(out.shape)}")
    q = torch.randn(1, 4, 8, 16)
    for what, call, word in (
            ("a key of 0 heads with enable_gqa",
             lambda: flex.flex_attention(q, q[:, :0], q[:, :0], enable_gqa=True), "heads"),
            ("a scale that is not a number", lambda: flex.flex_attention(q, q, q, scale="a"),
             "scale")):
        try:
            call()
            check(False, f"{what}: no error")
        except (TypeError, ValueError) as err:
            check(word in str(err), f"{what}: message {err}")
    # a scale out of range is a ValueError naming flex_attention and the
    # scale (the docs' promise for flex_attention), not the library's error
    for bad in (math.inf, -math.inf, math.nan, 1e39, -1e39):
        try:
            flex.flex_attention(q, q, q, scale=bad)
            check(False, f"flex_attention scale {bad}: no error")
        except ValueError as err:
            check(str(err).startswith("flex_attention:") and repr(bad) in str(err),
                  f"flex_attention scale {bad}: message {err}")
        except Exception as err:
            check(False, f"flex_attention scale {bad}: {type(err).__name__}: {err}")
    try:  # refused before its index grid (8 TB of int64 positions) is made
        flex.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None,
                               2 ** 40, 2 ** 40)
        check(False, "create_block_mask of 2^40 positions: no error")
    except ValueError as err:
        check("Q_LEN (1099511627776)" in str(err), f"create_block_mask of 2^40: message {err}")

# ---- (c) the rest of PyTorch's FlexAttention API, as PyTorch spells it -------------------

B, H, T, S = 2, 3, 70, 90


def causal_plus(b, h, q_idx, kv_idx):
    return q_idx + 10 >= kv_idx


# create_mask: a mask_mod's bools; a score_mod's where it is not -inf at 0
check(torch.equal(flex.create_mask(causal_plus, B, H, T, S), dense(causal_plus, B, H, T, S)),
      "create_mask of a mask_mod: the mask on the grid")
m = flex.create_mask(lambda s, b, h, q, kv: torch.where(q >= kv + h, s, -float("inf")), B, H,
                     T, S)
check(m.shape == (B, H, T, S) and torch.equal(
    m, dense(lambda b, h, q, kv: q >= kv + h, B, H, T, S)),
    "create_mask of a score_mod: where it is not -inf")
check(flex.create_mask(causal_plus, None, None, T, S).shape == (1, 1, T, S),
      "create_mask with B, H None: (1, 1, T, S)")
# zero sizes: an empty mask of that shape, as PyTorch's aranges give
for sizes in ((0, H, T, S), (B, 0, T, S), (B, H, 0, S), (B, H, T, 0)):
    for mod in (causal_plus, lambda s, b, h, q, kv: torch.where(q >= kv, s, -float("inf"))):
        try:
            m = flex.create_mask(mod, *sizes)
            check(m.dtype == torch.bool and m.shape == sizes, f"create_mask{sizes}: {m.shape}")
        except Exception as err:
            check(False, f"create_mask{sizes}: {type(err).__name__}: {err}")


def raising_mask(b, h, q_idx, kv_idx):
    raise KeyError("no such document")


# refusals name create_mask, the call made
for what, args, kind in (("B of -1", (causal_plus, -1, H, T, S), ValueError),
                         ("KV_LEN of 2.5", (causal_plus, B, H, T, 2.5), ValueError),
                         ("a mask_mod that raises", (raising_mask, B, H, T, S), KeyError)):
    try:
        flex.create_mask(*args)
        check(False, f"create_mask with {what}: no error")
    except kind as err:
        check(str(err).strip("'\"").startswith("create_mask:"),
              f"create_mask with {what}: message {err}")
if runs:
    bm = flex.create_block_mask(causal_plus, B, H, T, S, device=None, BLOCK_SIZE=16,
                                separate_full_blocks=False, compute_dq_write_order=False,
                                dq_kv_order=True)
    keep = dense(causal_plus, B, H, T, S)
    nq, nkv = -(-T // 16), -(-S // 16)
    want = torch.zeros(B, H, nq, nkv, dtype=torch.int32)
    for i in range(nq):
        for j in range(nkv):
            want[:, :, i, j] = keep[:, :, 16 * i:16 * i + 16, 16 * j:16 * j + 16].flatten(2) \
                .any(-1).to(torch.int32)
    got = bm.to_dense()
    check(got.dtype == torch.int32 and torch.equal(got, want),
          "BlockMask.to_dense: the visited blocks of the mask")
    check(bm.numel() == B * H * T * S, f"BlockMask.numel: {bm.numel()}")
    check(bm.to("cpu") is bm, "BlockMask.to('cpu') is the map")
    try:
        bm.to("meta")
        check(False, "BlockMask.to('meta'): no error")
    except ValueError as err:
        check("meta" in str(err), f"BlockMask.to('meta'): {err}")
    # a where-mask joins a from_kv_blocks map as its lists draw it (the
    # blocks listed: full ones whole, partial ones under mask_mod), not as
    # every block its mask_mod allows
    kvn = torch.ones(1, 2, 4, dtype=torch.int32)  # partial: the diagonal blocks
    kvi = torch.arange(4, dtype=torch.int32).view(1, 1, 4, 1).repeat(1, 2, 1, 4)
    fkn = torch.tensor([[[0, 0, 0, 1], [0, 0, 0, 0]]], dtype=torch.int32)  # full: (3, 0), h 0
    fki = torch.zeros(1, 2, 4, 4, dtype=torch.int32)
    qb, kb = torch.arange(64).view(64, 1) // 16, torch.arange(64).view(1, 64) // 16
    full = torch.stack([(qb == 3) & (kb == 0), torch.zeros(64, 64, dtype=torch.bool)])
    q2, k2, v2 = (torch.randn(1, 2, 64, 8, dtype=torch.float64) for _ in range(3))
    for mm in (None, causal_plus):
        bm = flex.BlockMask.from_kv_blocks(kvn, kvi, fkn, fki, BLOCK_SIZE=16, mask_mod=mm)
        inside = (qb == kb) & (True if mm is None else dense(mm, 1, 1, 64, 64)[0, 0])
        for how, sm, cond in (
                ("traced", lambda s, b, h, q, kv: torch.where(kv % 3 != 1, s, -float("inf")),
                 lambda q, kv: kv % 3 != 1),
                ("drawn", lambda s, b, h, q, kv: torch.where((q * kv) % 3 != 1, s,
                                                             -float("inf")),
                 lambda q, kv: (q * kv) % 3 != 1)):
            keep = (full | inside) & cond(torch.arange(64).view(64, 1), torch.arange(64))
            scores = (q2 @ k2.transpose(-1, -2) / math.sqrt(8)).masked_fill(~keep, -math.inf)
            want = torch.softmax(scores, -1).nan_to_num(0.0) @ v2
            got = flex.flex_attention(q2, k2, v2, score_mod=sm, block_mask=bm)
            check(torch.allclose(got, want, atol=1e-12),
                  f"where ({how}) and from_kv_blocks (mask_mod {mm is not None}): "
                  f"{(got - want).abs().max().item():.3g} off")
    # return_aux and kernel_options
    q, k, v = (torch.randn(B, H, T, 16) for _ in range(3))
    out, lse = flex.flex_attention(q, k, v, block_mask=None, return_lse=True)
    out2, aux = flex.flex_attention(q, k, v, return_aux=flex.AuxRequest(lse=True),
                                    kernel_options={"BLOCK_M": 32})
    check(torch.equal(out, out2) and torch.equal(lse, aux.lse) and aux.max_scores is None,
          "return_aux=AuxRequest(lse=True): the out and lse of return_lse")
    out3, aux = flex.flex_attention(q, k, v, return_aux=flex.AuxRequest())
    check(torch.equal(out, out3) and aux.lse is None, "return_aux=AuxRequest(): out alone")
    for what, call, kind, word in (
            ("max_scores", lambda: flex.flex_attention(
                q, k, v, return_aux=flex.AuxRequest(lse=True, max_scores=True)),
             NotImplementedError, "max_scores"),
            ("return_lse and return_aux", lambda: flex.flex_attention(
                q, k, v, return_lse=True, return_aux=flex.AuxRequest(lse=True)), ValueError,
             "both"),
            ("kernel_options of 3", lambda: flex.flex_attention(q, k, v, kernel_options=3),
             TypeError, "kernel_options"),
            ("return_aux of True", lambda: flex.flex_attention(q, k, v, return_aux=True),
             TypeError, "AuxRequest")):
        try:
            call()
            check(False, f"{what}: no error")
        except kind as err:
            check(word in str(err), f"{what}: message {err}")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
