"""The seeds' seven attention modules and the book's three chapter-4 ones
(GroupedQueryAttention, MultiHeadLatentAttention, MultiHeadAttentionWithSWA)
with PyTorch-like constructors, and the default generator (torch.manual_seed
and friends).

Threads: a module runs one call at a time; calls from several threads on
the same module wait for each other (a lock per module), and so do draws
from the default generator (construction, dropout, rand, manual_seed).
Different modules run in parallel: the C library lets the GIL go."""
import ctypes
import functools
import os
from collections import OrderedDict

import numpy as np

from . import _lib
from ._args import SIZE_MAX, as_choice, as_float32, as_index, as_number, library_scale
from ._lib import (F32P, AttnError, Context, HandleOwner, ModuleConfig, Param, encode_path,
                   lib)

_MASKS = {"neg-inf": 0, "renormalize": 1, "none": 2}
_BERNOULLI = {"mt19937": 0, "mkl": 1, "philox": 2}
_num_threads = min(os.cpu_count() or 1, _lib.MAX_THREADS)


class _Generator(HandleOwner):
    """PyTorch's default CPU generator: seeds construction and dropout."""

    def __init__(self, seed):
        seed = as_index("seed", seed, 0, 2**64 - 1)
        self.ctx = Context()
        self.lock = self.ctx.lock
        self.handle = ctypes.c_void_p()
        self.ctx.check(lib.attn_rng_new(self.ctx.handle, seed, ctypes.byref(self.handle)))

    def __del__(self):
        # at interpreter exit the module's lib may be gone before this runs
        if getattr(self, "handle", None) and lib is not None:
            lib.attn_rng_free(self.handle)
            self.handle = None


# torch's default generator starts from seed 67280421310721; manual_seed resets it.
default_generator = _Generator(67280421310721)


def manual_seed(seed):
    """torch.manual_seed(seed): module weights and dropout masks drawn after it
    equal PyTorch's."""
    seed = as_index("manual_seed: seed", seed, 0, 2**64 - 1)
    with default_generator.lock:
        default_generator.ctx.check(lib.attn_rng_manual_seed(default_generator.handle, seed))


def set_bernoulli(method):
    """Dropout draws as PyTorch builds without MKL make them ("mt19937", the
    default), as builds with MKL on Intel CPUs ("mkl"), or Philox4x32-10
    ("philox", see attn.h)."""
    as_choice("set_bernoulli", method, _BERNOULLI)
    with default_generator.lock:
        default_generator.ctx.check(
            lib.attn_rng_set_bernoulli_method(default_generator.handle, _BERNOULLI[method]))


def set_num_threads(n):
    """Threads used by modules created from now on (torch.set_num_threads)."""
    global _num_threads
    _num_threads = as_index("set_num_threads: n", n, 1, _lib.MAX_THREADS)


def get_num_threads():
    return _num_threads


def _draw(fn, size):
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    shape = tuple(as_index(f"size[{i}]", n) for i, n in enumerate(shape))
    out = np.empty(shape, dtype=np.float32)
    with default_generator.lock:
        default_generator.ctx.check(fn(default_generator.handle, out.ctypes.data_as(F32P),
                                       out.size))
    return out


def rand(*size):
    """torch.rand(*size) from the default generator, bit for bit."""
    return _draw(lib.attn_rng_rand, size)


def randn(*size):
    """torch.randn(*size) from the default generator (see the README's
    exactness notes)."""
    return _draw(lib.attn_rng_randn, size)


def _scale(scale):
    """The modules' scale= as the library's field: any finite number, as
    PyTorch's scaled_dot_product_attention and attn.functional take it (0
    a zero scale: uniform weights); None the default 1/sqrt(head_dim)."""
    return library_scale(None if scale is None else as_number("scale", scale))


