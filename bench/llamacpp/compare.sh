#!/usr/bin/env bash
# ggml's flash attention (fa_harness) against attn's KV-cache decode
# (attn_decode) on the same step: one query token, 32 query heads over 8 KV
# heads, head_dim D, cache length L, K/V types matched, the same thread count.
# Each (D, L, threads) case runs every program REPS times, the two sides
# alternating (their order flips every repetition); each launch prints its
# median of RUNS steps, and the table gives the median over launches.
#
#   bench/llamacpp/build.sh && bench/llamacpp/compare.sh
#   DIMS="128" LENGTHS="16384" THREADS="1" REPS=5 bench/llamacpp/compare.sh
#
# Pairs (llama.cpp type : attn k_dtype = v_dtype): f32:f32, f16:f16,
# f16:bf16, q8_0:int8. A type attn's cache does not take yet prints
# "pending" in its row. Writes bench/results/llamacpp-<llama.cpp commit>-attn-<attn commit>-<machine>.txt
# (RESULTS=path to write elsewhere, RESULTS=- for stdout only).
set -euo pipefail
source "$(dirname "$0")/common.sh"
need_build
build_attn

DIMS=${DIMS:-64 128}
LENGTHS=${LENGTHS:-4096 16384}
THREADS=${THREADS:-1 2}
REPS=${REPS:-5}
RUNS=${RUNS:-21}
PAIRS=${PAIRS:-f32:f32 f16:f16 f16:bf16 q8_0:int8}
[ "$REPS" -ge 5 ] || echo "compare.sh: REPS=$REPS: fewer than 5 launches per median" >&2

RESULTS=${RESULTS:-$(results_name llamacpp)}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

# The distinct programs of the pairs, in a fixed order.
jobs=()
for p in $PAIRS; do
  for j in "llama:${p%%:*}" "attn:${p##*:}"; do
    [[ " ${jobs[*]-} " == *" $j "* ]] || jobs+=("$j")
  done
done

run_job() { # side type D L T -> "ms gbs", "pending" or "error"
  local side=$1 type=$2 D=$3 L=$4 T=$5 line rc=0
  if [ "$side" = llama ]; then
    line=$("$HB/fa_harness" --type "$type" --head-dim "$D" --length "$L" --threads "$T" \
           --runs "$RUNS" 2>"$work/err") || rc=$?
  else
    line=$("$HB/attn_decode" --dtype "$type" --head-dim "$D" --length "$L" --threads "$T" \
           --runs "$RUNS" 2>"$work/err") || rc=$?
  fi
  if [ $rc -eq 3 ]; then echo pending; echo "$line" >"$work/pending-$type"; return; fi
  if [ $rc -ne 0 ]; then echo error; sed "s/^/  $side $type D=$D L=$L T=$T: /" "$work/err" >&2; return; fi
  echo "$line" | sed -n 's/.* ms=\([0-9.]*\) gbs=\([0-9.]*\).*/\1 \2/p'
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
start=$(date +%s)
for D in $DIMS; do for L in $LENGTHS; do for T in $THREADS; do
  echo "  D=$D L=$L threads=$T ..." >&2
  for ((r = 0; r < REPS; r++)); do
    order=("${jobs[@]}")
    if ((r % 2)); then # flip the order every other repetition
      order=(); for ((i = ${#jobs[@]} - 1; i >= 0; i--)); do order+=("${jobs[$i]}"); done
    fi
    for j in "${order[@]}"; do
      echo "$(run_job "${j%%:*}" "${j##*:}" "$D" "$L" "$T")" >>"$work/$D-$L-$T-${j/:/-}"
    done
  done
done; done; done
secs=$(( $(date +%s) - start ))
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

cell() { # file -> "ms gbs" medians, or pending/error
  local f=$1
  if grep -q pending "$f"; then echo pending; return; fi
  if grep -q error "$f"; then echo error; return; fi
  echo "$(cut -d' ' -f1 "$f" | median) $(cut -d' ' -f2 "$f" | median)"
}

{
  echo "\$ ${CMDLINE:-DIMS=\"$DIMS\" LENGTHS=\"$LENGTHS\" THREADS=\"$THREADS\" REPS=$REPS RUNS=$RUNS bench/llamacpp/compare.sh}"
  machine_lines
  echo "results file name: $(basename "$(results_name llamacpp)")"
  echo "load average before: $load_before; after: $load_after; $secs s; the machine is shared: other work may have run at the same time"
  echo
  echo "One decode step's attention: 1 query token, 32 query heads over 8 KV heads, head_dim D, K/V cache of L tokens."
  echo "  llama.cpp: ggml_flash_attn_ext on the CPU backend (bench/llamacpp/fa_harness.c: one-node graph, no mask, persistent ggml threadpool)"
  echo "  attn:      attn_kv_cache_attend on a one-layer cache filled by attn_kv_cache_append (bench/llamacpp/attn_decode.c)"
  echo "  ms: median over $REPS launches, alternating, of each launch's median of $RUNS steps; GB/s: K+V bytes stored / ms"
  echo "  x = llama.cpp ms / attn ms (above 1: attn faster); '<3' marks a ratio under the 3x target"
  echo
  printf "%4s %6s %3s | %-5s %9s %7s | %-5s %9s %7s | %7s\n" D L thr llama ms GB/s attn ms GB/s x
  for D in $DIMS; do for L in $LENGTHS; do for T in $THREADS; do for p in $PAIRS; do
    lt=${p%%:*}; at=${p##*:}
    read -r lms lgb <<<"$(cell "$work/$D-$L-$T-llama-$lt")" || true
    read -r ams agb <<<"$(cell "$work/$D-$L-$T-attn-$at")" || true
    if [[ "$lms" =~ ^[0-9.]+$ && "${ams:-}" =~ ^[0-9.]+$ ]]; then
      x=$(awk -v a="$lms" -v b="$ams" 'BEGIN{r=a/b; printf "%.2f%s", r, (r<3?" <3":"")}')
      printf "%4s %6s %3s | %-5s %9.3f %7.1f | %-5s %9.3f %7.1f | %7s\n" "$D" "$L" "$T" "$lt" "$lms" "$lgb" "$at" "$ams" "$agb" "$x"
    else
      printf "%4s %6s %3s | %-5s %9s %7s | %-5s %9s %7s | %7s\n" "$D" "$L" "$T" "$lt" "$lms" "${lgb:-}" "$at" "$ams" "${agb:-}" "-"
    fi
  done; done; done; done
  for f in "$work"/pending-*; do
    [ -e "$f" ] || continue
    t=${f##*/pending-}
    echo "pending $t: $(sed "s/^pending: //" "$f")"
    echo "  the row fills, unchanged, once attn's cache takes $t: bench/llamacpp/build.sh && bench/llamacpp/compare.sh"
  done
} >"$work/table"

cat "$work/table"
if [ "$RESULTS" != - ]; then
  mkdir -p "$(dirname "$RESULTS")"
  cp "$work/table" "$RESULTS"
  echo "written: ${RESULTS#$ROOT/}" >&2
fi
