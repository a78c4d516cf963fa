"""``hb submit``: hand one JSON payload to an agent's inbox, and with ``--wait`` get its reply
(the command line's side of ``hamsterbunker.ops.client.Client``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ..core.errors import ConfigError, HamsterbunkerError, InboxError, Tampered
from ..core.limits import MAX_SUBMISSION_BYTES
from ..ops.client import Admission, Client
from ..records import check_name
from ..sealing.keyring import Secret
from .args import not_on_syncdir, store_url
from .context import EXIT_TIMEOUT, known_agent, opened_store, warn

__all__ = ["EXIT_TIMEOUT", "submit"]

# The most of a payload read from --data-file or stdin: far above what can be admitted
# (MAX_SUBMISSION_BYTES sealed), so that the limit is what the message names.
MAX_INPUT_BYTES = 16 * MAX_SUBMISSION_BYTES


def read_payload(args: argparse.Namespace, stdin: TextIO | None = None) -> Any:
    """The payload from exactly one of --data, --data-file and - (stdin); ConfigError if not."""
    if args.stdin is not None and args.stdin != "-":
        raise ConfigError(f"unexpected argument {args.stdin!r}: to read stdin, give -")
    given = [
        name
        for name, value in (("--data", args.data), ("--data-file", args.data_file))
        if value is not None
    ]
    if args.stdin == "-":
        given.append("-")
    if not given:
        raise ConfigError("no payload given: give --data JSON, --data-file FILE or - (stdin)")
    if len(given) > 1:
        raise ConfigError(
            f"give one payload only (--data JSON, --data-file FILE or - for stdin), "
            f"not {' and '.join(given)}"
        )
    if args.data is not None:
        return _parse(args.data, "--data")
    if args.data_file is not None:
        path: Path = args.data_file
        try:
            with path.open("rb") as file:
                data = file.read(MAX_INPUT_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"--data-file {path} cannot be read: {exc.strerror}") from None
        return _parse(_limited(data, f"--data-file {path}"), f"--data-file {path}")
    source = stdin if stdin is not None else sys.stdin
    data = source.buffer.read(MAX_INPUT_BYTES + 1)
    return _parse(_limited(data, "stdin"), "stdin")


def _limited(data: bytes, where: str) -> bytes:
    if len(data) > MAX_INPUT_BYTES:
        raise ConfigError(
            f"{where} holds more than {MAX_INPUT_BYTES} bytes; a payload may be at most "
            f"{MAX_SUBMISSION_BYTES} bytes ({MAX_SUBMISSION_BYTES // 2**10} KiB) sealed"
        )
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (use null or a string)")


def _parse(text: str | bytes, where: str) -> Any:
    """JSON as RFC 8259 has it: NaN and Infinity are not, and cannot be sealed."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not JSON: not UTF-8 text ({exc.reason})") from None
    except RecursionError:
        raise ConfigError(f"{where} is not JSON that can be sent: nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError included
        raise ConfigError(f"{where} is not JSON: {exc}") from None


def submit(args: argparse.Namespace, read_secret: Callable[[], Secret]) -> int:
    """Run ``hb submit``; the exit status (errors raise). read_secret: after the checks."""
    agent_id = check_name("agent id", args.agent_id)
    if args.timeout is not None and not args.wait:
        raise ConfigError("--timeout needs --wait")
    url = not_on_syncdir(store_url(args), "submitting")
    payload = read_payload(args)
    secret = read_secret()
    with opened_store(url) as store, Client(store, secret) as client:
        if not args.new_agent:
            known_agent(store, agent_id)
        try:
            admission = client.submit(agent_id, payload, request_id=args.request_id)
        except InboxError as exc:  # a bad request id, a payload too big: nothing admitted
            raise ConfigError(str(exc)) from None
        except Tampered as exc:  # not the user's mistake: the store's contents
            raise _ReplyUnreadable(f"not admitted: {exc}") from None
        if not args.json:
            print(_admitted_line(admission), flush=True)
        if not args.wait:
            if args.json:
                print(_json(admission))
            return 0
        try:
            reply = client.result(
                agent_id, admission.request_id, timeout=args.timeout, number=admission.number
            )
        except TimeoutError:
            if args.json:
                print(_json(admission))
            warn(
                f"hb submit: timed out: no reply to request {admission.request_id} "
                f"(#{admission.number}) within {args.timeout:g} s; it stays admitted: the "
                f"same hb submit --wait with --request-id {admission.request_id} waits again"
            )
            return EXIT_TIMEOUT
        except Tampered as exc:  # not the user's mistake: the store's contents
            raise _ReplyUnreadable(f"the reply cannot be read: {exc}") from None
    if args.json:
        print(_json(admission, reply=reply))
    else:
        print(json.dumps(reply, ensure_ascii=False))
    return 0


class _ReplyUnreadable(HamsterbunkerError):
    """A stored reply, or a duplicate's record, that does not authenticate: reported as a
    failure (exit 1)."""


def _admitted_line(admission: Admission) -> str:
    already = "already admitted" if admission.duplicate else "admitted"
    return f"{already} as #{admission.number} (request id {admission.request_id})"


def _json(admission: Admission, **reply: Any) -> str:
    doc = {
        "number": admission.number,
        "request_id": admission.request_id,
        "duplicate": admission.duplicate,
        **reply,
    }
    return json.dumps(doc, ensure_ascii=False)
