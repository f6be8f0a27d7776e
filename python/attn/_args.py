"""The package's argument converters: every integer, id array and number
the package hands to C goes through one of these, so a value C's type
cannot hold (a negative count for a size_t, an id past int32, a float where
an integer belongs) is refused here with the argument's name and value,
never wrapped or truncated on its way through ctypes.

TypeError: the value is not of the kind the argument takes (a float or a
bool for an integer, a string for a number). ValueError: the kind is right
and the value is out of range.
"""
import math
import operator

import numpy as np

SIZE_MAX = 2**64 - 1        # size_t
INT32_MAX = 2**31 - 1       # int32_t: token ids, varlen offsets
INT64_MAX = 2**63 - 1       # long long
# counts whose element arrays Python allocates: past this numpy cannot
COUNT_MAX = INT64_MAX


def show(value):
    """value for a message: short, with its type where the repr hides it."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _bound(n):
    """n for a message: the C types' limits as powers of two."""
    for bits in (64, 63, 62, 31):
        if n == 2**bits - 1:
            return f"2**{bits} - 1"
        if n == -2**bits:
            return f"-2**{bits}"
        if n == 2**bits:
            return f"2**{bits}"
    return str(n)


def as_index(name, value, lo=0, hi=COUNT_MAX):
    """value as a Python int in [lo, hi]. Takes int, NumPy integers and
    0-d integer arrays/tensors (anything with __index__); a bool, a float
    (even 3.0) or a string is a TypeError."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected an integer, got {show(value)}")
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {show(value)}") from None
    if not lo <= n <= hi:
        raise ValueError(f"{name}: {n} is out of range; expected an integer in "
                         f"[{_bound(lo)}, {_bound(hi)}]")
    return n


def as_optional_index(name, value, lo=0, hi=COUNT_MAX):
    """None stays None; anything else as as_index."""
    return None if value is None else as_index(name, value, lo, hi)


def as_number(name, value, lo=-math.inf, hi=math.inf, lo_open=False, hi_open=False,
              finite=True):
    """value as a Python float in the interval lo .. hi (each end closed
    unless *_open). Takes int, float, NumPy scalars and 0-d arrays/tensors;
    a bool or a string is a TypeError, NaN a ValueError."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        raise TypeError(f"{name}: expected a number, got {show(value)}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a number, got {show(value)}") from None
    below = x <= lo if lo_open else x < lo
    above = x >= hi if hi_open else x > hi
    if math.isnan(x) or (finite and math.isinf(x)) or below or above:
        # an infinite end that finite refuses is open, whatever *_open says
        left = "(" if lo_open or (finite and math.isinf(lo)) else "["
        right = ")" if hi_open or (finite and math.isinf(hi)) else "]"
        what = "a finite number" if finite else "a number"
        raise ValueError(f"{name}: {x!r} is out of range; expected {what} in "
                         f"{left}{lo}, {hi}{right}")
    return x


def library_scale(scale):
    """scale (a float, or None for the default 1/sqrt(head_dim)) as the
    library's scale field, where 0 means that default. A zero scale
    (PyTorch's scale=0.0: every score 0, uniform weights) goes as the
    smallest positive double, which the kernels' float32 rounds to 0."""
    if scale is None:
        return 0.0
    return scale if scale != 0.0 else 5e-324


