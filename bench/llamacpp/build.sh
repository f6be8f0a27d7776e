#!/usr/bin/env bash
# Builds llama.cpp from the source vendored in the PyPI llama-cpp-python sdist, and the two
# harnesses of this folder against it and against libattn. Idempotent: every step is skipped
# when its output is there. Everything lands under build/llamacpp/ (gitignored).
#
#   bench/llamacpp/build.sh            # download, unpack, configure, build
#   LLAMACPP_SDIST_VERSION=0.3.36 bench/llamacpp/build.sh   # pin another sdist
#
# Needs: python3 with pip (the repo's .venv if present), cmake, a C/C++ compiler, git.
set -euo pipefail

source "$(dirname "$0")/common.sh" # ROOT, OUTDIR, HB, die, build_attn
JOBS=${JOBS:-2}
PY=${PYTHON:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
SPEC=llama-cpp-python${LLAMACPP_SDIST_VERSION:+==$LLAMACPP_SDIST_VERSION}

for tool in cmake git cc c++; do
  command -v "$tool" >/dev/null || die "needs '$tool' on PATH"
done

mkdir -p "$OUTDIR/sdist" "$OUTDIR/src"

# 1. The sdist, from the registry with pip (no other network).
sdist=$(ls "$OUTDIR"/sdist/llama_cpp_python-*.tar.gz 2>/dev/null | sort -V | tail -1 || true)
if [ -n "${LLAMACPP_SDIST_VERSION:-}" ]; then
  want="$OUTDIR/sdist/llama_cpp_python-$LLAMACPP_SDIST_VERSION.tar.gz"
  [ -f "$want" ] && sdist=$want || sdist=
fi
if [ -z "$sdist" ]; then
  # The source of llama-cpp-python alone: its build backend may come as a
  # wheel (with --no-binary :all: pip builds setuptools and every other
  # backend package from source first, which takes many minutes or stalls).
  echo "== pip download --no-binary llama-cpp-python --no-deps $SPEC"
  "$PY" -m pip download --no-binary llama-cpp-python --no-deps "$SPEC" -d "$OUTDIR/sdist" ||
    die "pip could not download the $SPEC sdist"
  sdist=$(ls "$OUTDIR"/sdist/llama_cpp_python-*.tar.gz | sort -V | tail -1)
fi
pyver=$(basename "$sdist" .tar.gz); pyver=${pyver#llama_cpp_python-}
echo "== sdist: $(basename "$sdist")"

# 2. Unpack; the vendored tree is vendor/llama.cpp.
SRC=$OUTDIR/src/llama_cpp_python-$pyver
if [ ! -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ]; then
  echo "== unpacking into $OUTDIR/src"
  tar -xzf "$sdist" -C "$OUTDIR/src"
fi
LC=$SRC/vendor/llama.cpp
[ -f "$LC/CMakeLists.txt" ] || die "no vendor/llama.cpp in $sdist"

# 3. Its commit: the sdist carries the submodule's git directory; failing that, 'unknown'.
commit=$(git -C "$LC" rev-parse HEAD 2>/dev/null || echo unknown)
cdate=$(git -C "$LC" log -1 --format=%cs 2>/dev/null || echo unknown)

BLD=$OUTDIR/build
FLAGS=(-DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
       -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
       -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON)
TARGETS=(ggml ggml-cpu llama llama-bench)
if [ ! -f "$BLD/CMakeCache.txt" ]; then
  echo "== cmake -S $LC -B $BLD ${FLAGS[*]}"
  cmake -S "$LC" -B "$BLD" "${FLAGS[@]}" >"$OUTDIR/configure.log" 2>&1 ||
    { tail -30 "$OUTDIR/configure.log"; die "configure failed (log: $OUTDIR/configure.log)"; }
fi
echo "== cmake --build $BLD -j$JOBS --target ${TARGETS[*]}"
cmake --build "$BLD" -j"$JOBS" --target "${TARGETS[@]}" >"$OUTDIR/build.log" 2>&1 ||
  { tail -30 "$OUTDIR/build.log"; die "build failed (log: $OUTDIR/build.log)"; }

LIBDIR=$BLD/bin
[ -f "$LIBDIR/libggml.so" ] || LIBDIR=$(dirname "$(find "$BLD" -name 'libggml.so' | head -1)")
[ -f "$LIBDIR/libllama.so" ] || die "no libllama.so under $BLD"

# 4. The harnesses: ggml's flash attention and llama's greedy ids (public headers only), and
# attn's decode (public attn.h, libattn from the repo's own build/).
mkdir -p "$HB"
cc "${CFLAGS_H[@]}" -I"$LC/ggml/include" "$ROOT/bench/llamacpp/fa_harness.c" \
   -L"$LIBDIR" -Wl,-rpath,"$LIBDIR" -lggml -lggml-base -lggml-cpu -lm -o "$HB/fa_harness"
cc "${CFLAGS_H[@]}" -I"$LC/include" -I"$LC/ggml/include" "$ROOT/bench/llamacpp/llama_greedy.c" \
   -L"$LIBDIR" -Wl,-rpath,"$LIBDIR" -lllama -lggml -lggml-base -o "$HB/llama_greedy"

echo "== attn (attn_static, attn_cli) and its decode harness"
build_attn

ccv=$(cc --version | head -1)
cat >"$OUTDIR/info.txt" <<INFO
llama-cpp-python sdist: $pyver
llama.cpp commit: $commit ($cdate)
llama.cpp configure: ${FLAGS[*]}
llama.cpp compiler: $(grep -m1 'CMAKE_CXX_COMPILER:' "$BLD/CMakeCache.txt" | cut -d= -f2) ($(c++ --version | head -1))
llama.cpp source: $LC
llama.cpp binaries: $LIBDIR
harness compiler: $ccv, ${CFLAGS_H[*]}
INFO
echo "== done"
cat "$OUTDIR/info.txt"
