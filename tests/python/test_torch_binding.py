"""attn.torch, the PyTorch binding, against PyTorch:
  - torch.autograd.gradcheck in float64 (attn's reference kernels) on small
    shapes: scaled_dot_product_attention (causal top-left, T != S, scale,
    GQA, 3-D inputs, dropout with a fixed seed), flash_attn_func (causal
    bottom-right, window, softcap, ALiBi, GQA, v_head_dim != head_dim) and
    flash_attn_varlen_func;
  - float32 against an explicit float64 computation in torch (forward and
    every gradient) on random shapes and every option, and against
    PyTorch's own float32 SDPA where it has the option (is_causal, scale,
    T != S; GQA from torch 2.5); strided views read in place; out and
    the gradients with PyTorch 2.15's strides; an attn_mask gives
    PyTorch's result (on attn's block maps, or falling back to PyTorch);
  - dropout: the keep rate, the 1 / (1 - p) scaling, reproducible under
    torch.manual_seed, and the backward using the forward's mask;
  - patch() / patched(): F.scaled_dot_product_attention routed and restored;
  - a nanoGPT-style model trained 50 steps on CPU (no dropout): the loss
    curve under patch() matches PyTorch's own within float32 noise.
usage: test_torch_binding.py LIBATTN_SO   (any torch >= 1.13)
"""
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if len(sys.argv) > 1:
    os.environ["ATTN_LIBRARY"] = sys.argv[1]
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attn  # noqa: E402
import attn.torch as AT  # noqa: E402

_TORCH2 = int(torch.__version__.split(".")[0]) >= 2

passed = failed = 0
T0 = time.time()


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)
        sys.stdout.flush()


def err(got, want):
    """max |got - want| / max(1, max |want|)"""
    got, want = got.detach().double(), want.detach().double()
    if got.shape != want.shape:
        return float("inf")
    if want.numel() == 0:
        return 0.0
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


seed = int.from_bytes(os.urandom(4), "little") % 100000
print(f"attn {attn.__version__} from {attn._lib.path}; torch {torch.__version__}; seed {seed}")
torch.manual_seed(seed)
torch.set_num_threads(2)
HAS_SDPA = hasattr(F, "scaled_dot_product_attention")
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])


# ---- the explicit float64 computation -----------------------------------------------

def reference(q, k, v, *, causal=False, top_left=False, scale=None, window=None, softcap=0.0,
              alibi=None, keep=None, p=0.0, layout="bhtd", lens=None):
    """Attention of the contract written out in torch (float64 in, float64
    out): q (B, H, T, D) (layout "bthd": (B, T, H, D)); keep: a (B, H, T, S)
    dropout mask scaled by 1 / (1 - p)."""
    if layout == "bthd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    B, H, T, D = q.shape
    Hkv, S = k.size(1), k.size(2)
    if Hkv != H:
        k = k.repeat_interleave(H // Hkv, 1)
        v = v.repeat_interleave(H // Hkv, 1)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    pos = torch.arange(T, dtype=torch.float64)[:, None] + (0 if top_left else S - T)
    j = torch.arange(S, dtype=torch.float64)[None, :]
    if alibi is not None:
        s = s - alibi.double()[None, :, None, None] * (pos - j).abs()
    visible = torch.ones(T, S, dtype=torch.bool)
    if causal:
        visible &= j <= pos
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= j >= pos - left
        if right >= 0:
            visible &= j <= pos + right
    s = s.masked_fill(~visible, float("-inf"))
    m = s.amax(-1, keepdim=True).clamp(min=-1e300)
    e = torch.exp(s - m)
    w = e / e.sum(-1, keepdim=True).clamp(min=1e-300)
    if keep is not None:
        w = w * keep.double() / (1 - p) if keep.dtype == torch.bool else w * keep.double()
    out = w @ v
    return out.transpose(1, 2) if layout == "bthd" else out


def grads_of(fn, inputs, dout):
    xs = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*xs)
    out.backward(dout)
    return out.detach(), [x.grad for x in xs]


# ---- 1. gradcheck in float64 ----------------------------------------------------------

def gradcheck(name, fn, shapes, seed_each_call=None):
    xs = [torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in shapes]
    if seed_each_call is not None:
        inner = fn

        def fn(*a):
            torch.manual_seed(seed_each_call)
            return inner(*a)
    try:
        ok = torch.autograd.gradcheck(fn, xs, eps=1e-6, atol=1e-6, rtol=1e-4)
    except Exception as e:  # noqa: BLE001
        print(f"  {name}: {e}"[:2000])
        ok = False
    check(ok, f"gradcheck {name}")


def test_gradcheck():
    sd = AT.scaled_dot_product_attention
    fa = AT.flash_attn_func
    B, H, T, S, D = 2, 2, 3, 5, 4
    gradcheck("sdpa", lambda q, k, v: sd(q, k, v), [(B, H, T, D), (B, H, S, D), (B, H, S, D)])
    gradcheck("sdpa causal T<S", lambda q, k, v: sd(q, k, v, is_causal=True),
              [(B, H, T, D), (B, H, S, D), (B, H, S, 3)])
    gradcheck("sdpa causal T>S", lambda q, k, v: sd(q, k, v, is_causal=True, scale=0.3),
              [(1, H, 6, D), (1, H, 4, D), (1, H, 4, D)])
    gradcheck("sdpa gqa", lambda q, k, v: sd(q, k, v, is_causal=True, enable_gqa=True),
              [(1, 4, 4, 3), (1, 2, 4, 3), (1, 2, 4, 3)])
    gradcheck("sdpa 3-D", lambda q, k, v: sd(q, k, v), [(2, 3, 4), (2, 5, 4), (2, 5, 2)])
    # a float64 additive mask keeps its bits (the library's masks are float32:
    # such a call goes to PyTorch), its gradient included
    gradcheck("sdpa float64 additive mask", lambda q, k, v, m: sd(q, k, v, attn_mask=m),
              [(1, H, T, D), (1, H, S, D), (1, H, S, D), (T, S)])
    gradcheck("sdpa dropout", lambda q, k, v: sd(q, k, v, dropout_p=0.3, is_causal=True),
              [(1, H, 4, 3), (1, H, 4, 3), (1, H, 4, 3)], seed_each_call=11)
    gradcheck("flash causal T<S", lambda q, k, v: fa(q, k, v, causal=True),
              [(B, T, H, D), (B, S, H, D), (B, S, H, D)])
    gradcheck("flash causal T>S", lambda q, k, v: fa(q, k, v, causal=True),
              [(1, 6, H, D), (1, 4, H, D), (1, 4, H, D)])
    gradcheck("flash gqa window", lambda q, k, v: fa(q, k, v, causal=True, window_size=(2, 0)),
              [(1, 5, 4, 3), (1, 5, 2, 3), (1, 5, 2, 3)])
    gradcheck("flash window both sides", lambda q, k, v: fa(q, k, v, window_size=(1, 2)),
              [(1, 5, 2, 3), (1, 6, 2, 3), (1, 6, 2, 5)])
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    gradcheck("flash softcap alibi gqa",
              lambda q, k, v: fa(q, k, v, causal=True, softcap=1.5, alibi_slopes=slopes,
                                 softmax_scale=0.8),
              [(1, 4, 4, 3), (1, 5, 2, 3), (1, 5, 2, 3)])
    gradcheck("flash dropout", lambda q, k, v: fa(q, k, v, dropout_p=0.25, causal=True),
              [(1, 4, 2, 3), (1, 4, 2, 3), (1, 4, 2, 3)], seed_each_call=5)
    cu_q = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    gradcheck("flash varlen causal alibi",
              lambda q, k, v: AT.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 4, causal=True,
                                                        alibi_slopes=slopes[:2], softcap=2.0),
              [(5, 2, 3), (8, 1, 3), (8, 1, 3)])


