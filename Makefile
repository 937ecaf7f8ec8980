# faro-serve developer entry points. `make run` and `make test` install everything they need
# into .venv first (see README "Install").
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.faro-installed

.PHONY: install run serve test bench clean

install: $(STAMP)

# constraints.txt pins a torch/torchvision pair that works together on CPU (see the file).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

# The demo: Ray + serve_config.yaml, a real trace slice replayed with a live table, a report
# under runs/demo-<time>/ (faro-serve demo --help; Ctrl-C stops early and shuts down).
run: install
	$(BIN)/faro-serve demo

# Just serve serve_config.yaml (Ctrl-C stops).
serve: install
	$(BIN)/serve run serve_config.yaml

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench.solver_bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis bench/results
