# Entry points (see README): `make demo`, `make test` (everything, as CI runs it),
# `make test-fast` (the tests that load no GGUF model: pytest -m "not model"), `make test-rpc` (RPC build + its tests);
# `make lint` (ruff, mypy, mkdocs build --strict) in CI; `make docs`, `make docs-serve` and
# `make docs-ref` (regenerate docs/reference/cli.md and http.md's field table from the code).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: demo test test-fast test-rpc install dev lint docs docs-serve docs-ref clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# llama-cpp-python compiles llama.cpp on install (about 5 minutes on 2 cores; pip caches the wheel).
install: $(PY)
	$(PY) -m pip install --quiet -e .

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

dev: $(STAMP)

demo: install
	$(VENV)/bin/specgen run -n 128 "Once upon a time, in a small village by the sea, there lived"

# Everything, on two pytest-xdist workers. tests/conftest.py pins each worker to its own
# share of the CPUs, and llama.cpp's default thread count is that share: two llama.cpp
# processes on the same cores slow each other down 50-150x (spinning threads), on disjoint
# cores they do not. worksteal: an idle worker takes queued tests from the busy one.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist worksteal

# The tests on fakes and pure code: no model loaded (tests/conftest.py marks `model` every test
# that uses a model fixture), on two workers.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not model" -n 2 --dist worksteal

# Builds (once, cached in .rpc-build/) an RPC-enabled llama-cpp-python and ggml-rpc-server
# from the same llama.cpp sources into .venv-rpc, then runs the tests marked `rpc`.
test-rpc:
	PYTHON=$(PYTHON) scripts/build_rpc.sh .venv-rpc
	.venv-rpc/bin/python -m pytest -q -m rpc

lint: $(STAMP)
	$(VENV)/bin/ruff check specgen tests
	$(VENV)/bin/ruff format --check specgen tests
	$(VENV)/bin/mypy
	@# not --quiet: under it mkdocs 1.6 counts no warning, and --strict fails on none
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The documentation site (MkDocs Material, mkdocs.yml): built into site/, previewed on
# http://127.0.0.1:8000 with live reload.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# The command-line reference is generated from the Typer app, and the HTTP reference's table
# of request fields from specgen/server/fields.py; tests/test_docs_reference.py fails when
# the committed pages differ from what this writes.
docs-ref: $(STAMP)
	$(PY) -m specgen.cli.reference docs

clean:
	rm -rf $(VENV) .venv-rpc .rpc-build .pytest_cache site
