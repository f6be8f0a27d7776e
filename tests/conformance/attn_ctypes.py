"""ctypes bindings for libattn (include/attn.h), used by conformance.py.

    from attn_ctypes import Attn
    lib = Attn("/path/to/libattn.so")
    ctx = lib.ctx_new(num_threads=1)
    rng = lib.rng_new(ctx, seed)
    out = lib.rng_rand(ctx, rng, n)          # numpy float32 array

Every wrapper checks the returned attn_status and raises AttnError with
attn_status_name() and attn_ctx_last_error() on failure. The config structs
mirror attn.h field for field (size_t, double, bool, float, enum -> int).
"""
import ctypes
from ctypes import (POINTER, Structure, c_bool, c_char_p, c_double, c_float, c_int, c_size_t,
                    c_uint8, c_uint32, c_uint64, c_void_p)

import numpy as np

ATTN_OK = 0

ATTN_BERNOULLI_MT19937 = 0
ATTN_BERNOULLI_MKL_MCG31 = 1

ATTN_MASK_NEG_INF = 0
ATTN_MASK_RENORMALIZE = 1
ATTN_MASK_NONE = 2
MASK_NAMES = {ATTN_MASK_NEG_INF: "NEG_INF", ATTN_MASK_RENORMALIZE: "RENORMALIZE",
              ATTN_MASK_NONE: "NONE"}

(ATTN_MODULE_SIMPLE, ATTN_MODULE_SA_V1, ATTN_MODULE_SA_V2, ATTN_MODULE_CAUSAL,
 ATTN_MODULE_MHA_WRAPPER, ATTN_MODULE_MHA, ATTN_MODULE_GPT2) = range(7)

F32P = POINTER(c_float)


class AttnError(RuntimeError):
    pass


# ---- structs, in the field order of attn.h ----

TRACE_FN = ctypes.CFUNCTYPE(None, c_void_p, c_char_p, c_char_p, c_size_t, POINTER(c_size_t),
                            F32P)


(ATTN_KERNELS_AUTO, ATTN_KERNELS_REFERENCE, ATTN_KERNELS_PORTABLE, ATTN_KERNELS_AVX2,
 ATTN_KERNELS_AVX512) = range(5)


class CtxConfig(Structure):
    _fields_ = [("num_threads", c_size_t), ("trace", TRACE_FN), ("trace_user", c_void_p),
                ("kernels", c_int), ("trace_shapes_only", c_bool)]


class Param(Structure):
    _fields_ = [("name", c_char_p), ("data", F32P), ("grad", F32P), ("ndim", c_size_t),
                ("shape", c_size_t * 2), ("numel", c_size_t)]


class SimpleConfig(Structure):
    _fields_ = [("d_in", c_size_t)]


class SaV1Config(Structure):
    _fields_ = [("d_in", c_size_t), ("d_out", c_size_t), ("scale", c_double)]


class SaV2Config(Structure):
    _fields_ = [("d_in", c_size_t), ("d_out", c_size_t), ("qkv_bias", c_bool),
                ("scale", c_double)]


class CausalConfig(Structure):
    _fields_ = [("d_in", c_size_t), ("d_out", c_size_t), ("context_length", c_size_t),
                ("dropout", c_double), ("qkv_bias", c_bool), ("scale", c_double),
                ("mask", c_int)]


class MhaWrapperConfig(Structure):
    _fields_ = [("d_in", c_size_t), ("d_out", c_size_t), ("context_length", c_size_t),
                ("num_heads", c_size_t), ("dropout", c_double), ("qkv_bias", c_bool),
                ("scale", c_double), ("mask", c_int)]


class MhaConfig(Structure):
    _fields_ = [("d_in", c_size_t), ("d_out", c_size_t), ("context_length", c_size_t),
                ("num_heads", c_size_t), ("dropout", c_double), ("qkv_bias", c_bool),
                ("scale", c_double), ("mask", c_int)]


class Gpt2Config(Structure):
    _fields_ = [("n_embd", c_size_t), ("n_head", c_size_t), ("block_size", c_size_t),
                ("dropout", c_double), ("scale", c_double)]


