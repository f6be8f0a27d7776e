"""Byte-level BPE tokenizers from local files (attn_tokenizer_* in attn.h).

    tok = attn.tokenizer.Tokenizer("gpt2/")           # encoder.json + vocab.bpe,
                                                      # or vocab.json + merges.txt
    tok = attn.tokenizer.Tokenizer("tokenizer.model") # tiktoken's file (Llama 3)
    ids = tok.encode("Hello, world")                  # list of int
    tok.decode(ids)                                   # "Hello, world"

Encoding treats special-token names in the text as plain text (tiktoken's
encode(disallowed_special=())); special tokens come only by id.
"""
import ctypes
from ctypes import POINTER, c_char_p, c_int, c_int32, c_size_t, c_void_p

from ._args import as_ids, as_utf8
from ._lib import AttnError, Context, HandleOwner, encode_path, lib, status_name

_SIGNATURES = {
    "attn_tokenizer_load": (c_int, c_void_p, c_char_p, POINTER(c_void_p)),
    "attn_tokenizer_free": (None, c_void_p),
    "attn_tokenizer_vocab_size": (c_size_t, c_void_p),
    "attn_tokenizer_encode": (c_int, c_void_p, c_char_p, c_size_t, POINTER(c_int32), c_size_t,
                              POINTER(c_size_t)),
    "attn_tokenizer_decode": (c_int, c_void_p, POINTER(c_int32), c_size_t, c_char_p, c_size_t,
                              POINTER(c_size_t)),
}
for _name, (_restype, *_argtypes) in _SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _restype
    _fn.argtypes = _argtypes

_SHAPE = 3  # ATTN_ERR_SHAPE: the output did not fit; the count says how much to give


class Tokenizer(HandleOwner):
    """A tokenizer loaded from path: a directory holding GPT-2's files
    (encoder.json + vocab.bpe or vocab.json + merges.txt, or tokenizer.model),
    one of those files, or a tiktoken file.

    Threads: one tokenizer encodes or decodes one text at a time; calls from
    several threads on the same tokenizer wait for each other (a lock)."""

    def __init__(self, path):
        path = encode_path("Tokenizer: path", path)
        self._ctx = Context()
        self._lock = self._ctx.lock
        handle = c_void_p()
        self._ctx.check(lib.attn_tokenizer_load(self._ctx.handle, path,
                                                ctypes.byref(handle)), "attn_tokenizer_load")
        self._handle = handle

    @property
    def vocab_size(self):
        return int(lib.attn_tokenizer_vocab_size(self._handle))

    def encode_bytes(self, data):
        """The ids of bytes (which need not be valid UTF-8)."""
        if isinstance(data, str):
            raise TypeError("encode_bytes: expected bytes (a bytes-like object), got str; "
                            "encode(text) takes a str")
        if isinstance(data, (list, tuple)):  # byte values, 0 .. 255 (bytes() checks)
            data = bytes(data)
        else:
            # a buffer of bytes: bytes(5) would be five NULs, and an int32
            # array's buffer its values' bytes, not its values
            try:
                view = memoryview(data)
            except TypeError:
                raise TypeError(f"encode_bytes: expected bytes (a bytes-like object), got "
                                f"{type(data).__name__}") from None
            if view.itemsize != 1:
                raise TypeError(f"encode_bytes: expected bytes, got a buffer of "
                                f"{view.itemsize}-byte items (format '{view.format}')")
            data = view.tobytes()
        count = c_size_t()
        capacity = len(data) + 1  # a token holds at least one byte
        ids = (c_int32 * capacity)()
        with self._lock:
            status = lib.attn_tokenizer_encode(self._handle, data, len(data), ids, capacity,
                                               ctypes.byref(count))
            self._ctx.check(status, "attn_tokenizer_encode")
        return list(ids[:count.value])

    def encode(self, text):
        """The ids of text (a str, encoded as UTF-8; bytes go to encode_bytes)."""
        if isinstance(text, (bytes, bytearray, memoryview)):
            raise TypeError(f"encode: expected a str, got {type(text).__name__}; "
                            "encode_bytes(data) takes bytes")
        return self.encode_bytes(as_utf8("encode: text", text))

    def decode_bytes(self, ids):
        """The bytes of ids: integers (TypeError for floats, ValueError past
        int32 or below 0, AttnError past the vocabulary)."""
        if hasattr(ids, "__iter__") and not hasattr(ids, "__len__"):
            ids = list(ids)  # a generator
        ids = as_ids("ids", ids)
        array = ids.ctypes.data_as(POINTER(c_int32))
        length = c_size_t()
        capacity = 16 * len(ids) + 1
        with self._lock:
            for _ in range(2):
                buf = ctypes.create_string_buffer(capacity)
                status = lib.attn_tokenizer_decode(self._handle, array, len(ids), buf, capacity,
                                                   ctypes.byref(length))
                if status == _SHAPE and length.value > capacity:
                    capacity = length.value
                    continue
                self._ctx.check(status, "attn_tokenizer_decode")
                return buf.raw[:length.value]
        raise AttnError(status_name(_SHAPE), "attn_tokenizer_decode: the length changed")

    def decode(self, ids, errors="replace"):
        """The text of ids; bytes that are not UTF-8 become U+FFFD (errors='replace',
        as tiktoken's and GPT2Tokenizer's decode)."""
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def __del__(self):
        if getattr(self, "_handle", None):
            lib.attn_tokenizer_free(self._handle)
            self._handle = None
