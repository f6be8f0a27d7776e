"""safetensors both ways against the PyPI `safetensors` package (in .venv,
installed by scripts/install-python-deps.sh):
  - files it writes (F32, F16, BF16, F64; metadata; module state_dicts from
    PyTorch) attn reads, bit for bit after the exact conversion to float32;
  - files attn writes it reads bit for bit, and they are byte-identical to
    the files it writes for the same arrays and metadata;
  - hostile files it rejects attn rejects too.
  - `attn forward --weights` runs a PyTorch module saved by safetensors.torch.
usage: test_safetensors_interop.py LIBATTN_SO ATTN_CLI
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["ATTN_LIBRARY"] = sys.argv[1]
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "conformance"))

import numpy as np  # noqa: E402
import safetensors  # noqa: E402
import safetensors.numpy as stnp  # noqa: E402
import safetensors.torch as stt  # noqa: E402
import torch  # noqa: E402

import attn  # noqa: E402
import seed_modules  # noqa: E402

passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def same_bits(a, b):
    a, b = np.ascontiguousarray(a, np.float32), np.ascontiguousarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def random_bits(rng, shape):
    """float32 arrays of any bit pattern: NaN payloads, infinities, subnormals."""
    return rng.integers(0, 2**32, size=shape, dtype=np.uint64).astype(np.uint32).view(np.float32)


rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
tmp = tempfile.mkdtemp(prefix="attn_st_interop_")
p_ref, p_attn = os.path.join(tmp, "ref.safetensors"), os.path.join(tmp, "attn.safetensors")
print(f"safetensors {safetensors.__version__}, torch {torch.__version__}")

# 1. The package writes, attn reads: every loadable dtype.
for trial in range(10):
    tensors = {f"t{i}.{rng.integers(1000)}": random_bits(rng, tuple(rng.integers(0, 5, rng.integers(0, 4))))
               for i in range(rng.integers(1, 6))}
    halves = {"half": rng.standard_normal((3, 4)).astype(np.float16),
              "double": rng.standard_normal((5,)) * 10.0 ** rng.integers(-40, 38, 5)}
    stnp.save_file({**tensors, **halves}, p_ref, metadata={"format": "np", "trial": str(trial)})
    back, meta = attn.load_file(p_ref, with_metadata=True)
    check(meta == {"format": "np", "trial": str(trial)}, f"metadata {meta}")
    for name, a in tensors.items():
        check(same_bits(back[name], a), f"F32 {name} read bit for bit")
    check(same_bits(back["half"], halves["half"].astype(np.float32)), "F16 -> float32 exact")
    with np.errstate(over="ignore"):
        check(same_bits(back["double"], halves["double"].astype(np.float32)), "F64 -> float32 rounded")
# an F64 value finite past float32's range is refused by element, not read as inf
stnp.save_file({"big": np.array([1.0, -1e39])}, p_ref)
try:
    attn.load_file(p_ref)
    check(False, "F64 -1e39: refused")
except attn.AttnError as err:
    check("tensor 'big' (F64) holds -9.9999999999999994e+38 at element 1, past float32's "
          "range" in str(err), f"F64 -1e39: {err}")
bf = torch.randn(4, 7).to(torch.bfloat16)
stt.save_file({"bf": bf, "f16": torch.randn(9).half()}, p_ref)
back = attn.load_file(p_ref)
check(same_bits(back["bf"], bf.float().numpy()), "BF16 -> float32 exact")
print("read: F32/F16/BF16/F64 files written by safetensors: bit-identical after conversion")

# 2. attn writes, the package reads, and the bytes are the package's own.
identical = 0
for trial in range(10):
    tensors = {f"w{i}/{rng.integers(100)}\u00e9\"": random_bits(rng, tuple(rng.integers(1, 5, rng.integers(0, 4))))
               for i in range(rng.integers(1, 6))}
    meta = {"format": "pt"}
    attn.save_file(tensors, p_attn, metadata=meta)
    back = stnp.load_file(p_attn)
    check(set(back) == set(tensors), "names survive")
    for name, a in tensors.items():
        check(same_bits(back[name], a), f"{name} read back by safetensors bit for bit")
    stnp.save_file(tensors, p_ref, metadata=meta)
    with open(p_attn, "rb") as f1, open(p_ref, "rb") as f2:
        same = f1.read() == f2.read()
    check(same, "attn's file is byte-identical to safetensors.numpy.save_file's")
    identical += same
print(f"write: {identical}/10 files byte-identical to safetensors.numpy.save_file")

# 3. Modules: attn -> safetensors.torch -> PyTorch module, and back.
x = torch.rand(2, 5, 6)
torch.manual_seed(1)
ref = seed_modules.MultiHeadAttention(6, 4, 5, 0.0, num_heads=2, qkv_bias=True).eval()
attn.manual_seed(99)
mha = attn.MultiHeadAttention(6, 4, 5, 0.0, num_heads=2, qkv_bias=True).eval()
mha.save(p_attn)
sd = stt.load_file(p_attn)
ref.load_state_dict(sd)
with torch.no_grad():
    check(np.allclose(ref(x).numpy(), mha(x.numpy()), atol=1e-6), "torch module on attn's file")
attn_sd = mha.state_dict()
for name, t in sd.items():
    want = attn_sd[name] if name != "mask" else np.triu(np.ones((5, 5), np.float32), 1)
    check(same_bits(t.numpy(), want), f"{name} bit for bit through torch")
torch.manual_seed(2)
ref2 = seed_modules.MultiHeadAttention(6, 4, 5, 0.0, num_heads=2, qkv_bias=True)
stt.save_file(ref2.state_dict(), p_ref, metadata={"format": "pt"})
mha.load(p_ref)
for name, t in ref2.named_parameters():
    check(same_bits(t.detach().numpy(), mha.state_dict()[name]), f"{name} loaded from torch's file")
mha.save(p_attn)
with open(p_attn, "rb") as f1, open(p_ref, "rb") as f2:
    check(f1.read() == f2.read(), "module file byte-identical to "
          "safetensors.torch.save_file(state_dict, metadata={'format': 'pt'})")
# Every module kind: attn's file loads strictly into the seeds' PyTorch class.
cases = [
    (lambda: attn.SelfAttention_v1(4, 3), lambda: seed_modules.SelfAttention_v1(4, 3)),
    (lambda: attn.SelfAttention_v2(4, 3, qkv_bias=True), lambda: seed_modules.SelfAttention_v2(4, 3, qkv_bias=True)),
    (lambda: attn.CausalAttention(4, 3, 6, 0.0), lambda: seed_modules.CausalAttention(4, 3, 6, 0.0)),
    (lambda: attn.MultiHeadAttentionWrapper(4, 3, 6, 0.0, 2), lambda: seed_modules.MultiHeadAttentionWrapper(4, 3, 6, 0.0, 2)),
    (lambda: attn.CausalSelfAttention(4, 2, 6), lambda: seed_modules.CausalSelfAttention(seed_modules.GPTConfig(block_size=6, n_embd=4, n_head=2))),
]
for make_attn, make_torch in cases:
    attn.manual_seed(5)
    ours = make_attn().eval()
    torch.manual_seed(6)
    theirs = make_torch().eval()
    ours.save(p_attn)
    theirs.load_state_dict(stt.load_file(p_attn), strict=True)
    xs = torch.rand(6, 4) if isinstance(ours, (attn.SelfAttention_v1, attn.SelfAttention_v2)) else torch.rand(2, 6, 4)
    with torch.no_grad():
        check(np.allclose(theirs(xs).numpy(), ours(xs.numpy()), atol=1e-5), f"{type(ours).__name__} outputs")
    stt.save_file(theirs.state_dict(), p_ref, metadata={"format": "pt"})
    ours.load(p_ref)
    with open(p_attn, "rb") as f1, open(p_ref, "rb") as f2:
        check(f1.read() == f2.read(), f"{type(ours).__name__}: attn's file == safetensors.torch's")
print("modules: attn <-> safetensors.torch <-> the seeds' torch classes (strict load_state_dict), "
      "files byte-identical")

# The CLI on a PyTorch module's file: the same outputs as the module.
torch.manual_seed(11)
ref3 = seed_modules.MultiHeadAttention(6, 4, 5, 0.0, num_heads=2).eval()
stt.save_file(ref3.state_dict(), p_ref)
x3 = torch.rand(3, 5, 6)
np.save(os.path.join(tmp, "x.npy"), x3.numpy())
r = subprocess.run([sys.argv[2], "forward", "--module", "mha", "--heads", "2", "--d-out", "4",
                    "--weights", p_ref, "--input", os.path.join(tmp, "x.npy"),
                    "--output", os.path.join(tmp, "y.npy")], capture_output=True, text=True)
check(r.returncode == 0, f"attn forward --weights: {r.stderr}")
if r.returncode == 0:
    with torch.no_grad():
        want = ref3(x3).numpy()
    check(np.abs(np.load(os.path.join(tmp, "y.npy")) - want).max() <= 1e-6,
          "attn forward --weights on safetensors.torch's file")
r = subprocess.run([sys.argv[2], "forward", "--module", "mha", "--heads", "2", "--d-out", "6",
                    "--weights", p_ref, "--input", os.path.join(tmp, "x.npy"),
                    "--output", os.path.join(tmp, "y.npy")], capture_output=True, text=True)
check(r.returncode == 1 and "has shape [4, 6]; MultiHeadAttention's W_query.weight is [6, 6]"
      in r.stderr, f"a mis-shaped module: {r.stderr}")
print("CLI: attn forward --weights on a torch module's file matches it")

# 4. Hostile files: what the package rejects, attn rejects.
def image(header, data=b""):
    h = header.encode() if isinstance(header, str) else header
    return len(h).to_bytes(8, "little") + h + data


t = '"dtype":"F32","shape":[2]'
hostile = {
    "not JSON": image("not json"),
    "overlap": image('{"a":{%s,"data_offsets":[0,8]},"b":{%s,"data_offsets":[4,12]}}' % (t, t), bytes(12)),
    "past end": image('{"a":{%s,"data_offsets":[0,8]}}' % t, bytes(4)),
    "wrong size": image('{"a":{%s,"data_offsets":[0,4]}}' % t, bytes(4)),
    "unknown dtype": image('{"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}', bytes(8)),
    "header too long": (10**9).to_bytes(8, "little") + b"{}",
    "gap": image('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)),
    "trailing data": image('{"a":{%s,"data_offsets":[0,8]}}' % t, bytes(12)),
}
for what, img in hostile.items():
    path = os.path.join(tmp, "bad.safetensors")
    with open(path, "wb") as f:
        f.write(img)
    try:
        stnp.load_file(path)
        theirs = "accepted"
    except Exception as err:  # noqa: BLE001 - any rejection
        theirs = f"rejected ({type(err).__name__})"
    try:
        attn.load_file(path)
        ours = "accepted"
    except attn.AttnError as err:
        ours = f"rejected: {err}"
    check(theirs.startswith("rejected") and ours.startswith("rejected"), f"{what}: safetensors {theirs}, attn {ours}")
    print(f"  {what}: safetensors {theirs}; attn {ours}")

# a valid file whose tensor has no elements but a dimension past NumPy's
# limit: a ValueError that names the file and the tensor, not NumPy's bare one
path = os.path.join(tmp, "huge_dim.safetensors")
with open(path, "wb") as f:
    f.write(image('{"a":{"dtype":"F32","shape":[0,%d],"data_offsets":[0,0]}}' % 2**63))
try:
    attn.load_file(path)
    ours = "accepted"
except ValueError as err:
    ours = str(err)
check("huge_dim.safetensors" in ours and "'a'" in ours, f"a zero-element huge shape: {ours}")

for name in os.listdir(tmp):
    os.remove(os.path.join(tmp, name))
os.rmdir(tmp)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