# module short name -> (config struct, C prefix)
MODULES = {
    "sa_v1": (SaV1Config, "attn_sa_v1"),
    "sa_v2": (SaV2Config, "attn_sa_v2"),
    "causal": (CausalConfig, "attn_causal"),
    "mha_wrapper": (MhaWrapperConfig, "attn_mha_wrapper"),
    "mha": (MhaConfig, "attn_mha"),
    "gpt2": (Gpt2Config, "attn_gpt2"),
}


def f32(a):
    """A C-contiguous float32 copy/view of a and its float* pointer."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    return a, a.ctypes.data_as(F32P)


class Attn:
    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(path)

        def fn(name, restype, *argtypes):
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = list(argtypes)
            return f

        fn("attn_version", c_char_p)
        fn("attn_status_name", c_char_p, c_int)
        fn("attn_ctx_new", c_int, POINTER(CtxConfig), POINTER(c_void_p))
        fn("attn_ctx_free", None, c_void_p)
        fn("attn_ctx_last_error", c_char_p, c_void_p)
        fn("attn_ctx_num_threads", c_size_t, c_void_p)

        fn("attn_rng_new", c_int, c_void_p, c_uint64, POINTER(c_void_p))
        fn("attn_rng_free", None, c_void_p)
        fn("attn_rng_manual_seed", c_int, c_void_p, c_uint64)
        fn("attn_rng_set_bernoulli_method", c_int, c_void_p, c_int)
        fn("attn_rng_next_u32", c_int, c_void_p, POINTER(c_uint32))
        fn("attn_rng_rand", c_int, c_void_p, F32P, c_size_t)
        fn("attn_rng_uniform", c_int, c_void_p, F32P, c_size_t, c_double, c_double)
        fn("attn_rng_randn", c_int, c_void_p, F32P, c_size_t)
        fn("attn_rng_linear_init", c_int, c_void_p, F32P, F32P, c_size_t, c_size_t)
        fn("attn_rng_dropout", c_int, c_void_p, F32P, F32P, c_size_t, c_double,
           POINTER(c_uint8))

        fn("attn_module_get_kind", c_int, c_void_p)
        fn("attn_module_class_name", c_char_p, c_void_p)
        fn("attn_module_d_in", c_size_t, c_void_p)
        fn("attn_module_d_out", c_size_t, c_void_p)
        fn("attn_module_param_count", c_size_t, c_void_p)
        fn("attn_module_num_scalars", c_size_t, c_void_p)
        fn("attn_module_param_at", c_int, c_void_p, c_size_t, POINTER(Param))
        fn("attn_module_param", c_int, c_void_p, c_char_p, POINTER(Param))
        fn("attn_module_set_training", c_int, c_void_p, c_bool)
        fn("attn_module_training", c_bool, c_void_p)
        fn("attn_module_forward", c_int, c_void_p, F32P, c_size_t, c_size_t, F32P, c_void_p)
        fn("attn_module_backward", c_int, c_void_p, F32P, c_size_t, c_size_t, F32P)
        fn("attn_module_zero_grad", c_int, c_void_p)
        fn("attn_module_set_grad_enabled", c_int, c_void_p, c_bool)
        fn("attn_module_grad_enabled", c_bool, c_void_p)
        fn("attn_simple_new", c_int, c_void_p, POINTER(SimpleConfig), POINTER(c_void_p))
        fn("attn_simple_module", c_void_p, c_void_p)
        fn("attn_simple_forward_query", c_int, c_void_p, F32P, c_size_t, c_size_t, F32P, F32P,
           F32P)
        fn("attn_module_free", None, c_void_p)

        for cfg_type, prefix in MODULES.values():
            fn(prefix + "_new", c_int, c_void_p, POINTER(cfg_type), c_void_p, POINTER(c_void_p))
            fn(prefix + "_module", c_void_p, c_void_p)
            fn(prefix + "_free", None, c_void_p)
        fn("attn_sa_v1_forward", c_int, c_void_p, F32P, c_size_t, c_size_t, F32P)
        fn("attn_sa_v2_forward", c_int, c_void_p, F32P, c_size_t, c_size_t, F32P)
        for prefix in ("attn_causal", "attn_mha_wrapper", "attn_mha", "attn_gpt2"):
            fn(prefix + "_forward", c_int, c_void_p, F32P, c_size_t, c_size_t, F32P, c_void_p)
        for prefix in ["attn_simple"] + [p for _, p in MODULES.values()]:
            fn(prefix + "_backward", c_int, c_void_p, F32P, c_size_t, c_size_t, F32P)

    # ---- status ----

    def check(self, status, ctx, what):
        if status != ATTN_OK:
            name = self.lib.attn_status_name(status).decode()
            msg = self.lib.attn_ctx_last_error(ctx).decode() if ctx else ""
            raise AttnError("%s failed: %s (%s)" % (what, name, msg))

    def version(self):
        return self.lib.attn_version().decode()

    # ---- context and rng ----

    def ctx_new(self, num_threads=1, kernels=ATTN_KERNELS_REFERENCE):
        """A ctx; the exactness suites run the reference kernels, the oracle."""
        cfg = CtxConfig(num_threads, TRACE_FN(), None, kernels)
        ctx = c_void_p()
        st = self.lib.attn_ctx_new(ctypes.byref(cfg), ctypes.byref(ctx))
        if st != ATTN_OK:
            raise AttnError("attn_ctx_new failed: %s" % self.lib.attn_status_name(st).decode())
        return ctx

    def ctx_free(self, ctx):
        self.lib.attn_ctx_free(ctx)

    def rng_new(self, ctx, seed, bernoulli=ATTN_BERNOULLI_MT19937):
        rng = c_void_p()
        self.check(self.lib.attn_rng_new(ctx, seed, ctypes.byref(rng)), ctx, "attn_rng_new")
        self.check(self.lib.attn_rng_set_bernoulli_method(rng, bernoulli), ctx,
                   "attn_rng_set_bernoulli_method")
        return rng

    def rng_free(self, rng):
        self.lib.attn_rng_free(rng)

    def rng_manual_seed(self, ctx, rng, seed):
        self.check(self.lib.attn_rng_manual_seed(rng, seed), ctx, "attn_rng_manual_seed")

    def rng_rand(self, ctx, rng, n):
        out, p = f32(np.empty(n, dtype=np.float32))
        self.check(self.lib.attn_rng_rand(rng, p, n), ctx, "attn_rng_rand")
        return out

    def rng_uniform(self, ctx, rng, n, a, b):
        out, p = f32(np.empty(n, dtype=np.float32))
        self.check(self.lib.attn_rng_uniform(rng, p, n, a, b), ctx, "attn_rng_uniform")
        return out

    def rng_randn(self, ctx, rng, n):
        out, p = f32(np.empty(n, dtype=np.float32))
        self.check(self.lib.attn_rng_randn(rng, p, n), ctx, "attn_rng_randn")
        return out

    def rng_linear_init(self, ctx, rng, out_features, in_features, bias):
        w, wp = f32(np.empty((out_features, in_features), dtype=np.float32))
        b, bp = (f32(np.empty(out_features, dtype=np.float32)) if bias else (None, None))
        self.check(self.lib.attn_rng_linear_init(rng, wp, bp, out_features, in_features), ctx,
                   "attn_rng_linear_init")
        return w, b

    def rng_dropout(self, ctx, rng, x, p):
        x, xp = f32(x)
        y, yp = f32(np.empty(x.shape, dtype=np.float32))
        keep = np.empty(x.shape, dtype=np.uint8)
        kp = keep.ctypes.data_as(POINTER(c_uint8))
        self.check(self.lib.attn_rng_dropout(rng, xp, yp, x.size, p, kp), ctx,
                   "attn_rng_dropout")
        return y, keep

    # ---- modules ----

    def module_new(self, ctx, kind, init_rng, **cfg):
        """Returns (handle, attn_module*) for kind in MODULES."""
        cfg_type, prefix = MODULES[kind]
        c = cfg_type(**cfg)
        h = c_void_p()
        self.check(getattr(self.lib, prefix + "_new")(ctx, ctypes.byref(c), init_rng,
                                                       ctypes.byref(h)),
                   ctx, "%s_new(%s)" % (prefix, cfg))
        m = getattr(self.lib, prefix + "_module")(h)
        if not m:
            raise AttnError("%s_module returned NULL" % prefix)
        return h, c_void_p(m)

    def simple_new(self, ctx, d_in):
        """Returns (handle, attn_module*) of a SimplifiedSelfAttention."""
        h = c_void_p()
        self.check(self.lib.attn_simple_new(ctx, ctypes.byref(SimpleConfig(d_in)),
                                            ctypes.byref(h)), ctx, "attn_simple_new")
        return h, c_void_p(self.lib.attn_simple_module(h))

    def simple_forward_query(self, ctx, h, x, query):
        """The seeds' one-query steps on x (T, d_in): (scores, weights, context)."""
        x = np.ascontiguousarray(x, np.float32)
        T, d = x.shape
        scores, weights, context = (np.empty(n, np.float32) for n in (T, T, d))
        ptr = lambda a: a.ctypes.data_as(F32P)  # noqa: E731
        self.check(self.lib.attn_simple_forward_query(h, ptr(x), T, query, ptr(scores),
                                                      ptr(weights), ptr(context)),
                   ctx, "attn_simple_forward_query")
        return scores, weights, context

    def module_free(self, m):
        self.lib.attn_module_free(m)

    def module_params(self, ctx, m):
        """[(name, ndarray copy)] in state_dict order via attn_module_param_at."""
        out = []
        for i in range(self.lib.attn_module_param_count(m)):
            p = Param()
            self.check(self.lib.attn_module_param_at(m, i, ctypes.byref(p)), ctx,
                       "attn_module_param_at(%d)" % i)
            out.append((p.name.decode(), self._param_array(p)))
        return out

    def module_param(self, ctx, m, name):
        p = Param()
        self.check(self.lib.attn_module_param(m, name.encode(), ctypes.byref(p)), ctx,
                   "attn_module_param(%r)" % name)
        return self._param_array(p)

    def module_grads(self, ctx, m):
        """[(name, ndarray copy of its grad)] in state_dict order."""
        out = []
        for i in range(self.lib.attn_module_param_count(m)):
            p = Param()
            self.check(self.lib.attn_module_param_at(m, i, ctypes.byref(p)), ctx,
                       "attn_module_param_at(%d)" % i)
            out.append((p.name.decode(), self._param_array(p, grad=True)))
        return out

    def module_zero_grad(self, ctx, m):
        self.check(self.lib.attn_module_zero_grad(m), ctx, "attn_module_zero_grad")

    def module_backward(self, ctx, m, dy, typed=None):
        """dy (B, T, d_out) -> dx (B, T, d_in) through attn_module_backward, or
        through attn_X_backward of typed = (prefix, handle)."""
        dy, dyp = f32(dy)
        b, t, _ = dy.shape
        dx, dxp = f32(np.empty((b, t, self.lib.attn_module_d_in(m)), dtype=np.float32))
        if typed:
            st = getattr(self.lib, typed[0] + "_backward")(typed[1], dyp, b, t, dxp)
        else:
            st = self.lib.attn_module_backward(m, dyp, b, t, dxp)
        self.check(st, ctx, "attn_module_backward")
        return dx

    @staticmethod
    def _param_array(p, grad=False):
        shape = tuple(p.shape[i] for i in range(p.ndim))
        n = int(np.prod(shape)) if shape else 1
        if n != p.numel:
            raise AttnError("param %s: shape %s but numel %d" % (p.name, shape, p.numel))
        src = p.grad if grad else p.data
        return np.ctypeslib.as_array(src, shape=(p.numel,)).copy().reshape(shape)

    def module_set_training(self, ctx, m, training):
        self.check(self.lib.attn_module_set_training(m, training), ctx,
                   "attn_module_set_training")

    def module_forward(self, ctx, m, x, rng=None):
        """x (B, T, d_in) -> y (B, T, d_out) through attn_module_forward."""
        x, xp = f32(x)
        b, t, _ = x.shape
        y, yp = f32(np.empty((b, t, self.lib.attn_module_d_out(m)), dtype=np.float32))
        self.check(self.lib.attn_module_forward(m, xp, b, t, yp, rng), ctx,
                   "attn_module_forward")
        return y

    def typed_forward(self, ctx, kind, h, x, d_out, rng=None):
        """The same through the module's own attn_X_forward."""
        x, xp = f32(x)
        b, t, _ = x.shape
        y, yp = f32(np.empty((b, t, d_out), dtype=np.float32))
        f = getattr(self.lib, MODULES[kind][1] + "_forward")
        if kind in ("sa_v1", "sa_v2"):
            st = f(h, xp, b, t, yp)
        else:
            st = f(h, xp, b, t, yp, rng)
        self.check(st, ctx, MODULES[kind][1] + "_forward")
        return y
