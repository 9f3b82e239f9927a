"""The lab's router: a process that moves IP packets between the nodes' TUN devices through shaped links.

Started by `WanLab` with the TUN descriptors inherited (`python -m heterorl.lab.router`). Its stdin carries one
JSON line, the spec (`t0` on CLOCK_MONOTONIC, `seed`, the learner's and samplers' descriptors and addresses,
each sampler's `LinkConfig`), then commands: `stats` (one JSON line back on stdout), `cut I SECONDS` (link I down
in both directions from now for SECONDS, beside its scheduled outages) and `quit`; end of file also
ends it, so the router never outlives the lab that started it. It ignores SIGINT (a Ctrl-C belongs to the lab,
which then cleans up in order).

One thread, one epoll loop: read every packet that is ready, route it by destination address (learner ->
sampler i through link i's `weights` direction, sampler i -> learner through its `rollout` direction, nothing
else), let the direction's `PacketShaper` give its delivery time, keep it in a heap, and write out each packet
whose time has come. Delivery is late by the loop's wake-up latency: epoll waits whole milliseconds, the rest
is slept in 0.2 ms slices (`Router._wait`), plus scheduling; docs/wan-lab.md has the measured figures.
"""

from __future__ import annotations

import heapq
import json
import os
import resource
import select
import signal
import sys
import time
from dataclasses import dataclass

from heterorl.config import LinkConfig
from heterorl.lab.shaper import PacketShaper
from heterorl.network import Link
from heterorl.network.outages import Outages

READ_BURST = 256  # packets read from one device before the loop looks at the others and the clock
DRAW_BLOCK = 1024  # delays drawn per numpy call
FINE_SLICE = 0.0002  # the longest sleep below epoll's resolution (s): how late a packet can be read meanwhile


@dataclass
class Route:
    shaper: PacketShaper
    out_fd: int


def _ipv4(address: str) -> bytes:
    return bytes(int(part) for part in address.split("."))


class Router:
    """Routes between the learner's device and the samplers', each pair through its link's two shapers."""

    def __init__(self, spec: dict) -> None:
        self.t0 = float(spec["t0"])
        self.learner_fd = int(spec["learner"]["fd"])
        self.learner_ip = _ipv4(spec["learner"]["ip"])
        self.to_sampler: dict[bytes, Route] = {}
        self.from_sampler: dict[int, Route] = {}
        self.shapers: list[dict[str, PacketShaper]] = []
        for i, node in enumerate(spec["samplers"]):
            cfg = LinkConfig.model_validate(node["link"])
            link = Link(cfg, seed=int(spec["seed"]), index=i, block=DRAW_BLOCK)
            pair = {
                path: PacketShaper(link.conditions[path], faults, cfg.queue_packets)
                for path, faults in (("weights", cfg.weights_faults), ("rollout", cfg.rollout_faults))
            }
            self.shapers.append(pair)
            self.to_sampler[_ipv4(node["ip"])] = Route(pair["weights"], int(node["fd"]))
            self.from_sampler[int(node["fd"])] = Route(pair["rollout"], self.learner_fd)
        self.heap: list[tuple[float, int, int, bytes]] = []
        self.seq = 0
        self.unroutable = 0
        self.write_errors = 0
        self.late_max = 0.0

    def route(self, fd: int, packet: bytes, now: float) -> None:
        if len(packet) < 20 or packet[0] >> 4 != 4:
            self.unroutable += 1
            return
        if fd == self.learner_fd:
            route = self.to_sampler.get(packet[16:20])
        else:
            route = self.from_sampler.get(fd) if packet[16:20] == self.learner_ip else None
        if route is None:
            self.unroutable += 1
            return
        at = route.shaper.admit(now, len(packet))
        if at is not None:
            self.seq += 1
            heapq.heappush(self.heap, (at, self.seq, route.out_fd, packet))

    def flush(self, now: float) -> None:
        heap = self.heap
        while heap and heap[0][0] <= now:
            at, _, fd, packet = heapq.heappop(heap)
            self.late_max = max(self.late_max, now - at)
            try:
                os.write(fd, packet)
            except OSError:
                self.write_errors += 1

    def stats(self) -> dict:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "elapsed_s": time.monotonic() - self.t0,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "links": [{path: s.stats() for path, s in pair.items()} for pair in self.shapers],
            "in_flight": len(self.heap),
            "unroutable": self.unroutable,
            "write_errors": self.write_errors,
            "late_max_s": self.late_max,
        }

    def cut(self, index: int, now: float, seconds: float) -> None:
        """Link `index` down in both directions over [now, now + seconds)."""
        window = Outages([(now, now + seconds)])
        for shaper in self.shapers[index].values():
            shaper.cond.outages = shaper.cond.outages.union(window)

    def _wait(self, now: float) -> float:
        """The epoll timeout until the next delivery. epoll counts whole milliseconds, rounded up (a packet due in
        0.3 ms would leave 1 ms late, twice per round trip): the whole milliseconds are left to epoll, the rest is
        slept off in slices of at most `FINE_SLICE`, so a packet that comes in meanwhile is read that much late."""
        if not self.heap:
            return 1.0
        wait = self.heap[0][0] - now
        if wait >= 0.001:
            return int(wait * 1000) / 1000
        if wait > 0:
            time.sleep(min(wait, FINE_SLICE))
        return 0.0

    def serve(self, control: int) -> None:
        """The loop: until `quit` or the end of the control pipe."""
        poller = select.epoll()
        devices = [self.learner_fd, *self.from_sampler]
        for fd in devices:
            os.set_blocking(fd, False)
            poller.register(fd, select.EPOLLIN)
        poller.register(control, select.EPOLLIN)
        pending = b""
        t0, monotonic, read = self.t0, time.monotonic, os.read
        while True:
            timeout = self._wait(monotonic() - t0)
            for fd, _ in poller.poll(timeout):
                if fd == control:
                    chunk = read(control, 4096)
                    if not chunk:
                        return
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        if line.strip() == b"quit":
                            return
                        if line.strip() == b"stats":
                            sys.stdout.write(json.dumps(self.stats()) + "\n")
                            sys.stdout.flush()
                        if line.startswith(b"cut "):
                            _, index, seconds = line.split()
                            self.cut(int(index), monotonic() - t0, float(seconds))
                    continue
                for _ in range(READ_BURST):
                    try:
                        packet = read(fd, 65536)
                    except BlockingIOError:
                        break
                    self.route(fd, packet, monotonic() - t0)
            self.flush(monotonic() - t0)


def _prioritise() -> str:
    """Ask for real-time scheduling (SCHED_FIFO, lowest priority): on a loaded machine a router that waits for
    a CPU delays every packet. The loop sleeps in epoll between packets, and the kernel's real-time throttling
    leaves other processes at least 5% of the CPU even if it did not; without the privilege, nice -10, else as is."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        return "fifo"
    except (PermissionError, OSError):
        pass
    try:
        os.nice(-10)
        return "nice"
    except PermissionError:
        return "normal"


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    scheduling = _prioritise()
    control = sys.stdin.fileno()
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(control, 65536)
        if not chunk:
            return
        line += chunk
    router = Router(json.loads(line))
    sys.stdout.write(json.dumps({"ready": True, "scheduling": scheduling}) + "\n")
    sys.stdout.flush()
    router.serve(control)


if __name__ == "__main__":
    main()
