# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create and use .venv in the repository root unless a virtual environment is active.

PYTHON ?= python3
ifdef VIRTUAL_ENV
ENV := $(VIRTUAL_ENV)
else
ENV := $(CURDIR)/.venv
endif
BIN := $(ENV)/bin
STAMP := $(ENV)/.tvm-stitch-installed

.PHONY: demo test lint install

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(ENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,models]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/tvm-stitch demo --report $(CURDIR)/report.html

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -p no:cacheprovider -n logical --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check .
