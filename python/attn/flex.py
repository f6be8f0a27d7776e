"""PyTorch's FlexAttention API on attn's CPU kernels (re-exported by attn.torch).

    from attn.torch import flex_attention, create_block_mask
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    mask = create_block_mask(causal, None, None, T, T)          # a BlockMask
    def softcap(score, b, h, q_idx, kv_idx):
        return 30.0 * torch.tanh(score / 30.0)
    out = flex_attention(q, k, v, score_mod=softcap, block_mask=mask)

attn has no Python in its kernels: a mask_mod and a score_mod are traced
once with torch.fx and recognised as attn's primitives (include/attn.h,
"Programmable attention"):
  masks       causal (q_idx + c >= kv_idx and the like), sliding windows
              (q_idx - kv_idx <= W, abs(q_idx - kv_idx) <= W), chunks
              (q_idx // C == kv_idx // C), prefix-LM (kv_idx < prefix[b]
              or'ed with causal), documents (doc[q_idx] == doc[kv_idx],
              doc[b, q_idx] too), key padding (kv_idx < lengths[b]), global
              tokens (q_idx < G | kv_idx < G), and &, |, ~ of them;
  score_mods  score * c, score / c, c * tanh(score / c), score + bias[...]
              (a captured tensor indexed by any of b, h, q_idx, kv_idx),
              ALiBi (score + slope[h] * (kv_idx - q_idx), score - slope[h] *
              abs(q_idx - kv_idx)), relative tables (score + table[h, q_idx -
              kv_idx + c], or kv_idx - q_idx + c; a negative index from the
              row's end, as PyTorch's indexing reads it), T5's relative bias
              (score + table[h, t5_relative_bucket(kv_idx - q_idx, ...)]), and
              chains; before them score * t[h] or score / t[h] (a factor
              per head, run on the query), and after them, as the last
              operation, torch.where(mask, score, -inf) (a mask joined with
              the block_mask).
A mask_mod the tracer does not recognise is evaluated once, in torch, over
the (B, H, Q_LEN, KV_LEN) index grid, and handed to attn as a dense boolean
mask; a score_mod it does not recognise raises ValueError naming the
operation. Gradients reach q, k, v and the tensors a score_mod captured
(a bias, a relative or T5 table) when they require grad; ALiBi slopes get
none.
"""
import ctypes
import functools
import inspect
import math
import numbers
import operator
import weakref
from collections.abc import Mapping
from typing import NamedTuple, Optional
from ctypes import POINTER, c_size_t, c_void_p

import torch
import torch.fx as fx

from . import _lib
from ._lib import (SCORE_ALIBI, SCORE_BIAS, SCORE_REL_BIAS, SCORE_REL_TABLE, SCORE_SCALE,
                   SCORE_SOFTCAP,
                   AttnError, BlockMaskConfig, BlockMaskInfo, HandleOwner, ScoreMod, lib)

__all__ = ["flex_attention", "create_block_mask", "BlockMask", "and_masks", "or_masks",
           "noop_mask", "t5_relative_bucket"]

_INT64_LIMIT = 2 ** 62


try:  # PyTorch's own, where it has them (2.9 and later), so that either is taken
    from torch.nn.attention.flex_attention import AuxOutput, AuxRequest
except ImportError:
    class AuxRequest(NamedTuple):
        """Which auxiliary outputs flex_attention returns (PyTorch's)."""
        lse: bool = False
        max_scores: bool = False

    class AuxOutput(NamedTuple):
        """flex_attention's auxiliary outputs: None where not asked for."""
        lse: Optional[torch.Tensor] = None
        max_scores: Optional[torch.Tensor] = None


def _attn_torch():
    # attn.torch imports this module at its end; its helpers are read at call time
    from . import torch as attn_torch
    return attn_torch


# ---- mask_mod helpers, as torch.nn.attention.flex_attention's ----------------------


def noop_mask(b, h, q_idx, kv_idx):
    """Every key visible."""
    return b.new_ones((), dtype=torch.bool)


def and_masks(*mask_mods):
    """A mask_mod visible where every one of mask_mods is (none: every key)."""
    if not all(callable(m) for m in mask_mods):
        raise TypeError("and_masks: every argument must be a mask_mod (a callable)")

    def and_mask(b, h, q_idx, kv_idx):
        result = None
        for m in mask_mods:
            r = m(b, h, q_idx, kv_idx)
            result = r if result is None else result & r
        return noop_mask(b, h, q_idx, kv_idx) if result is None else result
    return and_mask


def or_masks(*mask_mods):
    """A mask_mod visible where any one of mask_mods is (none: no key)."""
    if not all(callable(m) for m in mask_mods):
        raise TypeError("or_masks: every argument must be a mask_mod (a callable)")

    def or_mask(b, h, q_idx, kv_idx):
        result = None
        for m in mask_mods:
            r = m(b, h, q_idx, kv_idx)
            result = r if result is None else result | r
        return b.new_zeros((), dtype=torch.bool) if result is None else result
    return or_mask


class _ArgumentValueError(ValueError):
    """A bad argument of a helper a score_mod calls: raised as it is through
    tracing, as the call would raise it eagerly."""


class _ArgumentTypeError(TypeError):
    """As _ArgumentValueError, for an argument of the wrong type."""


