#!/usr/bin/python3
"""attn's tokenizers (python/attn/tokenizer.py over attn_tokenizer_*) against
tiktoken and transformers' GPT2Tokenizer, on vocabularies trained here.

    .venv/bin/python tests/conformance/test_tokenizer_vs_tiktoken.py LIBATTN_SO [--seed N]
                                                                     [--strings N]

GPT-2's and Llama 3's real files cannot be fetched (no network), so each run
trains a small byte-level BPE (a few hundred merges) on a fresh random
corpus (the seed is printed; --seed replays) mixing English with
contractions, accented and non-Latin letters, CJK, emoji, digits, white
space runs and newlines, and writes it in the formats attn reads:

  1. GPT-2: vocab.json + merges.txt (Hugging Face's names) and
     encoder.json + vocab.bpe (OpenAI's), with ids shuffled and some merges
     moved out of training order, against GPT2Tokenizer(vocab, merges)
     (Python regex's GPT-2 pattern, merges by rank): encode ids, decode;
     the four ways of naming the files agree;
  2. tiktoken files, against tiktoken.Encoding(pat_str=Llama 3's pattern,
     mergeable_ranks, Llama 3's special tokens after the ranks): one in
     training order with extra unreachable tokens (tiktoken's whole-piece
     lookup), one with every rank shuffled;
  3. a 128000-rank tiktoken file against the book's own Llama3Tokenizer
     (llms_from_scratch.kv_cache.llama3), special tokens included;

on many random and adversarial strings: text like the corpus, random code
points from several scripts (letters, marks, digits of other scripts, Nl/No
numbers, every White_Space character and U+001C..U+001F, which are not),
Latin-1 text from random bytes, long white space runs, contractions in any
case ("'s'S'LL", U+017F), digit runs of 1 to 10. decode(encode(s)) == s
always, and random id lists decode as the oracles decode them. Prints
"N passed, N failed".
"""
import argparse
import base64
import collections
import json
import os
import random
import sys
import tempfile
import time
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

parser = argparse.ArgumentParser()
parser.add_argument("library")
parser.add_argument("--seed", type=int, default=None)
parser.add_argument("--strings", type=int, default=600)
args = parser.parse_args()
os.environ["ATTN_LIBRARY"] = args.library
sys.path.insert(0, os.path.join(ROOT, "python"))

try:
    import regex
    import tiktoken
    from transformers import GPT2Tokenizer
except ImportError as err:  # the venv (scripts/install-python-deps.sh) has them
    print(f"SKIP: {err}")
    sys.exit(77)

from attn import AttnError  # noqa: E402
from attn.tokenizer import Tokenizer  # noqa: E402

seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
print(f"seed {seed}")
rng = random.Random(seed)

GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PAT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

passed = failed = 0
shown = collections.Counter()


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
        return True
    failed += 1
    key = what.split(":")[0]
    shown[key] += 1
    if shown[key] <= 5:
        print(f"FAIL: {what}" + (f"\n      {detail}" if detail else ""))
    return False


# ---- text ---------------------------------------------------------------

WORDS = ("the quick brown fox jumps over lazy dog it's don't we'll you've they're I'm "
         "she'd He'S THEY'LL naïve café résumé Straße façade über smörgåsbord "
         "Москва привет мир Ελλάδα καλημέρα שלום مرحبا नमस्ते สวัสดี "
         "東京 日本語 中文字符 漢字 こんにちは カタカナ 한국어 안녕하세요 "
         "😀 🚀 👍🏽 🇫🇷 👨‍👩‍👧 ½ ² Ⅻ ٣٤٥ १२३ ３４ $100 3.14159 2024 1,000,000 "
         "foo_bar x+y=z <html> {json: true} #tag @user e-mail ... !!! ?? -- __init__").split()
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "    ", "\u3000",
          "\u00a0", " \t \n"]


