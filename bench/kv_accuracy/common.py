"""What train_verdict.py and kv_accuracy.py share: the paths, the small
chapter-5 GPT's cfg, the text and its GPT-2 token ids, and `import attn`
from this checkout (ATTN_LIBRARY names the built libattn.so; unset, the
build/ of the checkout)."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BOOK = os.environ.get("LLMS_FROM_SCRATCH", "/work/shared/reference/llms-from-scratch")
TEXT = os.path.join(BOOK, "data", "the-verdict.txt")
BPE = os.path.join(BOOK, "data", "gpt2-bpe")
OUT_DIR = os.path.join(ROOT, "build", "kv_accuracy")
WEIGHTS = os.path.join(OUT_DIR, "verdict-gpt.safetensors")
CONFIG = os.path.join(OUT_DIR, "verdict-gpt.json")
MLA_WEIGHTS = os.path.join(OUT_DIR, "verdict-gpt-mla.safetensors")
MLA_CONFIG = os.path.join(OUT_DIR, "verdict-gpt-mla.json")

# The book's GPT_CONFIG_124M with the width, depth and heads cut so that it
# trains in minutes on two cores; the vocabulary and context are the book's
# chapter-5 ones.
CFG = {
    "vocab_size": 50257,
    "context_length": 256,
    "emb_dim": 256,
    "n_heads": 4,
    "n_layers": 4,
    "drop_rate": 0.1,
    "qkv_bias": False,
}
# The same model with chapter 4's latent attention (gpt_with_kv_mla.py's
# GPTModel), its latent the module's default width, max(16, emb_dim // 8).
MLA_CFG = dict(CFG, latent_dim=32)
# The book's split: the first 90% of the characters train, the rest validate.
TRAIN_RATIO = 0.90


def import_attn():
    if "ATTN_LIBRARY" not in os.environ:
        os.environ["ATTN_LIBRARY"] = os.path.join(ROOT, "build", "libattn.so")
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import attn
    return attn


def text_splits():
    """(train text, validation text) of the-verdict, split as the book splits it."""
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    cut = int(TRAIN_RATIO * len(text))
    return text[:cut], text[cut:]


def tokenizer():
    """GPT-2's BPE from the book's encoder.json + vocab.bpe, by attn's
    tokenizer (which gives tiktoken's "gpt2" ids:
    tests/conformance/test_tokenizer_vs_tiktoken.py)."""
    import_attn()
    from attn.tokenizer import Tokenizer
    return Tokenizer(BPE)


def write_config(path, cfg=None):
    with open(path, "w") as f:
        json.dump(CFG if cfg is None else cfg, f, indent=1)
