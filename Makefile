PYTHON ?= python

.PHONY: install test test-slow lint bench demo

install:
	$(PYTHON) -m pip install -e '.[dev]'

test:
	$(PYTHON) -m pytest

test-slow:
	$(PYTHON) -m pytest -m slow

lint:
	$(PYTHON) -m ruff check src tests benchmarks run.py
	$(PYTHON) -m ruff format --check src tests benchmarks run.py

bench:
	cd benchmarks && $(PYTHON) engine_overhead.py

demo:
	$(PYTHON) run.py
