#!/bin/sh
# What attn.h promises its includers (docs/api.md): C99 and later, C++11 and
# later, clean under -pedantic -Wall -Wextra -Werror; under C89/C90 and
# C++98/03, whose types it lacks (bool, long long), one #error saying which
# standard it needs, rather than a page of errors inside its structs.
#   test_header_standards.sh INCLUDE_DIR [c:COMPILER | c++:COMPILER]...
set -eu
include=$1
shift
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cat >"$work/use.c" <<'END'
#include "attn.h"
int main(void) {
    static attn_lm_config c;
    attn_status st = ATTN_OK;
    c.arch = ATTN_LM_GPT2;
    return (int)st + (int)c.n_layers + (c.qkv_bias ? 1 : 0);
}
END
cp "$work/use.c" "$work/use.cpp"
printf '#include "attn.h"\nint attn_included;\n' >"$work/only.c"
cp "$work/only.c" "$work/only.cpp"
flags="-pedantic -Wall -Wextra -Werror -fsyntax-only -I$include"

# accepts LANG COMPILER STD: whether the compiler knows the standard at all
accepts() {
  echo 'int x;' >"$work/probe.$1"
  # shellcheck disable=SC2086
  "$2" -std="$3" -fsyntax-only "$work/probe.$1" >/dev/null 2>&1
}

checked=0
for spec in "$@"; do
  lang=${spec%%:*} cc=${spec#*:}
  if [ "$lang" = c ]; then
    ext=c newer="c99 c11 c17" older="c89 c90 gnu89" need="attn.h needs C99 or later"
  else
    ext=cpp newer="c++11 c++14 c++17" older="c++98 c++03 gnu++98" \
      need="attn.h needs C++11 or later"
  fi
  for std in $newer; do
    accepts "$ext" "$cc" "$std" || continue
    # shellcheck disable=SC2086
    "$cc" -std="$std" $flags "$work/use.$ext" >"$work/out" 2>&1 \
      || { cat "$work/out"; fail "$cc -std=$std -pedantic -Werror: attn.h does not compile"; }
    checked=$((checked + 1))
  done
  for std in $older; do
    accepts "$ext" "$cc" "$std" || continue
    # shellcheck disable=SC2086
    if "$cc" -std="$std" $flags "$work/only.$ext" >"$work/out" 2>&1; then
      fail "$cc -std=$std: attn.h compiled, but its structs need C99/C++11 types"
    fi
    grep -q "$need" "$work/out" \
      || { cat "$work/out"; fail "$cc -std=$std: no #error saying \"$need\""; }
    # the #error alone: nothing from the header's declarations after it
    n=$(grep -c "error:" "$work/out" || true)
    [ "$n" -eq 1 ] || { cat "$work/out"; fail "$cc -std=$std: $n errors, not one #error"; }
    checked=$((checked + 1))
  done
done
[ "$checked" -gt 0 ] || fail "no compiler checked"
echo "attn.h: $checked compiler/standard pairs as promised"
