"""The book's text data and PyTorch's sampling draws in attn, against the book's
code (llms_from_scratch 1.0.19: GPTDatasetV1, create_dataloader_v1, generate)
and PyTorch 1.13 run here on fresh seeds:

  1. attn_text_split and attn_text_dataset_encode on the-verdict.txt (from
     the repository's data/, tokenized with its gpt2-bpe
     files through attn and through tiktoken) equal gpt_train.py's split and
     the book's windows, for the book's 256/256 and other lengths/strides,
     and on random text holding <|endoftext|> and multi-byte characters;
  2. attn_rng_random_int64 and attn_rng_randperm equal random_() and
     randperm (sizes up to 70000);
  3. attn_data_loader passes equal DataLoader's batches of indices for
     shuffled and unshuffled loaders, drop_last or not, several seeds,
     sizes and epochs, with other draws (torch.rand) between passes and
     passes left early (calc_loss_loader's break); after all of it the next
     torch.rand is equal, so the global generator is where PyTorch's is;
     and the book's create_dataloader_v1 batches of the-verdict equal
     attn_text_dataset_batch's;
  4. attn_rng_multinomial equals torch.multinomial(probs, 1) on PyTorch's
     own probabilities, and attn_sample_book the book's generate (top_k
     filters with -inf, temperature) token for token on the same draws;
  5. refusals: the status, a message naming the values, and no draw.

    test_book_data.py LIBATTN
"""
import ctypes
import os
import random
import sys
import types
from ctypes import POINTER, byref, c_bool, c_char_p, c_double, c_int32, c_int64, c_size_t, c_uint64, c_void_p

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(ROOT, "data")  # the book's files, kept in the repository (data/README.md)
VERDICT = os.path.join(DATA, "the-verdict.txt")
BPE = os.path.join(DATA, "gpt2-bpe")
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


class Runner:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL:", what)


R = Runner()


class Lib:
    def __init__(self, path):
        lib = ctypes.CDLL(path)
        self.lib = lib

        def fn(name, restype, *argtypes):
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = list(argtypes)

        P = c_void_p
        fn("attn_ctx_new", c_int32, c_void_p, POINTER(P))
        fn("attn_ctx_free", None, P)
        fn("attn_ctx_last_error", c_char_p, P)
        fn("attn_rng_new", c_int32, P, c_uint64, POINTER(P))
        fn("attn_rng_free", None, P)
        fn("attn_rng_rand", c_int32, P, P, c_size_t)
        fn("attn_rng_random_int64", c_int32, P, POINTER(c_int64))
        fn("attn_rng_randperm", c_int32, P, c_size_t, P)
        fn("attn_rng_multinomial", c_int32, P, P, c_size_t, POINTER(c_int64))
        fn("attn_sample_book", c_int32, P, P, c_size_t, c_double, c_size_t, P, POINTER(c_int32))
        fn("attn_tokenizer_load", c_int32, P, c_char_p, POINTER(P))
        fn("attn_tokenizer_free", None, P)
        fn("attn_text_split", c_int32, P, c_char_p, c_size_t, c_double, POINTER(c_size_t))
        fn("attn_text_dataset_new", c_int32, P, P, c_size_t, c_size_t, c_size_t, POINTER(P))
        fn("attn_text_dataset_encode", c_int32, P, P, c_char_p, c_size_t, c_size_t, c_size_t,
           POINTER(P))
        fn("attn_text_dataset_free", None, P)
        fn("attn_text_dataset_len", c_size_t, P)
        fn("attn_text_dataset_num_ids", c_size_t, P)
        fn("attn_text_dataset_get", c_int32, P, c_size_t, P, P)
        fn("attn_data_loader_new", c_int32, P, c_size_t, c_size_t, c_bool, c_bool, POINTER(P))
        fn("attn_data_loader_free", None, P)
        fn("attn_data_loader_len", c_size_t, P)
        fn("attn_data_loader_begin", c_int32, P, P)
        fn("attn_data_loader_batch", c_int32, P, c_size_t, P, POINTER(c_size_t))
        fn("attn_text_dataset_batch", c_int32, P, P, c_size_t, P, P, POINTER(c_size_t))
        self.ctx = P()
        assert lib.attn_ctx_new(None, byref(self.ctx)) == 0

    def ok(self, status, what):
        if status != 0:
            raise RuntimeError("%s: status %d: %s" % (what, status,
                               self.lib.attn_ctx_last_error(self.ctx)))

    def rng(self, seed):
        r = c_void_p()
        self.ok(self.lib.attn_rng_new(self.ctx, seed, byref(r)), "attn_rng_new")
        return r

    def rand(self, rng, n):
        out = np.zeros(n, np.float32)
        self.ok(self.lib.attn_rng_rand(rng, out.ctypes.data, n), "attn_rng_rand")
        return out


