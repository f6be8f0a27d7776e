"""The Python package (python/attn) against PyTorch: the seven modules built
after the same manual_seed hold the same state_dict bit for bit (buffers
included, in torch's order), give the same outputs in eval mode and the same
dropout in training mode, load each other's state_dicts, and (when the
library has backward) give the gradients autograd gives. Library errors
arrive as attn.AttnError with the library's message.
usage: test_package.py LIBATTN_SO
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["ATTN_LIBRARY"] = sys.argv[1]
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "conformance"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import attn  # noqa: E402
import seed_modules as S  # noqa: E402

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def close(got, want, tol=1e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.abs(want).max(initial=0.0)))
    return got.shape == want.shape and float(np.abs(got - want).max(initial=0.0)) <= tol * scale


def bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


seed = int.from_bytes(os.urandom(4), "little") % 100000
print(f"attn {attn.__version__} from {attn._lib.path}; seed {seed}")
torch.set_num_threads(1)

# (name, attn constructor, torch constructor, input rank)
CASES = [
    ("simple", lambda: attn.SimpleSelfAttention(5), lambda: S.SimplifiedSelfAttention(), 2),
    ("sa_v1", lambda: attn.SelfAttention_v1(5, 3), lambda: S.SelfAttention_v1(5, 3), 2),
    ("sa_v2", lambda: attn.SelfAttention_v2(5, 3, qkv_bias=True),
     lambda: S.SelfAttention_v2(5, 3, qkv_bias=True), 2),
    ("causal", lambda: attn.CausalAttention(5, 3, 7, 0.5), lambda: S.CausalAttention(5, 3, 7, 0.5), 3),
    ("wrapper", lambda: attn.MultiHeadAttentionWrapper(5, 3, 7, 0.5, num_heads=2),
     lambda: S.MultiHeadAttentionWrapper(5, 3, 7, 0.5, num_heads=2), 3),
    ("mha", lambda: attn.MultiHeadAttention(5, 4, 7, 0.5, num_heads=2, qkv_bias=True),
     lambda: S.MultiHeadAttention(5, 4, 7, 0.5, num_heads=2, qkv_bias=True), 3),
    ("gpt2", lambda: attn.CausalSelfAttention(S.GPTConfig(n_embd=6, n_head=3, block_size=7, dropout=0.5)),
     lambda: S.CausalSelfAttentionDropout(S.GPTConfig(n_embd=6, n_head=3, block_size=7, dropout=0.5)), 3),
]

for name, make_ours, make_theirs, rank in CASES:
    torch.manual_seed(seed)
    theirs = make_theirs()
    attn.manual_seed(seed)
    ours = make_ours()
    sd_t, sd_o = theirs.state_dict(), ours.state_dict()
    check(list(sd_t) == list(sd_o), f"{name}: state_dict keys {list(sd_o)} vs torch {list(sd_t)}")
    check(all(np.array_equal(bits(sd_t[k].numpy()), bits(sd_o[k])) for k in sd_t if k in sd_o),
          f"{name}: state_dict bit for bit")
    d_in = 6 if name == "gpt2" else 5
    x = torch.rand(*((2, 6, d_in) if rank == 3 else (6, d_in)))
    # eval
    theirs.eval()
    ours.eval()
    check(not ours.training, f"{name}: eval()")
    with torch.no_grad():
        want = theirs(x).numpy()
    check(close(ours(x.numpy()), want), f"{name}: eval forward")
    # training-mode dropout: the same draws from the same seed
    if rank == 3:
        theirs.train()
        ours.train()
        torch.manual_seed(seed + 1)
        attn.manual_seed(seed + 1)
        with torch.no_grad():
            want = theirs(x).numpy()
        check(close(ours(x.numpy()), want), f"{name}: training forward with dropout 0.5")
    # load_state_dict both ways
    torch.manual_seed(seed + 2)
    other = make_theirs().eval()
    ours.load_state_dict({k: v.numpy() for k, v in other.state_dict().items()})
    check(all(np.array_equal(bits(v.numpy()), bits(ours.state_dict()[k]))
              for k, v in other.state_dict().items()), f"{name}: load_state_dict from torch")
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in ours.state_dict().items()})
    # backward vs autograd (eval mode: no dropout)
    if attn._lib.has("attn_module_backward"):
        ours.eval()
        theirs.eval()
        xg = x.clone().requires_grad_(True)
        y = theirs(xg)
        dy = torch.randn_like(y)
        y.backward(dy)
        ours.zero_grad()
        ours(x.numpy())
        dx = ours.backward(dy.numpy())
        check(close(dx, xg.grad.numpy(), 1e-4), f"{name}: backward dx")
        grads = ours.grads()
        for k, p in theirs.named_parameters():
            check(k in grads and close(grads[k], p.grad.numpy(), 1e-4), f"{name}: grad of {k}")
    print(f"{name}: state_dict, eval/train forward, load_state_dict, backward ok")

# errors carry the library's message
try:
    attn.MultiHeadAttention(4, 6, 8, 0.0, num_heads=4)
    check(False, "bad head count accepted")
except attn.AttnError as err:
    check(err.status == "ATTN_ERR_INVALID" and "d_out (6) must be divisible by num_heads (4)" in str(err), str(err))
m = attn.CausalAttention(3, 2, 4, 0.0)
try:
    m(np.zeros((1, 5, 3), np.float32))
    check(False, "too long input accepted")
except attn.AttnError as err:
    check("sequence length (5) exceeds context_length (4)" in str(err), str(err))
try:
    m.load_state_dict({"W_query.weight": np.zeros((2, 3))})
    check(False, "missing keys accepted")
except RuntimeError as err:
    check("Missing key(s)" in str(err) and "W_key.weight" in str(err), str(err))
try:
    m.load("/nonexistent.safetensors")
    check(False, "missing file accepted")
except attn.AttnError as err:
    check(err.status == "ATTN_ERR_IO" and "/nonexistent.safetensors: cannot open" in str(err), str(err))
try:
    attn.manual_seed(-1)
    check(False, "negative seed accepted")
except ValueError:
    check(True, "")
# rand is torch.rand, bit for bit
attn.manual_seed(seed)
torch.manual_seed(seed)
check(np.array_equal(bits(attn.rand(3, 4)), bits(torch.rand(3, 4).numpy())), "attn.rand == torch.rand")
check(attn.__version__ == attn._lib.lib.attn_version().decode(), "version")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
