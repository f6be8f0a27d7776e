"""ctypes bindings for the training part of libattn (include/attn.h:
"Optimizers", "A small language model", "Synthetic tasks"), on top of
tests/conformance/attn_ctypes.py.

    from train_ctypes import AttnTrain
    lib = AttnTrain("/path/to/libattn.so")
    ctx = lib.ctx_new(num_threads=2)
    model = lib.model_new(ctx, rng, vocab_size=16, context_length=8, ...)
    params = lib.model_params(model)      # [(name, data view, grad view)]

Arrays returned as views alias the library's memory: they are valid until
the object that owns them is freed.
"""
import ctypes
import os
import sys
from ctypes import (POINTER, Structure, c_bool, c_char_p, c_double, c_float, c_int, c_int32,
                    c_int64, c_size_t, c_void_p)

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conformance"))
from attn_ctypes import (ATTN_KERNELS_AUTO, ATTN_KERNELS_REFERENCE, ATTN_MODULE_GPT2,  # noqa: E402,F401
                         ATTN_MODULE_MHA, F32P, Attn, AttnError, Param, f32)

ATTN_OPTIMIZER_SGD = 0
ATTN_OPTIMIZER_ADAMW = 1
ATTN_IGNORE_INDEX = -100
TASKS = {"copy": 0, "reverse": 1, "sort": 2, "induction": 3}
I32P = POINTER(c_int32)


class OptimizerConfig(Structure):
    _fields_ = [("kind", c_int), ("lr", c_double), ("weight_decay", c_double),
                ("momentum", c_double), ("dampening", c_double), ("nesterov", c_bool),
                ("beta1", c_double), ("beta2", c_double), ("eps", c_double),
                ("amsgrad", c_bool)]


class ModelConfig(Structure):
    _fields_ = [("vocab_size", c_size_t), ("context_length", c_size_t), ("d_model", c_size_t),
                ("n_layers", c_size_t), ("n_heads", c_size_t), ("attention", c_int),
                ("mlp", c_bool), ("dropout", c_double), ("qkv_bias", c_bool)]



class GptConfig(Structure):
    _fields_ = [("vocab_size", c_size_t), ("context_length", c_size_t), ("emb_dim", c_size_t),
                ("n_heads", c_size_t), ("n_layers", c_size_t), ("drop_rate", c_double),
                ("qkv_bias", c_bool), ("attention", c_int), ("n_kv_groups", c_size_t),
                ("latent_dim", c_size_t), ("sliding_window_size", c_size_t),
                ("sliding_window_stride", c_int64)]

class Llama3Config(Structure):
    _fields_ = [("vocab_size", c_size_t), ("context_length", c_size_t), ("emb_dim", c_size_t),
                ("n_heads", c_size_t), ("n_layers", c_size_t), ("hidden_dim", c_size_t),
                ("n_kv_groups", c_size_t), ("rope_base", c_double), ("rope_factor", c_double),
                ("rope_low_freq_factor", c_double), ("rope_high_freq_factor", c_double),
                ("rope_original_context_length", c_size_t)]

    @classmethod
    def from_book(cls, cfg):
        """The book's cfg dict (llama3.LLAMA32_CONFIG_1B's keys; dtype is not read)."""
        c = cls(**{k: cfg[k] for k in ("vocab_size", "context_length", "emb_dim", "n_heads",
                                       "n_layers", "hidden_dim", "n_kv_groups", "rope_base")})
        f = cfg.get("rope_freq")
        if f:
            c.rope_factor = f["factor"]
            c.rope_low_freq_factor = f["low_freq_factor"]
            c.rope_high_freq_factor = f["high_freq_factor"]
            c.rope_original_context_length = f["original_context_length"]
        return c


def i32(a):
    a = np.ascontiguousarray(a, dtype=np.int32)
    return a, a.ctypes.data_as(I32P)


