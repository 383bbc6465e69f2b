# The two entry points a new user needs (see README):
#   make demo   set up, predict Fig. 1's memory at full scale, measure CPU times at small sizes, render both
#   make test   set up, run the test suite: 28 min 3 s from a clean clone on 2 cores (Xeon, AVX-512, load ~1.5)
# and, for the development loop, `make test-fast`: the tests not marked slow (no child processes
# beyond a few, no Slurm cluster), 8 min 34 s on the same 2 cores. `make figures` redraws
# the figures of README.md and docs/ from the CSVs in docs/figures/data/; `make check-figures` fails when they
# are not what `topk-bench plot` draws today (tests/report/test_docs_figures.py runs the same check). `make docs`
# builds the documentation site (mkdocs.yml, docs/) into site/, failing on any broken link or anchor. `make lint`:
# ruff (lint and format check) and mypy, as CI runs them (pyproject.toml has their settings).
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: setup demo test test-fast figures check-figures docs lint
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV) dev,pretrained
	touch $@

# After set-up: 61 s on 2 cores of an AVX-512-BF16 EPYC at a load of 0.6 to 0.8 per core, its two runs 2 min 17 s
# there at 1.6 to 2.4 per core; set-up not timed (README, "Quick start").
demo: setup
	$(BIN)/topk-bench run suites/demo_memory.toml --predict --out results/demo
	$(BIN)/topk-bench run suites/demo_time.toml --device cpu --out results/demo
	$(BIN)/topk-bench plot results/demo --out plots/demo
	@echo "figures: plots/demo/. To run topk-bench yourself (README), in each new shell: source $(VENV)/bin/activate"

test: setup
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not slow" -q

figures: setup
	$(BIN)/python scripts/docs_figures.py

check-figures: setup
	$(BIN)/python scripts/docs_figures.py --check

docs: setup
	$(BIN)/mkdocs build --strict --site-dir site

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