def t5_relative_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
    """T5's bucket of relative_position = kv_idx - q_idx (HF transformers'
    _relative_position_bucket): exact buckets for small distances, then
    logarithmic ones up to max_distance; bidirectional halves the buckets
    between the two signs. In a score_mod, table[h, t5_relative_bucket(
    kv_idx - q_idx, ...)] runs as attn's ATTN_SCORE_REL_BIAS."""
    # checked before tracing too: attn's kernels read the table at the
    # buckets these give
    for name, value in (("num_buckets", num_buckets), ("max_distance", max_distance)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise _ArgumentTypeError(f"t5_relative_bucket: {name} {value!r} must be an int")
    num_buckets, max_distance = int(num_buckets), int(max_distance)
    half = num_buckets // 2 if bidirectional else num_buckets
    if half < 2 or num_buckets >= 2 ** 31 or max_distance <= half // 2:
        raise _ArgumentValueError(
            f"t5_relative_bucket: num_buckets {num_buckets} and max_distance {max_distance}: "
            f"T5's logarithmic buckets need num_buckets in {4 if bidirectional else 2} .. "
            f"2^31 - 1 and max_distance past the {max(half // 2, 0)} exact ones")
    if isinstance(relative_position, fx.Proxy):
        # traced: one node the score_mod tracer recognises
        return relative_position.tracer.create_proxy(
            "call_function", t5_relative_bucket, (relative_position,),
            {"bidirectional": bool(bidirectional), "num_buckets": num_buckets,
             "max_distance": max_distance})
    rel = torch.as_tensor(relative_position)
    buckets = torch.zeros_like(rel, dtype=torch.long)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (rel > 0).long() * num_buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    max_exact = num_buckets // 2
    is_small = rel < max_exact
    large = max_exact + (torch.log(rel.double().clamp(min=1) / max_exact)
                         / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.clamp(large, max=num_buckets - 1)
    return buckets + torch.where(is_small, rel.long(), large)


# ---- tracing: mask_mods and score_mods as attn's primitives ----------------------------


class _NotRecognised(Exception):
    """The traced function uses something attn has no primitive for (its
    message names the fx node)."""


class _Proxy(fx.Proxy):
    # torch 1.13's Proxy has no __abs__: builtin abs() on an index recorded as torch.abs
    def __abs__(self):
        return self.tracer.create_proxy("call_function", torch.abs, (self,), {})


class _Tracer(fx.Tracer):
    """symbolic tracing of a plain function whose captured tensors (closure
    variables, globals, Parameters) become get_attr nodes naming the very
    tensor objects, so gradients reach them."""

    def __init__(self):
        super().__init__()
        self.captured = {}
        self._names = {}

    def proxy(self, node):
        return _Proxy(node, self)

    def create_arg(self, a):
        if isinstance(a, torch.Tensor):
            name = self._names.get(id(a))
            if name is None:
                name = self._names[id(a)] = f"_captured{len(self.captured)}"
                self.captured[name] = a
            return self.create_node("get_attr", name, (), {})
        return super().create_arg(a)


def _trace(fn, names):
    """fn's graph and the tensors it captured, fn called with proxies named names."""
    tracer = _Tracer()
    code = "def traced({0}):\n    return fn({0})\n".format(", ".join(names))
    scope = {"fn": fn}
    exec(code, scope)  # a fixed signature: fx needs named positional arguments
    graph = tracer.trace(scope["traced"])
    return graph, tracer.captured


def _what(x):
    """A traced value in a message, in the user's terms."""
    if isinstance(x, _Mask):
        return "a mask"
    return {_Lin: "an index expression", _Tens: "a captured tensor's elements",
            _FloorDiv: "a floor division of indices", _Abs: "an absolute value of indices",
            _Bucket: "T5 buckets", _RelIndex: "a distance index", _Score: "the score",
            _Tanh: "a tanh of the score", _Term: "a score term",
            _MaskedScore: "where(mask, score, -inf)'s result",
            _Opaque: "an expression the tracer does not take apart"}.get(
                type(x), type(x).__name__)


def _node_name(node):
    t = node.target
    return getattr(t, "__name__", None) or str(t)


class _Lin:
    """sum(coef[x] * x) + const over the indices x in b, h, q, kv (integers)."""
    __slots__ = ("coef", "const")

    def __init__(self, coef, const=0):
        self.coef = {k: v for k, v in coef.items() if v}
        self.const = const
        for v in (const, *self.coef.values()):
            _check_int64(v)

    @staticmethod
    def of(x):
        return x if isinstance(x, _Lin) else _Lin({}, x)

    def __add__(self, other):
        o = _Lin.of(other)
        coef = dict(self.coef)
        for k, v in o.coef.items():
            coef[k] = coef.get(k, 0) + v
        return _Lin(coef, self.const + o.const)

    def scaled(self, c):
        return _Lin({k: v * c for k, v in self.coef.items()}, self.const * c)

    def index(self):
        """The index name when this is one bare index, else None."""
        if self.const == 0 and len(self.coef) == 1:
            (k, v), = self.coef.items()
            if v == 1:
                return k
        return None


class _Tens:
    """A captured tensor, indexed so far by dims (index names, or a _Bucket)."""
    __slots__ = ("t", "dims")

    def __init__(self, t, dims=()):
        self.t, self.dims = t, tuple(dims)

    def full(self):
        return len(self.dims) == self.t.dim()


class _FloorDiv:
    __slots__ = ("lin", "by")

    def __init__(self, lin, by):
        self.lin, self.by = lin, by


class _Abs:
    __slots__ = ("lin",)

    def __init__(self, lin):
        self.lin = lin


class _Bucket:
    __slots__ = ("lin", "bidirectional", "buckets", "max_distance")

    def __init__(self, lin, bidirectional, buckets, max_distance):
        self.lin, self.bidirectional = lin, bidirectional
        self.buckets, self.max_distance = buckets, max_distance


class _RelIndex:
    """A captured table's index q_idx - kv_idx + c or kv_idx - q_idx + c
    (a relative-position table read directly: ATTN_SCORE_REL_TABLE)."""
    __slots__ = ("lin",)

    def __init__(self, lin):
        self.lin = lin

    def signed(self):
        """True for kv_idx - q_idx + c, False for q_idx - kv_idx + c."""
        return self.lin.coef["kv"] == 1


def _check_int64(v):
    """Index arithmetic is int64's, in PyTorch as in attn's descriptions: a
    constant past it (which PyTorch refuses, "Overflow when unpacking long")
    is not recognised, where ctypes would wrap it silently."""
    if isinstance(v, int) and not -2 ** 63 <= v < 2 ** 63:
        raise _NotRecognised(f"the integer {v}, past int64")


def _as_int(x, node):
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        if isinstance(x, _Tens) and x.t.dim() == 0 and not x.t.dtype.is_floating_point:
            return int(x.t)
        raise _NotRecognised(f"{_node_name(node)} of a non-integer")
    if isinstance(x, float):
        if not x.is_integer():
            raise _NotRecognised(f"{_node_name(node)} with the non-integer {x}")
        x = int(x)
    _check_int64(x)
    return x


# ---- masks as data ---------------------------------------------------------------------


class _Grid:
    """The index grid a mask is evaluated on: b (B,1,1,1), h (1,H,1,1),
    q (1,1,T,1), kv (1,1,1,S) int64 aranges, each made when first read, so
    that a closed-form mask of sizes past memory meets the library's
    size check, not an arange's allocation."""

    def __init__(self, B, H, T, S):
        self.B, self.H, self.T, self.S = B, H, T, S

    @functools.cached_property
    def b(self):
        return torch.arange(self.B).view(self.B, 1, 1, 1)

    @functools.cached_property
    def h(self):
        return torch.arange(self.H).view(1, self.H, 1, 1)

    @functools.cached_property
    def q(self):
        return torch.arange(self.T).view(1, 1, self.T, 1)

    @functools.cached_property
    def kv(self):
        return torch.arange(self.S).view(1, 1, 1, self.S)


def _mask_handle(ctx, fn, *args):
    """An attn_mask made by fn(ctx, *args, &out)."""
    out = c_void_p()
    ctx.check(fn(ctx.handle, *args, ctypes.byref(out)), fn.__name__)
    return out


class _Mask:
    """A mask description: evaluate() in torch, lower() to an attn_mask."""

    def evaluate(self, g):
        raise NotImplementedError

    def lower(self, ctx, g):
        raise NotImplementedError


class _All(_Mask):
    def __repr__(self):
        return "all"

    def evaluate(self, g):
        return torch.ones((), dtype=torch.bool)

    def lower(self, ctx, g):
        return _mask_handle(ctx, lib.attn_mask_new_all)


def _nothing():
    return _Not(_All())


class _Band(_Mask):
    """q_idx + lo <= kv_idx <= q_idx + hi (None: unbounded on that side)."""

    def __init__(self, lo, hi):
        self.lo, self.hi = lo, hi

    def __repr__(self):
        return f"band({self.lo}, {self.hi})"

    def evaluate(self, g):
        d = g.kv - g.q
        keep = torch.ones((), dtype=torch.bool)
        if self.lo is not None:
            keep = keep & (d >= self.lo)
        if self.hi is not None:
            keep = keep & (d <= self.hi)
        return keep

    def lower(self, ctx, g):
        lo, hi = self.lo, self.hi
        # kv_idx - q_idx lies in [1 - T, S - 1]: a bound past it (sys.maxsize
        # for no window) bounds nothing, and the library's take +-2^62 only
        if lo is not None and lo <= 1 - g.T:
            lo = None
        if hi is not None and hi >= g.S - 1:
            hi = None
        if (lo is not None and lo > g.S - 1) or (hi is not None and hi < 1 - g.T):
            return _nothing().lower(ctx, g)
        if lo is not None and hi is not None and lo > hi:
            return _nothing().lower(ctx, g)
        if lo is None and hi is None:
            return _All().lower(ctx, g)
        if lo is None:
            return _mask_handle(ctx, lib.attn_mask_new_causal, hi)
        if hi is None:  # kv_idx >= q_idx + lo: a window open to the right
            return _mask_handle(ctx, lib.attn_mask_new_window, 0, -1, lo)
        return _mask_handle(ctx, lib.attn_mask_new_window, hi - lo, 0, hi)


class _Chunk(_Mask):
    """(q_idx + offset) // chunk == kv_idx // chunk."""

    def __init__(self, chunk, offset):
        self.chunk, self.offset = chunk, offset

    def __repr__(self):
        return f"chunked({self.chunk}, {self.offset})"

    def evaluate(self, g):
        return torch.div(g.q + self.offset, self.chunk, rounding_mode="floor") == \
            torch.div(g.kv, self.chunk, rounding_mode="floor")

    def lower(self, ctx, g):
        if self.chunk > 2 ** 62:
            # past the library's chunks (sys.maxsize for no chunks): chunk 0
            # holds every key, and a row sees them where 0 <= q_idx + offset < chunk
            first = _And(_Not(_QLess(-self.offset)), _QLess(self.chunk - self.offset))
            return first.lower(ctx, g)
        return _mask_handle(ctx, lib.attn_mask_new_chunked, self.chunk, self.offset)


def _on_cpu(t, what):
    """t, refused where it is not on the CPU (attn's maps are built there)."""
    if t.device.type != "cpu":
        raise ValueError(f"create_block_mask: attn runs on the CPU; {what} of shape "
                         f"{tuple(t.shape)} is on {t.device}")
    return t


def _per_batch(values, g, what):
    """values (an int, or an int tensor indexed by b: at least B values) as a
    contiguous int64 tensor of 1 or B values."""
    t = _on_cpu(torch.as_tensor(values).detach(), what)
    indexed = t.dim() > 0
    t = t.reshape(-1).to(torch.int64)
    if t.numel() > g.B:  # a map for fewer sequences (B=None: the first) reads the first
        t = t[:g.B]
    if indexed and t.numel() < g.B:  # PyTorch's values[b] would raise for b past them
        raise IndexError(f"create_block_mask: {what} has {t.numel()} values for a batch of "
                         f"{g.B} (indexed by b)")
    return t.contiguous()


class _KvLess(_Mask):
    """kv_idx < length[b] (length an int or per-batch int tensor)."""

    def __init__(self, length):
        self.length = length

    def __repr__(self):
        return f"kv_length({self.length})"

    def evaluate(self, g):
        n = _per_batch(self.length, g, "a key length")
        return g.kv < (n.view(-1, 1, 1, 1) if n.numel() > 1 else n[0])

    def lower(self, ctx, g):
        n = _per_batch(self.length, g, "a key length").clamp(0, g.S).contiguous()
        return _mask_handle(ctx, lib.attn_mask_new_kv_length,
                            ctypes.cast(n.data_ptr(), _lib.I64P), n.numel())


class _QLess(_Mask):
    """q_idx < n."""

    def __init__(self, n):
        self.n = n

    def __repr__(self):
        return f"q_less({self.n})"

    def evaluate(self, g):
        return g.q < self.n

    def lower(self, ctx, g):
        if self.n <= 0:
            return _nothing().lower(ctx, g)
        if self.n >= g.T:
            return _All().lower(ctx, g)
        # a chunk as wide as the keys: kv_idx // c is 0 for every key, and
        # (q_idx + c - n) // c is 0 exactly for q_idx < n
        c = max(g.S, self.n)
        return _mask_handle(ctx, lib.attn_mask_new_chunked, c, c - self.n)


class _Prefix(_Mask):
    """Prefix-LM: kv_idx <= q_idx or kv_idx < prefix[b]."""

    def __init__(self, prefix):
        self.prefix = prefix

    def __repr__(self):
        return f"prefix_lm({self.prefix})"

    def evaluate(self, g):
        return _Band(None, 0).evaluate(g) | _KvLess(self.prefix).evaluate(g)

    def lower(self, ctx, g):
        n = _per_batch(self.prefix, g, "a prefix length").clamp(0, g.S).contiguous()
        return _mask_handle(ctx, lib.attn_mask_new_prefix_lm,
                            ctypes.cast(n.data_ptr(), _lib.I64P), n.numel())


class _Global(_Mask):
    """q_idx < n or kv_idx < n."""

    def __init__(self, n):
        self.n = n

    def __repr__(self):
        return f"global({self.n})"

    def evaluate(self, g):
        return (g.q < self.n) | (g.kv < self.n)

    def lower(self, ctx, g):
        # n past both lengths already shows every element (the library's n
        # stops at 2^62)
        return _mask_handle(ctx, lib.attn_mask_new_global, min(max(0, self.n), max(g.T, g.S)))


class _Doc(_Mask):
    """q_doc[(b,) q_idx] == kv_doc[(b,) kv_idx]; each _Tens indexed by q or kv,
    with b first where it has a batch axis."""

    def __init__(self, q_doc, kv_doc):
        self.q_doc, self.kv_doc = q_doc, kv_doc

    def __repr__(self):
        return f"document{self.q_doc.dims}{self.kv_doc.dims}"

    def ids(self, g, which):
        """(rows 1 or B, length) int64 ids of one side."""
        side = self.q_doc if which == "q" else self.kv_doc
        n = g.T if which == "q" else g.S
        t = _on_cpu(side.t.detach(), "document ids")
        if side.dims[-1] != which or (len(side.dims) == 2 and side.dims[0] != "b"):
            raise ValueError(f"create_block_mask: document ids indexed by {side.dims}")
        if len(side.dims) == 2 and t.size(0) < g.B:  # PyTorch's doc[b] would raise past them
            raise IndexError(f"create_block_mask: document ids of shape {tuple(side.t.shape)} "
                             f"are indexed by b for a batch of {g.B}")
        t = t[:g.B] if t.dim() == 2 else t.unsqueeze(0)
        if t.size(-1) < n or (t.size(0) not in (1, g.B)):
            raise ValueError(f"create_block_mask: document ids of shape {tuple(side.t.shape)} "
                             f"for a batch of {g.B} and {n} {which} positions")
        return t[:, :n].to(torch.int64)

    def evaluate(self, g):
        q, kv = self.ids(g, "q"), self.ids(g, "kv")
        return q.view(q.size(0), 1, g.T, 1) == kv.view(kv.size(0), 1, 1, g.S)

    def lower(self, ctx, g):
        q, kv = self.ids(g, "q"), self.ids(g, "kv")
        rows = max(q.size(0), kv.size(0))
        q, kv = q.expand(rows, -1), kv.expand(rows, -1)
        both = torch.cat([q.reshape(-1), kv.reshape(-1)])
        if both.numel() and (int(both.min()) < -2 ** 31 or int(both.max()) >= 2 ** 31):
            # ids past int32: renumbered, which keeps every equality and run
            both = torch.unique(both, return_inverse=True)[1]
        both = both.to(torch.int32)
        qd = both[:q.numel()].contiguous()
        kvd = both[q.numel():].contiguous()
        return _mask_handle(ctx, lib.attn_mask_new_document,
                            ctypes.cast(qd.data_ptr(), _lib.I32P),
                            ctypes.cast(kvd.data_ptr(), _lib.I32P), rows, g.T, g.S)


def _reads(description):
    """Which of "b", "h" a traced mask description reads (both where it is
    not one of the primitives here)."""
    if isinstance(description, (_All, _Band, _Chunk, _QLess, _Global)):
        return set()
    if isinstance(description, (_KvLess, _Prefix)):
        n = description.length if isinstance(description, _KvLess) else description.prefix
        return {"b"} if torch.as_tensor(n).dim() > 0 else set()
    if isinstance(description, _Doc):
        return {"b"} if 2 in (len(description.q_doc.dims), len(description.kv_doc.dims)) \
            else set()
    if isinstance(description, _Combine):
        return set().union(*(_reads(p) for p in description.parts))
    return {"b", "h"}


class _Combine(_Mask):
    def __init__(self, op, *parts):
        self.op, self.parts = op, parts

    def __repr__(self):
        return f"{self.op}({', '.join(map(repr, self.parts))})"

    def evaluate(self, g):
        a = self.parts[0].evaluate(g)
        if self.op == "not":
            return ~a
        b = self.parts[1].evaluate(g)
        return a & b if self.op == "and" else a | b

    def lower(self, ctx, g):
        handles = [p.lower(ctx, g) for p in self.parts]
        try:
            fn = {"and": lib.attn_mask_new_and, "or": lib.attn_mask_new_or,
                  "not": lib.attn_mask_new_not}[self.op]
            return _mask_handle(ctx, fn, *handles)
        finally:
            for h in handles:  # a combinator copies its operands
                lib.attn_mask_free(h)


def _Not(a):
    if isinstance(a, _Combine) and a.op == "not":
        return a.parts[0]
    return _Combine("not", a)


def _And(a, b):
    if isinstance(a, _All):
        return b
    if isinstance(b, _All):
        return a
    if isinstance(a, _Band) and isinstance(b, _Band):
        lo = b.lo if a.lo is None else a.lo if b.lo is None else max(a.lo, b.lo)
        hi = b.hi if a.hi is None else a.hi if b.hi is None else min(a.hi, b.hi)
        return _Band(lo, hi)
    return _Combine("and", a, b)


def _Or(a, b):
    if isinstance(a, _All) or isinstance(b, _All):
        return _All()
    for x, y in ((a, b), (b, a)):
        if isinstance(x, _Band) and (x.lo, x.hi) == (None, 0) and isinstance(y, _KvLess):
            return _Prefix(y.length)
        if isinstance(x, _QLess) and isinstance(y, _KvLess) and isinstance(y.length, int) \
                and y.length == x.n:
            return _Global(x.n)
    return _Combine("or", a, b)


_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}


def _one_sided(op, n, make_less):
    """x op n for one index x, as make_less(m) (x < m), its negation and ands."""
    if op == "lt":
        return make_less(n)
    if op == "le":
        return make_less(n + 1)
    if op == "ge":
        return _Not(make_less(n))
    if op == "gt":
        return _Not(make_less(n + 1))
    if op == "eq":
        return _And(_Not(make_less(n)), make_less(n + 1))
    return _Or(make_less(n), _Not(make_less(n + 1)))


def _compare_lin(op, d, node):
    """The mask d op 0 for an integer combination d of q_idx and kv_idx."""
    if "b" in d.coef or "h" in d.coef:
        raise _NotRecognised(f"{_node_name(node)} of an expression in b or h")
    a, c, k = d.coef.get("q", 0), d.coef.get("kv", 0), d.const
    if a == 0 and c == 0:
        truth = {"lt": k < 0, "le": k <= 0, "gt": k > 0, "ge": k >= 0, "eq": k == 0,
                 "ne": k != 0}[op]
        return _All() if truth else _nothing()
    if a == 0 and abs(c) == 1:  # kv_idx alone: c * kv + k op 0
        if c == -1:
            op, k = _FLIP[op], -k
        return _one_sided(op, -k, _KvLess)
    if c == 0 and abs(a) == 1:
        if a == -1:
            op, k = _FLIP[op], -k
        return _one_sided(op, -k, _QLess)
    if a == -c and abs(a) == 1:  # +-(q - kv) + k op 0
        if a == -1:
            op, k = _FLIP[op], -k
        m = -k  # q - kv op m
        if op == "ge":
            return _Band(None, -m)
        if op == "gt":
            return _Band(None, -m - 1)
        if op == "le":
            return _Band(-m, None)
        if op == "lt":
            return _Band(-m + 1, None)
        if op == "eq":
            return _Band(-m, -m)
        return _Not(_Band(-m, -m))
    raise _NotRecognised(f"{_node_name(node)} of {a} * q_idx + {c} * kv_idx")


def _compare(op, x, y, node):
    """The mask x op y, or _NotRecognised."""
    if isinstance(x, (int, float)) and not isinstance(y, (int, float)):
        x, y, op = y, x, _FLIP[op]
    if isinstance(x, _Tens) and x.t.dim() == 0:
        x = _as_int(x, node)
    if isinstance(y, _Tens) and y.t.dim() == 0:
        y = _as_int(y, node)
    if isinstance(x, (_Lin, int, float)) and isinstance(y, (_Lin, int, float)):
        if isinstance(x, float) or isinstance(y, float):
            x, y = (_as_int(v, node) if not isinstance(v, _Lin) else v for v in (x, y))
        return _compare_lin(op, _Lin.of(x) + _Lin.of(y).scaled(-1), node)
    if isinstance(x, _Abs) or isinstance(y, _Abs):
        if isinstance(y, _Abs):
            x, y, op = y, x, _FLIP[op]
        w = _as_int(y, node)
        d = x.lin
        a, c = d.coef.get("q", 0), d.coef.get("kv", 0)
        if set(d.coef) - {"q", "kv"} or not (a == -c and abs(a) == 1):
            raise _NotRecognised("abs of an expression other than +-(q_idx - kv_idx) + c")
        k = d.const if a == 1 else -d.const  # |q - kv + k|
        if op == "lt":
            op, w = "le", w - 1
        elif op == "gt":
            op, w = "ge", w + 1
        if op == "le":
            return _Band(k - w, k + w) if w >= 0 else _nothing()
        if op == "ge":
            return _Not(_Band(k - w + 1, k + w - 1)) if w > 0 else _All()
        raise _NotRecognised(f"{op} of abs()")
    if isinstance(x, _FloorDiv) and isinstance(y, _FloorDiv) and op in ("eq", "ne"):
        if x.by != y.by:
            raise _NotRecognised("floordiv by two different chunks")
        for a, b in ((x, y), (y, x)):
            if b.lin.index() == "kv" and set(a.lin.coef) == {"q"} and a.lin.coef["q"] == 1:
                m = _Chunk(x.by, a.lin.const)
                return m if op == "eq" else _Not(m)
        raise _NotRecognised("floordiv of other than q_idx + c and kv_idx")
    if isinstance(x, _Tens) and isinstance(y, _Tens) and op in ("eq", "ne") and \
            x.full() and y.full() and not x.t.dtype.is_floating_point:
        for a, b in ((x, y), (y, x)):
            if a.dims[-1:] == ("q",) and b.dims[-1:] == ("kv",) and \
                    a.dims[:-1] in ((), ("b",)) and b.dims[:-1] in ((), ("b",)):
                m = _Doc(a, b)
                return m if op == "eq" else _Not(m)
        raise _NotRecognised(f"{_node_name(node)} of tensors indexed by {x.dims} and {y.dims}")
    if isinstance(y, _Lin) and isinstance(x, _Tens):
        x, y, op = y, x, _FLIP[op]
    if isinstance(x, _Lin) and isinstance(y, _Tens) and y.full() and y.dims == ("b",) \
            and not y.t.dtype.is_floating_point:
        # kv_idx + k op L[b]: key padding (kv_idx < L[b]) and its kin
        if set(x.coef) != {"kv"} or x.coef["kv"] not in (1, -1):
            raise _NotRecognised(f"{_node_name(node)} of a per-batch tensor and other than "
                                 "kv_idx")
        lengths = y.t.detach().to(torch.int64)
        if x.coef["kv"] == -1:  # -kv + k op L  <=>  kv flip(op) k - L
            op, lengths = _FLIP[op], x.const - lengths
        else:
            lengths = lengths - x.const
        if op == "lt":
            return _KvLess(lengths)
        if op == "le":
            return _KvLess(lengths + 1)
        if op == "ge":
            return _Not(_KvLess(lengths))
        if op == "gt":
            return _Not(_KvLess(lengths + 1))
        raise _NotRecognised(f"{op} of kv_idx and a per-batch tensor")
    raise _NotRecognised(f"{_node_name(node)} of {_what(x)} and {_what(y)}")


_CMP = {operator.lt: "lt", operator.le: "le", operator.gt: "gt", operator.ge: "ge",
        operator.eq: "eq", operator.ne: "ne", torch.lt: "lt", torch.le: "le", torch.gt: "gt",
        torch.ge: "ge", torch.eq: "eq", torch.ne: "ne"}
_CMP_METHODS = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne",
                "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge",
                "__eq__": "eq", "__ne__": "ne"}
