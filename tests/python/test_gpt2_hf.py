"""Hugging Face GPT-2 attention weights: a randomly initialised tiny GPT-2
from `transformers` (pinned in scripts/requirements-test.txt), saved with
save_pretrained(safe_serialization=True), gives, layer by layer, the same
attention outputs in attn (library and `attn forward --weights`) as
transformers' own GPT2Attention, and `attn heatmap --weights` draws the
attention weights GPT2Attention returns (output_attentions, max error 1e-5);
attn's writer gives a file transformers loads. Tolerance: relative L2 error
1e-5.
usage: test_gpt2_hf.py LIBATTN_SO ATTN_CLI
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["ATTN_LIBRARY"] = sys.argv[1]
cli = sys.argv[2]
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import numpy as np  # noqa: E402
import safetensors.torch as stt  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model  # noqa: E402

import attn  # noqa: E402

passed = failed = 0
TOL = 1e-5


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def rel_l2(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def npy_save(path, a):
    np.save(path, np.ascontiguousarray(a, np.float32))


print(f"transformers {transformers.__version__}, torch {torch.__version__}")
seed = int.from_bytes(os.urandom(4), "little")
print(f"seed {seed}")
torch.manual_seed(seed)
tmp = tempfile.mkdtemp(prefix="attn_gpt2_hf_")
C, H, L, P = 48, 4, 3, 16
cfg = GPT2Config(n_embd=C, n_head=H, n_layer=L, n_positions=P, vocab_size=64,
                 attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
for model_cls, name in ((GPT2Model, "GPT2Model"), (GPT2LMHeadModel, "GPT2LMHeadModel")):
    model = model_cls(cfg).eval()
    with torch.no_grad():  # random biases too: HF initialises them to zero
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    out_dir = os.path.join(tmp, name)
    model.save_pretrained(out_dir, safe_serialization=True)
    path = os.path.join(out_dir, "model.safetensors")
    blocks = model.h if name == "GPT2Model" else model.transformer.h
    prefix = "" if name == "GPT2Model" else "transformer."
    keys = stt.load_file(path).keys()
    check(f"{prefix}h.0.attn.c_attn.weight" in keys, f"{name} names ({sorted(keys)[:3]}...)")
    for layer in range(L):
        x = torch.randn(2, 11, C)
        with torch.no_grad():
            want = blocks[layer].attn(x)[0].numpy()
        module = attn.CausalSelfAttention(C, H, P).load_hf(path, layer).eval()
        err = rel_l2(module(x.numpy()), want)
        check(err <= TOL, f"{name} layer {layer}: library rel L2 {err:.3g}")
        xin, yout = os.path.join(tmp, "x.npy"), os.path.join(tmp, "y.npy")
        npy_save(xin, x.numpy())
        run = subprocess.run([cli, "forward", "--module", "gpt2", "--heads", str(H),
                              "--context", str(P), "--weights", path, "--layer", str(layer),
                              "--input", xin, "--output", yout], capture_output=True, text=True)
        check(run.returncode == 0, f"attn forward --weights: {run.stderr}")
        cli_err = rel_l2(np.load(yout), want) if run.returncode == 0 else float("inf")
        check(cli_err <= TOL, f"{name} layer {layer}: CLI rel L2 {cli_err:.3g}")
        print(f"{name} layer {layer}: relative L2 error library {err:.2e}, CLI {cli_err:.2e}")
        # attn heatmap draws the attention weights transformers computes.
        with torch.no_grad():
            hf_weights = blocks[layer].attn(x, output_attentions=True)[2][1].numpy()  # batch 1
        wout = os.path.join(tmp, "w.npy")
        run = subprocess.run([cli, "heatmap", "--module", "gpt2", "--heads", str(H), "--context",
                              str(P), "--weights", path, "--layer", str(layer), "--input", xin,
                              "--batch", "1", "--terminal", "--save-weights", wout],
                             capture_output=True, text=True)
        check(run.returncode == 0, f"attn heatmap --weights: {run.stderr}")
        w_err = float(np.abs(np.load(wout) - hf_weights).max()) if run.returncode == 0 else 1.0
        check(w_err <= 1e-5, f"{name} layer {layer}: heatmap weights max error {w_err:.3g}")

    # The reverse: attn writes layer 1, transformers loads it.
    attn.manual_seed(seed % 1000)
    ours = attn.CausalSelfAttention(C, H, P).eval()
    ours.save_hf(os.path.join(tmp, "layer1.safetensors"), layer=1)
    sd = stt.load_file(os.path.join(tmp, "layer1.safetensors"))
    if prefix:
        sd = {prefix + k: v for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    check(not unexpected, f"transformers takes attn's names (unexpected {unexpected})")
    x = torch.randn(1, 9, C)
    with torch.no_grad():
        want = blocks[1].attn(x)[0].numpy()
    err = rel_l2(ours(x.numpy()), want)
    check(err <= TOL, f"{name}: transformers on attn's file, rel L2 {err:.3g}")
    print(f"{name}: attn's save_hf file in transformers' layer 1: relative L2 error {err:.2e}")

# Errors name the problem.
m = attn.CausalSelfAttention(C, H, P)
try:
    m.load_hf(os.path.join(tmp, "GPT2Model", "model.safetensors"), L)
    check(False, "missing layer accepted")
except attn.AttnError as err:
    check("no layer 3" in str(err) and "layers 0 to 2" in str(err), str(err))
try:
    attn.CausalSelfAttention(C * 2, H, P).load_hf(os.path.join(tmp, "GPT2Model", "model.safetensors"), 0)
    check(False, "wrong n_embd accepted")
except attn.AttnError as err:
    check("needs [96, 288]" in str(err), str(err))

# --weights-dtype f16 on a bf16 checkpoint names a value past f16's range by its element in
# the file's tensor: Conv1D weights are (in, out), transposed (and c_attn split) on load
big = GPT2LMHeadModel(cfg).to(torch.bfloat16).eval()
with torch.no_grad():
    for p in big.parameters():
        p[p.abs() < 2 ** -14] = 0  # no subnormal of f16 to be refused first
    layer = int(torch.randint(0, L, ()))
    tname = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"][int(torch.randint(0, 4, ()))]
    w = big.transformer.h[layer].get_submodule(tname).weight
    row, col = int(torch.randint(0, w.shape[0], ())), int(torch.randint(0, w.shape[1], ()))
    w[row, col] = 1e6
big_dir = os.path.join(tmp, "big_bf16")
big.save_pretrained(big_dir, safe_serialization=True)
run = subprocess.run([cli, "generate", "--weights", big_dir, "--prompt-ids", "1,2",
                      "--max-new-tokens", "1", "--weights-dtype", "f16"],
                     capture_output=True, text=True)
want = (f"tensor 'transformer.h.{layer}.{tname}.weight' (BF16) holds 999424 at element "
        f"{row * w.shape[1] + col},")
check(run.returncode != 0 and want in run.stderr,
      f"--weights-dtype f16, 1e6 at ({row}, {col}) of h.{layer}.{tname}: {run.stderr.strip()}")

subprocess.run(["rm", "-rf", tmp])
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
