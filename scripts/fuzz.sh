#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang under ASan + UBSan and
# runs each one for SECONDS seconds (default 60), as many at once as JOBS
# (default the CPU count), from its committed seed corpus (read only) and its
# dictionary. New inputs go to a scratch directory; a crash, leak or timeout
# fails the run and its input is kept in $FUZZ_BUILD/artifacts. Prints each
# target's executions and coverage.
#   scripts/fuzz.sh [SECONDS]        (make fuzz runs it longer)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${FUZZ_BUILD:-build-fuzz}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_FUZZ=ON \
  -DATTN_WERROR=ON >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz_npy fuzz_safetensors fuzz_cli_args fuzz_tokenizer \
  fuzz_json >/dev/null

artifacts="$build/artifacts"
mkdir -p "$artifacts"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# One target: its run into its log, its exit code into $scratch/TARGET.rc.
fuzz_one() {
  local target=$1 corpus=${1%_args}
  mkdir -p "$scratch/$target"
  set +e
  "$build/tests/fuzz_$target" "$scratch/$target" "tests/fuzz/corpus/$corpus" \
    -dict="tests/fuzz/$corpus.dict" -max_total_time="$seconds" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$artifacts/$target-" \
    >"$build/fuzz_$target.log" 2>&1
  echo $? >"$scratch/$target.rc"
}

# Each target runs on one core: as many at once as there are jobs.
targets=(npy safetensors cli_args tokenizer json)
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  for target in "${targets[@]:i:jobs}"; do
    fuzz_one "$target" &
  done
  wait
done

status=0
for target in "${targets[@]}"; do
  log="$build/fuzz_$target.log"
  rc=$(cat "$scratch/$target.rc")
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  corpus_size=$(find "$scratch/$target" -type f | wc -l)
  printf 'fuzz_%-12s %6ss  %10s executions  %s  %s new inputs  exit %s\n' "$target" \
    "$seconds" "${runs:-?}" "${cov:-cov: ?}" "$corpus_size" "$rc"
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "fuzz_$target FAILED; the log's end ($log):"
    tail -40 "$log"
    ls "$artifacts" | sed 's/^/  artifact: /'
  fi
done
exit "$status"