_AND = (operator.and_, torch.logical_and, torch.bitwise_and)
_OR = (operator.or_, torch.logical_or, torch.bitwise_or)
_NOT = (operator.invert, torch.logical_not, torch.bitwise_not)
_ADD = (operator.add, torch.add)
_SUB = (operator.sub, torch.sub)
_MUL = (operator.mul, torch.mul)
_DIV = (operator.truediv, torch.div, torch.true_divide)
_ABS = (torch.abs, abs, operator.abs)
_TANH = (torch.tanh,)
_METHOD_AS_FUNCTION = {"abs": torch.abs, "tanh": torch.tanh, "__getitem__": operator.getitem,
                       "logical_and": torch.logical_and, "logical_or": torch.logical_or,
                       "logical_not": torch.logical_not, "add": torch.add, "sub": torch.sub,
                       "mul": torch.mul, "div": torch.div, "neg": operator.neg,
                       "__and__": operator.and_, "__or__": operator.or_,
                       "__invert__": operator.invert}


def _operation(node):
    """(the function a call node applies, its args, its kwargs)."""
    args, kwargs = list(node.args), dict(node.kwargs)
    for position, name in enumerate(("input", "other")):  # torch.ge(q, other=kv)
        if name in kwargs and len(args) == position:
            args.append(kwargs.pop(name))
    return _resolve(node, tuple(args), kwargs)


def _resolve(node, args, kwargs):
    if node.op == "call_method":
        if node.target in _CMP_METHODS:
            return ("cmp", _CMP_METHODS[node.target]), args, kwargs
        fn = _METHOD_AS_FUNCTION.get(node.target)
        if fn is None:
            return ("method", node.target), args, kwargs
        return fn, args, kwargs
    if node.target in _CMP:
        return ("cmp", _CMP[node.target]), args, kwargs
    return node.target, args, kwargs


def _index_of(v, node):
    if isinstance(v, _Lin) and v.index() is not None:
        return v.index()
    if isinstance(v, _Bucket):
        return v
    if isinstance(v, _Lin) and v.coef in ({"q": 1, "kv": -1}, {"q": -1, "kv": 1}):
        return _RelIndex(v)
    raise _NotRecognised(f"indexing a captured tensor by other than b, h, q_idx, kv_idx "
                         f"(in {_node_name(node)})")


class _Interpreter:
    """Runs a traced graph on symbolic values: _Lin for integer index
    expressions, _Tens for captured tensors, _Mask for booleans; score
    mods extend it with the score."""

    def __init__(self, graph, captured):
        self.graph, self.captured = graph, captured

    def run(self, inputs):
        env = {}
        placeholders = iter(inputs)
        for node in self.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(placeholders)
            elif node.op == "get_attr":
                env[node] = _Tens(self.captured[node.target])
            elif node.op == "output":
                return self.load(node.args[0], env)
            else:
                fn, args, kwargs = _operation(node)
                args = [self.load(a, env) for a in args]
                kwargs = {k: self.load(v, env) for k, v in kwargs.items()}
                env[node] = self.apply(node, fn, args, kwargs)
        raise _NotRecognised("a graph without output")

    def load(self, a, env):
        if isinstance(a, fx.Node):
            return env[a]
        if isinstance(a, (tuple, list)):
            return type(a)(self.load(x, env) for x in a)
        return a

    def apply(self, node, fn, args, kwargs):
        if isinstance(fn, tuple) and fn[0] == "cmp":
            return _compare(fn[1], args[0], args[1], node)
        if fn in _AND or fn in _OR:
            a, b = args
            if isinstance(a, _Mask) and isinstance(b, _Mask):
                return _And(a, b) if fn in _AND else _Or(a, b)
        if fn in _NOT and isinstance(args[0], _Mask):
            return _Not(args[0])
        if fn == ("method", "new_ones") or fn == ("method", "new_zeros"):
            if kwargs.get("dtype") == torch.bool:
                return _All() if fn[1] == "new_ones" else _nothing()
        if fn is operator.getitem:
            base, idx = args
            if isinstance(base, _Tens):
                t, dims = base.t, list(base.dims)
                for i in (idx if isinstance(idx, tuple) else (idx,)):
                    if len(dims) >= t.dim():
                        raise _NotRecognised(f"indexing a {base.t.dim()}-D tensor by more "
                                             "indices")
                    if isinstance(i, _Lin) and not i.coef:
                        i = i.const
                    if isinstance(i, int) and not isinstance(i, bool):
                        t = t.select(len(dims), i)  # a fixed entry: that slice
                    else:
                        dims.append(_index_of(i, node))
                return _Tens(t, dims)
        if fn in _ADD or fn in _SUB:
            a, b = args[0], args[1]
            if kwargs.get("alpha", 1) != 1:
                raise _NotRecognised(f"{_node_name(node)} with alpha")
            if isinstance(a, (_Lin, int)) and isinstance(b, (_Lin, int)) and \
                    not (isinstance(a, int) and isinstance(b, int)):
                return _Lin.of(a) + (_Lin.of(b).scaled(-1) if fn in _SUB else b)
        if fn in _MUL:
            a, b = args
            if isinstance(a, int) and isinstance(b, _Lin):
                a, b = b, a
            if isinstance(a, _Lin) and isinstance(b, int):
                return a.scaled(b)
        if fn is operator.neg and isinstance(args[0], _Lin):
            return args[0].scaled(-1)
        if fn in (operator.floordiv, torch.floor_divide) and isinstance(args[0], _Lin):
            by = _as_int(args[1], node)
            if by <= 0:
                raise _NotRecognised(f"floordiv by {by}")
            return _FloorDiv(args[0], by)
        if fn in _ABS and isinstance(args[0], _Lin):
            return _Abs(args[0])
        return self.other(node, fn, args, kwargs)

    def other(self, node, fn, args, kwargs):
        raise _NotRecognised(_node_name(node))


