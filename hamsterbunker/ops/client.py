"""Handing work to an agent: ``Client(store, secret).submit(...)`` and ``.result(...)``.
Needs the store and the cluster's secret, not a running node::

    with Client("redis://127.0.0.1:6379/0", secret) as client:
        admission = client.submit("agent-1", {"question": "why?"}, request_id="q-42")
        answer = client.result("agent-1", "q-42", timeout=60)
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..agent.inbox import Admission
from ..core.errors import InboxError, NotNextNumber, StoreError, Tampered, UnknownRequest
from ..core.failpoints import failpoint
from ..core.limits import MAX_SUBMISSION_BYTES, check_request_id
from ..records import check_name
from ..sealing import Sealer, new_cluster_record
from ..sealing.keyring import Secret
from ..stores import Store, open_store

__all__ = ["Admission", "Client"]

# Racing submitters each take the next number in turn; one that keeps losing gives up.
MAX_ADMIT_TRIES = 1000
# How often submit reads a duplicate's admission for a sealed record of it: a pending
# submission consumed between two reads is proved by its reply at the next.
PROOF_READS = 3
# A watch is only a hint: result() reads again at least this often without one.
RESULT_REREAD_S = 5.0
# A watch subscribes some time after it is started (a connection, an inotify watch):
# a reply that lands in between wakes nobody, so result() also reads again this long
# after it started watching, and then only when woken.
SUBSCRIBED_S = (0.05, 0.25)


class Client:
    """Submits work to agents in one store and waits for their replies."""

    def __init__(self, store: Store | str, secret: Secret) -> None:
        self._owned = isinstance(store, str)
        self.store: Store = open_store(store) if isinstance(store, str) else store
        try:
            # No node needs to be up: the first user of a store makes its cluster record.
            cluster = self.store.read_cluster() or self.store.create_cluster(
                new_cluster_record(secret)
            )
            self._sealer = Sealer(secret, cluster)
        except BaseException:
            self.close()
            raise
        self._next: dict[str, int] = {}  # agent -> the number to try first
        self._lock = threading.Lock()

    def submit(self, agent_id: str, payload: Any, request_id: str | None = None) -> Admission:
        """Admit payload (JSON) to agent_id's inbox once per request_id (a new UUID if None).

        A second submit with the same request id admits nothing and returns the
        first admission with duplicate=True, once a sealed record proves that
        admission (its submission, or its reply). InboxError for a request id or
        payload that cannot be sent; InboxFull when the inbox is at its limit;
        Tampered, admitting nothing, when the store calls the request id known
        but holds no sealed record of it (the store refuses to admit it again).
        """
        request_id = str(uuid.uuid4()) if request_id is None else request_id
        _check_ids(agent_id, request_id)
        with self._lock:
            number = self._next.get(agent_id, 1)
        self._follow_keys()
        for _ in range(MAX_ADMIT_TRIES):
            blob = self._seal(agent_id, number, request_id, payload)
            try:
                got, duplicate = self.store.admit(agent_id, request_id, number, blob)
            except NotNextNumber as exc:
                number = exc.next_number
                continue
            failpoint("inbox.submit.after_admit")
            if duplicate and not self._admitted_before(agent_id, request_id, got):
                continue  # forgotten (compacted) since admit answered: admit it anew
            if not duplicate:
                with self._lock:
                    self._next[agent_id] = got + 1
            return Admission(got, request_id, duplicate)
        raise StoreError(
            f"could not admit {request_id!r} in {MAX_ADMIT_TRIES} tries: other submitters "
            "kept taking the next number"
        )

    def _admitted_before(self, agent_id: str, request_id: str, number: int) -> bool:
        """Whether a sealed record proves request_id admitted as number: its submission still
        pending, or its reply. False if the store no longer knows it as number (forgotten
        meanwhile). Tampered if the store keeps calling it known without such a record."""
        for _ in range(PROOF_READS):
            state = self.store.read_admission(agent_id, request_id)
            if state is None or state.number != number:
                return False
            if state.consumed and state.reply is not None:
                self._sealer.open_reply(state.reply, agent_id, number, request_id)
                return True
            if self._pending_as(agent_id, number, request_id):
                return True
            # Consumed between the two reads (a genuine reply is readable now), or unproven.
        raise Tampered(
            f"the store holds request {request_id!r} of agent {agent_id!r} as admitted "
            f"(#{number}) but no sealed submission or reply of it: written without the "
            "secret, so nothing was admitted (the store refuses that request id until "
            "the record is removed)"
        )

    def _pending_as(self, agent_id: str, number: int, request_id: str) -> bool:
        """Whether submission number is pending, sealed with request_id."""
        listed = self.store.read_inbox(agent_id, after=number - 1)
        if not listed or listed[0][0] != number:
            return False
        try:
            found = self._sealer.open_submission(listed[0][1], agent_id, number)
        except Tampered:
            return False  # junk in its place proves nothing
        return found.request_id == request_id

    def _follow_keys(self) -> None:
        """Seal with the cluster's current key: follow a secret rotation (hb rotate-secret)
        begun since this client opened. WrongSecret if this client lacks the new key."""
        stored = self.store.read_cluster()
        if stored is not None:
            self._sealer.adopt(stored)

    def _seal(self, agent_id: str, number: int, request_id: str, payload: Any) -> bytes:
        try:
            blob = self._sealer.seal_submission(agent_id, number, request_id, payload, time.time())
        except Exception as exc:  # SealError: not JSON
            raise InboxError(f"payload cannot be submitted: {exc}") from exc
        if len(blob) > MAX_SUBMISSION_BYTES:
            raise InboxError(
                f"payload is {len(blob)} bytes sealed, above the limit of "
                f"{MAX_SUBMISSION_BYTES} bytes ({MAX_SUBMISSION_BYTES // 2**10} KiB)"
            )
        return blob

    def result(
        self,
        agent_id: str,
        request_id: str,
        timeout: float | None = None,
        *,
        number: int | None = None,
    ) -> Any:
        """Wait for the reply to request_id (None if it was consumed without one): a sealed
        reply that opens as this submission's, never a bare "consumed" mark.

        number (``Admission.number``) pins the admission waited for. TimeoutError after
        timeout seconds; UnknownRequest if the store knows no such admission (or knows it
        under another number); Tampered if the stored reply does not authenticate.
        """
        work = self.result_async(agent_id, request_id, timeout, number=number)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(work)
        # Called from a running event loop's thread: wait in a thread of our own.
        with ThreadPoolExecutor(1, thread_name_prefix="hb-client-result") as pool:
            return pool.submit(asyncio.run, work).result()

    async def result_async(
        self,
        agent_id: str,
        request_id: str,
        timeout: float | None = None,
        *,
        number: int | None = None,
    ) -> Any:
        """result() for async callers."""
        _check_ids(agent_id, request_id)
        loop = asyncio.get_running_loop()
        until = loop.time() + (math.inf if timeout is None else timeout)
        watcher = self.store.watch(agent_id)
        wake: asyncio.Future[None] | None = asyncio.ensure_future(_next_wake(watcher))
        rereads = list(SUBSCRIBED_S)
        try:
            while True:
                state = await asyncio.to_thread(self.store.read_admission, agent_id, request_id)
                if state is None:
                    raise UnknownRequest(
                        f"agent {agent_id!r} has no admission of request {request_id!r} (never "
                        "submitted, or consumed so long ago that its reply was compacted)"
                    )
                if number is not None and state.number != number:
                    raise UnknownRequest(
                        f"agent {agent_id!r} holds request {request_id!r} as #{state.number}, "
                        f"not as the #{number} waited for (its reply was compacted and the "
                        "request id admitted again, or the store was written without the secret)"
                    )
                if state.consumed and state.reply is not None:
                    return self._sealer.open_reply(state.reply, agent_id, state.number, request_id)
                left = until - loop.time()
                if left <= 0:
                    raise TimeoutError(
                        f"no reply to request {request_id!r} (#{state.number}) of agent "
                        f"{agent_id!r} within {timeout} s"
                        + (" (marked consumed, but with no sealed reply)" if state.consumed else "")
                    )
                wake = wake or asyncio.ensure_future(_next_wake(watcher))
                reread = rereads.pop(0) if rereads else RESULT_REREAD_S
                done, _ = await asyncio.wait({wake}, timeout=min(left, reread))
                if done:
                    wake.result()
                    wake = None
        finally:
            if wake is not None:
                wake.cancel()
                await asyncio.gather(wake, return_exceptions=True)
            await watcher.aclose()  # type: ignore[attr-defined]

    def close(self) -> None:
        """Close the store if this client opened it from a URL."""
        if self._owned:
            self.store.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _next_wake(watcher: AsyncIterator[object]) -> None:
    await anext(watcher)


def _check_ids(agent_id: str, request_id: str) -> None:
    check_name("agent id", agent_id)
    problem = check_request_id(request_id)
    if problem is not None:
        raise InboxError(problem)
