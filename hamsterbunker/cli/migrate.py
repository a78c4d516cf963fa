"""``hb migrate-store --from URL --to URL``: the command line of ``stores.migrate``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from ..core.errors import ConfigError
from ..sealing import Sealer
from ..sealing.keyring import Secret
from ..stores import is_syncdir_url
from ..stores.migrate import migrate, open_migration
from ..stores.migrate_syncdir import migrate_syncdir, open_syncdir_migration
from .args import Subcommands, add_command

__all__ = ["add_migrate_parser", "migrate_store"]

DESCRIPTION = """\
Copy a store written by an earlier version of HamsterBunker (file://, redis:// or
etcd://) into a new, empty store in this version's layout (file://, redis://, etcd://
or postgresql://): per agent the lease at its epoch, every retained checkpoint byte
for byte, the effect journal of the step in flight, the loss-acceptance record and
the inbox (pending submissions, consumed ones with their replies, numbers and request
ids). Heartbeats and event logs are not copied. The earlier store is only read.

A syncdir:// folder is copied into a new, empty syncdir:// folder: each node's
subtree as above (its claim keeping its version), its published claims, term
records and chain choices byte for byte, the marker and the cluster record. Run it
on one machine with every node stopped and the sync done; the sync tool brings the
new folder to the others.

Stop every node first: the source is watched for a lease TTL, and any change refuses.
Then start the nodes of this version with --store set to the new store.

exit status: 0 copied; 1 a store failed, or a node still writes the source (nothing
is wrong with the target: run it again once stopped); 2 a usage mistake (a bad URL, a
secret that does not open the cluster, a target that is not empty)."""


def add_migrate_parser(sub: Subcommands, secret_help: str) -> None:
    parser = add_command(
        sub,
        "migrate-store",
        "copy an earlier version's store into this version's layout",
        DESCRIPTION,
        secret_help,
    )
    parser.add_argument("--from", dest="source", required=True, metavar="URL",
                        help="the earlier version's store")  # fmt: skip
    parser.add_argument("--to", dest="target", required=True, metavar="URL",
                        help="a new, empty store of this version")  # fmt: skip
    parser.add_argument("--secret-file", type=Path, help="file holding the cluster's secret")


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
