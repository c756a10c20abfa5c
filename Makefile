# recflow — two commands on a fresh machine: `make demo` and `make test`. Each builds .venv first if needed.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
AIRFLOW_ENV := source scripts/airflow_env.sh
PYTEST_ARGS ?=

.PHONY: venv test test-fast browser-deps demo bench airflow airflow-init lock clean

venv: $(STAMP)

# TorchRec names the CUDA fbgemm-gpu as a requirement; on CPU the same modules come from fbgemm-gpu-cpu (pinned in
# requirements.txt with torchrec's other runtime deps), so torchrec itself is installed without its requirements.
TORCHREC := torchrec==1.8.0
# The one known `pip check` line that follows from that; any other line fails the build.
PIP_CHECK_KNOWN := torchrec 1.8.0 requires fbgemm-gpu, which is not installed.

# torch first, the CPU build the lock pins (torch==2.13.0+cpu), so nothing pulls a multi-GB CUDA build; then the
# pinned lock. PyPI has no +cpu wheel: where pip's own configuration finds none (a wheel on disk, a mirror), it comes
# from PyTorch's CPU index (TORCH_INDEX). Asked only then: an index pip cannot reach costs a minute of retries.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "pip<26.3"
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0+cpu 2>/dev/null \
	  || $(PY) -m pip install --quiet --disable-pip-version-check --extra-index-url $(TORCH_INDEX) torch==2.13.0+cpu
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $(TORCHREC)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@problems=$$($(PY) -m pip check 2>&1 | grep -vxF -e "$(PIP_CHECK_KNOWN)" -e "No broken requirements found."); \
	  if [ -n "$$problems" ]; then echo "$$problems"; exit 1; fi; \
	  echo "pip check: no broken requirements (but the known one: $(PIP_CHECK_KNOWN))"
	@touch $(STAMP)

# Every tier that runs on a CPU machine: unit, spark, dag integrity, e2e (dag.test), integration, reliability,
# browser (the Airflow UI in Chromium; browser-deps installs its tools), and the NVTabular engine's tests (nvt-env
# builds its environment once; the stamp keeps it between runs). Two lanes side by side (tests/conftest.py):
# the integration and browser tests, which mostly wait on the services they start, next to everything else.
# TEST_LANES= runs one lane.
TEST_LANES ?= -n 2 --dist loadgroup
# The tests not marked gpu run on the CPU even on a GPU host (CUDA_VISIBLE_DEVICES empty): .venv's torch and
# TensorFlow are CPU builds, which device auto refuses where it can use a GPU (tasks.core.gpus.check_usable).
test: venv browser-deps nvt-env
	$(AIRFLOW_ENV) && CUDA_VISIBLE_DEVICES= $(PY) -m pytest -m "not gpu" $(TEST_LANES) $(PYTEST_ARGS)

test-fast: venv
	$(AIRFLOW_ENV) && CUDA_VISIBLE_DEVICES= $(PY) -m pytest \
	  -m "not gpu and not e2e and not integration and not slow and not browser" $(PYTEST_ARGS)

# The browser tier's tools (tests/browser, marker `browser`): Debian's chromium from apt (no browser is ever
# downloaded) and playwright-core, pinned by package-lock.json, in ./node_modules. Node.js >= 20 with npm is a
# system requirement, like Python 3.11 and Java 17. apt runs as root, or through sudo.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
NODE_STAMP := node_modules/.recflow-installed

browser-deps: $(NODE_STAMP)
	@command -v chromium >/dev/null 2>&1 || { echo "browser-deps: installing Debian's chromium (apt)"; \
	  $(SUDO) apt-get update -q && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }
	@chromium --version 2>/dev/null | grep -q '^Chromium' || { echo "browser-deps: chromium does not start"; exit 1; }

$(NODE_STAMP): package.json package-lock.json
	@node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' 2>/dev/null && command -v npm >/dev/null \
	  || { echo "browser-deps: Node.js >= 20 and npm are needed (playwright-core); install them first"; exit 1; }
	npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# Benchmarks (quick mode < 10 min; BENCH_ARGS=--full for bigger runs): bench/results/*.json + docs/PERFORMANCE.md
bench: venv airflow-init nvt-env
	$(AIRFLOW_ENV) && $(PY) -m bench.run $(BENCH_ARGS)

# ENGINE=nvtabular (or arrow) runs the pipelines' preprocessing with that engine (make demo ENGINE=nvtabular builds
# NVTabular's environment first).
ENGINE ?=
demo: venv airflow-init $(if $(filter nvtabular,$(ENGINE)),nvt-env)
	$(AIRFLOW_ENV) && $(PY) scripts/demo.py $(if $(ENGINE),--engine $(ENGINE)) $(DEMO_ARGS)

airflow-init: venv
	$(AIRFLOW_ENV) && bash scripts/airflow_init.sh

# The Airflow UI on http://localhost:8080 (login: see README).
airflow: venv airflow-init
	$(AIRFLOW_ENV) && airflow standalone

lock: venv
	(echo "# Pinned lock of requirements.in (pip freeze of a fresh .venv, pip check clean). Regenerate: make lock"; \
	 $(PY) -m pip freeze --exclude-editable | grep -v -e '^recflow' -e '^torchrec==') > requirements.txt

clean:
	rm -rf .airflow data build

# NVTabular 23.08's own environment (DESIGN.md "Environments"): numpy 1.26 / pandas 1.5 / pyarrow 14 / dask 2023.7,
# which cannot share .venv. Built on demand and stamped like .venv; never imported by Airflow or the main
# environment (tasks run its interpreter as a child process). Ends with a smoke run of a CPU workflow.
NVT_VENV := .venv-nvtabular
NVT_PY := $(NVT_VENV)/bin/python
NVT_STAMP := $(NVT_VENV)/.installed
.PHONY: nvt-env

nvt-env: $(NVT_STAMP)

$(NVT_STAMP): requirements-nvtabular.txt
	@test -x $(NVT_PY) || $(PYTHON) -m venv $(NVT_VENV)
	$(NVT_PY) -m pip install --quiet --disable-pip-version-check "pip<26.3"
	$(NVT_PY) -m pip install --quiet --disable-pip-version-check -r requirements-nvtabular.txt
	$(NVT_PY) -m pip check
	$(NVT_PY) scripts/nvt_smoke.py
	@touch $(NVT_STAMP)
