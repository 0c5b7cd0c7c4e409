# Two commands from a fresh clone: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint unit unit-serial fmt schemas bench clean

# The C source too: pip builds healer/schemas/_framec.c into the tree (the controller's frame decoder).
$(STAMP): pyproject.toml healer/schemas/_framec.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/healer demo

test: lint unit

lint: $(STAMP)
	$(BIN)/ruff check healer tests benchmarks
	$(BIN)/ruff format --check healer tests benchmarks
	$(BIN)/mypy healer tests

# The suite in 4 worker processes (pytest-xdist; most tests wait on real servers, not the CPU). Every
# test starts its own servers on free ports, so any split works; `make unit-serial` runs it in one.
WORKERS ?= 4

unit: $(STAMP)
	$(BIN)/pytest -q -n $(WORKERS) --dist worksteal

unit-serial: $(STAMP)
	$(BIN)/pytest -q

fmt: $(STAMP)
	$(BIN)/ruff format healer tests benchmarks
	$(BIN)/ruff check --fix healer tests benchmarks

schemas: $(STAMP)
	$(BIN)/healer schema export --out docs/schemas
	$(BIN)/healer rules schema --out docs/schemas/rules.v1.json
	$(BIN)/healer config docs > docs/configuration.md
	$(BIN)/python -m healer.rules.packdoc rules docs/rules.md
	$(BIN)/python -m healer.rules.configmap rules deploy/kubernetes/rules-configmap.yaml
	$(BIN)/python -m healer.sizing docs/deployment.md

bench: $(STAMP)
	$(BIN)/python benchmarks/agent_cost.py
	$(BIN)/python benchmarks/sim_throughput.py --quick
	$(BIN)/python benchmarks/rules_eval.py
	$(BIN)/python benchmarks/anomaly_cost.py
	$(BIN)/healer bench controller

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
