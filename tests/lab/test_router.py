"""The lab's router without root: its shaper's arithmetic, and the real router process moving packets between
socket pairs that stand in for the TUN devices (SOCK_SEQPACKET keeps packet boundaries, as a TUN does)."""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from heterorl.config import LinkConfig
from heterorl.lab.netns import LabError, check_host
from heterorl.lab.shaper import PacketShaper
from heterorl.network import Link


def shaper(**link) -> PacketShaper:
    cfg = LinkConfig(**link)
    return PacketShaper(Link(cfg, seed=0).conditions["weights"], cfg.weights_faults, cfg.queue_packets)


def test_rate_serialises_and_the_queue_bounds_the_backlog() -> None:
    # 1500 bytes at 12 Mbit/s = 1 ms each; delay 0.1; three packets fit the queue, the fourth is dropped
    s = shaper(weights_delay={"kind": "fixed", "seconds": 0.1}, bandwidth_mbps=12.0, queue_packets=3)
    assert [s.admit(0.0, 1500) for _ in range(4)] == pytest.approx([0.101, 0.102, 0.103, None])
    assert s.admit(0.0015, 1500) == pytest.approx(0.104)  # the first has left the queue by then
    assert s.admit(1.0, 750) == pytest.approx(1.1005)
    assert s.stats() == {"packets": 6, "bytes": 8250, "delivered": 5, "queue": 1, "max_queue": 3}


def test_jitter_never_reorders_but_reordering_does() -> None:
    s = shaper(weights_delay={"kind": "uniform", "low": 0.0, "high": 1.0})
    times = [s.admit(t, 100) for t in np.arange(0.0, 10.0, 0.01)]
    assert all(b >= a for a, b in itertools.pairwise(times))
    r = shaper(weights_faults={"packet_reorder": 1.0, "packet_reorder_seconds": 0.5})
    assert [r.admit(0.0, 100), r.admit(0.1, 100)] == pytest.approx([0.5, 0.6])


def test_packet_loss_rate() -> None:
    s = shaper(weights_faults={"packet_loss": 0.2})
    delivered = sum(s.admit(i * 1e-3, 100) is not None for i in range(20_000))
    assert delivered / 20_000 == pytest.approx(0.8, abs=0.015)
    assert s.counts["loss"] == 20_000 - delivered


def test_a_cut_drops_what_enters_and_what_is_in_flight() -> None:
    s = shaper(weights_delay={"kind": "fixed", "seconds": 0.1}, outages=[{"start": 1.0, "end": 2.0}])
    assert [s.admit(t, 100) for t in (0.5, 0.95, 1.5, 2.0)] == pytest.approx([0.6, None, None, 2.1])
    assert s.counts["cut"] == 2


def test_check_host_refuses_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(LabError, match="needs root"):
        check_host()


def ipv4(dst: str, payload: bytes) -> bytes:
    """A minimal IPv4 packet: version 4, header length 5, the destination at bytes 16..19."""
    head = bytearray(20)
    head[0] = 0x45
    head[16:20] = bytes(int(x) for x in dst.split("."))
    return bytes(head) + payload


def test_the_router_process_routes_through_the_links() -> None:
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(3)]
    ours = [a for a, _ in pairs]
    theirs = [b.fileno() for _, b in pairs]
    links = [
        LinkConfig(weights_delay={"kind": "fixed", "seconds": 0.2}, rollout_delay={"kind": "fixed", "seconds": 0.1}),
        LinkConfig(weights_delay={"kind": "fixed", "seconds": 0.05}),
    ]
    router = subprocess.Popen(
        [sys.executable, "-m", "heterorl.lab.router"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        pass_fds=theirs,
    )
    assert router.stdin is not None
    assert router.stdout is not None
    t0 = time.monotonic()
    spec = {
        "t0": t0,
        "seed": 0,
        "learner": {"fd": theirs[0], "ip": "10.77.0.1"},
        "samplers": [
            {"fd": theirs[i + 1], "ip": f"10.77.0.{i + 2}", "link": link.model_dump(mode="json")}
            for i, link in enumerate(links)
        ],
    }
    router.stdin.write(json.dumps(spec).encode() + b"\n")
    router.stdin.flush()
    assert json.loads(router.stdout.readline())["ready"] is True
    for _, b in pairs:
        b.close()
    learner, s0, s1 = ours

    def arrival(sock: socket.socket, sent: float) -> tuple[bytes, float]:
        ready, _, _ = select.select([sock], [], [], 5.0)
        assert ready, "nothing arrived"
        return sock.recv(65536), time.monotonic() - sent

    to_s0 = ipv4("10.77.0.2", b"weights for 0")
    start = time.monotonic()
    learner.send(to_s0)
    got, took = arrival(s0, start)
    assert got == to_s0
    assert 0.2 <= took < 0.3
    to_learner = ipv4("10.77.0.1", b"rollout of 0")
    start = time.monotonic()
    s0.send(to_learner)
    got, took = arrival(learner, start)
    assert got == to_learner
    assert 0.1 <= took < 0.2
    start = time.monotonic()
    learner.send(ipv4("10.77.0.3", b"to 1"))
    assert arrival(s1, start)[1] >= 0.05
    s1.send(ipv4("10.77.0.2", b"sampler to sampler"))  # not routed
    s1.send(b"\x60" + bytes(39))  # IPv6: not routed
    time.sleep(0.1)
    router.stdin.write(b"stats\n")
    router.stdin.flush()
    stats = json.loads(router.stdout.readline())
    assert stats["unroutable"] == 2
    assert stats["links"][0]["weights"]["delivered"] == 1
    assert stats["links"][0]["rollout"]["delivered"] == 1
    assert stats["links"][1]["weights"]["delivered"] == 1
    router.stdin.close()  # end of file: the router leaves
    assert router.wait(5) == 0
    for sock in ours:
        sock.close()
