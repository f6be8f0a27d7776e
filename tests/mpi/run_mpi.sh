#!/usr/bin/env bash
# run_mpi.sh NP PROGRAM [ARGS...] — runs PROGRAM on NP ranks of this machine
# (--oversubscribe: more ranks than cores), as root too. Exits 77, which
# CTest reports as skipped, with the reason, where the build has no MPI
# (PROGRAM "none") or mpirun is missing.
set -u
np=$1
shift
if [ "$1" = none ]; then
  echo "skipped: this build has no MPI (install Open MPI: scripts/install-deps.sh; then -DATTN_MPI=ON)"
  exit 77
fi
mpirun=${MPIEXEC:-$(command -v mpirun || true)}
if [ -z "$mpirun" ]; then
  echo "skipped: mpirun not found (install openmpi-bin: scripts/install-deps.sh)"
  exit 77
fi
# Open MPI refuses root unless told; CI runs as root
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# one machine: shared memory and loopback only, no probing for fabrics
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp} OMPI_MCA_btl_tcp_if_include=${OMPI_MCA_btl_tcp_if_include:-lo}
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
# a job whose rank fails is torn down at once: mpirun's default waits a
# second between its SIGTERM and SIGKILL to the others, even when they have
# already exited, and attn handles neither signal
export OMPI_MCA_odls_base_sigkill_timeout=${OMPI_MCA_odls_base_sigkill_timeout:-0}
exec "$mpirun" -np "$np" --oversubscribe "$@"
