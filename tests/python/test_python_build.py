"""`python -m build` (PyPA's build front end, pinned in
scripts/requirements-test.txt) on the package, with --no-isolation (the
project virtualenv's setuptools and wheel, so no network):
  - plain `python -m build ./python` builds the sdist, then the wheel from
    the unpacked sdist, which carries no C sources: it must refuse, saying
    to run `python -m build --wheel`, or make a wheel that holds libattn;
    never a wheel without it, silently;
  - `python -m build --wheel ./python` builds from the repository: its
    wheel holds the build's libattn (ATTN_BUILD_DIR, byte for byte);
  - ATTN_SKIP_BUILD=1 makes the package without libattn, as asked.
The package is built in a copy (python/ with the two files setup.py looks
for beside it), so nothing is written into the checkout.
usage: test_python_build.py REPO_ROOT BUILD_DIR
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

root, build = (os.path.abspath(a) for a in sys.argv[1:3])
tmp = tempfile.mkdtemp(prefix="attn_build_")
repo = os.path.join(tmp, "repo")
shutil.copytree(os.path.join(root, "python"), os.path.join(repo, "python"),
                ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__",
                                              "libattn.so"))
os.makedirs(os.path.join(repo, "include"))
shutil.copy(os.path.join(root, "CMakeLists.txt"), repo)
shutil.copy(os.path.join(root, "include", "attn.h"), os.path.join(repo, "include"))
env = {k: v for k, v in os.environ.items()
       if k not in ("ATTN_LIBRARY", "ATTN_SKIP_BUILD", "PYTHONPATH")}
env["ATTN_BUILD_DIR"] = build
library = open(os.path.realpath(os.path.join(build, "libattn.so")), "rb").read()
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def python_build(name, *args, **extra):
    """Runs python -m build on the copy; (return code, output, the wheels'
    {path: the bytes of attn/libattn.so in it, or None})."""
    out = os.path.join(tmp, name)
    cmd = [sys.executable, "-m", "build", "--no-isolation", "--outdir", out, *args,
           os.path.join(repo, "python")]
    print("$", " ".join(f"{k}={v}" for k, v in extra.items()), " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env=dict(env, **extra), text=True, capture_output=True, cwd=tmp)
    wheels = {}
    for path in glob.glob(os.path.join(out, "*.whl")):
        with zipfile.ZipFile(path) as z:
            wheels[os.path.basename(path)] = (z.read("attn/libattn.so")
                                              if "attn/libattn.so" in z.namelist() else None)
    return r.returncode, r.stdout + r.stderr, wheels


rc, said, wheels = python_build("plain")
refused = rc != 0 and "python -m build --wheel" in said and not wheels
print(f"python -m build: exit {rc}, wheels {sorted(wheels)}")
check(refused or (wheels and all(lib == library for lib in wheels.values())),
      "python -m build ./python: neither refused, saying to build the wheel from the "
      f"repository, nor made wheels holding libattn (exit {rc}, wheels "
      f"{ {w: lib is not None for w, lib in wheels.items()} }):\n{said[-2000:]}")

rc, said, wheels = python_build("wheel", "--wheel")
print(f"python -m build --wheel: exit {rc}, wheels {sorted(wheels)}")
check(rc == 0 and len(wheels) == 1 and list(wheels.values())[0] == library,
      f"python -m build --wheel ./python: a wheel holding the build's libattn (exit {rc}, "
      f"wheels { {w: lib is not None for w, lib in wheels.items()} }):\n{said[-2000:]}")

rc, said, wheels = python_build("skipped", ATTN_SKIP_BUILD="1")
print(f"ATTN_SKIP_BUILD=1 python -m build: exit {rc}, wheels {sorted(wheels)}")
check(rc == 0 and len(wheels) == 1 and list(wheels.values())[0] is None,
      f"ATTN_SKIP_BUILD=1 python -m build ./python: a wheel without libattn (exit {rc}):\n"
      f"{said[-2000:]}")

shutil.rmtree(tmp, ignore_errors=True)
print(f"python_build: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