def _locked(method):
    """method run holding the module's lock: one call at a time per module
    (its ctx, its last forward and its gradients are the module's own)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return run


def _mask(mask):
    return _MASKS[as_choice("mask", mask, _MASKS)]


class Module(HandleOwner):
    """What every module shares: forward (NumPy in, NumPy out), train/eval,
    state_dict / load_state_dict, backward and gradients, safetensors."""

    _kind = None  # the kind's name in libattn's table of kinds ("mha")
    # the names of the seeds' causal masks, as in torch's state_dict; the mask
    # itself (side x side floats) is made only when a state_dict holds it
    _buffers = ()
    _mask_side, _mask_lower = 0, False

    def _build(self, **fields):
        """Builds the module through attn_module_new from the fields of
        attn_module_config its kind takes; weights come from the default
        generator."""
        checked = {}
        for name, value in fields.items():
            if name == "dropout":
                checked[name] = as_number("dropout", value, 0.0, 1.0)
            elif name == "qkv_bias":
                if not (isinstance(value, (bool, np.bool_)) or (
                        isinstance(value, (int, np.integer)) and value in (0, 1))):
                    raise TypeError(f"qkv_bias: expected True or False, got {value!r}")
                checked[name] = bool(value)
            elif name in ("scale", "mask"):
                checked[name] = value  # _scale and _mask checked them
            else:
                checked[name] = as_index(name, value, 0, SIZE_MAX)
        self._ctx = Context(_num_threads)
        self._lock = self._ctx.lock
        kind = ctypes.c_int()
        self._ctx.check(lib.attn_module_kind_from_name(self._ctx.handle, self._kind.encode(),
                                                       ctypes.byref(kind)))
        handle = ctypes.c_void_p()
        with default_generator.lock:
            self._ctx.check(lib.attn_module_new(self._ctx.handle, kind.value,
                                                ctypes.byref(ModuleConfig(**checked)),
                                                default_generator.handle, ctypes.byref(handle)))
        self._module = handle
        self._last_shape = None

    def __del__(self):
        if getattr(self, "_module", None):
            lib.attn_module_free(self._module)
            self._module = None

    # ---- sizes and mode ----
    @property
    def d_in(self):
        return lib.attn_module_d_in(self._module)

    @property
    def d_out(self):
        return lib.attn_module_d_out(self._module)

    @property
    def training(self):
        return bool(lib.attn_module_training(self._module))

    @_locked
    def train(self, mode=True):
        """module.train(): dropout draws from the default generator. mode is a
        bool, as PyTorch's: bool("False") would turn dropout on."""
        if not isinstance(mode, (bool, np.bool_)):
            raise ValueError(f"train: training mode is expected to be boolean, got {mode!r}")
        self._ctx.check(lib.attn_module_set_training(self._module, bool(mode)))
        return self

    def eval(self):
        return self.train(False)

    def num_parameters(self):
        return lib.attn_module_num_scalars(self._module)

    def __repr__(self):
        return f"{type(self).__name__}(d_in={self.d_in}, d_out={self.d_out})"

    # ---- forward and backward ----
    def forward(self, x):
        """y = module(x) for x (B, T, d_in) or (T, d_in); y has the same rank."""
        x = self._real("x", x)
        if x.ndim not in (2, 3):
            raise ValueError(f"{type(self).__name__}: expected x of shape (B, T, d_in) or "
                             f"(T, d_in), got {x.shape}")
        if x.shape[-1] != self.d_in:
            # the library knows rows only by d_in: a wider x would be misread
            raise ValueError(f"{type(self).__name__}: x has {x.shape[-1]} features in its last "
                             f"dimension (shape {x.shape}), the module's d_in is {self.d_in}")
        batch, tokens = (x.shape[0], x.shape[1]) if x.ndim == 3 else (1, x.shape[0])
        y = np.empty((batch, tokens, self.d_out), dtype=np.float32)
        # dropout draws from the default generator: its lock too, taken
        # after the module's (the order every caller keeps)
        with self._lock, default_generator.lock:
            self._ctx.check(lib.attn_module_forward(self._module, x.ctypes.data_as(F32P), batch,
                                                    tokens, y.ctypes.data_as(F32P),
                                                    default_generator.handle))
            self._last_shape = x.shape
        return y if x.ndim == 3 else y[0]

    __call__ = forward

    def _real(self, name, x):
        """x as a contiguous float32 array; refused unless it holds real numbers
        (None would become NaN, strings be parsed, complex values lose their
        imaginary parts)."""
        a = np.asarray(x)
        if a.dtype.kind not in "fiu":
            raise TypeError(f"{type(self).__name__}: {name} must hold real numbers, got dtype "
                            f"{a.dtype}")
        return np.ascontiguousarray(as_float32(f"{type(self).__name__}: {name}", a))

    def _need_training(self, what):
        if not _lib.has("attn_module_backward"):
            raise NotImplementedError(f"{what}: this libattn ({_lib.path}) has no backward")

    @_locked
    def backward(self, dy):
        """The backward of the last forward: dy = dL/dy of y's shape; returns
        dL/dx and adds every parameter's dL/dW to its gradient (grads()).
        With threads: the last forward is the module's, whichever thread ran
        it, so run a forward and its backward in one thread."""
        self._need_training("backward")
        if self._last_shape is None:
            raise RuntimeError(f"{type(self).__name__}.backward: no forward to differentiate")
        dy = self._real("dy", dy)
        shape = self._last_shape
        batch, tokens = (shape[0], shape[1]) if len(shape) == 3 else (1, shape[0])
        want = shape[:-1] + (self.d_out,)
        if dy.shape != want:
            raise ValueError(f"{type(self).__name__}.backward: dy has shape {dy.shape}, "
                             f"the last forward's output has {want}")
        dx = np.empty(shape, dtype=np.float32)
        self._ctx.check(lib.attn_module_backward(self._module, dy.ctypes.data_as(F32P), batch,
                                                 tokens, dx.ctypes.data_as(F32P)))
        return dx

    @_locked
    def zero_grad(self):
        self._need_training("zero_grad")
        self._ctx.check(lib.attn_module_zero_grad(self._module))

    @_locked
    def set_grad_enabled(self, enabled):
        self._need_training("set_grad_enabled")
        if not isinstance(enabled, (bool, np.bool_)):  # as torch.set_grad_enabled
            raise TypeError(f"set_grad_enabled: enabled must be bool, got {enabled!r}")
        self._ctx.check(lib.attn_module_set_grad_enabled(self._module, bool(enabled)))

    # ---- parameters ----
    def _params(self):
        for i in range(lib.attn_module_param_count(self._module)):
            p = Param()
            self._ctx.check(lib.attn_module_param_at(self._module, i, ctypes.byref(p)))
            yield p

    @staticmethod
    def _view(ptr, p):
        shape = tuple(p.shape[:p.ndim])
        return np.ctypeslib.as_array(ptr, shape=shape)

    @_locked
    def state_dict(self):
        """name -> a float32 copy, in PyTorch's order: the parameters and the
        seeds' causal-mask buffers ("mask", "heads.N.mask", GPT-2's "bias"),
        each buffer before its module's parameters, as torch lists them."""
        params = [(p.name.decode(), self._view(p.data, p).copy()) for p in self._params()]
        out = OrderedDict()
        pending = list(self._buffers)
        mask = self._mask() if pending else None
        for name, value in params:
            for b in list(pending):
                owner = b.rpartition(".")[0]
                if not owner or name.startswith(owner + "."):
                    out[b] = mask.copy()
                    pending.remove(b)
            out[name] = value
        for name in pending:
            out[name] = mask.copy()
        return out

    def _set_mask_buffers(self, names, side, lower):
        self._buffers = tuple(names)
        self._mask_side, self._mask_lower = side, lower

    def _mask(self):
        """The seeds' causal mask: torch.triu(ones, 1) (1 hides), or GPT-2's
        tril(ones) (1, 1, side, side) (1 shows)."""
        side = self._mask_side
        if self._mask_lower:
            return np.tril(np.ones((side, side), np.float32)).reshape(1, 1, side, side)
        return np.triu(np.ones((side, side), np.float32), 1)

    @_locked
    def grads(self):
        """name -> a copy of the parameter's gradient (PyTorch's .grad)."""
        self._need_training("grads")
        return OrderedDict((p.name.decode(), self._view(p.grad, p).copy())
                           for p in self._params() if p.grad)

    @_locked
    def load_state_dict(self, state_dict, strict=True):
        """Copies arrays into the parameters. strict: the keys must match
        exactly (else RuntimeError naming them, as PyTorch); shapes always
        must. Nothing changes unless everything fits. A parameter whose
        values change moves to a new version: the last forward's backward
        is then refused, naming it and its versions (its activations belong
        to the old weights), as PyTorch raises for weights changed in place
        since the forward."""
        params = {p.name.decode(): p for p in self._params()}
        buffers = set(self._buffers)
        missing = [k for k in params if k not in state_dict]
        unexpected = [k for k in state_dict if k not in params and k not in buffers]
        mask = None
        for k in self._buffers:  # optional, but when given, the mask
            if k in state_dict:
                mask = self._mask() if mask is None else mask
                if not np.array_equal(np.asarray(state_dict[k]), mask):
                    raise RuntimeError(f"{k}: not the causal mask of this "
                                       f"{type(self).__name__} (shape {mask.shape})")
        if strict and (missing or unexpected):
            parts = []
            if missing:
                parts.append("Missing key(s): " + ", ".join(f'"{k}"' for k in missing))
            if unexpected:
                parts.append("Unexpected key(s): " + ", ".join(f'"{k}"' for k in unexpected))
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}: "
                               + ". ".join(parts))
        staged = {}
        for name, p in params.items():
            if name not in state_dict:
                continue
            value = np.asarray(state_dict[name])
            if value.dtype.kind not in "fiu":
                raise TypeError(f"{name}: must hold real numbers, got dtype {value.dtype}")
            value = as_float32(name, value)
            want = tuple(p.shape[:p.ndim])
            if value.shape != want:
                raise RuntimeError(f"size mismatch for {name}: copying a param with shape "
                                   f"{value.shape}, the shape in the current model is {want}")
            staged[name] = value
        for name, value in staged.items():
            np.copyto(self._view(params[name].data, params[name]), value)
        return self

    # ---- safetensors ----
    @_locked
    def save(self, path):
        """Writes the parameters to a safetensors file under their state_dict
        names (what safetensors.torch.save_file(module.state_dict()) writes)."""
        self._ctx.check(lib.attn_safetensors_save_module(self._ctx.handle, self._module,
                                                         encode_path("save: path", path)))

    @_locked
    def load(self, path, prefix=None):
        """Loads the parameters from a safetensors file: every parameter must be
        there with its shape, and nothing else (under prefix, when given)."""
        if prefix is not None and not isinstance(prefix, str):
            raise TypeError(f"load: prefix is a str, got {prefix!r}")
        if prefix and "\0" in prefix:
            raise ValueError(f"load: prefix must not hold a NUL character: {prefix!r}")
        self._ctx.check(lib.attn_safetensors_load_module(
            self._ctx.handle, self._module, encode_path("load: path", path),
            prefix.encode() if prefix else None))
        self._last_shape = None  # the library dropped the last forward too
        return self