def _trace_mask(mask_mod):
    """mask_mod as a _Mask, or None where it is not recognised."""
    try:
        graph, captured = _trace(mask_mod, ["b", "h", "q_idx", "kv_idx"])
    except Exception:  # control flow on an index, an op fx cannot trace: evaluated densely
        return None
    idx = [_Lin({"b": 1}), _Lin({"h": 1}), _Lin({"q": 1}), _Lin({"kv": 1})]
    try:
        result = _Interpreter(graph, captured).run(idx)
    except Exception:  # not recognised (or an unexpected call form): evaluated densely
        return None
    return result if isinstance(result, _Mask) else None


def _on_grid(who, role, fn, args, g):
    """fn(*args), the index grid g's tensors among args, as a tensor; what it
    raises passes on (of its type where that takes a message) naming who,
    the function and the grid."""
    try:
        return torch.as_tensor(fn(*args))
    except Exception as err:
        message = (f"{who}: the {role} {getattr(fn, '__name__', fn)!r} raised on the (B, H, "
                   f"Q_LEN, KV_LEN) = ({g.B}, {g.H}, {g.T}, {g.S}) index grid: "
                   f"{type(err).__name__}: {err}")
        try:
            wrapped = type(err)(message)
        except Exception:
            wrapped = RuntimeError(message)
        raise wrapped from err


def _dense_mask(mask_mod, g, who="create_block_mask"):
    """mask_mod evaluated once on the (B, H, T, S) index grid: a bool tensor.
    Errors begin with who, the public call."""
    r = _on_grid(who, "mask_mod", mask_mod, (g.b, g.h, g.q, g.kv), g)
    if r.device.type != "cpu":  # a tensor it captured is elsewhere
        raise ValueError(f"{who}: attn runs on the CPU; the mask_mod "
                         f"{getattr(mask_mod, '__name__', mask_mod)!r} returned a tensor on "
                         f"{r.device}")
    if r.dtype != torch.bool:  # as PyTorch: a number's truth would hide a mistake
        raise TypeError(f"{who}: the mask_mod "
                        f"{getattr(mask_mod, '__name__', mask_mod)!r} must return a torch.bool "
                        f"tensor, got {r.dtype}")
    try:
        return r.expand(g.B, g.H, g.T, g.S)
    except RuntimeError:
        raise ValueError(f"{who}: the mask_mod "
                         f"{getattr(mask_mod, '__name__', mask_mod)!r} returned a tensor of "
                         f"shape {tuple(r.shape)}, which does not broadcast to (B, H, Q_LEN, "
                         f"KV_LEN) = ({g.B}, {g.H}, {g.T}, {g.S})") from None


# ---- score mods as data ----------------------------------------------------------------


class _Score:
    """The score after the chain of mods (each a dict of attn_score_mod fields)."""

    def __init__(self, mods=()):
        self.mods = list(mods)

    def then(self, mod):
        mods = list(self.mods)
        if mod["kind"] == SCORE_SCALE and mods and mods[-1]["kind"] == SCORE_SCALE:
            value = mods[-1]["value"] * mod["value"]
            mods.pop()
            if abs(value - 1.0) > 1e-12:
                mods.append({"kind": SCORE_SCALE, "value": value})
            return _Score(mods)
        mods.append(mod)
        return _Score(mods)


class _Tanh:
    """tanh of a score."""

    def __init__(self, score):
        self.score = score

    def times(self, c):
        """c * tanh(score): a softcap where score ends in a scale by 1 / c (of
        |c|: tanh is odd, so -c tanh(s / -c) = c tanh(s / c))."""
        mods = self.score.mods
        if mods and mods[-1]["kind"] == SCORE_SCALE and \
                abs(mods[-1]["value"] * c - 1.0) <= 1e-12:
            return _Score(mods[:-1]).then({"kind": SCORE_SOFTCAP, "value": abs(float(c))})
        return self.as_score().then({"kind": SCORE_SCALE, "value": float(c)})

    def as_score(self):
        return self.score.then({"kind": SCORE_SOFTCAP, "value": 1.0})


class _MaskedScore:
    """torch.where(mask, score, -inf) (or where(mask, -inf, score), mask
    then negated) as a score_mod's result: the score, and a mask of the
    scores it keeps. Taken only as the score_mod's last operation: tanh,
    a negative scale or a bias after it would not keep -inf where it is."""

    def __init__(self, score, mask):
        self.score, self.mask = score, mask


def _head_factor(x):
    """x as a per-head factor (a captured tensor indexed by h alone), or None."""
    if isinstance(x, _Tens) and x.dims == ("h",) and x.full():
        return x.t
    return None


def _scales_only(score):
    """Whether score is q . k * scale times factors alone (scales, per-head
    factors): a per-head factor then multiplies the query instead."""
    return isinstance(score, _Score) and \
        all(m["kind"] in (SCORE_SCALE, "head_factor") for m in score.mods)


class _Term:
    """A score-independent addend: kind "bias" (tensor, dims), "alibi"
    (slope, lin, absolute), "rel" (table, bucket, heads_first), "const"."""

    def __init__(self, kind, **kw):
        self.kind = kind
        self.__dict__.update(kw)

    def rows_per_head(self, H):
        """A "rel" term's table as (heads, positions), floating point: a table
        without h serves every head, one indexed [position, h] transposed."""
        table = self.table
        if not table.dtype.is_floating_point:
            table = table.to(torch.float32)
        if self.heads == "none":
            return table.reshape(1, -1).expand(H, -1)
        return table.t() if self.heads == "last" else table

    def heads_of(self, H):
        """rows_per_head's first H rows: a table of more heads serves the
        first H, as PyTorch's indexing reads it (the others' gradients are
        zero); one of fewer is read past its end."""
        table = self.rows_per_head(H)
        if table.size(0) < H:
            raise IndexError(f"flex_attention: the score_mod reads head {H - 1} of a relative "
                             f"table of shape {tuple(self.table.shape)} ({table.size(0)} "
                             "heads): out of range, as PyTorch's indexing would be")
        return table[:H]

    def times(self, c):
        kw = {k: v for k, v in self.__dict__.items() if k != "kind"}
        if self.kind == "bias" or self.kind == "rel":
            kw["t" if self.kind == "bias" else "table"] = \
                (self.t if self.kind == "bias" else self.table) * c
        elif self.kind == "alibi":
            kw["slope"] = self.slope * c
        else:
            kw["value"] = self.value * c
        return _Term(self.kind, **kw)


def _distance(lin):
    """Whether lin is n (kv_idx - q_idx) + c, n a nonzero integer."""
    a, c = lin.coef.get("q", 0), lin.coef.get("kv", 0)
    return not set(lin.coef) - {"q", "kv"} and a == -c and a != 0


def _term_of(v, node):
    """v as a list of _Term, or _NotRecognised."""
    if isinstance(v, list):
        return v
    if isinstance(v, _Term):
        return [v]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return [_Term("const", value=float(v))]
    if isinstance(v, _Lin) and _distance(v):  # n (kv_idx - q_idx) + c: ALiBi of slope 1
        return [_Term("alibi", slope=1.0, lin=v, absolute=False)]
    if isinstance(v, _Abs) and _distance(v.lin):
        return [_Term("alibi", slope=1.0, lin=v.lin, absolute=True)]
    if isinstance(v, _Tens) and v.full():
        buckets = [d for d in v.dims if isinstance(d, (_Bucket, _RelIndex))]
        if not buckets:
            if len(set(v.dims)) != len(v.dims):
                raise _NotRecognised("a captured tensor indexed twice by one index")
            return [_Term("bias", t=v.t, dims=v.dims)]
        if len(v.dims) == 1:
            return [_Term("rel", table=v.t, bucket=v.dims[0], heads="none")]
        if len(v.dims) == 2 and "h" in v.dims and len(buckets) == 1:
            return [_Term("rel", table=v.t, bucket=buckets[0],
                          heads="first" if v.dims[0] == "h" else "last")]
        raise _NotRecognised("a relative-bias table indexed by other than h and the relative "
                             "position")
    raise _NotRecognised(f"{_what(v)} added to the score (in "
                         f"{_node_name(node)})")


def _slope_of(v):
    """v as an ALiBi slope (a number or a tensor over heads), or None."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, _Tens) and v.dims == ("h",) and v.full():
        return v.t
    return None


class _Opaque:
    """A value of indices and captured tensors alone that the tracer does not
    recognise: an error where it meets the score, a mask drawn over the
    index grid where it is where(mask, score, -inf)'s mask."""

    def __init__(self, why):
        self.why = why


