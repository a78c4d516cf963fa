"""``hb rotate-secret begin | commit | finish``: the command line of
``hamsterbunker.rotation``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..core.errors import ConfigError
from ..records import check_name
from ..rotation import Rotation
from ..sealing.keyring import Keyring
from ..stores.base import Refusal
from .args import store_url
from .context import opened_store

__all__ = ["rotate_secret"]


def rotate_secret(args: argparse.Namespace, read_keyring: Callable[[], Keyring]) -> int:
    agent = check_name("agent id", args.agent_id)
    url = store_url(args)
    keyring = read_keyring()
    with opened_store(url) as store:
        if Refusal.KEY_ROTATION in store.report().refuses:  # said before anything is read
            raise ConfigError(
                f"store {store.url} does not rotate keys: rotation rewrites records every "
                "node shares, which this store cannot do (a syncdir:// store: a synced "
                "folder keeps one of two copies of a rewritten file); nothing was changed"
            )
        rotation = Rotation(store, agent, keyring, say=lambda line: print(line, flush=True))
        if args.step == "begin":
            rotation.begin(args.timeout)
        elif args.step == "commit":
            rotation.commit(args.timeout)
        else:
            rotation.finish()
    return 0
