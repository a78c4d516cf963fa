"""The `booted` fixture: one real systemd in systemd-nspawn for the whole session.

Every test module in this directory is marked `system` (its ``pytestmark``), so
`-m "not system"` leaves them out, and tests/conftest.py runs them one after
another on one worker. Where the machine cannot run them (not root, debootstrap or
systemd-nspawn missing, root tree cannot be built) they are skipped with the
reason, except on CI (CI=true), where that is a failure: a CI that silently
skips them would prove nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import nspawn

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The first test to use `booted` may debootstrap the root tree, far longer
    # than the suite's per-test timeout; only then is the timeout lengthened.
    if nspawn.cache_dir().is_dir():
        return
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.timeout(nspawn.BUILD_TIMEOUT + 300))


@pytest.fixture(scope="session")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nspawn.Container]:
    """A booted container (running or degraded), stopped and removed after the session."""
    try:
        nspawn.check_prerequisites()
        nspawn.ensure_rootfs()
    except nspawn.HarnessUnavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"system tests cannot run on CI: {e}")
        pytest.skip(str(e))
    with nspawn.booted_container(tmp_path_factory.mktemp("nspawn")) as container:
        yield container
