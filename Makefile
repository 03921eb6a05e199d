# The two commands the README gives: `make demo` (the main job) and `make test` (the test suite).
# TORCH picks the torch build installed before shardwise; the default is the CPU wheel.
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[test,integrations,bench,s3]'
	touch $@

.PHONY: demo plan test
demo: $(VENV)/.installed
	$(VENV)/bin/shardwise demo

plan: $(VENV)/.installed
	$(VENV)/bin/shardwise plan

test: $(VENV)/.installed
	$(PY) -m pytest -q