class AttnTrain(Attn):
    def __init__(self, path):
        super().__init__(path)
        lib = self.lib

        def fn(name, restype, *argtypes):
            f = getattr(lib, name)
            f.restype = restype
            f.argtypes = list(argtypes)

        fn("attn_ctx_kernels", c_int, c_void_p)
        fn("attn_kernels_name", c_char_p, c_int)
        fn("attn_optimizer_defaults", OptimizerConfig, c_int)
        fn("attn_optimizer_new", c_int, c_void_p, POINTER(OptimizerConfig), POINTER(Param),
           c_size_t, POINTER(c_void_p))
        fn("attn_optimizer_step", c_int, c_void_p)
        fn("attn_optimizer_zero_grad", c_int, c_void_p)
        fn("attn_optimizer_set_lr", c_int, c_void_p, c_double)
        fn("attn_optimizer_free", None, c_void_p)
        fn("attn_optimizer_state_size", c_size_t, c_void_p)
        fn("attn_optimizer_get_state", c_int, c_void_p, POINTER(c_float), c_size_t,
           POINTER(c_size_t))
        fn("attn_clip_grad_norm", c_int, c_void_p, POINTER(Param), c_size_t, c_double,
           POINTER(c_float))
        fn("attn_model_new", c_int, c_void_p, POINTER(ModelConfig), c_void_p, POINTER(c_void_p))
        fn("attn_model_new_gpt", c_int, c_void_p, POINTER(GptConfig), c_void_p,
           POINTER(c_void_p))
        fn("attn_model_get_gpt_config", c_int, c_void_p, POINTER(GptConfig))
        fn("attn_model_new_llama3", c_int, c_void_p, POINTER(Llama3Config), c_void_p,
           POINTER(c_void_p))
        fn("attn_model_get_llama3_config", c_int, c_void_p, POINTER(Llama3Config))
        fn("attn_llama3_rope_tables", c_int, c_void_p, POINTER(Llama3Config), F32P, F32P)
        fn("attn_model_free", None, c_void_p)
        fn("attn_model_param_count", c_size_t, c_void_p)
        fn("attn_model_num_scalars", c_size_t, c_void_p)
        fn("attn_model_param_at", c_int, c_void_p, c_size_t, POINTER(Param))
        fn("attn_model_params", c_int, c_void_p, POINTER(POINTER(Param)), POINTER(c_size_t))
        fn("attn_model_set_training", c_int, c_void_p, c_bool)
        fn("attn_model_set_grad_enabled", c_int, c_void_p, c_bool)
        fn("attn_model_zero_grad", c_int, c_void_p)
        fn("attn_model_forward", c_int, c_void_p, I32P, I32P, c_size_t, c_size_t, F32P,
           POINTER(c_float), c_void_p)
        fn("attn_model_backward", c_int, c_void_p)
        fn("attn_model_save", c_int, c_void_p, c_char_p)
        fn("attn_model_load", c_int, c_void_p, c_char_p)
        fn("attn_task_batch", c_int, c_void_p, c_int, c_size_t, c_size_t, c_void_p, c_size_t,
           I32P, I32P, POINTER(c_size_t))

    # ---- parameters ----

    @staticmethod
    def param_views(p):
        """(name, data, grad) numpy views of an attn_param (grad None if NULL)."""
        shape = tuple(p.shape[i] for i in range(p.ndim))
        data = np.ctypeslib.as_array(p.data, shape=(p.numel,)).reshape(shape)
        grad = (np.ctypeslib.as_array(p.grad, shape=(p.numel,)).reshape(shape)
                if p.grad else None)
        return p.name.decode(), data, grad

    @staticmethod
    def param_array(arrays):
        """A Param array describing numpy (data, grad) pairs (kept alive by the caller)."""
        out = (Param * len(arrays))()
        for i, (name, data, grad) in enumerate(arrays):
            out[i].name = name.encode()
            out[i].data = data.ctypes.data_as(F32P)
            out[i].grad = grad.ctypes.data_as(F32P)
            out[i].ndim = data.ndim
            for d in range(data.ndim):
                out[i].shape[d] = data.shape[d]
            out[i].numel = data.size
        return out

    # ---- optimizers ----

    def optimizer_new(self, ctx, params, kind, count=None, **overrides):
        """params: a Param array (count: its length), or a POINTER(Param) and count."""
        count = len(params) if count is None else count
        cfg = self.lib.attn_optimizer_defaults(kind)
        for k, v in overrides.items():
            setattr(cfg, k, v)
        opt = c_void_p()
        self.check(self.lib.attn_optimizer_new(ctx, ctypes.byref(cfg), params, count,
                                               ctypes.byref(opt)), ctx, "attn_optimizer_new")
        return opt

    def optimizer_step(self, ctx, opt):
        self.check(self.lib.attn_optimizer_step(opt), ctx, "attn_optimizer_step")

    def clip_grad_norm(self, ctx, params, max_norm, count=None):
        count = len(params) if count is None else count
        total = c_float()
        self.check(self.lib.attn_clip_grad_norm(ctx, params, count, max_norm,
                                                ctypes.byref(total)), ctx, "attn_clip_grad_norm")
        return total.value

    # ---- the model ----

    def model_new(self, ctx, init_rng, **cfg):
        c = ModelConfig(**cfg)
        m = c_void_p()
        self.check(self.lib.attn_model_new(ctx, ctypes.byref(c), init_rng, ctypes.byref(m)), ctx,
                   "attn_model_new(%s)" % cfg)
        return m

    def model_new_gpt(self, ctx, init_rng, **cfg):
        """The book's GPTModel from its cfg dict's keys."""
        c = GptConfig(**cfg)
        m = c_void_p()
        self.check(self.lib.attn_model_new_gpt(ctx, ctypes.byref(c), init_rng, ctypes.byref(m)),
                   ctx, "attn_model_new_gpt(%s)" % cfg)
        return m

    def model_new_llama3(self, ctx, init_rng, cfg):
        """The book's Llama3Model from its cfg dict."""
        c = Llama3Config.from_book(cfg)
        m = c_void_p()
        self.check(self.lib.attn_model_new_llama3(ctx, ctypes.byref(c), init_rng,
                                                  ctypes.byref(m)),
                   ctx, "attn_model_new_llama3(%s)" % cfg)
        return m

    def llama3_rope_tables(self, ctx, cfg):
        """(cos, sin), (context_length, head_dim) each, as compute_rope_params gives them."""
        c = Llama3Config.from_book(cfg)
        shape = (cfg["context_length"], cfg["emb_dim"] // cfg["n_heads"])
        cos, cp = f32(np.empty(shape, np.float32))
        sin, sp = f32(np.empty(shape, np.float32))
        self.check(self.lib.attn_llama3_rope_tables(ctx, ctypes.byref(c), cp, sp), ctx,
                   "attn_llama3_rope_tables")
        return cos, sin

    def model_params(self, ctx, m):
        """[(name, data view, grad view)] in state_dict order."""
        out = []
        for i in range(self.lib.attn_model_param_count(m)):
            p = Param()
            self.check(self.lib.attn_model_param_at(m, i, ctypes.byref(p)), ctx,
                       "attn_model_param_at(%d)" % i)
            out.append(self.param_views(p))
        return out

    def model_param_table(self, ctx, m):
        """The model's own attn_param array and count, as attn_optimizer_new takes it."""
        ptr = POINTER(Param)()
        n = c_size_t()
        self.check(self.lib.attn_model_params(m, ctypes.byref(ptr), ctypes.byref(n)), ctx,
                   "attn_model_params")
        return ptr, n.value

    def model_forward(self, ctx, m, tokens, targets=None, vocab=None, rng=None, logits=True):
        tokens, tp = i32(tokens)
        b, t = tokens.shape
        gp = None
        if targets is not None:
            targets, gp = i32(targets)
        out, op = (f32(np.empty((b, t, vocab), np.float32)) if logits else (None, None))
        loss = c_float()
        self.check(self.lib.attn_model_forward(m, tp, gp, b, t, op,
                                               ctypes.byref(loss) if targets is not None else None,
                                               rng), ctx, "attn_model_forward")
        return (loss.value if targets is not None else None), out

    def model_backward(self, ctx, m):
        self.check(self.lib.attn_model_backward(m), ctx, "attn_model_backward")

    def model_zero_grad(self, ctx, m):
        self.check(self.lib.attn_model_zero_grad(m), ctx, "attn_model_zero_grad")

    def model_set_training(self, ctx, m, training):
        self.check(self.lib.attn_model_set_training(m, training), ctx, "attn_model_set_training")

    def task_batch(self, ctx, task, vocab, context, rng, batch):
        tokens, tp = i32(np.empty((batch, context), np.int32))
        targets, gp = i32(np.empty((batch, context), np.int32))
        answers = c_size_t()
        self.check(self.lib.attn_task_batch(ctx, TASKS[task], vocab, context, rng, batch, tp, gp,
                                            ctypes.byref(answers)), ctx, "attn_task_batch")
        return tokens, targets, answers.value
