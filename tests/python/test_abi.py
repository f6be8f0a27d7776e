"""Python cannot drift from C: every ctypes Structure against the library's
layout table, and the package refusing a libattn of another ABI.

    test_abi.py libattn.so include/attn.h previous_libattn.so next_libattn.so

1. attn_abi_layout() gives every struct of attn.h as compiled: sizeof, and
   per field its name, offset and size. Every ctypes Structure of the
   Python package (python/attn) and of the tests' and benchmarks' bindings
   (each .py of the repository that defines one) must match the C struct it
   mirrors: the same field names in the same order, the same offsets and
   sizes, the same total size. A class mirrors attn_<its name in
   snake_case> (SdpaConfig: attn_sdpa_config) unless it names its C
   structs in _c_structs_.
2. Every public struct that a function the package calls takes or returns
   (and every struct inside one) has a mirror in the package, programmable
   attention's (block map config and info, score modifier and tile) by name.
3. The package's ABI_VERSION is attn.h's ATTN_ABI_VERSION and the library's
   attn_abi_version(); `import attn` refuses the previous minor's library
   (no attn_abi_version) and the next minor's (another ABI version) with an
   ImportError naming the library, its version and the ABI it needs.
"""
import ast
import ctypes
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from ctypes import POINTER, Structure, c_char_p, c_int, c_size_t

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PACKAGE = os.path.join(ROOT, "python", "attn")
# Where bindings that mirror attn.h's structs live besides the package.
BINDING_DIRS = ["tests", "bench", "scripts", "examples", "cli"]

failures = []


def fail(message):
    failures.append(message)
    print("FAIL: " + message)


class AbiField(Structure):
    _c_structs_ = ("attn_abi_field",)
    _fields_ = [("name", c_char_p), ("offset", c_size_t), ("size", c_size_t)]


class AbiStruct(Structure):
    _c_structs_ = ("attn_abi_struct",)
    _fields_ = [("name", c_char_p), ("size", c_size_t), ("num_fields", c_size_t),
                ("fields", POINTER(AbiField))]


def read_layout(lib):
    """{struct name: (sizeof, [(field, offset, size), ...])} from attn_abi_layout."""
    lib.attn_abi_layout.restype = POINTER(AbiStruct)
    lib.attn_abi_layout.argtypes = [POINTER(c_size_t)]
    count = c_size_t()
    table = lib.attn_abi_layout(ctypes.byref(count))
    layout = {}
    for i in range(count.value):
        st = table[i]
        fields = [(st.fields[k].name.decode(), st.fields[k].offset, st.fields[k].size)
                  for k in range(st.num_fields)]
        layout[st.name.decode()] = (st.size, fields)
    return layout


def snake(name):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def c_structs_of(cls):
    return tuple(cls.__dict__.get("_c_structs_", ("attn_" + snake(cls.__name__),)))


def check_structure(cls, where, layout):
    """cls against each C struct it mirrors; returns the names it mirrors."""
    names = c_structs_of(cls)
    for c_name in names:
        if c_name not in layout:
            fail(f"{where}: {cls.__name__} mirrors {c_name}, which attn_abi_layout does "
                 f"not have (name the C struct in _c_structs_)")
            continue
        size, fields = layout[c_name]
        py = [(name, getattr(cls, name).offset, getattr(cls, name).size)
              for name, *_ in cls._fields_]
        py_names, c_names = [f[0] for f in py], [f[0] for f in fields]
        if py_names != c_names:
            k = next(k for k in range(max(len(py_names), len(c_names)))
                     if py_names[k:k + 1] != c_names[k:k + 1])
            fail(f"{where}: {cls.__name__} has {len(py_names)} fields, {c_name} "
                 f"{len(c_names)}; field {k} is {(py_names[k:k + 1] or ['(none)'])[0]} in "
                 f"Python, {(c_names[k:k + 1] or ['(none)'])[0]} in C")
            continue
        for (name, off, sz), (_, c_off, c_sz) in zip(py, fields):
            if (off, sz) != (c_off, c_sz):
                fail(f"{where}: {cls.__name__}.{name} at offset {off} size {sz}; "
                     f"{c_name}.{name} at offset {c_off} size {c_sz}")
        if ctypes.sizeof(cls) != size:
            fail(f"{where}: sizeof {cls.__name__} is {ctypes.sizeof(cls)}; sizeof {c_name} "
                 f"is {size}")
    return names


def structures_in(module):
    return [obj for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, Structure) and obj is not Structure
            and obj.__module__ == module.__name__]


def binding_files():
    """Every .py outside the package that defines a ctypes Structure."""
    found = []
    for top in BINDING_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for filename in sorted(filenames):
                path = os.path.join(dirpath, filename)
                if not filename.endswith(".py") or path == os.path.abspath(__file__):
                    continue
                tree = ast.parse(open(path, encoding="utf-8").read(), path)
                for node in ast.walk(tree):
                    if isinstance(node, ast.ClassDef) and any(
                            (isinstance(b, ast.Name) and b.id == "Structure")
                            or (isinstance(b, ast.Attribute) and b.attr == "Structure")
                            for b in node.bases):
                        found.append(path)
                        break
    return found


def import_path(path):
    """Imports a test or benchmark file as a module (their main() is guarded),
    its own directory first on sys.path for the helpers it imports."""
    name = "abi_mirror_" + re.sub(r"\W", "_", os.path.relpath(path, ROOT))
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.pop(0)


def header_prototypes(header):
    """{function: its prototype's text} for every function attn.h declares."""
    text = re.sub(r"/\*.*?\*/", " ", open(header, encoding="utf-8").read(), flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"^\s*#[^\n]*", " ", text, flags=re.M)
    protos = {}
    for decl in text.split(";"):
        m = re.search(r"(?<![\w(*])(attn_\w+)\s*\(", decl)
        if m and "typedef" not in decl and "{" not in decl.split(m.group(1))[0][-40:]:
            protos[m.group(1)] = decl
    return protos


