# Distributed Training from Scratch: the two commands a newcomer types are `make demo` and `make test`.
# Both create .venv if it is missing and install from constraints.txt (exact pins) once; a stamp
# file makes later runs skip the install until pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
# The package index torch is taken from. Empty (the default): PyPI, as every other package, whose Linux torch is
# the CUDA build with its CUDA packages (README: "Platforms"). TORCH_INDEX=https://download.pytorch.org/whl/cpu
# installs the CPU build of the same version (torch 2.13.0+cpu) first; the pins then keep it.
TORCH_INDEX ?=
# make install's browser step looks for chromium here; when it cannot install it, the note says why (tests/test_site.py
# shows it in the score table's NOT RUN line)
CHROMIUM ?= /usr/bin/chromium
BROWSER_NOTE = $(VENV)/browser-not-installed.txt
# make install's slurm step: where it cannot install Debian's Slurm, the note says why (tests/test_slurm.py shows it
# in the score table's NOT RUN line)
SLURM_NOTE = $(VENV)/slurm-not-installed.txt
SLURM_PROGRAMS ?= /usr/bin/sbatch /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged

.PHONY: help install browser slurm check-pins demo lint format test test-fast grade hint notebooks docs serve clean results results-00 results-01 results-01-checks check-times kernel-sets results-02 results-03 results-04 results-05 results-06 results-07 check-memory check-grades

help:
	@echo "make demo    install (once) and run Lab 01: MiniGPT trained on 2 processes with the hand-rolled DDP, checked against one process"
	@echo "             DEVICE=cpu|cuda where the two ranks run (default auto: two GPUs if there are, else the CPU)"
	@echo "make test    install (once; Debian's chromium and Slurm too, for the browser and Slurm tests), make lint, then the whole test suite"
	@echo "make test-fast  the quick loop for contributors: unit and page tests only, about a minute"
	@echo "make lint    ruff check and ruff format --check, with the rules in pyproject.toml (make format fixes what it can)"
	@echo "make grade   score your own exercises (lab/exercises/): per exercise, one line per lost point"
	@echo "             EX=1.3 one exercise · LAB=01 one lab · LANG=es en español · DETAILS=1 tracebacks too"
	@echo "make hint EX=4.3   the next hint of one exercise (each call one more) · RESET=1 start over · LANG=es"
	@echo "make notebooks  open the lab notebooks (your workbooks) in Jupyter Lab"
	@echo "make docs    build the bilingual website into site/ (tables and figures regenerated first)"
	@echo "make serve   the website on http://127.0.0.1:8000, rebuilt as you edit a page"
	@echo "make clean   remove .venv, out/ and the built site"
	@echo "make install TORCH_INDEX=https://download.pytorch.org/whl/cpu   the CPU build of torch on Linux (no CUDA packages)"
	@echo "make check-pins  maintainers: do the pins of constraints.txt install on Python 3.10-3.14 on Linux"
	@echo "             (x86_64, aarch64), macOS (arm64) and Windows (amd64)? pip's resolver is asked, nothing installed"
	@echo "make results maintainers only: re-measure the committed results in lab/results/ (long: Lab 01's"
	@echo "             benchmark alone takes about 18 min); results-00 ... results-07 one lab."
	@echo "             Learners never need it: every command of the guides writes to out/"
	@echo "make check-times, make kernel-sets   maintainers: every lab's default --check timed (median of 3) and under"
	@echo "             every kernel set the CPU supports (about 90 and 60 min); the guides show both tables"
	@echo "make check-grades   maintainers: each lab's make grade EX=N.M, and make grade on the stubs, timed"

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_INDEX),$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --index-url $(TORCH_INDEX) -c constraints.txt torch)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[test,notebooks,docs]"
	@touch $(STAMP)

# Debian's chromium for the website's browser test (tests/test_site.py; Playwright cannot download
# a browser here). Installed with apt-get when it is missing and this user may (root, or sudo
# without a password). Whatever stops it (no apt-get, no root, a package lock held by another
# process, no network) is one WARNING line and exit status 0: the install and the tests go on, and
# the score table's NOT RUN line says that the browser test did not run, and why (BROWSER_NOTE).
browser:
	@rm -f $(BROWSER_NOTE); \
	if [ -x "$(CHROMIUM)" ]; then exit 0; fi; \
	skip() { echo "WARNING: $(CHROMIUM) is missing and $$1: the browser test will not run"; \
	    mkdir -p $(VENV) && echo "$$1" > $(BROWSER_NOTE); exit 0; }; \
	command -v apt-get >/dev/null 2>&1 || skip "there is no apt-get to install it"; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=""; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo"; \
	else skip "installing it needs root (sudo apt-get install chromium)"; fi; \
	echo "installing Debian's chromium for the browser test (apt-get, once)"; \
	out=$$( { $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } 2>&1 ) \
	    || { code=$$?; why=$$(printf '%s\n' "$$out" | grep '^E: ' | head -n 1 | cut -c1-200); \
	         skip "apt-get failed (exit status $$code$${why:+: $$why})"; }; \
	[ -x "$(CHROMIUM)" ] || skip "apt-get's chromium is not there"

