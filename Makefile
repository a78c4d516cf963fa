# The two set-up commands of the README: `make demo` and `make test`; `make test-all`
# is the whole suite, which .ci/run runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: demo test test-all coverage bench venv clean install-systemd

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test,tui,redis,etcd,postgres,pydantic-ai,langgraph]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/hb demo

# pytest exits 5 when it collects no test: that is a failure here, as it is in CI.
# Most tests wait on leases and servers rather than compute, so more workers than
# cores pays (tests/README.md has the measures); tests that cannot share the
# machine run one after another in one xdist_group (tests/conftest.py).
# The slow tier's real processes load the machine more, and lease timing tests
# beside them need the room: fewer workers there.
WORKERS ?= 6
WORKERS_ALL ?= 4

# The fast tier: everything but the tests marked slow (tests/conftest.py).
test: $(STAMP)
	HB_FAST_TIER=1 $(BIN)/python -m pytest -n $(WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

# Every test: the fast tier and the slow one (real processes, faults, systemd, Syncthing).
test-all: $(STAMP)
	$(BIN)/python -m pytest -n $(WORKERS_ALL) --dist loadgroup $(PYTEST_ARGS)

# Line coverage of hamsterbunker/ under every test, node processes included
# (coverage's subprocess patch); TIER=fast measures the fast tier alone.
TIER ?= all
coverage: $(STAMP)
	rm -f .coverage .coverage.*
	status=0; $(BIN)/coverage run -m pytest -n $(WORKERS) --dist loadgroup \
		$(if $(filter fast,$(TIER)),-m "not slow") $(PYTEST_ARGS) || status=$$?; \
	$(BIN)/coverage combine --quiet && $(BIN)/coverage report --sort=cover | tail -30; \
	exit $$status

# The benchmarks' own extra (matplotlib, for docs/growth.png), apart: demo and test skip it.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[test,tui,redis,etcd,postgres,pydantic-ai,langgraph,bench]'
	touch $(BENCH_STAMP)

# Measured figures are printed and written to docs/benchmarks.md.
bench: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks

# Install a node for systemd (as root): a virtual environment in $(PREFIX) with
# the extras a node uses (EXTRAS: hb-tui, the Redis, etcd and PostgreSQL clients; an agent
# built on PydanticAI or LangGraph: add pydantic-ai or langgraph, or let AGENT_PKG require it), hb and
# hb-tui linked into $(BIN_DIR), the template unit hamsterbunker@.service, and
# the static user `hamsterbunker`. AGENT_PKG: your agents' package, installed
# into the same environment (anything pip takes: mypkg, ./path, 'mypkg==1.2').
# HB_UID pins that user's UID: nodes sharing an NFS store need the same one.
# Then: hb init NAME --store URL, and systemctl enable --now hamsterbunker@NAME.
PREFIX ?= /opt/hamsterbunker
BIN_DIR ?= /usr/local/bin
UNIT_DIR ?= /etc/systemd/system
SYSUSERS_DIR ?= /etc/sysusers.d
HB_UID ?= -
EXTRAS ?= tui,redis,etcd,postgres
AGENT_PKG ?=
install-systemd:
	$(PYTHON) -m venv $(PREFIX)
	$(PREFIX)/bin/pip install --quiet '.[$(EXTRAS)]'
	if [ -n '$(AGENT_PKG)' ]; then $(PREFIX)/bin/pip install --quiet $(AGENT_PKG); fi
	install -d $(BIN_DIR) $(UNIT_DIR) $(SYSUSERS_DIR)
	ln -sf $(PREFIX)/bin/hb $(BIN_DIR)/hb
	ln -sf $(PREFIX)/bin/hb-tui $(BIN_DIR)/hb-tui
	sed 's|/opt/hamsterbunker/bin/hb|$(PREFIX)/bin/hb|' systemd/hamsterbunker@.service \
		> $(UNIT_DIR)/hamsterbunker@.service
	sed 's|^u hamsterbunker - |u hamsterbunker $(HB_UID) |' systemd/hamsterbunker.sysusers \
		> $(SYSUSERS_DIR)/hamsterbunker.conf
	systemd-sysusers $(SYSUSERS_DIR)/hamsterbunker.conf
	if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "installed; next: hb init NAME --store URL (or --local-only), then systemctl enable --now hamsterbunker@NAME"

clean:
	rm -rf $(VENV) build *.egg-info
