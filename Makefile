# StreamRec: one-command entry points. `make demo` and `make test` install what is missing
# first (Debian packages, the .venv, the project with its compiled extension).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
APT_PACKAGES := redis-server prometheus
SOURCES := $(shell find services -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' 2>/dev/null)

.PHONY: install system-deps test test-fast demo demo-sampler bench lint format clean

install: $(STAMP)

# Debian packages the tests and the demo run for real (redis-server, prometheus).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml setup.py $(SOURCES)
	@$(MAKE) --no-print-directory system-deps
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	# torch first, pinned (a CPU build at hand); then the project against it.
	$(PIP) install -q torch==2.13.0 ninja
	$(PIP) install -q -e '.[test]' --no-build-isolation
	touch $(STAMP)

test: install
	$(PY) -m pytest -q tests

test-fast: install
	$(PY) -m pytest -q -m "not slow" tests

demo: install
	$(VENV)/bin/streamrec up

demo-sampler: install
	$(PY) -m streamrec.sampler.demo

bench: install
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# ruff, the configured mypy and the import contracts (.importlinter). mypy and import-linter
# read the packages from a tree of symlinks (tools/source_tree.py: the editable install's
# import hook is invisible to static tools).
lint: install
	$(VENV)/bin/ruff check services tests bench tools
	$(VENV)/bin/ruff format --check services tests bench tools
	$(PY) tools/source_tree.py build/srctree >/dev/null
	cd build/srctree && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p streamrec
	PYTHONPATH=build/srctree $(VENV)/bin/lint-imports

format: install
	$(VENV)/bin/ruff format services tests bench tools
	$(VENV)/bin/ruff check --fix services tests bench tools

clean:
	rm -rf build *.egg-info $(VENV) .pytest_cache .ruff_cache
	find services -name '*.so' -delete
