#!/usr/bin/python3
"""The layering of src/ against the Layers table of docs/architecture.md.

    check_layers.py [--root REPO]     check the tree (exit 1 on any problem)
    check_layers.py --self-test       check the checker on small trees

Reads every `#include "..."` of src/ (outside comments), resolves it as the
compiler does (the including file's folder, then include/, src/core/, src/:
the library's include path in its order, CMakeLists.txt's
attn_configure_target), and fails on
  - an include into a folder of a higher layer, or of another folder on the
    same layer;
  - a cycle of folders;
  - a folder under src/ with no row in the table, an include that resolves
    to no file;
  - a cycle of files inside one folder, where file A depends on file B
    when A includes B, or when A (a .c) names a function that B (a .c)
    defines with external linkage: the calls count because one header
    shared by several .c files would otherwise hide their cycle.
docs/architecture.md says the same for readers; the table is read from
there, so the document and the check cannot disagree.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile
from collections import defaultdict, deque

# The back-arrows other branches are removing, include by include (the
# including file and the file it includes, both under src/). The check
# passes over these and fails on any that it no longer finds, so each entry
# goes when its branch lands and the list ends empty.
KNOWN_VIOLATIONS = [
    # none: an edge listed here (including file, included file) is passed
    # over while a branch removes it, and fails the check once it is gone
]

# The library's include path after the including file's own folder, in the
# compiler's order (relative to the repository).
INCLUDE_PATH = ("include", "src/core", "src")

INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"\n]+)"', re.M)
# A function's head at column 0 (the library's style): group 1 is `static`
# when it is, group 2 the name right before the parameter list; `{` after
# the list tells a definition from a declaration.
DEFINITION = re.compile(r"^(static\s+)?[A-Za-z_][^;{}()=#]*?\b([A-Za-z_]\w*)\s*\(", re.M)
IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*\b")


def blank(text, strings):
    """text with its comments (and string and char literals when strings is
    true) turned to spaces, newlines kept, so line numbers still hold."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i) or text.startswith("//", i):
            end = "*/" if text[i + 1] == "*" else "\n"
            j = text.find(end, i + 2)
            j = n if j < 0 else (j + 2 if end == "*/" else j)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]) if strings else text[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def read_table(root):
    """{folder: layer} from the Layers section of docs/architecture.md, and
    the problems found in it."""
    path = os.path.join(root, "docs", "architecture.md")
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        return {}, ["docs/architecture.md: cannot read it (%s)" % e]
    table, problems, in_section, rows = {}, [], False, 0
    for number, line in enumerate(lines, 1):
        if re.match(r"##\s+Layers\s*$", line):
            in_section = True
            continue
        if in_section and re.match(r"##\s", line):
            break
        if not in_section or not line.lstrip().startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "Layer" or set(cells[0]) <= set(":- "):
            continue  # the header and the separator
        if len(cells) < 2 or not cells[0].isdigit():
            problems.append("docs/architecture.md:%d: a row of the Layers table without a "
                            "layer number and a folder: %s" % (number, line.strip()))
            continue
        folder = cells[1].strip("`").strip().rstrip("/")
        if folder in table:
            problems.append("docs/architecture.md:%d: folder %s has two rows" % (number, folder))
        table[folder] = int(cells[0])
        rows += 1
    if not rows:
        problems.append("docs/architecture.md: no Layers table (a '## Layers' section with rows "
                        "| layer | `folder` | what it holds |)")
    return table, problems


def source_files(root):
    """Repository-relative paths of src/'s .c and .h files, sorted."""
    found = []
    for top, dirs, files in os.walk(os.path.join(root, "src")):
        dirs.sort()
        for name in sorted(files):
            if name.endswith((".c", ".h")):
                found.append(os.path.relpath(os.path.join(top, name), root).replace(os.sep, "/"))
    return found


def resolve(root, including, name):
    """The repository-relative file `#include "name"` in including reaches,
    or None."""
    for base in (os.path.dirname(including),) + INCLUDE_PATH:
        candidate = os.path.normpath(os.path.join(base, name)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    return None


def folder_of(path):
    """The first folder under src/ of a repository-relative path; None
    outside src/ (include/'s public headers), "" for a file directly in src/."""
    parts = path.split("/")
    if parts[0] != "src":
        return None
    return parts[1] if len(parts) > 2 else ""


def src_name(path):
    return path[4:] if path.startswith("src/") else path


def definitions_and_uses(text):
    """The functions a .c defines (external, static) and the identifiers
    it names, from its text with comments and literals blanked."""
    code = re.sub(r"^[ \t]*#.*$", "", text.replace("\\\n", " "), flags=re.M)
    external, static = set(), set()
    for m in DEFINITION.finditer(code):
        i, depth = m.end(), 1
        while i < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        if code[i:].lstrip().startswith("{"):
            (static if m.group(1) else external).add(m.group(2))
    return external, static, set(IDENTIFIER.findall(code))


def find_cycle(nodes, edges):
    """One cycle through the strongly connected nodes: a list of nodes, its
    first repeated at the end."""
    start = min(nodes)
    previous, queue = {}, deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges[node]):
            if nxt not in nodes:
                continue
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [start] + path[::-1][1:] + [start] if len(path) > 1 else [start, start]
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return [start]


def strongly_connected(edges):
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    nodes = sorted(set(edges) | {b for a in edges for b in edges[a]})

    def visit(v):
        # iterative, so deep graphs do not meet Python's recursion limit
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            advanced = False
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.add(w)
                    if w == node:
                        break
                if len(component) > 1:
                    found.append(component)

    for v in nodes:
        if v not in index:
            visit(v)
    return found


def check(root, known):
    """(problems, notes): the layering's problems in the tree at root, each
    a line; notes say what was checked and which known violations remain."""
    table, problems = read_table(root)
    files = source_files(root)
    known = set(known)
    known_seen = set()
    folder_edges = defaultdict(set)  # folder -> folders it includes (known ones left out)
    folder_why = {}                  # (folder, folder) -> an include that makes the edge
    file_edges = defaultdict(set)    # file -> files of its folder it includes or calls
    file_why = {}
    unknown_folders = {}
    n_includes = 0
    texts = {}
    for path in files:
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            texts[path] = f.read()
    for path in files:
        here = folder_of(path)
        if here not in table and here not in unknown_folders:
            unknown_folders[here] = path
        code = blank(texts[path], strings=False)
        for m in INCLUDE.finditer(code):
            n_includes += 1
            line = code.count("\n", 0, m.start()) + 1
            where = '%s:%d includes "%s"' % (src_name(path), line, m.group(1))
            target = resolve(root, path, m.group(1))
            if target is None:
                problems.append("unresolved: %s, which is no file of the folder, include/, "
                                "src/core/ or src/" % where)
                continue
            there = folder_of(target)
            if there is None:
                continue  # include/: the public headers, below every layer
            if there == here:
                a, b = src_name(path), src_name(target)
                if a != b:
                    file_edges[a].add(b)
                    file_why.setdefault((a, b), where)
                continue
            edge = (src_name(path), src_name(target))
            if edge in known:
                known_seen.add(edge)
                continue
            if here in table and there in table:
                if table[there] > table[here]:
                    problems.append("higher layer: %s (%s, layer %d, from %s, layer %d)" %
                                    (where, there, table[there], here, table[here]))
                elif table[there] == table[here]:
                    problems.append("same layer: %s (%s and %s are both layer %d)" %
                                    (where, there, here, table[here]))
            folder_edges[here].add(there)
            folder_why.setdefault((here, there), where)

    for folder, path in sorted(unknown_folders.items()):
        problems.append("no layer: %s is in no row of docs/architecture.md's Layers table (%s)" %
                        ("src/" + folder if folder else "src/ itself", path))

    # calls between the .c files of one folder
    owners = defaultdict(set)
    parsed = {}
    for path in files:
        if path.endswith(".c"):
            parsed[path] = definitions_and_uses(blank(texts[path], strings=True))
            for name in parsed[path][0]:
                owners[(folder_of(path), name)].add(path)
    for path, (external, static, names) in parsed.items():
        for name in sorted(names - external - static):
            for owner in owners.get((folder_of(path), name), ()):
                a, b = src_name(path), src_name(owner)
                if a != b:
                    file_edges[a].add(b)
                    file_why.setdefault((a, b), "%s calls %s (defined in %s)" % (a, name, b))

    for component in strongly_connected(folder_edges):
        cycle = find_cycle(component, folder_edges)
        problems.append("folder cycle: %s: %s%s" % (
            " -> ".join(cycle),
            "; ".join(folder_why[(a, b)] for a, b in zip(cycle, cycle[1:])),
            " (one cycle among %s)" % ", ".join(sorted(component))
            if len(component) > len(cycle) - 1 else ""))
    for component in strongly_connected(file_edges):
        cycle = find_cycle(component, file_edges)
        problems.append("file cycle: %s: %s%s" % (
            " -> ".join(cycle),
            "; ".join(file_why[(a, b)] for a, b in zip(cycle, cycle[1:])),
            " (one cycle among %s)" % ", ".join(sorted(component))
            if len(component) > len(cycle) - 1 else ""))

    for edge in sorted(known - known_seen):
        problems.append('stale known violation: %s no longer includes "%s" (or it no longer '
                        "resolves there): remove it from KNOWN_VIOLATIONS" % edge)
    missing = sorted(f for f in table if not os.path.isdir(os.path.join(root, "src", f)))
    notes = ["%d files, %d includes, %d folders in the table%s" % (
        len(files), n_includes, len(table),
        " (not in the tree yet: %s)" % ", ".join(missing) if missing else "")]
    notes += ['known violation, still there: %s includes "%s"' % e for e in sorted(known_seen)]
    return problems, notes


# ---- the self-test ------------------------------------------------------------------------

TABLE = """# Architecture

## Layers

| Layer | Folder | What it holds |
|------:|--------|---------------|
| 0 | `core` | the base |
| 1 | `low` | a lower layer |
| 1 | `peer` | a folder on low's layer |
| 2 | `high` | a higher layer |
| 2 | `planned` | a folder that does not exist yet |

## Another section

| 9 | `ignored` | rows outside the Layers section are not read |
"""

BASE = {
    "docs/architecture.md": TABLE,
    "include/pub.h": "int pub(void);\n",
    "src/core/internal.h": '#include "pub.h"\nint base(void);\n',
    "src/core/base.c": '#include "internal.h"\nint base(void) { return pub(); }\n',
    "src/low/low.h": '#include "internal.h"\nint low(void);\n',
    "src/low/low.c": '#include "low/low.h"\nint low(void) { return base(); }\n',
    "src/low/util.h": "int util(void);\n",
    # a bare name resolves in the including file's folder first: util.h is low's
    "src/low/util.c": '#include "util.h"\n#include "low.h"\n'
                      "int util(void) { return low(); }\n",
    "src/peer/peer.c": '#include "internal.h"\nint peer(void) { return 1; }\n',
    # includes in comments and strings are no includes
    "src/high/high.c": '#include "low/low.h"\n/*\n#include "high/nothing.h"\n */\n'
                       '// #include "high/nothing.h"\n'
                       'static const char *s = "#include \\"x\\"";\n'
                       "int high(void) { return low() + (s != 0); }\n",
}

CASES = [
    # (name, files added or replaced, known violations, what the problems must say)
    ("a clean tree passes", {}, [], []),
    ("an include into a higher layer",
     {"src/low/low.c": '#include "low/low.h"\n#include "high/high.h"\nint low(void) '
                       "{ return 0; }\n", "src/high/high.h": "int high(void);\n"}, [],
     ['higher layer: low/low.c:2 includes "high/high.h"', "folder cycle: high -> low -> high"]),
    ("an include into a folder on the same layer",
     {"src/peer/peer.c": '#include "low/low.h"\nint peer(void) { return low(); }\n'}, [],
     ['same layer: peer/peer.c:1 includes "low/low.h"']),
    ("a folder cycle with the includes that close it",
     {"src/core/base.c": '#include "internal.h"\n#include "low/low.h"\n'
                         "int base(void) { return pub(); }\n"}, [],
     ['higher layer: core/base.c:2 includes "low/low.h"',
      'folder cycle: core -> low -> core: core/base.c:2 includes "low/low.h"; '
      'low/low.h:1 includes "internal.h"']),
    ("a folder the table does not name",
     {"src/extra/extra.c": '#include "internal.h"\nint extra(void) { return 0; }\n'}, [],
     ["no layer: src/extra is in no row"]),
    ("a file directly in src/", {"src/loose.c": "int loose(void) { return 0; }\n"}, [],
     ["no layer: src/ itself"]),
    ("an include that resolves to no file",
     {"src/high/high.c": '#include "high/missing.h"\nint high(void) { return 0; }\n'}, [],
     ['unresolved: high/high.c:1 includes "high/missing.h"']),
    ("headers that include each other",
     {"src/low/a.h": '#include "low/b.h"\n', "src/low/b.h": '#include "low/a.h"\n'}, [],
     ['file cycle: low/a.h -> low/b.h -> low/a.h: low/a.h:1 includes "low/b.h"; '
      'low/b.h:1 includes "low/a.h"']),
    ("two .c files calling each other through their headers",
     {"src/low/a.h": "int fa(void);\n", "src/low/b.h": "int fb(void);\n",
      "src/low/a.c": '#include "low/a.h"\n#include "low/b.h"\nint fa(void) { return fb(); }\n',
      "src/low/b.c": '#include "low/b.h"\n#include "low/a.h"\nint fb(void) { return fa(); }\n'},
     [], ["file cycle: low/a.c -> low/b.c -> low/a.c"]),
    ("a .c including another's header for its types alone is no cycle",
     {"src/low/a.h": "struct ta { int x; };\nint fa(void);\n",
      "src/low/b.h": "struct tb { int y; };\nint fb(void);\n",
      "src/low/a.c": '#include "low/a.h"\n#include "low/b.h"\n'
                     "int fa(void) { struct tb t = {0}; return t.y; }\n",
      "src/low/b.c": '#include "low/b.h"\n#include "low/a.h"\n'
                     "int fb(void) { struct ta t = {0}; return t.x; }\n"}, [], []),
    ("two .c files calling each other through one shared header",
     {"src/low/shared.h": "int fa(void);\nint fb(void);\n",
      "src/low/a.c": '#include "low/shared.h"\nint\nfa(void)\n{\n    return fb();\n}\n',
      "src/low/b.c": '#include "low/shared.h"\nint fb(void) { return fa(); }\n'}, [],
     ["file cycle: low/a.c -> low/b.c -> low/a.c: low/a.c calls fb (defined in low/b.c); "
      "low/b.c calls fa (defined in low/a.c)"]),
    ("a static function of the same name is no call into the other file",
     {"src/low/shared.h": "int fa(void);\nint fb(void);\n",
      "src/low/a.c": '#include "low/shared.h"\nstatic int fb2(void) { return 0; }\n'
                     "int fa(void) { return fb(); }\n",
      "src/low/b.c": '#include "low/shared.h"\nstatic int fa(void) { return 1; }\n'
                     "int fb(void) { return fa(); }\n"}, [], []),
    ("a known violation passes",
     {"src/low/low.c": '#include "low/low.h"\n#include "high/high.h"\nint low(void) '
                       "{ return 0; }\n", "src/high/high.h": "int high(void);\n"},
     [("low/low.c", "high/high.h")], []),
    ("a known violation no longer there fails", {}, [("low/low.c", "high/high.h")],
     ['stale known violation: low/low.c no longer includes "high/high.h"']),
]


def write_tree(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)


def self_test(repo):
    """Each case's tree must give exactly the expected kinds of problem, and
    the real tree with an injected back-arrow must fail. Returns failures."""
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for number, (name, extra, known, expected) in enumerate(CASES):
            root = os.path.join(tmp, "case%d" % number)
            write_tree(root, dict(BASE, **extra))
            problems, _ = check(root, known)
            text = "\n".join(problems)
            missing = [e for e in expected if e not in text]
            kinds = {p.split(":")[0] for p in problems}
            unexpected = kinds - {e.split(":")[0] for e in expected}
            if missing or unexpected or (not expected and problems):
                failures.append("%s: expected %s, got %s" % (name, expected or "no problem",
                                                            problems or "no problem"))
            else:
                print("ok: %s" % name)

        # the real tree, copied: a back-arrow from core to the top layer adds a
        # higher-layer include and a folder cycle to whatever it had
        root = os.path.join(tmp, "repo")
        for part in ("src", "include"):
            shutil.copytree(os.path.join(repo, part), os.path.join(root, part))
        os.makedirs(os.path.join(root, "docs"))
        shutil.copy(os.path.join(repo, "docs", "architecture.md"), os.path.join(root, "docs"))
        before, _ = check(root, KNOWN_VIOLATIONS)
        table, _ = read_table(root)
        top = max((layer, folder) for folder, layer in table.items()
                  if folder != "core" and os.path.isdir(os.path.join(root, "src", folder)))[1]
        header = next(os.path.join(top_dir, name)[len(root) + 5:]
                      for top_dir, _, names in sorted(os.walk(os.path.join(root, "src", top)))
                      for name in sorted(names) if name.endswith(".h"))
        with open(os.path.join(root, "src", "core", "alloc.c"), "a", encoding="utf-8") as f:
            f.write('#include "%s"\n' % header)
        problems = [p for p in check(root, KNOWN_VIOLATIONS)[0] if p not in before]
        text = "\n".join(problems)
        if ("higher layer: core/alloc.c" not in text or
                not re.search(r"folder cycle: .*core/alloc\.c:\d+ includes", text)):
            failures.append('the copied tree with core/alloc.c including "%s": expected a '
                            "higher-layer include and a folder cycle, got %s" %
                            (header, problems or "no problem"))
        else:
            print('ok: the real tree with core/alloc.c including "%s" fails' % header)
    return failures


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=os.path.normpath(os.path.join(here, "..", "..")),
                        help="the repository (default: this script's)")
    parser.add_argument("--self-test", action="store_true",
                        help="check the checker on small trees with injected back-arrows")
    args = parser.parse_args()
    if args.self_test:
        failures = self_test(args.root)
        for f in failures:
            print("FAIL: %s" % f)
        print("self-test: %d of %d cases failed" % (len(failures), len(CASES) + 1)
              if failures else "self-test: all %d cases pass" % (len(CASES) + 1))
        return 1 if failures else 0
    problems, notes = check(args.root, KNOWN_VIOLATIONS)
    for note in notes:
        print(note)
    for p in problems:
        print("FAIL: %s" % p)
    print("layering: %d problem%s" % (len(problems), "" if len(problems) == 1 else "s"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
