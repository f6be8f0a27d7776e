"""safetensors files through libattn: dicts of NumPy float32 arrays, like
safetensors.numpy's save_file / load_file (F16, BF16 and F64 tensors load
as float32)."""
import ctypes
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from ._args import as_float32
from ._lib import (F32P, MAX_DIMS, Context, MetadataEntry, NamedTensor, SafetensorsInfo,
                   encode_path, lib)


def save_file(tensors, path, metadata=None):
    """Writes a dict name -> array (converted to float32) to path. Names and
    metadata keys are str; metadata values str (others are written as
    str(value))."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"save_file: tensors must be a dict of name -> array, got "
                        f"{type(tensors).__name__}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"save_file: metadata must be a dict of str -> str, got "
                        f"{type(metadata).__name__}")
    path = encode_path("save_file: path", path)
    ctx = Context()
    keep = []
    items = list(tensors.items())
    # C reads names as NUL-terminated strings: a NUL inside would cut them
    for what, names in (("tensor names", [n for n, _ in items]),
                        ("metadata keys", list(metadata or {})),
                        ("metadata values", [str(v) for v in (metadata or {}).values()])):
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"save_file: {what} are str, got {name!r}")
            if "\0" in name:
                raise ValueError(f"save_file: {what} must not hold a NUL character: {name!r}")
    arr = (NamedTensor * max(1, len(items)))()
    for i, (name, value) in enumerate(items):
        try:
            a = np.asarray(value)
            if a.dtype.kind not in "fiub":
                raise TypeError(f"dtype {a.dtype}")
        except (TypeError, ValueError) as err:
            raise TypeError(f"save_file: tensor '{name}' is not an array of numbers "
                            f"({err})") from None
        a = np.require(as_float32(f"save_file: tensor '{name}'", a), requirements='C')
        if a.ndim > MAX_DIMS:
            raise ValueError(f"save_file: tensor '{name}' has {a.ndim} dimensions, at most "
                             f"{MAX_DIMS}")
        keep.append(a)
        arr[i].name = name.encode()
        arr[i].data = a.ctypes.data_as(F32P)
        arr[i].ndim = a.ndim
        for d, size in enumerate(a.shape):
            arr[i].shape[d] = size
    meta = list((metadata or {}).items())
    marr = (MetadataEntry * max(1, len(meta)))()
    for i, (k, v) in enumerate(meta):
        marr[i].key, marr[i].value = str(k).encode(), str(v).encode()
    ctx.check(lib.attn_safetensors_write(ctx.handle, path, arr, len(items), marr,
                                         len(meta)))


def load_file(path, with_metadata=False):
    """Reads every tensor of path as a float32 array, in data order. With
    with_metadata, returns (tensors, metadata)."""
    path = encode_path("load_file: path", path)
    ctx = Context()
    st = ctypes.c_void_p()
    ctx.check(lib.attn_safetensors_open(ctx.handle, path, ctypes.byref(st)))
    try:
        out = OrderedDict()
        for i in range(lib.attn_safetensors_count(st)):
            info = SafetensorsInfo()
            ctx.check(lib.attn_safetensors_info_at(st, i, ctypes.byref(info)))
            shape = tuple(info.shape[:info.ndim])
            try:
                a = np.empty(shape, dtype=np.float32)
            except ValueError as e:  # a dimension NumPy cannot hold, even with 0 elements
                raise ValueError(f"load_file: {path.decode(errors='replace')}: tensor "
                                 f"'{info.name.decode(errors='replace')}' of shape {shape}: "
                                 f"{e}") from None
            ctx.check(lib.attn_safetensors_load(st, info.index, a.ctypes.data_as(F32P),
                                                info.numel))
            out[info.name.decode()] = a
        meta = {}
        for i in range(lib.attn_safetensors_metadata_count(st)):
            e = MetadataEntry()
            ctx.check(lib.attn_safetensors_metadata_at(st, i, ctypes.byref(e)))
            meta[e.key.decode()] = e.value.decode()
    finally:
        lib.attn_safetensors_free(st)
    return (out, meta) if with_metadata else out
