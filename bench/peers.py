#!/usr/bin/env python3
"""attn next to PyTorch 2.15 on the same CPU, in one process, on the same tensors.

    .venv-peers/bin/python bench/peers.py path/to/attn [--quick] [--runs N] [--threads 1,2]
        [--tables attention,bf16,layer,dropout,gemm] [--tokens 1024,4096] [--long-runs N]
        [--out bench/results/peers-<cpu-kind>-<ncpu>.txt]

Run by `make bench-peers` (arguments through PEERS_ARGS="--quick ..."), which
sets up PyTorch 2.15 in .venv-peers first (scripts/setup-bench-peers.sh).
attn's public C API is called through ctypes on PyTorch's own tensors (their
data pointers: no copies; attn's outputs are allocated once, before timing),
PyTorch as its users call it. In each row attn and PyTorch run alternately,
run by run, after one warm-up of each; the figures are medians of --runs
runs (T >= 16384: --long-runs runs, 1 by default, without the warm-up).
speedup = PyTorch ms / attn ms: above 1, attn is faster.

Tables (B=1, H=12, hd=64, T=S; threads from --threads, 1 and 2 by default):
  attention  fp32: attn_sdpa_forward (+ attn_sdpa_backward) against
             F.scaled_dot_product_attention under no_grad (+ .backward()),
             T in {1024, 4096, 16384} (--quick: 1024, 4096), causal and not;
             '<' marks a speedup under the target, 1.2.
  bf16       the same on torch.bfloat16 tensors: attn_sdpa_forward_16 /
             attn_sdpa_backward_16 against PyTorch's bf16 SDPA, and attn's
             bf16 speedup over its own fp32 (the attention table's times);
             '<' marks PyTorch faster, or bf16 under 1.6x attn's fp32.
             "not built" while libattn lacks the 16-bit functions.
  layer      GPT-2-small's attention layer with its projections (c_attn,
             attention, c_proj; C=768): attn_gpt2 through
             attn_module_forward/_backward on torch tensors against the usual
             nn.Linear + SDPA module; '<' marks PyTorch faster.
  gemm       the layer's projection GEMMs, forward (attn_linear against
             F.linear, with the bias) and backward (dx = dy W: attn_gemm
             against torch.mm; dW += dy^T x: attn_gemm against addmm_), for
             c_attn (768 -> 2304) and c_proj (768 -> 768) at T rows: where
             the layer's time goes when it is not attention; '<' marks
             PyTorch faster. Not in the default set.
  dropout    forward+backward in training with dropout 0.1, where PyTorch
             leaves its flash kernel for the math path and attn draws its
             mask inside the fused kernel; with attn.torch (the binding,
             through autograd) beside the C API: the binding's overhead.
The header names the CPU (/proc/cpuinfo), the PyTorch build, the FMA peak
(attn-bench --section peak, the attn-bench beside attn) and the load average: figures taken while other
work runs on the machine are noisy. The attention table gives each side's
GFLOP/s as a fraction of that peak: how far both are from the ceiling.
"""
import argparse
import ctypes
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from ctypes import POINTER, c_bool, c_int, c_size_t, c_void_p

# PyTorch's OpenMP threads spin after each parallel region; with attn's own
# threads running next, alternately on the same 2 cores, the spinning took
# their time (attn's 2-thread calls ran at 1-thread speed). Passive waiting
# lets both sides have the cores they ask for. Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

B, H, D, C = 1, 12, 64, 768
LONG_T = 16384               # from here on: --long-runs runs, no warm-up
TARGET_SPEEDUP = 1.2         # the target: attention at least 1.2x PyTorch
TARGET_BF16_OVER_FP32 = 1.6  # the target: bf16 at least 1.6x attn's fp32
FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16",
                     "amx_tile")


# ---- the CPU, for the header of every results file -----------------------------------------


def cpu_facts():
    """(fields of /proc/cpuinfo's first processor, number of logical CPUs)."""
    first, count = {}, 0
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "processor":
                    count += 1
                elif count == 1 and key and key not in first:
                    first[key] = value
    except OSError:
        pass
    return first, count or os.cpu_count()


