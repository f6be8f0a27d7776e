#!/bin/sh
# bench/ab_attention's paths run the library against itself, and their hashes
# cover what they claim to:
#   - every path (fp32, bf16, f64, the layer, varlen, windows, the KV cache)
#     gives both builds one hash;
#   - the cache's attend gives the same bits on every layout and page size
#     (attn.h promises it), so the tool's refill of the cache is the same
#     positions whatever the layout, in chunks that straddle pages;
#   - one more cached position, or a window, changes the hash: the cache
#     holds what the tool appended, and the call reads it;
#   - varlen with one sequence hashes as the dense bthd layout of the same
#     tensors, in each precision: cu_seqlens are built as the layout expects.
#   test_ab_attention.sh ab_attention libattn.so
set -eu
tool=$1 lib=$2
fail() { echo "FAIL: $*" >&2; exit 1; }

# hash_of ARGS...: the one hash both builds print, or a failure (it runs in a
# command substitution, so every call is assigned before it is compared)
hash_of() {
  out=$("$tool" --rounds 2 "$@" "$lib" "$lib") || fail "ab_attention $* failed: $out"
  echo "$out" >&2
  [ "$(echo "$out" | grep -c ' hash ')" = 2 ] || fail "ab_attention $*: not two hash lines"
  hashes=$(echo "$out" | grep -o 'hash [0-9a-f]*' | sort -u)
  [ "$(echo "$hashes" | wc -l)" = 1 ] || fail "ab_attention $*: the builds differ: $hashes"
  echo "$hashes"
}

small="--tokens 60 --heads 4 --kv-heads 2 --head-dim 32"
got=$(hash_of $small --causal --mode fwdbwd)
got=$(hash_of $small --bf16 --mode bwd --window 9)
got=$(hash_of $small --f64 --causal --mode fwdbwd)
got=$(hash_of --layer --tokens 30 --heads 2 --mode fwdbwd)
got=$(hash_of $small --varlen --batch 3 --window 20 --causal --mode fwdbwd)

cache="--heads 4 --kv-heads 2 --head-dim 32 --batch 2"
want=$(hash_of --decode 1300 $cache)
for layout in "--paged" "--paged --page-size 1" "--paged --page-size 7"; do
  got=$(hash_of --decode 1300 $cache $layout)
  [ "$got" = "$want" ] || fail "decode 1300 $layout differs from contiguous"
done
got=$(hash_of --decode 1301 $cache)
[ "$got" != "$want" ] || fail "decode 1301 hashes as 1300"
windowed=$(hash_of --decode 1300 --window 100 $cache)
[ "$windowed" != "$want" ] || fail "a window of 100 hashes as no window"
got=$(hash_of --decode 1300 --window 100 --paged --page-size 16 $cache)
[ "$got" = "$windowed" ] || fail "the windowed cache differs between contiguous and paged"
prefill=$(hash_of --prefill 40 $cache)
got=$(hash_of --prefill 40 --paged --page-size 3 $cache)
[ "$got" = "$prefill" ] || fail "prefill differs between contiguous and paged"

for precision in "" --bf16 --f64; do
  dense=$(hash_of $small $precision --causal --mode fwdbwd --layout bthd)
  got=$(hash_of $small $precision --causal --mode fwdbwd --varlen)
  [ "$got" = "$dense" ] \
    || fail "varlen of one sequence ${precision:-fp32} differs from the dense bthd layout"
done
echo "ab_attention: every path agrees with itself and with its oracle"
