# fedbench — `make table2` (default comparison on the offline data) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATASET ?= fashion-mnist
FMNIST_DIR := /usr/share/datasets/fashion-mnist
OFFLINE := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false

.PHONY: install data table2 table-ablation table-fednpr table-facmic table-fstcbdg coverage test test-fast regression-update bench bench-round bench-table2 lint clean-results

# A venv with the pinned torch pair from constraints.txt, then the package (editable) with dev tools.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt torch torchvision
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $@

# Debian's Fashion-MNIST (the offline default data), when apt-get is usable and the files are missing.
data:
	@if [ ! -e $(FMNIST_DIR)/train-images-idx3-ubyte.gz ] && [ ! -e $(FMNIST_DIR)/train-images-idx3-ubyte ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null \
	      || echo "warning: could not install dataset-fashion-mnist; pass --data.root with the IDX files"; \
	  else echo "note: Fashion-MNIST not in $(FMNIST_DIR) and apt-get unusable; pass --data.root"; fi; \
	fi

install: $(VENV)/.installed data

table2: install
	$(BIN)/fedbench table --config configs/tables/table2_$(DATASET).yaml $(ARGS)

table-ablation: install
	$(BIN)/fedbench table --config configs/tables/ablation_$(DATASET).yaml $(ARGS)

table-fednpr: install
	$(BIN)/fedbench table --config configs/tables/fednpr_$(DATASET).yaml $(ARGS)

table-facmic: install
	$(BIN)/fedbench table --config configs/tables/facmic_$(DATASET).yaml $(ARGS)

table-fstcbdg: install
	$(BIN)/fedbench table --config configs/tables/fstcbdg_$(DATASET).yaml $(ARGS)

# Which published cell of results/paper/*.json the table configs reproduce (ARGS="--json", "--paper fedbm", "--uncovered-only")
coverage: install
	$(BIN)/fedbench coverage $(ARGS)

test: install
	$(OFFLINE) $(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test-fast: install
	$(OFFLINE) $(BIN)/pytest -q -p no:cacheprovider -m "not ddp and not regression" $(PYTEST_ARGS)

# Rewrite results/reference/*.json after a deliberate change: make regression-update REASON="why the numbers moved"
regression-update: install
	@test -n "$(REASON)" || { echo 'usage: make regression-update REASON="why the numbers moved" [ARGS="--only fedavg"]'; exit 2; }
	$(OFFLINE) $(BIN)/fedbench regression --update --reason "$(REASON)" $(ARGS)

# Speed on an idle machine, each loop in its own process (bench/reporting/perf.py): local training vs a bare
# loop with and without allocator churn, speed options, cores as client workers, the per-round case, FACMIC's cache
bench: install
	$(OFFLINE) $(BIN)/fedbench bench $(ARGS)

# The per-round case alone (issue 19's workload: full Fashion-MNIST, ResNet-18, 3 rounds; several minutes)
bench-round: install
	$(OFFLINE) $(BIN)/fedbench bench --cases round $(ARGS)

# The offline table2 (every run forced) with its configured 2 ranks vs --jobs 2: wall time of each (~25 min)
bench-table2: install
	$(OFFLINE) $(BIN)/fedbench bench --cases table2 $(ARGS)

lint: install
	$(BIN)/ruff check bench lightning_modules datamodules tests