def corpus_text(r, words=60):
    out = []
    for _ in range(words):
        w = r.choice(WORDS)
        if r.random() < 0.1:
            w = w.upper()
        if r.random() < 0.15:
            w = str(r.randrange(10 ** r.randint(1, 8)))
        out.append(w)
        out.append(" " if r.random() < 0.8 else r.choice(SPACES))
    return "".join(out)


SCRIPT_RANGES = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x590, 0x5FF), (0x600, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF),
    (0x16A0, 0x16FF), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x2070, 0x218F),
    (0x2460, 0x24FF), (0x3000, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xACFF),
    (0xFF00, 0xFFEF), (0x10330, 0x1034F), (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF),
    (0x20000, 0x200FF),
]
SPECIAL_CHARS = ("\t\n\r\x0b\x0c \x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2005\u200a\u2028"
                 "\u2029\u202f\u205f\u3000\u180e\u200b\u200d\ufeff'sStTmMdDrReEvVlLſK\u0130")


# Blocks (with their neighbours) where Unicode 15 and 16 made new letters
# and digits: Cyrillic Extended-D, CJK Extensions H and I, Egyptian
# Hieroglyphs Extended-A, Garay, Kawi, Todhri, Tulu-Tigalari, and others.
UNICODE_15_16_BLOCKS = [
    (0x1C80, 0x1C8F), (0xA7C0, 0xA7DF), (0x105C0, 0x105FF), (0x10D40, 0x10D8F),
    (0x10EC0, 0x10EFF), (0x11230, 0x1124F), (0x11380, 0x113FF), (0x116C0, 0x116FF),
    (0x11BC0, 0x11BFF), (0x11F00, 0x11F5F), (0x13420, 0x1343F), (0x13460, 0x143FF),
    (0x16100, 0x1613F), (0x16D40, 0x16D7F), (0x18CF0, 0x18CFF), (0x1B130, 0x1B15F),
    (0x1CCF0, 0x1CCFF), (0x1D2C0, 0x1D2DF), (0x1DF20, 0x1DF2F), (0x1E030, 0x1E08F),
    (0x1E4D0, 0x1E4FF), (0x1E5D0, 0x1E5FF), (0x2B730, 0x2B73F), (0x2EBF0, 0x2EE5F),
    (0x31350, 0x323AF),
]


def class_probe_text(cp):
    """A letter and a digit either side of cp: Llama 3's pattern puts cp
    in the letter's piece only if it is a letter, in the digits' only if it
    is a digit."""
    return "a" + chr(cp) + " 1" + chr(cp)


def class_probe_ranks(cps):
    """The bytes, then for each code point its UTF-8 prefixes and "a" and
    "1" before it as merges: a piece "a<cp>" or "1<cp>" is one token, and
    a boundary inside it is seen in the ids."""
    tokens = [bytes([b]) for b in range(256)]
    for cp in cps:
        u = chr(cp).encode("utf-8")
        tokens += [u[:n] for n in range(2, len(u) + 1)] + [b"a" + u, b"1" + u]
    tokens = list(dict.fromkeys(tokens))
    return {t: i for i, t in enumerate(tokens)}


def assigned(cp):
    return unicodedata.category(chr(cp)) not in ("Cn", "Cs")


def random_unicode(r, n):
    out = []
    while len(out) < n:
        if r.random() < 0.25:
            out.append(r.choice(SPECIAL_CHARS))
            continue
        lo, hi = r.choice(SCRIPT_RANGES)
        cp = r.randint(lo, hi)
        if assigned(cp):
            out.append(chr(cp))
    return "".join(out)


def contraction_soup(r):
    parts = []
    for _ in range(r.randint(1, 8)):
        c = r.choice(["s", "t", "re", "ve", "m", "ll", "d", "x", "", "ſ"])
        c = "".join(ch.upper() if r.random() < 0.5 else ch for ch in c)
        parts.append("'" + c + r.choice(["", " ", "a", "1", "'", "\n"]))
    return "".join(parts)


