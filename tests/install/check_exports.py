#!/usr/bin/python3
"""libattn.so exports attn.h and nothing else.

    check_exports.py include/attn.h libattn.so libattn.a

Every symbol the shared library defines for the dynamic linker must be a
function declared in attn.h (names the toolchain reserves, starting with an
underscore, are let through), and every function of attn.h that the static
library defines must be exported. The static library hides nothing from a
program linked with it, so every global it defines, internal ones included,
must start with attn_: a consumer's own sgemm or utf8_decode must not clash.
Prints what is wrong; exits 1 if anything is.
"""
import re
import subprocess
import sys


def header_functions(path):
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    # "name(" declares a function; "(*name)(" is a function pointer type.
    return set(re.findall(r"(?<![\w(])(?<!\(\*)(attn_\w+)\s*\(", text))


def defined_symbols(args):
    out = subprocess.run(["nm"] + args, check=True, capture_output=True, text=True).stdout
    symbols = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            symbols[parts[2]] = parts[1]
    return symbols


def main():
    header, shared, static = sys.argv[1:4]
    api = header_functions(header)
    exported = defined_symbols(["-D", "--defined-only", shared])
    static_globals = defined_symbols(["-g", "--defined-only", static])
    in_static = {name for name, kind in static_globals.items() if kind == "T"}
    failed = 0
    leaked = sorted(n for n in exported if not n.startswith("_") and n not in api)
    for name in leaked:
        print("FAIL: %s exports %s, which attn.h does not declare" % (shared, name))
        failed += 1
    unprefixed = sorted(n for n in static_globals
                        if not n.startswith("attn_") and not n.startswith("_"))
    for name in unprefixed:
        print("FAIL: %s defines the global %s, which a program linked with it may define too"
              % (static, name))
        failed += 1
    missing = sorted(n for n in api if n in in_static and n not in exported)
    for name in missing:
        print("FAIL: attn.h declares %s and the library defines it, but does not export it"
              % name)
        failed += 1
    ok = len(exported) - len(leaked)
    print("%d exported symbols, all declared in attn.h; %d of attn.h's %d functions defined;"
          " %d globals in the static library, all attn_"
          % (ok, len([n for n in api if n in exported]), len(api), len(static_globals))
          if not failed else
          "%d problems" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
