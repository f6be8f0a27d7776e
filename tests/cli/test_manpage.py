"""attn(1) and the version: the generated man page holds the --help of attn
and of every command it lists, verbatim; groff renders it without warnings;
`attn --version` prints the version of attn.h, CMakeLists.txt and the
Python package's pyproject.toml.
usage: test_manpage.py ATTN_CLI ATTN_1 SOURCE_DIR
"""
import re
import shutil
import subprocess
import sys

cli, manpage, src = sys.argv[1:4]
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAIL:", what)


def run(*args):
    return subprocess.run([cli, *args], capture_output=True, text=True)


header = open(f"{src}/include/attn.h").read()
want = re.search(r'#define ATTN_VERSION_STRING "([^"]+)"', header).group(1)
parts = [re.search(rf"#define ATTN_VERSION_{k} (\d+)", header).group(1) for k in ("MAJOR", "MINOR", "PATCH")]
check(".".join(parts) == want, f"ATTN_VERSION_MAJOR.MINOR.PATCH {parts} vs {want}")
cmake = re.search(r"project\(attn VERSION ([0-9.]+)", open(f"{src}/CMakeLists.txt").read()).group(1)
check(cmake == want, f"CMakeLists.txt project version {cmake} vs attn.h {want}")
py = re.search(r'^version = "([^"]+)"', open(f"{src}/python/pyproject.toml").read(), re.M).group(1)
check(py == want, f"python/pyproject.toml version {py} vs attn.h {want}")
for flag in ("--version", "version"):
    r = run(flag)
    # attn version: the version, the CPU in two lines "cpu: ...", then the
    # kernels chosen for it, "kernels: ..."
    lines = r.stdout.split("\n") if flag == "version" else [r.stdout]
    check(r.returncode == 0 and (r.stdout == f"attn {want}\n" if flag == "--version" else
          lines[0] == f"attn {want}" and len(lines) == 5 and lines[4] == ""
          and all(l.startswith("cpu: ") for l in lines[1:3])
          and lines[3].startswith("kernels: ")), f"attn {flag}: {r.stdout!r}")

text = open(manpage).read()
check(f'.TH ATTN 1 "" "attn {want}"' in text, "the .TH line carries the version")
# undo the generator's escapes
plain = re.sub(r"(^|\n)\\&", r"\1", text).replace("\\e", "\\")
overview = run("--help").stdout
commands = re.findall(r"^  ([a-z]+) ", overview.split("commands:")[1], re.M)
check(len(commands) >= 6, f"commands listed: {commands}")
for name in commands:
    if name == "version":
        continue
    check(f".SS attn {name}\n" in text, f"a section for attn {name}")
    help_text = run(name, "--help").stdout
    section = plain.split(f".SS attn {name}\n", 1)[-1].split(".SS ", 1)[0]
    check(help_text.rstrip("\n") in section, f"attn {name} --help verbatim in its section")
check(overview.rstrip("\n") in plain, "attn --help verbatim")
# EXIT STATUS lists every status a command's help gives, the signals' too
exit_status = text.split(".SH EXIT STATUS", 1)[-1].split(".SH ", 1)[0]
for name in commands:
    if "128 + the signal's number" in run(name, "--help").stdout:
        check("128" in exit_status, f"EXIT STATUS gives 128 + N, as attn {name} --help does")
if shutil.which("groff"):
    r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", manpage], capture_output=True, text=True)
    check(r.returncode == 0 and not r.stderr.strip(), f"groff warnings: {r.stderr}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
