#!/usr/bin/python3
"""No attn_status is thrown away.

    check_status.py DIR...        check the C files under each DIR
    check_status.py --self-test   check that the check catches what it must

A function that returns attn_status can fail, and its caller must look at
what it returned: a call whose value is discarded (a statement of its own,
or cast to void) turns a failure into a silent success. The names of the
functions and function pointers declared to return attn_status are taken
from every .c and .h under the DIRs given (include/ for the public ones);
each call of one of them must have its value used: assigned, returned,
compared, passed on. A name also declared with another return type is
left out (a name alone cannot tell them apart), and so is attn_fail. Prints each discarded call with its file and line;
exits 1 if there is one.
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_alloc import code_only  # noqa: E402  comments and literals blanked

# attn_status name(   and   attn_status (*name)(
DECLARED = re.compile(r"\battn_status\s+(\w+)\s*\(")
POINTER = re.compile(r"\battn_status\s*\(\s*\*\s*(\w+)\s*\)\s*\(")
# a function or function pointer declared with some other return type
OTHER_FUNCTION = re.compile(r"^[ \t]*(?:(?:static|inline|extern|const|struct|enum|unsigned)\s+)*"
                            r"(\w+)[\s*]+(\w+)\s*\(", re.M)
OTHER_POINTER = re.compile(r"\b(\w+)[\s*]*\(\s*\*\s*(\w+)\s*\)\s*\(")
KEYWORDS = {"if", "while", "for", "switch", "return", "sizeof", "else", "case", "goto", "do"}
# attn_fail records the message of a failure in its ctx and returns the
# status it was given: a caller that reports failure otherwise (a NULL
# result) has no use for it.
EXEMPT = {"attn_fail"}


def c_files(dirs):
    for d in dirs:
        for root, _, names in os.walk(d):
            for name in sorted(names):
                if name.endswith((".c", ".h")):
                    yield os.path.join(root, name)


def status_names(texts):
    """The functions, and apart the function pointers (struct members),
    declared to return attn_status."""
    functions, pointers, other_functions, other_pointers = set(), set(), set(), set()
    for text in texts:
        functions.update(DECLARED.findall(text))
        pointers.update(POINTER.findall(text))
        other_functions.update(name for kind, name in OTHER_FUNCTION.findall(text)
                               if kind != "attn_status" and kind not in KEYWORDS)
        other_pointers.update(name for kind, name in OTHER_POINTER.findall(text)
                              if kind != "attn_status")
    # a name also declared otherwise (a static function of another type
    # elsewhere, a member of another type) cannot be told apart by name:
    # left out
    return (functions - other_functions - KEYWORDS - EXEMPT,
            pointers - other_pointers - KEYWORDS)


def matching_open(code, close):
    """The index of the '(' that the ')' at close ends, or -1."""
    depth = 0
    for i in range(close, -1, -1):
        if code[i] == ")":
            depth += 1
        elif code[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return -1


def word_before(code, i):
    """The identifier that ends just before index i (spaces skipped)."""
    j = i
    while j > 0 and code[j - 1].isspace():
        j -= 1
    k = j
    while k > 0 and (code[k - 1].isalnum() or code[k - 1] == "_"):
        k -= 1
    return code[k:j], k


def discarded(code, start):
    """Whether the call expression that starts at index start (the callee's
    name, or the object it is a member of) is a statement of its own or is
    cast to void: its value thrown away."""
    j = start
    while j > 0 and code[j - 1].isspace():
        j -= 1
    if j == 0:
        return True
    c = code[j - 1]
    if c in ";{}":
        return True
    if c == ")":
        open_ = matching_open(code, j - 1)
        if open_ < 0:
            return False
        inside = code[open_ + 1:j - 1].strip()
        if inside == "void":
            return True
        word, _ = word_before(code, open_)
        # the body of if (...), while (...), for (...): a statement
        return word in ("if", "while", "for", "switch")
    if c == ":":
        # a label or case (a statement follows), not the ternary's ':'
        before = code[:j - 1]
        line = before[before.rfind("\n") + 1:]
        return bool(re.match(r"\s*(case\b.*|default\s*|\w+\s*)$", line)) and "?" not in line
    word, _ = word_before(code, j)
    return word in ("else", "do")


def call_start(code, name_at):
    """Where the callee expression ending in the name at name_at begins:
    a member call (a->f(, a.f(, a[i].f() is taken back to its object."""
    i = name_at
    while True:
        j = i
        while j > 0 and code[j - 1].isspace():
            j -= 1
        if code[j - 2:j] == "->":
            j -= 2
        elif j > 0 and code[j - 1] == ".":
            j -= 1
        else:
            return i
        while j > 0 and code[j - 1].isspace():
            j -= 1
        while j > 0 and code[j - 1] == "]":
            depth = 0
            for k in range(j - 1, -1, -1):
                depth += code[k] == "]"
                depth -= code[k] == "["
                if depth == 0:
                    j = k
                    break
        word, k = word_before(code, j)
        if not word:
            return i
        i = k


def is_member_call(code, name_at):
    """Whether the name at name_at follows -> or . (a member)."""
    j = name_at
    while j > 0 and code[j - 1].isspace():
        j -= 1
    return code[j - 2:j] == "->" or (j > 0 and code[j - 1] == ".")


def find_discarded(code, names):
    """(line, name) of each call in code whose attn_status is discarded;
    names: status_names' functions and pointers."""
    functions, pointers = names
    found = []
    for m in re.finditer(r"\b(\w+)\s*\(", code):
        name = m.group(1)
        member = is_member_call(code, m.start())
        if name not in (pointers if member else functions):
            continue
        line_start = code.rfind("\n", 0, m.start()) + 1
        if code[line_start:m.start()].lstrip().startswith("#"):
            continue  # a macro's body: checked where it is used
        word, _ = word_before(code, m.start())
        if word == "attn_status" or code[line_start:m.start()].rstrip().endswith("*"):
            continue  # a declaration or definition
        start = call_start(code, m.start())
        if discarded(code, start):
            found.append((code.count("\n", 0, m.start()) + 1, name))
    return found


def check(dirs):
    paths = list(c_files(dirs))
    codes = {p: code_only(open(p, encoding="utf-8").read()) for p in paths}
    names = status_names(codes.values())
    total = 0
    for path in paths:
        for line, name in find_discarded(codes[path], names):
            print("FAIL: %s:%d discards the attn_status of %s()" % (path, line, name))
            total += 1
    print("%d files checked, %d functions and %d function pointers return attn_status, "
          "%d discarded statuses" % (len(paths), len(names[0]), len(names[1]), total))
    return total


SELF_TEST = r"""
attn_status f(int x);
attn_status g(void) { return f(1); }
typedef struct ops { attn_status (*run)(int); } ops;
static int h(int x) { return x; }
static attn_status used(ops *o, ops a[2]) {
    attn_status st = f(1);
    if (f(2) != ATTN_OK) return st;
    st = o->run(3);
    if ((st = a[1].run(4)) != ATTN_OK) return st;
    h(f(5));
    bool ok = cond ? f(6) == ATTN_OK : false;
    return o->run(7) == ATTN_OK ? f(8) : g();
}
static void dropped(ops *o, ops a[2]) {
    f(100); /* dropped */
    (void)f(101); /* dropped */
    if (x) f(102); /* dropped */
    else f(103); /* dropped */
    o->run(104); /* dropped */
    (void)a[0].run(105); /* dropped */
    for (;;) g(); /* dropped */
done:
    f(106); /* dropped */
}
"""


def self_test():
    """The check finds the eight calls of SELF_TEST marked dropped, and no other."""
    code = code_only(SELF_TEST)
    names = status_names([code])
    got = sorted(find_discarded(code, names))
    want = sorted((i + 1, re.search(r"(\w+)\(\d*\); /\* dropped", line).group(1))
                  for i, line in enumerate(SELF_TEST.split("\n")) if "dropped */" in line)
    ok = names == ({"f", "g", "used"}, {"run"}) and got == want and len(want) == 8
    print("self-test: %s (found %s, want %s)" % ("ok" if ok else "FAIL", got, want))
    return 0 if ok else 1


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    return 1 if check(sys.argv[1:]) else 0


if __name__ == "__main__":
    sys.exit(main())
