"""attn_sdpa_forward_16 / attn_sdpa_backward_16 against PyTorch's own 16-bit
attention, both measured against float64.

For each case and dtype (bfloat16, float16):
  inputs   q, k, v, dout: randn (q, k times amp) rounded to the dtype; every
           computation below starts from these very values.
  truth    float64 math attention of the inputs widened exactly to float64
           (scores, softmax, P V), and its autograd gradients for dout.
  torch    what a PyTorch user computing in the dtype gets, written as
           PyTorch's math SDPA: scores = (q @ k^T) * scale, masked_fill(-inf),
           softmax, @ v, backward by autograd.
           bfloat16: torch 1.13's CPU bf16 ops themselves (each op's output,
           and each gradient, a bf16 tensor).
           float16: torch 1.13 has no CPU half matmul/softmax, so each op runs
           in float32 on the half inputs and rounds its output to half, and
           each gradient is rounded to half on its way back (as CUDA's half
           kernels do: fp32 accumulation, half storage).
  attn     attn_sdpa_forward_16 / _backward_16 (ctypes, on the dtype's raw
           bits; bf16 runs AMX tiles for head_dim 64 and 128 where the CPU
           has AMX: this script asks for them first, attn_cpu_request_amx,
           as an application does; else vdpbf16ps where the CPU has
           avx512_bf16 and is not Intel's, whose cores widen to float),
           out and lse from the forward fed to the backward.
Checked, for out, dq, dk, dv: relative L2 error (||x - truth|| / ||truth||)
of attn <= that of torch (plus 1e-5): "within PyTorch's own error" (attn.h).
The table prints both errors.

Fresh random inputs each run; the seed is printed (argv[2] replays it).
Usage: test_sdpa16_vs_torch.py LIBATTN [SEED]
"""
import ctypes
import os
import sys
from ctypes import POINTER, Structure, c_bool, c_double, c_float, c_int, c_int32, c_longlong, \
    c_size_t, c_void_p

import torch

DTYPE_F16, DTYPE_BF16 = 1, 2
ALIGN_BOTTOM_RIGHT = 0


class CtxConfig(Structure):
    _fields_ = [("num_threads", c_size_t), ("trace", c_void_p), ("trace_user", c_void_p),
                ("kernels", c_int), ("trace_shapes_only", c_bool)]


F32P, I32P = POINTER(c_float), POINTER(c_int32)


class SdpaConfig(Structure):  # attn_sdpa_config, field for field
    _fields_ = [
        ("batch", c_size_t), ("heads", c_size_t), ("q_tokens", c_size_t),
        ("kv_tokens", c_size_t), ("head_dim", c_size_t),
        ("q_strides", c_size_t * 3), ("kv_strides", c_size_t * 3),
        ("out_strides", c_size_t * 3), ("scale", c_double), ("causal", c_bool),
        ("dropout", c_double),
        ("kv_heads", c_size_t), ("v_head_dim", c_size_t), ("v_strides", c_size_t * 3),
        ("align", c_int), ("q_offset", c_longlong), ("window", c_bool),
        ("window_left", c_longlong), ("window_right", c_longlong), ("softcap", c_double),
        ("alibi_slopes", F32P), ("sinks", F32P), ("sinks_grad", F32P),
        ("cu_seqlens_q", I32P), ("cu_seqlens_kv", I32P),
        # programmable attention (attn_block_mask *, attn_score_mod *): unused here
        ("block_mask", c_void_p), ("score_mods", c_void_p), ("score_mod_count", c_size_t)]


class Lib:
    def __init__(self, path):
        self.lib = lib = ctypes.CDLL(path)
        lib.attn_ctx_new.argtypes = [POINTER(CtxConfig), POINTER(c_void_p)]
        lib.attn_ctx_last_error.restype = ctypes.c_char_p
        lib.attn_ctx_last_error.argtypes = [c_void_p]
        lib.attn_sdpa_forward_16.argtypes = [c_void_p, POINTER(SdpaConfig), c_int] + \
            [c_void_p] * 4 + [c_void_p, c_void_p, c_void_p]
        lib.attn_sdpa_backward_16.argtypes = [c_void_p, POINTER(SdpaConfig), c_int] + \
            [c_void_p] * 9 + [c_void_p]
        self.ctx = c_void_p()
        if lib.attn_ctx_new(ctypes.byref(CtxConfig(num_threads=2)), ctypes.byref(self.ctx)):
            raise RuntimeError("attn_ctx_new failed")

    def check(self, status, what):
        if status:
            raise RuntimeError(f"{what}: status {status}: "
                               f"{self.lib.attn_ctx_last_error(self.ctx).decode()}")


def ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def mask_of(T, S, causal):
    """Keys query i sees: j <= i + S - T (bottom-right) when causal."""
    if not causal:
        return None
    i = torch.arange(T).unsqueeze(1)
    j = torch.arange(S).unsqueeze(0)
    return j <= i + (S - T)


class RoundHalf(torch.autograd.Function):
    """x rounded to float16 (kept in float32), its gradient rounded too."""

    @staticmethod
    def forward(ctx, x):
        return x.half().float()

    @staticmethod
    def backward(ctx, g):
        return g.half().float()


