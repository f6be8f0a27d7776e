#!/usr/bin/env bash
# Installs the build into a fresh temporary prefix with
# `cmake --install BUILD --prefix P`, checks that attn is the one program
# installed (no attn-bench), and builds a consumer against it both ways the
# README gives: pkg-config (shared, and --static) and find_package(attn)
# (attn::attn_static and attn::attn_shared), from the prefix and from the
# build tree; where the build has MPI, the same for the MPI layer (attn-mpi,
# attn::attn_mpi). Then the uninstall target removes every file it installed.
#   test_install.sh BUILD_DIR CONSUMER_DIR
set -euo pipefail
build=$1
consumer=$2
work=$(mktemp -d)
# The installs below rewrite the build's install_manifest.txt and
# install_destdir.txt, which a user's later `make uninstall` reads: the
# user's own are put back.
manifest="$build/install_manifest.txt"
destdir_file="$build/install_destdir.txt"
for f in "$manifest" "$destdir_file"; do
  if [ -e "$f" ]; then cp -p "$f" "$work/$(basename "$f").saved"; fi
done
restore() {
  for f in "$manifest" "$destdir_file"; do
    if [ -e "$work/$(basename "$f").saved" ]; then cp -p "$work/$(basename "$f").saved" "$f"
    else rm -f "$f"; fi
  done
  rm -rf "$work"
}
trap restore EXIT
prefix="$work/prefix with space"
cc=${CC:-cc}

# A staged install (DESTDIR, as packagers make): uninstall removes the staged
# files, not the ones at the prefix itself, which that install never wrote.
live="$work/live"
DESTDIR="$work/stage" cmake --install "$build" --prefix "$live" >/dev/null
[ ! -e "$live" ] || { echo "FAIL: DESTDIR install wrote under the prefix itself"; exit 1; }
mkdir -p "$live/include"
echo "another package's" >"$live/include/attn.h"
cmake --build "$build" --target uninstall >"$work/uninstall.log" \
  || { echo "FAIL: uninstall after a DESTDIR install:"; cat "$work/uninstall.log"; exit 1; }
staged=$(cd "$work/stage" && find . ! -type d | tr '\n' ' ')
[ -z "$staged" ] || { echo "FAIL: left after uninstall of a DESTDIR install: $staged"; exit 1; }
grep -q "another package's" "$live/include/attn.h" \
  || { echo "FAIL: uninstall of a DESTDIR install removed the prefix's own attn.h"; exit 1; }
rm -rf "$live" "$work/stage"
# a relative DESTDIR is the install's working directory's: the uninstall,
# which runs in the build directory, still finds the files
(cd "$work" && DESTDIR=rel-stage cmake --install "$build" --prefix "$live" >/dev/null)
[ -n "$(cd "$work/rel-stage" && find . ! -type d)" ] \
  || { echo "FAIL: nothing under the relative DESTDIR"; exit 1; }
cmake --build "$build" --target uninstall >"$work/uninstall.log" \
  || { echo "FAIL: uninstall after a relative DESTDIR install:"; cat "$work/uninstall.log"; exit 1; }
staged=$(cd "$work/rel-stage" && find . ! -type d | tr '\n' ' ')
[ -z "$staged" ] || { echo "FAIL: left after uninstall of a relative DESTDIR: $staged"; exit 1; }
# uninstall again: nothing is there, which it says and fails on
if cmake --build "$build" --target uninstall >"$work/uninstall.log" 2>&1; then
  echo "FAIL: an uninstall that removed nothing succeeded"; cat "$work/uninstall.log"; exit 1
fi
# CMake wraps a long error message at spaces, as the paths' lengths fall
tr -s ' \n' '  ' <"$work/uninstall.log" | grep -q "uninstall: removed nothing: none of the" \
  || { echo "FAIL: the empty uninstall's message:"; cat "$work/uninstall.log"; exit 1; }
rm -rf "$work/rel-stage"
echo "DESTDIR install and uninstall: ok"

cmake --install "$build" --prefix "$prefix" >/dev/null
# The one program installed is attn, the user's tool; attn-bench and the
# other programs of the build stay in it.
programs=$(cd "$prefix" && find . -type f -perm -u+x ! -name '*.so*' | sort | tr '\n' ' ')
[ "$programs" = "./bin/attn " ] \
  || { echo "FAIL: installed programs: $programs(want ./bin/attn alone)"; exit 1; }
