#!/bin/sh
# The build without libpng (-DATTN_WITH_PNG=OFF, as on a machine without
# libpng-dev) still builds attn; heatmap --output says PNG is unavailable
# (exit 1) and --terminal still draws. Built unoptimised (Debug): the
# kernels at -O3 took most of this test's minute.
# usage: heatmap_without_libpng.sh SOURCE_DIR BUILD_DIR C_COMPILER
set -eu
src=$1 out=$2
cmake -S "$src" -B "$out" -DCMAKE_C_COMPILER="$3" -DATTN_WITH_PNG=OFF -DATTN_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=Debug >"$out.log" 2>&1 || { cat "$out.log"; exit 1; }
grep -q "libpng not found; PNG output unavailable" "$out.log" || { echo "no notice in configure"; exit 1; }
cmake --build "$out" --target attn_cli -j 2 >>"$out.log" 2>&1 || { cat "$out.log"; exit 1; }
set +e
"$out/attn" heatmap --module causal --d-out 2 --text "Your journey" --output "$out/x.png" 2>"$out/err"
rc=$?
set -e
[ "$rc" -eq 1 ] || { echo "exit code $rc, want 1"; exit 1; }
grep -q "PNG output is unavailable: this attn was built without libpng" "$out/err" || { cat "$out/err"; exit 1; }
[ ! -e "$out/x.png" ] || { echo "a PNG was written"; exit 1; }
"$out/attn" heatmap --module causal --d-out 2 --text "Your journey" --terminal | grep -q "head 0"
echo "1 passed, 0 failed"
