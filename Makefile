# crosshost — the README's two commands are `make demo` and `make test`; each sets itself up (`make setup`
# sets up without running either).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# What the set-up installs from the registries (the venv's pinned packages, the agent CLIs) is copied
# from a machine-wide cache keyed by the pins' bytes and the interpreter (tools/setupcache.py) when
# this machine installed the same pins before, so a fresh clone does not download, unpack and
# compile them again; what was copied is checked as what was installed is.
SETUP_CACHE ?= /var/cache/crosshost-setup
SETUPCACHE = CROSSHOST_SETUP_CACHE=$(SETUP_CACHE) python3 tools/setupcache.py
VENV_KEY = tools/requirements-dev.txt --key-text "$$(python3 -c 'import sys; print(sys.version, sys.base_prefix)')"
NPM_KEY = tools/agent-clis/package.json tools/agent-clis/package-lock.json --key-text "$$(node --version)"
MSWEA_KEY = tools/agent-clis/mini-swe-agent.txt --key-text "$$(/usr/bin/python3 -VV)"

.PHONY: setup demo demo-containers test test-fast lint hosts-up hosts-down bench clean browser agent-clis docker docker-up docker-down

$(STAMP): pyproject.toml tools/requirements-dev.txt
	@command -v /usr/sbin/sshd >/dev/null || { \
	  echo "installing openssh-server (needed for the real test hosts)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server openssh-client >/dev/null) \
	  || { echo "error: could not install openssh-server; install it (apt-get install openssh-server) and rerun" >&2; exit 1; }; }
	@command -v strace >/dev/null || { \
	  echo "installing strace (crosshost explain's file evidence)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >/dev/null) \
	  || { echo "error: could not install strace; install it (apt-get install strace) and rerun" >&2; exit 1; }; }
	@command -v systemd-analyze >/dev/null || { \
	  echo "installing systemd (systemd-analyze verifies the units crosshost schedule writes)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null) \
	  || { echo "error: could not install systemd; install it (apt-get install systemd) and rerun" >&2; exit 1; }; }
	@rm -rf $(VENV); $(SETUPCACHE) restore venv $(VENV) $(VENV_KEY) || { \
	  echo "python3 -m venv $(VENV) && $(PY) -m pip install -q --no-deps -r tools/requirements-dev.txt"; \
	  python3 -m venv $(VENV) && $(PY) -m pip install -q --no-deps -r tools/requirements-dev.txt \
	  && $(SETUPCACHE) store venv $(VENV) $(VENV_KEY); } || exit 1
	$(PY) -m pip install -q --no-deps -e .
	@$(PY) tools/setupcache.py satisfied 'crosshost[dev]' || { \
	  echo "error: tools/requirements-dev.txt does not meet pyproject.toml (above); regenerate it (its first lines say how) and rerun" >&2; exit 1; }
	touch $(STAMP)

# The report.html tests drive a real headless Chromium (Debian's package); installed when missing.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  echo "installing chromium (needed for the report.html browser tests)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || { echo "error: could not install chromium; install it (apt-get install chromium) and rerun" >&2; exit 1; }; }

# Slurm (Debian's packages): the shard tests submit real job arrays to a single-node munged + slurmctld +
# slurmd that tools/slurmcluster.py starts in a temporary directory (no systemd); installed when missing.
.PHONY: slurm
# make setup and make test install it too (their own prerequisites are listed where they are defined)
setup test: slurm
slurm:
	@(for p in munged slurmctld slurmd sbatch scontrol; do command -v $$p >/dev/null || [ -x /usr/sbin/$$p ] || exit 1; done) || { \
	  echo "installing slurmctld, slurmd, slurm-client and munge (the Slurm job-array tests)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null) \
	  || { echo "error: could not install Slurm; install it (apt-get install slurmctld slurmd slurm-client munge) and rerun" >&2; exit 1; }; }

# Agent CLIs from the package registries that the integration tests drive end to end through the model
# proxy (tests/integration/test_agent_cli_sshd.py): Claude Code, Codex, Gemini CLI and opencode pinned
# in tools/agent-clis (package.json and its lockfile), mini-swe-agent in tools/agent-clis/mini-swe-agent.txt
# (every PyPI package pinned), installed into .agent-clis/ next to the venv, never globally. The
# mini-swe-agent venv is made with Debian's /usr/bin/python3, an interpreter every test host and uid can run.
AGENT_CLIS := .agent-clis
AGENT_CLIS_STAMP := $(AGENT_CLIS)/.installed
# each CLI's binary under node_modules : its package in tools/agent-clis/package.json
NPM_CLIS := .bin/claude:@anthropic-ai/claude-code .bin/codex:@openai/codex .bin/gemini:@google/gemini-cli \
  opencode-linux-x64/bin/opencode:opencode-linux-x64
$(AGENT_CLIS_STAMP): tools/agent-clis/package.json tools/agent-clis/package-lock.json
	@command -v npm >/dev/null || { \
	  echo "installing nodejs and npm (they install the agent CLIs of tools/agent-clis)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null) \
	  || { echo "error: could not install npm; install Node.js with npm (apt-get install nodejs npm) and rerun" >&2; exit 1; }; }
	rm -rf $(AGENT_CLIS) && mkdir -p $(AGENT_CLIS)
	cp tools/agent-clis/package.json tools/agent-clis/package-lock.json $(AGENT_CLIS)/
	@from=npm; $(SETUPCACHE) restore agent-clis-npm $(AGENT_CLIS)/node_modules $(NPM_KEY) && from=cache || { \
	  echo "npm ci --prefix $(AGENT_CLIS) --no-fund --no-audit --loglevel=error"; \
	  npm ci --prefix $(AGENT_CLIS) --no-fund --no-audit --loglevel=error || exit 1; }; \
	pids=; for pair in $(NPM_CLIS); do \
	  bin=$${pair%%:*}; pkg=$${pair#*:}; \
	  want=$$(node -p "require('./tools/agent-clis/package.json').dependencies['$$pkg']"); \
	  { $(AGENT_CLIS)/node_modules/$$bin --version 2>/dev/null | grep -qwF -- "$$want" || { \
	    echo "error: $(AGENT_CLIS)/node_modules/$$bin does not run the pinned $$pkg $$want (its postinstall did not place the native binary?); rm -rf $(AGENT_CLIS) $(SETUP_CACHE) and rerun make setup" >&2; exit 1; }; } & pids="$$pids $$!"; \
	done; \
	ok=1; for p in $$pids; do wait $$p || ok=0; done; [ $$ok = 1 ] || exit 1; \
	[ $$from = cache ] || $(SETUPCACHE) store agent-clis-npm $(AGENT_CLIS)/node_modules $(NPM_KEY)
	touch $@

MSWEA := $(AGENT_CLIS)/mini-swe-agent
$(MSWEA)/.installed: tools/agent-clis/mini-swe-agent.txt $(AGENT_CLIS_STAMP)
	@/usr/bin/python3 -c 'import ensurepip' 2>/dev/null || { \
	  echo "installing python3-venv (the mini-swe-agent venv is made with /usr/bin/python3)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null) \
	  || { echo "error: could not install python3-venv; install it (apt-get install python3-venv) and rerun" >&2; exit 1; }; }
	@rm -rf $(MSWEA); from=pip; $(SETUPCACHE) restore mini-swe-agent $(MSWEA) $(MSWEA_KEY) && from=cache || { \
	  echo "/usr/bin/python3 -m venv $(MSWEA) && $(MSWEA)/bin/python -m pip install -q --no-deps -r tools/agent-clis/mini-swe-agent.txt"; \
	  /usr/bin/python3 -m venv $(MSWEA) && $(MSWEA)/bin/python -m pip install -q --no-deps -r tools/agent-clis/mini-swe-agent.txt || exit 1; }; \
	$(MSWEA)/bin/python -c 'import importlib.metadata as m; import sys; want = [l.strip().split("==")[1] for l in open("tools/agent-clis/mini-swe-agent.txt") if l.startswith("mini-swe-agent==")][0]; sys.exit(m.version("mini-swe-agent") != want)' || { \
	  echo "error: $(MSWEA) does not hold the pinned mini-swe-agent; rm -rf $(MSWEA) $(SETUP_CACHE) and rerun make setup" >&2; exit 1; }; \
	[ $$from = cache ] || $(SETUPCACHE) store mini-swe-agent $(MSWEA) $(MSWEA_KEY)
	touch $@

agent-clis: $(AGENT_CLIS_STAMP) $(MSWEA)/.installed

# Debian's Docker (daemon, containerd, runc): the container hosts' tests and make demo-containers start
# it themselves (tools/testdocker.py: no systemd, a socket and data root of its own), and the packages
# its test images are assembled from (this machine's files, no registry); installed when missing.
docker:
	@missing=$$(for p in docker.io tzdata procps strace; do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	test -z "$$missing" || { \
	  echo "installing $$missing (Docker and what the container test images are assembled from)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq $$missing >/dev/null) \
	  || { echo "error: could not install $$missing; install it (apt-get install $$missing) and rerun" >&2; exit 1; }; }

# A Docker daemon for people (the tests start and stop their own): tools/testdocker.py up builds the
# test images offline when they are missing; docker-down stops it.
docker-up: $(STAMP) docker
	@$(PY) tools/testdocker.py up

docker-down:
	@python3 tools/testdocker.py down

setup: $(STAMP) browser agent-clis docker

# The two lanes (README "Testing"). test: every test, the sshd, Docker, browser and agent-CLI ones too,
# on TEST_WORKERS parallel workers (each starts its own test hosts on free ports; most of their time is
# spent waiting on hosts, so more workers than cores: on 2 cores the main lane took 5 min 15 s with 4,
# 4 min 18 s with 6 and 4 min 28 s with 8, where the CPU is full), then the `serial` ones alone. test-fast: what
# needs only the venv (no root, no network services, no browser), on FAST_WORKERS workers (one more than
# the cores: a fifth of its time is spent waiting on subprocesses; on 2 cores 76 s against 92 s with 2);
# a test there that starts sshd or Docker fails naming the marker it lacks (tests/support/lanes.py).
TEST_WORKERS ?= 6
FAST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) + 1 )))
# The tests keep the bytecode they compile whatever the shell says: under PYTHONDONTWRITEBYTECODE every
# worker and every crosshost a test starts compiled each module again (the main lane: 301 s -> 278 s).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/pytest
# mypy (a fresh clone has no cache: CPU for a while) runs beside the main lane, whose workers mostly
# wait on hosts; its output follows that lane, it is done before the serial lane, and it fails the target.
test: $(STAMP) browser agent-clis docker
	$(VENV)/bin/ruff check .
	@rc=0; out=$$(mktemp); echo "$(VENV)/bin/mypy (beside the tests; its output follows them)"; \
	$(VENV)/bin/mypy >$$out 2>&1 & mypy=$$!; \
	$(PYTEST) -q -ra -n $(TEST_WORKERS) --dist loadscope -m "not serial" || rc=$$?; \
	wait $$mypy || rc=1; cat $$out; rm -f $$out; \
	$(PYTEST) -q -ra -m serial || rc=$$?; exit $$rc

test-fast: $(STAMP)
	CROSSHOST_TEST_LANE=fast $(PYTEST) -q -ra -n $(FAST_WORKERS) -p no:cacheprovider \
	  -m "not sshd and not docker and not browser and not root and not serial"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/vermin -q --no-tips --violations -t=3.9- agent_runner orchestrator/hosts/runner_boot.py

# The demo: the triage suite on this machine (local, the reference) and box-b, a real sshd host in its
# own UTS + mount namespace on 127.0.0.1 whose private /opt holds a feature flag this machine lacks,
# while this machine's /tmp holds a stale cached wheel box-b's private /tmp does not. box-b listens on
# DEMO_PORT when given, else on 2222 when that is free, else on a port the kernel picks; the port is
# printed and written into .state/demo-hosts.toml (hosts.toml with box-b's port replaced, paths absolute).
# Exit 1 (flips over the gate / invalid) is the demo's finding, not a failure of `make`.
DEMO_STATE ?= /var/tmp/crosshost-demo
DEMO_PORT ?=
demo: $(STAMP)
	@set -u; \
	down() { $(PY) tools/testhosts.py down --state $(DEMO_STATE) >/dev/null 2>&1 || true; rm -rf /tmp/crosshost-demo; }; \
	trap down EXIT; \
	port="$(DEMO_PORT)"; [ -n "$$port" ] || port=$$($(PY) tools/testhosts.py free-port --prefer 2222) || exit 1; \
	echo "== starting box-b (sshd on 127.0.0.1:$$port, own hostname, /root, /tmp, /opt)$(if $(DEMO_PORT),, -- DEMO_PORT=N picks the port)"; \
	$(PY) tools/testhosts.py up --names box-b --base-port $$port --state $(DEMO_STATE) --no-local \
	  --identity-out .state/keys/id_ed25519 --known-hosts-out .state/known_hosts \
	  --inventory-out $(DEMO_STATE)/hosts.toml || { echo "error: box-b did not start on port $$port (free it, or run make demo DEMO_PORT=<another port>)" >&2; exit 1; }; \
	$(PY) tools/testhosts.py retarget hosts.toml $$port .state/demo-hosts.toml || exit 1; \
	mkdir -p $(DEMO_STATE)/hosts/box-b/opt/crosshost-demo; \
	touch $(DEMO_STATE)/hosts/box-b/opt/crosshost-demo/feature.flag; \
	echo "== box-b: /opt/crosshost-demo/feature.flag created (inside box-b only)"; \
	mkdir -p /tmp/crosshost-demo/wheels; touch /tmp/crosshost-demo/wheels/triage_tools-0.9-py3-none-any.whl; \
	echo "== local: a stale wheel left in /tmp/crosshost-demo/wheels (this machine only; box-b has its own /tmp)"; \
	echo "== crosshost replay examples/suites/triage -i .state/demo-hosts.toml --explain   (hosts.toml, box-b on port $$port)"; \
	rc=0; $(VENV)/bin/crosshost replay examples/suites/triage -i .state/demo-hosts.toml --explain || rc=$$?; \
	echo "== crosshost replay exited $$rc (0 valid, within the gate; 1 invalid or flips over the gate; 2 bad input; 3 a host failed)"; \
	case $$rc in 0|1) exit 0;; *) exit $$rc;; esac

# The container demo: the triage suite on this machine (local, the reference) and two containers from
# images built offline here (tools/testdocker.py: this machine's Debian packages, no registry) that
# differ as real images do: img-posix has no UTF-8 locale default, another time zone, another
# /etc/crosshost-image.conf and a feature flag under /opt. Each container is started for the run and
# removed after it; the Docker daemon is stopped again when this target started it.
# Exit 1 (flips over the gate / invalid) is the demo's finding, not a failure of `make`.
demo-containers: $(STAMP) docker
	@set -u; \
	started=$$($(PY) tools/testdocker.py up) || { echo "error: the Docker daemon did not start or the images were not built (above)" >&2; exit 1; }; \
	down() { case "$$started" in *" started "*) $(PY) tools/testdocker.py down;; esac; }; \
	trap down EXIT; \
	echo "== $$started"; \
	$(PY) tools/testdocker.py inventory .state/containers-hosts.toml || exit 1; \
	echo "== images (built offline, reused while their recipe holds):"; \
	$(PY) tools/testdocker.py images | sed 's/^/   /'; \
	echo "== crosshost replay examples/suites/triage -i .state/containers-hosts.toml --explain"; \
	rc=0; $(VENV)/bin/crosshost replay examples/suites/triage -i .state/containers-hosts.toml --explain || rc=$$?; \
	echo "== crosshost replay exited $$rc (0 valid, within the gate; 1 invalid or flips over the gate; 2 bad input; 3 a host failed)"; \
	case $$rc in 0|1) exit 0;; *) exit $$rc;; esac