class _ScoreInterpreter(_Interpreter):
    def apply(self, node, fn, args, kwargs):
        values = list(args) + list(kwargs.values())
        if fn is torch.where and len(args) == 3 and not kwargs:
            return self.where(node, *args)
        opaque = [a for a in values if isinstance(a, _Opaque)]
        scored = any(isinstance(a, (_Score, _Tanh, _MaskedScore)) for a in values)
        if opaque and scored:
            raise _NotRecognised(opaque[0].why)
        if opaque:
            return opaque[0]
        try:
            return super().apply(node, fn, args, kwargs)
        except _NotRecognised as err:
            if scored:
                raise
            return _Opaque(str(err))

    def other(self, node, fn, args, kwargs):
        name = _node_name(node)
        if any(isinstance(a, _MaskedScore) for a in list(args) + list(kwargs.values())):
            raise _NotRecognised(f"{name} of where(mask, score, -inf)'s result (attn takes "
                                 "that where as the score_mod's last operation)")
        if fn is t5_relative_bucket:
            lin = args[0]
            if not isinstance(lin, _Lin):
                raise _NotRecognised("t5_relative_bucket of other than kv_idx - q_idx")
            return _Bucket(lin, bool(kwargs.get("bidirectional", True)),
                           int(kwargs.get("num_buckets", 32)), int(kwargs.get("max_distance", 128)))
        if fn in _MUL or fn in _DIV:
            a, b = args
            if fn in _DIV:
                if kwargs.get("rounding_mode") is not None:
                    raise _NotRecognised(f"{name} with rounding_mode={kwargs['rounding_mode']!r}")
                if _scales_only(a) and _head_factor(b) is not None:
                    return _Score(a.mods + [{"kind": "head_factor", "t": _head_factor(b),
                                             "divide": True}])
                if not isinstance(b, (int, float)) or isinstance(b, bool) or b == 0:
                    raise _NotRecognised(f"{name} by other than a nonzero number")
                return self.scale(a, 1.0 / b, node)
            if isinstance(a, (int, float)) and not isinstance(a, bool):
                a, b = b, a
            if isinstance(b, (int, float)) and not isinstance(b, bool):
                return self.scale(a, float(b), node)
            for x, y in ((a, b), (b, a)):
                if _scales_only(x) and _head_factor(y) is not None:
                    return _Score(x.mods + [{"kind": "head_factor", "t": _head_factor(y),
                                             "divide": False}])
            for x, y in ((a, b), (b, a)):
                slope = _slope_of(x)
                if slope is not None and isinstance(y, _Lin):
                    return _Term("alibi", slope=slope, lin=y, absolute=False)
                if slope is not None and isinstance(y, _Abs):
                    return _Term("alibi", slope=slope, lin=y.lin, absolute=True)
            raise _NotRecognised(f"{name} of {_what(a)} and {_what(b)}")
        if fn is operator.neg:
            return self.scale(args[0], -1.0, node)
        if fn in _TANH:
            if isinstance(args[0], _Tanh):
                args = [args[0].as_score()]
            if isinstance(args[0], _Score):
                return _Tanh(args[0])
            raise _NotRecognised(f"{name} of other than the score")
        if fn in _ADD or fn in _SUB:
            a, b = args[0], args[1]
            sub = fn in _SUB
            if isinstance(a, _Tanh):
                a = a.as_score()
            if isinstance(b, _Tanh):
                b = b.as_score()
            if isinstance(b, _Score) and not isinstance(a, _Score):
                if sub:  # c - score: -(score - c)
                    return self.scale(self.add(b, _term_of(a, node), node, negate=True), -1.0,
                                      node)
                a, b = b, a
            if isinstance(a, _Score):
                if isinstance(b, _Score):
                    raise _NotRecognised(f"{name} of the score and itself")
                return self.add(a, _term_of(b, node), node, negate=sub)
            terms_b = _term_of(b, node)
            if sub:
                terms_b = [t.times(-1.0) for t in terms_b]
            return _term_of(a, node) + terms_b
        raise _NotRecognised(name)

    def where(self, node, cond, x, y):
        """where(mask, score, -inf) and where(mask, -inf, score)."""
        def minus_inf(v):
            return isinstance(v, float) and v == -math.inf
        if isinstance(cond, (_Mask, _Opaque)):
            negated = cond if isinstance(cond, _Opaque) else _Not(cond)
            for keep, other, mask in ((x, y, cond), (y, x, negated)):
                if isinstance(keep, _Tanh):
                    keep = keep.as_score()
                if isinstance(keep, _Score) and minus_inf(other):
                    # a mask not recognised is drawn from the score_mod itself
                    return _MaskedScore(keep, None if isinstance(cond, _Opaque) else mask)
        raise _NotRecognised(f"{_node_name(node)} of {_what(cond)}, {_what(x)} and {_what(y)} "
                             "(attn takes where(mask, score, -inf), a mask over b, h, q_idx, "
                             "kv_idx)")

    def scale(self, a, c, node):
        if isinstance(a, _MaskedScore):
            raise _NotRecognised(f"{_node_name(node)} of where(mask, score, -inf)'s result "
                                 "(attn takes that where as the score_mod's last operation)")
        if isinstance(a, _Score):
            return a.then({"kind": SCORE_SCALE, "value": c})
        if isinstance(a, _Tanh):
            return a.times(c)
        if isinstance(a, _Tens):
            return _Tens(a.t * c, a.dims)
        if isinstance(a, (_Term, list)):
            return [t.times(c) for t in _term_of(a, node)]
        if isinstance(a, _Lin) and float(c).is_integer():
            return a.scaled(int(c))
        if isinstance(a, _Lin) and _distance(a):  # slope * (kv_idx - q_idx): ALiBi's term
            return _Term("alibi", slope=float(c), lin=a, absolute=False)
        if isinstance(a, _Abs) and _distance(a.lin):
            return _Term("alibi", slope=float(c), lin=a.lin, absolute=True)
        raise _NotRecognised(f"{_node_name(node)} of {_what(a)}")

    def add(self, score, terms, node, negate=False):
        for t in terms:
            score = score.then({"kind": "term", "term": t.times(-1.0) if negate else t})
        return score


def _trace_score(score_mod):
    """score_mod as a list of mod dicts; ValueError naming what attn lacks."""
    what = getattr(score_mod, "__name__", repr(score_mod))
    try:
        graph, captured = _trace(score_mod, ["score", "b", "h", "q_idx", "kv_idx"])
    except (_ArgumentValueError, _ArgumentTypeError):
        raise
    except Exception as err:
        raise ValueError(f"flex_attention: the score_mod {what!r} cannot be traced by "
                         f"torch.fx ({type(err).__name__}: {err}); attn runs score_mods made "
                         "of scales, softcaps, captured biases, ALiBi, relative tables and T5 "
                         "buckets") from err
    idx = [_Score(), _Lin({"b": 1}), _Lin({"h": 1}), _Lin({"q": 1}), _Lin({"kv": 1})]
    try:
        result = _ScoreInterpreter(graph, captured).run(idx)
    except _NotRecognised as err:
        raise ValueError(f"flex_attention: the score_mod {what!r} uses {err}, which attn has "
                         "no score modifier for (it runs scales, softcaps, captured biases "
                         "indexed by b, h, q_idx, kv_idx, ALiBi, relative tables indexed by "
                         "q_idx - kv_idx + c and t5_relative_bucket tables)") from None
    if isinstance(result, _Opaque):
        raise ValueError(f"flex_attention: the score_mod {what!r} uses {result.why}, which "
                         "attn has no score modifier for")
    if isinstance(result, _Tanh):
        result = result.as_score()
    if isinstance(result, _MaskedScore):
        return result.score.mods + [{"kind": "mask", "mask": result.mask}]
    if not isinstance(result, _Score):
        raise ValueError(f"flex_attention: the score_mod {what!r} does not return the score "
                         "modified (its result does not depend on score)")
    return result.mods


# ---- the chain as attn_score_mod structs --------------------------------------------


_AXIS = {"b": 0, "h": 1, "q": 2, "kv": 3}  # attn_score_mod.strides' order


class _Chain:
    """The attn_score_mod array of a traced chain for one call's shapes, the
    float32 tensors it points at (kept alive), and which of them take a
    gradient (tensor_grad)."""

    def __init__(self, mods, B, H, T, S):
        self.entries = []    # (fields, tensor index or None)
        self.tensors = []    # float32 contiguous tensors (autograd-connected to the captured)
        for m in mods:
            if m["kind"] == "term":
                self.add_term(m["term"], B, H, T, S)
            else:
                self.entries.append(({"kind": m["kind"], "value": m["value"]}, None))

    @classmethod
    def bias(cls, values, strides):
        """A chain of one ATTN_SCORE_BIAS over values through strides (b, h, q, kv)."""
        chain = cls([], 1, 1, 1, 1)
        chain.entries.append(({"kind": SCORE_BIAS, "strides": tuple(strides)},
                              chain.tensor(values)))
        return chain

    def tensor(self, t):
        if t.device.type != "cpu":
            raise ValueError(f"flex_attention: attn runs on the CPU; a score_mod's captured "
                             f"tensor of shape {tuple(t.shape)} is on {t.device}")
        if t.is_complex():  # a softmax of complex scores has no meaning
            raise TypeError(f"flex_attention: a score_mod's captured tensor of shape "
                            f"{tuple(t.shape)} is complex ({t.dtype})")
        self.tensors.append(t.to(torch.float32).contiguous())
        return len(self.tensors) - 1

    def add_term(self, t, B, H, T, S):
        extent = {"b": B, "h": H, "q": T, "kv": S}
        if t.kind == "const":
            i = self.tensor(torch.tensor([t.value]))
            self.entries.append(({"kind": SCORE_BIAS, "strides": (0, 0, 0, 0)}, i))
        elif t.kind == "bias":
            i = self.tensor(t.t)
            ft = self.tensors[i]
            strides = [0, 0, 0, 0]
            for d, name in enumerate(t.dims):
                size = ft.size(d)
                # as PyTorch indexes it: a dim of 1 read at index 1 and up is
                # out of bounds, not broadcast
                if size < extent[name]:
                    raise IndexError(f"flex_attention: a score_mod's tensor of shape "
                                     f"{tuple(t.t.shape)} is indexed by {name} up to "
                                     f"{extent[name] - 1} along its dim {d} of size {size}")
                strides[_AXIS[name]] = ft.stride(d) if size != 1 else 0
            self.entries.append(({"kind": SCORE_BIAS, "strides": tuple(strides)}, i))
        elif t.kind == "alibi":
            d = t.lin
            a, c = d.coef.get("q", 0), d.coef.get("kv", 0)
            # n (kv_idx - q_idx) + n k: the slope times n, the distance's own
            n = abs(a)
            if set(d.coef) - {"q", "kv"} or a != -c or n == 0 or d.const % n:
                raise ValueError("flex_attention: a score_mod's slope multiplies other than "
                                 "n (+-(kv_idx - q_idx) + k) (ALiBi)")
            a, d = a // n, _Lin({x: v // n for x, v in d.coef.items()}, d.const // n)
            slope = t.slope
            if isinstance(slope, torch.Tensor):
                if slope.requires_grad and torch.is_grad_enabled():
                    raise ValueError("flex_attention: ALiBi slopes that require grad: attn "
                                     "computes no gradient for them (detach them)")
                slope = slope.detach().to(torch.float32).reshape(-1)
                # slopes[h] reads the first H, as PyTorch's indexing does
                if slope.numel() < H:
                    raise ValueError(f"flex_attention: ALiBi slopes of {slope.numel()} "
                                     f"values for {H} heads")
                slope = slope[:H] * n
            else:
                slope = torch.full((H,), float(slope) * n)
            if t.absolute:
                # s + slope * |q - kv + k| = s - (-slope) * |q + k - kv|
                k = d.const if a == 1 else -d.const
                fields = {"kind": SCORE_ALIBI, "offset": k, "signed_distance": False}
                slope = -slope
            else:
                # s + slope * (a (q - kv) + k) = s + (-a slope) (kv - q - a k)
                fields = {"kind": SCORE_ALIBI, "offset": a * d.const, "signed_distance": True}
                slope = slope * -a
            self.entries.append((fields, self.tensor(slope)))
        elif isinstance(t.bucket, _RelIndex):  # table[h, q_idx - kv_idx + c] and the like
            table = t.heads_of(H)
            rel = t.bucket
            n, c, signed = table.size(1), rel.lin.const, rel.signed()
            lo = (-(T - 1) if signed else -(S - 1)) + c
            hi = (S - 1 if signed else T - 1) + c
            if lo < -n or hi >= n:
                raise IndexError(f"flex_attention: the score_mod reads a relative table of "
                                 f"{n} positions at {lo if lo < -n else hi} "
                                 f"({'kv_idx - q_idx' if signed else 'q_idx - kv_idx'} + {c} "
                                 f"over Q_LEN {T}, KV_LEN {S}): out of range, as PyTorch's "
                                 "indexing would be")
            fields = {"kind": SCORE_REL_TABLE, "buckets": n, "offset": c,
                      "signed_distance": signed}
            self.entries.append((fields, self.tensor(table)))
        else:  # rel
            b = t.bucket
            if b.lin.coef != {"kv": 1, "q": -1} or b.lin.const != 0:
                raise ValueError("flex_attention: t5_relative_bucket of other than "
                                 "kv_idx - q_idx (T5's memory - query position)")
            table = t.heads_of(H)
            if table.size(1) < b.buckets:
                raise ValueError(f"flex_attention: a relative-bias table of shape "
                                 f"{tuple(t.table.shape)} for {H} heads and {b.buckets} "
                                 "buckets")
            table = table[:, :b.buckets]
            fields = {"kind": SCORE_REL_BIAS, "buckets": b.buckets,
                      "max_distance": b.max_distance, "bidirectional": b.bidirectional}
            self.entries.append((fields, self.tensor(table)))

    def structs(self, tensors, grads):
        """The attn_score_mod array reading tensors (and writing grads: None
        where no gradient is wanted)."""
        arr = (ScoreMod * max(1, len(self.entries)))()
        for slot, (fields, i) in zip(arr, self.entries):
            for k, v in fields.items():
                if k == "strides":
                    slot.strides[:] = list(v)
                else:
                    setattr(slot, k, v)
            if i is not None:
                slot.tensor = ctypes.cast(tensors[i].data_ptr(), _lib.F32P)
                if grads is not None and grads[i] is not None:
                    slot.tensor_grad = ctypes.cast(grads[i].data_ptr(), _lib.F32P)
        return arr

    def evaluate(self, scores, g):
        """The chain applied to scores (B, H, T, S) in torch (what attn computes)."""
        s = scores
        for fields, i in self.entries:
            kind = fields["kind"]
            t = self.tensors[i] if i is not None else None
            if kind == SCORE_SCALE:
                s = s * fields["value"]
            elif kind == SCORE_SOFTCAP:
                s = fields["value"] * torch.tanh(s / fields["value"])
            elif kind == SCORE_BIAS:
                st = fields["strides"]
                s = s + t.as_strided((g.B, g.H, g.T, g.S), st).to(s.dtype)
            elif kind == SCORE_ALIBI:
                slope = t.view(1, -1, 1, 1).to(s.dtype)
                if fields["signed_distance"]:
                    s = s + slope * (g.kv - g.q - fields["offset"])
                else:
                    s = s - slope * (g.q + fields["offset"] - g.kv).abs()
            elif kind == SCORE_REL_TABLE:
                e = (g.kv - g.q if fields["signed_distance"] else g.q - g.kv) + fields["offset"]
                e = torch.where(e < 0, e + fields["buckets"], e)
                s = s + t.to(s.dtype)[:, e.view(g.T, g.S)].unsqueeze(0)
            else:
                bucket = t5_relative_bucket(g.kv - g.q, fields["bidirectional"],
                                            fields["buckets"], fields["max_distance"])
                s = s + t.to(s.dtype)[:, bucket.view(g.T, g.S)].unsqueeze(0)
        return s