def gpt2_tiktoken():
    """tiktoken's gpt2 encoding from the local files (get_encoding would
    fetch them): the same ranks, pattern and special token."""
    import tiktoken
    import tiktoken.load
    if "blobfile" not in sys.modules:
        try:
            import blobfile  # noqa: F401
        except ImportError:
            sys.modules["blobfile"] = types.SimpleNamespace(BlobFile=open)
    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
        os.path.join(BPE, "vocab.bpe"), os.path.join(BPE, "encoder.json"))
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


def dataset_rows(L, ds, max_length):
    n = L.lib.attn_text_dataset_len(ds)
    inputs = np.zeros((n, max_length), np.int32)
    targets = np.zeros((n, max_length), np.int32)
    for k in range(n):
        L.ok(L.lib.attn_text_dataset_get(ds, k, inputs[k].ctypes.data, targets[k].ctypes.data),
             "attn_text_dataset_get")
    return inputs, targets


def encode_dataset(L, tok, text, max_length, stride):
    raw = text.encode("utf-8")
    ds = c_void_p()
    L.ok(L.lib.attn_text_dataset_encode(L.ctx, tok, raw, len(raw), max_length, stride, byref(ds)),
         "attn_text_dataset_encode")
    return ds


# ---- 1. the split and the windows --------------------------------------------