class SimpleSelfAttention(Module):
    """The seeds' simplified self-attention: softmax(x x^T) x, no weights."""
    _kind = "simple"

    def __init__(self, d_in):
        self._build(d_in=d_in)


class SelfAttention_v1(Module):
    """SelfAttention_v1(d_in, d_out): x @ W, weights from torch.rand."""
    _kind = "sa1"

    def __init__(self, d_in, d_out, scale=None):
        self._build(d_in=d_in, d_out=d_out, scale=_scale(scale))


class SelfAttention_v2(Module):
    """SelfAttention_v2(d_in, d_out, qkv_bias=False): nn.Linear projections."""
    _kind = "sa2"

    def __init__(self, d_in, d_out, qkv_bias=False, scale=None):
        self._build(d_in=d_in, d_out=d_out, qkv_bias=qkv_bias, scale=_scale(scale))


class CausalAttention(Module):
    """CausalAttention(d_in, d_out, context_length, dropout, qkv_bias=False)."""
    _kind = "causal"

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False, scale=None,
                 mask="neg-inf"):
        self._build(d_in=d_in, d_out=d_out, context_length=context_length, dropout=dropout,
                    qkv_bias=qkv_bias, scale=_scale(scale), mask=_mask(mask))
        self._set_mask_buffers(["mask"], context_length, False)


