# The two entry points a new user needs (see README):
#   make demo   set up, run the attention-layer suite on the CPU, render its figures
#   make test   set up, run the test suite
# and, for the development loop, `make test-fast`: the tests not marked slow (no child processes
# beyond a few, no Slurm cluster), in about a minute on 2 cores.
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: setup demo test test-fast
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV) dev,pretrained
	touch $@

demo: setup
	$(BIN)/topk-bench run suites/mha.toml --device cpu
	$(BIN)/topk-bench plot results/

test: setup
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not slow" -q
