#!/bin/sh
# The SONAME half of the ABI policy (docs/abi.md): this build's libattn.so
# is named libattn.so.0.<ATTN_ABI_VERSION of attn.h>; a program linked
# against it needs that name and runs; a program linked against the previous
# 0.x minor needs that minor's name and fails to load where only this build
# is installed (an old-style libattn.so.0 beside it too), rather than run
# with structs of another layout. The same program runs beside its own
# library, so the failure is the SONAME's alone.
#   test_soname.sh attn.h libattn.so consumer other_libattn.so other_consumer
set -eu
header=$1 lib=$2 consumer=$3 other_lib=$4 other_consumer=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

field() { # field FILE TAG: the [value] of readelf -d's TAG line(s)
  readelf -d "$1" | sed -n "s/.*($2).*\[\(.*\)\]/\1/p"
}
fail() { echo "FAIL: $*"; exit 1; }

abi=$(sed -n 's/^#define ATTN_ABI_VERSION \([0-9]*\)$/\1/p' "$header")
[ -n "$abi" ] || fail "no ATTN_ABI_VERSION in $header"
want=libattn.so.0.$abi
soname=$(field "$lib" SONAME)
[ "$soname" = "$want" ] || fail "$lib has SONAME '$soname'; attn.h's ABI $abi wants $want"
[ "$(field "$consumer" NEEDED | grep '^libattn')" = "$want" ] \
  || fail "$consumer needs '$(field "$consumer" NEEDED | tr '\n' ' ')', not $want"
other=$(field "$other_lib" SONAME)
case $other in libattn.so.0.*) ;; *) fail "the stand-in's SONAME is '$other'" ;; esac
[ "$other" != "$want" ] || fail "the stand-in has this build's SONAME $want"
[ "$(field "$other_consumer" NEEDED | grep '^libattn')" = "$other" ] \
  || fail "$other_consumer needs '$(field "$other_consumer" NEEDED | tr '\n' ' ')', not $other"

# This build, installed as an installation lays it out, with the name 0.x
# releases before this policy shared.
mkdir "$work/installed" "$work/other"
cp "$lib" "$work/installed/$want"
ln -s "$want" "$work/installed/libattn.so"
ln -s "$want" "$work/installed/libattn.so.0"
cp "$other_lib" "$work/other/$other"

out=$(LD_LIBRARY_PATH="$work/installed" "$consumer") || fail "$consumer did not run: $out"
echo "$out" | grep -q "^attn .* ok$" || fail "$consumer printed '$out'"
echo "built against $want, run with it: $out"

if out=$(LD_LIBRARY_PATH="$work/installed" "$other_consumer" 2>&1); then
  fail "a program built against $other ran with $want: $out"
fi
echo "$out" | grep -q "$other: cannot open shared object file" \
  || fail "a program built against $other failed otherwise than for its SONAME: $out"
echo "built against $other, run where $want is installed: refused ($out)"

out=$(LD_LIBRARY_PATH="$work/other" "$other_consumer") || fail "$other_consumer did not run: $out"
echo "built against $other, run with it: $out"