class MultiHeadAttentionWrapper(Module):
    """MultiHeadAttentionWrapper(d_in, d_out, context_length, dropout, num_heads,
    qkv_bias=False): num_heads CausalAttention heads of width d_out each."""
    _kind = "mha-wrapper"

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False,
                 scale=None, mask="neg-inf"):
        self._build(d_in=d_in, d_out=d_out, context_length=context_length,
                    num_heads=num_heads, dropout=dropout, qkv_bias=qkv_bias,
                    scale=_scale(scale), mask=_mask(mask))
        self._set_mask_buffers([f"heads.{i}.mask" for i in range(num_heads)], context_length,
                               False)


class MultiHeadAttention(Module):
    """MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads,
    qkv_bias=False)."""
    _kind = "mha"

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False,
                 scale=None, mask="neg-inf"):
        self._build(d_in=d_in, d_out=d_out, context_length=context_length,
                    num_heads=num_heads, dropout=dropout, qkv_bias=qkv_bias,
                    scale=_scale(scale), mask=_mask(mask))
        self._set_mask_buffers(["mask"], context_length, False)


class CausalSelfAttention(Module):
    """GPT-2's CausalSelfAttention: CausalSelfAttention(config) with a config
    holding n_embd, n_head, block_size (and optionally dropout), or
    CausalSelfAttention(n_embd, n_head, block_size, dropout=0.0)."""
    _kind = "gpt2"

    def __init__(self, n_embd, n_head=None, block_size=None, dropout=0.0, scale=None):
        if hasattr(n_embd, "n_embd"):
            config = n_embd
            n_embd, n_head = config.n_embd, config.n_head
            block_size = getattr(config, "block_size", None) or getattr(config, "n_positions")
            dropout = getattr(config, "dropout", 0.0)
        if n_head is None or block_size is None:
            raise TypeError("CausalSelfAttention: n_head and block_size are required")
        self._build(d_in=n_embd, num_heads=n_head, context_length=block_size,
                    dropout=dropout, scale=_scale(scale))
        self._set_mask_buffers(["bias"], block_size, True)

    @_locked
    def load_hf(self, path, layer=0):
        """Loads layer `layer`'s attention from a Hugging Face GPT-2
        model.safetensors (Conv1D weights transposed)."""
        self._ctx.check(lib.attn_gpt2_load_hf(self._ctx.handle, self._module,
                                              encode_path("load_hf: path", path),
                                              as_index("layer", layer, 0, SIZE_MAX)))
        self._last_shape = None  # the library dropped the last forward too
        return self

    @_locked
    def save_hf(self, path, layer=0):
        """Writes the module as layer `layer` of a Hugging Face checkpoint."""
        self._ctx.check(lib.attn_gpt2_save_hf(self._ctx.handle, self._module,
                                              encode_path("save_hf: path", path),
                                              as_index("layer", layer, 0, SIZE_MAX)))


