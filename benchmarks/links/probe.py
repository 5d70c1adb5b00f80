"""Link probe: a TCP sink and a timed sender, each run inside a namespace by the harness.

    ip netns exec NS_B python -m benchmarks.links.probe serve --host 10.77.0.2 --port 5201
    ip netns exec NS_A python -m benchmarks.links.probe send --host 10.77.0.2 --port 5201 --seconds 1
    ip netns exec NS_B python -m benchmarks.links.probe echo --host 10.77.0.2 --port 5202
    ip netns exec NS_A python -m benchmarks.links.probe ping --host 10.77.0.2 --port 5202

The sink prints ``ready`` once listening, then one JSON line: bytes received and the seconds
between the first and the last byte, so connection set-up and the tbf bucket's first burst
barely count. ``ping`` times one-byte round trips over a TCP connection to ``echo`` (the delay a
Horovod message sees on an idle link). No torch import: it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

CHUNK = 1 << 20


@contextmanager
def one_connection(host: str, port: int, timeout_s: float) -> Iterator[socket.socket]:
    """Listen, say ``ready`` on stdout (the harness waits for it), and yield the first connection, both under
    ``timeout_s``."""
    with socket.create_server((host, port)) as server:
        server.settimeout(timeout_s)
        print("ready", flush=True)
        connection, _ = server.accept()
        with connection:
            connection.settimeout(timeout_s)
            yield connection


def serve(host: str, port: int, timeout_s: float = 60.0) -> dict:
    """Accept one connection, read until EOF, return ``{"bytes", "seconds", "mbit_per_s"}``."""
    with one_connection(host, port, timeout_s) as connection:
        received, first, last = 0, None, None
        buffer = bytearray(CHUNK)
        while True:
            count = connection.recv_into(buffer)
            if not count:
                break
            last = time.perf_counter()
            first = first if first is not None else last
            received += count
    seconds = (last - first) if received and last > first else 0.0
    return {"bytes": received, "seconds": seconds, "mbit_per_s": received * 8 / seconds / 1e6 if seconds else 0.0}


def send(host: str, port: int, seconds: float) -> int:
    """Send zeros as fast as the link allows for ``seconds``; return the bytes sent."""
    payload = bytes(CHUNK)
    sent = 0
    with socket.create_connection((host, port), timeout=30) as connection:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            connection.sendall(payload)
            sent += len(payload)
    return sent


def echo(host: str, port: int, timeout_s: float = 60.0) -> None:
    """Accept one connection and send back every byte until EOF."""
    with one_connection(host, port, timeout_s) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := connection.recv(64):
            connection.sendall(data)


def ping(host: str, port: int, count: int = 20) -> dict:
    """``count`` one-byte round trips after a warm-up one; returns their median and minimum in ms."""
    times = []
    with socket.create_connection((host, port), timeout=30) as connection:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count + 1):
            started = time.perf_counter()
            connection.sendall(b"x")
            connection.recv(1)
            times.append((time.perf_counter() - started) * 1e3)
    times = sorted(times[1:])
    return {"rtt_ms": times[len(times) // 2], "min_rtt_ms": times[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=("serve", "send", "echo", "ping"))
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    if args.role == "serve":
        print(json.dumps(serve(args.host, args.port)), flush=True)
    elif args.role == "echo":
        echo(args.host, args.port)
    elif args.role == "ping":
        print(json.dumps(ping(args.host, args.port)), flush=True)
    else:
        print(json.dumps({"sent": send(args.host, args.port, args.seconds)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