# ---- 2. float32 against float64 torch and PyTorch's SDPA ------------------------------------

def pytorch_sdpa(q, k, v, is_causal=False, scale=None):
    """PyTorch's own float32 SDPA (1.13: the private one, without scale)."""
    if HAS_SDPA and AT._torch_sdpa is not None:
        kw = {} if scale is None else {"scale": scale}
        return AT._torch_sdpa(q, k, v, is_causal=is_causal, **kw)
    return F._scaled_dot_product_attention(q, k, v, is_causal=is_causal)[0]


def compare(name, attn_fn, ref_fn, inputs, dout, tol=2e-5):
    out, gs = grads_of(attn_fn, inputs, dout)
    wout, wgs = grads_of(ref_fn, [t.double() for t in inputs], dout.double())
    worst = max([err(out, wout)] + [err(g, w) for g, w in zip(gs, wgs)])
    check(worst <= tol, f"{name}: off by {worst:.3g} (tol {tol})")
    return worst


def random_sdpa_case(rng_seed):
    g = torch.Generator().manual_seed(rng_seed)

    def ri(lo, hi):
        return int(torch.randint(lo, hi + 1, (), generator=g))
    B, Hkv = ri(1, 2), ri(1, 3)
    H = Hkv * ri(1, 2)
    T, S, D = ri(1, 40), ri(1, 40), ri(1, 33)
    Dv = D if ri(0, 1) else ri(1, 20)
    causal = bool(ri(0, 1))
    scale = None if ri(0, 1) else 0.05 + 0.5 * float(torch.rand((), generator=g))
    return B, H, Hkv, T, S, D, Dv, causal, scale