def adversarial(r):
    kind = r.randrange(8)
    if kind == 0:
        return bytes(r.randrange(256) for _ in range(r.randint(1, 40))).decode("latin-1")
    if kind == 1:
        run = "".join(r.choice(" \t\n\r\u3000\u00a0\x0b") for _ in range(r.randint(1, 60)))
        return r.choice(["", "a", "1", "!"]) + run + r.choice(["", "b", "2", "?", " x"])
    if kind == 2:
        return " " * r.randint(1, 300) + r.choice(["", "word", "\n", "1"])
    if kind == 3:
        return contraction_soup(r)
    if kind == 4:
        return "".join(r.choice(["", " ", "x", "\n"]) + "".join(
            r.choice("0123456789") for _ in range(r.randint(1, 10))) for _ in range(r.randint(1, 5)))
    if kind == 5:
        return "".join(r.choice("aaaa----    0000zz..") for _ in range(r.randint(1, 30)))
    if kind == 6:
        return "\n" * r.randint(1, 20) + " " * r.randint(0, 5) + "\r\n" * r.randint(0, 3)
    return random_unicode(r, r.randint(1, 30)) + corpus_text(r, 3)


def test_strings(r, n, specials_in_text):
    out = ["", " ", "a", "\n", "'s", "  a", "hello world", "Hello, World!\n\n  x", "  \n\n",
           "'S'LL'Ve'ſ", "'ſa 'ſt'ſ1 x'ſſ", "'Kx 'K", "1234567890", " 123 4567", "a\u0301", "ab\u200dcd", "x\u3000\u3000y"]
    if specials_in_text:
        out.append("<|endoftext|> and <|begin_of_text|>")
    for i in range(n):
        k = i % 4
        if k == 0:
            out.append(corpus_text(r, r.randint(1, 30)))
        elif k == 1:
            out.append(random_unicode(r, r.randint(1, 60)))
        else:
            out.append(adversarial(r))
    return out


