#!/usr/bin/env bash
# Hash A/B of the MPI layers: attn forward and attn grad under mpirun -np 2
# with --context-parallel ring|zigzag|ulysses (modules mha and gpt2), one
# CLI binary against another, every output file compared byte for byte.
# usage: bench/ab_mpi.sh OLD_ATTN NEW_ATTN tests/mpi/run_mpi.sh
set -u
old=$1 new=$2 run=$3
d=$(mktemp -d)
/usr/bin/python3 - "$d" <<'PY'
import sys, numpy as np
d = sys.argv[1]
rng = np.random.default_rng(16)
np.save(f"{d}/x_mha.npy", rng.standard_normal((2, 37, 20)).astype(np.float32))
np.save(f"{d}/x_gpt2.npy", rng.standard_normal((41, 24)).astype(np.float32))
np.save(f"{d}/dy_mha.npy", rng.standard_normal((2, 37, 36)).astype(np.float32))
np.save(f"{d}/dy_gpt2.npy", rng.standard_normal((41, 24)).astype(np.float32))
PY
same=0 diff=0
for module in mha gpt2; do
  if [ $module = mha ]; then opts="--heads 6 --d-out 36 --qkv-bias"; else opts="--heads 6"; fi
  for mode in ring zigzag ulysses; do
    for which in old new; do
      bin=$old; [ $which = new ] && bin=$new
      bash "$run" 2 "$bin" forward --module $module --input $d/x_$module.npy --threads 1 $opts \
        --output $d/y_${module}_${mode}_$which.npy --context-parallel $mode >/dev/null 2>&1
      bash "$run" 2 "$bin" grad --module $module --input $d/x_$module.npy --threads 1 $opts \
        --grad-output $d/dy_$module.npy --out $d/g_${module}_${mode}_$which \
        --context-parallel $mode >/dev/null 2>&1
    done
    for f in y_${module}_${mode}; do
      if cmp -s $d/${f}_old.npy $d/${f}_new.npy; then r=SAME; same=$((same+1)); else r=DIFF; diff=$((diff+1)); fi
      echo "forward $module $mode: $r ($(sha256sum < $d/${f}_new.npy | cut -c1-16))"
    done
    for g in $(ls $d/g_${module}_${mode}_new); do
      if cmp -s $d/g_${module}_${mode}_old/$g $d/g_${module}_${mode}_new/$g; then r=SAME; same=$((same+1)); else r=DIFF; diff=$((diff+1)); fi
      echo "grad $module $mode $g: $r"
    done
  done
done
echo "mpi A/B: $same SAME, $diff DIFF"
rm -rf "$d"