# ---- BlockMask ---------------------------------------------------------------------------


def _block_sizes(BLOCK_SIZE):
    if isinstance(BLOCK_SIZE, int) and not isinstance(BLOCK_SIZE, bool):
        bq = bkv = BLOCK_SIZE
    elif isinstance(BLOCK_SIZE, (tuple, list)) and len(BLOCK_SIZE) == 2:
        bq, bkv = BLOCK_SIZE
    else:
        raise ValueError(f"BLOCK_SIZE: an int or (Q_BLOCK, KV_BLOCK), got {BLOCK_SIZE!r} "
                         f"({type(BLOCK_SIZE).__name__})")
    for x in (bq, bkv):
        if not isinstance(x, int) or x < 16 or x > 256 or x & (x - 1):
            raise ValueError(f"BLOCK_SIZE: attn's blocks are powers of two from 16 to 256, "
                             f"got {BLOCK_SIZE!r}")
    return bq, bkv


def _dims(name, value, default=1, who="create_block_mask", least=1):
    """A size: None (default) or an integer >= least, a NumPy or 0-d torch
    integer too. Errors begin with who, the public call."""
    if value is None:
        return default
    try:
        n = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        n = None
    if n is None or n < least:
        kind = "a positive int" if least == 1 else f"an int >= {least}"
        raise ValueError(f"{who}: {name} must be None or {kind}, got {value!r} "
                         f"({type(value).__name__})")
    return n


def _has_masks():
    return all(_lib.has(n) for n in ("attn_mask_new_all", "attn_mask_new_and",
                                      "attn_block_mask_from_mask"))


# The library's limits on a mask tree (attn.h): a traced description past
# them is drawn over the index grid instead.
_MASK_MAX_NODES, _MASK_MAX_DEPTH = 4096, 256


def _lowers(description):
    """Whether a traced mask description becomes an attn_mask."""
    if description is None or not _has_masks():
        return False
    nodes, deepest, stack = 0, 0, [(description, 1)]
    while stack:
        d, depth = stack.pop()
        nodes, deepest = nodes + 1, max(deepest, depth)
        if nodes > _MASK_MAX_NODES or deepest > _MASK_MAX_DEPTH:
            return False
        stack.extend((p, depth + 1) for p in getattr(d, "parts", ()))
    return True