def as_ids(name, ids, lo=0, hi=INT32_MAX, ndim=1):
    """ids as a C-contiguous int32 array of ndim dimensions (1: a sequence,
    2: (batch, n)), each in [lo, hi]. Lists of ints, integer arrays and
    integer tensors are taken; floats, bools and strings are a TypeError,
    a wrong rank or a value out of range (named with its position) a
    ValueError."""
    if isinstance(ids, (str, bytes, bytearray)):
        raise TypeError(f"{name}: expected integer token ids, got {show(ids)}")
    if hasattr(ids, "detach") and hasattr(ids, "numpy"):  # a torch tensor
        ids = ids.detach().cpu().numpy()
    try:
        a = np.asarray(ids)
    except (ValueError, OverflowError) as err:  # ragged lists, ints past int64
        a = None
        why = err
    if a is not None and a.dtype.kind == "f" and not isinstance(ids, np.ndarray) and \
            all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                for v in _flatten(ids)):
        a = a.astype(object)  # ints NumPy could not hold as one integer type ([2**63, 1])
    if a is None or a.dtype == object:
        # Python ints past int64, or mixed: check one by one, by value
        flat = _flatten(ids)
        values = [as_index(f"{name}[{i}]", v, lo, hi) for i, v in enumerate(flat)]
        # an object array holding lists or arrays: ragged, whatever its count
        nested = a is not None and any(isinstance(e, (list, tuple, np.ndarray)) for e in a.flat)
        if nested:
            a, why = None, f"an array of shape {a.shape} holding sequences"
        if a is None:
            raise ValueError(f"{name}: not a rectangular array of ids ({why})")
        a = np.asarray(values, dtype=np.int64).reshape(a.shape)
    if a.size == 0 and a.dtype == np.float64 and not isinstance(ids, np.ndarray):
        a = a.astype(np.int64)  # [] and [[]] are empty lists, not floats
    if a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name}: expected integer token ids, got dtype {a.dtype}")
    if a.ndim != ndim:
        want = "a 1-D sequence" if ndim == 1 else f"a {ndim}-D array"
        raise ValueError(f"{name}: expected {want} of token ids, got shape {a.shape}")
    if a.size:
        bad = np.flatnonzero((a.reshape(-1) < lo) | (a.reshape(-1) > hi))
        if bad.size:
            at = np.unravel_index(int(bad[0]), a.shape)
            where = ", ".join(str(int(i)) for i in at)
            raise ValueError(f"{name}[{where}] = {int(a[at])} is out of range; token ids are "
                             f"integers in [{_bound(lo)}, {_bound(hi)}]")
    return np.ascontiguousarray(a, dtype=np.int32)


def _flatten(seq):
    if isinstance(seq, np.ndarray):  # an object array: its Python objects, nested
        seq = seq.tolist()
    if isinstance(seq, (list, tuple)):
        out = []
        for s in seq:
            out.extend(_flatten(s))
        return out
    return [seq]


def as_flag(name, value):
    """value as a bool when it is True or False (NumPy's too) or the int 0
    or 1; anything else is a TypeError: bool() would read the string
    "False", or any nonzero number, as True."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, (int, np.integer))
                                               and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name}: expected True or False, got {value!r}")


def as_str(name, value):
    """value when it is a str, else a TypeError naming what it is."""
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected a str, got {show(value)}")
    return value


def as_utf8(name, value):
    """The UTF-8 bytes of value, a str (TypeError otherwise); a lone
    surrogate, which no UTF-8 text holds, is a ValueError naming its index
    and code point."""
    value = as_str(name, value)
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(f"{name}: character {err.start} is a lone surrogate "
                         f"(U+{ord(value[err.start]):04X}), which UTF-8 cannot encode") from None


def as_choice(name, value, choices):
    """value when it is one of choices (a dict or sequence of names)."""
    try:
        ok = value in choices
    except TypeError:  # an unhashable value
        ok = False
    if not ok:
        raise ValueError(f"{name}: expected one of {', '.join(map(str, choices))}, got "
                         f"{value!r}")
    return value


def as_float32(name, a):
    """a (an array of real numbers) as float32, refusing a finite value that
    float32 cannot hold: astype would make it an infinity, and a later check
    (or every output, NaN) would name a value the caller never gave. The
    ValueError names the element and its value."""
    a = np.asarray(a)
    f = a.astype(np.float32) if a.dtype != np.float32 else a
    if a.dtype.kind == "f" and a.dtype.itemsize > 4 and a.size:
        past = np.isinf(f) & np.isfinite(a)
        if past.any():
            at = np.unravel_index(int(np.argmax(past)), a.shape)
            raise ValueError(f"{name}: element {tuple(int(i) for i in at)} "
                             f"({float(a[at]):g}) is beyond float32's range")
    return f
