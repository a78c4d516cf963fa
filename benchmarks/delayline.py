"""A userspace netem: point-to-point links that delay every packet a fixed time each way.

``python benchmarks/delayline.py DELAY_MS HOST_DEV:NODE_DEV ...`` makes two TUN devices
per pair in the current network namespace, prints ``ready``, then copies every IP packet
read from one device of a pair into the other DELAY_MS later, in order (netem's
``delay`` without jitter or loss). The caller moves NODE_DEV into a namespace and gives
both ends their addresses; then the pair is a link with a round trip of 2 × DELAY_MS.

Used by ``regions.py`` where the kernel has no ``sch_netem`` (this machine's has not).
It runs until its stdin is closed (the benchmark ended or died) or SIGTERM, at most
MAX_LIFETIME_S; the devices go with it. Timers are epoll's, in whole milliseconds, so
a packet leaves up to about 1 ms after its due time.
"""

from __future__ import annotations

import contextlib
import fcntl
import heapq
import math
import os
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
MAX_PACKET = 65535
MAX_QUEUED = 100_000  # packets in flight, all pairs: beyond this a packet is dropped
MAX_LIFETIME_S = 4 * 3600


def open_tun(name: str) -> int:
    """A new non-persistent TUN device of that name (IP packets, no extra header)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    return fd


def relay(delay_s: float, peers: dict[int, int]) -> None:
    """Copy packets between each fd and its peer after delay_s, until stdin closes."""
    poller = select.epoll()
    for fd in peers:
        poller.register(fd, select.EPOLLIN)
    poller.register(sys.stdin.fileno(), select.EPOLLIN | select.EPOLLHUP)
    queue: list[tuple[float, int, int, bytes]] = []  # (due, n, out fd, packet)
    n = 0
    ends = time.monotonic() + MAX_LIFETIME_S
    while time.monotonic() < ends:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, packet = heapq.heappop(queue)
            with contextlib.suppress(OSError):  # a device down or gone: lost, as on a wire
                os.write(out, packet)
        timeout = max(0.0, queue[0][0] - now) if queue else 1.0
        for fd, _events in poller.poll(math.ceil(timeout * 1000) / 1000):
            if fd == sys.stdin.fileno():
                return  # EOF or hang-up: the benchmark is done with us
            for _ in range(1000):  # whatever is waiting, bounded
                try:
                    packet = os.read(fd, MAX_PACKET)
                except OSError:  # nothing more waiting (EAGAIN), or the device went
                    break
                if len(queue) < MAX_QUEUED:
                    n += 1
                    heapq.heappush(queue, (time.monotonic() + delay_s, n, peers[fd], packet))


def main(argv: list[str]) -> int:
    delay_s = int(argv[0]) / 1000
    peers: dict[int, int] = {}
    for pair in argv[1:]:
        host, node = pair.split(":")
        host_fd, node_fd = open_tun(host), open_tun(node)
        peers[host_fd], peers[node_fd] = node_fd, host_fd
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(OSError):
        os.nice(-10)  # the wire should not wait behind the nodes it carries for
    print("ready", flush=True)
    relay(delay_s, peers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
