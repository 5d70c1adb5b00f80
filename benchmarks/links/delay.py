"""A fixed delay on every packet a namespace sends, for kernels built without ``sch_netem``.

    ip netns exec NS iptables-legacy -A OUTPUT -o DEVICE -j NFQUEUE --queue-num 0
    ip netns exec NS python -m benchmarks.links.delay --delay-ms 20

The kernel queues each outgoing packet and hands this process its id (no payload is copied, over a
netlink socket: no library needed); the verdict ACCEPT goes back ``--delay-ms`` after the packet arrived,
in arrival order, so packets keep their order and the rate shaping after the hook (tbf) is unchanged. Half
the round trip on each side gives the round trip. It prints ``ready`` once bound. If it dies, the queue
drops every packet: a run fails loudly rather than going on without its delay.
"""

from __future__ import annotations

import argparse
import collections
import select
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND, NFQNL_COPY_META = 1, 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
QUEUE_MAXLEN = 8192  # packets held at once: 40 ms of a 1 Gbit/s link in 1500-byte packets is ~3,300


def message(kind: int, queue: int, attributes: list[tuple[int, bytes]], flags: int = NLM_F_REQUEST) -> bytes:
    """One nfnetlink message of the queue subsystem: netlink header, nfgenmsg, attributes (4-byte aligned)."""
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue))
    for attribute, data in attributes:
        length = 4 + len(data)
        body += struct.pack("=HH", length, attribute) + data + b"\0" * (-length % 4)
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, flags, 0, 0) + body


def packet_ids(data: bytes) -> list[int]:
    """The ids of the queued packets in one receive (several netlink messages may share it)."""
    ids, offset = [], 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            break
        if kind == NLMSG_ERROR:
            error = struct.unpack_from("=i", data, offset + 16)[0]
            if error:
                raise OSError(-error, f"nfnetlink refused a request: {error}")
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            position = offset + 20  # past the netlink header and nfgenmsg
            while position + 4 <= offset + length:
                size, attribute = struct.unpack_from("=HH", data, position)
                if size < 4:
                    break
                if attribute & 0x7FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, position + 4)[0])
                position += (size + 3) & ~3
        offset += (length + 3) & ~3
    return ids


def bind(queue: int) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    for attribute, data in ((NFQA_CFG_CMD, struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, 0)),
                            (NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)),
                            (NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))):
        sock.send(message(NFQNL_MSG_CONFIG, queue, [(attribute, data)], NLM_F_REQUEST | NLM_F_ACK))
        packet_ids(sock.recv(65536))  # the acknowledgement: raises on an error
    return sock


def serve(queue: int, delay_s: float) -> None:
    """Accept each queued packet ``delay_s`` after it was queued, in order, until killed."""
    sock = bind(queue)
    print("ready", flush=True)
    held: collections.deque[tuple[float, int]] = collections.deque()
    while True:
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
        if select.select([sock], [], [], timeout)[0]:
            now = time.monotonic()
            held.extend((now + delay_s, packet) for packet in packet_ids(sock.recv(1 << 20)))
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, packet = held.popleft()
            sock.send(message(NFQNL_MSG_VERDICT, queue, [(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet))]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.links.delay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--queue", type=int, default=0)
    args = parser.parse_args(argv)
    if args.delay_ms <= 0:
        parser.error("--delay-ms must be > 0")
    serve(args.queue, args.delay_ms / 1e3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
