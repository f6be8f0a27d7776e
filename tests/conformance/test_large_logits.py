#!/usr/bin/python3
"""Large logits: the fused kernels against PyTorch float32's own error.

    python3 tests/conformance/test_large_logits.py LIBATTN_SO

Scores in the hundreds make attention ill-conditioned: a weight's relative
error is the absolute error of its exponent, so every rounding that grows
with a score's size shows. Each case runs the same float32 inputs through
attn's fused kernels (every kernel set this CPU runs) and through PyTorch
float32 (the seeds' math: matmul, softmax, matmul, autograd), both against
float64 on the same inputs, and compares the two relative L2 errors: the
median ratio over fresh random cases must stay under the bounds below.

  1. attn_sdpa_forward/_backward on q, k sharing a direction (scores ~200):
     out, lse, dq, dk, dv. dv (= P^T dO) is bounded by the float lse the
     public call hands over, as PyTorch's flash kernel's is: a float lse of
     200 is off by up to 7.6e-6, so is every recomputed weight of its row.
  2. The same call on the module's q, k, v = x W (below), whose rows are
     mostly nearly one-hot and take the consistent delta (attention.h): dq
     and dk, in the shapes (1, 1, 11, 64), which runs the fused backward's
     two passes, and (4, 1, 11, 64), its one pass (flash.h).
  3. The issue's module, SelfAttention_v1(d_in=128, d_out=64) on T=11 rows
     uniform in [-1, 1] (scaled scores up to ~1000): its output y, whose
     error is the scores' rounding (q . k ~ 3000: a float's half ulp is
     1.2e-4), in chains of 16 dims as PyTorch's SGEMM blocks its own, so
     on one seed either may be the worse by several times (over 600 seeds
     the median ratio of max-abs errors was 1.00, attn 3x worse on 7 and
     PyTorch on 5; the issue's seed 373705 gives 1.4); W_value's gradient,
     x^T dv, where the module's kept lse_lo (the forward's rounding error
     of lse) makes the weights of the backward exact; and x's gradient,
     where most rows are nearly one-hot and take the consistent delta
     (attention.h).
  4. SelfAttention_v1(d_in=768, d_out=1) on rows x0 + 1e-4 u (x0, u uniform
     in [0, 1)): scores near 4e4 (q, k ~ 190, scale 1) whose differences
     are a few units, so rows weigh several keys. q, k and v then share one
     large component, and delta's mismatch with the tiles' own P and dP (a
     rounding of |dO . O|) reaches dq as resid |k| and dk as resid |q|:
     before every row took the consistent delta (attention.h), x's
     gradient was 3-10x PyTorch float32's error and W_key's 2.5x (medians
     over 8 cases, T = 1024); now about 0.03 and 0.6. Its output y is a
     weighted mean of values ~190 that differ by ~6e-4, so a weight's error
     moves y by almost nothing: in a float64 emulation of the lane forward
     (T = 512, medians of 4 cases) the scores' rounding alone gives y
     1.5e-10 of error, each exponent's argument, exp2 and the rescaling
     factors below 1e-14, and scores scaled before the row max is
     subtracted (s c - m c, rounded at |s c| ~ 6e4) 9e-11; y's error is
     the sums: of the weighted values and of the weights, and the
     division. Each key block's weighted values are summed from zero and
     join the output in one fma (flash_lanes.h), so a sum is chains of 64
     keys. y and W_value's gradient (x^T dv, a sum over the 512 rows) are
     bounded in units of float32's unit roundoff u = 2^-24, not against
     PyTorch: PyTorch float32's error there is its BLAS's summation order.
     Debian's torch loads whichever libblas.so.3 is installed: the
     reference BLAS sums a dot product in one chain (y 8.3-8.7 u, W_value
     5.8-5.9 u, medians of 48 cases), OpenBLAS in vector lanes (y 1.4-1.5
     u, W_value 1.2-1.9 u), PyPI's torch 2.15 (MKL) about as OpenBLAS; attn
     gives y 1.5-1.7 u and W_value 3.3-3.6 u on either (4 seeds, each
     kernel set, EMR). The bounds, 2.5 u and 5 u, fail one chain over all
     the keys (y about 13 u) and a backward's lse rounded twice (W_value
     tens of u); the ratios to PyTorch are printed beside them.
  5. MultiHeadAttention(64, 64, 128, 0.0, num_heads=4) on a batch of 2
     (8 (batch, head) items: the fused backward's one pass, flash.h) on
     rows 30 x0 + 1e-3 n (x0, n normal): keys share one large component,
     so W_key's gradient, x^T dk, is made of the keys' small differences
     while the common component carries sum_j dk_j whole. Each row's
     dS sums to zero only to a rounding (resid, attention.h), which every
     key's dk would take with the row's weights; the one pass gives dk
     the transpose of dq's mean-key correction, and W_key's gradient
     stays within 0.5x PyTorch float32's error (median of 24 cases, T =
     128; about 2x without that transpose: docs/exactness.md).
  6. attn_sdpa_forward/_backward with a softcap (Gemma 2's cap tanh(s /
     cap)) on scores of std 25-64 under caps of a half to all of that, so
     s / cap spans tanh's bend and its saturation (D = 32, H = 2): out,
     lse, dq and dk within 1.6x PyTorch float32's error. The vector tanh
     (vec_*.h) is within 1.7 ulp, as the libm tanhf the portable kernels
     call, and the backward's 1 - t^2 rounds once: t's error reaches the
     exponents as cap ulps and the gradient through 1 - t^2 magnified
     where the cap saturates. dv is bounded by the float lse, as in case
     1: that alone puts it near 1.2x PyTorch's (a float64 emulation of the
     rounded lse, median of 30 cases), and the portable kernels' tanhf
     gives the same ratio as the vector tanh, about 1.5.
Before the fix (scores scaled in q, one chain of fmas over the head dim,
lse rounded twice in the backward) the medians were 2.2-3.0 (out, lse),
2.7-3.2 (dq, dk), 4.2-4.5 (dv) and, for W_value's gradient, 8-20. Before
the consistent delta, case 2's dq and dk were 2.9-3.5 (now 0.5-1.0) and
x's gradient 3.1-4.5 (now 0.4-0.7). With the vector tanh 3 ulp off
(avx512; avx2's 2), case 6's out was 1.3-1.7, dq and dk 1.6-2.2 (now
0.9-1.1 and 1.2-1.35).
Prints the seed (ATTN_TEST_SEED repeats a run); exits 1 on any failure.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["ATTN_LIBRARY"] = sys.argv[1]
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import attn  # noqa: E402
import attn.functional as AF  # noqa: E402
from seed_modules import MultiHeadAttention, SelfAttention_v1  # noqa: E402

CASES = 40  # the median of 16 put dk past its bound about once in 30 runs
SDPA_BOUNDS = {"out": 1.8, "lse": 1.8, "dq": 2.3, "dk": 2.3, "dv": 3.6}
ONE_HOT_BOUNDS = {"dq": 1.8, "dk": 1.8}
MODULE_BOUNDS = {"y": 1.5, "W_value": 2.0, "x": 1.5}
SHARED_BOUNDS = {"x": 1.0, "W_key": 1.5}
# one case in 10 puts W_key past 1.5 (a median of 8 failed about once in 100 runs)
SHARED_ULP_BOUNDS = {"y": 2.5, "W_value": 5.0}  # units of 2^-24 (the docstring, case 4)
SHARED_CASES, SHARED_T = 48, 512
ONE_PASS_BOUNDS = {"x": 1.0, "W_key": 0.5}
ONE_PASS_CASES = 24
SOFTCAP_BOUNDS = {"out": 1.6, "lse": 1.6, "dq": 1.6, "dk": 1.6, "dv": 2.0}

seed = int(os.environ.get("ATTN_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
print("seed", seed, "(ATTN_TEST_SEED to repeat)")
torch.manual_seed(seed)
failed = 0


def rel(a, ref):
    a = torch.as_tensor(np.asarray(a)).double()
    return ((a - ref).norm() / ref.norm()).item()


def kernel_sets():
    names = ["portable", "avx2", "avx512"]
    return [k for k in names if attn.kernels_supported(k)]


def sdpa_ratios(kernels, cases):
    """{name: [attn error / torch float32 error]} over the cases."""
    ratios = {k: [] for k in SDPA_BOUNDS}
    for q, k, v, dy in cases:
        qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
        s = qd @ kd.transpose(-1, -2) / 8
        od = torch.softmax(s, -1) @ vd
        od.backward(dy.double())
        qf, kf, vf = (t.clone().requires_grad_(True) for t in (q, k, v))
        sf = qf @ kf.transpose(-1, -2) / 8
        of = torch.softmax(sf, -1) @ vf
        of.backward(dy)
        arrays = [t.numpy() for t in (q, k, v)]
        out, lse = AF.scaled_dot_product_attention(*arrays, return_lse=True, kernels=kernels)
        dq, dk, dv = AF.scaled_dot_product_attention_backward(dy.numpy(), *arrays, kernels=kernels)
        ours = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
        theirs = {"out": (of, od), "lse": (torch.logsumexp(sf, -1), torch.logsumexp(s, -1)),
                  "dq": (qf.grad, qd.grad), "dk": (kf.grad, kd.grad), "dv": (vf.grad, vd.grad)}
        for name, (t32, t64) in theirs.items():
            t64 = t64.detach()
            ratios[name].append(rel(ours[name], t64) / max(rel(t32.detach(), t64), 1e-12))
    return ratios


def softcap_scores(q, k, cap):
    s = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5
    return cap * torch.tanh(s / cap)


def softcap_ratios(kernels, cases):
    """As sdpa_ratios, with each case's softcap."""
    ratios = {k: [] for k in SOFTCAP_BOUNDS}
    for q, k, v, dy, cap in cases:
        results = {}
        for dtype in (torch.float64, torch.float32):
            qt, kt, vt = (t.to(dtype).clone().requires_grad_(True) for t in (q, k, v))
            s = softcap_scores(qt, kt, cap)
            o = torch.softmax(s, -1) @ vt
            o.backward(dy.to(dtype))
            results[dtype] = {"out": o, "lse": torch.logsumexp(s, -1), "dq": qt.grad,
                              "dk": kt.grad, "dv": vt.grad}
        arrays = [t.numpy() for t in (q, k, v)]
        out, lse = AF.scaled_dot_product_attention(*arrays, softcap=cap, return_lse=True,
                                                   kernels=kernels)
        dq, dk, dv = AF.scaled_dot_product_attention_backward(dy.numpy(), *arrays, softcap=cap,
                                                              kernels=kernels)
        ours = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
        for name in SOFTCAP_BOUNDS:
            t64 = results[torch.float64][name].detach()
            t32 = results[torch.float32][name].detach()
            ratios[name].append(rel(ours[name], t64) / max(rel(t32, t64), 1e-12))
    return ratios