def cpu_kind(facts):
    """The machine-kind part of a results file name (bench/results/README.md)."""
    vendor, family = facts.get("vendor_id", ""), facts.get("cpu family", "")
    if vendor == "AuthenticAMD" and family == "25":  # Zen 3 at models 0x00-0x0f, 0x20-0x5f
        model = int(facts.get("model", "0"))
        return "zen3" if model < 0x10 or 0x20 <= model < 0x60 else "zen4"
    if vendor == "AuthenticAMD":
        return {"26": "zen5"}.get(family, "amd-family%s" % family)
    if vendor == "GenuineIntel":
        if "Xeon" not in facts.get("model name", ""):
            return "intel"
        # Intel family 6 models whose cores differ from the first Xeon's
        # (model 167: L1d 48 KiB, AMX); that one keeps the plain name
        model, stepping = facts.get("model", ""), facts.get("stepping", "0")
        if family == "6" and model == "85":  # Skylake-SP; stepping 5-7: Cascade Lake
            return "xeon-clx" if stepping.isdigit() and int(stepping) >= 5 else "xeon-skx"
        if family == "6" and model == "207":
            return "xeon-emr"
        return "xeon"
    return platform.machine() or "cpu"


class CpuInfo(ctypes.Structure):
    """attn_cpu_info, field for field (include/attn.h)."""
    _fields_ = [("vendor", ctypes.c_char * 16), ("model_name", ctypes.c_char * 64),
                ("family", ctypes.c_uint), ("model", ctypes.c_uint), ("uarch", ctypes.c_char_p),
                ("avx2_fma", c_bool), ("avx512f", c_bool), ("avx512_bf16", c_bool),
                ("avx512_fp16", c_bool), ("amx_bf16", c_bool), ("fma_vector_bits", ctypes.c_uint),
                ("l1d_bytes", c_size_t), ("l2_bytes", c_size_t), ("l3_bytes", c_size_t)]


def attn_cpu_line(attn):
    """What libattn's attn_cpu_info_get says (its tuning keys on it), or None
    for a libattn without it."""
    fn = attn._bind("attn_cpu_info_get", c_int, POINTER(CpuInfo))
    info = CpuInfo()
    if fn is None or fn(ctypes.byref(info)) != 0:
        return None
    isa = [n for n in ("avx2_fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")
           if getattr(info, n)]
    return "%s family %u model %u: uarch %s, %s, FMA %u bits; L1d %d KiB, L2 %d KiB, L3 %d KiB" % (
        info.vendor.decode(errors="replace") or "?", info.family, info.model,
        (info.uarch or b"?").decode(), " ".join(isa) or "no SIMD", info.fma_vector_bits,
        info.l1d_bytes >> 10, info.l2_bytes >> 10, info.l3_bytes >> 10)


def bench_beside(attn_bin):
    """The attn-bench of attn_bin's build: make builds both in one folder."""
    return os.path.join(os.path.dirname(os.path.abspath(attn_bin)), "attn-bench")


