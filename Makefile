# fedbench — `make table2` (default comparison on the offline data) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DATASET ?= fashion-mnist
FMNIST_DIR := /usr/share/datasets/fashion-mnist
OFFLINE := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false

.PHONY: install lock data quick table2 dashboard table-ablation table-fednpr table-fednpr-ablation table-facmic table-fstcbdg coverage test test-fast smoke-tables regression-update bench bench-startup catalog bench-round bench-table2 gpu-check gpu-bench lint clean-results

# A venv with exactly the versions of requirements.lock (the whole dependency tree, nothing resolved
# at install time: --no-deps, then `pip check` proves the locked set is complete and consistent),
# then the package itself (editable). Refresh the lock with `make lock`.
LOCK := requirements.lock
LOCK_VENV := .lock-venv
PIP_Q := -q --disable-pip-version-check
$(VENV)/.installed: pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install $(PIP_Q) --no-deps -r $(LOCK)
	$(BIN)/pip install $(PIP_Q) --no-deps -e .
	$(BIN)/pip check
	touch $@

# Rewrite requirements.lock: a clean venv resolves pyproject.toml's ranges (with the dev extra) and is
# frozen. Commit the new lock together with the references it changes (`make regression-update`).
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install $(PIP_Q) -e '.[dev]'
	$(LOCK_VENV)/bin/pip check
	$(LOCK_VENV)/bin/python -c 'import platform as p, sys; print("# fedbench locked environment: make install installs exactly these; refresh: make lock\n# resolved from pyproject.toml [dev] on CPython", \
	  p.python_version(), sys.platform, p.machine())' > $(LOCK).tmp
	$(LOCK_VENV)/bin/pip freeze --all --exclude pip --exclude-editable | grep -v '^#' >> $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf $(LOCK_VENV)