def module_ratios(kernels, d_in=128, d_out=64, bounds=MODULE_BOUNDS, cases=CASES, inputs=None,
                  errors=None):
    """SelfAttention_v1's output y and its gradients (of W_value, x, ...):
    {name: [attn error / torch float32 error]} over the cases; attn's own
    relative errors appended to errors[name] where errors holds name."""
    ratios = {name: [] for name in bounds}
    os.environ["ATTN_KERNELS"] = kernels
    for _ in range(cases):
        tm = SelfAttention_v1(d_in, d_out)
        x, dy = inputs() if inputs else (torch.rand(11, 128) * 2 - 1, torch.randn(11, 64))
        grads = {}
        for dtype in (torch.float64, torch.float32):
            m = SelfAttention_v1(d_in, d_out).to(dtype)
            m.load_state_dict({n: p.to(dtype) for n, p in tm.state_dict().items()})
            xt = x.to(dtype).clone().requires_grad_(True)
            y = m(xt)
            y.backward(dy.to(dtype))
            grads[dtype] = {"y": y.detach().double(), "W_value": m.W_value.grad.detach().double(),
                            "W_key": m.W_key.grad.detach().double(), "x": xt.grad.detach().double()}
        am = attn.SelfAttention_v1(d_in, d_out)
        am.load_state_dict({n: p.detach().numpy() for n, p in tm.state_dict().items()})
        y = np.asarray(am.forward(x.numpy()[None]))[0]
        ours = {"y": y, "x": np.asarray(am.backward(dy.numpy()[None]))[0],
                "W_value": am.grads()["W_value"], "W_key": am.grads()["W_key"]}
        for name in bounds:
            ref = grads[torch.float64][name]
            ratios[name].append(rel(ours[name], ref) / max(rel(grads[torch.float32][name], ref), 1e-12))
            if errors is not None and name in errors:
                errors[name].append(rel(ours[name], ref))
    del os.environ["ATTN_KERNELS"]
    return ratios



