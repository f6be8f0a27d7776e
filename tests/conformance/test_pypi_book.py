#!/usr/bin/env python3
"""attn against the book's later code as it ships on PyPI (llms-from-scratch
1.0.19, installed --no-deps in the project venv): the Llama 3 attention of its
llama3.py, GroupedQueryAttention(d_in, d_out, num_heads, num_kv_groups),
with rotary embeddings from its compute_rope_params and apply_rope.

    test_pypi_book.py <libattn.so> [--seed N] [--cases N]

Two checks per random configuration (fresh each run; the seed is printed):
  1. The attention core under real RoPE: q, k, v from the book's module (its
     projections, its apply_rope) in float32 go through attn's
     scaled_dot_product_attention with GQA (kv_heads = num_kv_groups, no
     repeat_interleave) and causal masking; out_proj is applied after. The
     output, and dq, dk, dv, against float64 autograd of the book's own
     forward.
  2. attn's GroupedQueryAttention module (the chapter-4 class's parameters:
     Llama's, no biases) loaded with the book's weights and RoPE at the
     identity (cos 1, sin 0): forward and every gradient.
Bound: relative L2 <= 1e-5, or twice PyTorch float32's own error against
float64 on the same case.
"""
import argparse
import os
import random
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))

import book_shim  # noqa: E402,F401  (nn.RMSNorm for torch < 2.4, before the import below)
import torch  # noqa: E402

from llms_from_scratch import llama3  # noqa: E402

TOL = 1e-5


def rel_l2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


class Results:
    def __init__(self):
        self.failures, self.passed, self.worst = [], 0, {}

    def check(self, name, ours, ref64, ref32):
        err, err32 = rel_l2(ours, ref64), rel_l2(ref32, ref64)
        bound = max(TOL, 2 * err32)
        key = name.split()[0]
        w = self.worst.setdefault(key, [0.0, 0.0])
        w[0], w[1] = max(w[0], err), max(w[1], err32)
        if err <= bound:
            self.passed += 1
        else:
            self.failures.append("%s: rel L2 %.3g > bound %.3g (torch f32 %.3g)"
                                 % (name, err, bound, err32))


def book_forward(m, x, T, cos, sin, dtype):
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    return m(x.to(dtype), mask, cos.to(dtype), sin.to(dtype))


