"""``hb migrate-store --from URL --to URL``: the command line of ``stores.migrate``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..core.errors import ConfigError
from ..sealing import Sealer
from ..sealing.keyring import Secret
from ..stores import is_syncdir_url
from ..stores.migrate import migrate, open_migration
from ..stores.migrate_syncdir import migrate_syncdir, open_syncdir_migration

__all__ = ["migrate_store"]


def migrate_store(args: argparse.Namespace, read_secret: Callable[[], Secret]) -> int:
    secret = read_secret()
    if is_syncdir_url(args.source):
        return _migrate_syncdir(args, secret)
    source, target = open_migration(args.source, args.target)
    try:
        cluster = source.read_cluster()
        if cluster is None:
            raise ConfigError(f"store {source.url} holds no cluster record: nothing to migrate")
        migrated = migrate(source, target, Sealer(secret, cluster), say=_say)
    finally:
        source.close()
        target.close()
    for line in migrated.left_out:
        _say(f"left out (junk in the earlier store): {line}")
    _say(
        f"migrated {len(migrated.agents)} agent(s) from {source.url} to {target.url}: "
        "start this version's nodes with --store set to it"
    )
    return 0


def _migrate_syncdir(args: argparse.Namespace, secret: Secret) -> int:
    source, target = open_syncdir_migration(args.source, args.target)
    migrated = migrate_syncdir(source, target, secret, say=_say)
    for line in migrated.left_out:
        _say(f"left out (junk in the earlier folder): {line}")
    _say(
        f"migrated {len(migrated.agents)} agent(s) of its nodes from {source} to {target}: "
        "let the sync bring it to every machine, then start this version's nodes on it"
    )
    return 0


def _say(line: str) -> None:
    print(line, flush=True)
