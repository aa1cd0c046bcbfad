# The README's two commands: `make run` (main job) and `make test` (test suite).
# Both create .venv (seeing system site-packages, so a GPU image's torch is reused),
# install torch only if none is importable, then install tritongemm.

PYTHON ?= python3
VENV ?= .venv
# Without a torch already installed, this version is installed (on the CPU dev
# machines it is a CPU build that lies on disk; elsewhere pip downloads it).
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
JOBS ?= 2

.PHONY: venv run test lint gpu-check clean

venv:
	@test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	@$(PY) -m pip install -q -e ".[test,bench]"

run: venv
	$(PY) -m benchmarks quick

test: venv
	TRITON_INTERPRET=1 TRITONGEMM_POISON_OUTPUTS=1 $(PY) -m pytest -n $(JOBS) -q tests

lint: venv
	$(PY) -m pip install -q ruff && $(PY) -m ruff check tritongemm benchmarks tests

clean:
	rm -rf $(VENV) build *.egg-info
