# The two entry points a new user needs (see README):
#   make demo   set up, run the attention-layer suite on the CPU, render its figures
#   make test   set up, run the test suite
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: setup demo test
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV) dev,pretrained
	touch $@

demo: setup
	$(BIN)/topk-bench run suites/mha.toml --device cpu
	$(BIN)/topk-bench plot results/

test: setup
	$(BIN)/python -m pytest
