"""The ``hb`` parser: every command's flags and help. It imports nothing that a command
runs, so that ``hb`` starts fast: ``main`` imports a command's module only to run it."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from .. import __version__
from ..core.timing import DEFAULT_LEASE_TTL_MS, DEFAULT_TICK_MS, MAX_WATCH_S
from .args import Subcommands, add_command, add_wait_flags, positive_int, seconds, whole_number
from .context import EXIT_TIMEOUT, EXIT_USAGE
from .node_parsers import INIT_HELP, RUN_HELP, add_init_parser, add_run_parser

__all__ = ["build_parser"]

SECRET_HELP = """\
the network secret (at least 8 characters) is taken from, in this order:
  1. the environment variable HB_SECRET (and HB_SECRET_PREVIOUS while the secret
     is rotated: see hb rotate-secret)
  2. the file named by --secret-file (one secret a line, newest first)
  3. $CREDENTIALS_DIRECTORY/secret (systemd LoadCredential=secret:...), the same
Never pass it on the command line: every user can read that."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """hb's parser. Given the command about to run, the flags of hb run and hb init (whose
    defaults come from the node's config) are added only if it is one of them."""
    parser = _Parser(
        prog="hb",
        description="HamsterBunker: keep an agent alive across machines.",
        epilog="Without a command, hb prints this help on stderr and exits 2.",
    )
    parser.add_argument("--version", action="version", version=f"hb {__version__}")
    # Not required: a bare `hb` gets this help, not an argparse error (main).
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    if command in (None, "run", "init"):
        add_run_parser(sub, SECRET_HELP)
        add_init_parser(sub)
    else:  # listed all the same
        sub.add_parser("run", help=RUN_HELP)
        sub.add_parser("init", help=INIT_HELP)
    _add_demo_parser(sub)
    add_accept_loss_parser(sub, SECRET_HELP)
    add_status_parser(sub)
    add_submit_parser(sub, SECRET_HELP)
    add_forget_parser(sub, SECRET_HELP)
    add_control_parsers(sub, SECRET_HELP)
    add_rotate_parser(sub, "file holding the secrets, one a line, newest first")
    add_choose_chain_parser(sub, SECRET_HELP)
    add_migrate_parser(sub, SECRET_HELP)
    return parser


def _add_demo_parser(sub: Subcommands) -> None:
    demo = sub.add_parser("demo", help="the local three-node survival demo")
    demo.add_argument("--kills", type=positive_int, default=1, help="kill the active node N times")
    demo.add_argument("--store", help="store URL (default: a temporary directory)")
    demo.add_argument("--tick-ms", type=positive_int, help=f"default: {DEFAULT_TICK_MS}")
    demo.add_argument("--lease-ttl-ms", type=positive_int, help=f"default: {DEFAULT_LEASE_TTL_MS}")


SWITCHOVER_WAIT_S = 30.0


SWITCHOVER_HELP = """\
Hand the lease of agent ID from its live leader to the live standby NODE (--to), or
to the freshest live standby. The leader finishes its step in flight (within its stop
grace), publishes it and releases the lease naming the target, which takes it at once;
the other standbys leave it to the target for a TTL. Leader and target must be live:
their records of this term written within a TTL, as this machine's clock reads their
dates; else seen to change while watched (at most a lease TTL).

exit status: 0 asked (with --wait: the target leads); 1 refused, nothing changed (no
live leader, the target is not a live standby) or the store failed; 2 a usage mistake
or a wrong secret; 124 --wait ran out."""


PAUSE_HELP = """\
Pause agent ID for maintenance: its leader finishes its step in flight and steps no
more, but keeps its lease and heartbeats, so standbys do not take over. A paused
leader that dies is still replaced, and the new leader starts paused. hb resume ends it."""


