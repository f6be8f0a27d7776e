"""The documentation against the code it describes.

1. Every fenced ```sh or ```python block of README.md and docs/*.md that the
   line before marks `<!-- doc-test -->` runs, in the order of its file, in
   one temporary directory per file (holding a link to data/, as the
   repository's root does), with `attn` (the build's) first on PATH,
   `python3` the test venv's, and the package importable from python/ over the
   build's libattn. A block fails the test when it exits non-zero.
2. Every relative link of those files names a file that exists, and every
   `#anchor` into a Markdown file names one of its headings.
   Every `attn` command line of an unmarked ```sh block (one under `mpirun`
   too, run as a single process) takes its arguments: run from a directory
   holding data/ and the README's x.npy (2, 6, 768), it may fail on a file it
   lacks (exit 1), not on its options (exit 2). Every unmarked ```python block
   (but a `>>>` session) parses and reads no name it does not define or import,
   `attn` and `np` aside.
3. Facts the docs state about the code: docs/cli.md's table lists every
   command of `attn --help`; docs/python.md's table lists every module class
   of the package; the man page's SEE ALSO names files that exist; the sample
   line of `attn train --help` has the shape of the line a run prints, and the
   run's header names the options of the optimizer it ran; the package's
   licence is the one in LICENSE; `make demo` builds the attn command alone;
   README.md stays a guide (under 300 lines).

usage: test_docs.py REPO ATTN LIBATTN PYTHON
"""
import ast
import builtins
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

REPO, ATTN, LIBATTN, PYTHON = (os.path.abspath(a) for a in sys.argv[1:5])
MARK = "<!-- doc-test -->"
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg)


