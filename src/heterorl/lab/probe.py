"""Measure a lab link through real TCP: a probe server (run in the learner's namespace) and a client (in a
sampler's) that follows a plan of steps and prints what it measured as one JSON object.

    python -m heterorl.lab.probe server --listen 10.77.0.1:9000
    python -m heterorl.lab.probe client --connect 10.77.0.1:9000 --plan '[{"op": "connect"}, {"op": "ping"}]'

Wire protocol (one connection carries any number of requests): a 9-byte head, op (1 byte) and size (uint64 big
endian), then
    P  ping: the server answers 1 byte
    U  upload: `size` bytes follow; the server answers its CLOCK_MONOTONIC times (two float64) when half of them
       and when the last of them had arrived, and how many bytes came after the first time (uint64)
    D  download: the server sends `size` bytes
Every machine namespace shares CLOCK_MONOTONIC, so the client can subtract the server's times from its own.

Plan steps: {"op": "connect"} (a new connection; the time connect() took), {"op": "ping", "count": n,
"interval": s} (round trips of 1 byte each way), {"op": "upload", "size": n} and {"op": "download", "size": n}
(seconds from the first byte sent, or the request sent, to the last byte at the receiver), {"op": "sleep",
"seconds": s}, {"op": "stream", "size": n, "seconds": s} (uploads back to back for s seconds; each one's
start and arrival time). Uploads and downloads also give `half_at`, `last_at` (the receiver's clock when half and all of
the bytes were in) and `after_half` (bytes still to come at `half_at`): steady rate = after_half / (last - half).
The output adds the client namespace's TCP retransmission count over the plan (RetransSegs). Both sides raise
their priority (nice -10) when they may, so a loaded machine delays what they measure less.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

HEAD = struct.Struct(">cQ")
TIMES = struct.Struct(">ddQ")
CHUNK = 1 << 16
MAX_SIZE = 1 << 34


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(min(CHUNK, n - len(data)))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        data += chunk
    return bytes(data)


def _serve_connection(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    zeros = bytes(CHUNK)
    with conn:
        while True:
            try:
                op, size = HEAD.unpack(_recv_exact(conn, HEAD.size))
            except ConnectionError:
                return
            if size > MAX_SIZE:
                return
            if op == b"P":
                conn.sendall(b"p")
            elif op == b"U":
                got, half_at, after = 0, 0.0, 0
                while got < size:
                    chunk = conn.recv(min(CHUNK, size - got))
                    if not chunk:
                        return
                    got += len(chunk)
                    if not half_at and got >= size // 2:
                        half_at, after = time.monotonic(), size - got
                conn.sendall(TIMES.pack(half_at, time.monotonic(), after))
            elif op == b"D":
                left = size
                while left:
                    left -= conn.send(zeros[: min(CHUNK, left)])
            else:
                return


def serve(listen: str) -> None:
    """Accept connections forever, one thread each."""
    host, port = _split(listen)
    server = socket.create_server((host, port), reuse_port=False)
    print(json.dumps({"listening": listen}), flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve_connection, args=(conn,), daemon=True).start()


def retransmitted_segments() -> int:
    """RetransSegs of this network namespace (/proc/net/snmp is per namespace)."""
    text = Path("/proc/net/snmp").read_text()
    lines = [line.split() for line in text.splitlines() if line.startswith("Tcp:")]
    return int(lines[1][lines[0].index("RetransSegs")])


class Client:
    """Runs plan steps over one connection at a time."""

    def __init__(self, address: str) -> None:
        self.address = _split(address)
        self.sock: socket.socket | None = None

    def connect(self) -> dict[str, Any]:
        if self.sock is not None:
            self.sock.close()
        start = time.monotonic()
        self.sock = socket.create_connection(self.address, timeout=600)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return {"start": start, "seconds": time.monotonic() - start}

    def _live(self) -> socket.socket:
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        return self.sock

    def ping(self, count: int = 10, interval: float = 0.0) -> dict[str, Any]:
        sock, starts, rtts = self._live(), [], []
        for _ in range(count):
            start = time.monotonic()
            sock.sendall(HEAD.pack(b"P", 0))
            _recv_exact(sock, 1)
            starts.append(start)
            rtts.append(time.monotonic() - start)
            time.sleep(interval)
        return {"starts": starts, "rtts": rtts}

    def upload(self, size: int) -> dict[str, Any]:
        sock, payload = self._live(), bytes(min(size, CHUNK))
        start = time.monotonic()
        sock.sendall(HEAD.pack(b"U", size))
        left = size
        while left:
            left -= sock.send(payload[: min(len(payload), left)])
        half_at, last_at, after = TIMES.unpack(_recv_exact(sock, TIMES.size))
        return {"start": start, "seconds": last_at - start, "half_at": half_at, "last_at": last_at, "after_half": after}

    def download(self, size: int) -> dict[str, Any]:
        sock = self._live()
        start = time.monotonic()
        sock.sendall(HEAD.pack(b"D", size))
        got, half_at, after = 0, 0.0, 0
        while got < size:
            chunk = sock.recv(min(CHUNK, size - got))
            if not chunk:
                raise ConnectionError("server closed the connection")
            got += len(chunk)
            if not half_at and got >= size // 2:
                half_at, after = time.monotonic(), size - got
        last_at = time.monotonic()
        return {"start": start, "seconds": last_at - start, "half_at": half_at, "last_at": last_at, "after_half": after}

    def stream(self, size: int, seconds: float) -> dict[str, Any]:
        end, starts, arrivals = time.monotonic() + seconds, [], []
        while time.monotonic() < end:
            up = self.upload(size)
            starts.append(up["start"])
            arrivals.append(up["last_at"])
        return {"starts": starts, "arrivals": arrivals}

    def run(self, plan: list[dict[str, Any]]) -> dict[str, Any]:
        before = retransmitted_segments()
        results = []
        for step in plan:
            args = {k: v for k, v in step.items() if k != "op"}
            op = step["op"]
            if op == "sleep":
                time.sleep(args["seconds"])
                results.append({})
                continue
            results.append(getattr(self, op)(**args))
        return {"steps": results, "retransmitted": retransmitted_segments() - before}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m heterorl.lab.probe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="role", required=True)
    sub.add_parser("server").add_argument("--listen", required=True, help="HOST:PORT")
    client = sub.add_parser("client")
    client.add_argument("--connect", required=True, help="HOST:PORT of the probe server")
    client.add_argument("--plan", required=True, help="JSON list of steps")
    args = parser.parse_args(argv)
    with contextlib.suppress(PermissionError):
        os.nice(-10)  # a measuring tool: on a loaded machine, less of the scheduler's delay in what it measures
    if args.role == "server":
        serve(args.listen)
        return
    plan = json.loads(args.plan)
    sys.stdout.write(json.dumps(Client(args.connect).run(plan)) + "\n")


if __name__ == "__main__":
    main()