def _positive(what, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what}: expected a positive integer, got {value!r}")
    return int(value)


class GroupedQueryAttention(Module):
    """GroupedQueryAttention(d_in, d_out, dropout, num_heads, num_kv_groups,
    qkv_bias=False), the book's ch04/04_gqa without its KV cache: num_kv_groups
    key/value heads, each shared by num_heads / num_kv_groups query heads."""
    _kind = "gqa"

    def __init__(self, d_in, d_out, dropout, num_heads, num_kv_groups, qkv_bias=False,
                 scale=None):
        self._build(d_in=d_in, d_out=d_out, num_heads=num_heads, num_kv_groups=num_kv_groups,
                    dropout=dropout, qkv_bias=qkv_bias, scale=_scale(scale))


class MultiHeadLatentAttention(Module):
    """MultiHeadLatentAttention(d_in, d_out, dropout, num_heads, qkv_bias=False,
    latent_dim=None), the book's ch04/05_mla without its latent cache; latent_dim
    None is the book's max(16, d_out // 8)."""
    _kind = "mla"

    def __init__(self, d_in, d_out, dropout, num_heads, qkv_bias=False, latent_dim=None,
                 scale=None):
        latent = 0 if latent_dim is None else _positive("latent_dim", latent_dim)
        self._build(d_in=d_in, d_out=d_out, num_heads=num_heads, latent_dim=latent,
                    dropout=dropout, qkv_bias=qkv_bias, scale=_scale(scale))


class MultiHeadAttentionWithSWA(Module):
    """MultiHeadAttentionWithSWA(d_in, d_out, dropout, num_heads, qkv_bias=False,
    sliding_window_size=None), the book's ch04/06_swa without its KV cache:
    query i sees keys i - W + 1 .. i; None is plain causal attention."""
    _kind = "swa"

    def __init__(self, d_in, d_out, dropout, num_heads, qkv_bias=False,
                 sliding_window_size=None, scale=None):
        # the class's W = 0 would hide every key (NaN rows); attn's 0 means None
        window = (0 if sliding_window_size is None
                  else _positive("sliding_window_size", sliding_window_size))
        self._build(d_in=d_in, d_out=d_out, num_heads=num_heads, sliding_window_size=window,
                    dropout=dropout, qkv_bias=qkv_bias, scale=_scale(scale))


__all__ = ["AttnError", "Module", "manual_seed", "set_bernoulli", "set_num_threads", "rand",
           "randn"]
