# The README's two commands: `make run` (main job) and `make test` (test suite).
# Both create .venv (seeing system site-packages, so a GPU image's torch is reused),
# install torch only if none is importable, then install tritongemm (once per
# pyproject.toml change: the stamp file .venv/.installed).

PYTHON ?= python3
VENV ?= .venv
# Without a torch already installed, this version is installed (on the CPU dev
# machines it is a CPU build that lies on disk; elsewhere pip downloads it).
TORCH_SPEC ?= torch==2.13.0
TORCH_PIP_ARGS ?=
PY := $(VENV)/bin/python
JOBS ?= 2

.PHONY: venv run test lint gpu-check clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("tritongemm needs Python >= 3.10, this is " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
	@$(PY) -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear --system-site-packages $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	@$(PY) -m pip install -q -e ".[test,bench]"
	@touch $@

run: venv
	$(PY) -m benchmarks quick

test: venv
	TRITON_INTERPRET=1 TRITONGEMM_POISON_OUTPUTS=1 $(PY) -m pytest -n $(JOBS) -q tests

# On a CUDA GPU: correctness matrix on compiled kernels + the pipeline ladder.
gpu-check: venv
	$(PY) -m benchmarks.gpu_check

lint: venv
	$(PY) -m pip install -q ruff && $(PY) -m ruff check tritongemm benchmarks tests

clean:
	rm -rf $(VENV) build *.egg-info
