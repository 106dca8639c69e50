# Wraps the CMake build. `make demo` and `make test` work on a fresh machine:
# they install what is missing first (scripts/ensure_deps.sh).
BUILD ?= build
NOCUDA_BUILD ?= build-nocuda
FUZZ_BUILD ?= build-fuzz
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
GPU_BUILD ?= build-gpu
JOBS ?= $(shell nproc)
# The library alone is CMake's default; these targets build the tests,
# examples and benchmarks too.
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=ON -DDSOPT_BUILD_TESTS=ON \
  -DDSOPT_BUILD_EXAMPLES=ON -DDSOPT_BUILD_BENCH=ON
# CUDA_ARCHS=90-real: compile the CUDA code for one architecture only (CI,
# which has no GPU, only checks that it compiles); default: CMakeLists.txt's.
CUDA_ARCHS ?=
CMAKE_FLAGS += $(if $(CUDA_ARCHS),-DCMAKE_CUDA_ARCHITECTURES="$(CUDA_ARCHS)")
MPI_ENV = OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

.PHONY: all deps build python install test test-prebuild test-c test-nocuda test-python test-torch test-frameworks test-rust test-install test-fuzz test-sanitize test-docs test-gpu docs demo demo-c bench bench-gpu clean

all: build

deps:
	@scripts/ensure_deps.sh

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

# The cffi extension of the Python binding, against $(BUILD)/libdsopt.so.
python: build
	DSOPT_LIBRARY_DIR=$(abspath $(BUILD)) python3 bindings/python/dsopt/_ffi_build.py

# The C tests also run against a build without CUDA: test-sanitize's, whose
# ASan build has CUDA off (test-nocuda does the same in Release, alone).
# test-prebuild first: what the last targets need is made in the
# background while the others run.
test: test-prebuild test-docs test-c test-python test-torch test-frameworks test-rust test-install test-fuzz test-sanitize

# The framework venv and the fuzz and sanitizer trees, built in the
# background at idle priority on the cores the tests leave idle
# (tests/prebuild.sh); test-frameworks, test-fuzz and test-sanitize wait for
# them, or build what is missing themselves.
test-prebuild: deps
	@tests/prebuild.sh $$PPID $(FUZZ_BUILD) $(ASAN_BUILD) $(TSAN_BUILD)

test-c: build
	cd $(BUILD) && $(MPI_ENV) ctest --output-on-failure --timeout 300

# The same C tests against a build without CUDA (EUNSUPPORTED paths).
test-nocuda: deps
	cmake -S . -B $(NOCUDA_BUILD) $(CMAKE_FLAGS) -DDSOPT_WITH_CUDA=OFF -DDSOPT_BUILD_BENCH=OFF
	cmake --build $(NOCUDA_BUILD) -j$(JOBS)
	cd $(NOCUDA_BUILD) && $(MPI_ENV) ctest --output-on-failure --timeout 300

test-python: python
	DSOPT_LIBRARY_DIR=$(abspath $(BUILD)) $(MPI_ENV) python3 -m pytest tests/python -q

# dsopt.torch under a Python that has torch (python3, else Debian's
# /usr/bin/python3 with python3-torch); skips when there is none.
test-torch: python
	tests/python/run_torch_tests.sh $(BUILD)

# The integrations with PyPI's torch, transformers and lightning
# (dsopt.hf.Trainer, dsopt.lightning.DsoptStrategy, DDP with
# dsopt.torch.ddp_comm_hook, torch.compile, parameters moved or cast), in the
# venv of scripts/framework_venv.sh (created on first use: a large download).
test-frameworks: python
	$(MPI_ENV) tests/python/run_framework_tests.sh $(BUILD)

# The Rust binding's tests and examples/rust, offline, against $(BUILD)
# (skips without cargo; as root installs Debian's bindgen crate if missing).
test-rust: build
	tests/rust/test_rust.sh $(BUILD)

# cmake --install into a temporary prefix, then a C program built against the
# installed copy through find_package(dsopt) and through pkg-config; and the
# Python wheel (pip wheel from a copy of the repository, installed into a
# fresh venv after the copy is deleted).
test-install: build
	tests/install/test_install.sh $(BUILD)
	tests/install/test_wheel.sh

# The libFuzzer targets (tests/fuzz) in $(FUZZ_BUILD), clang with ASan and
# UBSan, 40 s each (FUZZ_SECONDS) on a copy of the checked-in corpus; fails on
# any crash. Skips with a message when clang or libFuzzer is missing.
test-fuzz: deps
	tests/fuzz/run_fuzz.sh $(FUZZ_BUILD)

# The C tests under the sanitizers (tests/sanitize/run_sanitizers.sh), CUDA
# off, GCC: ASan + UBSan + LeakSanitizer over every CTest test of
# $(ASAN_BUILD) (mpirun runs included; tests/sanitize/lsan.supp holds Open
# MPI's own leaks), and ThreadSanitizer over test_threads_many_handles in
# $(TSAN_BUILD).
test-sanitize: deps
	JOBS=$(JOBS) tests/sanitize/run_sanitizers.sh $(ASAN_BUILD) $(TSAN_BUILD)

# The documentation site (docs/, mkdocs.yml) into build-docs/site; strict:
# a broken link, or a page missing from the navigation, fails it. Also the
# citations of the design documents in the code (tests/scripts/
# check_design_citations.py).
docs:
	@python3 -c "import mkdocs" 2>/dev/null || python3 -m pip install -q --root-user-action=ignore mkdocs
	python3 -m mkdocs build --strict --quiet

test-docs: docs
	python3 tests/scripts/check_design_citations.py

# On a machine with an NVIDIA GPU (not part of `make test`): builds with
# CUDA for that GPU in $(GPU_BUILD), runs the C GPU tests, the Python CUDA
# tests (dsopt.torch on CUDA parameters at 1 and 2 processes over gloo,
# mpi4py and NCCL; the DDP hook on a CUDA model) and the GPU benchmark;
# fails when the GPU, CUDA or torch's CUDA is missing. DEPS=DIR: the
# packages of scripts/offline_deps.sh for a machine without registries.
test-gpu:
	tests/gpu/run_gpu_suite.sh $(GPU_BUILD)

# PREFIX=/usr/local by default: header, library, CMake package, dsopt.pc.
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

demo: python
	DSOPT_LIBRARY_DIR=$(abspath $(BUILD)) $(MPI_ENV) examples/python/run_demo.sh out/demo

# The C example alone (softmax regression, 1 process and 4 MPI ranks).
demo-c: build
	$(MPI_ENV) examples/run_demo.sh $(BUILD)

bench: python
	$(MPI_ENV) bench/run_benchmarks.sh $(BUILD)

# On a machine with an NVIDIA GPU: the CUDA steps against a device copy and
# against torch's fused AdamW, in $(GPU_BUILD) (built for that GPU if needed).
bench-gpu:
	bench/run_gpu_benchmarks.sh $(GPU_BUILD)

clean:
	rm -rf $(BUILD) $(NOCUDA_BUILD) $(FUZZ_BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(GPU_BUILD) build-prebuild