def used_structs(source_text, protos, layout, header_text):
    """The public structs the functions named in source_text take or return,
    and the structs inside those."""
    words = set(re.findall(r"\battn_\w+", source_text))
    used = set()
    for fn in words & set(protos):
        used |= set(re.findall(r"\battn_\w+", protos[fn])) & set(layout)
    # a struct field of struct type (attn_generate_args.sampling) needs its own mirror
    grew = True
    while grew:
        grew = False
        for name in list(used):
            body = re.search(r"typedef struct %s \{(.*?)\}" % name, header_text, re.S)
            inner = set(re.findall(r"\battn_\w+", body.group(1) if body else "")) & set(layout)
            if not inner <= used:
                used |= inner
                grew = True
    return used


def check_refused(library, expect):
    """`import attn` with ATTN_LIBRARY=library fails with an ImportError whose
    message holds every fragment of expect."""
    env = dict(os.environ, ATTN_LIBRARY=library, PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run([sys.executable, "-c", "import attn"], env=env, capture_output=True,
                         text=True, cwd=os.path.join(ROOT, "python"))
    last = run.stderr.strip().splitlines()[-1] if run.stderr.strip() else ""
    if run.returncode == 0:
        fail(f"import attn accepted {library}")
    elif not last.startswith("ImportError:") or not all(e in last for e in expect):
        fail(f"import attn with {library}: want an ImportError holding {expect}, got: {last}")
    else:
        print("refused: " + last)


def main():
    lib_path, header, previous_lib, next_lib = map(os.path.abspath, sys.argv[1:5])
    lib = ctypes.CDLL(lib_path)
    layout = read_layout(lib)
    text = open(header, encoding="utf-8").read()
    header_structs = re.findall(r"typedef struct (\w+) \{", text)
    if sorted(layout) != sorted(header_structs):
        fail(f"attn_abi_layout has {sorted(layout)}; attn.h defines {sorted(header_structs)}")
    for cls in (AbiField, AbiStruct):
        check_structure(cls, "test_abi.py", layout)

    # 3, first half: the versions agree.
    abi = int(re.search(r"#define ATTN_ABI_VERSION (\d+)", text).group(1))
    lib.attn_abi_version.restype = c_int
    if lib.attn_abi_version() != abi:
        fail(f"{lib_path}: attn_abi_version() is {lib.attn_abi_version()}; attn.h says {abi}")
    os.environ["ATTN_LIBRARY"] = lib_path
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import attn  # noqa: E402  (after ATTN_LIBRARY)
    from attn import _lib  # noqa: E402
    if _lib.ABI_VERSION != abi:
        fail(f"python/attn/_lib.py's ABI_VERSION is {_lib.ABI_VERSION}; attn.h's "
             f"ATTN_ABI_VERSION is {abi}")

    # 1. The package's structures, module by module.
    package_mirrors = set()
    package_text = ""
    checked = 0
    for filename in sorted(os.listdir(PACKAGE)):
        if not filename.endswith(".py"):
            continue
        module = importlib.import_module("attn." + filename[:-3] if filename != "__init__.py"
                                         else "attn")
        package_text += open(os.path.join(PACKAGE, filename), encoding="utf-8").read()
        for cls in structures_in(module):
            package_mirrors |= set(check_structure(cls, "python/attn/" + filename, layout))
            checked += 1
    # ... and every other file's.
    other_mirrors = set()
    other_text = ""
    files = binding_files()
    for path in files:
        module = import_path(path)
        other_text += open(path, encoding="utf-8").read()
        for cls in structures_in(module):
            other_mirrors |= set(check_structure(cls, os.path.relpath(path, ROOT), layout))
            checked += 1
    if checked < 30:
        fail(f"only {checked} ctypes structures found: the search lost some")
    print(f"{checked} ctypes structures checked ({len(files)} files besides the package) "
          f"against attn_abi_layout's {len(layout)} structs")

    # 2. Every struct the package's calls take has a mirror in the package.
    protos = header_prototypes(header)
    need = used_structs(package_text, protos, layout, text)
    for name in sorted(need - package_mirrors):
        fail(f"the Python package calls a function of attn.h that takes {name}, and no "
             f"ctypes Structure of python/attn mirrors it")
    if len(need) < 10:
        fail(f"only {len(need)} structs found in the package's calls: the search lost some")
    need_other = used_structs(other_text, protos, layout, text)
    for name in sorted(need_other - other_mirrors - package_mirrors):
        fail(f"a test or benchmark calls a function of attn.h that takes {name}, and no "
             f"ctypes Structure mirrors it")
    print(f"the package's calls take {len(need)} structs")
    # Programmable attention's structs are handed to C by attn.torch's flex
    # API: each must have its mirror in the package whatever the search finds.
    for name in ("attn_block_mask_config", "attn_block_mask_info", "attn_score_mod",
                 "attn_score_tile", "attn_sdpa_config"):
        if name in layout and name not in package_mirrors:
            fail(f"python/attn has no ctypes mirror of {name} (attn.torch's flex API)")
        elif name not in layout:
            fail(f"attn_abi_layout has no {name}")

    # 3, second half: another minor's library is refused, saying why.
    check_refused(previous_lib, [previous_lib, "no attn_abi_version",
                                 f"needs ABI {abi}"])
    check_refused(next_lib, [next_lib, f"ABI version {abi + 1}", f"needs ABI {abi}"])
    print("import attn: ABI %d, %s" % (abi, attn.__version__))

    print("%d failures" % len(failures) if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