def test_float32():
    worst = 0.0
    for n in range(40):
        B, H, Hkv, T, S, D, Dv, causal, scale = random_sdpa_case(seed + n)
        gqa = H != Hkv
        q, k, v = torch.randn(B, H, T, D), torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, Dv)
        dout = torch.randn(B, H, T, Dv)
        tag = f"sdpa {B, H, Hkv, T, S, D, Dv} causal={causal} scale={scale}"
        worst = max(worst, compare(
            tag, lambda q, k, v: AT.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=gqa),
            lambda q, k, v: reference(q, k, v, causal=causal, top_left=True, scale=scale),
            [q, k, v], dout))
        if gqa and TORCH < (2, 5):
            continue
        if scale is not None and not HAS_SDPA:
            continue
        # PyTorch's own float32 SDPA, forward and gradients
        if gqa:
            mine, gm = grads_of(lambda q, k, v: AT.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=True), [q, k, v], dout)
            theirs, gt = grads_of(lambda q, k, v: AT._torch_sdpa(
                q, k, v, is_causal=causal, scale=scale, enable_gqa=True), [q, k, v], dout)
        else:
            mine, gm = grads_of(lambda q, k, v: AT.scaled_dot_product_attention(
                q, k, v, is_causal=causal, scale=scale), [q, k, v], dout)
            theirs, gt = grads_of(lambda q, k, v: pytorch_sdpa(q, k, v, causal, scale),
                                  [q, k, v], dout)
        if causal and T > S:
            # rows past the keys: PyTorch's top-left mask leaves them every
            # key; both agree. (No row is empty with top-left alignment.)
            pass
        e = max([err(mine, theirs)] + [err(a, b) for a, b in zip(gm, gt)])
        check(e <= 3e-5, f"{tag} vs PyTorch's SDPA: off by {e:.3g}")
    print(f"  sdpa float32 vs float64: worst {worst:.3g}")

    # flash_attn_func: every option, against the float64 computation
    worst = 0.0
    cases = [
        dict(causal=True), dict(causal=False), dict(causal=True, window_size=(7, 0)),
        dict(window_size=(3, 5)), dict(softcap=2.5), dict(alibi=True, causal=True),
        dict(causal=True, softcap=5.0, alibi=True, window_size=(10, -1), softmax_scale=0.2),
    ]
    for n, opt in enumerate(cases):
        g = torch.Generator().manual_seed(seed + 100 + n)
        B, Hkv = 2, 2
        H = Hkv * (1 + n % 2)
        T, S = int(torch.randint(1, 50, (), generator=g)), int(torch.randint(1, 50, (), generator=g))
        D, Dv = 32, 32 if n % 3 else 16
        q, k, v = torch.randn(B, T, H, D), torch.randn(B, S, Hkv, D), torch.randn(B, S, Hkv, Dv)
        dout = torch.randn(B, T, H, Dv)
        slopes = torch.rand(H) * 0.3 if opt.pop("alibi", False) else None
        w = opt.get("window_size")
        worst = max(worst, compare(
            f"flash {B, T, S, H, Hkv} {opt}",
            lambda q, k, v: AT.flash_attn_func(q, k, v, alibi_slopes=slopes, **opt),
            lambda q, k, v: reference(q, k, v, causal=opt.get("causal", False),
                                      scale=opt.get("softmax_scale"), window=w,
                                      softcap=opt.get("softcap", 0.0), alibi=slopes,
                                      layout="bthd"),
            [q, k, v], dout))
    # varlen: each sequence as its own flash_attn_func
    lens_q, lens_k = [5, 0, 17, 9], [8, 3, 17, 4]
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32)
    H, Hkv, D = 4, 2, 16
    q, k, v = torch.randn(sum(lens_q), H, D), torch.randn(sum(lens_k), Hkv, D), torch.randn(sum(lens_k), Hkv, D)
    dout = torch.randn(sum(lens_q), H, D)
    out, lse, none = AT.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                               causal=True, return_attn_probs=True)
    check(none is None and lse.shape == (H, sum(lens_q)), "varlen returns (out, lse (H, total), None)")
    mine, gm = grads_of(lambda q, k, v: AT.flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, window_size=(4, 0)),
        [q, k, v], dout)
    e = 0.0
    for b in range(4):
        a, z, c, y = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        if z == a:
            continue
        seq = [q[a:z][None].double(), k[c:y][None].double(), v[c:y][None].double()]
        want, gw = grads_of(lambda q, k, v: reference(q, k, v, causal=True, window=(4, 0),
                                                      layout="bthd"), seq, dout[a:z][None].double())
        e = max(e, err(mine[a:z], want[0]), err(gm[0][a:z], gw[0][0]))
        # rows of k, v no query of this sequence sees get 0 in the reference too
        e = max(e, err(gm[1][c:y], gw[1][0]), err(gm[2][c:y], gw[2][0]))
    check(e <= 2e-5, f"varlen vs per-sequence float64: off by {e:.3g}")
    # lse: flash-attn's log-sum-exp of the scaled scores
    qq, kk, vv = torch.randn(1, 6, 2, 8), torch.randn(1, 9, 2, 8), torch.randn(1, 9, 2, 8)
    out, lse, none = AT.flash_attn_func(qq, kk, vv, causal=True, return_attn_probs=True)
    s = (qq.double().transpose(1, 2) @ kk.double().transpose(1, 2).transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(torch.ones(6, 9, dtype=torch.bool).tril(3).logical_not(), float("-inf"))
    check(none is None and lse.dtype == torch.float32 and lse.shape == (1, 2, 6) and
          err(lse, torch.logsumexp(s, -1)) <= 1e-5, "flash_attn_func lse")
    # a loss reading lse as well (a z-loss): its gradient reaches q and k
    qq, kk, vv = (t.requires_grad_() for t in (qq, kk, vv))
    out, lse, _ = AT.flash_attn_func(qq, kk, vv, causal=True, return_attn_probs=True)
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    ((out * dout).sum() + (lse * dlse).sum()).backward()
    qo, ko, vo = (t.detach().double().requires_grad_() for t in (qq, kk, vv))
    s = (qo.transpose(1, 2) @ ko.transpose(1, 2).transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(torch.ones(6, 9, dtype=torch.bool).tril(3).logical_not(), float("-inf"))
    want = (torch.softmax(s, -1) @ vo.transpose(1, 2)).transpose(1, 2)
    ((want * dout.double()).sum() + (torch.logsumexp(s, -1) * dlse.double()).sum()).backward()
    e = max(err(qq.grad, qo.grad), err(kk.grad, ko.grad), err(vv.grad, vo.grad))
    check(e <= 1e-5, f"flash_attn_func: gradients through lse off by {e:.3g}")
    print(f"  flash float32 vs float64: worst {worst:.3g}")


def test_layouts_and_fallbacks():
    # strided views read in place; gradients with the inputs' strides
    B, T, H, D = 2, 33, 4, 16
    qkv = torch.randn(B, T, 3 * H * D)
    dout = torch.randn(B, H, T, D)

    def split(x):
        q, k, v = x.split(H * D, dim=2)
        return [t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v)]
    x = qkv.clone().requires_grad_(True)
    q, k, v = split(x)
    seen = []
    q.register_hook(lambda g: seen.append(g.stride()))
    out = AT.scaled_dot_product_attention(q, k, v, is_causal=True)
    check(out.stride() == (T * H * D, D, H * D, 1), "out is (B, T, H, D) in memory, as q")
    out.backward(dout)
    check(seen == [(T * H * D, D, H * D, 1)], f"dq (B, T, H, D) in memory, as PyTorch's: {seen}")
    y = qkv.double().requires_grad_(True)
    ref = reference(*split(y), causal=True, top_left=True)
    ref.backward(dout.double())
    check(err(out, ref) <= 2e-5 and err(x.grad, y.grad) <= 2e-5, "strided qkv split: forward and dqkv")
    # a transposed y reshaped as nanoGPT does: no copy needed
    check(out.transpose(1, 2).is_contiguous(), "out.transpose(1, 2) is contiguous")
    # expanded (overlapping) and non-contiguous last axis: copied once, same numbers
    k1 = torch.randn(B, 1, T, D).requires_grad_(True)
    qf = torch.randn(B, H, T, D)
    ke = k1.expand(B, H, T, D)
    vt = torch.randn(B, H, D, T).transpose(-1, -2)
    o = AT.scaled_dot_product_attention(qf, ke, vt)
    o.sum().backward()
    k2 = k1.detach().double().requires_grad_(True)
    r = reference(qf.double(), k2.expand(B, H, T, D), vt.double())
    r.sum().backward()
    check(err(o, r) <= 2e-5 and err(k1.grad, k2.grad) <= 2e-5, "expanded k, transposed v")
    # inference without grad: no autograd node, no lse kept
    with torch.no_grad():
        o = AT.scaled_dot_product_attention(qf, qf, qf)
    check(o.grad_fn is None, "no_grad: plain tensor")
    # attn_mask (bool, additive): attn's block maps where the library applies
    # them (test_flex_python.py checks those against float64), else PyTorch's
    # result; float16 runs attn's 16-bit calls
    mask = torch.rand(T, T) > 0.3
    mask.fill_diagonal_(True)
    runs_masks = AT._runs_block_maps()
    check((AT.supports(qf, qf, qf, attn_mask=mask) is None) == runs_masks,
          "attn_mask runs on attn exactly where the library applies block maps")
    for m in (mask, torch.randn(T, T)):
        got = AT.scaled_dot_product_attention(qf, qf, qf, attn_mask=m)
        want = AT._pytorch_sdpa(qf, qf, qf, attn_mask=m)
        check(err(got, want) <= 2e-5 if runs_masks else torch.equal(got, want),
              f"attn_mask {m.dtype}: PyTorch's result")
    check(AT.supports(qf.half(), qf.half(), qf.half()) is None, "float16 runs on attn")
    check(AT.supports(qf, qf, qf) is None, "float32 runs on attn")
    check(AT.supports(qf.double(), qf.double(), qf.double()) is None, "float64 runs on attn")
    check(AT.supports(qf, k1.detach(), k1.detach()) is not None, "other heads without enable_gqa")
    check(AT.supports(qf, qf[:1], qf[:1]) is not None, "batch sizes that differ go to PyTorch")
    # bfloat16 through flash_attn_func: attn_sdpa_forward_16, returned in bfloat16
    qb = torch.randn(1, 8, 2, 16).bfloat16()
    ob = AT.flash_attn_func(qb, qb, qb, causal=True)
    check(ob.dtype == torch.bfloat16 and err(ob.float(), AT.flash_attn_func(
        qb.float(), qb.float(), qb.float(), causal=True)) <= 1e-2, "bfloat16 in, bfloat16 out")
    # errors name the values
    try:
        AT.flash_attn_func(torch.randn(1, 4, 3, 8), torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8))
        check(False, "3 heads over 2 kv heads refused")
    except ValueError as e:
        check("divide" in str(e), f"message: {e}")
    # kernel sets this CPU does not run: refused by set_kernels (every later
    # call's context was refused instead, with a message blaming the threads)
    for name in ("reference", "portable", "avx2", "avx512"):
        if attn.kernels_supported(name):
            AT.set_kernels(name)
            check(err(AT.flash_attn_func(qb.float(), qb.float(), qb.float()),
                      AT.flash_attn_func(qb.float(), qb.float(), qb.float())) == 0,
                  f"set_kernels({name!r}) runs")
        else:
            try:
                AT.set_kernels(name)
                check(False, f"set_kernels({name!r}) on a CPU without it: no error")
            except ValueError as e:
                check("does not run" in str(e), f"set_kernels({name!r}): {e}")
    AT.set_kernels("auto")
    # batch sizes that differ: refused (the library read k and v past their end)
    try:
        AT.flash_attn_func(torch.randn(3, 4, 2, 8), torch.randn(2, 4, 2, 8), torch.randn(2, 4, 2, 8))
        check(False, "q of batch 3 over k, v of batch 2 refused")
    except ValueError as e:
        check("(3, 4, 2, 8)" in str(e) and "batch sizes differ" in str(e), f"message: {e}")
    # no rows or no keys: out zeros, lse -inf, zero gradients (the library's
    # calls took the empty tensors for NULL ones); head dim 0 refused by name
    for B, T, S in ((0, 4, 5), (2, 0, 5), (2, 4, 0)):
        qe = torch.randn(B, T, 2, 8, requires_grad=True)
        ke = torch.randn(B, S, 2, 8, requires_grad=True)
        out, lse, _ = AT.flash_attn_func(qe, ke, ke, causal=True, return_attn_probs=True)
        out.sum().backward()
        check(out.shape == (B, T, 2, 8) and lse.shape == (B, 2, T) and
              bool((out == 0).all()) and bool(torch.isneginf(lse).all()) and
              bool((qe.grad == 0).all()) and bool((ke.grad == 0).all()),
              f"flash_attn_func with B {B}, T {T}, S {S}: zeros, lse -inf, zero gradients")
    cu0, cu_q = torch.tensor([0, 0], dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32)
    out, lse, _ = AT.flash_attn_varlen_func(torch.randn(3, 2, 8), torch.randn(0, 2, 8),
                                            torch.randn(0, 2, 8), cu_q, cu0, 3, 0,
                                            return_attn_probs=True)
    check(out.shape == (3, 2, 8) and bool((out == 0).all()) and lse.shape == (2, 3) and
          bool(torch.isneginf(lse).all()), "flash_attn_varlen_func with no keys")
    try:
        AT.flash_attn_func(torch.randn(1, 4, 2, 0), torch.randn(1, 4, 2, 0), torch.randn(1, 4, 2, 0))
        check(False, "head dim 0 refused")
    except ValueError as e:
        check("head dims must be positive" in str(e), f"message: {e}")
    # arguments out of range are ValueErrors naming the values given (docs/python.md)
    x, cu = torch.randn(10, 2, 8), torch.tensor([0, 3, 10])
    for what, call, fragment in (
            ("max_seqlen_q below the longest",
             lambda: AT.flash_attn_varlen_func(x, x, x, cu, cu, 5, 7),
             "max_seqlen_q: 5 is less than the longest sequence of cu_seqlens_q (7 tokens)"),
            ("max_seqlen_q 0", lambda: AT.flash_attn_varlen_func(x, x, x, cu, cu, 0, 7),
             "max_seqlen_q: 0 is less"),
            ("decreasing offsets",
             lambda: AT.flash_attn_varlen_func(x, x, x, torch.tensor([0, 6, 3, 10]),
                                               torch.tensor([0, 6, 3, 10]), 7, 7),
             "cu_seqlens_q[1] = 6 > cu_seqlens_q[2] = 3"),
            ("a slope of NaN",
             lambda: AT.flash_attn_func(x[None], x[None], x[None],
                                        alibi_slopes=torch.tensor([float("nan"), 1.0])),
             "alibi_slopes: expected finite slopes")):
        try:
            call()
            check(False, f"flash_attn {what}: no error")
        except ValueError as e:
            check(fragment in str(e), f"flash_attn {what}: {e}")
    # SDPA's output is a tensor of its own, which an in-place op may change
    qg = torch.randn(1, 2, 4, 8, requires_grad=True)
    out = AT.scaled_dot_product_attention(qg, qg, qg)
    try:
        out.add_(1)
        check(out._base is None and out.stride() == (64, 32, 8, 1),
              f"scaled_dot_product_attention's output changed in place (strides {out.stride()})")
    except RuntimeError as e:
        check(False, f"scaled_dot_product_attention's output changed in place: {e}")