# Debian's Slurm (22.05 in bookworm), for the test that submits Lab 01's recipe, lab/slurm/01_ddp.sbatch, to a
# cluster of two nodes on this machine (tests/test_slurm.py). Installed as the browser is, and never failing the
# install: where it cannot be installed, one WARNING line, SLURM_NOTE says why, and that test is NOT RUN. Only the
# packages: the test starts and stops its own daemons, with a configuration of its own, and nothing is started here.
slurm:
	@rm -f $(SLURM_NOTE); \
	there() { for p in $(SLURM_PROGRAMS); do [ -x "$$p" ] || return 1; done; }; \
	if there; then exit 0; fi; \
	skip() { echo "WARNING: Slurm is missing and $$1: the Slurm test will not run"; \
	    mkdir -p $(VENV) && echo "$$1" > $(SLURM_NOTE); exit 0; }; \
	command -v apt-get >/dev/null 2>&1 || skip "there is no apt-get to install it"; \
	if [ "$$(id -u)" -eq 0 ]; then SUDO=""; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo"; \
	else skip "installing it needs root (sudo apt-get install slurmctld slurmd slurm-client munge)"; fi; \
	echo "installing Debian's Slurm for the Slurm test (apt-get, once)"; \
	out=$$( { $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge; } 2>&1 ) \
	    || { code=$$?; why=$$(printf '%s\n' "$$out" | grep '^E: ' | head -n 1 | cut -c1-200); \
	         skip "apt-get failed (exit status $$code$${why:+: $$why})"; }; \
	there || skip "apt-get's Slurm is not there ($(SLURM_PROGRAMS))"

install: $(STAMP) browser slurm

# DEVICE=auto|cpu|cuda (or MINIGPT_DEVICE in the environment): where the two ranks run. auto, the default: one GPU
# each when this machine has two, else the CPU, said in one line with the command that would use the GPU.
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc_per_node=2 lab/01_ddp.py --check --report out/lab01.json$(if $(DEVICE), --device $(DEVICE))

# ruff's rules and line length are in pyproject.toml ([tool.ruff]); `make format` applies the formatting.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test: install lint
	MINIGPT_CHROMIUM="$(CHROMIUM)" MINIGPT_BROWSER_NOTE="$(BROWSER_NOTE)" MINIGPT_SLURM_NOTE="$(SLURM_NOTE)" \
	    MINIGPT_SLURM_PROGRAMS="$(SLURM_PROGRAMS)" $(PY) -m pytest

# The contributor's quick loop (CONTRIBUTING, "Tests"): no test that starts processes or trains a model.
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

# Maintainers (CONTRIBUTING, "Checks"): pip's resolver, asked without installing, for every supported Python and
# system; one line each, and a pin with no distribution named (.ci/check_pins.py --help).
check-pins: $(STAMP)
	$(PY) .ci/check_pins.py

# The graded tests only, against lab/exercises/ (python -m minigpt.grader --help). LANG=es (or a
# Spanish locale) gives the report in Spanish; EX, LAB and DETAILS pick what to grade and show.
grade: $(STAMP)
	@MINIGPT_LANG="$(LANG)" $(PY) -m minigpt.grader $(if $(EX),--exercise $(EX)) $(if $(LAB),--lab $(LAB)) $(if $(DETAILS),--details)

# One hint of one exercise, the next on each call (python -m minigpt.hints --help); what has been seen
# is kept in out/hints.json. RESET=1 starts the exercise over; LANG=es gives it in Spanish.
hint: $(STAMP)
	@MINIGPT_LANG="$(LANG)" $(PY) -m minigpt.hints $(EX) $(if $(RESET),--reset)

# The labs' workbooks (notebooks/NN-name.ipynb, and NN-name.es.ipynb in Spanish) in Jupyter Lab. Their
# "your turn" and grade cells run your code in lab/exercises/; MINIGPT_IMPL=reference runs the reference.
notebooks: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

# The site's generated tables and figures come from the code first: python -m minigpt.pages writes
# the tables into the pages that show them (between markers) and the figures into figures/
# (committed, so that a page read on the forge shows them; docs/figures links there).
docs: $(STAMP)
	$(PY) -m minigpt.pages
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

serve: $(STAMP)
	$(PY) -m minigpt.pages
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve -a 127.0.0.1:8000

clean:
	rm -rf $(VENV) out site build/tables

# Maintainers: the committed measurements in lab/results/, each file re-measured by the command that
# wrote it (the pages' "measured on" notes and the page tests, tests/test_lab0N_page.py, name them).
# A run re-renders its tables and figures beside its JSON. Afterwards update the pages' machine and
# date, and run the page tests: the numbers the pages quote must still be the measured ones.
TORCHRUN := OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc_per_node=2
TORCHRUN4 := OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc_per_node=4
TORCHRUN8 := OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc_per_node=8
RESULTS  := lab/results

results: results-00 results-01 results-02 results-03 results-04 results-05 results-06 results-07

# Maintainers: every lab's default --check timed as a learner runs it (the median of 3; on a quiet machine: it is
# a benchmark), and run under each kernel set the CPU supports (its rulers). The lab guides show both tables.
check-times: $(STAMP)
	$(PY) -m minigpt.runners.checks times --out $(RESULTS)

kernel-sets: $(STAMP)
	$(PY) -m minigpt.runners.checks kernel-sets --out $(RESULTS)

# Maintainers: the memory each lab's default run takes, all its processes at once (README, Platforms); about 25 min.
check-memory: $(STAMP)
	$(PY) -m minigpt.runners.checks memory --out $(RESULTS)

# Maintainers: make grade EX=N.M of each lab's grading section, the exercise written, and make grade on the
# untouched stubs, timed (median of 3; about two minutes). The lab guides show the table.
check-grades: $(STAMP)
	$(PY) -m minigpt.runners.checks grades --out $(RESULTS)

results-00: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) lab/00_batch_scaling.py --report $(RESULTS)/00-batch-scaling-cpu.json

results-01: results-01-checks
	$(TORCHRUN) lab/01_ddp.py --quiet --trace out/lab01-trace --report $(RESULTS)/01-trace-cpu.json
	$(PY) lab/01_ddp.py --render $(RESULTS)/01-trace-cpu.json
	$(PY) lab/01_drift.py --out $(RESULTS)
	$(PY) lab/01_drift.py --sources 0,286 --out $(RESULTS)
	$(TORCHRUN) lab/01_benchmark.py --out $(RESULTS)
	$(TORCHRUN4) lab/01_links.py --repeats 101 --out $(RESULTS)

# the checks alone (about 35 min): the default check make demo runs, the whole stories (--full), and
# the whole stories under the three kernel sets
results-01-checks: $(STAMP)
	$(TORCHRUN) lab/01_ddp.py --check --quiet --report $(RESULTS)/01-check-adamw-cpu.json
	$(PY) lab/01_ddp.py --render $(RESULTS)/01-check-adamw-cpu.json
	$(TORCHRUN) lab/01_ddp.py --check --full --quiet --report $(RESULTS)/01-check-adamw-full-cpu.json
	$(TORCHRUN) lab/01_ddp.py --check --full --quiet --dtype float64 --report $(RESULTS)/01-check-float64-cpu.json
	$(TORCHRUN) lab/01_ddp.py --check --full --quiet --optimizer sgd --lr 0.1 --min-lr 0 --report $(RESULTS)/01-check-sgd-cpu.json
	$(PY) lab/01_kernel_sets.py --config adamw --out $(RESULTS)
	$(PY) lab/01_kernel_sets.py --config sgd --out $(RESULTS)

results-02: $(STAMP)
	$(TORCHRUN) lab/02_crosscheck.py --report $(RESULTS)/02-crosscheck-cpu.json
	$(PY) lab/02_crosscheck.py --render $(RESULTS)/02-crosscheck-cpu.json
	$(TORCHRUN) lab/02_crosscheck.py --sizes 96,192,384 --steps 10 --report $(RESULTS)/02-sharding-pays-cpu.json
	$(PY) lab/02_crosscheck.py --render $(RESULTS)/02-sharding-pays-cpu.json

results-03: $(STAMP)
	$(TORCHRUN) lab/03_fsdp_prefetch.py --quiet --report $(RESULTS)/03-prefetch-cpu.json
	$(PY) lab/03_fsdp_prefetch.py --render $(RESULTS)/03-prefetch-cpu.json
	$(TORCHRUN) lab/03_fsdp_practice.py --steps 20 --report $(RESULTS)/03-practice-cpu.json
	$(PY) lab/03_fsdp_practice.py --render $(RESULTS)/03-practice-cpu.json
	$(TORCHRUN) lab/03_fsdp_options.py --report $(RESULTS)/03-options-cpu.json
	OMP_NUM_THREADS=1 $(PY) lab/03_compile_budget.py --report $(RESULTS)/03-compile-budget-cpu.json

results-04: $(STAMP)
	$(TORCHRUN) lab/04_fsdp.py --check --full --quiet --report $(RESULTS)/04-fsdp-cpu.json
	$(PY) lab/04_fsdp.py --render $(RESULTS)/04-fsdp-cpu.json
	$(TORCHRUN) lab/04_fsdp.py --check --full --quiet --clip-norm one-number --rounds 0 --report $(RESULTS)/04-fsdp-cpu-one-number-norm.json
	$(PY) lab/04_fsdp.py --render $(RESULTS)/04-fsdp-cpu-one-number-norm.json
	$(TORCHRUN4) lab/04_fsdp.py --check --full --quiet --report $(RESULTS)/04-fsdp-cpu-4.json
	$(PY) lab/04_fsdp.py --render $(RESULTS)/04-fsdp-cpu-4.json

results-05: $(STAMP)
	$(TORCHRUN) lab/05_tensor_parallel.py --check --full --quiet --report $(RESULTS)/05-tensor-parallel-cpu.json
	$(PY) lab/05_tensor_parallel.py --render $(RESULTS)/05-tensor-parallel-cpu.json
	$(TORCHRUN) lab/05_tensor_parallel.py --check --full --quiet --optimizer sgd --lr 0.1 --min-lr 0 --report $(RESULTS)/05-tensor-parallel-sgd-cpu.json
	$(PY) lab/05_tensor_parallel.py --render $(RESULTS)/05-tensor-parallel-sgd-cpu.json
	$(TORCHRUN4) lab/05_tensor_parallel.py --check --full --quiet --sequence-parallel --report $(RESULTS)/05-tensor-parallel-sp-4-cpu.json
	$(PY) lab/05_tensor_parallel.py --render $(RESULTS)/05-tensor-parallel-sp-4-cpu.json
	$(TORCHRUN) lab/05_ring_attention.py --check --full --report $(RESULTS)/05-ring-attention-cpu.json
	$(PY) lab/05_ring_attention.py --render $(RESULTS)/05-ring-attention-cpu.json
	$(TORCHRUN4) lab/05_ring_attention.py --check --full --report $(RESULTS)/05-ring-attention-4-cpu.json
	$(PY) lab/05_ring_attention.py --render $(RESULTS)/05-ring-attention-4-cpu.json

results-06: $(STAMP)
	$(TORCHRUN) lab/06_pipeline.py --check --full --quiet --report $(RESULTS)/06-pipeline-cpu.json
	$(PY) lab/06_pipeline.py --render $(RESULTS)/06-pipeline-cpu.json
	$(TORCHRUN4) lab/06_pipeline.py --check --full --quiet --schedule gpipe --report $(RESULTS)/06-pipeline-4-cpu.json
	$(PY) lab/06_pipeline.py --render $(RESULTS)/06-pipeline-4-cpu.json
	$(TORCHRUN4) lab/06_mesh.py --check --full --quiet --shard 2 --report $(RESULTS)/06-mesh-cpu.json
	$(PY) lab/06_mesh.py --render $(RESULTS)/06-mesh-cpu.json

results-07: $(STAMP)
	$(TORCHRUN8) lab/07_nd_parallel.py --check --quiet --report $(RESULTS)/07-nd-parallel-cpu.json
	$(PY) lab/07_nd_parallel.py --render $(RESULTS)/07-nd-parallel-cpu.json
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc_per_node=16 lab/07_nd_parallel.py --check --quiet \
		--dp-replicate 2 --dp-shard 2 --cp 2 --tp 2 --report $(RESULTS)/07-nd-parallel-4d-cpu.json
	$(PY) lab/07_nd_parallel.py --render $(RESULTS)/07-nd-parallel-4d-cpu.json
	$(TORCHRUN8) lab/07_nd_parallel.py --check --quiet --pp 2 --report $(RESULTS)/07-nd-parallel-pp-cpu.json
	$(PY) lab/07_nd_parallel.py --render $(RESULTS)/07-nd-parallel-pp-cpu.json