def test_windows(L, enc, tok):
    from llms_from_scratch.ch02 import GPTDatasetV1
    with open(VERDICT, "r", encoding="utf-8") as f:
        text = f.read()
    raw = text.encode("utf-8")
    for ratio in (0.9, 0.5, 0.0, 1.0, 0.123):
        split = c_size_t()
        L.ok(L.lib.attn_text_split(L.ctx, raw, len(raw), ratio, byref(split)), "attn_text_split")
        idx = int(ratio * len(text))
        R.check(raw[:split.value].decode("utf-8") == text[:idx],
                "split %g: byte %d is character %d" % (ratio, split.value, idx))
    idx = int(0.90 * len(text))
    for part_name, part in (("train", text[:idx]), ("val", text[idx:])):
        for max_length, stride in ((256, 256), (4, 1), (7, 3), (1, 5), (5000, 1)):
            book = GPTDatasetV1(part, enc, max_length, stride)
            ds = encode_dataset(L, tok, part, max_length, stride)
            n = L.lib.attn_text_dataset_len(ds)
            R.check(L.lib.attn_text_dataset_num_ids(ds) ==
                    len(enc.encode(part, allowed_special={"<|endoftext|>"})),
                    "%s: the token count" % part_name)
            R.check(n == len(book), "%s %d/%d: %d windows, the book's %d" %
                    (part_name, max_length, stride, n, len(book)))
            if n == len(book) and n > 0:
                inputs, targets = dataset_rows(L, ds, max_length)
                want_in = torch.stack(book.input_ids).numpy()
                want_tg = torch.stack(book.target_ids).numpy()
                R.check(np.array_equal(inputs, want_in) and np.array_equal(targets, want_tg),
                        "%s %d/%d: the windows" % (part_name, max_length, stride))
            L.lib.attn_text_dataset_free(ds)
    # the book's counts for its 124M config: 9 training batches of 2, 1 of 2
    # for validation (4608 and 512 tokens seen)
    book = GPTDatasetV1(text[:idx], enc, 256, 256)
    R.check(len(book) == 18, "the book's 18 training windows of 256 (%d)" % len(book))
    book = GPTDatasetV1(text[idx:], enc, 256, 256)
    R.check(len(book) == 2, "the book's 2 validation windows of 256 (%d)" % len(book))

    # random text: multi-byte characters, <|endoftext|> inside and at the ends
    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    pieces = ["hello", " world", "\u00e9t\u00e9", " \u4e2d\u6587", "<|endoftext|>", "\n\n",
              " 12345", "\U0001F600", "endoftext", "<|", "|>", " The", "."]
    for trial in range(20):
        s = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 300)))
        max_length, stride = rnd.randint(1, 12), rnd.randint(1, 6)
        book = GPTDatasetV1(s, enc, max_length, stride)
        ds = encode_dataset(L, tok, s, max_length, stride)
        n = L.lib.attn_text_dataset_len(ds)
        same = n == len(book)
        if same and n:
            inputs, targets = dataset_rows(L, ds, max_length)
            same = (np.array_equal(inputs, torch.stack(book.input_ids).numpy()) and
                    np.array_equal(targets, torch.stack(book.target_ids).numpy()))
        R.check(same, "random text %d (%d chars, %d/%d): windows as the book's" %
                (trial, len(s), max_length, stride))
        L.lib.attn_text_dataset_free(ds)
        raw = s.encode("utf-8")
        ratio = rnd.random()
        split = c_size_t()
        L.ok(L.lib.attn_text_split(L.ctx, raw, len(raw), ratio, byref(split)), "split")
        R.check(raw[:split.value].decode("utf-8") == s[:int(ratio * len(s))],
                "random text %d: split at %g" % (trial, ratio))


# ---- 2. random_() and randperm --------------------------------------------------


def test_draws(L):
    seeds = [0, 123, int.from_bytes(os.urandom(4), "little")]
    for seed in seeds:
        torch.manual_seed(seed)
        rng = L.rng(seed)
        for n in (1, 2, 3, 10, 57, 1000, 65535, 65536, 70000):
            want = torch.empty((), dtype=torch.int64).random_().item()
            got = c_int64()
            L.ok(L.lib.attn_rng_random_int64(rng, byref(got)), "random_int64")
            R.check(got.value == want, "seed %d: random_() %d == %d" % (seed, got.value, want))
            g = torch.Generator()
            g.manual_seed(want)
            perm = torch.randperm(n, generator=g).numpy()
            own = L.rng(want)
            out = np.zeros(n, np.int64)
            L.ok(L.lib.attn_rng_randperm(own, n, out.ctypes.data), "randperm")
            R.check(np.array_equal(out, perm), "seed %d: randperm(%d)" % (seed, n))
            L.lib.attn_rng_free(own)
        R.check(L.rand(rng, 3).tobytes() == torch.rand(3).numpy().tobytes(),
                "seed %d: the generator after the draws" % seed)
        L.lib.attn_rng_free(rng)


# ---- 3. the loader ------------------------------------------------------------------