def test_pytorch_strides():
    # out and the gradients of q, k, v have PyTorch 2.15's strides (its CPU
    # flash kernel: out empty_like(query), the gradients (B, T, H, D) in
    # memory; its math path, for dropout, head dims that differ, a mask that
    # wants a gradient or is 3-D with 4-D inputs, or a last axis not
    # contiguous: matmul results), so
    # out.view(B * H, T, D) works where it works on PyTorch's. The table is
    # PyTorch 2.15's, checked against it where the torch running is 2.15.
    B, H, T, S, D = 2, 3, 5, 7, 4

    def laid(shape, order, g):
        """A tensor of this shape whose dims lie in memory in this order."""
        t = torch.randn([shape[d] for d in order], generator=g)
        return t.permute([order.index(d) for d in range(len(order))])

    def bthd(b, h, t, d, g):
        return laid((b, h, t, d), (0, 2, 1, 3), g)

    def contiguous(*shape, g):
        return torch.randn(*shape, generator=g)

    C = (60, 20, 4, 1)                         # (B, H, T, D) contiguous
    QG, KG = (60, 4, 12, 1), (84, 4, 12, 1)    # (B, T, H, D) in memory
    KT = (84, 28, 1, 7)                        # the math path's dk: (B, H, D, S) in memory
    cases = [  # name, inputs, kwargs, out, (dq, dk, dv) or None
        ("contiguous", lambda g: (contiguous(B, H, T, D, g=g), contiguous(B, H, S, D, g=g),
                                  contiguous(B, H, S, D, g=g)), {}, C, (QG, KG, KG)),
        ("causal, scale", lambda g: (contiguous(B, H, T, D, g=g), contiguous(B, H, S, D, g=g),
                                     contiguous(B, H, S, D, g=g)),
         {"is_causal": True, "scale": 0.3}, C, (QG, KG, KG)),
        ("(B, T, H, D) views", lambda g: (bthd(B, H, T, D, g), bthd(B, H, S, D, g),
                                          bthd(B, H, S, D, g)), {}, QG, (QG, KG, KG)),
        ("(H, B, T, D) in memory", lambda g: (laid((B, H, T, D), (1, 0, 2, 3), g),
                                              contiguous(B, H, S, D, g=g),
                                              contiguous(B, H, S, D, g=g)),
         {}, (20, 40, 4, 1), (QG, KG, KG)),
        ("(T, B, H, D) in memory", lambda g: (laid((B, H, T, D), (2, 0, 1, 3), g),
                                              contiguous(B, H, S, D, g=g),
                                              contiguous(B, H, S, D, g=g)),
         {}, (12, 4, 24, 1), (QG, KG, KG)),
        ("q of a fused qkv", lambda g: (torch.randn(B, T, 3, H, D, generator=g)[:, :, 0]
                                        .transpose(1, 2), bthd(B, H, S, D, g),
                                        bthd(B, H, S, D, g)), {}, QG, (QG, KG, KG)),
        ("q sliced in its head dim", lambda g: (contiguous(B, H, T, 2 * D, g=g)[..., :D],
                                                contiguous(B, H, S, D, g=g),
                                                contiguous(B, H, S, D, g=g)),
         {}, C, (QG, KG, KG)),
        ("q expanded over batch", lambda g: (contiguous(1, H, T, D, g=g).expand(B, H, T, D),
                                             contiguous(B, H, S, D, g=g),
                                             contiguous(B, H, S, D, g=g)), {}, C, None),
        ("one query token", lambda g: (bthd(B, H, 1, D, g), contiguous(B, H, S, D, g=g),
                                       contiguous(B, H, S, D, g=g)),
         {}, (12, 4, 12, 1), ((12, 4, 12, 1), KG, KG)),
        ("GQA", lambda g: (contiguous(B, H, T, D, g=g), contiguous(B, 1, S, D, g=g),
                           contiguous(B, 1, S, D, g=g)),
         {"enable_gqa": True}, C, (QG, (28, 4, 4, 1), (28, 4, 4, 1))),
        ("3-D", lambda g: (contiguous(H, T, D, g=g), contiguous(H, S, D, g=g),
                           contiguous(H, S, D, g=g)), {}, (20, 4, 1),
         ((4, 12, 1), (4, 12, 1), (4, 12, 1))),
        ("3-D (T, N, E) in memory", lambda g: (laid((H, T, D), (1, 0, 2), g),
                                               contiguous(H, S, D, g=g),
                                               contiguous(H, S, D, g=g)), {}, (4, 12, 1),
         ((4, 12, 1), (4, 12, 1), (4, 12, 1))),
        ("dropout", lambda g: (bthd(B, H, T, D, g), bthd(B, H, S, D, g), bthd(B, H, S, D, g)),
         {"dropout_p": 0.25}, C, (C, KT, (84, 28, 4, 1))),
        ("v's head dim 6", lambda g: (bthd(B, H, T, D, g), bthd(B, H, S, D, g),
                                      bthd(B, H, S, 6, g)), {}, (90, 30, 6, 1),
         (C, KT, (126, 42, 6, 1))),
        ("v's last axis strided", lambda g: (bthd(B, H, T, D, g), bthd(B, H, S, D, g),
                                             contiguous(B, H, D, S, g=g).transpose(2, 3)),
         {}, C, (C, KT, (84, 28, 4, 1))),
        ("dropout, GQA", lambda g: (bthd(B, H, T, D, g), contiguous(B, 1, S, D, g=g),
                                    contiguous(B, 1, S, D, g=g)),
         {"dropout_p": 0.25, "enable_gqa": True}, C, (C, (28, 28, 4, 1), (28, 28, 4, 1))),
        ("3-D, dropout", lambda g: (contiguous(H, T, D, g=g), contiguous(H, S, D, g=g),
                                    contiguous(H, S, D, g=g)), {"dropout_p": 0.25},
         (20, 4, 1), ((20, 4, 1), (28, 1, 7), (28, 4, 1))),
    ]
    if AT._runs_block_maps():
        cases += [
            ("bool mask", lambda g: (bthd(B, H, T, D, g), bthd(B, H, S, D, g),
                                     bthd(B, H, S, D, g)),
             {"attn_mask": torch.rand(T, S, generator=torch.Generator().manual_seed(3)) > 0.3},
             QG, (QG, KG, KG)),
            ("3-D mask, 4-D inputs", lambda g: (bthd(B, H, T, D, g), bthd(B, H, S, D, g),
                                                bthd(B, H, S, D, g)),
             {"attn_mask": torch.rand(H, T, S, generator=torch.Generator().manual_seed(4)) > 0.3},
             C, (C, KT, (84, 28, 4, 1))),
            ("additive mask that wants a gradient",
             lambda g: (bthd(B, H, T, D, g), bthd(B, H, S, D, g), bthd(B, H, S, D, g)),
             {"attn_mask": torch.randn(T, S).requires_grad_(True)}, C, (C, KT, (84, 28, 4, 1))),
        ]
    on_215 = AT._torch_sdpa is not None and TORCH == (2, 15)
    for dtype in (torch.float32, torch.bfloat16):
        for name, make, kw, want_out, want_grads in cases:
            name = f"{name} ({dtype})"
            q, k, v = (t.to(dtype).requires_grad_(True) for t in make(torch.Generator()
                                                                    .manual_seed(5)))
            torch.manual_seed(9)
            out = AT.scaled_dot_product_attention(q, k, v, **kw)
            grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
            got = (out.stride(), tuple(g.stride() for g in grads))
            check(out.stride() == want_out, f"{name}: out strides {out.stride()}, PyTorch's "
                  f"{want_out}")
            if want_grads is not None:
                check(got[1] == want_grads, f"{name}: gradient strides {got[1]}, PyTorch's "
                      f"{want_grads}")
            if on_215:
                torch.manual_seed(9)
                theirs = AT._torch_sdpa(q, k, v, **kw)
                their_grads = torch.autograd.grad(theirs, (q, k, v), torch.ones_like(theirs))
                theirs = (theirs.stride(), tuple(g.stride() for g in their_grads))
                check(theirs[0] == want_out and want_grads in (None, theirs[1]),
                      f"{name}: the table is not PyTorch {torch.__version__}'s: {theirs}")
            if kw.get("dropout_p") or dtype != torch.float32:
                continue
            # the values, written through those strides
            k2, v2 = k, v
            if q.size(-3) != k.size(-3) and q.dim() == 4:
                k2, v2 = (t.repeat_interleave(q.size(1) // t.size(1), 1) for t in (k, v))
            mask = kw.get("attn_mask")
            qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k2, v2))
            if q.dim() == 3:
                ref = reference(qd[None], kd[None], vd[None], causal=kw.get("is_causal", False),
                                top_left=True, scale=kw.get("scale"))[0]
            elif mask is not None and mask.dtype == torch.bool:
                ref = AT._math_sdpa(qd, kd, vd, attn_mask=mask)
            elif mask is not None:
                ref = AT._math_sdpa(qd, kd, vd, attn_mask=mask.detach().double())
            else:
                ref = reference(qd, kd, vd, causal=kw.get("is_causal", False), top_left=True,
                                scale=kw.get("scale"))
            ref_grads = torch.autograd.grad(ref, (qd, kd, vd), torch.ones_like(ref))
            worst = max([err(out, ref)] + [err(g, r) for g, r in zip(grads, ref_grads)
                                           if g.shape == r.shape])
            check(worst <= 2e-5, f"{name}: out and gradients off by {worst:.3g}")
    # what the strides are for: PyTorch's out of contiguous inputs is contiguous
    q = torch.randn(B, H, T, D)
    try:
        AT.scaled_dot_product_attention(q, q, q).view(B * H, T, D)
        check(True, "out.view(B * H, T, D) of contiguous inputs")
    except RuntimeError as e:
        check(False, f"out.view(B * H, T, D) of contiguous inputs: {e}")