class BlockMask(HandleOwner):
    """attn's block map (flex_attention's BlockMask): which key blocks each
    query block visits, full or partial, for (B, H, Q_LEN, KV_LEN); B or H 1
    broadcasts. It holds the C map, freed when the object goes."""

    def __init__(self, handle, shape, block_size, mask_mod, description=None):
        self._handle = handle
        self._finalizer = weakref.finalize(self, lib.attn_block_mask_free, handle)
        self.shape = tuple(shape)
        self.BLOCK_SIZE = tuple(block_size)
        self.mask_mod = mask_mod
        self.description = description  # the traced _Mask, or None (dense)
        # from_kv_blocks: the (B, H, Q_LEN, KV_LEN) bools its lists and
        # mask_mod draw (None for a map drawn from its mask_mod alone), which
        # the description does not give: the lists choose the blocks
        self._listed = None
        self._lists = None  # from_kv_blocks: its int32 lists and block sizes
        self.seq_lengths = self.shape[2:]
        # {(B, H): the map a call of batch B and H heads runs} (_for_call)
        self._calls = {}

    @property
    def handle(self):
        return self._handle

    def info(self):
        out = BlockMaskInfo()
        status = lib.attn_block_mask_get_info(self._handle, ctypes.byref(out))
        if status != 0:
            raise AttnError(_lib.status_name(status), "attn_block_mask_get_info failed")
        return out

    def sparsity(self):
        """Percent of the (B, H) tiles skipped, as BlockMask.sparsity()."""
        if self._lists is not None:
            listed = self._listed_blocks()
            return 100.0 * (1.0 - int(listed.sum()) / listed.numel())
        return float(self.info().sparsity)

    def _listed_blocks(self):
        """from_kv_blocks: its lists' blocks (B, H, query blocks, key
        blocks), each listed one visited as in PyTorch's map, though the
        C map skips a partial one whose mask_mod shows no key there."""
        i32, bq, bkv = self._lists
        return _listed_blocks(i32, _Grid(*self.shape), bq, bkv)

    def _draw(self, b, h):
        needed = c_size_t()
        status = lib.attn_block_mask_to_string(self._handle, b, h, None, 0, ctypes.byref(needed))
        if status != 0:
            raise AttnError(_lib.status_name(status), f"attn_block_mask_to_string ({b}, {h})")
        buf = ctypes.create_string_buffer(needed.value)
        status = lib.attn_block_mask_to_string(self._handle, b, h, buf, needed.value, None)
        if status != 0:
            raise AttnError(_lib.status_name(status), f"attn_block_mask_to_string ({b}, {h})")
        return buf.value.decode()

    def to_string(self, limit=4):
        """The map of each (b, h), up to limit of them, a line per query block
        and a character per key block: '#' full, '~' partial, '.' skipped."""
        B, H = self.shape[:2]
        parts = []
        for b in range(B):
            for h in range(H):
                if len(parts) == limit:
                    parts.append("...\n")
                    return "".join(parts)
                parts.append(f"b={b}, h={h}\n" + self._draw(b, h))
        return "".join(parts)

    def numel(self):
        """Elements of the (B, H, Q_LEN, KV_LEN) mask it stands for, as
        PyTorch's BlockMask.numel() (sparsity not counted)."""
        return math.prod(self.shape)

    def _for_call(self, B, H, who="flex_attention", pytorch_classes=True):
        """The map a call of batch B and H heads runs. PyTorch serves every
        sequence (head) from a map made with B=1 or None (H) with the block
        classes of b = 0 (h = 0), but tests elements with the mask_mod at
        the real b (h): its compiled kernels those of partial blocks, its
        eager ones every element. Where the mask_mod reads b (h) the call
        runs the map of its own (B, H): the answer of both wherever a
        sequence's (head's) blocks are full where b = 0's are full and empty
        where b = 0's are empty; elsewhere the two differ, and ValueError
        names the block. A map from block lists runs its lists of b = 0
        (h = 0) with the mask_mod at the real b (h) in their partial blocks,
        as PyTorch's kernels both do. Built once per (B, H). Without
        pytorch_classes (attn's own functions, which PyTorch has no answer
        for) the map of the call's (B, H) runs as it is, unchecked."""
        mB, mH, T, S = self.shape
        wide = {d for d, m, n in (("b", mB, B), ("h", mH, H)) if m == 1 < n}
        if not wide or self.mask_mod is None:
            return self
        # a map that skipped the check is kept apart from the checked ones
        key = (B, H) if pytorch_classes else (B, H, "unchecked")
        for k in {(B, H), key}:
            if k in self._calls:
                return self._calls[k]
        if self._listed is not None:
            return self._lists_for_call(B, H, wide, who)
        if self.description is not None:
            reads = _reads(self.description) & wide
            cB, cH = (B if "b" in reads else mB), (H if "h" in reads else mH)
            if reads:
                call = _block_mask_of(self.description, self.mask_mod, cB, cH, T, S,
                                      self.BLOCK_SIZE)
        else:
            keep = _dense_mask(self.mask_mod, _Grid(B if "b" in wide else mB,
                                                    H if "h" in wide else mH, T, S), who)
            reads = {d for i, d in ((0, "b"), (1, "h")) if d in wide and keep.stride(i) != 0}
            keep = keep[:B if "b" in reads else mB, :H if "h" in reads else mH]
            cB, cH = keep.shape[:2]
            if reads:
                call = _from_bool(_attn_torch()._context(), keep, self.BLOCK_SIZE,
                                  self.mask_mod, None)
        if not reads:
            self._calls[(B, H)] = self
            return self
        for b in range(cB if pytorch_classes else 0):
            for h in range(cH):
                mine = self._draw(b if mB > 1 else 0, h if mH > 1 else 0).splitlines()
                real = call._draw(b, h).splitlines()
                for qb, (row, want) in enumerate(zip(mine, real)):
                    for kb, (c, w) in enumerate(zip(row, want)):
                        if c != "~" and c != w:
                            name = getattr(self.mask_mod, "__name__", self.mask_mod)
                            at = ", ".join(f"{d} = 0" for d in ("b", "h") if d in reads)
                            raise ValueError(
                                f"{who}: block_mask of shape {self.shape} serves a call of "
                                f"(B, H) = ({B}, {H}) with the block classes of {at}, and its "
                                f"mask_mod {name!r} at (b, h) = ({b}, {h}) "
                                f"{'shows keys in' if c == '.' else 'hides keys in'} key block "
                                f"{kb} of query block {qb}, which that map "
                                f"{'skips' if c == '.' else 'has full'}: PyTorch's compiled "
                                f"flex_attention {'skips' if c == '.' else 'shows'} them there "
                                f"and its eager one does not; pass create_block_mask the "
                                f"call's {' and '.join(sorted(d.upper() for d in reads))}")
        self._calls[key] = call
        return call

    def _lists_for_call(self, B, H, wide, who):
        """_for_call of a map from block lists made for one sequence (head):
        the lists broadcast, their partial blocks' elements those the
        mask_mod leaves visible at the real b (h)."""
        mB, mH, T, S = self.shape
        if self.description is not None:
            reads = _reads(self.description) & wide
        else:
            keep = _dense_mask(self.mask_mod, _Grid(B if "b" in wide else mB,
                                                    H if "h" in wide else mH, T, S), who)
            reads = {d for i, d in ((0, "b"), (1, "h")) if d in wide and keep.stride(i) != 0}
        if not reads:
            self._calls[(B, H)] = self
            return self
        cB, cH = (B if "b" in reads else mB), (H if "h" in reads else mH)
        i32, bq, bkv = self._lists
        lists = [None if t is None else t.expand(cB, cH, *t.shape[2:]) for t in i32]
        g = _Grid(cB, cH, T, S)
        call = _from_bool(_attn_torch()._context(),
                          _listed_keep(lists, g, bq, bkv, self.mask_mod, self.description),
                          self.BLOCK_SIZE, self.mask_mod, None)
        call._listed = functools.partial(_listed_keep, lists, g, bq, bkv, self.mask_mod,
                                         self.description)
        self._calls[(B, H)] = call
        return call

    def to(self, device):
        """The map itself on the CPU (attn's maps live there); any other
        device raises ValueError."""
        if str(torch.device(device).type) != "cpu":
            raise ValueError(f"BlockMask.to: attn runs on the CPU, not {device}")
        return self

    def to_dense(self):
        """The key blocks each query block visits, as PyTorch's
        BlockMask.to_dense(): an int32 tensor (B, H, query blocks, key
        blocks), 1 for a block visited (full or partial), 0 for one
        skipped."""
        if self._lists is not None:
            return self._listed_blocks().to(torch.int32)
        info = self.info()
        B, H = self.shape[:2]
        dense = torch.zeros(B, H, info.q_blocks, info.kv_blocks, dtype=torch.int32)
        for b in range(B):
            for h in range(H):
                rows = self._draw(b, h).splitlines()
                dense[b, h] = torch.tensor([[c != "." for c in row] for row in rows],
                                           dtype=torch.int32).view(info.q_blocks, info.kv_blocks)
        return dense

    def __repr__(self):
        return (f"BlockMask(shape={self.shape}, BLOCK_SIZE={self.BLOCK_SIZE}, "
                f"sparsity={self.sparsity():.2f}%,\n{self.to_string(limit=1)})")

    @classmethod
    def from_kv_blocks(cls, kv_num_blocks, kv_indices, full_kv_num_blocks=None,
                       full_kv_indices=None, BLOCK_SIZE=128, mask_mod=None, seq_lengths=None):
        """A BlockMask from block lists, as PyTorch's: kv_num_blocks (B, H,
        q_blocks) partial key blocks listed in kv_indices (B, H, q_blocks,
        max), full ones likewise; a partial block's elements are those
        mask_mod (None: all) leaves visible. seq_lengths (Q_LEN, KV_LEN)
        defaults to the lists' block counts times the block sizes."""
        bq, bkv = _block_sizes(BLOCK_SIZE)
        for name, t in (("kv_num_blocks", kv_num_blocks), ("kv_indices", kv_indices),
                        ("full_kv_num_blocks", full_kv_num_blocks),
                        ("full_kv_indices", full_kv_indices)):
            if t is not None and (not isinstance(t, torch.Tensor) or t.dtype.is_floating_point):
                raise TypeError(f"from_kv_blocks: {name} must be an integer tensor")
        if (full_kv_num_blocks is None) != (full_kv_indices is None):
            raise ValueError("from_kv_blocks: full_kv_num_blocks and full_kv_indices go "
                             "together")
        if kv_num_blocks.dim() != 3 or kv_indices.dim() != 4 or \
                kv_indices.shape[:3] != kv_num_blocks.shape:
            raise ValueError(f"from_kv_blocks: kv_num_blocks (B, H, q_blocks) and kv_indices "
                             f"(B, H, q_blocks, max), got {tuple(kv_num_blocks.shape)} and "
                             f"{tuple(kv_indices.shape)}")
        B, H, QB = kv_num_blocks.shape
        if seq_lengths is None:
            seq_lengths = (QB * bq, kv_indices.size(-1) * bkv)
        T, S = _seq_lengths(seq_lengths)
        if full_kv_num_blocks is not None and (full_kv_num_blocks.shape != kv_num_blocks.shape
                                               or full_kv_indices.shape[:3] != (B, H, QB)):
            raise ValueError("from_kv_blocks: the full blocks' lists must have the partial "
                             "ones' (B, H, q_blocks)")
        need = -(-T // bq)
        if QB < need:
            raise ValueError(f"from_kv_blocks: seq_lengths {tuple(seq_lengths)} needs "
                             f"{need} query blocks of {bq}, the lists have {QB} "
                             f"(kv_num_blocks {tuple(kv_num_blocks.shape)})")
        # query blocks past Q_LEN are never read, as in PyTorch
        kv_num_blocks, kv_indices = kv_num_blocks[:, :, :need], kv_indices[:, :, :need]
        if full_kv_num_blocks is not None:
            full_kv_num_blocks = full_kv_num_blocks[:, :, :need]
            full_kv_indices = full_kv_indices[:, :, :need]
        g = _Grid(B, H, T, S)
        description = _trace_mask(mask_mod) if mask_mod is not None else _All()
        names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
        lists = (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)
        for name, t in zip(names, lists):
            if t is not None and t.numel():
                lo, hi = int(t.min()), int(t.max())
                if lo < -2 ** 31 or hi >= 2 ** 31:
                    raise ValueError(f"from_kv_blocks: {name} holds {hi if hi >= 2 ** 31 else lo},"
                                     " past int32")
        i32 = [None if t is None else t.detach().to(torch.int32).contiguous() for t in lists]
        cfg = BlockMaskConfig(batch=B, heads=H, q_len=T, kv_len=S, block_q=bq, block_kv=bkv)
        ctx = _attn_torch()._context()
        p = [None if t is None else ctypes.cast(t.data_ptr(), _lib.I32P) for t in i32]

        def lists_map(mask):
            out = c_void_p()
            ctx.check(lib.attn_block_mask_from_kv_blocks(
                ctx.handle, ctypes.byref(cfg), p[0], p[1], i32[1].size(-1), p[2], p[3],
                0 if i32[3] is None else i32[3].size(-1), mask, ctypes.byref(out)),
                "attn_block_mask_from_kv_blocks")
            return out

        has_lists = _lib.has("attn_block_mask_from_kv_blocks")
        if has_lists and _lowers(description):
            mask = description.lower(ctx, g)
            try:
                out = lists_map(mask)
            finally:
                lib.attn_mask_free(mask)
            bm = cls(out, (B, H, T, S), (bq, bkv), mask_mod, description)
        else:
            if has_lists:
                # the lists checked as the library checks them (counts past
                # max or negative, a block out of range, listed twice, partial
                # and full), which drawing them out would pass over
                lib.attn_block_mask_free(lists_map(None))
            # the lists drawn out densely: the same map through the dense builder
            bm = _from_bool(ctx, _listed_keep(i32, g, bq, bkv, mask_mod, description),
                            (bq, bkv), mask_mod, None)
        # drawn again only where a call needs it, not kept: it is (B, H, T, S)
        bm._listed = functools.partial(_listed_keep, i32, g, bq, bkv, mask_mod, description)
        bm._lists = (i32, bq, bkv)
        return bm


def _listed_keep(i32, g, bq, bkv, mask_mod, description):
    """The (B, H, T, S) bools of block lists i32: a full block's elements
    all, a partial one's those mask_mod (None: all) leaves visible."""
    keep = _listed_dense(i32, g, bq, bkv)
    if mask_mod is not None:
        partial = _listed_dense(i32[:2], g, bq, bkv)
        inside = description.evaluate(g) if description is not None else \
            _dense_mask(mask_mod, g, "from_kv_blocks")
        keep = (keep & ~partial) | (partial & inside.expand(g.B, g.H, g.T, g.S))
    return keep


def _seq_lengths(seq_lengths):
    """(Q_LEN, KV_LEN) as two ints >= 0; TypeError or ValueError naming them."""
    try:
        if len(seq_lengths) != 2:
            raise TypeError
        T, S = (operator.index(n) for n in seq_lengths)
    except TypeError:
        raise TypeError(f"from_kv_blocks: seq_lengths {seq_lengths!r} must be two ints "
                        "(Q_LEN, KV_LEN)") from None
    if T < 0 or S < 0:
        raise ValueError(f"from_kv_blocks: seq_lengths {tuple(seq_lengths)} must be >= 0")
    return T, S


def _listed_dense(i32, g, bq, bkv):
    """The elements of the listed blocks (partial, then full if given) as a
    (B, H, T, S) bool tensor; a block out of range is refused by name."""
    keep = _listed_blocks(i32, g, bq, bkv)
    dense = keep.repeat_interleave(bq, 2).repeat_interleave(bkv, 3)
    return dense[:, :, :g.T, :g.S]


def _listed_blocks(i32, g, bq, bkv):
    """The listed blocks (partial, then full if given) as a (B, H, query
    blocks, key blocks) bool tensor; a block out of range is refused by
    name."""
    keep = torch.zeros(g.B, g.H, (g.T + bq - 1) // bq, (g.S + bkv - 1) // bkv, dtype=torch.bool)
    kvb = keep.size(-1)
    for num, idx in zip(i32[0::2], i32[1::2]):
        if num is None:
            continue
        count = num.clamp(0, idx.size(-1)).unsqueeze(-1)
        listed = torch.arange(idx.size(-1)).view(1, 1, 1, -1) < count
        if bool(((idx < 0) | (idx >= kvb))[listed].any()):
            raise ValueError(f"from_kv_blocks: a listed key block is outside 0 .. {kvb - 1}")
        rows = keep.view(-1, kvb)
        flat_idx = idx.reshape(-1, idx.size(-1)).long()
        flat_listed = listed.reshape(-1, idx.size(-1))
        for r in range(rows.size(0)):
            rows[r, flat_idx[r][flat_listed[r]]] = True
    return keep


def _from_bool(ctx, keep, block_size, mask_mod, description):
    """A BlockMask of the (B, H, T, S) bool tensor keep (broadcast dims read
    with stride 0)."""
    B, H, T, S = keep.shape
    keep = keep.to(torch.bool)
    if keep.stride(-1) not in (0, 1):
        keep = keep.contiguous()
    strides = (c_size_t * 4)(*[0 if keep.size(d) == 1 else keep.stride(d) for d in range(4)])
    cfg = BlockMaskConfig(batch=B, heads=H, q_len=T, kv_len=S, block_q=block_size[0],
                          block_kv=block_size[1])
    out = c_void_p()
    ctx.check(lib.attn_block_mask_from_bool(
        ctx.handle, ctypes.byref(cfg), ctypes.cast(keep.data_ptr(), POINTER(ctypes.c_uint8)),
        strides, ctypes.byref(out)), "attn_block_mask_from_bool")
    return BlockMask(out, (B, H, T, S), block_size, mask_mod, description)


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128,
                      _compile=False, separate_full_blocks=True, compute_dq_write_order=False,
                      dq_kv_order=True):
    """The BlockMask of mask_mod(b, h, q_idx, kv_idx) -> bool for (B, H,
    Q_LEN, KV_LEN) (B, H None: 1, one map for every sequence / head; a call
    of more runs it as BlockMask._for_call says), as
    torch.nn.attention.flex_attention.create_block_mask. A mask_mod attn
    recognises becomes its closed-form description (no (Q_LEN, KV_LEN)
    mask is built); any other is evaluated once on the index grid. device
    None is the CPU; separate_full_blocks, compute_dq_write_order and
    dq_kv_order arrange PyTorch's GPU kernels' reads and change no result:
    attn's maps always keep full blocks apart."""
    if not callable(mask_mod):
        raise TypeError(f"create_block_mask: mask_mod must be callable, got {mask_mod!r}")
    if device is not None and str(torch.device(device).type) != "cpu":
        raise ValueError(f"create_block_mask: attn runs on the CPU, not {device}")
    B, H = _dims("B", B), _dims("H", H)
    T, S = _dims("Q_LEN", Q_LEN, None), _dims("KV_LEN", KV_LEN, None)
    if T is None or S is None:
        raise ValueError("create_block_mask: Q_LEN and KV_LEN are needed")
    if T > 2**32 - 1 or S > 2**32 - 1:  # the library's block indices; checked before the grid
        raise ValueError(f"create_block_mask: Q_LEN ({T}) and KV_LEN ({S}) must be at most "
                         f"2^32 - 1")
    block_size = _block_sizes(BLOCK_SIZE)
    return _block_mask_of(_trace_mask(mask_mod), mask_mod, B, H, T, S, block_size)


def _block_mask_of(description, mask_mod, B, H, T, S, block_size):
    """The BlockMask of a traced description (None: mask_mod evaluated on
    the index grid)."""
    g = _Grid(B, H, T, S)
    ctx = _attn_torch()._context()
    if _lowers(description):
        cfg = BlockMaskConfig(batch=B, heads=H, q_len=T, kv_len=S, block_q=block_size[0],
                              block_kv=block_size[1])
        mask = description.lower(ctx, g)
        try:
            out = c_void_p()
            ctx.check(lib.attn_block_mask_from_mask(ctx.handle, ctypes.byref(cfg), mask,
                                                    ctypes.byref(out)),
                      "attn_block_mask_from_mask")
        finally:
            lib.attn_mask_free(mask)
        return BlockMask(out, (B, H, T, S), block_size, mask_mod, description)
    if description is not None:  # past the tree limits, or a libattn without masks: drawn
        keep = description.evaluate(g).expand(B, H, T, S)
    else:
        keep = _dense_mask(mask_mod, g)
    return _from_bool(ctx, keep, block_size, mask_mod, description)


def _with_where(block_mask, where, score_mod, B, H, T, S):
    """The block map of a call whose score_mod ends in where(mask, score,
    -inf): block_mask (None: every key) and that mask, for the call's (B,
    H, T, S). A block_mask that still broadcasts over the batch or the
    heads here has a mask_mod that reads neither (BlockMask._for_call), so
    that its description serves every b (h)."""
    if where is None:  # the score_mod's own -inf over the index grid
        g = _Grid(B, H, T, S)
        r = _on_grid("flex_attention", "score_mod", score_mod,
                     (torch.zeros((), dtype=torch.float64), g.b, g.h, g.q, g.kv), g)
        drawn = (r != -math.inf).expand(B, H, T, S)
        if block_mask is None:
            return _from_bool(_attn_torch()._context(), drawn, _block_sizes(128), None, None)
        where = _Drawn(drawn)
    if block_mask is None:
        return _block_mask_of(where, None, B, H, T, S, _block_sizes(128))
    mB, mH = block_mask.shape[:2]
    if block_mask._listed is None and block_mask.description is None and \
            block_mask.mask_mod is None:
        name = getattr(score_mod, "__name__", repr(score_mod))
        raise ValueError(f"flex_attention: the score_mod {name!r} masks scores with "
                         "torch.where and block_mask has no mask to join it with: write the "
                         "condition in a mask_mod")
    if block_mask._listed is None and block_mask.description is not None and \
            not isinstance(where, _Drawn):
        return _block_mask_of(_And(block_mask.description, where), None, B, H, T, S,
                              block_mask.BLOCK_SIZE)
    mine = _Grid(mB, mH, T, S)
    if block_mask._listed is not None:  # from_kv_blocks: its lists choose the blocks
        keep = block_mask._listed()
    elif block_mask.description is not None:
        keep = block_mask.description.evaluate(mine)
    else:
        keep = _dense_mask(block_mask.mask_mod, mine, "flex_attention")
    keep = keep.expand(mB, mH, T, S).expand(B, H, T, S) & \
        where.evaluate(_Grid(B, H, T, S)).expand(B, H, T, S)
    return _from_bool(_attn_torch()._context(), keep, block_mask.BLOCK_SIZE, None, None)


class _Drawn(_Mask):
    """A mask given as its (B, H, T, S) bool tensor."""

    def __init__(self, keep):
        self.keep = keep

    def __repr__(self):
        return "drawn"

    def evaluate(self, g):
        return self.keep


def _head_factors(query, mods, head_axis, H, who):
    """The chain's per-head factors (head_factor mods, which come before any
    other modifier but scales) taken into the query: (q . k * scale) * f[h]
    is (q * f[h]) . k * scale, and PyTorch's autograd then gives the query
    and a captured f their gradients. Returns the query and the other mods."""
    rest = []
    for m in mods:
        if m["kind"] != "head_factor":
            rest.append(m)
            continue
        t = m["t"]
        if t.device.type != "cpu":
            raise ValueError(f"{who}: attn runs on the CPU; a score_mod's captured tensor of "
                             f"shape {tuple(t.shape)} is on {t.device}")
        if t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{who}: a score_mod multiplies the score by a captured tensor of "
                            f"shape {tuple(t.shape)} and dtype {t.dtype}")
        if t.numel() < H:  # f[h] for h < H, as PyTorch's indexing reads it
            raise IndexError(f"{who}: the score_mod reads head {H - 1} of a captured tensor "
                             f"of shape {tuple(t.shape)}: out of range, as PyTorch's indexing "
                             "would be")
        shape = [1] * query.dim()
        shape[head_axis] = H
        f = t.reshape(-1)[:H].to(query.dtype).view(shape)
        query = query / f if m["divide"] else query * f
    return query, rest


