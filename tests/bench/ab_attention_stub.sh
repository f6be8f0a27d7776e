#!/bin/sh
# A stand-in for bench/ab_attention that test_ab_contract.sh gives
# bench/ab_contract.sh: it prints the real tool's lines with times and hashes
# chosen from its arguments, so that every verdict of the script is known:
#   --layer    fails (exit 3)
#   --decode   the two builds' hashes differ
#   --bf16     the new build takes 1.25x the old's time (old/new 0.800)
#   otherwise  the same hash and time
# The old build's median is the --rounds given, to show what the script asks.
rounds=0 threads=0 fail=0 diff=0 slow=0
while [ $# -gt 2 ]; do
  case $1 in
    --rounds) rounds=$2; shift ;;
    --threads) threads=$2; shift ;;
    --layer) fail=1 ;;
    --decode) diff=1 ;;
    --bf16) slow=1 ;;
  esac
  shift
done
[ "$fail" = 0 ] || { echo "stub: --layer fails" >&2; exit 3; }
[ "$threads" -ge 1 ] || { echo "stub: no --threads" >&2; exit 2; }
old_ms=$rounds new_ms=$rounds new_hash=00000000000000aa
[ "$slow" = 0 ] || new_ms=$(echo "$rounds" | awk '{ print $1 * 1.25 }')
[ "$diff" = 0 ] || new_hash=00000000000000bb
echo "B=1 T=1 H=1 Hkv=1 hd=1 no mask, $threads thread, forward, $rounds rounds, layout peers"
printf '  %-36s median %9.3f ms  x %.3f   fastest %9.3f ms  x %.3f   hash %s\n' "$1" "$old_ms" \
  1 "$old_ms" 1 00000000000000aa
printf '  %-36s median %9.3f ms  x %.3f   fastest %9.3f ms  x %.3f   hash %s\n' "$2" "$new_ms" \
  1 "$new_ms" 1 "$new_hash"
