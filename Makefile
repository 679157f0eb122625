# Two commands do all set-up on a fresh machine:
#   make run    the main job: the benchmark on a small preset (CPU: reference, says no GPU was found)
#   make test   the test suite (CPU: kernels run in Pallas GPU interpret mode)
#   make test-jax-latest   the suite against the newest jax in the registry (past
#               pyproject.toml's cap), in its own environment .venv-jax-latest
# Both create the Python 3.12 virtual environment .venv first if it is missing.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test test-jax-latest venv clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	@test -x $(PY) || "$$(tools/find-python312)" -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt setuptools -e '.[test]'
	@touch $@

run: venv
	$(PY) benchmarks/blockwise_dot.py --shapes=small

test: venv
	$(PY) -m pytest -q tests

LATEST := .venv-jax-latest
test-jax-latest:
	@test -x $(LATEST)/bin/python || "$$(tools/find-python312)" -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip setuptools
	$(LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e '.[test]'
	@# The newest jax, past the cap (pip warns that jax_fp8's requirement is not met).
	$(LATEST)/bin/python -m pip install -q --upgrade jax jaxlib
	@$(LATEST)/bin/python -c "import jax, jaxlib; print('testing with jax', jax.__version__, 'jaxlib', jaxlib.__version__)"
	$(LATEST)/bin/python -m pytest -q tests

clean:
	rm -rf $(VENV) $(LATEST) build *.egg-info
