# The two set-up commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean install-systemd

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test,tui,redis,etcd]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/hb demo

# pytest exits 5 when it collects no test: that is a failure here, as it is in CI.
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Measured figures are printed and written to docs/benchmarks.md.
bench: $(STAMP)
	$(BIN)/python -m benchmarks

# Install a node for systemd (as root): a virtual environment in $(PREFIX), the
# template unit hamsterbunker@.service, and the static user `hamsterbunker`.
# HB_UID pins that user's UID: nodes sharing an NFS store need the same one.
# Then: hb init NAME, and systemctl enable --now hamsterbunker@NAME.
PREFIX ?= /opt/hamsterbunker
UNIT_DIR ?= /etc/systemd/system
SYSUSERS_DIR ?= /etc/sysusers.d
HB_UID ?= -
install-systemd:
	$(PYTHON) -m venv $(PREFIX)
	$(PREFIX)/bin/pip install --quiet .
	ln -sf $(PREFIX)/bin/hb /usr/local/bin/hb
	install -d $(UNIT_DIR) $(SYSUSERS_DIR)
	sed 's|/opt/hamsterbunker/bin/hb|$(PREFIX)/bin/hb|' systemd/hamsterbunker@.service \
		> $(UNIT_DIR)/hamsterbunker@.service
	sed 's|^u hamsterbunker - |u hamsterbunker $(HB_UID) |' systemd/hamsterbunker.sysusers \
		> $(SYSUSERS_DIR)/hamsterbunker.conf
	systemd-sysusers $(SYSUSERS_DIR)/hamsterbunker.conf
	if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
	@echo "installed; next: hb init NAME, then systemctl enable --now hamsterbunker@NAME"

clean:
	rm -rf $(VENV) build *.egg-info
