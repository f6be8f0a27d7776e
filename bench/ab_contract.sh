#!/bin/sh
# ab_contract.sh — the A/B of two builds of libattn.so that a change of the
# attention contract has to pass: every path gives the same bits as before,
# and every timed case runs within 2% of the old build's time, or faster.
# Each case is one bench/ab_attention run (old and new alternating round by
# round in one process, medians), on 1 and on 2 threads:
#   timed: fp32 and bf16 SDPA, T = 1024 and 4096, causal and not, forward and
#          forward+backward; decode of one token on a cache of L = 16384
#          (32 query heads, 8 KV heads, head_dim 128), contiguous and paged,
#          and of bf16 and int8 caches;
#          the GPT-2 layer, T = 1024, forward and forward+backward; f64 SDPA
#          at T = 256, forward and forward+backward
#   hash:  one round each, for the bits of the paths the timed cases do not
#          take: the bthd layout, GQA, varlen, sliding windows, f64 with
#          them, decode with page size 1, f16, fp8 and int4 caches, a batch
#          and a windowed cache,
#          prefill of 200 tokens on an empty cache and on a filled one
#
#   bench/ab_contract.sh OLD.so NEW.so OUTFILE
#
# Writes to OUTFILE (and to stdout) the command, the CPU and the load, as
# bench/results/ keeps them, then one line per case: case, threads, old and
# new median ms, old over new (above 1: new is faster), both hashes, SAME or
# DIFF (FAIL: the run failed, its output follows). Then the load after, the
# seconds the run took, and a summary: cases, how many SAME, the worst ratio
# of the timed cases and how many of them are below 0.98. Exits 1 if any case
# is DIFF or FAIL. The speed verdict needs a machine that runs nothing else.
#
# The two libraries are copied to a scratch directory first, so that each
# is loaded on its own even when OLD and NEW are one file (the dynamic
# loader would hand the second dlopen the first one's copy), and a rebuild
# during the run touches neither.
#
# Environment: AB_TOOL the ab_attention binary (default build/ab_attention
# beside this script), AB_ONLY an extended regex that keeps the cases whose
# name matches it, AB_ROUNDS the rounds of every timed case, AB_THREADS the
# thread counts ("1 2").
set -eu