class Indices(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def test_loader(L):
    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    cases = [(9, 2, True, True), (9, 2, False, False), (10, 5, True, False), (1, 1, True, True),
             (3, 4, True, True), (3, 4, True, False), (0, 2, False, False), (0, 3, False, True),
             (57, 8, True, True), (70000, 1024, True, False), (70000, 7, False, True)]
    for _ in range(6):
        cases.append((rnd.randint(1, 300), rnd.randint(1, 20), rnd.random() < 0.7,
                      rnd.random() < 0.5))
    for n, bs, shuffle, drop_last in cases:
        seed = rnd.randrange(2**31)
        torch.manual_seed(seed)
        loader = torch.utils.data.DataLoader(Indices(n), batch_size=bs, shuffle=shuffle,
                                             drop_last=drop_last, num_workers=0)
        rng = L.rng(seed)
        ours = c_void_p()
        L.ok(L.lib.attn_data_loader_new(L.ctx, n, bs, shuffle, drop_last, byref(ours)),
             "attn_data_loader_new")
        label = "n=%d batch=%d shuffle=%d drop_last=%d seed=%d" % (n, bs, shuffle, drop_last,
                                                                    seed)
        R.check(L.lib.attn_data_loader_len(ours) == len(loader),
                "%s: len %d == %d" % (label, L.lib.attn_data_loader_len(ours), len(loader)))
        same = True
        for epoch in range(3):
            between = rnd.randint(0, 5)
            same &= L.rand(rng, between).tobytes() == torch.rand(between).numpy().tobytes()
            # a pass left early, as calc_loss_loader's num_batches does
            stop = len(loader) if epoch != 1 else min(len(loader), 2)
            want = []
            for i, batch in enumerate(loader):
                if i >= stop:
                    break
                want.append(batch.tolist())
            L.ok(L.lib.attn_data_loader_begin(ours, rng), "attn_data_loader_begin")
            got = []
            idx = np.zeros(bs, np.uint64)
            count = c_size_t()
            for b in range(stop):
                L.ok(L.lib.attn_data_loader_batch(ours, b, idx.ctypes.data, byref(count)),
                     "attn_data_loader_batch")
                got.append([int(v) for v in idx[:count.value]])
            if got != want:
                print("  %s epoch %d: %s vs %s" % (label, epoch, got[:2], want[:2]))
            same &= got == want
        R.check(same, "%s: 3 passes of batches as DataLoader's" % label)
        R.check(L.rand(rng, 5).tobytes() == torch.rand(5).numpy().tobytes(),
                "%s: the generator after the passes" % label)
        L.lib.attn_data_loader_free(ours)
        L.lib.attn_rng_free(rng)


def test_book_loader(L, enc, tok):
    """create_dataloader_v1 of gpt_train.py's training part: the batches."""
    import tiktoken
    from llms_from_scratch import ch02
    with open(VERDICT, "r", encoding="utf-8") as f:
        text = f.read()
    train = text[:int(0.90 * len(text))]
    get_encoding = tiktoken.get_encoding
    tiktoken.get_encoding = lambda name: enc
    try:
        for seed, batch, length, shuffle, drop_last in ((123, 2, 256, True, True),
                                                        (7, 3, 64, True, False),
                                                        (5, 4, 32, False, False)):
            torch.manual_seed(seed)
            loader = ch02.create_dataloader_v1(train, batch_size=batch, max_length=length,
                                               stride=length, shuffle=shuffle,
                                               drop_last=drop_last, num_workers=0)
            rng = L.rng(seed)
            ds = encode_dataset(L, tok, train, length, length)
            ours = c_void_p()
            L.ok(L.lib.attn_data_loader_new(L.ctx, L.lib.attn_text_dataset_len(ds), batch,
                                            shuffle, drop_last, byref(ours)), "loader_new")
            same = L.lib.attn_data_loader_len(ours) == len(loader)
            for epoch in range(2):
                L.ok(L.lib.attn_data_loader_begin(ours, rng), "begin")
                for b, (x, y) in enumerate(loader):
                    inputs = np.zeros((batch, length), np.int32)
                    targets = np.zeros((batch, length), np.int32)
                    rows = c_size_t()
                    L.ok(L.lib.attn_text_dataset_batch(ds, ours, b, inputs.ctypes.data,
                                                       targets.ctypes.data, byref(rows)),
                         "attn_text_dataset_batch")
                    same &= (rows.value == x.shape[0] and
                             np.array_equal(inputs[:rows.value], x.numpy()) and
                             np.array_equal(targets[:rows.value], y.numpy()))
            R.check(same, "the book's loader (seed %d, batch %d, %d, shuffle %d): 2 epochs of "
                    "batches" % (seed, batch, length, shuffle))
            R.check(L.rand(rng, 2).tobytes() == torch.rand(2).numpy().tobytes(),
                    "the book's loader (seed %d): the generator after" % seed)
            L.lib.attn_data_loader_free(ours)
            L.lib.attn_text_dataset_free(ds)
            L.lib.attn_rng_free(rng)
    finally:
        tiktoken.get_encoding = get_encoding


def test_book_flow(L, enc, tok):
    """train_model_simple's data draws, with torch.rand standing for the
    model's dropout: each epoch iterates train_loader, and every eval_freq
    steps evaluate_model iterates train_loader again inside it (one batch,
    eval_iter) and val_loader; the batches and the generator after 3 epochs
    equal the book's."""
    import tiktoken
    from llms_from_scratch import ch02
    with open(VERDICT, "r", encoding="utf-8") as f:
        text = f.read()
    idx = int(0.90 * len(text))
    get_encoding = tiktoken.get_encoding
    tiktoken.get_encoding = lambda name: enc
    try:
        for seed, length, eval_freq, dropout_draws in ((123, 256, 5, 37), (11, 64, 3, 5)):
            torch.manual_seed(seed)
            rng = L.rng(seed)
            same = L.rand(rng, 11).tobytes() == torch.rand(11).numpy().tobytes()  # the init
            train_loader = ch02.create_dataloader_v1(text[:idx], batch_size=2, max_length=length,
                                                     stride=length, drop_last=True, shuffle=True,
                                                     num_workers=0)
            val_loader = ch02.create_dataloader_v1(text[idx:], batch_size=2, max_length=length,
                                                   stride=length, drop_last=False,
                                                   shuffle=False, num_workers=0)
            train = encode_dataset(L, tok, text[:idx], length, length)
            val = encode_dataset(L, tok, text[idx:], length, length)
            loaders = {}
            for name, ds, shuffle, drop_last in (("train", train, True, True),
                                                 ("train_eval", train, True, True),
                                                 ("val", val, False, False)):
                loaders[name] = c_void_p()
                L.ok(L.lib.attn_data_loader_new(L.ctx, L.lib.attn_text_dataset_len(ds), 2,
                                                shuffle, drop_last, byref(loaders[name])), name)
            x = np.zeros((2, length), np.int32)
            y = np.zeros((2, length), np.int32)
            rows = c_size_t()

            def batch(ds, loader, b, want):
                L.ok(L.lib.attn_text_dataset_batch(ds, loader, b, x.ctypes.data, y.ctypes.data,
                                                   byref(rows)), "batch")
                return (rows.value == want[0].shape[0] and
                        np.array_equal(x[:rows.value], want[0].numpy()) and
                        np.array_equal(y[:rows.value], want[1].numpy()))

            def calc_loss_loader(loader, ds, ours, num_batches):
                ok = True
                if len(loader) == 0:
                    return ok
                L.ok(L.lib.attn_data_loader_begin(ours, rng), "begin")
                for i, pair in enumerate(loader):
                    if i >= min(num_batches, len(loader)):
                        break
                    ok &= batch(ds, ours, i, pair)
                return ok

            step = -1
            for epoch in range(3):
                L.ok(L.lib.attn_data_loader_begin(loaders["train"], rng), "begin")
                for b, pair in enumerate(train_loader):
                    same &= batch(train, loaders["train"], b, pair)
                    same &= (L.rand(rng, dropout_draws).tobytes() ==
                             torch.rand(dropout_draws).numpy().tobytes())
                    step += 1
                    if step % eval_freq == 0:
                        same &= calc_loss_loader(train_loader, train, loaders["train_eval"], 1)
                        same &= calc_loss_loader(val_loader, val, loaders["val"], 1)
            R.check(same, "the book's training flow (seed %d, %d tokens, eval every %d): "
                    "batches of 3 epochs and evaluations" % (seed, length, eval_freq))
            R.check(L.rand(rng, 4).tobytes() == torch.rand(4).numpy().tobytes(),
                    "the book's training flow (seed %d): the generator after" % seed)
            for loader in loaders.values():
                L.lib.attn_data_loader_free(loader)
            L.lib.attn_text_dataset_free(train)
            L.lib.attn_text_dataset_free(val)
            L.lib.attn_rng_free(rng)
    finally:
        tiktoken.get_encoding = get_encoding


# ---- 4. multinomial and the book's generate -------------------------------------


class Rows(torch.nn.Module):
    """A model whose logits at the last position are the next given row."""

    def __init__(self, rows):
        super().__init__()
        self.rows = rows
        self.calls = 0

    def forward(self, idx):
        row = self.rows[self.calls]
        self.calls += 1
        out = torch.zeros(idx.shape[0], idx.shape[1], row.shape[0])
        out[:, -1, :] = row
        return out


def book_ch05():
    """llms_from_scratch.ch05, whose plotting imports (matplotlib, tqdm) the
    venv may lack and these tests never call: stand-ins where missing."""
    for name in ("matplotlib", "matplotlib.pyplot", "matplotlib.ticker", "tqdm"):
        try:
            __import__(name)
        except ImportError:
            stub = types.ModuleType(name)
            stub.MaxNLocator = stub.tqdm = None
            sys.modules[name] = stub
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, stub)
    from llms_from_scratch import ch05
    return ch05


