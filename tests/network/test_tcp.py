"""The TCP-like transfer model, against numbers worked out by hand from its rules (heterorl.network.tcp)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heterorl.config import LinkConfig
from heterorl.network import Link, TcpPath


class ScriptedRng:
    """Stands in for the packet stream: the uniforms a test chooses, in order."""

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)

    def random(self, size: int | None = None):
        if size is None:
            return self.values.pop(0)
        out, self.values = self.values[:size], self.values[size:]
        assert len(out) == size, "the script ran out of uniforms"
        return np.array(out)


def tcp_link(one_way: float = 0.05, mbps: float | None = None, **kw) -> Link:
    delay = {"kind": "fixed", "seconds": one_way}
    kw.setdefault("transfer", {"model": "tcp"})
    cfg = LinkConfig(weights_delay=delay, rollout_delay=delay, bandwidth_mbps=mbps, **kw)
    return Link(cfg, seed=0)


def established(link: Link, srtt: float = 0.1, rttvar: float = 0.2, cwnd: float = 10.0) -> TcpPath:
    """The rollout path as after a handshake: RTO = srtt + rttvar."""
    path = link.transfers["rollout"]
    assert isinstance(path, TcpPath)
    path.established, path.srtt, path.rttvar, path.cwnd, path.last_sent = True, srtt, rttvar, cwnd, -0.01
    return path


def test_fresh_64kb_without_a_rate_is_three_and_a_half_round_trips() -> None:
    # 45 segments of 1448 bytes; handshake 0.1; rounds of 10 and 20 (0.1 each); the last 15 arrive 0.05 later
    link = tcp_link()
    done = link.transfer("rollout", 0.0, 64_000, fresh=True)
    assert (done.start, done.sent, done.arrival) == pytest.approx((0.1, 0.3, 0.35))
    # slow start counts the last round's acknowledgements too: 10 + 45 segments
    assert link.transfers["rollout"].cwnd == 55


def test_fresh_64kb_at_12_mbits() -> None:
    # a 1500-byte segment takes 1 ms at 12 Mbit/s: a round is RTT + 1 ms = 0.101 s; the last 15 segments 15 ms
    done = tcp_link(mbps=12.0).transfer("rollout", 0.0, 64_000, fresh=True)
    assert (done.sent, done.arrival) == pytest.approx((0.1 + 0.101 + 0.101 + 0.015, 0.367))


def test_the_server_side_of_a_new_connection_pays_no_handshake() -> None:
    done = tcp_link().transfer("weights", 1.0, 64_000, fresh=True, handshake=False)
    assert done.arrival == pytest.approx(1.0 + 0.2 + 0.05)


def test_a_warm_bulk_transfer_runs_at_the_rate() -> None:
    link = tcp_link(mbps=12.0)
    link.transfer("rollout", 0.0, 10_000_000, fresh=True)
    start = link.transfers["rollout"].free_at + 0.01
    done = link.transfer("rollout", start, 10_000_000)
    segments = math.ceil(10_000_000 / 1448)
    # the window already fills the pipe: segments x 1 ms, plus the one-way delay
    assert done.arrival - start == pytest.approx(segments * 1e-3 + 0.05, rel=0.01)


@pytest.mark.parametrize(("idle", "cwnd"), [(0.25, 80.0), (0.65, 20.0), (1.0, 10.0), (30.0, 10.0)])
def test_slow_start_after_idle_halves_per_rto(idle: float, cwnd: float) -> None:
    # Linux tcp_cwnd_restart with RTO 0.3: while (idle -= RTO) > 0 and cwnd > 10: cwnd /= 2
    path = established(tcp_link(), cwnd=80.0)
    path.last_sent = 0.0
    path._restart_after_idle(idle)
    assert path.cwnd == cwnd
    assert path.ssthresh == (math.inf if idle <= 0.3 else max(math.inf, 60.0))


def test_no_restart_when_slow_start_after_idle_is_off() -> None:
    link = tcp_link(transfer={"model": "tcp", "slow_start_after_idle": False})
    path = established(link, cwnd=80.0)
    path._restart_after_idle(100.0)
    assert path.cwnd == 80.0


def test_a_cut_costs_the_probe_and_the_backed_off_retransmission_timer() -> None:
    # SRTT 0.1, RTO 0.3; the one segment sent at 1.0 is lost. Tail loss probe after min(2 x 0.1 + 0.2, RTO) = 0.3:
    # 1.3 (down); then RTO from the probe, doubling: 1.6 (down), 2.2 (down), 3.4 (up): it arrives at 3.45
    link = tcp_link(outages=[{"start": 1.0, "end": 3.0}])
    path = established(link, cwnd=10.0)
    done = link.transfer("rollout", 1.0, 100)
    assert (done.arrival, done.retransmissions) == pytest.approx((3.45, 4))
    # after the timeout: ssthresh = 0.7 x 10, cwnd from 1 (then one acknowledged segment: 2)
    assert (path.ssthresh, path.cwnd) == (7.0, 2.0)


def test_a_cut_with_two_segments_out() -> None:
    # PTO = 2 x 0.1 + 10 ms = 0.21: probe 1.21, RTO 1.51, 2.11, 3.31 (up); then cwnd 1: one segment, then the other
    link = tcp_link(outages=[{"start": 1.0, "end": 3.0}])
    established(link, cwnd=10.0)
    assert link.transfer("rollout", 1.0, 2 * 1448).arrival == pytest.approx(3.31 + 0.1 + 0.05)


def test_a_lost_syn_waits_one_second_then_two() -> None:
    link = tcp_link(rollout_faults={"packet_loss": 0.5})
    link.conditions["rollout"].packet_rng = ScriptedRng([0.1, 0.9, 0.1, 0.9, 0.9] + [0.9] * 10)
    # SYN lost at 0 (1 s timeout), SYN-ACK lost at 1 (2 s), both cross at 3: data leaves at 3.1
    done = link.transfer("rollout", 0.0, 1000, fresh=True)
    assert (done.start, done.arrival, done.retransmissions) == pytest.approx((3.1, 3.15, 2))


@pytest.mark.parametrize(
    ("uniforms", "arrival"),
    [
        # the last segment lost: nothing after it to reveal the loss; the tail probe fires 2 SRTT + 10 ms later
        ([0.9, 0.9, 0.1, 0.9], 0.21 + 0.05),
        # the first segment lost: later segments reveal it after RTT + RTT / 4
        ([0.1, 0.9, 0.9, 0.9], 0.1 + 0.025 + 0.05),
    ],
)
def test_random_loss_recovery(uniforms: list[float], arrival: float) -> None:
    link = tcp_link(rollout_faults={"packet_loss": 0.5})
    path = established(link, cwnd=10.0)
    link.conditions["rollout"].packet_rng = ScriptedRng(uniforms)
    done = link.transfer("rollout", 0.0, 3 * 1448)
    assert (done.arrival, done.retransmissions) == pytest.approx((arrival, 1))
    assert path.ssthresh == 7.0


def test_loss_slows_a_long_transfer_down() -> None:
    clean = tcp_link(one_way=0.02, mbps=50.0).transfer("rollout", 0.0, 20_000_000, fresh=True)
    lossy = tcp_link(one_way=0.02, mbps=50.0, rollout_faults={"packet_loss": 0.01})
    done = lossy.transfer("rollout", 0.0, 20_000_000, fresh=True)
    assert done.retransmissions > 50
    assert done.arrival > 1.5 * clean.arrival


def test_the_rto_follows_linux_estimator() -> None:
    path = tcp_link().transfers["rollout"]
    assert isinstance(path, TcpPath)
    assert path.rto == 1.0  # no sample yet: the SYN timeout
    path._sample_rtt(0.1)  # first sample: SRTT 0.1, RTTVAR max(2 x 0.1, 0.2) -> RTO 0.3 (3 RTT)
    assert path.rto == pytest.approx(0.3)
    for _ in range(30):
        path._sample_rtt(0.1)  # a steady RTT: RTTVAR decays to its 200 ms floor
    assert path.rto == pytest.approx(0.3)
    # a jump raises RTTVAR at once: SRTT 0.1 + 0.4 / 8 = 0.15, mdev ~0 + |0.4| -> RTTVAR 0.4, RTO 0.55
    path._sample_rtt(0.5)
    assert (path.srtt, path.rto) == pytest.approx((0.15, 0.55), abs=1e-3)