# ---- training -----------------------------------------------------------

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(
        range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_ENCODER = bytes_to_unicode()


def train_bpe(text, pattern, merges_wanted):
    """Byte-level BPE on text split by pattern: the merges, (left, right)
    byte strings in order."""
    words = collections.Counter(regex.findall(pattern, text))
    seqs = {tuple(bytes([b]) for b in w.encode("utf-8")): c for w, c in words.items()}
    merges = []
    for _ in range(merges_wanted):
        pairs = collections.Counter()
        for seq, c in seqs.items():
            for a, b in zip(seq, seq[1:]):
                pairs[a, b] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        joined = best[0] + best[1]
        new = {}
        for seq, c in seqs.items():
            out, i = [], 0
            while i < len(seq):
                if i + 1 < len(seq) and seq[i] == best[0] and seq[i + 1] == best[1]:
                    out.append(joined)
                    i += 2
                else:
                    out.append(seq[i])
                    i += 1
            new[tuple(out)] = new.get(tuple(out), 0) + c
        seqs = new
    return merges


def to_gpt2_str(b):
    return "".join(BYTE_ENCODER[x] for x in b)


def write_gpt2(directory, merges, r, vocab_name, merges_name, shuffle_merges):
    """vocab + merges files; ids shuffled, some merges moved."""
    tokens = [bytes([b]) for b in range(256)] + [a + b for a, b in merges]
    tokens = list(dict.fromkeys(tokens))
    ids = list(range(len(tokens)))
    r.shuffle(ids)
    vocab = {to_gpt2_str(t): i for t, i in zip(tokens, ids)}
    vocab["<|endoftext|>"] = len(tokens)
    order = list(merges)
    if shuffle_merges:
        for _ in range(len(order) // 8):
            i, j = r.randrange(len(order)), r.randrange(len(order))
            order[i], order[j] = order[j], order[i]
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, vocab_name), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=r.random() < 0.5)
    with open(os.path.join(directory, merges_name), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in order:
            f.write(f"{to_gpt2_str(a)} {to_gpt2_str(b)}\n")
    return vocab


def llama3_specials(base):
    named = {"<|begin_of_text|>": 0, "<|end_of_text|>": 1, "<|start_header_id|>": 6,
             "<|end_header_id|>": 7, "<|eot_id|>": 9}
    specials = {name: base + k for name, k in named.items()}
    for i in range(254):
        if 2 + i not in named.values():
            specials[f"<|reserved_{i}|>"] = base + 2 + i
    return specials


def adjacent_grams(strings, r):
    """Merges (left, right) of byte strings: every adjacent byte pair of the
    strings' UTF-8 in random order, then a third of the triples found (pair
    + byte), so that the merged pieces show where the pieces end."""
    pairs, triples = {}, {}
    for s in strings + [SPECIAL_CHARS]:
        b = s.encode("utf-8")
        for i in range(len(b) - 1):
            pairs[b[i:i + 1], b[i + 1:i + 2]] = None
            if i + 2 < len(b) and r.random() < 0.3:
                triples[b[i:i + 2], b[i + 2:i + 3]] = None
    pairs, triples = list(pairs), list(triples)
    r.shuffle(pairs)
    r.shuffle(triples)
    return pairs + triples


def write_tiktoken(path, ranks):
    with open(path, "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")


# ---- comparisons --------------------------------------------------------

def compare_encode(name, ours, oracle_encode, strings):
    for s in strings:
        want = oracle_encode(s)
        got = ours.encode(s)
        check(got == want, f"{name}: encode {s[:40]!r}", f"got  {got[:20]}\n      want {want[:20]}")
        check(ours.decode(got) == s, f"{name}: decode(encode(s)) == s for {s[:40]!r}")


def compare_decode(name, ours, oracle_decode, vocab_size, r, trials=150):
    for _ in range(trials):
        ids = [r.randrange(vocab_size) for _ in range(r.randint(0, 12))]
        want = oracle_decode(ids)
        got = ours.decode(ids)
        check(got == want, f"{name}: decode {ids}", f"got {got!r} want {want!r}")


def expect_error(status, fn, what):
    try:
        fn()
    except AttnError as err:
        return check(err.status == status, f"errors: {what} gives {err.status}, want {status}",
                     str(err))
    return check(False, f"errors: {what} did not fail")


def main():
    corpus = "".join(corpus_text(rng, 80) + rng.choice(SPACES) for _ in range(150))
    corpus += "".join(adversarial(rng) for _ in range(100))
    merges_wanted = rng.randint(250, 400)
    strings = test_strings(rng, args.strings, specials_in_text=False)
    tmp = tempfile.TemporaryDirectory()
    t0 = time.time()

    # 1. GPT-2's formats against GPT2Tokenizer
    merges = train_bpe(corpus, GPT2_PAT, merges_wanted)
    print(f"trained {len(merges)} merges on {len(corpus)} characters ({time.time() - t0:.1f} s)")
    hf_dir = os.path.join(tmp.name, "hf")
    vocab = write_gpt2(hf_dir, merges, rng, "vocab.json", "merges.txt", shuffle_merges=True)
    hf = GPT2Tokenizer(os.path.join(hf_dir, "vocab.json"), os.path.join(hf_dir, "merges.txt"))
    ours = Tokenizer(hf_dir)
    check(ours.vocab_size == len(vocab), f"gpt2: vocab_size {ours.vocab_size} == {len(vocab)}")
    compare_encode("gpt2", ours, lambda s: hf.encode(s), strings)
    compare_decode("gpt2", ours,
                   lambda ids: hf.decode(ids, clean_up_tokenization_spaces=False,
                                         spaces_between_special_tokens=False),
                   len(vocab), rng)
    eot = vocab["<|endoftext|>"]
    check(ours.decode([eot]) == "<|endoftext|>", "gpt2: <|endoftext|> decodes to its name")
    check(eot not in ours.encode("<|endoftext|>"), "gpt2: special names in text are plain text")
    # every adjacent byte pair (and some triples) of the strings as a merge,
    # in random order: a piece boundary in another place changes the ids
    pairs = adjacent_grams(strings, rng)
    dense_dir = os.path.join(tmp.name, "dense")
    vocab = write_gpt2(dense_dir, pairs, rng, "vocab.json", "merges.txt", shuffle_merges=False)
    hf = GPT2Tokenizer(os.path.join(dense_dir, "vocab.json"),
                       os.path.join(dense_dir, "merges.txt"))
    compare_encode("gpt2 dense", Tokenizer(dense_dir), lambda s: hf.encode(s), strings)
    # OpenAI's names, and paths to a file of either pair
    openai_dir = os.path.join(tmp.name, "openai")
    os.makedirs(openai_dir)
    os.link(os.path.join(hf_dir, "vocab.json"), os.path.join(openai_dir, "encoder.json"))
    os.link(os.path.join(hf_dir, "merges.txt"), os.path.join(openai_dir, "vocab.bpe"))
    sample = strings[: len(strings) // 4]
    want = [ours.encode(s) for s in sample]
    for path in (openai_dir, os.path.join(openai_dir, "encoder.json"),
                 os.path.join(openai_dir, "vocab.bpe"), os.path.join(hf_dir, "vocab.json"),
                 os.path.join(hf_dir, "merges.txt")):
        other = Tokenizer(path)
        check([other.encode(s) for s in sample] == want, f"gpt2: {path} loads the same tokenizer")

    # 2. tiktoken files against tiktoken with Llama 3's pattern
    merges = train_bpe(corpus, LLAMA3_PAT, merges_wanted)
    tokens = [bytes([b]) for b in range(256)] + [a + b for a, b in merges]
    # unreachable by merges: tiktoken finds them only as a whole piece
    for _ in range(60):
        w = rng.choice(regex.findall(LLAMA3_PAT, corpus)).encode("utf-8")
        tokens.append(w)
    tokens = list(dict.fromkeys(tokens))
    shuffled = tokens[:]
    rng.shuffle(shuffled)
    dense = [bytes([b]) for b in range(256)] + [a + b for a, b in pairs]
    dense = list(dict.fromkeys(dense))
    for label, order in (("tiktoken", tokens), ("tiktoken shuffled", shuffled),
                         ("tiktoken dense", dense)):
        ranks = {t: i for i, t in enumerate(order)}
        path = os.path.join(tmp.name, label.replace(" ", "_") + ".model")
        write_tiktoken(path, ranks)
        specials = llama3_specials(len(ranks))
        enc = tiktoken.Encoding(name=label, pat_str=LLAMA3_PAT, mergeable_ranks=ranks,
                                special_tokens=specials)
        ours = Tokenizer(path)
        check(ours.vocab_size == enc.n_vocab, f"{label}: vocab_size {ours.vocab_size} == "
              f"{enc.n_vocab}")
        tt_strings = strings + ["<|endoftext|> and <|begin_of_text|><|eot_id|>"]
        compare_encode(label, ours, lambda s: enc.encode(s, disallowed_special=()), tt_strings)
        compare_decode(label, ours, lambda ids: enc.decode(ids), enc.n_vocab, rng)
        for name, i in specials.items():
            if ours.decode([i]) != name:
                check(False, f"{label}: special {i} decodes to {name}")
                break
        else:
            check(True, "specials")
    # the same file through a directory's tokenizer.model
    llama_dir = os.path.join(tmp.name, "llama")
    os.makedirs(llama_dir)
    os.link(path, os.path.join(llama_dir, "tokenizer.model"))
    check([Tokenizer(llama_dir).encode(s) for s in sample] == [ours.encode(s) for s in sample],
          "tiktoken: a directory's tokenizer.model loads")

    # 3. Meta's size: the book's Llama3Tokenizer reads the same file
    big = dict((t, i) for i, t in enumerate(tokens))
    while len(big) < 128000:
        filler = bytes(rng.randrange(256) for _ in range(rng.randint(4, 9)))
        big.setdefault(filler, len(big))
    path = os.path.join(tmp.name, "tokenizer.model")
    write_tiktoken(path, big)
    # tiktoken's load_tiktoken_bpe reads local files through blobfile, which
    # the venv lacks: open() does that job; no cache of the file
    if "blobfile" not in sys.modules:
        try:
            import blobfile  # noqa: F401
        except ImportError:
            import types
            sys.modules["blobfile"] = types.SimpleNamespace(BlobFile=open)
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    from llms_from_scratch.kv_cache.llama3 import Llama3Tokenizer
    book = Llama3Tokenizer(path)
    ours = Tokenizer(path)
    check(ours.vocab_size == 128256, f"llama3: vocab_size {ours.vocab_size} == 128256")
    compare_encode("llama3 book", ours, lambda s: book.encode(s, disallowed_special=()),
                   strings[: len(strings) // 2])
    compare_decode("llama3 book", ours, book.decode, 128256, rng, trials=50)
    for name, i in book.special.items():
        if i < 128256:
            check(ours.decode([i]) == name, f"llama3 book: {name} is {i}")
    check(ours.encode("") == [], "encode('') is []")

    # large text: the same ids as tiktoken, and the time of each
    big_text = corpus * max(1, 1_000_000 // len(corpus))
    t1 = time.time()
    got = ours.encode(big_text)
    t2 = time.time()
    want = book.encode(big_text, disallowed_special=())
    t3 = time.time()
    check(got == want, "llama3 book: a 1 MB text")
    print(f"{len(big_text.encode()) / 1e6:.1f} MB: attn {t2 - t1:.2f} s, tiktoken {t3 - t2:.2f} s "
          f"({len(got)} tokens)")
    # one long piece: merging stays n log n
    piece = "a" * 200_000
    t1 = time.time()
    got = ours.encode(piece)
    t2 = time.time()
    check(got == book.encode(piece), "llama3 book: a piece of 200000 letters")
    check(t2 - t1 < 5, f"a piece of 200000 letters took {t2 - t1:.2f} s")

    # the Unicode classes, code point by code point, where Unicode 15 and 16
    # made letters and digits (tiktoken 0.9's tables are 16's), and at random
    cps = [cp for lo, hi in UNICODE_15_16_BLOCKS for cp in range(lo, hi + 1)]
    cps += [rng.randrange(0x110000) for _ in range(4000)]
    cps = [cp for cp in dict.fromkeys(cps) if not 0xD800 <= cp < 0xE000]
    ranks = class_probe_ranks(cps)
    path = os.path.join(tmp.name, "classes.model")
    write_tiktoken(path, ranks)
    enc = tiktoken.Encoding(name="classes", pat_str=LLAMA3_PAT, mergeable_ranks=ranks,
                            special_tokens=llama3_specials(len(ranks)))
    ours = Tokenizer(path)
    wrong = [f"U+{cp:04X}" for cp in cps
             if ours.encode(class_probe_text(cp)) != enc.encode(class_probe_text(cp),
                                                                disallowed_special=())]
    check(not wrong, f"classes: {len(cps)} code points split as tiktoken splits them"
          f"{': not ' + ', '.join(wrong[:8]) if wrong else ''}")

    # errors: missing files, malformed files
    expect_error("ATTN_ERR_IO", lambda: Tokenizer(os.path.join(tmp.name, "missing")), "a missing file")
    bad = os.path.join(tmp.name, "bad.model")
    with open(bad, "w") as f:
        f.write("IQ== 0\nnot-base64! 1\n")
    expect_error("ATTN_ERR_FORMAT", lambda: Tokenizer(bad), "a malformed tiktoken file")
    try:
        Tokenizer(bad)
    except AttnError as err:
        check(f"{bad}:2" in str(err), f"errors: the message names the file and line: {err}")
    print(f"{time.time() - t0:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
