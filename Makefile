# The two commands the README gives: `make demo` (the main job) and `make test` (the test suite).
# TORCH picks the torch build installed before shardwise (pip's pick for torch 2.13.0 by default).
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python

# The torch asked for, noted: another one set up again.
$(VENV)/.torch: FORCE
	@mkdir -p $(VENV)
	@echo '$(TORCH)' | cmp -s - $@ || echo '$(TORCH)' > $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[test,integrations,bench,s3]'
	touch $@

.PHONY: demo plan test FORCE
FORCE:

demo: $(VENV)/.installed
	$(VENV)/bin/shardwise demo

plan: $(VENV)/.installed
	$(VENV)/bin/shardwise plan

test: $(VENV)/.installed
	$(PY) -m pytest -q
