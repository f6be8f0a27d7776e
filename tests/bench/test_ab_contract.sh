#!/bin/sh
# bench/ab_contract.sh's verdicts and summary:
#   - on a stand-in tool whose every answer is known (ab_attention_stub.sh):
#     SAME, DIFF, FAIL and a slower new build are each reported as such, the
#     summary counts them and gives the worst ratio, a hash-only case is not
#     timed, each case gets its rounds, and the script exits 1;
#   - on the real tool with the library twice: the same hashes, exit 0.
#   test_ab_contract.sh ab_contract.sh ab_attention_stub.sh ab_attention libattn.so
set -eu
script=$1 stub=$2 tool=$3 lib=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# expect FILE CASE PATTERN: CASE's line of FILE matches the extended regex
expect() {
  got=$(grep "^$2  " "$1") || fail "no line for '$2' in $1"
  echo "$got" | grep -Eq -- "$3" || fail "'$got' does not match '$3'"
}

: > "$work/old.so"
: > "$work/new.so"
status=0
cases='f32 T=1024 none fwd|bf16 T=4096 causal fwdbwd|decode L=16384 contiguous'
cases="$cases|gpt2 layer T=1024 fwd|decode L=16384 paged 1"
AB_TOOL=$stub AB_THREADS=1 AB_ONLY="^($cases)\$" \
  sh "$script" "$work/old.so" "$work/new.so" "$work/stub.txt" > "$work/stub.out" 2>&1 || status=$?
cat "$work/stub.out"
[ "$status" = 1 ] || fail "exit status $status with a DIFF and a FAIL, not 1"
cmp -s "$work/stub.out" "$work/stub.txt" || fail "stdout and the outfile differ"
n='[0-9.]+'
expect "$work/stub.txt" "f32 T=1024 none fwd" " 1 +21.000 +21.000 +1.000  0+aa 0+aa SAME$"
expect "$work/stub.txt" "bf16 T=4096 causal fwdbwd" " 1 +5.000 +6.250 +0.800  0+aa 0+aa SAME$"
expect "$work/stub.txt" "decode L=16384 contiguous" " 1 +21.000 +21.000 +1.000  0+aa 0+bb DIFF$"
expect "$work/stub.txt" "gpt2 layer T=1024 fwd" " 1 +- +- +- +- +- +FAIL$"
expect "$work/stub.txt" "decode L=16384 paged 1" " 1 +$n +$n +$n  0+aa 0+bb DIFF \(hash only\)$"
grep -q "stub: --layer fails" "$work/stub.txt" || fail "the failed run's output is not kept"
grep -qx "summary: 5 cases, 2 SAME, 2 DIFF, 1 FAIL; 3 timed, worst old/new 0.800, 1 below 0.98" \
  "$work/stub.txt" || fail "wrong summary: $(grep summary "$work/stub.txt")"

AB_TOOL=$tool AB_ROUNDS=2 AB_ONLY='^(f64 T=256 causal fwd|prefill T=200 contiguous)$' \
  sh "$script" "$lib" "$lib" "$work/real.txt" || fail "the library against itself: exit $?"
grep -Eq "^summary: 4 cases, 4 SAME, 0 DIFF, 0 FAIL; 2 timed, worst old/new $n, [0-2] below" \
  "$work/real.txt" || fail "wrong summary of the library against itself"
echo "ab_contract: every verdict as expected"