def shared_component_inputs():
    """Rows x0 + 1e-4 u of SelfAttention_v1(768, 1): q, k, v ~ 190 with
    differences of a few hundredths, scores ~4e4 differing by units."""
    x = torch.rand(1, 768, dtype=torch.float64) + 1e-4 * torch.rand(SHARED_T, 768, dtype=torch.float64)
    return x.float(), torch.randn(SHARED_T, 1)


def shared_direction_cases():
    cases = []
    for c in range(CASES):
        T, D = 11 + c % 16, 64  # T = 11..26, each 2.5 times
        # a shared direction in q and k: scaled scores near 200
        q, k = ((torch.randn(1, 2, T, D) + 3) * 1.5 for _ in range(2))
        cases.append((q, k, torch.randn(1, 2, T, D), torch.randn(1, 2, T, D)))
    return cases


def one_hot_cases(batch):
    """q, k, v = x W as SelfAttention_v1(128, 64) makes them (W uniform in
    [0, 1), x in [-1, 1]): scaled scores in the hundreds, most rows' largest
    weight near 1."""
    cases = []
    for _ in range(CASES):
        x = torch.rand(batch, 1, 11, 128) * 2 - 1
        q, k, v = (x @ torch.rand(128, 64) for _ in range(3))
        cases.append((q, k, v, torch.randn(batch, 1, 11, 64)))
    return cases


