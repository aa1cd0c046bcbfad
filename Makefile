# The README's two commands: `make run` (main job) and `make test` (the fast test tier).
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

# The venv sees the machine's site-packages (for its torch), and with them every
# pytest plugin installed there (pytest-benchmark warns under xdist, others could
# reorder or time out tests).  So plugins are not auto-loaded; the one the suite
# uses is named.  --dist loadgroup: tests marked xdist_group (sharing an expensive
# module fixture) go to one worker; the rest are spread as by --dist load.
PYTEST := PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 TRITON_INTERPRET=1 TRITONGEMM_POISON_OUTPUTS=1 \
	$(PY) -m pytest -p xdist.plugin
PYTEST_N := $(PYTEST) -n $(JOBS) --dist loadgroup

.PHONY: venv run test test-all test-slow compat lint gpu-check clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit("tritongemm needs Python >= 3.10, this is " + sys.version.split()[0]) if sys.version_info < (3, 10) else None'
	@$(PY) -m pip --version >/dev/null 2>&1 || $(PYTHON) -m venv --clear --system-site-packages $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_PIP_ARGS) "$(TORCH_SPEC)"
	@$(PY) -m pip install -q -e ".[test,bench]"
	@touch $@

run: venv
	$(PY) -m benchmarks quick

# Fast tier: every test but those marked slow or heavy, which it skips with the reason (tests/conftest.py).
test: venv
	$(PYTEST_N) -q tests

# Everything: `make test`, then only what it skipped: slow (full-size variants, whole grids) and heavy (subprocess, gloo, wheel, notebook).
test-all: venv
	$(MAKE) test
	$(PYTEST_N) -q -m "slow or heavy" tests

# Only the slow tier.
test-slow: venv
	$(PYTEST_N) -q -m slow tests

# Not part of CI: the fast subset below in two throwaway venvs (under $(COMPAT_DIR),
# without system site-packages) with the oldest and the newest Triton that install
# next to $(COMPAT_TORCH) (README, "Supported versions").  Triton 3.6's interpreter
# needs numpy < 2.4.
COMPAT_DIR ?= build/compat
COMPAT_TORCH ?= $(TORCH_SPEC)
COMPAT_OLDEST ?= "triton==3.6.0" "numpy<2.4"
COMPAT_NEWEST ?= "triton" "numpy"
COMPAT_TESTS ?= tests/test_api.py tests/test_errors.py tests/test_gemv.py tests/test_decomposition.py \
	tests/test_autograd.py tests/test_tma_path.py tests/test_nn.py tests/test_patch.py \
	tests/test_epilogue.py::test_linear_activation_forward_backward

# $(1): venv name, $(2): pip requirements pinning Triton and numpy.  The -W filter: Triton
# 3.6's interpreter warns on every launch under numpy >= 1.25 (thousands of lines).
define compat_run
	rm -rf $(COMPAT_DIR)/$(1) && $(PYTHON) -m venv $(COMPAT_DIR)/$(1)
	$(COMPAT_DIR)/$(1)/bin/python -m pip install -q $(TORCH_PIP_ARGS) "$(COMPAT_TORCH)" $(2) "pytest>=7" "pytest-xdist>=3" .
	@$(COMPAT_DIR)/$(1)/bin/python -c 'import torch, triton, numpy; print("== $(1):", "torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__)'
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 TRITON_INTERPRET=1 TRITONGEMM_POISON_OUTPUTS=1 \
		$(COMPAT_DIR)/$(1)/bin/python -m pytest -p xdist.plugin -n $(JOBS) -q -p no:cacheprovider \
		-W "ignore:Conversion of an array with ndim:DeprecationWarning" $(COMPAT_TESTS)
endef

compat:
	$(call compat_run,oldest,$(COMPAT_OLDEST))
	$(call compat_run,newest,$(COMPAT_NEWEST))

# On a CUDA GPU: correctness matrix on compiled kernels + the pipeline ladder.
gpu-check: venv
	$(PY) -m benchmarks.gpu_check

# Lint and format check (CI runs it after the tests): ruff check + ruff format --check.
lint: venv
	$(PY) -m pip install -q "ruff>=0.5"
	$(PY) -m ruff check tritongemm benchmarks tests tools
	$(PY) -m ruff format --check tritongemm benchmarks tests tools

clean:
	rm -rf $(VENV) build *.egg-info
