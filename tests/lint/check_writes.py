#!/usr/bin/python3
"""Every file that the library or the CLI writes goes through attn_file.

    check_writes.py ROOT           check ROOT/src and ROOT/cli (exit 1 on a hit)
    check_writes.py --self-test    check the checker on small trees

src/io/file.c is the one file that may open a file for writing: it writes a
temporary beside the destination and renames it over it only once every
byte is flushed, synced and closed. Anywhere else in src/ or cli/, fopen or
freopen with a mode that writes ("w", "a", "r+", any "+"), open/openat with
O_WRONLY, O_RDWR, O_CREAT, O_TRUNC or O_APPEND, creat, fdopen, mkstemp and
tmpfile are refused, with the file and line: a file written in place is
destroyed by a full disk or a size limit in the middle of the write.
"""
import os
import re
import shutil
import sys
import tempfile

ALLOWED = os.path.join("src", "io", "file.c")

FOPEN = re.compile(r'(?<![\w.>])(fopen|freopen)\s*\(([^;]*?),\s*"([^"]*)"')
OPEN = re.compile(r"(?<![\w.>])(open|openat)\s*\(([^;]*)\)")
OPEN_WRITES = re.compile(r"\bO_(WRONLY|RDWR|CREAT|TRUNC|APPEND)\b")
ALWAYS = re.compile(r"(?<![\w.>])(creat|fdopen|mkstemp|mkostemp|tmpfile)\s*\(")


def code_only(text):
    """text with comments blanked (string literals kept: the mode is one),
    lines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i) or text.startswith("//", i):
            end = "*/" if text[i + 1] == "*" else "\n"
            j = text.find(end, i + 2)
            j = n if j < 0 else (j + 2 if end == "*/" else j)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text[i] in "\"'":
            q, j = text[i], i + 1
            while j < n and text[j] != q and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def problems(root):
    found, files = [], 0
    for top in ("src", "cli"):
        for folder, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith((".c", ".h")):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root)
                if rel == ALLOWED:
                    continue
                files += 1
                code = code_only(open(path, encoding="utf-8").read())
                # a call may span lines: match on the text, report the line
                for m in FOPEN.finditer(code):
                    mode = m.group(3)
                    if any(c in mode for c in "wa+"):
                        found.append((rel, code.count("\n", 0, m.start()) + 1,
                                      '%s(..., "%s")' % (m.group(1), mode)))
                for m in OPEN.finditer(code):
                    if OPEN_WRITES.search(m.group(2)):
                        found.append((rel, code.count("\n", 0, m.start()) + 1,
                                      "%s() with %s" % (m.group(1),
                                                        OPEN_WRITES.search(m.group(2)).group(0))))
                for m in ALWAYS.finditer(code):
                    found.append((rel, code.count("\n", 0, m.start()) + 1, m.group(1) + "()"))
    return files, found


def check(root):
    files, found = problems(root)
    for rel, line, what in found:
        print("FAIL: %s:%d: %s writes a file in place; write it through attn_file "
              "(attn_file_open ... attn_file_commit, include/attn.h)" % (rel, line, what))
    print("%d files checked, %d writes outside %s" % (files, len(found), ALLOWED))
    return 1 if found else 0


def self_test():
    """Each way of writing in place, alone in a tree, is caught; reading,
    comments and the allowed file are not."""
    bad = [
        'FILE *f = fopen(path, "wb");',
        'FILE *f = fopen(path,\n               "w");',
        'FILE *f = fopen(path, "ab");',
        'FILE *f = fopen(path, "r+b");',
        'freopen(path, "w", stdout);',
        "int fd = open(path, O_WRONLY | O_TRUNC, 0666);",
        "int fd = open(path,\n O_CREAT | O_RDONLY, 0666);",
        "int fd = openat(dirfd, name, O_RDWR);",
        "int fd = creat(path, 0666);",
        "int fd = mkstemp(name);",
        "FILE *f = fdopen(fd, \"wb\");",
        "FILE *f = tmpfile();",
    ]
    good = [
        'FILE *f = fopen(path, "rb");',
        "int fd = open(path, O_RDONLY | O_CLOEXEC);",
        '/* fopen(path, "wb") in a comment */',
        'attn_status s = attn_file_open(ctx, path, &f);',
    ]
    failures = 0
    for text, want in [(t, 1) for t in bad] + [(t, 0) for t in good]:
        for top in ("src", "cli"):
            root = tempfile.mkdtemp()
            try:
                os.makedirs(os.path.join(root, top))
                with open(os.path.join(root, top, "x.c"), "w") as f:
                    f.write("void f(void) {\n    %s\n}\n" % text)
                os.makedirs(os.path.join(root, "src", "io"), exist_ok=True)
                with open(os.path.join(root, ALLOWED), "w") as f:
                    f.write('void g(void) { fopen(p, "wb"); open(p, O_CREAT); }\n')
                got = len(problems(root)[1])
                if got != want:
                    print("FAIL: self-test: %r in %s/: %d hits, want %d" % (text, top, got, want))
                    failures += 1
            finally:
                shutil.rmtree(root)
    print("self-test: %d cases, %d failures" % (2 * (len(bad) + len(good)), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(check(sys.argv[1]))
