# graphex: every target sets up what it needs on a fresh machine.
#   make demo    build, then run the shipped decoder with graphex vs eager
#   make test    build, then the C++ (ctest) and Python (pytest) tests, then the bitwise ones again under
#                ATEN_CPU_CAPABILITY=default (make test-default-isa); installs what they need first (gtest,
#                clang-19 + libFuzzer, bench/requirements.txt), so none skips for a missing tool
#   make bench   build, then eager / TorchScript / ONNX Runtime / inductor / aot_eager / graphex (exact, fused,
#                cache_compile) side by side at 1 and 2 threads, on this repo's decoder and chain and on workloads
#                users run (transformers Llama / GPT-2 decode and prefill, BERT, a conv net, PyTorch's attention
#                blocks); installs bench/requirements.txt (transformers, onnxruntime, onnx, onnxscript) first
#   make opinfo  build, then every OpInfo through graphex vs eager, classified (sweeps/results/opinfo.md)
#   make fuzz    build, then 10,000 random programs through graphex vs eager, failures shrunk to reproducers
#   make fusion-coverage  build, then fused mode on 40 decoder spellings and 9 transformers decoders: what fired, tokens
#   make fusion-patterns  build, then trace fused mode's built-in patterns and write this torch's shipped graphs
#                         (graphex/fusion/serialized/torch_X_Y.py; run it after changing a pattern, and commit the file)
#   make soak    build, then 100,000 replays with memory flat and 4 threads on one model
#   make fuzz-loader  build, then libFuzzer on the artifact loader (FUZZ_LOADER_S seconds), corpus merged
#   make deploy-demo  build, export the shipped decoder, build examples/deploy (C++) against the
#                     installed package, generate tokens in C++ and compare them with Python's
#   make docs    the documentation site (docs/, MkDocs Material) into build/docs, offline; open build/docs/index.html
#   make docs-update  regenerate the generated blocks of README.md and docs/ (the options table, ...)
#   make gpu-check  on a GPU machine: build against its torch, then the device-graph checks and decode benchmark on cuda
#   make test-torch TORCH=2.14.1   the same build and tests against another torch, in its own
#                                 venv (.venv-torch2.14.1) and build folder (build/torch2.14.1)
# Variables: PYTHON (interpreter that creates .venv), TESTS (pytest paths, default tests/python), TEST_JOBS (pytest
# workers, default: the cores, at most 4), PYTEST_ARGS, BENCH_ARGS, TORCH.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
BUILD_DIR := build/py
STAMP_VENV := $(VENV)/.graphex-venv
STAMP_SYS := build/.graphex-system-deps
STAMP_FUZZ := build/.graphex-fuzz-deps
STAMP_BENCH := $(VENV)/.graphex-bench-deps
TORCH_VERSION := 2.13.0

.PHONY: all build schema demo test test-cpp test-python test-default-isa test-torch gpu-check bench soak clean distclean

all: build

# $(call apt_install,PACKAGES): apt-get install PACKAGES (Debian), with sudo unless root; a shell command.
apt_install = (SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); $$SUDO apt-get update -qq && \
  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(1) >/dev/null)

# System packages (Debian): flatc and the FlatBuffers headers for the program format (required),
# gtest for the C++ tests, ccache for fast rebuilds.
$(STAMP_SYS):
	@mkdir -p build
	@if ! command -v flatc >/dev/null || [ ! -f /usr/include/flatbuffers/flatbuffers.h ]; then \
	  echo "graphex: installing flatbuffers-compiler and libflatbuffers-dev (Debian)"; \
	  $(call apt_install,flatbuffers-compiler libflatbuffers-dev) \
	    || { echo "graphex: could not install flatbuffers-compiler libflatbuffers-dev"; exit 1; }; \
	fi
	@if [ ! -f /usr/lib/x86_64-linux-gnu/libgtest.a ] && [ ! -f /usr/lib/aarch64-linux-gnu/libgtest.a ] && [ ! -f /usr/lib/libgtest.a ]; then \
	  echo "graphex: installing libgtest-dev and ccache (Debian)"; \
	  $(call apt_install,libgtest-dev ccache) \
	    || echo "graphex: WARNING: could not install libgtest-dev; C++ unit tests will not be built"; \
	fi
	@touch $@

# clang-19 and libFuzzer (Debian), for the libFuzzer test of the loader (tests/python/test_fuzz_loader.py, which
# skips without clang++-19) and make fuzz-loader: make test installs them, as it does gtest.
$(STAMP_FUZZ):
	@mkdir -p build
	@if ! command -v clang++-19 >/dev/null || ! dpkg -s libfuzzer-19-dev >/dev/null 2>&1; then \
	  echo "graphex: installing clang-19 and libfuzzer-19-dev (Debian)"; \
	  $(call apt_install,clang-19 libfuzzer-19-dev) \
	    || { echo "graphex: could not install clang-19 libfuzzer-19-dev (the libFuzzer test needs them)"; exit 1; }; \
	fi
	@touch $@

