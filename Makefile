# Two entry points for people: `make demo` (the main job) and `make test` (everything CI runs).
# Both work on a fresh Debian machine as root: they install what is missing, then run.
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
PIP   := $(VENV)/bin/pip
DEBS  := iproute2 ethtool iperf3 iputils-ping openvswitch-switch openssh-server openssh-client ruby \
         vagrant vagrant-libvirt
STAMP := $(VENV)/.installed

.PHONY: demo test check lint bench deps clean

deps: $(STAMP)

$(STAMP): pyproject.toml
	@missing=""; for p in $(DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip >/dev/null
	# CPU wheel first: nothing later may pull the CUDA build.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[controller,dev,ansible]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m bench.demo

# Two passes, both always run, each listing its slowest tests: most tests side by side in
# $(TEST_WORKERS) processes (pytest-xdist; a module stays in one process, so its lab is built
# once; modules start in file order, which puts the long e2e ones first, where xdist's default
# would start the modules with the most tests first and the long few-test ones last), then the
# `serial` ones alone (they time something on this CPU or change something machine-wide:
# pyproject.toml's markers).
# The project's bytecode is compiled once first: with PYTHONDONTWRITEBYTECODE set (as in the
# team's shells) every process (each agent call, rank and CLI run) would otherwise compile the
# modules it imports from source again (0.06 CPU-s an agent call, 0.1 s a rank, on 2 cores).
TEST_WORKERS ?= 4
test: $(STAMP)
	$(VENV)/bin/ruff check controller agent tests bench
	$(PY) -m compileall -q controller agent tests bench >/dev/null
	$(VENV)/bin/pytest -q --durations=40 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not serial"; a=$$?; \
	$(VENV)/bin/pytest -q --durations=20 -m serial $$(grep -rl 'mark\.serial' tests --include='test_*.py'); b=$$?; \
	exit $$(( a ? a : b ))

# the fast loop while coding: lint and the unit tests (no root, no labs), stop at the first failure
check: $(STAMP)
	$(VENV)/bin/ruff check controller agent tests bench
	$(VENV)/bin/pytest -q -x tests/unit

bench: $(STAMP)
	$(PY) -m bench.agent.apply

clean:
	rm -rf $(VENV) build *.egg-info