def one_pass_shared_ratios(kernels):
    """MultiHeadAttention(64, 64, 128, 0.0, 4) on a batch of 2 rows
    30 x0 + 1e-3 n (case 5): {name: [attn error / torch float32 error]}."""
    ratios = {name: [] for name in ONE_PASS_BOUNDS}
    os.environ["ATTN_KERNELS"] = kernels
    for _ in range(ONE_PASS_CASES):
        tm = MultiHeadAttention(64, 64, 128, 0.0, 4)
        x = (30 * torch.randn(1, 1, 64, dtype=torch.float64) +
             1e-3 * torch.randn(2, 128, 64, dtype=torch.float64)).float()
        dy = torch.randn(2, 128, 64)
        grads = {}
        for dtype in (torch.float64, torch.float32):
            m = MultiHeadAttention(64, 64, 128, 0.0, 4).to(dtype)
            m.load_state_dict({n: p.to(dtype) for n, p in tm.state_dict().items()})
            xt = x.to(dtype).clone().requires_grad_(True)
            m(xt).backward(dy.to(dtype))
            grads[dtype] = {"W_key": m.W_key.weight.grad.detach().double(),
                            "x": xt.grad.detach().double()}
        am = attn.MultiHeadAttention(64, 64, 128, 0.0, num_heads=4)
        am.load_state_dict({n: p.detach().numpy() for n, p in tm.state_dict().items()})
        am.forward(x.numpy())
        ours = {"x": am.backward(dy.numpy()), "W_key": am.grads()["W_key.weight"]}
        for name in ONE_PASS_BOUNDS:
            ref = grads[torch.float64][name]
            ratios[name].append(rel(ours[name], ref) /
                                max(rel(grads[torch.float32][name], ref), 1e-12))
    del os.environ["ATTN_KERNELS"]
    return ratios
def softcap_cases():
    """q, k of std g (5 to 8): scores of std g^2 under a cap of g^2 / (1 to
    2), so most lie past tanh's series (|s / cap| >= 0.625)."""
    cases = []
    for c in range(CASES):
        T, D = 11 + c % 40, 32
        g = float(torch.empty(()).uniform_(5, 8))
        cap = g * g / float(torch.empty(()).uniform_(1, 2))
        q, k = (torch.randn(1, 2, T, D) * g for _ in range(2))
        cases.append((q, k, torch.randn(1, 2, T, D), torch.randn(1, 2, T, D), cap))
    return cases


def check(kernels, label, ratios, bounds):
    global failed
    for name, bound in bounds.items():
        med = float(np.median(ratios[name]))
        ok = med <= bound
        failed += not ok
        print("%s  %-8s %-28s %-3s: median error / PyTorch float32's %.2f (bound %.1f)" % (
            "ok  " if ok else "FAIL", kernels, label, name, med, bound))


def check_ulps(kernels, label, errors, ratios, bounds):
    global failed
    for name, bound in bounds.items():
        med = float(np.median(errors[name])) / 2**-24
        ok = med <= bound
        failed += not ok
        print("%s  %-8s %-28s %-3s: median error %.2f u (bound %.1f), / PyTorch float32's %.2f" % (
            "ok  " if ok else "FAIL", kernels, label, name, med, bound, float(np.median(ratios[name]))))


sets = [("sdpa, shared direction", shared_direction_cases(), SDPA_BOUNDS),
        ("sdpa, one-hot, two passes", one_hot_cases(1), ONE_HOT_BOUNDS),
        ("sdpa, one-hot, one pass", one_hot_cases(4), ONE_HOT_BOUNDS)]
capped = softcap_cases()
for kernels in kernel_sets():
    for label, cases, bounds in sets:
        check(kernels, label, sdpa_ratios(kernels, cases), bounds)
    check(kernels, "sdpa, softcap", softcap_ratios(kernels, capped), SOFTCAP_BOUNDS)
    check(kernels, "SelfAttention_v1 y, .grad of", module_ratios(kernels), MODULE_BOUNDS)
    errors = {name: [] for name in SHARED_ULP_BOUNDS}
    ratios = module_ratios(kernels, 768, 1, {**SHARED_BOUNDS, **SHARED_ULP_BOUNDS}, SHARED_CASES,
                           shared_component_inputs, errors)
    check(kernels, "SelfAttention_v1(768, 1) y, .grad of", ratios, SHARED_BOUNDS)
    check_ulps(kernels, "SelfAttention_v1(768, 1) y, .grad of", errors, ratios, SHARED_ULP_BOUNDS)
    check(kernels, "MHA, shared, one pass, .grad of", one_pass_shared_ratios(kernels),
          ONE_PASS_BOUNDS)

print("%d failed" % failed)
sys.exit(1 if failed else 0)
