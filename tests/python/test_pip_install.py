"""`pip install ./python` into a fresh virtualenv builds libattn with CMake
into the package; the installed package, imported from elsewhere with no
ATTN_LIBRARY, finds its own libattn and matches PyTorch.

The venv is made with --system-site-packages (Debian's numpy satisfies the
package's one dependency) and pip runs with --no-build-isolation --no-index,
so the test needs no network; a plain `python3 -m venv` + `pip install
./python` fetches setuptools and numpy from PyPI instead (docs/python.md).
The library is built unoptimised (ATTN_BUILD_TYPE=Debug): at -O3 its
kernels made this test a minute long from a fresh clone (64 s in CI), and
the few products it checks need no speed.

Then a second install, into the same venv, with ATTN_BUILD_DIR naming the
suite's own build: the package must take that build's libattn as it is,
byte for byte, without relinking it (the sources match, so CMake has
nothing to do).
usage: test_pip_install.py REPO_ROOT [BUILD_DIR]
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

root = os.path.abspath(sys.argv[1])
tmp = tempfile.mkdtemp(prefix="attn_pip_")
venv = os.path.join(tmp, "venv")
env = {k: v for k, v in os.environ.items() if k not in ("ATTN_LIBRARY", "PYTHONPATH")}
env["ATTN_BUILD_JOBS"] = "2"
env["ATTN_BUILD_TYPE"] = "Debug"
passed = failed = 0


def run(cmd, **kw):
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, text=True, capture_output=True, **kw)


start = time.time()
steps = [
    ["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv],
    [os.path.join(venv, "bin", "pip"), "install", "--no-build-isolation", "--no-index",
     "--disable-pip-version-check", "--quiet", os.path.join(root, "python")],
]
for cmd in steps:
    r = run(cmd)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
        print("0 passed, 1 failed")
        sys.exit(1)
print(f"installed in {time.time() - start:.1f} s")

script = r'''
import numpy as np, torch, attn, os, sys
sys.path.insert(0, sys.argv[1])
import seed_modules as S
assert os.path.dirname(attn._lib.path) == os.path.dirname(attn.__file__), attn._lib.path
torch.manual_seed(123); ref = S.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2).eval()
attn.manual_seed(123); mha = attn.MultiHeadAttention(3, 2, 6, 0.0, num_heads=2).eval()
x = torch.rand(2, 6, 3)
with torch.no_grad():
    want = ref(x).numpy()
err = float(np.abs(mha(x.numpy()) - want).max())
print(f"attn {attn.__version__} from {attn._lib.path}: max abs error vs torch {err:.2e}")
sys.exit(0 if err <= 1e-6 else 1)
'''
r = run([os.path.join(venv, "bin", "python"), "-W", "ignore", "-c", script,
         os.path.join(root, "tests", "conformance")], cwd=tmp)
print(r.stdout, r.stderr[-2000:])
if r.returncode == 0:
    passed += 1
else:
    failed += 1

if len(sys.argv) > 2:
    build = os.path.abspath(sys.argv[2])
    lib = os.path.realpath(os.path.join(build, "libattn.so"))
    before = os.stat(lib).st_mtime_ns
    reuse_env = dict(env, ATTN_BUILD_DIR=build)
    del reuse_env["ATTN_BUILD_TYPE"]
    start = time.time()
    print("$ ATTN_BUILD_DIR=" + build + " pip install --force-reinstall ./python", flush=True)
    r = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--no-build-isolation",
                        "--no-index", "--no-deps", "--force-reinstall",
                        "--disable-pip-version-check", "-v", os.path.join(root, "python")],
                       env=reuse_env, text=True, capture_output=True)
    took = time.time() - start
    where = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                            "import attn, sys; sys.stdout.write(attn._lib.path)"],
                           env=env, text=True, capture_output=True, cwd=tmp).stdout
    same = r.returncode == 0 and where and open(where, "rb").read() == open(lib, "rb").read()
    untouched = os.stat(lib).st_mtime_ns == before
    said = f"attn: reusing the build in {build}" in r.stdout + r.stderr
    print(f"reinstalled in {took:.1f} s from {build}: the package's libattn "
          f"{'is' if same else 'is NOT'} the build's, which was "
          f"{'left as it was' if untouched else 'rebuilt'}")
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-3000:])
    if not said:
        print("setup.py did not say it reused the build")
    if same and untouched and said:
        passed += 1
    else:
        failed += 1
    # `pip install -e ./python`: the package is the checkout's python/attn,
    # so libattn must land there for the import to find it. The library the
    # install puts in the checkout is removed afterwards, unless one was there.
    bundled = os.path.join(root, "python", "attn", "libattn.so")
    had = os.path.exists(bundled)
    print("$ ATTN_BUILD_DIR=" + build + " pip install -e ./python", flush=True)
    r = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "--no-build-isolation",
                        "--no-index", "--no-deps", "--disable-pip-version-check", "-e",
                        os.path.join(root, "python")],
                       env=reuse_env, text=True, capture_output=True)
    probe = subprocess.run([os.path.join(venv, "bin", "python"), "-c",
                            "import attn, sys; sys.stdout.write(attn.__file__ + '\\n' + "
                            "attn._lib.path + '\\n' + attn.__version__)"],
                           env=env, text=True, capture_output=True, cwd=tmp)
    lines = probe.stdout.split("\n")
    package = os.path.realpath(os.path.join(root, "python", "attn"))
    editable = (r.returncode == 0 and probe.returncode == 0 and len(lines) == 3
                and os.path.realpath(os.path.dirname(lines[0])) == package
                and os.path.realpath(os.path.dirname(lines[1])) == package
                and open(lines[1], "rb").read() == open(lib, "rb").read())
    if not had and os.path.exists(bundled):
        os.remove(bundled)
    print("editable install: " + ("imports the checkout's package, with the build's libattn"
                                  if editable else "FAILED"))
    if not editable:
        print(r.stdout[-2000:], r.stderr[-2000:], probe.stdout, probe.stderr[-2000:])
        failed += 1
    else:
        passed += 1
shutil.rmtree(tmp)
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
