# Two entry points for a fresh machine: `make chat` and `make test`. Each sets itself up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup chat test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

chat: setup
	$(BIN)/dflash-mlx chat

test: setup
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache
