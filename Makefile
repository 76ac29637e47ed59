# Dyno: `make demo` runs the platform on embedded defaults; `make test` runs every test.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 8000
# Dyno starts with production settings unless DYNO_ENV=development is asked for: the tests ask
# here, scripts/demo.sh for the demo; migrate and worker follow the environment they run in.
# Tests use the real services: PostgreSQL and Redis on this machine unless told otherwise.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/dyno
TEST_BROKER_URL   ?= redis://127.0.0.1:6379/15

.PHONY: install demo test test-fast worker web migrate bench gpu-check gpu-wheels lock clean

$(VENV)/.installed: pyproject.toml requirements.lock scripts/install.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/install.sh
	touch $@

install: $(VENV)/.installed

demo: install
	PORT=$(PORT) bash scripts/demo.sh

test: install
	bash scripts/services.sh
	DYNO_ENV=development DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# Unit tests only: no worker processes, no browser.
test-fast: install
	bash scripts/services.sh
	DYNO_ENV=development DATABASE_URL=$(TEST_DATABASE_URL) CELERY_BROKER_URL=$(TEST_BROKER_URL) \
		$(BIN)/python -m pytest -q -m "not integration and not browser" $(PYTEST_ARGS)

migrate: install
	$(BIN)/python manage.py migrate

# One worker that measures (cpu) and does the platform's chores (control), as make demo starts it; a
# runner reports to the web server's control API with a runner key (docs/operations.md, Roles).
worker: install
	@test -n "$$DYNO_RUNNER_TOKEN" || { echo "make worker: set DYNO_RUNNER_TOKEN (from manage.py runner_key create NAME --hardware cpu) and, unless the web server is at http://127.0.0.1:8000, DYNO_CONTROL_URL"; exit 2; }
	cd platform && ../$(BIN)/celery -A dyno worker -Q cpu,control -c 1 -B -l info

bench: install
	$(BIN)/python benchmarks/harness.py

# The one-shot GPU check (benchmarks/gpu_check.py). On the GPU machine it runs on that machine's own
# python3 with what `make gpu-wheels` put in .whl/; DRY_RUN=1 runs it here on CPU (cpu-ci shapes).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
gpu-check:
	@if [ -z "$(DRY_RUN)" ] && ls .whl/*.whl >/dev/null 2>&1; then \
		$(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dyno-gpu-site .whl/*.whl; fi
	PYTHONPATH=/tmp/dyno-gpu-site$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) benchmarks/gpu_check.py $(if $(DRY_RUN),--dry-run,)

# Refresh requirements.lock after changing pyproject.toml's dependencies (torch is installed apart:
# the CPU build on CPU machines, the host's own CUDA build on GPU hosts).
lock: install
	$(BIN)/python -m pip install -q pip-tools
	$(BIN)/pip-compile -q --extra test --strip-extras --unsafe-package torch --no-emit-index-url \
		--no-emit-find-links -c scripts/lock-constraints.txt --output-file requirements.lock pyproject.toml

# What the GPU machine's image lacks, as Python 3.12 wheels for it (git-ignored; carried to the machine).
gpu-wheels:
	bash scripts/gpu_wheels.sh

clean:
	rm -rf $(VENV) var .pytest_cache