def fma_peaks(attn_bin, threads):
    """{threads: GFLOP/s} of the widest float FMAs, from `attn-bench
    --section peak` (the ceiling both attn and PyTorch run under); {}
    where it cannot be measured."""
    try:
        text = subprocess.run([bench_beside(attn_bin), "--section", "peak", "--runs", "3",
                               "--threads", ",".join(str(t) for t in threads)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    peaks = {}
    for line in text.splitlines():
        cells = [c.split() for c in line.split("|")]
        if len(cells) >= 4 and len(cells[0]) == 1 and cells[0][0].isdigit():
            widest = next((c[0] for c in cells[1:3] if c and c[0] != "-"), None)
            if widest:
                peaks[int(cells[0][0])] = float(widest)
    return peaks


def print_header(attn_bin, attn, argv, peaks):
    """The command, the CPU, attn's own view of it, PyTorch and the load."""
    print("$ " + " ".join(shlex.quote(a) for a in argv))
    facts, ncpu = cpu_facts()
    flags = set(facts.get("flags", "").split())
    print("CPU: %s; vendor %s, family %s model %s stepping %s; %d logical CPUs (%s usable), "
          "%s cores per socket" % (
              facts.get("model name", platform.processor() or "?"), facts.get("vendor_id", "?"),
              facts.get("cpu family", "?"), facts.get("model", "?"), facts.get("stepping", "?"),
              ncpu, len(os.sched_getaffinity(0)), facts.get("cpu cores", "?")))
    print("CPU flags: " + " ".join("%s %s" % (f, "yes" if f in flags else "no")
                                    for f in FLAGS_OF_INTEREST) +
          "; hypervisor %s" % ("yes" if "hypervisor" in flags else "no"))
    try:
        version = subprocess.run([attn_bin, "version"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as err:
        version = "attn version: %s" % err
    lines = version.strip().splitlines()
    cpu_lines = [l for l in lines[1:] if "cpu" in l.lower()]
    for line in lines[:1] + cpu_lines:
        print("attn version: " + line.strip())
    cpu = None if cpu_lines else attn_cpu_line(attn)  # an attn version without its CPU lines
    if cpu:
        print("attn_cpu_info_get: " + cpu)
    print("AMX tile state for this process (attn_cpu_request_amx): %s" %
          ("granted" if attn.amx else "not available"))
    print("OMP_WAIT_POLICY=%s (PyTorch's threads sleep between its calls, not spin)" %
          os.environ.get("OMP_WAIT_POLICY"))
    print("libattn: %s; 16-bit SDPA: %s" % (attn.path, "yes" if attn.has_16 else "not built"))
    capability = (torch.backends.cpu.get_cpu_capability()
                  if hasattr(torch.backends.cpu, "get_cpu_capability") else "?")
    print("PyTorch %s (%s), CPU capability %s" % (
        torch.__version__, torch.__file__.rsplit("/", 2)[0], capability))
    print("results file name (bench/results/README.md): <what>-%s-%dvcpu.txt" % (
        cpu_kind(facts), ncpu))
    print("FMA peak (attn-bench --section peak, widest vectors): %s" % (
        ", ".join("%.1f GFLOP/s on %d thread%s" % (g, t, "" if t == 1 else "s")
                  for t, g in sorted(peaks.items())) or "not measured"))
    print("load average before: %.2f %.2f %.2f" % os.getloadavg())


# ---- attn's C API on torch tensors ------------------------------------------------------------


class Attn:
    """libattn (the one beside the attn binary) through ctypes: its SDPA,
    fp32 and 16-bit, and its GPT-2 layer, called on torch tensors' data
    pointers. One attn_ctx (with a Philox rng for dropout) per thread count."""

    def __init__(self, attn_bin):
        self.path = os.path.join(os.path.dirname(os.path.abspath(attn_bin)), "libattn.so")
        os.environ["ATTN_LIBRARY"] = self.path  # for the attn package (and attn.torch)
        from attn import _lib
        from attn.functional import BERNOULLI_PHILOX, KERNELS, SdpaConfig, SdpaDropout
        self._lib, self.lib = _lib, _lib.lib
        self.SdpaConfig, self.SdpaDropout = SdpaConfig, SdpaDropout
        self._philox, self._auto = BERNOULLI_PHILOX, KERNELS["auto"]
        P, CFG, DROP = c_void_p, POINTER(SdpaConfig), POINTER(SdpaDropout)
        # own prototypes (void * for every tensor): the package's may say float *
        self.forward = self._bind("attn_sdpa_forward", c_int, c_void_p, CFG, P, P, P, P, P, P, DROP)
        self.backward = self._bind("attn_sdpa_backward", c_int, c_void_p, CFG, P, P, P, P, P, P,
                                   P, P, P, DROP)
        self.forward_16 = self._bind("attn_sdpa_forward_16", c_int, c_void_p, CFG, c_int, P, P, P,
                                     P, P, P, DROP)
        self.backward_16 = self._bind("attn_sdpa_backward_16", c_int, c_void_p, CFG, c_int, P, P,
                                      P, P, P, P, P, P, P, DROP)
        self.module_forward = self._bind("attn_module_forward", c_int, P, P, c_size_t, c_size_t,
                                         P, P)
        self.module_backward = self._bind("attn_module_backward", c_int, P, P, c_size_t,
                                          c_size_t, P)
        S, F32 = c_size_t, ctypes.c_float
        self.linear = self._bind("attn_linear", c_int, P, P, P, P, P, S, S, S)
        self.gemm = self._bind("attn_gemm", c_int, P, c_bool, c_bool, S, S, S, F32, P, S, P, S,
                               F32, P, S)
        self.bf16 = self._dtype("BF16")
        self._ctxs = {}
        # AMX for the bf16 kernels, as PyTorch's oneDNN asks for it on its
        # first bf16 call: both sides then run on the same footing
        request = self._bind("attn_cpu_request_amx", c_int)
        self.amx = request is not None and request() == 0

    def _bind(self, name, restype, *argtypes):
        if not self._lib.has(name):
            return None
        return ctypes.CFUNCTYPE(restype, *argtypes)((name, self.lib))

    def _dtype(self, name):
        """The attn_dtype value the library names name ("BF16"), or None."""
        for value in range(32):
            if self.lib.attn_dtype_name(value).decode() == name:
                return value
        return None

    @property
    def has_16(self):
        return self.forward_16 is not None and self.backward_16 is not None

    def ctx(self, threads):
        """(attn_ctx, attn_rng in Philox mode) for threads, made once."""
        if threads not in self._ctxs:
            ctx, rng = c_void_p(), c_void_p()
            cfg = self._lib.CtxConfig(num_threads=threads, kernels=self._auto)
            if self.lib.attn_ctx_new(ctypes.byref(cfg), ctypes.byref(ctx)) != 0:
                raise RuntimeError("attn_ctx_new: %d threads not accepted" % threads)
            self.check(ctx, self.lib.attn_rng_new(ctx, 1234, ctypes.byref(rng)))
            self.check(ctx, self.lib.attn_rng_set_bernoulli_method(rng, self._philox))
            self._ctxs[threads] = (ctx, rng)
        return self._ctxs[threads]

    def check(self, ctx, status):
        if status != 0:
            raise RuntimeError("libattn: %s: %s" % (
                self._lib.status_name(status),
                self.lib.attn_ctx_last_error(ctx).decode(errors="replace")))

    def sdpa_config(self, T, causal, dropout=0.0):
        """attn_sdpa_config of q, k, v contiguous (B, H, T, D) and out in
        PyTorch's (B, T, H, D) memory (what sdpa_out allocates); causal is
        PyTorch's is_causal (top-left)."""
        c = self.SdpaConfig()
        c.batch, c.heads, c.q_tokens, c.kv_tokens, c.head_dim = B, H, T, T, D
        c.q_strides[:] = c.kv_strides[:] = [H * T * D, D, T * D]  # (b, t, h)
        c.out_strides[:] = [T * H * D, H * D, D]
        c.causal, c.align, c.dropout = causal, 1, dropout  # ATTN_ALIGN_TOP_LEFT
        return c


def sdpa_out(T, dtype):
    """out (B, H, T, D) as a view of (B, T, H, D) memory, touched once so
    that timing sees no page faults; and lse (B, H, T) float32."""
    out = torch.zeros(B, T, H, D, dtype=dtype).transpose(1, 2)
    return out, torch.zeros(B, H, T)


# ---- timing -----------------------------------------------------------------------------------


def alternate(fns, runs, warm_up=True):
    """Median wall seconds of each of fns over runs runs, run alternately
    (fns[0], fns[1], ..., fns[0], ...), after one warm-up call of each."""
    if warm_up:
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(runs):
        for ts, fn in zip(times, fns):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [statistics.median(ts) for ts in times]


def runs_for(T, a):
    return (a.long_runs, False) if T >= LONG_T else (a.runs, True)


def cell(attn_s, torch_s, target):
    """'attn ms  torch ms  speedup' with '<' under target."""
    x = torch_s / attn_s
    return "%9.1f %9.1f %5.2f%s" % (1e3 * attn_s, 1e3 * torch_s, x, "<" if x < target else " ")


# ---- attention: fp32 and bf16 ---------------------------------------------------------------


def time_attention(attn, threads, T, causal, dtype, runs, warm_up):
    """(attn fwd, torch fwd, attn f+b, torch f+b) median seconds and the
    largest |difference| of attn's out and dq from PyTorch's, on the same
    q, k, v, dout: that both computed the same thing."""
    ctx, _ = attn.ctx(threads)
    q, k, v, dout = (torch.randn(B, H, T, D).to(dtype) for _ in range(4))
    out, lse = sdpa_out(T, dtype)
    dout_c = torch.empty_like(out).copy_(dout)  # attn reads dout in out's layout
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    cfg = ctypes.byref(attn.sdpa_config(T, causal))
    if dtype == torch.float32:
        fwd_c = lambda lse_p: attn.forward(ctx, cfg, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                           out.data_ptr(), lse_p, None, None)
        bwd_c = lambda: attn.backward(ctx, cfg, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                      out.data_ptr(), lse.data_ptr(), dout_c.data_ptr(),
                                      dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), None)
    else:
        fwd_c = lambda lse_p: attn.forward_16(ctx, cfg, attn.bf16, q.data_ptr(), k.data_ptr(),
                                              v.data_ptr(), out.data_ptr(), lse_p, None, None)
        bwd_c = lambda: attn.backward_16(ctx, cfg, attn.bf16, q.data_ptr(), k.data_ptr(),
                                         v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                                         dout_c.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                                         dv.data_ptr(), None)

    def attn_fwd():
        attn.check(ctx, fwd_c(None))

    def attn_fwd_bwd():
        attn.check(ctx, fwd_c(lse.data_ptr()))
        attn.check(ctx, bwd_c())

    last = {}

    def torch_fwd():
        with torch.no_grad():
            last["out"] = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

    def torch_fwd_bwd():
        for t in (qg, kg, vg):
            t.grad = None
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(dout)

    torch.set_num_threads(threads)
    af, tf = alternate([attn_fwd, torch_fwd], runs, warm_up)
    diff_out = (out.float() - last.pop("out").float()).abs().max().item()
    afb, tfb = alternate([attn_fwd_bwd, torch_fwd_bwd], runs, warm_up)
    diff_dq = (dq.float() - qg.grad.float()).abs().max().item()
    return af, tf, afb, tfb, (diff_out, diff_dq)


def attention_rows(a):
    for threads in a.threads:
        for T in a.tokens:
            for causal in (True, False):
                yield threads, T, causal


def of_peak(seconds, flops, peak):
    """GFLOP/s of flops in seconds over peak GFLOP/s ('-' without one)."""
    return "%5.2f" % (flops / seconds / 1e9 / peak) if peak else "%5s" % "-"


def attention_table(attn, a, peaks):
    """fp32 attention in process; returns {(threads, T, causal): (fwd s, f+b s)} of attn."""
    print("\nattention in process, fp32, B=%d H=%d hd=%d, T=S: median ms of %d runs "
          "(T >= %d: %d, no warm-up), attn and PyTorch alternating" % (
              B, H, D, a.runs, LONG_T, a.long_runs))
    print("  attn: attn_sdpa_forward (+ attn_sdpa_backward) via ctypes on the torch tensors; "
          "torch: F.scaled_dot_product_attention (no_grad; + .backward())")
    print("  x = torch ms / attn ms (above 1: attn faster); '<' below the target %.1fx; "
          "diff: max |attn - torch| of out, of dq" % TARGET_SPEEDUP)
    print("  of FMA peak: GFLOP/s over the FMA peak on as many threads; fwd attn, fwd torch, f+b "
          "attn, f+b torch (4 B H T^2 hd flops a forward, halved when causal; 2.5x that a "
          "backward)")
    print("%6s %-6s %3s | %9s %9s %6s | %9s %9s %6s | %15s | %23s" % (
        "T", "mask", "thr", "fwd attn", "torch", "x", "f+b attn", "torch", "x", "diff out, dq",
        "of FMA peak: f  f  fb fb"))
    fp32 = {}
    for threads, T, causal in attention_rows(a):
        runs, warm = runs_for(T, a)
        af, tf, afb, tfb, diff = time_attention(attn, threads, T, causal, torch.float32,
                                                runs, warm)
        fp32[(threads, T, causal)] = (af, afb)
        flops = 4.0 * B * H * T * T * D * (0.5 if causal else 1.0)
        peak = peaks.get(threads)
        print("%6d %-6s %3d | %s | %s | %7.1e %7.1e | %s %s %s %s" % (
            T, "causal" if causal else "none", threads, cell(af, tf, TARGET_SPEEDUP),
            cell(afb, tfb, TARGET_SPEEDUP), *diff, of_peak(af, flops, peak),
            of_peak(tf, flops, peak), of_peak(afb, 3.5 * flops, peak),
            of_peak(tfb, 3.5 * flops, peak)))
        sys.stdout.flush()
    return fp32


def bf16_table(attn, a, fp32):
    """bf16 attention in process, and attn's bf16 speedup over its fp32."""
    print("\nattention in process, bf16 (fp32 accumulation), B=%d H=%d hd=%d, T=S: median ms "
          "of %d runs (T >= %d: %d, no warm-up), attn and PyTorch alternating" % (
              B, H, D, a.runs, LONG_T, a.long_runs))
    print("  attn: attn_sdpa_forward_16 (+ attn_sdpa_backward_16), dtype BF16 = %s, on "
          "torch.bfloat16 tensors; torch: its bf16 F.scaled_dot_product_attention" % attn.bf16)
    print("  x = torch ms / attn ms, '<' below 1; bf16/fp32 = attn fp32 ms (attention table) / "
          "attn bf16 ms, fwd and f+b, '<' below %.1f; diff: max |attn - torch| of out, of dq" %
          TARGET_BF16_OVER_FP32)
    print("%6s %-6s %3s | %9s %9s %6s | %9s %9s %6s | %11s | %15s" % (
        "T", "mask", "thr", "fwd attn", "torch", "x", "f+b attn", "torch", "x",
        "bf16/fp32", "diff out, dq"))
    for threads, T, causal in attention_rows(a):
        mask = "causal" if causal else "none"
        if not attn.has_16 or attn.bf16 is None:
            print("%6d %-6s %3d | not built: %s has no attn_sdpa_forward_16/_backward_16" % (
                T, mask, threads, attn.path))
            continue
        runs, warm = runs_for(T, a)
        try:
            af, tf, afb, tfb, diff = time_attention(attn, threads, T, causal, torch.bfloat16,
                                                    runs, warm)
        except RuntimeError as err:  # a libattn whose 16-bit SDPA refuses the case
            print("%6d %-6s %3d | failed: %s" % (T, mask, threads, err))
            continue
        if (threads, T, causal) in fp32:
            f32, fb32 = fp32[(threads, T, causal)]
            gain = "%4.2f%s %4.2f%s" % (f32 / af, "<" if f32 / af < TARGET_BF16_OVER_FP32 else " ",
                                        fb32 / afb,
                                        "<" if fb32 / afb < TARGET_BF16_OVER_FP32 else " ")
        else:
            gain = "%11s" % "-"
        print("%6d %-6s %3d | %s | %s | %s | %7.1e %7.1e" % (
            T, mask, threads, cell(af, tf, 1.0), cell(afb, tfb, 1.0), gain, *diff))
        sys.stdout.flush()


# ---- the GPT-2 attention layer ----------------------------------------------------------------


class TorchLayer(torch.nn.Module):
    """GPT-2-small attention as people write it with SDPA."""

    def __init__(self):
        super().__init__()
        self.c_attn = torch.nn.Linear(C, 3 * C)
        self.c_proj = torch.nn.Linear(C, C)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (u.view(b, t, H, D).transpose(1, 2) for u in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, C))


def time_layer(attn, threads, T, runs, warm_up):
    """(attn fwd, torch fwd, attn f+b, torch f+b) median seconds of the
    GPT-2-small attention layer on the same x and dy."""
    from attn._lib import Gpt2Config
    lib = attn.lib
    ctx, rng = attn.ctx(threads)
    gpt2 = c_void_p()
    attn.check(ctx, lib.attn_gpt2_new(ctx, ctypes.byref(Gpt2Config(n_embd=C, n_head=H,
                                                                   block_size=T)),
                                      rng, ctypes.byref(gpt2)))
    module = lib.attn_gpt2_module(gpt2)
    try:
        attn.check(ctx, lib.attn_module_set_training(module, False))
        x, dy = torch.randn(B, T, C), torch.randn(B, T, C)
        y, dx = torch.zeros(B, T, C), torch.zeros(B, T, C)
        m = TorchLayer()
        xg = x.clone().requires_grad_(True)

        def attn_fwd():
            attn.check(ctx, attn.module_forward(module, x.data_ptr(), B, T, y.data_ptr(), None))

        def attn_fwd_bwd():
            attn_fwd()
            attn.check(ctx, attn.module_backward(module, dy.data_ptr(), B, T, dx.data_ptr()))

        def torch_fwd():
            with torch.no_grad():
                m(x)

        def torch_fwd_bwd():
            m.zero_grad()
            xg.grad = None
            m(xg).backward(dy)

        torch.set_num_threads(threads)
        attn.check(ctx, lib.attn_module_set_grad_enabled(module, False))
        af, tf = alternate([attn_fwd, torch_fwd], runs, warm_up)
        attn.check(ctx, lib.attn_module_set_grad_enabled(module, True))
        afb, tfb = alternate([attn_fwd_bwd, torch_fwd_bwd], runs, warm_up)
        return af, tf, afb, tfb
    finally:
        lib.attn_module_free(module)


def layer_table(attn, a):
    print("\nGPT-2-small attention layer in process (c_attn, causal attention, c_proj; C=%d, "
          "%d heads), B=%d: median ms of %d runs (T >= %d: %d, no warm-up)" % (
              C, H, B, a.runs, LONG_T, a.long_runs))
    print("  attn: attn_gpt2 via attn_module_forward (+ _backward: dx and the weights' "
          "gradients) on torch tensors; torch: nn.Linear + SDPA + nn.Linear (no_grad; + "
          ".backward())")
    print("  x = torch ms / attn ms, '<' below 1 (the target: attn faster)")
    print("%6s %3s | %9s %9s %6s | %9s %9s %6s" % (
        "T", "thr", "fwd attn", "torch", "x", "f+b attn", "torch", "x"))
    for threads in a.threads:
        for T in a.tokens:
            runs, warm = runs_for(T, a)
            af, tf, afb, tfb = time_layer(attn, threads, T, runs, warm)
            print("%6d %3d | %s | %s" % (T, threads, cell(af, tf, 1.0), cell(afb, tfb, 1.0)))
            sys.stdout.flush()


# ---- the layer's projections ---------------------------------------------------------------


def gemm_cases(attn, ctx, T, n_out):
    """(name, attn fn, torch fn) of one projection (C -> n_out) at T rows:
    its forward with the bias, and its backward's dx and dW, on the same
    tensors (attn's outputs beside PyTorch's, allocated once)."""
    x, w, bias = torch.randn(T, C), torch.randn(n_out, C), torch.randn(n_out)
    dy = torch.randn(T, n_out)
    y, dx = torch.zeros(T, n_out), torch.zeros(T, C)
    dw, dw_t = torch.zeros(n_out, C), torch.zeros(n_out, C)
    ptr = lambda t: t.data_ptr()

    def linear():
        attn.check(ctx, attn.linear(ctx, ptr(x), ptr(w), ptr(bias), ptr(y), T, C, n_out))

    def dx_nn():  # dx (T, C) = dy (T, n_out) @ w (n_out, C)
        attn.check(ctx, attn.gemm(ctx, False, False, T, C, n_out, 1.0, ptr(dy), n_out, ptr(w), C,
                                  0.0, ptr(dx), C))

    def dw_tn():  # dw (n_out, C) += dy^T (n_out, T) @ x (T, C)
        attn.check(ctx, attn.gemm(ctx, True, False, n_out, C, T, 1.0, ptr(dy), n_out, ptr(x), C,
                                  1.0, ptr(dw), C))

    def t_linear():
        with torch.no_grad():
            F.linear(x, w, bias)

    def t_dx():
        torch.mm(dy, w)

    def t_dw():
        dw_t.addmm_(dy.t(), x)

    return [("y = x W^T + b", linear, t_linear), ("dx = dy W", dx_nn, t_dx),
            ("dW += dy^T x", dw_tn, t_dw)]


def gemm_table(attn, a):
    print("\nthe GPT-2-small layer's projections in process, fp32: median GFLOP/s of %d runs, "
          "attn and PyTorch alternating" % a.runs)
    print("  attn: attn_linear (forward, bias added in the SGEMM's tiles) and attn_gemm "
          "(backward); torch: F.linear, torch.mm, addmm_ (its BLAS: %s)" % (
              "MKL" if torch.backends.mkl.is_available() else "not MKL"))
    print("  x = torch ms / attn ms, '<' below 1; 2 T C n flops a product")
    print("%6s %3s %-8s %-14s | %9s %9s %6s" % ("T", "thr", "proj", "product", "attn GF/s",
                                               "torch", "x"))
    for threads in a.threads:
        ctx, _ = attn.ctx(threads)
        torch.set_num_threads(threads)
        for T in a.tokens:
            if T >= LONG_T:
                continue  # the projections grow as T, not T^2: 4096 shows them
            for proj, n_out in (("c_attn", 3 * C), ("c_proj", C)):
                flops = 2.0 * T * C * n_out
                for name, attn_fn, torch_fn in gemm_cases(attn, ctx, T, n_out):
                    at, tt = alternate([attn_fn, torch_fn], a.runs)
                    print("%6d %3d %-8s %-14s | %9.1f %9.1f %5.2f%s" % (
                        T, threads, proj, name, flops / at / 1e9, flops / tt / 1e9, tt / at,
                        "<" if tt < at else " "))
                    sys.stdout.flush()


# ---- dropout, and the binding ---------------------------------------------------------------


def time_dropout(attn, AT, threads, T, causal, p, runs):
    """(C API, attn.torch, PyTorch) median seconds of forward+backward with
    dropout p in training, alternating."""
    ctx, rng = attn.ctx(threads)
    q, k, v, dout = (torch.randn(B, H, T, D) for _ in range(4))
    out, lse = sdpa_out(T, torch.float32)
    dout_c = torch.empty_like(out).copy_(dout)
    dq, dk, dv = (torch.zeros_like(t) for t in (q, k, v))
    cfg = ctypes.byref(attn.sdpa_config(T, causal, p))
    drawn = attn.SdpaDropout()

    def c_api():
        attn.check(ctx, attn.forward(ctx, cfg, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                     out.data_ptr(), lse.data_ptr(), rng, ctypes.byref(drawn)))
        attn.check(ctx, attn.backward(ctx, cfg, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                      out.data_ptr(), lse.data_ptr(), dout_c.data_ptr(),
                                      dq.data_ptr(), dk.data_ptr(), dv.data_ptr(),
                                      ctypes.byref(drawn)))

    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

    def through(sdpa):
        def fwd_bwd():
            for t in (qg, kg, vg):
                t.grad = None
            sdpa(qg, kg, vg, is_causal=causal, dropout_p=p).backward(dout)
        return fwd_bwd

    torch.set_num_threads(threads)
    return alternate([c_api, through(AT.scaled_dot_product_attention),
                      through(F.scaled_dot_product_attention)], runs)


def dropout_table(attn, a):
    import attn.torch as AT
    p = 0.1
    tokens = [T for T in a.tokens if T < LONG_T]
    print("\ndropout %.1f in training, fp32 forward+backward, B=%d H=%d hd=%d: median ms of %d "
          "runs (T >= 4096: %d), the three alternating" % (p, B, H, D, a.runs, min(a.runs, 3)))
    print("  attn: the C API as in the attention table; attn.torch: "
          "attn.torch.scaled_dot_product_attention + .backward() (the binding, autograd); "
          "torch: F.scaled_dot_product_attention + .backward() (its math path)")
    print("  x = torch ms / attn ms; binding: attn.torch ms / attn ms - 1")
    print("%6s %-6s %3s | %9s %10s %9s %6s | %7s" % (
        "T", "mask", "thr", "f+b attn", "attn.torch", "torch", "x", "binding"))
    for threads in a.threads:
        for T in tokens:
            for causal in (True, False):
                runs = a.runs if T < 4096 else min(a.runs, 3)  # PyTorch's math path is slow
                c, b, t = time_dropout(attn, AT, threads, T, causal, p, runs)
                print("%6d %-6s %3d | %9.1f %10.1f %9.1f %5.2f%s | %+6.1f%%" % (
                    T, "causal" if causal else "none", threads, 1e3 * c, 1e3 * b, 1e3 * t,
                    t / c, "<" if t / c < TARGET_SPEEDUP else " ", 100 * (b / c - 1)))
                sys.stdout.flush()


# ---- main -------------------------------------------------------------------------------------

TABLES = ("attention", "bf16", "layer", "dropout", "gemm")
DEFAULT_TABLES = ("attention", "bf16", "layer", "dropout")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("attn", help="the attn binary; its libattn.so (beside it) is measured, "
                    "and its attn-bench (beside it) measures the FMA peak")
    ap.add_argument("--quick", action="store_true", help="T in {1024, 4096} only")
    ap.add_argument("--runs", type=int, default=5, help="runs per case (default 5)")
    ap.add_argument("--long-runs", type=int, default=1,
                    help="runs per case at T >= %d, without a warm-up (default 1)" % LONG_T)
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--tokens", default=None,
                    help="T values (default 1024,4096,16384; --quick: 1024,4096)")
    ap.add_argument("--out", default=None,
                    help="also write the output to this file (bench/results/README.md)")
    ap.add_argument("--tables", default=",".join(DEFAULT_TABLES),
                    help="which tables, of %s (default: %s)" % (",".join(TABLES),
                                                              ",".join(DEFAULT_TABLES)))
    a = ap.parse_args(argv)
    a.threads = [int(t) for t in a.threads.split(",")]
    a.tokens = [int(t) for t in (a.tokens or ("1024,4096" if a.quick else "1024,4096,16384"))
                .split(",")]
    a.tables = a.tables.split(",")
    unknown = set(a.tables) - set(TABLES)
    if unknown or a.runs < 1 or a.long_runs < 1:
        ap.error("--tables: one of %s; --runs, --long-runs: at least 1" % ",".join(TABLES))
    return a


class Tee:
    """stdout that also writes to a file, line by line as it comes."""

    def __init__(self, stream, path):
        self.stream, self.file = stream, open(path, "w")

    def write(self, text):
        self.stream.write(text)
        self.file.write(text)

    def flush(self):
        self.stream.flush()
        self.file.flush()


def main():
    a = parse_args(sys.argv[1:])
    if not hasattr(F, "scaled_dot_product_attention"):
        sys.exit("peers.py: PyTorch %s (%s) has no F.scaled_dot_product_attention (2.0 and later); "
                 "make bench-peers runs it with PyTorch 2.15 in .venv-peers"
                 % (torch.__version__, sys.executable))
    if a.out:
        sys.stdout = Tee(sys.stdout, a.out)
    attn = Attn(a.attn)
    peaks = fma_peaks(a.attn, a.threads)
    print_header(a.attn, attn, [os.path.relpath(sys.executable)] + sys.argv, peaks)
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    fp32 = attention_table(attn, a, peaks) if "attention" in a.tables else {}
    if "bf16" in a.tables:
        bf16_table(attn, a, fp32)
    if "layer" in a.tables:
        layer_table(attn, a)
    if "dropout" in a.tables:
        dropout_table(attn, a)
    if "gemm" in a.tables:
        gemm_table(attn, a)
    print("\nload average after: %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