def add_control_parsers(sub: Subcommands, secret_help: str) -> None:
    switch = add_command(
        sub, "switchover", "hand the lease to a live standby, now", SWITCHOVER_HELP
    )
    _agent_flags(switch, secret_help)
    switch.add_argument("--to", metavar="NODE", help="the standby to hand over to")
    add_wait_flags(switch, "the target leads", SWITCHOVER_WAIT_S)
    for name, text in (("pause", "hold the agent still"), ("resume", "end a pause")):
        _agent_flags(add_command(sub, name, text, PAUSE_HELP), secret_help)
    past = sub.add_parser(
        "history",
        help="the agent's takeovers, newest first, each with its gap: how long no leader "
        "was able to step",
    )
    past.add_argument("--store", help="store URL (default: $HB_STORE)")
    past.add_argument("--agent-id", required=True)
    past.add_argument("--json", action="store_true", help="one JSON object per takeover")


def add_accept_loss_parser(sub: Subcommands, secret_help: str) -> None:
    accept = add_command(
        sub,
        "accept-loss",
        "accept a loss the nodes refuse to resume behind (stop every node first)",
        "Give up checkpoints that are gone or damaged (or, with --to-seq, newer than N) and let "
        "nodes resume from the newest authenticated checkpoint at or below N. Refused while a "
        "node is live (its heartbeat or events change within a lease TTL, watched from here). "
        "Prints what is given up and asks first.",
        secret_help,
    )
    accept.add_argument("--store", help="store URL (default: $HB_STORE)")
    accept.add_argument("--agent-id", required=True)
    accept.add_argument(
        "--to-seq",
        type=positive_int,
        metavar="N",
        help="resume from the newest authenticated checkpoint at or below seq N "
        "(default: the newest that authenticates)",
    )
    accept.add_argument("--yes", action="store_true", help="do not ask")
    accept.add_argument("--secret-file", type=Path, help="file holding the network secret")


def _agent_flags(parser: argparse.ArgumentParser, secret_help: str) -> None:
    parser.add_argument("--store", help="store URL (default: $HB_STORE)")
    parser.add_argument("--agent-id", required=True)
    parser.add_argument("--secret-file", type=Path, help=secret_help)


# -- hb status -------------------------------------------------------------------------------

STATUS_HELP = """\
Show an agent's lease, nodes, checkpoint and inbox, and say whether it is healthy:
exit 0 healthy; 1 degraded (no live leader, a failing step, a node refusing); 2 when
status cannot tell (an unknown agent id, an unreadable store).

Whether the lease is live is seen from here: the record is watched on this machine's
own clock for up to one lease TTL (never comparing clocks across machines); it is
live if it changed (its holder renews it every tick) within the last TTL."""


