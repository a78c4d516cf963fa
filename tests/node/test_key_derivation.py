"""The secret's key for a cluster is derived once per process (cluster_keys.master_key):
a process keeping many agents opens their cluster record once per agent."""

from __future__ import annotations

import threading

import pytest

from hamsterbunker.sealing import cluster_keys
from hamsterbunker.sealing.cluster_keys import master_key


def test_a_key_is_derived_once_however_many_agents_open_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    derived: list[bytes] = []
    real = cluster_keys.Scrypt

    class Counted:
        def __init__(self, **parameters: object) -> None:
            self._scrypt = real(**parameters)  # type: ignore[arg-type]

        def derive(self, key_material: bytes) -> bytes:
            derived.append(key_material)
            return self._scrypt.derive(key_material)

    monkeypatch.setattr(cluster_keys, "Scrypt", Counted)
    monkeypatch.setattr(cluster_keys, "_DERIVED", {})
    salt = b"s" * 16
    keys: list[bytes] = []
    threads = [
        threading.Thread(target=lambda: keys.append(master_key("secret", salt, 1024, 8, 1)))
        for _ in range(20)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(keys) == 20 and len(set(keys)) == 1
    assert len(derived) == 1
    # Another secret or salt is another key, derived in its turn.
    assert master_key("other", salt, 1024, 8, 1) != keys[0]
    assert master_key("secret", b"t" * 16, 1024, 8, 1) != keys[0]
    assert len(derived) == 3


def test_only_the_newest_derivations_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_keys, "_DERIVED", {})
    for n in range(cluster_keys._DERIVED_KEPT + 5):
        master_key(f"secret-{n}", b"s" * 16, 1024, 8, 1)
    assert len(cluster_keys._DERIVED) == cluster_keys._DERIVED_KEPT
