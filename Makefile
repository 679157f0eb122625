# Two commands do all set-up on a fresh machine:
#   make run    the main job: the benchmark on a small preset (CPU: reference, says no GPU was found)
#   make test   the test suite (CPU: kernels run in Pallas GPU interpret mode)
# Both create the Python 3.12 virtual environment .venv first if it is missing.
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test venv clean

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

clean:
	rm -rf $(VENV) build *.egg-info
