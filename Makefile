# Developer shortcuts. The README's two commands work without make.
PY ?= .venv/bin/python

.PHONY: install lint test unit e2e bench run demo
install:
	python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]'
lint:
	$(PY) -m ruff check . && $(PY) -m ruff format --check . && $(PY) -m mypy shared training_server prediction_server coalescer stack
test:
	$(PY) -m pytest
unit:
	$(PY) -m pytest tests/unit tests/service
e2e:
	$(PY) -m pytest -m e2e
bench:
	$(PY) bench/run_all.py
run:
	$(PY) -m stack
demo:
	$(PY) -m stack --demo
