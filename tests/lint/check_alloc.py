#!/usr/bin/python3
"""Every allocation in the library goes through its allocator.

    check_alloc.py SRC_DIR

src/core/alloc.c is the one file that may call malloc, calloc, realloc,
free and friends; everything else in src/ calls attn_malloc, attn_calloc,
attn_realloc, attn_free (or attn_alloc_floats), so that the allocation
failure sweep (tests/unit/test_alloc_failure.c) reaches every allocation.
Prints each raw call with its file and line; exits 1 if there is one.
"""
import os
import re
import sys

RAW = re.compile(r"(?<![\w.>])(malloc|calloc|realloc|free|strdup|strndup|aligned_alloc|"
                 r"posix_memalign|reallocarray|memalign|valloc)\s*\(")


def code_only(text):
    """text with comments and string/char literals blanked, lines kept."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(" " * (min(j + 1, n) - i))
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def main():
    src = sys.argv[1]
    found = 0
    files = 0
    for root, _, names in os.walk(src):
        for name in sorted(names):
            if not name.endswith((".c", ".h")):
                continue
            path = os.path.join(root, name)
            if os.path.relpath(path, src) == os.path.join("core", "alloc.c"):
                continue
            files += 1
            code = code_only(open(path, encoding="utf-8").read())
            for lineno, line in enumerate(code.splitlines(), 1):
                for m in RAW.finditer(line):
                    print("FAIL: %s:%d calls %s(); use attn_%s (src/core/internal.h)"
                          % (path, lineno, m.group(1), m.group(1) if m.group(1) in
                             ("malloc", "calloc", "realloc", "free") else "malloc"))
                    found += 1
    print("%d files checked, %d raw allocation calls" % (files, found))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