def rope_case(res, F, r, i):
    H = r.choice([2, 4, 6, 8])
    G = r.choice([g for g in (1, 2, H // 2, H) if g >= 1 and H % g == 0])
    hd = r.choice([8, 16, 32, 64])
    d_in, d_out, B, T = r.randrange(8, 96), H * hd, r.randrange(1, 3), r.randrange(2, 40)
    seed = r.randrange(1 << 30)
    desc = "H=%d G=%d hd=%d d_in=%d B=%d T=%d seed=%d" % (H, G, hd, d_in, B, T, seed)
    torch.manual_seed(seed)
    m = llama3.GroupedQueryAttention(d_in, d_out, H, G)
    cos, sin = llama3.compute_rope_params(hd, context_length=T)
    x = torch.rand(B, T, d_in) * 2 - 1
    dy = torch.rand(B, T, d_out) * 2 - 1

    def parts(module, dtype):
        """The book's q, k (after RoPE) and v, shaped (B, H, T, hd)."""
        xx = x.to(dtype)
        q = module.W_query(xx).view(B, T, H, hd).transpose(1, 2)
        k = module.W_key(xx).view(B, T, G, hd).transpose(1, 2)
        v = module.W_value(xx).view(B, T, G, hd).transpose(1, 2)
        return (llama3.apply_rope(q, cos.to(dtype), sin.to(dtype)),
                llama3.apply_rope(k, cos.to(dtype), sin.to(dtype)), v)

    refs = {}
    for dtype in (torch.float64, torch.float32):
        mm = llama3.GroupedQueryAttention(d_in, d_out, H, G).to(dtype)
        mm.load_state_dict({n: p.to(dtype) for n, p in m.state_dict().items()})
        q, k, v = (t.detach().requires_grad_(True) for t in parts(mm, dtype))
        # the book's forward from q, k, v on: repeat_interleave, mask, softmax
        kk, vv = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
        scores = (q @ kk.transpose(2, 3)).masked_fill(
            torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1), -torch.inf)
        ctx = (torch.softmax(scores / hd ** 0.5, dim=-1) @ vv)
        dctx = (torch.rand(B, H, T, hd, generator=torch.Generator().manual_seed(seed))
                * 2 - 1).to(dtype)
        ctx.backward(dctx)
        # and the module's own forward agrees with this decomposition
        y = book_forward(mm, x, T, cos, sin, dtype)
        refs[dtype] = dict(ctx=ctx.detach().numpy(), dq=q.grad.numpy(), dk=k.grad.numpy(),
                           dv=v.grad.numpy(), dctx=dctx.numpy(), y=y.detach().numpy(),
                           q=q.detach().numpy(), k=k.detach().numpy(), v=v.detach().numpy(),
                           y_from_parts=(ctx.detach().transpose(1, 2).reshape(B, T, d_out)
                                         @ mm.out_proj.weight.detach().T).numpy())
    r64, r32 = refs[torch.float64], refs[torch.float32]
    # the decomposition is the book's module, exactly in float64
    res.check("decomposition " + desc, r64["y_from_parts"], r64["y"], r32["y"])
    q32, k32, v32 = (np.ascontiguousarray(r32[n], dtype=np.float32) for n in "qkv")
    for kernels in ("reference", "auto"):
        out = F.scaled_dot_product_attention(q32, k32, v32, causal=True, kernels=kernels)
        dq, dk, dv = F.scaled_dot_product_attention_backward(
            r32["dctx"].astype(np.float32), q32, k32, v32, causal=True, kernels=kernels)
        tag = "%s %s" % (kernels, desc)
        res.check("rope_out " + tag, out, r64["ctx"], r32["ctx"])
        res.check("rope_dq " + tag, dq, r64["dq"], r32["dq"])
        res.check("rope_dk " + tag, dk, r64["dk"], r32["dk"])
        res.check("rope_dv " + tag, dv, r64["dv"], r32["dv"])


def module_case(res, attn, r):
    H = r.choice([2, 4, 8])
    G = r.choice([g for g in (1, 2, H) if H % g == 0])
    hd = r.choice([4, 8, 16])
    d_in, d_out, B, T = r.randrange(4, 64), H * hd, r.randrange(1, 3), r.randrange(1, 24)
    seed = r.randrange(1 << 30)
    desc = "H=%d G=%d hd=%d d_in=%d B=%d T=%d seed=%d" % (H, G, hd, d_in, B, T, seed)
    torch.manual_seed(seed)
    book = llama3.GroupedQueryAttention(d_in, d_out, H, G)
    weights = {n: p.detach().numpy().copy() for n, p in book.state_dict().items()}
    ours = attn.GroupedQueryAttention(d_in, d_out, 0.0, H, G)
    sd = ours.state_dict()
    assert list(sd) == list(weights), (list(sd), list(weights))  # the same names, in order
    ours.load_state_dict(weights)
    ours.eval()
    x = (torch.rand(B, T, d_in) * 2 - 1)
    dy = (torch.rand(B, T, d_out) * 2 - 1)
    y = ours(x.numpy())
    dx = ours.backward(dy.numpy())
    grads = ours.grads()
    cos, sin = torch.ones(T, hd), torch.zeros(T, hd)  # RoPE at the identity
    ref = {}
    for dtype in (torch.float64, torch.float32):
        mm = llama3.GroupedQueryAttention(d_in, d_out, H, G).to(dtype)
        mm.load_state_dict({n: p.to(dtype) for n, p in book.state_dict().items()})
        xx = x.to(dtype).requires_grad_(True)
        yy = book_forward(mm, xx, T, cos, sin, dtype)
        yy.backward(dy.to(dtype))
        ref[dtype] = dict(y=yy.detach().numpy(), dx=xx.grad.numpy(),
                          **{n: p.grad.numpy() for n, p in mm.named_parameters()})
    for name in ["y", "dx"] + [n for n, _ in book.named_parameters()]:
        got = y if name == "y" else dx if name == "dx" else grads[name]
        res.check("module_%s %s" % (name, desc), got, ref[torch.float64][name],
                  ref[torch.float32][name])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("lib")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--cases", type=int, default=6)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print("run seed %d (replay with --seed %d)" % (seed, seed))
    os.environ["ATTN_LIBRARY"] = args.lib
    import attn
    import attn.functional as F
    torch.set_num_threads(1)
    r = random.Random(seed)
    res = Results()
    for i in range(args.cases):
        rope_case(res, F, r, i)
        module_case(res, attn, r)
    print("largest relative L2 vs float64 (attn | PyTorch float32):")
    for k, (e, e32) in sorted(res.worst.items()):
        print("  %-18s %.3g | %.3g" % (k, e, e32))
    for f in res.failures:
        print("FAIL " + f)
    print("%d passed, %d failed" % (res.passed, len(res.failures)))
    return 1 if res.failures else 0


if __name__ == "__main__":
    sys.exit(main())