def doc_files():
    files = [os.path.join(REPO, "README.md")]
    docs = os.path.join(REPO, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return files


def marked_blocks(text):
    """(line number, language, code) of each block the line before marks."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == MARK and i + 1 < len(lines):
            m = re.match(r"^```(\w+)\s*$", lines[i + 1])
            if not m:
                fail(f"line {i + 1}: {MARK} is not followed by a fenced block")
                i += 1
                continue
            j = i + 2
            while j < len(lines) and lines[j].rstrip() != "```":
                j += 1
            out.append((i + 2, m.group(1), "\n".join(lines[i + 2:j])))
            i = j
        i += 1
    return out


def environment(bindir):
    env = dict(os.environ)
    env["PATH"] = bindir + os.pathsep + os.path.dirname(PYTHON) + os.pathsep + env["PATH"]
    env["PYTHONPATH"] = os.path.join(REPO, "python")
    env["ATTN_LIBRARY"] = LIBATTN
    return env


def run_blocks():
    bindir = tempfile.mkdtemp(prefix="attn-doc-bin-")
    try:
        return run_blocks_in(bindir)
    finally:
        shutil.rmtree(bindir, ignore_errors=True)


def run_blocks_in(bindir):
    os.symlink(os.path.abspath(ATTN), os.path.join(bindir, "attn"))
    os.symlink(os.path.abspath(PYTHON), os.path.join(bindir, "python3"))
    env = environment(bindir)
    count = 0
    for path in doc_files():
        blocks = marked_blocks(open(path, encoding="utf-8").read())
        if not blocks:
            continue
        work = tempfile.mkdtemp(prefix="attn-doc-")
        try:
            count += run_file_blocks(path, blocks, work, env)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if count == 0:
        fail("no block is marked " + MARK)
    return count


def run_file_blocks(path, blocks, work, env):
    # the blocks run as from the repository's root: data/ is there
    os.symlink(os.path.join(REPO, "data"), os.path.join(work, "data"))
    count = 0
    for line, lang, code in blocks:
        where = f"{os.path.relpath(path, REPO)}:{line}"
        if lang == "sh":
            cmd = ["bash", "-e", "-o", "pipefail", "-c", code]
        elif lang == "python":
            cmd = [PYTHON, "-c", code]
        else:
            fail(f"{where}: a marked block must be sh or python, not {lang}")
            continue
        try:
            # decoded text may cut a character at a token's edge
            r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                               errors="replace", timeout=300)
        except subprocess.TimeoutExpired:
            fail(f"{where}: the {lang} block ran past 300 s")
            continue
        count += 1
        if r.returncode != 0:
            fail(f"{where}: the {lang} block exited {r.returncode}:\n{r.stdout[-2000:]}"
                 f"{r.stderr[-2000:]}")
        else:
            print(f"ok {where} ({lang})")
    return count


def slug(heading):
    """GitHub's anchor of a heading."""
    h = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return h.replace(" ", "-")


def anchors(path):
    out = set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            m = re.match(r"^#{1,6}\s+(.*)$", line)
            if m:
                out.add(slug(m.group(1)))
    return out


def check_links():
    count = 0
    for path in doc_files():
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            count += 1
            file_part, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                if file_part else path
            where = os.path.relpath(path, REPO)
            if not os.path.exists(dest):
                fail(f"{where}: link to {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                fail(f"{where}: link to {target}: no heading with that anchor")
    return count


def unmarked_commands(text):
    """(line number, argv after `attn`) of each attn command of an unmarked sh block."""
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            if lines[i].strip() == "```sh" and (i == 0 or lines[i - 1].strip() != MARK):
                k = i + 1
                while k < j:
                    start, cmd = k + 1, lines[k]
                    while cmd.endswith("\\") and k + 1 < j:
                        k += 1
                        cmd = cmd[:-1] + lines[k]
                    k += 1
                    words = shlex.split(cmd, comments=True)
                    if words and words[0] == "mpirun":
                        words = words[next((n for n, w in enumerate(words)
                                            if w.endswith("attn")), len(words)):]
                    if words and words[0] in ("attn", "./build/attn"):
                        out.append((start, words[1:]))
            i = j
        i += 1
    return out


def check_commands():
    """The attn command lines of the unmarked blocks, each run once to see that it
    takes its arguments. One still running after a few seconds is past them (the
    book's pretraining run takes minutes). A line meant for mpirun runs as one
    process; a build without MPI runs it without --context-parallel."""
    import numpy as np
    count = 0
    for path in doc_files():
        for line, argv in unmarked_commands(open(path, encoding="utf-8").read()):
            work = tempfile.mkdtemp(prefix="attn-doc-cmd-")
            try:
                os.symlink(os.path.join(REPO, "data"), os.path.join(work, "data"))
                np.save(os.path.join(work, "x.npy"), np.random.rand(2, 6, 768).astype("f4"))
                r = run_in(work, argv)
                if r and r.returncode == 2 and "this build has no MPI" in r.stderr:
                    n = argv.index("--context-parallel")
                    r = run_in(work, argv[:n] + argv[n + 2:])
            finally:
                shutil.rmtree(work, ignore_errors=True)
            count += 1
            if r and r.returncode == 2:
                fail(f"{os.path.relpath(path, REPO)}:{line}: `attn {' '.join(argv)}` "
                     f"is refused as a usage error: {r.stderr.strip()}")
    if count == 0:
        fail("no attn command found in the unmarked sh blocks: the parse is wrong")
    return count


def check_python_names():
    """The unmarked python blocks, which need files no test has (checkpoints,
    tokenizers), parsed: a name read and never bound fails as the reader would."""
    count = 0
    for path in doc_files():
        lines = open(path, encoding="utf-8").read().split("\n")
        for n, line in enumerate(lines):
            if line.strip() != "```python" or (n and lines[n - 1].strip() == MARK):
                continue
            end = next(k for k in range(n + 1, len(lines)) if lines[k].startswith("```"))
            code = "\n".join(lines[n + 1:end])
            if code.lstrip().startswith(">>>"):
                continue
            count += 1
            where = f"{os.path.relpath(path, REPO)}:{n + 2}"
            try:
                tree = ast.parse(code)
            except SyntaxError as e:
                fail(f"{where}: the python block does not parse: {e}")
                continue
            bound = set(dir(builtins)) | {"attn", "np"}
            for node in ast.walk(tree):
                if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                    bound.add(node.id)
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
                elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    bound.add(node.name)
                elif isinstance(node, ast.arg):
                    bound.add(node.arg)
            unbound = sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name)
                              and isinstance(node.ctx, ast.Load)} - bound)
            if unbound:
                fail(f"{where}: the python block reads {', '.join(unbound)}, which it never "
                     f"defines")
    return count


def run_in(work, argv):
    """The run of attn with argv in work, or None when it ran past 5 s."""
    try:
        return subprocess.run([ATTN, *argv], cwd=work, capture_output=True, text=True,
                              errors="replace", timeout=5)
    except subprocess.TimeoutExpired:
        return None


def run(*args):
    return subprocess.run([ATTN, *args], capture_output=True, text=True, timeout=120)


def check_facts():
    # docs/cli.md's table of commands against `attn --help`
    help_text = run("--help").stdout
    commands = re.findall(r"^  (\w+)\s{2,}", help_text.split("commands:")[1], flags=re.M)
    if len(commands) < 8:
        fail(f"attn --help lists {len(commands)} commands: the parse is wrong")
    cli_md = open(os.path.join(REPO, "docs", "cli.md"), encoding="utf-8").read()
    for c in commands:
        if f"| `attn {c}` |" not in cli_md:
            fail(f"docs/cli.md's command table does not list `attn {c}`")

    # docs/python.md's module table against the package's module classes
    sys.path.insert(0, os.path.join(REPO, "python"))
    os.environ["ATTN_LIBRARY"] = LIBATTN
    import attn.modules as modules
    classes = sorted(n for n, v in vars(modules).items() if isinstance(v, type)
                     and issubclass(v, modules.Module) and v is not modules.Module)
    py_md = open(os.path.join(REPO, "docs", "python.md"), encoding="utf-8").read()
    listed = sorted(set(re.findall(r"^\| `(\w+)\(", py_md, flags=re.M)))
    if listed != classes:
        fail(f"docs/python.md's table lists {listed}, the package has {classes}")
    words = {7: "seven", 8: "eight", 9: "nine", 10: "ten", 11: "eleven", 12: "twelve"}
    for path in doc_files():
        for n, w in words.items():
            if n != len(classes) and re.search(rf"(?<!seeds' )\b{w} modules\b",
                                               open(path).read()):
                fail(f"{os.path.relpath(path, REPO)} speaks of {w} modules; "
                     f"the package has {len(classes)}")

    # the man page's SEE ALSO
    man = open(os.path.join(REPO, "cmake", "attn.1.in"), encoding="utf-8").read()
    see_also = man.split(".SH SEE ALSO")[1]
    for f in re.findall(r"^\.IR (\S+?) ?[,.]?$", see_also, flags=re.M):
        if not os.path.exists(os.path.join(REPO, f)):
            fail(f"attn.1's SEE ALSO names {f}, which does not exist")

    # attn train: its help's sample line and its header
    sample = re.search(r"The last line reads like: (.*)$", run("train", "--help").stdout,
                       flags=re.M)
    r = run("train", "--task", "copy", "--steps", "20", "--eval", "64", "--threads", "1")
    last = r.stdout.strip().split("\n")[-1] if r.stdout.strip() else ""
    if not sample:
        fail("attn train --help shows no sample of its last line")
    else:
        pattern = re.escape(sample.group(1).strip())
        pattern = re.sub(r"\d+(\\\.\d+)?", r"\\d+(\\.\\d+)?", pattern)
        if not re.fullmatch(pattern, last):
            fail(f"attn train --help's sample line {sample.group(1)!r} has not the shape "
                 f"of what it prints: {last!r}")
    header = r.stdout.split("\n")[1] if r.returncode == 0 else ""
    if not header.startswith("adamw") or "momentum" in header or "betas 0.9, 0.999" not in header:
        fail(f"attn train's adamw header does not name AdamW's options: {header!r}")
    r = run("train", "--task", "copy", "--steps", "2", "--eval", "8", "--optimizer", "sgd",
            "--threads", "1")
    header = r.stdout.split("\n")[1] if r.returncode == 0 else ""
    if not header.startswith("sgd") or "momentum 0.9" not in header or "betas" in header:
        fail(f"attn train's sgd header does not name SGD's options: {header!r}")

    # one licence
    lic = open(os.path.join(REPO, "LICENSE"), encoding="utf-8").readline().split()[0]
    pyproject = open(os.path.join(REPO, "python", "pyproject.toml"), encoding="utf-8").read()
    m = re.search(r'license = \{text = "([^"]+)"\}', pyproject)
    if not m or m.group(1) != lic:
        fail(f"python/pyproject.toml's licence {m.group(1) if m else None!r} is not "
             f"LICENSE's {lic!r}")

    # the README's first command builds what the demo needs, not the suite
    r = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True)
    builds = [line for line in r.stdout.split("\n") if "cmake --build" in line]
    if r.returncode != 0 or not builds or any("--target attn_cli" not in b for b in builds):
        fail(f"make demo builds more than the attn command: {builds}")

    n = open(os.path.join(REPO, "README.md"), encoding="utf-8").read().count("\n")
    if n >= 300:
        fail(f"README.md has {n} lines: a guide stays under 300 (move detail to docs/)")


blocks = run_blocks()
links = check_links()
commands = check_commands()
python_blocks = check_python_names()
check_facts()
print(f"{blocks} doc blocks run, {links} links checked, {commands} commands parsed, "
      f"{python_blocks} python blocks read, {len(failures)} failures")
sys.exit(1 if failures else 0)