benches=$(cd "$prefix" && find . -iname '*bench*')
[ -z "$benches" ] || { echo "FAIL: bench files installed: $benches"; exit 1; }
echo "programs: ok (bin/attn alone)"
pc=$(find "$prefix" -name attn.pc)
[ -n "$pc" ] || { echo "FAIL: no attn.pc under $prefix"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")

# pkg-config: the paths it gives must point into the prefix just used.
export PKG_CONFIG_PATH=$(dirname "$pc")
eval "got_prefix=$(pkg-config --variable=prefix attn)"
if [ "$(cd "$got_prefix" 2>/dev/null && pwd -P)" != "$(cd "$prefix" && pwd -P)" ]; then
  echo "FAIL: pkg-config says prefix=$got_prefix, installed to $prefix"
  exit 1
fi
# pkg-config escapes the space in the prefix; eval reads its output as the
# shell words it is.
eval "cflags=($(pkg-config --cflags attn))"
eval "libs=($(pkg-config --libs attn))"
"$cc" -o "$work/pc_shared" "$consumer/consumer.c" "${cflags[@]}" "${libs[@]}"
LD_LIBRARY_PATH="$libdir" "$work/pc_shared" | grep -q "^attn .* ok$" \
  || { echo "FAIL: pkg-config consumer"; exit 1; }
# --static: libattn.a itself (-l:libattn.a, as the shared library stands beside
# it), linked with nothing but what --static gives, Libs.private included
eval "static_libs=($(pkg-config --static --libs attn))"
"$cc" -o "$work/pc_static" "$consumer/consumer.c" "${cflags[@]}" \
  "${static_libs[@]/#-lattn/-l:libattn.a}" \
  || { echo "FAIL: pkg-config --static: the consumer does not link"; exit 1; }
if readelf -d "$work/pc_static" | grep -q "NEEDED.*libattn"; then
  echo "FAIL: pkg-config --static consumer needs libattn.so"; exit 1
fi
"$work/pc_static" | grep -q "^attn .* ok$" \
  || { echo "FAIL: pkg-config --static consumer"; exit 1; }
echo "pkg-config: ok (prefix $got_prefix; shared, and --static)"

# find_package(attn MAJOR.MINOR) from the same prefix, the installed header's
# version; while 0.x, asking for another minor finds no package (docs/abi.md).
header=$(find "$prefix" -name attn.h)
major=$(sed -n 's/^#define ATTN_VERSION_MAJOR \([0-9]*\)$/\1/p' "$header")
minor=$(sed -n 's/^#define ATTN_VERSION_MINOR \([0-9]*\)$/\1/p' "$header")
[ -n "$major" ] && [ -n "$minor" ] || { echo "FAIL: no version in $header"; exit 1; }
cmake -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
  -DATTN_WANTED_VERSION="$major.$minor" >/dev/null
if [ "$major" = 0 ]; then
  if cmake -S "$consumer" -B "$work/build-other" -DCMAKE_PREFIX_PATH="$prefix" \
      -DATTN_WANTED_VERSION="0.$((minor + 1))" >"$work/other.log" 2>&1; then
    echo "FAIL: find_package(attn 0.$((minor + 1))) accepted attn $major.$minor"
    exit 1
  fi
  grep -q "attnConfig.cmake, version: $major.$minor" "$work/other.log" \
    || { echo "FAIL: find_package(attn 0.$((minor + 1))) failed for another reason:";
         cat "$work/other.log"; exit 1; }
fi
cmake --build "$work/build" >/dev/null
"$work/build/consumer_static" | grep -q "^attn .* ok$" \
  || { echo "FAIL: find_package consumer (attn::attn_static)"; exit 1; }
"$work/build/consumer_shared" | grep -q "^attn .* ok$" \
  || { echo "FAIL: find_package consumer (attn::attn_shared)"; exit 1; }
echo "find_package: ok (attn $major.$minor)"
# The build tree itself, named in CMAKE_PREFIX_PATH: its attnConfig.cmake
# gives the same targets, the build's own libraries.
cmake -S "$consumer" -B "$work/build-tree" -DCMAKE_PREFIX_PATH="$build" \
  -DCMAKE_BUILD_TYPE=Release -DATTN_WANTED_VERSION="$major.$minor" >"$work/tree.log" 2>&1 \
  || { echo "FAIL: find_package(attn) from the build tree:"; cat "$work/tree.log"; exit 1; }
found=$(sed -n 's/^attn_DIR:PATH=//p' "$work/build-tree/CMakeCache.txt")
[ "$(realpath "$found")" = "$(realpath "$build")" ] \
  || { echo "FAIL: find_package(attn) from the build tree found $found"; exit 1; }
cmake --build "$work/build-tree" >/dev/null
"$work/build-tree/consumer_static" | grep -q "^attn .* ok$" \
  || { echo "FAIL: build-tree find_package consumer (attn::attn_static)"; exit 1; }
"$work/build-tree/consumer_shared" | grep -q "^attn .* ok$" \
  || { echo "FAIL: build-tree find_package consumer (attn::attn_shared)"; exit 1; }
echo "find_package from the build tree: ok"

# The MPI layer, where the build has it: pkg-config attn-mpi and
# find_package(attn COMPONENTS mpi) (attn::attn_mpi), each consumer run on 2
# ranks against the single process.
uninstall() {
  local before after
  before=$(wc -l <"$manifest")
  cmake --build "$build" --target uninstall >"$work/uninstall.log" \
    || { echo "FAIL: the uninstall target:"; cat "$work/uninstall.log"; exit 1; }
  after=$(cd "$prefix" && find . ! -type d | sort | tr '\n' ' ')
  [ -z "$after" ] || { echo "FAIL: left after uninstall: $after"; exit 1; }
  echo "uninstall: ok ($before files removed)"
}
if [ -z "$(find "$prefix" -name 'libattn_mpi.*')" ]; then
  echo "attn-mpi: skipped (this build has no MPI)"
  uninstall
  exit 0
fi
[ -n "$(find "$prefix" -name attn-mpi.pc)" ] \
  || { echo "FAIL: libattn_mpi installed without attn-mpi.pc"; exit 1; }
[ -n "$(find "$prefix" -name attnMpiTargets.cmake)" ] \
  || { echo "FAIL: libattn_mpi installed without its CMake target (attnMpiTargets.cmake)"; exit 1; }
run_mpi=$(cd "$(dirname "$0")/../mpi" && pwd)/run_mpi.sh
mpi_consumer=$(cd "$consumer/../consumer_mpi" && pwd)
eval "cflags=($(pkg-config --cflags attn-mpi))"
eval "libs=($(pkg-config --libs attn-mpi))"
"$cc" -o "$work/pc_mpi" "$mpi_consumer/consumer_mpi.c" "${cflags[@]}" "${libs[@]}"
bash "$run_mpi" 2 "$work/pc_mpi" | grep -q "^attn_mpi .* ok$" \
  || { echo "FAIL: pkg-config attn-mpi consumer"; exit 1; }
echo "pkg-config attn-mpi: ok"
cmake -S "$mpi_consumer" -B "$work/build-mpi" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build-mpi" >/dev/null
bash "$run_mpi" 2 "$work/build-mpi/consumer_mpi" | grep -q "^attn_mpi .* ok$" \
  || { echo "FAIL: find_package consumer (attn::attn_mpi)"; exit 1; }
echo "find_package(attn COMPONENTS mpi): ok (attn::attn_mpi)"
cmake -S "$mpi_consumer" -B "$work/build-tree-mpi" -DCMAKE_PREFIX_PATH="$build" \
  -DCMAKE_BUILD_TYPE=Release >"$work/tree-mpi.log" 2>&1 \
  || { echo "FAIL: find_package(attn COMPONENTS mpi) from the build tree:";
       cat "$work/tree-mpi.log"; exit 1; }
cmake --build "$work/build-tree-mpi" >/dev/null
bash "$run_mpi" 2 "$work/build-tree-mpi/consumer_mpi" | grep -q "^attn_mpi .* ok$" \
  || { echo "FAIL: build-tree find_package consumer (attn::attn_mpi)"; exit 1; }
echo "find_package(attn COMPONENTS mpi) from the build tree: ok"
uninstall