# Real sshd test hosts for people (the tests start their own): box-b and box-c, on 2222/2223 where free
# (else ports the kernel picks), or on HOSTS_PORT and the port after it. The client key, known_hosts
# and an inventory of local, box-b and box-c (their real ports) go under HOSTS_OUT.
HOSTS_STATE ?= /var/tmp/crosshost-hosts
HOSTS_PORT ?=
HOSTS_OUT ?= .state
hosts-up: $(STAMP)
	@$(PY) tools/testhosts.py up --names box-b,box-c $(if $(HOSTS_PORT),--base-port $(HOSTS_PORT)) \
	  --state $(HOSTS_STATE) --identity-out $(HOSTS_OUT)/keys/id_ed25519 \
	  --known-hosts-out $(HOSTS_OUT)/known_hosts --inventory-out $(HOSTS_OUT)/hosts.toml
	@echo "try: $(VENV)/bin/crosshost hosts -i $(HOSTS_OUT)/hosts.toml   (make hosts-down stops them)"

hosts-down:
	@python3 tools/testhosts.py down --state $(HOSTS_STATE)

# Benchmarks (BENCHMARKS.md): its own sshd hosts on free ports picked at start. Ansible gets a venv
# of its own so its dependencies never change the environment the tests run in.
BENCH_VENV ?= .venv-bench
BENCH_ARGS ?=
$(BENCH_VENV)/.installed:
	python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q 'ansible-core>=2.16,<2.20'
	touch $@

bench: $(STAMP) browser $(BENCH_VENV)/.installed
	BENCH_ANSIBLE_VENV=$(abspath $(BENCH_VENV)) $(PY) -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(AGENT_CLIS) build *.egg-info