if [ $# -ne 3 ]; then
  echo "usage: bench/ab_contract.sh OLD.so NEW.so OUTFILE" >&2
  exit 2
fi
old=$1 new=$2 outfile=$3
root=$(cd "$(dirname "$0")/.." && pwd)
tool=${AB_TOOL:-$root/build/ab_attention}
only=${AB_ONLY:-}
threads_list=${AB_THREADS:-1 2}
if [ ! -x "$tool" ]; then
  echo "ab_contract: no ab_attention at $tool (cmake --build build --target ab_attention)" >&2
  exit 2
fi

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp "$old" "$scratch/old.so"
cp "$new" "$scratch/new.so"
: > "$outfile"

emit() {
  echo "$1"
  echo "$1" >> "$outfile"
}

# the header bench/results/README.md asks for: the command, the CPU, the load
start=$(date +%s)
emit "\$ bench/ab_contract.sh $old $new $outfile"
emit "# old $old, new $new"
emit "# $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(uname -n): $(sed -n 's/^model name[^:]*: //p' \
  /proc/cpuinfo 2>/dev/null | head -1), $(nproc 2>/dev/null || echo '?') CPUs"
emit "# load before: $(cat /proc/loadavg 2>/dev/null || echo '?')"
emit "$(printf '%-44s %3s %10s %10s %7s  %-16s %-16s %s' case thr old_ms new_ms old/new \
  hash_old hash_new bits)"

# One case: NAME ROUNDS ARGS... (ROUNDS 0: hash only, one round), on each
# thread count.
run_case() {
  name=$1 rounds=$2
  shift 2
  if [ -n "$only" ] && ! echo "$name" | grep -Eq -- "$only"; then return 0; fi
  kind=timed
  if [ "$rounds" = 0 ]; then
    kind=hash rounds=1
  elif [ -n "${AB_ROUNDS:-}" ]; then
    rounds=$AB_ROUNDS
  fi
  for threads in $threads_list; do
    if ! output=$("$tool" --threads "$threads" --rounds "$rounds" "$@" \
        "$scratch/old.so" "$scratch/new.so" 2>&1); then
      emit "$(printf '%-44s %3s %10s %10s %7s  %-16s %-16s %s' "$name" "$threads" - - - - - FAIL)"
      echo "$output" | sed 's/^/    /' | tee -a "$outfile"
      continue
    fi
    # the tool's lines per build: PATH median MS x R fastest MS x R hash H
    line=$(echo "$output" | awk -v name="$name" -v thr="$threads" -v kind="$kind" '
      / median / { ms[++n] = $3; hash[n] = $NF }
      END {
        if (n != 2) { print "bad"; exit }
        printf "%-44s %3s %10.3f %10.3f %7.3f  %-16s %-16s %s%s\n", name, thr, ms[1], ms[2],
               ms[1] / ms[2], hash[1], hash[2], hash[1] == hash[2] ? "SAME" : "DIFF",
               kind == "hash" ? " (hash only)" : ""
      }')
    if [ "$line" = bad ]; then
      emit "$(printf '%-44s %3s %10s %10s %7s  %-16s %-16s %s' "$name" "$threads" - - - - - FAIL)"
      echo "$output" | sed 's/^/    /' | tee -a "$outfile"
      continue
    fi
    emit "$line"
  done
}

decode="--heads 32 --kv-heads 8 --head-dim 128"

# fp32 and bf16 SDPA, GPT-2 small's heads (12 x 64)
for prec in f32 bf16; do
  flag=""
  [ "$prec" = bf16 ] && flag=--bf16
  for T in 1024 4096; do
    for mask in none causal; do
      causal=""
      [ "$mask" = causal ] && causal=--causal
      for mode in fwd fwdbwd; do
        rounds=7
        [ "$T" = 1024 ] && rounds=15
        [ "$T" = 1024 ] && [ "$mode" = fwd ] && rounds=21
        [ "$T" = 4096 ] && [ "$mode" = fwdbwd ] && rounds=5
        run_case "$prec T=$T $mask $mode" "$rounds" $flag --tokens "$T" $causal --mode "$mode"
      done
    done
  done
done
run_case "decode L=16384 contiguous" 21 --decode 16384 $decode
run_case "decode L=16384 paged 16" 21 --decode 16384 --paged --page-size 16 $decode
run_case "decode L=16384 contiguous bf16" 21 --decode 16384 --kv-dtype bf16 $decode
run_case "decode L=16384 contiguous int8" 21 --decode 16384 --kv-dtype int8 $decode
run_case "gpt2 layer T=1024 fwd" 15 --layer --tokens 1024 --mode fwd
run_case "gpt2 layer T=1024 fwdbwd" 11 --layer --tokens 1024 --mode fwdbwd
run_case "f64 T=256 causal fwd" 7 --f64 --tokens 256 --causal --mode fwd
run_case "f64 T=256 causal fwdbwd" 7 --f64 --tokens 256 --causal --mode fwdbwd

# hash only
run_case "f32 bthd T=1024 causal fwdbwd" 0 --layout bthd --tokens 1024 --causal --mode fwdbwd
run_case "f32 gqa4 T=1024 causal fwdbwd" 0 --kv-heads 4 --tokens 1024 --causal --mode fwdbwd
run_case "f32 varlen B=3 T=1024 causal fwdbwd" 0 --varlen --batch 3 --tokens 1024 --causal \
  --mode fwdbwd
run_case "f32 window 256 T=1024 causal fwdbwd" 0 --window 256 --tokens 1024 --causal --mode fwdbwd
run_case "f32 window 100 T=1024 none fwdbwd" 0 --window 100 --tokens 1024 --mode fwdbwd
run_case "bf16 bthd T=1024 causal fwdbwd" 0 --bf16 --layout bthd --tokens 1024 --causal \
  --mode fwdbwd
run_case "bf16 gqa4 T=1024 causal fwdbwd" 0 --bf16 --kv-heads 4 --tokens 1024 --causal \
  --mode fwdbwd
run_case "bf16 varlen B=3 window 256 T=1024 fwdbwd" 0 --bf16 --varlen --batch 3 --window 256 \
  --tokens 1024 --causal --mode fwdbwd
run_case "f64 gqa4 varlen B=3 window 50 T=128 fwdbwd" 0 --f64 --kv-heads 4 --varlen --batch 3 \
  --window 50 --tokens 128 --causal --mode fwdbwd
run_case "decode L=16384 paged 1" 0 --decode 16384 --paged --page-size 1 $decode
run_case "decode L=16384 contiguous f16" 0 --decode 16384 --kv-dtype f16 $decode
run_case "decode L=16384 paged 16 fp8" 0 --decode 16384 --paged --kv-dtype fp8 $decode
run_case "decode L=16384 contiguous int4" 0 --decode 16384 --kv-dtype int4 $decode
run_case "decode L=4096 B=3 paged 16" 0 --decode 4096 --batch 3 --paged $decode
run_case "decode L=16384 window 4096 contiguous" 0 --decode 16384 --window 4096 $decode
run_case "decode L=16384 window 4096 paged 16" 0 --decode 16384 --window 4096 --paged $decode
run_case "prefill T=200 contiguous" 0 --prefill 200 $decode
run_case "prefill T=200 paged 16" 0 --prefill 200 --paged $decode
run_case "prefill T=200 on L=1000 paged 16" 0 --decode 1000 --prefill 200 --paged $decode

awk '
  /^#/ || /^\$ / || /^case / || /^    / { next }
  { cases++ }
  / SAME/ { same++ }
  / DIFF/ { diff++ }
  / FAIL$/ { fail++ }
  / SAME$| DIFF$/ {
    timed++
    if (worst == "" || $(NF - 3) < worst) { worst = $(NF - 3); worst_case = $0 }
    if ($(NF - 3) < 0.98) slower++
  }
  END {
    printf "summary: %d cases, %d SAME, %d DIFF, %d FAIL; ", cases, same, diff, fail
    printf "%d timed, worst old/new %s, %d below 0.98\n", timed, worst == "" ? "-" : worst, slower
    if (worst_case != "") print "worst: " worst_case
  }' "$outfile" > "$scratch/summary"
emit "# load after: $(cat /proc/loadavg 2>/dev/null || echo '?'); $(($(date +%s) - start)) s"
cat "$scratch/summary" | tee -a "$outfile"
grep -q " 0 DIFF, 0 FAIL" "$scratch/summary"