def add_status_parser(sub: Subcommands) -> None:
    parser = add_command(
        sub,
        "status",
        "show an agent's lease, nodes and checkpoints; exit 0 healthy, 1 degraded",
        STATUS_HELP,
    )
    parser.add_argument("--store", help="store URL (default: $HB_STORE)")
    parser.add_argument(
        "--instance", metavar="NAME", help="take the store (and agent id) from NAME's config file"
    )
    parser.add_argument(
        "--agent-id", help="default: the store's only agent; with several, one line each"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--watch", action="store_true", help="refresh every tick until Ctrl-C")
    parser.add_argument(
        "--count", type=positive_int, metavar="N", help="with --watch: stop after N refreshes"
    )
    parser.add_argument(
        "--observe-ms",
        type=whole_number,
        metavar="MS",
        help="watch the lease for at most MS to tell whether it is live (default: its TTL, "
        f"at most {MAX_WATCH_S:.0f} s); 0: do not watch, judge only the rest",
    )


# -- hb submit -------------------------------------------------------------------------------

SUBMIT_HELP = """\
Admit one JSON payload to the inbox of agent ID, once per request id, and print its
number. No node needs to be up: the running agent (now, or after a failover) sees it
in its step's inbox. The store must exist (a node has run on it).

The payload comes from exactly one of --data JSON, --data-file FILE, or - (stdin).
It prints "admitted as #N (request id R)"; with --wait, then the reply as JSON on
the next line (null if the agent consumed it without one). A second submit with the
same --request-id admits nothing: it prints "already admitted as #N" and exits 0
(with --wait it waits for that submission's reply), so retrying a submit is safe.
With --json, one object instead: {"number", "request_id", "duplicate", "reply"}
("reply" only once there is one: not after a timeout).

exit status: 0 admitted (or already admitted), and with --wait replied;
  1 the store refused or failed (a full inbox, an unreachable store, a reply or an
    earlier admission that does not authenticate);
  2 a usage mistake (a payload that is not JSON, a bad request id, a wrong secret);
  124 --wait --timeout ran out (the submission stays admitted: wait again with the
      same --request-id)."""


def add_submit_parser(sub: Subcommands, secret_help: str) -> None:
    submit = add_command(
        sub,
        "submit",
        "hand a JSON payload to an agent's inbox (and wait for its reply)",
        SUBMIT_HELP,
        secret_help,
    )
    submit.add_argument("--store", help="store URL (default: $HB_STORE)")
    submit.add_argument("--agent-id", required=True)
    submit.add_argument(
        "--request-id",
        metavar="R",
        help="the submission's name: a retry under the same one is admitted once "
        "(letters, digits and ._:@+=-; default: a new UUID, printed)",
    )
    submit.add_argument("--data", metavar="JSON", help="the payload, a JSON text")
    submit.add_argument(
        "--data-file", type=Path, metavar="FILE", help="a file holding the payload (JSON)"
    )
    submit.add_argument(
        "stdin",
        nargs="?",
        metavar="-",
        help="read the payload (JSON) from stdin",
    )
    submit.add_argument(
        "--wait", action="store_true", help="then wait for the agent's reply and print it (JSON)"
    )
    submit.add_argument(
        "--timeout",
        type=seconds,
        metavar="S",
        help=f"with --wait: give up after S seconds (exit {EXIT_TIMEOUT}; default: no limit)",
    )
    submit.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object: {"number", "request_id", "duplicate"} and, with '
        '--wait, "reply"',
    )
    submit.add_argument(
        "--new-agent",
        action="store_true",
        help="the agent has no records in the store yet (no node of it has run): admit the "
        "submission all the same (without it, an agent id the store does not hold is refused: "
        "a mistyped one would make a new agent)",
    )
    submit.add_argument("--secret-file", type=Path, help="file holding the network secret")


# -- hb forget -------------------------------------------------------------------------------

FORGET_HELP = """\
Drop node NODE's heartbeat and event log from agent ID's records in the store, so that
hb status and hb-tui no longer show it. Only for a node that is gone: NODE's records
are watched from here, on this machine's own clock, for one lease TTL (never comparing
clocks across machines), and if its heartbeat or events change it is live: refused.
Refused too while the lease names NODE as holder. A forgotten node that runs again
shows again.

hb forget --agent ID removes a whole agent instead (a mistyped id an earlier version made,
an agent retired): every record of it, once none of its nodes is seen live the same way;
it says what goes and asks first (--yes: does not ask).

exit status: 0 forgotten; 1 refused (NODE is live or holds the lease; a node of the agent
  is live; not confirmed) or nothing of NODE is stored; 2 a usage mistake (a missing flag,
  a bad URL or name, an agent the store does not hold, a wrong secret)."""


def add_forget_parser(sub: Subcommands, secret_help: str) -> None:
    parser = add_command(
        sub,
        "forget",
        "drop a dead node's heartbeat and events, or (--agent) a whole agent; refused while live",
        FORGET_HELP,
        secret_help,
    )
    parser.add_argument("node", metavar="NODE", nargs="?", help="the node id to forget")
    parser.add_argument("--agent-id", metavar="ID", help="the agent NODE kept")
    parser.add_argument(
        "--agent",
        metavar="ID",
        help="forget a whole agent instead: every record of it (its lease, checkpoints, "
        "journal, inbox, heartbeats and events); refused while a node of it is live; asks first",
    )
    parser.add_argument("--yes", action="store_true", help="with --agent: do not ask")
    parser.add_argument("--store", help="store URL (default: $HB_STORE)")
    parser.add_argument("--secret-file", type=Path, help="file holding the network secret")