# graphex/fb/: flatc's Python code for the program schema (committed; C++'s is generated at build time),
# importing the FlatBuffers runtime vendored in graphex/_vendor (graphex's runtime dependency stays torch alone).
schema:
	rm -rf build/fbgen && flatc --python -o build/fbgen csrc/schema/program.fbs
	rm -rf graphex/fb && cp -r build/fbgen/graphex/fb graphex/fb
	sed -i 's/^import flatbuffers$$/from graphex._vendor import flatbuffers/; s/^from flatbuffers\.compat import/from graphex._vendor.flatbuffers.compat import/' graphex/fb/*.py

# The virtual environment: torch pinned exactly (pip takes the CPU build on this disk).
$(STAMP_VENV): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==$(TORCH_VERSION)
	$(PIP) install -q "scikit-build-core>=0.10" "pybind11>=2.12" ninja cmake pytest pytest-xdist numpy matplotlib expecttest
	@touch $@

# The C++ core, the Python extension and the C++ tests, built against the torch in .venv.
build: $(STAMP_SYS) $(STAMP_VENV)
	$(PIP) install -q --no-build-isolation --no-deps -e .

# The benchmark's dependencies (bench/requirements.txt: transformers, onnxruntime, onnx, onnxscript) and the test
# tools (tests/requirements.txt: import-linter), pinned; for make bench and the tests only. About 30 s.
$(STAMP_BENCH): $(STAMP_VENV) bench/requirements.txt tests/requirements.txt
	$(PIP) install -q -r bench/requirements.txt -r tests/requirements.txt
	@touch $@

# The suite, then its bitwise subset once more on ATen's portable kernels (test-default-isa), last.
test: build $(STAMP_BENCH) $(STAMP_FUZZ) test-cpp test-python
	@$(MAKE) --no-print-directory test-default-isa

test-cpp:
	@if [ -x $(BUILD_DIR)/graphex_cpp_tests ]; then \
	  cd $(BUILD_DIR) && ctest --output-on-failure --timeout 120 -j $(TEST_JOBS); \
	else echo "graphex: C++ tests were not built (no gtest)"; exit 1; fi

# Tests run in TEST_JOBS worker processes (pytest-xdist), one test file per worker at a time (--dist loadfile:
# a module's shared fixtures, e.g. triage's batch of runs, are built once). Most of the suite's time is fresh
# interpreters compiling (cache_compile's cross-process tests, the tools, C++ extension builds), which overlap.
TESTS ?= tests/python
TEST_JOBS ?= $(shell n=$$(nproc); [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST := -m pytest -q -n $(TEST_JOBS) --dist loadfile
test-python:
	$(PY) $(PYTEST) $(TESTS) $(PYTEST_ARGS)

# The bitwise graphex-vs-eager tests marked `default_isa` (the engine, the model zoo and decoder, CSE, reinplacing,
# lowering edge cases, kept-whole kernels) once more with ATen's CPU kernels forced to the portable path
# (ATEN_CPU_CAPABILITY=default; the suite above runs on this CPU's best, e.g. avx512): a result that is bit for bit
# only on one kernel path shows here. Under a minute.
test-default-isa:
	ATEN_CPU_CAPABILITY=default $(PY) $(PYTEST) $(TESTS) -m default_isa $(PYTEST_ARGS)

# Another torch, side by side with the default one: its own venv and build folder.
TORCH ?= $(TORCH_VERSION)
ALT_VENV := .venv-torch$(TORCH)
ALT_PY := $(ALT_VENV)/bin/python
ALT_BUILD := build/torch$(TORCH)
test-torch: $(STAMP_SYS)
	@test -x $(ALT_PY) || $(PYTHON) -m venv $(ALT_VENV)
	@$(ALT_PY) -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$(TORCH)')" 2>/dev/null || \
	  $(ALT_PY) -m pip install -q torch==$(TORCH)
	$(ALT_PY) -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12" ninja cmake pytest pytest-xdist numpy matplotlib expecttest \
	  -r bench/requirements.txt -r tests/requirements.txt
	CUDA_HOME=$${CUDA_HOME:-/usr/local/cuda} $(ALT_PY) -m pip install -q --no-build-isolation --no-deps \
	  -C build-dir=$(ALT_BUILD) $$($(ALT_PY) scripts/cmake_args_for_torch.py) -e .
	cd $(ALT_BUILD) && ctest --output-on-failure --timeout 120
	GRAPHEX_BUILD_DIR=$(CURDIR)/$(ALT_BUILD) $(ALT_PY) $(PYTEST) $(TESTS) $(PYTEST_ARGS)

# On a GPU machine (torch with CUDA already installed, no package registry needed): build graphex against that torch,
# then scripts/gpu_check.py: the device-graph checks on cuda (one replay per decode step, bit for bit eager; held
# outputs; a moved KV cache; side streams as fork/join; a 1-GPU NCCL group; tests/python/test_device_graphs.py with
# GRAPHEX_TEST_DEVICE=cuda when pytest is there) and the decode-step benchmark (eager, reduce-overhead, inductor,
# graphex), written to gpu_check.json. About 8 minutes. Without a GPU: python scripts/gpu_check.py --device gxsim
# --quick (make test runs its checks on gxsim).
GPU_PY ?= python3
gpu-check:
	$(GPU_PY) -m pip install -q --no-build-isolation --no-deps -e .
	$(GPU_PY) scripts/gpu_check.py $(GPU_CHECK_ARGS)

# Every OpInfo (float32/float16/bfloat16/int64, static and dynamic) through graphex, classified against eager and
# aot_eager: sweeps/results/opinfo.{md,json}. OPINFO_ARGS e.g. --ops add,mul or --shard 0/10 (python -m sweeps.opinfo -h).
opinfo: build
	$(PY) -m sweeps.opinfo $(OPINFO_ARGS)

# FUZZ_COUNT random programs from FUZZ_SEED through graphex vs eager, bit for bit; each failure shrunk to
# sweeps/results/fuzz/repro_SEED.py. FUZZ_ARGS: python -m sweeps.fuzz -h.
FUZZ_SEED ?= 0
FUZZ_COUNT ?= 10000
fuzz: build
	$(PY) -m sweeps.fuzz --seed $(FUZZ_SEED) --count $(FUZZ_COUNT) --batch 4 $(FUZZ_ARGS)

# Fused mode on decoders spelled the ways model code spells them (sweeps/coverage_decoder.py: 40 spellings) and on
# transformers decoders from configs (fp32 and bf16): which kernels fired, tokens equal to eager over 16 steps, the
# largest logit difference; writes sweeps/results/fusion_coverage.{md,json}. About 2 minutes. COVERAGE_ARGS:
# python -m sweeps.fusion_coverage -h. make test runs a subset (tests/python/test_fusion_coverage.py).
fusion-coverage: build $(STAMP_BENCH)
	@mkdir -p sweeps/results
	$(PY) -m sweeps.fusion_coverage --markdown sweeps/results/fusion_coverage.md --json sweeps/results/fusion_coverage.json $(COVERAGE_ARGS)

# The built-in patterns' search graphs, traced once and shipped as Python source (Note [Built-in patterns ship as
# traced graphs], graphex/fusion/serialized/__init__.py): fused mode's first compile reads them instead of tracing
# ~3 s of search functions. For another torch, after make test-torch TORCH=2.14.1: .venv-torch2.14.1/bin/python -m
# graphex.fusion.serialized --write. tests/python/test_fusion_serialized.py fails while the file is stale. About 15 s.
fusion-patterns: build
	$(PY) -m graphex.fusion.serialized --write

.PHONY: opinfo fuzz fusion-coverage fusion-patterns

demo: build
	$(PY) examples/demo.py

# examples/deploy: export (Python), install the graphex package, build decode.cpp against it, run it,
# compare its tokens with eager PyTorch's (DEPLOY_ARGS: python -m examples.deploy.demo -h).
deploy-demo: build
	$(PY) -m examples.deploy.demo $(DEPLOY_ARGS)

.PHONY: deploy-demo

# libFuzzer on graphex::Module::load (tests/fuzz): clang-19 + libFuzzer (installed if missing), graphex's core
# built with AddressSanitizer into build/fuzz, run FUZZ_LOADER_S seconds, new inputs merged into tests/fuzz/corpus.
FUZZ_LOADER_S ?= 600
fuzz-loader: build $(STAMP_FUZZ)
	cmake -S tests/fuzz -B build/fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++-19 $$(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=$$(command -v ccache)) \
	  -DCMAKE_PREFIX_PATH=$$($(PY) -c "import torch; print(torch.utils.cmake_prefix_path)")
	cmake --build build/fuzz
	rm -rf build/fuzz/found && mkdir -p build/fuzz/found
	build/fuzz/fuzz_load build/fuzz/found tests/fuzz/corpus -max_total_time=$(FUZZ_LOADER_S) -timeout=10 \
	  -rss_limit_mb=4096 -artifact_prefix=build/fuzz/crash-
	build/fuzz/fuzz_load -merge=1 tests/fuzz/corpus build/fuzz/found

.PHONY: fuzz-loader

bench: build $(STAMP_BENCH)
	$(PY) -m bench.run $(BENCH_ARGS)

# 100,000 decode steps with resident memory flat, then 4 threads on one compiled model (SOAK_ARGS).
soak: build
	$(PY) -m bench.soak $(SOAK_ARGS)

# The documentation site, offline, into build/docs (mkdocs.yml). --strict: a broken link or a page out of the nav is
# an error (make test checks the same, tests/python/test_docs.py).
docs: $(STAMP_BENCH)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -f mkdocs.yml -d build/docs

# The blocks of README.md and docs/ that a command writes (<!-- generated by: CMD -->), written anew.
docs-update: build
	$(PY) scripts/update_docs.py

.PHONY: docs docs-update

clean:
	rm -rf build

distclean: clean
	rm -rf $(VENV) .venv-torch* .graphex_cache
