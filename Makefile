# Developer shortcuts; run them inside the venv that has `pip install -c constraints-cpu.txt -e '.[runs,test,dev]'`.
PYTHON ?= python

.PHONY: lint format test-fast test validate-network ci

# ruff, the import contracts and mypy, as pinned in pyproject.toml's dev extra (the same checks CI runs)
lint:
	ruff check .
	ruff format --check .
	lint-imports
	mypy

format:
	ruff format .
	ruff check --fix .

# no multi-process jobs, no browser: 2 minutes of CPU (tests/conftest.py says what is slow)
test-fast:
	$(PYTHON) -m pytest -q -m "not slow"

# everything, as CI runs it (about 15 minutes on 2 cores)
test:
	$(PYTHON) -m pytest -q

# tracekit predict against real emulated networks (root + iproute2; 8 runs of 4 ranks, minutes)
validate-network:
	TRACEKIT_NETWORK_VALIDATION=1 $(PYTHON) -m pytest -q -s tests/test_predict_network.py

# the CI check on this machine: a clean venv, the README's two commands, ruff, lint-imports, mypy (as root: apt-get)
ci:
	bash .ci/run