def test_multinomial(L):
    generate = book_ch05().generate
    rnd = np.random.RandomState(int.from_bytes(os.urandom(4), "little"))
    mismatches = total = 0
    for trial in range(60):
        seed = int(rnd.randint(2**31))
        v = int(rnd.choice([2, 3, 17, 100, 1000, 50257]))
        logits = torch.from_numpy((rnd.randn(v) * rnd.uniform(0.5, 6)).astype(np.float32))
        if trial % 3 == 1:
            logits[torch.from_numpy(rnd.rand(v) < 0.4)] = float("-inf")
            logits[int(rnd.randint(v))] = 1.0
        probs = torch.softmax(logits, -1)
        if trial % 3 == 2:
            probs[torch.from_numpy(rnd.rand(v) < 0.5)] = 0.0
            probs[int(rnd.randint(v))] += 0.25
        torch.manual_seed(seed)
        rng = L.rng(seed)
        p = np.ascontiguousarray(probs.numpy())
        for draw in range(5):
            want = torch.multinomial(probs, 1).item()
            got = c_int64()
            L.ok(L.lib.attn_rng_multinomial(rng, p.ctypes.data, v, byref(got)), "multinomial")
            total += 1
            mismatches += got.value != want
        R.check(L.rand(rng, 2).tobytes() == torch.rand(2).numpy().tobytes(),
                "multinomial v=%d seed %d: the generator after 5 draws" % (v, seed))
        L.lib.attn_rng_free(rng)
    R.check(mismatches == 0, "multinomial: %d of %d draws differ" % (mismatches, total))

    # the book's generate, token for token: top_k, temperature, -inf logits
    same_tokens = steps = 0
    for trial in range(24):
        seed = int(rnd.randint(2**31))
        v = int(rnd.choice([5, 50, 1000, 50257]))
        n = 8
        rows = torch.from_numpy((rnd.randn(n, v) * rnd.uniform(0.5, 4)).astype(np.float32))
        if trial % 2:
            rows[torch.from_numpy(rnd.rand(n, v) < 0.3)] = float("-inf")
            rows[:, 0] = 2.0
        temperature = float(rnd.choice([0.0, 0.5, 1.0, 1.4]))
        top_k = [None, 1, 3, 25][trial % 4]
        if top_k is not None and top_k > v:
            top_k = v
        torch.manual_seed(seed)
        out = generate(Rows(rows), torch.zeros(1, 1, dtype=torch.long), max_new_tokens=n,
                       context_size=4, temperature=temperature, top_k=top_k)
        want = out[0, 1:].tolist()
        rng = L.rng(seed)
        got = []
        for i in range(len(want)):
            row = np.ascontiguousarray(rows[i].numpy())
            tok = c_int32()
            L.ok(L.lib.attn_sample_book(L.ctx, row.ctypes.data, v, temperature, top_k or 0, rng,
                                        byref(tok)), "attn_sample_book")
            got.append(tok.value)
        steps += len(want)
        same_tokens += sum(a == b for a, b in zip(got, want))
        R.check(got == want, "generate v=%d T=%g top_k=%s seed %d: %s == %s" %
                (v, temperature, top_k, seed, got, want))
        R.check(L.rand(rng, 2).tobytes() == torch.rand(2).numpy().tobytes(),
                "generate v=%d T=%g top_k=%s: the generator after" % (v, temperature, top_k))
        L.lib.attn_rng_free(rng)
    print("generate: %d of %d tokens as the book's" % (same_tokens, steps))