# -- hb choose-chain -------------------------------------------------------------------------

CHAIN_WAIT_S = 120.0


CHAIN_HELP = """\
On a syncdir:// store: list agent ID's lineage and the chains kept aside, or (with
--term EPOCH@NODE) choose the checkpoint the next term goes on from: by default the
newest of that term's chain, or seq N (--seq). The choice is signed and written into
this machine's node subtree (--node-id, or the instance's); once it has synced, the
leader ends its term and the next term restores from the chosen checkpoint. Nothing
is deleted: the steps the chosen checkpoint leaves out are kept aside and reported.

exit status: 0 listed, or chosen (with --wait: a term went on from it); 1 refused,
nothing written (a choice after this term was already made here, or --wait ran out);
2 a usage mistake (a bad flag, store, term or seq, a wrong secret)."""


def add_choose_chain_parser(sub: Subcommands, secret_help: str) -> None:
    parser = add_command(
        sub,
        "choose-chain",
        "syncdir: list the chains kept aside, or choose the one to go on from",
        CHAIN_HELP,
        secret_help,
    )
    parser.add_argument("--agent-id", metavar="ID", help="default: the instance's")
    parser.add_argument("--instance", metavar="NAME", help="take store and node id from NAME.toml")
    parser.add_argument("--store", help="store URL (default: $HB_STORE)")
    parser.add_argument("--node-id", help="this machine's node: its subtree holds the choice")
    parser.add_argument("--term", metavar="EPOCH@NODE", help="the term whose chain to go on from")
    parser.add_argument("--seq", type=positive_int, metavar="N", help="default: its newest")
    parser.add_argument("--yes", action="store_true", help="do not ask")
    add_wait_flags(parser, "a term goes on from it", CHAIN_WAIT_S)
    parser.add_argument("--secret-file", type=Path, help="file holding the network secret")


# -- hb migrate-store ------------------------------------------------------------------------

MIGRATE_HELP = """\
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
        MIGRATE_HELP,
        secret_help,
    )
    parser.add_argument("--from", dest="source", required=True, metavar="URL",
                        help="the earlier version's store")  # fmt: skip
    parser.add_argument("--to", dest="target", required=True, metavar="URL",
                        help="a new, empty store of this version")  # fmt: skip
    parser.add_argument("--secret-file", type=Path, help="file holding the cluster's secret")


# -- hb rotate-secret ------------------------------------------------------------------------

ROTATE_TIMEOUT_S = 60.0


ROTATE_HELP = """\
Rotate the cluster's secret without stopping the agent, in three steps, each
refused (exit 1, nothing changed) until it is safe; each may be run again:

  begin   every live node must already hold the new secret (restart them one by
          one with the new secret first and the old one after it); the cluster
          then seals with the new key, and this waits until every live node does
  commit  re-seals every retained checkpoint under the new key
  finish  drops the old key: nodes holding only the old secret are refused

Give this command both secrets, the new one first: HB_SECRET=new and
HB_SECRET_PREVIOUS=old, or a secret file with the new one on its first line.

exit status: 0 done; 1 refused (nothing changed) or the store failed; 2 a usage
mistake or secrets that do not open the cluster."""


def add_rotate_parser(sub: Subcommands, secret_help: str) -> None:
    parser = add_command(
        sub,
        "rotate-secret",
        "rotate the cluster's secret online (begin, commit, finish)",
        ROTATE_HELP,
    )
    parser.add_argument("step", choices=("begin", "commit", "finish"))
    parser.add_argument("--store", help="store URL (default: $HB_STORE)")
    parser.add_argument("--agent-id", required=True)
    parser.add_argument("--secret-file", type=Path, help=secret_help)
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=ROTATE_TIMEOUT_S,
        metavar="S",
        help="how long begin and commit wait for every live node to seal with the new key "
        f"(default: {ROTATE_TIMEOUT_S:g}; at least 9 lease TTLs: a node reads the cluster "
        "record every 4)",
    )