# ---- 3. dropout ----------------------------------------------------------------------------

def test_dropout():
    B, H, T, S, p = 2, 3, 64, 64, 0.1
    q = torch.zeros(B, H, T, 8)
    k = torch.zeros(B, H, S, 8)
    eye = torch.eye(S).expand(B, H, S, S)
    torch.manual_seed(1234)
    A = AT.scaled_dot_product_attention(q, k, eye, dropout_p=p)  # = dropout(1/S) per weight
    kept = A != 0
    rate = float(kept.float().mean())
    n = kept.numel()
    check(abs(rate - (1 - p)) <= 5 * math.sqrt(p * (1 - p) / n), f"keep rate {rate:.4f} vs {1 - p}")
    vals = A[kept] * S
    want = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32)
    check(float((vals - want).abs().max()) <= 1e-6, "kept weights scaled by 1 / (1 - p)")
    torch.manual_seed(1234)
    A2 = AT.scaled_dot_product_attention(q, k, eye, dropout_p=p)
    check(torch.equal(A, A2), "same mask after the same torch.manual_seed")
    A3 = AT.scaled_dot_product_attention(q, k, eye, dropout_p=p)
    check(not torch.equal(A, A3), "a new mask on the next call")
    # rows are independent: per-row keep counts spread as a binomial would
    per_row = kept.float().sum(-1).flatten()
    check(abs(float(per_row.std()) - math.sqrt(S * p * (1 - p))) <= 0.25 * math.sqrt(S * p * (1 - p)),
          f"per-row kept count spread {float(per_row.std()):.3f}")
    # the backward uses the forward's mask: gradients against the float64
    # computation with the mask revealed above (the same seed)
    for causal in (False, True):
        qr, kr, vr = torch.randn(B, H, T, 8), torch.randn(B, H, S, 8), torch.randn(B, H, S, 8)
        dout = torch.randn(B, H, T, 8)
        torch.manual_seed(99)
        Am = AT.scaled_dot_product_attention(torch.zeros_like(qr), torch.zeros_like(kr), eye,
                                             dropout_p=p)
        keep = Am != 0
        torch.manual_seed(99)
        out, gs = grads_of(lambda q, k, v: AT.scaled_dot_product_attention(
            q, k, v, dropout_p=p, is_causal=causal), [qr, kr, vr], dout)
        wout, wgs = grads_of(lambda q, k, v: reference(q, k, v, causal=causal, top_left=True,
                                                       keep=keep.double() * float(want)),
                             [qr.double(), kr.double(), vr.double()], dout.double())
        e = max([err(out, wout)] + [err(g, w) for g, w in zip(gs, wgs)])
        check(e <= 2e-5, f"dropout causal={causal}: forward and backward with the mask: off by {e:.3g}")
    # float64: kept weights scaled by 1 / (1 - p) in double (a float32 scale
    # is 2.4e-8 off at p = 0.3), out and gradients at float64's precision
    pd = 0.3
    torch.manual_seed(5)
    Ad = AT.scaled_dot_product_attention(q.double(), k.double(), eye.double(), dropout_p=pd)
    keep_d = Ad != 0
    scale_err = float((Ad[keep_d] * S - 1.0 / (1.0 - pd)).abs().max())
    check(scale_err <= 1e-14,
          f"float64 kept weights scaled by 1 / (1 - p) in double: {scale_err:.3g}")
    qr, kr, vr = (torch.randn(B, H, n_, 8, dtype=torch.float64) for n_ in (T, S, S))
    dout = torch.randn(B, H, T, 8, dtype=torch.float64)
    torch.manual_seed(5)
    out, gs = grads_of(lambda q, k, v: AT.scaled_dot_product_attention(q, k, v, dropout_p=pd),
                       [qr, kr, vr], dout)
    wout, wgs = grads_of(lambda q, k, v: reference(q, k, v, keep=keep_d.double() / (1.0 - pd)),
                         [qr, kr, vr], dout)
    e = max([err(out, wout)] + [err(g, w) for g, w in zip(gs, wgs)])
    check(e <= 1e-12, f"float64 dropout: forward and backward with the mask: off by {e:.3g}")
    # flash_attn_func dropout: same statistics
    torch.manual_seed(7)
    Af = AT.flash_attn_func(torch.zeros(1, T, 4, 8), torch.zeros(1, S, 4, 8),
                            torch.eye(S)[None, :, None, :].expand(1, S, 4, S), dropout_p=0.3)
    rate = float((Af != 0).float().mean())
    check(abs(rate - 0.7) <= 5 * math.sqrt(0.21 / Af.numel()), f"flash keep rate {rate:.4f} vs 0.7")