# Debian's Fashion-MNIST (the offline default data), when apt-get is usable and the files are missing.
data:
	@if [ ! -e $(FMNIST_DIR)/train-images-idx3-ubyte.gz ] && [ ! -e $(FMNIST_DIR)/train-images-idx3-ubyte ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null \
	      || echo "warning: could not install dataset-fashion-mnist; pass --data.root with the IDX files"; \
	  else echo "note: Fashion-MNIST not in $(FMNIST_DIR) and apt-get unusable; pass --data.root"; fi; \
	fi

install: $(VENV)/.installed data

# Before a table: `fedbench data get --table CONFIG` downloads (checked, resumable) every public dataset the config
# reads that the data home ($FEDBENCH_DATA, else ./data) lacks, or prints the steps for one behind a registration
# and stops (docs/data.md). Skipped with FETCH=0, or when ARGS points the runs elsewhere (data.root, --data-home).
FETCH ?= 1
fetch-data = $(if $(filter 1,$(FETCH)),$(if $(findstring data.root,$(ARGS))$(findstring data-home,$(ARGS))$(findstring data_home,$(ARGS)),,$(BIN)/fedbench data get --table $(1)))

# The first run, under a minute on a laptop CPU: FedAvg on sklearn's digits (no download), 4 clients, 3 rounds
# (configs/experiments/quick.yaml; any `fedbench run` flag in ARGS, e.g. ARGS="--method.name fedprox")
quick: install
	$(OFFLINE) $(BIN)/fedbench run --config configs/experiments/quick.yaml $(ARGS)

table2: install
	$(call fetch-data,configs/tables/table2_$(DATASET).yaml)
	$(BIN)/fedbench table --config configs/tables/table2_$(DATASET).yaml $(ARGS)

# The W&B workspace + report of table2 (its runs logged with `make table2 ARGS=--wandb`): saved with a
# W&B key, else written as JSON under results/dashboards (docs/wandb.md)
dashboard: install
	$(BIN)/fedbench dashboard --config configs/tables/table2_$(DATASET).yaml $(ARGS)

table-ablation: install
	$(call fetch-data,configs/tables/ablation_$(DATASET).yaml)
	$(BIN)/fedbench table --config configs/tables/ablation_$(DATASET).yaml $(ARGS)

table-fednpr: install
	$(call fetch-data,configs/tables/fednpr_$(DATASET).yaml)
	$(BIN)/fedbench table --config configs/tables/fednpr_$(DATASET).yaml $(ARGS)

table-fednpr-ablation: install
	$(call fetch-data,configs/tables/fednpr-ablation_$(DATASET).yaml)
	$(BIN)/fedbench table --config configs/tables/fednpr-ablation_$(DATASET).yaml $(ARGS)

table-facmic: install
	$(call fetch-data,configs/tables/facmic_$(DATASET).yaml)
	$(BIN)/fedbench table --config configs/tables/facmic_$(DATASET).yaml $(ARGS)

table-fstcbdg: install
	$(call fetch-data,configs/tables/fstcbdg_$(DATASET).yaml)
	$(BIN)/fedbench table --config configs/tables/fstcbdg_$(DATASET).yaml $(ARGS)

# Which published cell of results/paper/*.json the table configs reproduce (ARGS="--json", "--paper fedbm", "--uncovered-only")
coverage: install
	$(BIN)/fedbench coverage $(ARGS)

# Two worker processes (pytest-xdist), one test file per worker at a time (module fixtures run once);
# TEST_JOBS=1 runs serially. Bytecode is written even where the shell sets PYTHONDONTWRITEBYTECODE (as this
# machine's image does): otherwise every worker re-rewrites every test module's asserts and every fedbench
# process a test starts recompiles the package (measured: a test-fast collection 14.0 s -> 9.6 s).
TEST_JOBS ?= 2
TEST_ENV := $(OFFLINE) PYTHONDONTWRITEBYTECODE=
test: install
	$(TEST_ENV) $(BIN)/pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

# The fast inner loop: every test file not marked end-to-end (pytestmark = pytest.mark.slow in the file)
test-fast: install
	$(TEST_ENV) $(BIN)/pytest -q -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile -m "not slow and not ddp and not regression" $(PYTEST_ARGS)

# Every configs/tables/*.yaml, every row, 1 seed, 2 rounds, 3 clients, 16 px, on generated fixtures in each
# dataset's official layout with offline weights; fails if any config cannot run (tests/smoke_tables.py).
smoke-tables: install
	$(TEST_ENV) $(BIN)/python tests/smoke_tables.py $(ARGS)

# Rewrite results/reference/*.json after a deliberate change: make regression-update REASON="why the numbers moved"
regression-update: install
	@test -n "$(REASON)" || { echo 'usage: make regression-update REASON="why the numbers moved" [ARGS="--only fedavg"]'; exit 2; }
	$(OFFLINE) $(BIN)/fedbench regression --update --reason "$(REASON)" $(ARGS)

# Speed on an idle machine, each loop in its own process (bench/perf/perf.py): local training vs a bare
# loop with and without allocator churn, speed options, cores as client workers, the per-round case, FACMIC's cache
bench: install
	$(OFFLINE) $(BIN)/fedbench bench $(ARGS)

# How soon each command of issue 41's table answers (help, errors, list, coverage <= 1.5 s wall; run and table's
# first line <= 2 s), median of 3 on a quiet machine; exits 1 over a limit (bench/perf/perf_startup.py)
bench-startup: install
	$(OFFLINE) $(BIN)/python -m bench.perf.perf_startup $(ARGS)

# Rewrite bench/tables/catalog_data.py (what `fedbench list`/`coverage` read without importing the methods)
# after a method, dataset or partition scheme changed; tests/commands/test_startup.py says when it is out of date
catalog: install
	$(OFFLINE) $(BIN)/python -m bench.tables.catalog --write

# The per-round case alone (issue 19's workload: full Fashion-MNIST, ResNet-18, 3 rounds; several minutes)
bench-round: install
	$(OFFLINE) $(BIN)/fedbench bench --cases round $(ARGS)

# The offline table2 (every run forced) with its configured 2 ranks vs --jobs 2: wall time of each (~25 min)
bench-table2: install
	$(OFFLINE) $(BIN)/fedbench bench --cases table2 $(ARGS)

# On a machine with a CUDA GPU: what only a GPU can show (bench/perf/gpu_check.py), pass/fail per item, < 5 min
gpu-check: install
	$(OFFLINE) $(BIN)/python -m bench.perf.gpu_check $(ARGS)

# On a machine with a CUDA GPU: table2_kvasir's rows for 3 rounds on synthetic Kvasir images under each math mode,
# alone and K at once, and the projected wall time of the whole table per setting (bench/perf/gpu_bench.py)
gpu-bench: install
	$(OFFLINE) $(BIN)/python -m bench.perf.gpu_bench $(ARGS)

# Delete what runs write and git does not track (run records, checkpoints, W&B files, reduced tables under
# results/tables/reduced/ and the __reduced-<hash> files older versions wrote beside the tables); keeps
# results/paper, results/reference and the committed tables
clean-results:
	rm -rf results/runs results/checkpoints results/wandb results/bench results/tables/reduced
	rm -f results/tables/*__reduced-*

lint: install
	$(BIN)/ruff check bench lightning_modules datamodules tests