def math_attention(q, k, v, keep, scale, rnd=lambda x: x):
    """PyTorch's math SDPA on (B, H, T, D) tensors (k, v repeated for GQA);
    rnd after each op (float16's emulation)."""
    g = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    scores = rnd(rnd(q @ k.transpose(-2, -1)) * scale)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return rnd(rnd(torch.softmax(scores, dim=-1)) @ v)


def grads(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def rel(x, truth):
    x, truth = x.double(), truth.double()
    return float((x - truth).norm() / truth.norm())


def run_attn(L, dtype_code, cfg, q, k, v, dout):
    """attn on (B, T, H, D) contiguous 16-bit tensors."""
    out = torch.empty_like(q)
    lse = torch.empty(cfg.batch, cfg.heads, cfg.q_tokens, dtype=torch.float32)
    L.check(L.lib.attn_sdpa_forward_16(L.ctx, ctypes.byref(cfg), dtype_code, ptr(q), ptr(k),
                                       ptr(v), ptr(out), ptr(lse), None, None),
            "attn_sdpa_forward_16")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    L.check(L.lib.attn_sdpa_backward_16(L.ctx, ctypes.byref(cfg), dtype_code, ptr(q), ptr(k),
                                        ptr(v), ptr(out), ptr(lse), ptr(dout), ptr(dq), ptr(dk),
                                        ptr(dv), None),
            "attn_sdpa_backward_16")
    return out, dq, dk, dv


def check_case(L, gen, dtype, case):
    name, B, H, Hkv, T, S, D, causal, amp = case
    bhtd = lambda heads, n, a: (torch.randn(B, heads, n, D, generator=gen, dtype=torch.float64)
                                * a).to(dtype)
    q, k, v, dout = bhtd(H, T, amp), bhtd(Hkv, S, amp), bhtd(Hkv, S, 1.0), bhtd(H, T, 1.0)
    keep = mask_of(T, S, causal)
    scale = 1.0 / D ** 0.5
    truth = grads(lambda a, b, c: math_attention(a, b, c, keep, scale), q.double(), k.double(),
                  v.double(), dout.double())
    if dtype == torch.bfloat16:
        peer = grads(lambda a, b, c: math_attention(a, b, c, keep, scale), q, k, v, dout)
    else:
        peer = grads(lambda a, b, c: math_attention(a, b, c, keep, scale, RoundHalf.apply),
                     q.float(), k.float(), v.float(), dout.float())
    cfg = SdpaConfig(batch=B, heads=H, q_tokens=T, kv_tokens=S, head_dim=D, kv_heads=Hkv,
                     causal=causal, align=ALIGN_BOTTOM_RIGHT)
    # attn's layout: (B, T, H, D) contiguous; results back to (B, H, T, D)
    to_bthd = lambda t: t.transpose(1, 2).contiguous()
    got = run_attn(L, DTYPE_BF16 if dtype == torch.bfloat16 else DTYPE_F16, cfg,
                   *(to_bthd(t) for t in (q, k, v, dout)))
    got = [t.transpose(1, 2) for t in got]
    ok = True
    cols = []
    for label, a, p, w in zip(("out", "dq", "dk", "dv"), got, peer, truth):
        ea, ep = rel(a, w), rel(p, w)
        cols.append(f"{label} {ea:.2e}/{ep:.2e}")
        if not ea <= ep + 1e-5:
            ok = False
            print(f"FAIL {name} {dtype}: attn's {label} error {ea:.3e} > torch's {ep:.3e}")
    print(f"  {str(dtype)[6:]:9} {name:26} " + "  ".join(cols))
    return ok


def request_amx(L):
    """attn_cpu_request_amx: asks the OS for AMX's tile data for this process
    (what an application that wants attn's AMX kernels does; the library
    never asks by itself): what bf16 of head_dim 64 and 128 then runs on."""
    if not hasattr(L.lib, "attn_cpu_request_amx"):
        return "no attn_cpu_request_amx in this build"
    return "AMX tiles" if L.lib.attn_cpu_request_amx() == 0 else "no AMX here: vdpbf16ps or widened"


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: test_sdpa16_vs_torch.py LIBATTN [SEED]")
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else int.from_bytes(os.urandom(6), "little")
    L = Lib(sys.argv[1])
    print(f"test_sdpa16_vs_torch: seed {seed} (torch {torch.__version__}; bf16 head_dim 64, "
          f"128: {request_amx(L)})")
    gen = torch.Generator().manual_seed(seed)
    cases = [  # name, B, H, Hkv, T, S, D, causal, amp (of q and k)
        ("causal T=128 d64", 1, 4, 4, 128, 128, 64, True, 1.0),
        ("none T=77 d64 GQA 4:2", 2, 4, 2, 77, 77, 64, False, 1.0),
        ("causal T=100 d128", 1, 2, 2, 100, 100, 128, True, 1.0),
        ("none T=65 d80", 1, 3, 3, 65, 65, 80, False, 1.0),
        ("causal T=33 S=200 d64", 1, 2, 1, 33, 200, 64, True, 1.0),
        ("large scores causal T=96", 1, 2, 2, 96, 96, 64, True, 3.0),
    ]
    print("  dtype     case                       relative L2 error vs float64: attn/torch")
    ok = True
    for dtype in (torch.bfloat16, torch.float16):
        for case in cases:
            ok = check_case(L, gen, dtype, case) and ok
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