def create_mask(mod_fn, B, H, Q_LEN, KV_LEN, device=None):
    """The dense bool mask (B, H, Q_LEN, KV_LEN) of a mask_mod (b, h, q_idx,
    kv_idx), or of a score_mod (score, b, h, q_idx, kv_idx): where it does
    not give -inf for a score of 0, as PyTorch's create_mask. B, H None: 1."""
    if not callable(mod_fn):
        raise TypeError(f"create_mask: mod_fn must be callable, got {mod_fn!r}")
    if device is not None and str(torch.device(device).type) != "cpu":
        raise ValueError(f"create_mask: attn runs on the CPU, not {device}")
    # zero sizes give an empty mask, as PyTorch's aranges do
    B, H = (_dims(n, v, 1, "create_mask", 0) for n, v in (("B", B), ("H", H)))
    T, S = (_dims(n, v, None, "create_mask", 0) for n, v in (("Q_LEN", Q_LEN),
                                                              ("KV_LEN", KV_LEN)))
    if T is None or S is None:
        raise ValueError("create_mask: Q_LEN and KV_LEN are needed")
    g = _Grid(B, H, T, S)
    try:
        params = [p for p in inspect.signature(mod_fn).parameters.values()
                  if p.default is inspect.Parameter.empty and
                  p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) == 5:  # a score_mod
        r = _on_grid("create_mask", "score_mod", mod_fn,
                     (torch.zeros(B, H, T, S), g.b, g.h, g.q, g.kv), g)
        return ~torch.isneginf(r).expand(B, H, T, S)
    return _dense_mask(mod_fn, g, "create_mask").clone()


# ---- flex_attention ---------------------------------------------------------------------


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None):
    """torch.nn.attention.flex_attention.flex_attention on attn's CPU kernels.

    query (B, H, T, D), key (B, H_kv, S, D), value (B, H_kv, S, Dv) ->
    out (B, H, T, Dv), and with return_lse (out, lse (B, H, T), natural
    log, query's dtype; a loss may read it: its gradient flows back).
    score_mod(score, b, h, q_idx, kv_idx) changes each score
    q . k * scale (None: 1 / sqrt(D)); block_mask (create_block_mask) says
    which keys each query sees. enable_gqa: H_kv divides H. float32 runs
    the fused kernels, float64 the reference ones (gradcheck). A query
    that sees no key gives zeros and lse -inf. return_aux=AuxRequest(lse=True)
    returns (out, AuxOutput(lse=lse)) as PyTorch's (max_scores: not kept by
    attn's kernels, NotImplementedError); kernel_options, which tune
    PyTorch's generated kernels, are taken and change nothing here."""
    if kernel_options is not None and not isinstance(kernel_options, Mapping):
        raise TypeError(f"flex_attention: kernel_options must be a dict, got "
                        f"{type(kernel_options).__name__}")
    if return_aux is not None:
        if return_lse:
            raise ValueError("flex_attention: cannot specify both return_lse and return_aux "
                             "(return_aux=AuxRequest(lse=True) replaces return_lse)")
        if not hasattr(return_aux, "lse") or not hasattr(return_aux, "max_scores"):
            raise TypeError(f"flex_attention: return_aux must be an AuxRequest, got "
                            f"{type(return_aux).__name__}")
        if return_aux.max_scores:
            raise NotImplementedError("flex_attention: return_aux max_scores: attn's kernels "
                                      "keep each row's logsumexp, not its largest score")
        out = flex_attention(query, key, value, score_mod, block_mask, scale, enable_gqa,
                             bool(return_aux.lse), kernel_options)
        return (out[0], AuxOutput(lse=out[1])) if return_aux.lse else (out, AuxOutput())
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"flex_attention: {name} must be a 4-D (B, H, T, D) tensor")
        if t.device.type != "cpu":
            raise ValueError(f"flex_attention: attn runs on the CPU; {name} is on {t.device}")
    if not (query.dtype == key.dtype == value.dtype) or \
            query.dtype not in (torch.float32, torch.float64):
        raise ValueError(f"flex_attention: query, key, value must all be float32 (or float64), "
                         f"got {query.dtype}, {key.dtype}, {value.dtype}")
    B, H, T, D = query.shape
    if key.size(0) != B or value.size(0) != B or key.size(3) != D or \
            key.shape[:3] != value.shape[:3]:
        raise ValueError(f"flex_attention: shapes query {tuple(query.shape)}, key "
                         f"{tuple(key.shape)}, value {tuple(value.shape)} do not match")
    if key.size(1) != H and (not enable_gqa or key.size(1) == 0 or H % key.size(1)):
        raise ValueError(f"flex_attention: key has {key.size(1)} heads and query {H}: "
                         "enable_gqa=True with H_kv dividing H")
    S = key.size(2)
    if block_mask is not None:
        if not isinstance(block_mask, BlockMask):
            raise TypeError("flex_attention: block_mask must be a BlockMask (create_block_mask)")
        mB, mH, mT, mS = block_mask.shape
        if mB not in (1, B) or mH not in (1, H) or (mT, mS) != (T, S):
            raise ValueError(f"flex_attention: block_mask of shape {block_mask.shape} for a "
                             f"call of (B, H, Q_LEN, KV_LEN) = ({B}, {H}, {T}, {S})")
    if scale is not None:
        try:
            scale = float(scale)
        except (TypeError, ValueError):
            raise TypeError(f"flex_attention: scale must be a number, got {scale!r}") from None
        # refused here as an argument out of range, before the library would
        # refuse it with a RuntimeError naming one of its own calls
        problem = _attn_torch()._scale_problem(scale)
        if problem is not None:
            raise ValueError(f"flex_attention: {problem}")
    if D == 0:
        raise ValueError(f"flex_attention: query {tuple(query.shape)} has head dimension 0")
    if 0 in (B, H, T, S, value.size(3)):
        # nothing to attend, or nothing to attend to: a query that sees no
        # key gives zeros and lse -inf (attn's rule); tied to the inputs so
        # that their gradients (zeros) come back as PyTorch's would
        tie = query.flatten()[:0].sum() + key.flatten()[:0].sum() + value.flatten()[:0].sum()
        out = query.new_zeros(B, H, T, value.size(3)) + tie
        if return_lse:
            return out, torch.full((B, H, T), -math.inf, dtype=query.dtype) + tie
        return out
    if block_mask is not None:
        block_mask = block_mask._for_call(B, H)
    chain = None
    if score_mod is not None:
        mods = _trace_score(score_mod)
        query, mods = _head_factors(query, mods, 1, H, "flex_attention")
        where = [m["mask"] for m in mods if m["kind"] == "mask"]
        mods = [m for m in mods if m["kind"] != "mask"]
        chain = _Chain(mods, B, H, T, S) if mods else None  # "return score": no chain
        if where:
            block_mask = _with_where(block_mask, where[0], score_mod, B, H, T, S)
    at = _attn_torch()
    if (block_mask is not None or chain is not None) and not at._runs_block_maps():
        raise AttnError("ATTN_ERR_UNSUPPORTED",
                        f"flex_attention: this libattn ({_lib.path}) runs no attention with a "
                        "block map and score modifiers (no flex backend)")
    spec = at._Spec("bhtd", scale=scale, block_mask=block_mask, chain=chain)
    out, lse = at._attend(spec, query, key, value, return_lse=True)
    return (out, lse) if return_lse else out
