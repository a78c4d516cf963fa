"""The two tiers, and shared fixtures: local clusters of real node processes, held to the
history checker.

``make test`` runs the fast tier (``-m "not slow"``), ``make test-all`` every test
(tests/README.md). A test is in the slow tier when it carries one of
``SLOW_MARKERS``, unless it is marked ``smoke``: the few real-process tests the
fast tier keeps. Tests that cannot share the machine (a booted systemd, network
namespaces) are put in one ``xdist_group``, so that under ``--dist loadgroup``
they run one after another on one worker.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hamsterbunker.core.history import read_history
from hamsterbunker.ops.checker import check
from hamsterbunker.ops.local import LocalCluster
from tests.support import SUPPORT_DIR

SLOW_MARKERS = ("multiprocess", "fault", "system", "syncthing")
# What cannot run beside each other: a booted systemd in nspawn (one per worker that
# runs any), network namespaces with nftables rules.
EXCLUSIVE_MARKERS = ("system", "netns")


@pytest.hookimpl(wrapper=True)  # marks before -m deselects and xdist reads the groups
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    for item in items:
        if not item.get_closest_marker("smoke") and any(
            item.get_closest_marker(name) for name in SLOW_MARKERS
        ):
            item.add_marker(pytest.mark.slow)
        if any(item.get_closest_marker(name) for name in EXCLUSIVE_MARKERS):
            item.add_marker(pytest.mark.xdist_group("exclusive"))
    yield
    # On an xdist worker under --dist loadgroup, a grouped test's id ends in @group.
    # pytest 9.2 silently stopped that (pytest-xdist issue 1386): fail, never share.
    if getattr(config.option, "loadgroup", False):
        ungrouped = [i.nodeid for i in items if i.get_closest_marker("xdist_group")]
        if any("@" not in nodeid for nodeid in ungrouped):
            raise pytest.UsageError(
                "pytest-xdist did not group the tests that cannot share the machine "
                f"(e.g. {ungrouped[0]}): use a pytest that pyproject.toml allows"
            )


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Make LocalClusters of `python -m hamsterbunker run` processes; all stopped at the end."""
    made: list[LocalCluster] = []

    def make(agent: str = "hb_test_agents:JournalCounter", **kwargs: object) -> LocalCluster:
        store_dir = tmp_path / f"store{len(made)}"
        env = {
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(SUPPORT_DIR), os.environ.get("PYTHONPATH")])
            ),
            "HB_TEST_JOURNAL": str(tmp_path / f"journal{len(made)}.jsonl"),
        }
        env.update(kwargs.pop("env", {}))  # type: ignore[arg-type]
        cluster = LocalCluster(
            store_url=str(kwargs.pop("store_url", None) or store_dir.as_uri()),  # file by default
            secret=secrets.token_urlsafe(16),
            agent=agent,
            log_dir=tmp_path / f"logs{len(made)}",
            history=tmp_path / f"history{len(made)}.jsonl",
            env=env,
            **kwargs,  # type: ignore[arg-type]
        )
        made.append(cluster)
        return cluster

    yield make
    violations = []
    for cluster in made:
        cluster.stop_all()
        for node in cluster.processes:  # shown by pytest only when the test failed
            print(f"----- log of {node} -----\n{cluster.log(node)}")
        if cluster.history and cluster.history.exists():
            violations += check(read_history(cluster.history))
    # Every multi-process test also holds its whole history to the safety rules.
    assert violations == [], violations