# ---- 4. patch() ---------------------------------------------------------------------------

def test_patch():
    before = getattr(F, "scaled_dot_product_attention", None)
    with AT.patched():
        check(AT.is_patched(), "patched() routes F.scaled_dot_product_attention")
        q = torch.randn(1, 2, 5, 4)
        check(torch.equal(F.scaled_dot_product_attention(q, q, q, is_causal=True),
                          AT.scaled_dot_product_attention(q, q, q, is_causal=True)),
              "F.scaled_dot_product_attention is attn's")
    check(getattr(F, "scaled_dot_product_attention", None) is before, "restored after the block")
    AT.patch()
    AT.patch()
    AT.unpatch()
    check(AT.is_patched(), "nested patch")
    AT.unpatch()
    check(getattr(F, "scaled_dot_product_attention", None) is before, "unpatch restores")


# ---- 5. a nanoGPT-style training loop -------------------------------------------------------

class CausalSelfAttention(torch.nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = torch.nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = torch.nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # nanoGPT's flash check
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).tril().logical_not(), float("-inf"))
            y = torch.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(torch.nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(n_embd), torch.nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(n_embd, 4 * n_embd), torch.nn.GELU(),
                                       torch.nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(torch.nn.Module):
    def __init__(self, vocab, block, n_layer, n_head, n_embd):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, n_embd), torch.nn.Embedding(block, n_embd)
        self.h = torch.nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = torch.nn.LayerNorm(n_embd)
        self.lm_head = torch.nn.Linear(n_embd, vocab, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def train(steps, patched):
    torch.manual_seed(0)
    model = GPT(vocab=24, block=32, n_layer=3, n_head=4, n_embd=48)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    # sequences with structure to learn: arithmetic progressions mod vocab
    starts = torch.randint(0, 24, (64, 1), generator=g)
    steps_of = torch.randint(1, 4, (64, 1), generator=g)
    data = (starts + steps_of * torch.arange(33)) % 24
    losses = []
    if patched:
        AT.patch()
    try:
        for s in range(steps):
            batch = data[(torch.arange(8) + 8 * s) % 64]
            loss = model(batch[:, :-1], batch[:, 1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
    finally:
        if patched:
            AT.unpatch()
    return losses


def test_training():
    # one thread: PyTorch's OpenMP threads spin, and on a loaded 2-core machine
    # two of them can take 30x longer
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    t = time.time()
    theirs = train(50, False)
    t_theirs = time.time() - t
    t = time.time()
    mine = train(50, True)
    t_mine = time.time() - t
    torch.set_num_threads(threads)
    diff = max(abs(a - b) for a, b in zip(mine, theirs))
    print(f"  nanoGPT 50 steps: loss {theirs[0]:.4f} -> {theirs[-1]:.4f} (PyTorch, {t_theirs:.1f} s), "
          f"{mine[0]:.4f} -> {mine[-1]:.4f} (patch(), {t_mine:.1f} s); max |diff| {diff:.2e}")
    check(theirs[-1] < theirs[0] - 0.5, "the model learns")
    check(abs(mine[0] - theirs[0]) <= 1e-5, f"step 0 loss: {mine[0]} vs {theirs[0]}")
    check(diff <= 2e-3, f"loss curves differ by {diff:.3g} (float32 noise is ~1e-4)")


# ---- 6. transforms and autocast ------------------------------------------------------------

def test_transforms():
    """What attn cannot run under a torch transform goes to PyTorch (the
    drop-in) or raises (attn's own functions), never a silent wrong
    derivative: forward-mode AD's tangent, torch.func's wrapped tensors,
    CPU autocast's output dtype, and torch.jit.trace's recording."""
    import torch.autograd.forward_ad as fwAD
    q, k, v, tq = (torch.randn(1, 2, 5, 8, dtype=torch.float64) for _ in range(4))
    with fwAD.dual_level():
        dual = fwAD.make_dual(q, tq)
        why = AT.supports(dual, k, v)
        check(why is not None and "forward-mode AD" in why, f"a dual query falls back: {why}")
        def tangent(fn):  # the output's tangent, or the error PyTorch raises
            try:
                return fwAD.unpack_dual(fn(dual, k, v)).tangent
            except NotImplementedError as e:
                return e
        got, want = tangent(AT.scaled_dot_product_attention), tangent(AT._pytorch_sdpa)
        if isinstance(want, NotImplementedError):  # PyTorch 2's fused kernel has no jvp
            check(isinstance(got, NotImplementedError), f"the drop-in raises as PyTorch: {got}")
        else:  # the math path written out in torch has one
            check(got is not None and want is not None and torch.equal(got, want),
                  "the drop-in's tangent is PyTorch's")
        try:
            AT.flash_attn_func(dual.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            check(False, "flash_attn_func with a dual query raises")
        except NotImplementedError as e:
            check("forward-mode AD" in str(e), f"flash_attn_func names forward-mode AD: {e}")
    func = getattr(torch, "func", None)
    if func is not None and hasattr(func, "vmap"):
        qs, ks, vs = (torch.randn(3, 2, 5, 8) for _ in range(3))
        got = func.vmap(AT.scaled_dot_product_attention)(qs, ks, vs)
        want = func.vmap(AT._pytorch_sdpa)(qs, ks, vs)
        check(torch.allclose(got, want, atol=1e-6), "vmap of the drop-in runs PyTorch's")
        g = func.grad(lambda a: AT.scaled_dot_product_attention(a, ks[0], vs[0]).sum())(qs[0])
        w = func.grad(lambda a: AT._pytorch_sdpa(a, ks[0], vs[0]).sum())(qs[0])
        check(torch.allclose(g, w, atol=1e-6), "torch.func.grad of the drop-in is PyTorch's")
    nested = getattr(torch, "nested", None)
    if nested is not None and _TORCH2:
        jagged = nested.nested_tensor([torch.randn(2, 3, 8), torch.randn(2, 5, 8)],
                                      layout=torch.jagged).transpose(1, 2)
        why = AT.supports(jagged, jagged, jagged)
        check(why is not None and "nested" in why, f"a jagged tensor falls back: {why}")
        got = AT.scaled_dot_product_attention(jagged, jagged, jagged)
        want = AT._pytorch_sdpa(jagged, jagged, jagged)
        check(all(torch.equal(a, b) for a, b in zip(got.unbind(), want.unbind())),
              "a jagged tensor's attention is PyTorch's")
    q32, k32, v32 = (t.float() for t in (q, k, v))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        why = AT.supports(q32, k32, v32)
        got = AT.scaled_dot_product_attention(q32, k32, v32)
        want = AT._pytorch_sdpa(q32, k32, v32)
    check(why is not None and "autocast" in why, f"CPU autocast falls back: {why}")
    check(got.dtype == want.dtype and torch.equal(got, want),
          f"under autocast the output is PyTorch's ({got.dtype} vs {want.dtype})")
    # torch.jit.trace records torch ops only: a trace of attn's call would
    # hold the output's torch.empty and not the library call that fills it,
    # and return uninitialised memory when run on other inputs
    x, y = torch.randn(1, 2, 8, 4), torch.randn(1, 2, 8, 4)
    keep = torch.rand(8, 8) > 0.3
    for what, fn in (("is_causal", lambda a: AT.scaled_dot_product_attention(
                         a, a, a, is_causal=True)),
                     ("attn_mask", lambda a: AT.scaled_dot_product_attention(
                         a, a, a, attn_mask=keep))):
        traced = torch.jit.trace(fn, (x,), check_trace=False)
        check(torch.allclose(traced(y), fn(y), atol=1e-6),
              f"a torch.jit.trace of the drop-in ({what}) runs PyTorch's on new inputs")
    # torch.compile traces the drop-in into PyTorch's SDPA, which it can
    # compile, with fullgraph=True too (attn's ctypes calls are no torch ops)
    if hasattr(getattr(torch, "compiler", None), "is_compiling"):
        xg = x.clone().requires_grad_(True)
        for what, kw in (("is_causal", {"is_causal": True}), ("attn_mask", {"attn_mask": keep})):
            torch._dynamo.reset()
            fn = lambda a, kw=kw: AT.scaled_dot_product_attention(a, a * 2, a + 1, **kw)  # noqa
            try:
                got = torch.compile(fn, backend="eager", fullgraph=True)(xg)
            except Exception as e:  # noqa: BLE001 - the failure reported
                check(False, f"torch.compile(fullgraph=True) of the drop-in ({what}): "
                      f"{type(e).__name__}: {str(e).splitlines()[0]}")
                continue
            want = AT._pytorch_sdpa(xg, xg * 2, xg + 1, **kw)
            g, = torch.autograd.grad(got.sum(), xg)
            w, = torch.autograd.grad(want.sum(), xg)
            check(torch.equal(got, want) and torch.equal(g, w),
                  f"torch.compile of the drop-in ({what}) runs PyTorch's SDPA")
    try:
        torch.jit.trace(lambda a: AT.flash_attn_func(a, a, a), (x,), check_trace=False)
        check(False, "torch.jit.trace of flash_attn_func raises")
    except NotImplementedError as e:
        check("torch.jit.trace" in str(e), f"flash_attn_func names torch.jit.trace: {e}")


def test_saved_tensor_hooks():
    """Saved-tensor hooks (activation offloading, compression) may unpack
    copies in other layouts than the forward saved: the gradients are the
    same. save_on_cpu(pin_memory=True) copies into contiguous tensors, so
    out comes back (B, H, T, D) in memory, not the forward's (B, T, H, D)."""
    torch.manual_seed(13)
    B, T, H, D = 2, 9, 4, 8
    qkv = torch.randn(B, T, 3 * H * D)
    dout = torch.randn(B, H, T, D)

    def split(x):
        q, k, v = x.split(H * D, dim=2)
        return [t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v)]
    y = qkv.double().requires_grad_(True)
    ref = reference(*split(y), causal=True, top_left=True)
    ref.backward(dout.double())
    G = torch.autograd.graph
    hooks = (("a contiguous copy", lambda: G.saved_tensors_hooks(
                  lambda t: t.clone(memory_format=torch.contiguous_format), lambda t: t)),
             ("save_on_cpu(pin_memory=True)", lambda: G.save_on_cpu(pin_memory=True)))
    for name, hook in hooks:
        x = qkv.clone().requires_grad_(True)
        with hook():
            out = AT.scaled_dot_product_attention(*split(x), is_causal=True)
        out.backward(dout)
        check(err(out, ref) <= 2e-5 and err(x.grad, y.grad) <= 2e-5,
              f"saved tensors unpacked as {name}: dqkv off by {err(x.grad, y.grad):.3g}")


def test_mask_one_hot_rows():
    """A boolean attn_mask runs on the block-map kernels, whose scores stay
    unscaled in the forward: with a scale that makes every row one-hot
    (scores near 1e10 and 1e30), the backward's weights must still be the
    forward's, so out and the gradients are float64's, finite, not the
    exp of the scaled scores' rounding (inf and NaN)."""
    if not AT._runs_block_maps():
        return
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 8, 8, generator=g) for _ in range(3))
    keep = torch.rand(8, 8, generator=g) < 0.7
    keep[:, 0] = True
    dout = torch.randn(1, 2, 8, 8, generator=g)

    def masked(a, b, c, scale):
        s = (a @ b.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
        return torch.softmax(s, -1) @ c

    for scale in (1e3, 1e10, 1e30):
        out, grads = grads_of(lambda a, b, c: AT.scaled_dot_product_attention(
            a, b, c, attn_mask=keep, scale=scale), [q, k, v], dout)
        want, wgrads = grads_of(lambda a, b, c: masked(a, b, c, scale),
                                [t.double() for t in (q, k, v)], dout.double())
        for name, got, ref in zip(("out", "dq", "dk", "dv"), [out] + grads, [want] + wgrads):
            finite = bool(torch.isfinite(got).all())
            # dq and dk are 0 (one-hot rows) plus the scale times a rounding:
            # at 1e30 only their finiteness is asked
            check(finite and (err(got, ref) < 1e-5 or (scale > 1e20 and name in ("dq", "dk"))),
                  f"bool attn_mask, scale {scale:g}: {name} "
                  f"{'off by %.3g' % err(got, ref) if finite else 'not finite'}")


def test_thread_counts():
    # torch takes any thread count; attn runs a count past its limit of 4096
    # as 4096, which gives the same bits as 1 thread. torch.get_num_threads
    # is stood in for: torch.set_num_threads(4097) starts 4097 OpenMP threads,
    # which takes most of a minute on a small machine.
    torch.manual_seed(11)
    q, k, v = (torch.randn(2, 3, 70, 16) for _ in range(3))
    dout = torch.randn(2, 3, 70, 16)

    def fn(q, k, v):
        return AT.scaled_dot_product_attention(q, k, v, is_causal=True)

    get_num_threads = torch.get_num_threads
    try:
        torch.get_num_threads = lambda: 1
        want, want_grads = grads_of(fn, (q, k, v), dout)
        for n in (3, 4096, 4097, 10**6):
            torch.get_num_threads = lambda n=n: n
            try:
                got, got_grads = grads_of(fn, (q, k, v), dout)
            except Exception as e:  # noqa: BLE001 - the failure reported
                check(False, f"{n} torch threads: {type(e).__name__}: {e}")
                continue
            check(torch.equal(got, want) and all(torch.equal(g, w) for g, w in
                                                  zip(got_grads, want_grads)),
                  f"{n} torch threads: out, dq, dk, dv as on 1 thread, bit for bit")
    finally:
        torch.get_num_threads = get_num_threads


def test_thread_contexts():
    # each Python thread has its own attn contexts (and Philox rng): those of
    # a thread that has finished are freed with it, so 200 short threads
    # leave no context, worker thread, descriptor or workspace behind
    import gc
    import threading
    q = torch.randn(1, 2, 40, 16, requires_grad=True)
    mask = torch.randn(40, 40, requires_grad=True)

    def work():
        out = AT.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        out = out + AT.scaled_dot_product_attention(q, q, q, is_causal=True, dropout_p=0.1)
        out = out + AT.flash_attn_func(q, q, q, causal=True)
        out.sum().backward()

    def live():
        return sum(isinstance(o, AT._Ctx) for o in gc.get_objects())

    def tasks():
        return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0

    def resident_kib():
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
        except OSError:
            return 0

    def threads(n):
        for _ in range(n):
            t = threading.Thread(target=work)
            t.start()
            t.join()
        gc.collect()

    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)  # contexts with a worker thread of their own
    try:
        threads(20)  # torch's and the allocator's own first-use memory
        ctxs, fds = live(), len(os.listdir("/proc/self/fd"))
        task_count, kib = tasks(), resident_kib()
        threads(200)
        deadline = time.time() + 5
        while tasks() > task_count and time.time() < deadline:
            time.sleep(0.01)  # joined workers leave /proc/self/task a moment later
        check(live() == ctxs, f"200 threads: {live() - ctxs} contexts outlive their threads")
        check(tasks() <= task_count, f"200 threads: {tasks() - task_count} threads left")
        check(len(os.listdir("/proc/self/fd")) <= fds, "200 threads: descriptors left open")
        grew = resident_kib() - kib
        check(grew < 32 * 1024, f"200 threads: resident memory grew {grew} KiB")
    finally:
        torch.set_num_threads(threads_before)


for test in (test_gradcheck, test_float32, test_layouts_and_fallbacks, test_pytorch_strides,
             test_dropout, test_patch,
             test_training, test_transforms, test_saved_tensor_hooks, test_mask_one_hot_rows,
             test_thread_counts,
             test_thread_contexts):
    t = time.time()
    test()
    print(f"{test.__name__}: {time.time() - t:.1f} s")
    sys.stdout.flush()

print(f"torch_binding: {passed} passed, {failed} failed ({time.time() - T0:.1f} s, torch "
      f"{torch.__version__})")
sys.exit(1 if failed else 0)
