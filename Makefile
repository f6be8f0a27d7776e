# The two commands of the README, and a few more for development.
#   make demo   build, then run the seeds' walk-through (attn demo)
#   make test   install what the tests need, build, run the whole suite
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: bench-peers all demo test deps build sanitize fuzz clean install uninstall bench bench-deps

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

# The demo needs the attn command alone (and what builds it), not the tests
# and benchmarks.
demo:
	./scripts/install-deps.sh --build-only
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS) --target attn_cli
	./$(BUILD)/attn demo

deps:
	./scripts/install-deps.sh

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# attn-bench (bench/attn_bench.c, built by make, not installed): our kernels
# against OpenBLAS (loaded at run time, installed by
# scripts/install-bench-deps.sh). BENCH_ARGS passes options, e.g.
#   make bench BENCH_ARGS="--quick --threads 1"
bench-deps:
	./scripts/install-bench-deps.sh

bench: bench-deps build
	./$(BUILD)/attn-bench $(BENCH_ARGS)

# The suite under AddressSanitizer and UndefinedBehaviorSanitizer, with the
# allocation-failure hook built in, so that the sweep that fails every
# allocation in turn (test_alloc_failure) runs under the leak checker. The
# ctypes suites (by name, or labelled python_ctypes) load the library into
# Python, which ASan cannot join late, so they run in the plain build only;
# so do the learning runs (label slow), minutes long under the sanitizers,
# and the MPI tests (label mpi): Open MPI keeps allocations past
# MPI_Finalize, which LeakSanitizer reports as leaks. heatmap_without_libpng
# makes and runs a build of its own, not this one. Built at -O1: at -O0
# the kernels' intrinsics run unoptimised and slow the suite far more than
# -O1 adds to the build.
sanitize: deps
	cmake -S . -B $(BUILD)-sanitize -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG="-g -O1" \
	  -DATTN_SANITIZE=ON -DATTN_ALLOC_FAILURE_INJECTION=ON
	cmake --build $(BUILD)-sanitize -j $(JOBS)
	cd $(BUILD)-sanitize && ctest --output-on-failure -j $(JOBS) \
	  -E "conformance_vs_torch|grad_vs_torch|fast_vs_reference|numerics_vs_torch|heatmap_without_libpng" \
	  -LE "python_ctypes|slow|mpi"

# The libFuzzer targets (clang, ASan + UBSan), FUZZ_SECONDS each (CI runs
# them for 30 s): scripts/fuzz.sh prints executions and coverage.
FUZZ_SECONDS ?= 600
fuzz: deps
	nice -n 19 ./scripts/fuzz.sh $(FUZZ_SECONDS)

install: build
	cmake --install $(BUILD)

uninstall:
	cmake --build $(BUILD) --target uninstall

clean:
	rm -rf $(BUILD) $(BUILD)-sanitize build-fuzz build-tsan

# attn next to PyTorch 2.15 (PyPI, its CPU flash attention) in one process,
# on the same tensors (bench/peers.py); sets up the peer in .venv-peers first
# (scripts/setup-bench-peers.sh: ~2.7 GB, once). Arguments of peers.py go in
# PEERS_ARGS, e.g. make bench-peers PEERS_ARGS="--quick --runs 3"; to keep
# the figures, see bench/results/README.md.
PEERS_ARGS ?=
bench-peers: build
	./scripts/setup-bench-peers.sh
	.venv-peers/bin/python bench/peers.py ./$(BUILD)/attn $(PEERS_ARGS)
