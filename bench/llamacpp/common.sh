# Sourced by build.sh, compare.sh and model_compare.sh: where build.sh puts things, and
# the machine lines every results file starts with.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUTDIR=${LLAMACPP_DIR:-$ROOT/build/llamacpp}
HB=$OUTDIR/harness
INFO=$OUTDIR/info.txt

die() { echo "$(basename "$0"): $*" >&2; exit 1; }

need_build() {
  [ -f "$INFO" ] && [ -x "$HB/fa_harness" ] && [ -x "$HB/attn_decode" ] ||
    die "run bench/llamacpp/build.sh first (no $INFO or harnesses under $HB)"
  LC_COMMIT=$(sed -n 's/^llama.cpp commit: \([0-9a-f]*\).*/\1/p' "$INFO")
  LC_BIN=$(sed -n 's/^llama.cpp binaries: //p' "$INFO")
  LC_SRC=$(sed -n 's/^llama.cpp source: //p' "$INFO")
  [ -n "$LC_COMMIT" ] && [ -d "$LC_BIN" ] || die "$INFO lacks the commit or binaries line"
}

# The harnesses' C flags (build.sh records them in info.txt).
CFLAGS_H=(-O2 -std=c11 -Wall -Wextra -Werror)

# attn as the tree stands now: its library and CLI built (nothing to do when
# they are current) and the decode harness linked again against that library,
# so that the code a results file times is the commit (and changes) it names.
build_attn() {
  local b=${ATTN_BUILD:-$ROOT/build}
  if [ ! -f "$b/CMakeCache.txt" ]; then
    echo "== configuring attn in $b (Release)" >&2
    cmake -S "$ROOT" -B "$b" -DCMAKE_BUILD_TYPE=Release >/dev/null
  fi
  cmake --build "$b" -j"${JOBS:-2}" --target attn_static attn_cli >/dev/null ||
    die "attn's build failed (try 'make build')"
  [ -f "$b/libattn.a" ] || die "no $b/libattn.a after building attn_static"
  cc "${CFLAGS_H[@]}" -I"$ROOT/include" "$ROOT/bench/llamacpp/attn_decode.c" "$b/libattn.a" \
     -lm -lpthread -o "$HB/attn_decode"
}

# attn's commit, and whether the library's sources differ from it.
attn_commit() {
  local dirty=""
  [ -z "$(git -C "$ROOT" status --porcelain -- src include CMakeLists.txt)" ] ||
    dirty=" + uncommitted changes"
  echo "$(git -C "$ROOT" rev-parse --short HEAD)$dirty"
}

# bench/results/README.md's <cpu-kind>-<ncpu>: zen4, zen5, xeon, xeon-emr,
# xeon-skx, else the vendor and family.
machine_name() {
  local vendor family model n kind
  vendor=$(awk -F': ' '/^vendor_id/{print $2; exit}' /proc/cpuinfo)
  family=$(awk -F': ' '/^cpu family/{print $2; exit}' /proc/cpuinfo)
  model=$(awk -F': ' '/^model\t/{print $2; exit}' /proc/cpuinfo)
  n=$(nproc)
  case "$vendor/$family/$model" in
    AuthenticAMD/25/*) # family 25 is Zen 3 (models 0-15, 32-95) and Zen 4, as bench/peers.py
      if (( model < 16 || (model >= 32 && model < 96) )); then kind=zen3; else kind=zen4; fi ;;
    AuthenticAMD/26/*) kind=zen5 ;;
    GenuineIntel/6/167) kind=xeon ;;
    GenuineIntel/6/207) kind=xeon-emr ;;
    GenuineIntel/6/85) kind=xeon-skx ;;
    *) kind=$(echo "$vendor-$family" | tr 'A-Z' 'a-z') ;;
  esac
  echo "$kind-${n}vcpu"
}

# The results file's name: llama.cpp's commit, attn's and the machine, so
# that a run of another attn on the same llama.cpp and machine does not
# replace an earlier run's file.
results_name() { # prefix -> bench/results/<prefix>-<llama.cpp>-attn-<attn>-<machine>.txt
  echo "$ROOT/bench/results/$1-${LC_COMMIT:0:7}-attn-$(git -C "$ROOT" rev-parse --short=7 HEAD)-$(machine_name).txt"
}

machine_lines() {
  echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); $(awk -F': ' '/^vendor_id/{v=$2} /^cpu family/{f=$2} /^model\t/{m=$2} END{print v", family " f " model " m}' /proc/cpuinfo); $(nproc) logical CPUs"
  echo "CPU flags: $(grep -m1 -o 'avx512f\|avx512_bf16\|avx512_vnni\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  sed "s/^/build: /; s|$ROOT/||g" "$INFO"
  echo "attn: $(attn_commit) ($(git -C "$ROOT" log -1 --format=%s | cut -c1-80))"
  "$ROOT/build/attn" version 2>/dev/null | sed 's/^/attn version: /' || true
}

median() { sort -g | awk '{a[NR]=$1} END{if (NR==0) print ""; else if (NR%2) print a[(NR+1)/2]; else printf "%.4f\n", (a[NR/2]+a[NR/2+1])/2}'; }
