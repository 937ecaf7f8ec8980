# faro-serve developer entry points. `make run` and `make test` install everything they need
# into .venv first (see README "Install").
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.faro-installed

.PHONY: install system-deps lock run serve test bench forecaster clean

install: $(STAMP)

# constraints.txt pins a torch/torchvision pair that works together on CPU (see the file).
# requirements.lock pins every dependency, transitive ones included (make lock refreshes it).
$(STAMP): pyproject.toml constraints.txt requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -c requirements.lock -e ".[dev]"
	@$(MAKE) --no-print-directory system-deps
	@touch $(STAMP)

# Debian packages that tests use for real components: a Prometheus server (the metrics
# test) and a headless Chromium (the status page test). Installed with apt-get when this
# machine has it and we are root; otherwise those tests skip and say why.
SYSTEM_DEPS := prometheus chromium
system-deps:
	@missing=""; for p in $(SYSTEM_DEPS); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "note: not installing$$missing (needs root and apt-get): the tests that use them skip"; exit 0; fi; \
	echo "installing Debian packages:$$missing"; \
	(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends $$missing) >/dev/null 2>&1 \
		|| echo "note: apt-get could not install$$missing: the tests that use them skip"

# Refresh requirements.lock: every dependency of pyproject.toml (dev extras included),
# resolved anew by uv for Python 3.10+ on any platform, within constraints.txt. Commit the
# result; `make install` then gives every machine the same versions. Pass UV_EXCLUDE_NEWER=
# <date> to resolve as of a past day.
UV_VERSION := 0.13.8
lock:
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet uv==$(UV_VERSION)
	.lock-venv/bin/uv pip compile pyproject.toml --extra dev -c constraints.txt --universal \
		--python-version 3.10 --custom-compile-command "make lock" --upgrade --quiet -o requirements.lock
	rm -rf .lock-venv

# The demo: Ray + serve_config.yaml, a real trace slice replayed with a live table, a report
# under runs/demo-<time>/ (faro-serve demo --help; Ctrl-C stops early and shuts down).
run: install
	$(BIN)/faro-serve demo

# Just serve serve_config.yaml; Ctrl-C drains (admitted requests answered), then stops.
serve: install
	$(BIN)/faro-serve run serve_config.yaml

# The offline tests (pure code, no Ray: CPU-bound) on two pytest-xdist workers, then the
# live ones (`slow`: a real Ray cluster, mostly waiting on real time) one at a time, alone
# on the machine: live tests time real requests, so nothing else may compete with them.
# Both phases always run; make fails if either fails.
test: install
	@st=0; \
	$(BIN)/python -m pytest -m "not slow" -n 2 || st=$$?; \
	$(BIN)/python -m pytest -m slow || { rc=$$?; [ $$st -ne 0 ] || st=$$rc; }; \
	exit $$st

bench: install
	$(BIN)/python -m bench.solver_bench

# The forecaster shipped in the package (faro_serve/data/forecaster), trained again from the
# shared traces with its fixed seed (bench/train_shipped_forecaster.py, docs/forecasting.md).
forecaster: install
	$(BIN)/python -m bench.train_shipped_forecaster

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis bench/results