# ---- 5. refusals: a status and a message naming the values, nothing drawn ----

ERR_NULL, ERR_INVALID, ERR_SHAPE = 1, 2, 3


def test_errors(L):
    def refused(status, want, words, what):
        msg = (L.lib.attn_ctx_last_error(L.ctx) or b"").decode()
        R.check(status == want and all(w in msg for w in words),
                "%s: status %d (want %d), message %r names %s" % (what, status, want, msg, words))

    out = c_void_p()
    refused(L.lib.attn_data_loader_new(L.ctx, 0, 2, True, False, byref(out)), ERR_INVALID,
            ["shuffle", "empty"], "shuffle over 0 items")
    refused(L.lib.attn_data_loader_new(L.ctx, 5, 0, False, False, byref(out)), ERR_INVALID,
            ["batch_size is 0"], "batch_size 0")
    ids = np.arange(10, dtype=np.int32)
    refused(L.lib.attn_text_dataset_new(L.ctx, ids.ctypes.data, 10, 4, 0, byref(out)),
            ERR_INVALID, ["stride is 0"], "stride 0")
    refused(L.lib.attn_text_dataset_new(L.ctx, ids.ctypes.data, 10, 0, 1, byref(out)),
            ERR_INVALID, ["max_length is 0"], "max_length 0")
    split = c_size_t()
    refused(L.lib.attn_text_split(L.ctx, b"abc", 3, 1.5, byref(split)), ERR_INVALID,
            ["train_ratio 1.5"], "train_ratio 1.5")
    # text Python would not read (open(..., encoding="utf-8") raises on it),
    # whose characters Python therefore never counts: refused at its byte
    for bad, at in ((b"ab\xffcd", 2), (b"\xc3\xa9\xed\xa0\x80", 2), (b"abc\xe2\x82", 3)):
        try:
            bad.decode("utf-8")
            R.check(False, "%r is not UTF-8 to Python" % bad)
        except UnicodeDecodeError as e:
            R.check(e.start == at, "Python's decoder stops %r at byte %d" % (bad, at))
        refused(L.lib.attn_text_split(L.ctx, bad, len(bad), 0.5, byref(split)), ERR_INVALID,
                ["not UTF-8", "byte %d (0x%02x)" % (at, bad[at])], "split of %r" % bad)

    ds, loader, other = c_void_p(), c_void_p(), c_void_p()
    L.ok(L.lib.attn_text_dataset_new(L.ctx, ids.ctypes.data, 10, 3, 2, byref(ds)), "new")
    R.check(L.lib.attn_text_dataset_len(ds) == 4, "10 ids, 3/2: 4 windows")
    L.ok(L.lib.attn_data_loader_new(L.ctx, 4, 3, True, False, byref(loader)), "loader")
    L.ok(L.lib.attn_data_loader_new(L.ctx, 5, 3, False, False, byref(other)), "loader")
    idx = np.zeros(3, np.uint64)
    count = c_size_t()
    refused(L.lib.attn_data_loader_batch(loader, 0, idx.ctypes.data, byref(count)), ERR_INVALID,
            ["no pass begun"], "a batch before begin")
    rng = L.rng(3)
    L.ok(L.lib.attn_data_loader_begin(loader, rng), "begin")
    refused(L.lib.attn_data_loader_batch(loader, 2, idx.ctypes.data, byref(count)), ERR_INVALID,
            ["batch 2", "2"], "batch 2 of 2")
    L.ok(L.lib.attn_data_loader_begin(other, rng), "begin")
    x = np.zeros((3, 3), np.int32)
    rows = c_size_t()
    refused(L.lib.attn_text_dataset_batch(ds, other, 0, x.ctypes.data, x.ctypes.data,
                                          byref(rows)), ERR_SHAPE, ["5 items", "4 windows"],
            "a loader of another size")
    refused(L.lib.attn_text_dataset_get(ds, 4, x.ctypes.data, x.ctypes.data), ERR_INVALID,
            ["index 4", "4 windows"], "window 4 of 4")
    L.lib.attn_data_loader_free(loader)
    L.lib.attn_data_loader_free(other)
    L.lib.attn_text_dataset_free(ds)
    L.lib.attn_rng_free(rng)

    # refused weights draw nothing: the generator stays with PyTorch's
    torch.manual_seed(9)
    rng = L.rng(9)
    got = c_int64()
    for probs, words in (([0.5, float("nan")], ["probs[1] = nan"]),
                         ([0.5, -0.25], ["probs[1] = -0.25"]),
                         ([0.5, float("inf")], ["probs[1] = inf"]),
                         ([0.0, 0.0], ["sum to 0"])):
        p = np.array(probs, np.float32)
        refused(L.lib.attn_rng_multinomial(rng, p.ctypes.data, 2, byref(got)), ERR_INVALID,
                words, "multinomial of %s" % probs)
    logits = np.array([1.0, float("inf"), 0.0], np.float32)
    tok = c_int32()
    refused(L.lib.attn_sample_book(L.ctx, logits.ctypes.data, 3, 1.0, 0, rng, byref(tok)),
            ERR_INVALID, ["is inf"], "sample_book with an inf logit")
    R.check(L.rand(rng, 2).tobytes() == torch.rand(2).numpy().tobytes(),
            "refusals drew nothing")
    # 3e38 / 0.5 overflows float32: PyTorch's softmax of the quotients is NaN
    # and torch.multinomial raises; attn draws from the softmax in double,
    # which puts all of the weight on the largest logit
    logits = np.array([3e38, 1.0, 0.0], np.float32)
    tok.value = -1
    st = L.lib.attn_sample_book(L.ctx, logits.ctypes.data, 3, 0.5, 0, rng, byref(tok))
    R.check(st == 0 and tok.value == 0,
            f"sample_book: 3e38 / 0.5 draws the largest logit (status {st}, token {tok.value})")
    L.lib.attn_rng_free(rng)


def main():
    L = Lib(sys.argv[1])
    test_errors(L)
    test_draws(L)
    test_loader(L)
    test_multinomial(L)
    enc = gpt2_tiktoken()
    tok = c_void_p()
    L.ok(L.lib.attn_tokenizer_load(L.ctx, BPE.encode(), byref(tok)), "tokenizer")
    test_windows(L, enc, tok)
    test_book_loader(L, enc, tok)
    test_book_flow(L, enc, tok)
    L.lib.attn_tokenizer_free(tok)
    L.lib.attn_ctx_free(L.ctx)
    print("%d passed, %d failed" % (R.passed, R.failed))
    sys.exit(1 if R.failed else 0)


if __name__ == "__main__":
    main()
