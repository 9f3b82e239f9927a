"""A TCP-like transfer model: what a message costs on one direction of a TCP connection, round by round.

Linux's defaults (CUBIC's window cut, RFC 6298 timers with a 200 ms floor), simplified to rounds of one window:

- Handshake: a side that opens the connection waits one round trip (SYN, SYN-ACK) before its data leaves; a lost
  SYN is sent again after `syn_rto_s`, doubling (RFC 6298).
- Window: a new connection starts at `initial_window` segments of `mss` payload bytes (RFC 6928: 10). Each round
  sends min(cwnd, what is left). In slow start each acknowledged segment adds one (a full round doubles cwnd),
  up to ssthresh, when the window limited the sender (Linux: cwnd < 2 x the most segments in flight), also on
  the acknowledgements of a message's last round; congestion avoidance adds one segment per round. Once a
  round's window exceeds the bandwidth-delay product the bottleneck queue grows, the round lasts window x
  segment time instead of one RTT (the rate bounds the throughput) and the queueing inflates the RTT samples
  (and so the RTO); segments beyond BDP + `queue_packets` are dropped. Slow start runs on into the queue:
  CUBIC's HyStart, measured in the WAN lab, left it late (at 3.4 x the BDP on a 5 Mbit/s, 300 ms link with a
  1000-packet buffer), so the model has none.
- Round time: max(RTT + one segment's serialisation, window's serialisation); the last round ends when its
  last byte arrives: start of the round + window's serialisation + one-way delay.
- Random loss (each segment lost with the path's `loss`): the round's losses are detected by later segments'
  acknowledgements (RACK / fast retransmit, about 1.25 RTT) or, when the last segment sent is lost, by the tail
  loss probe after PTO = 2 SRTT + 10 ms (+ rto_min instead when one segment is out), at most the RTO (RFC 8985,
  Linux); cwnd and ssthresh become beta * cwnd, and the lost segments go again in the next round.
- A cut (an outage overlapping a round) loses the round: the tail loss probe goes PTO after the round's last
  segment, then the retransmission timer fires RTO after the probe and backs off (RTO doubles, up to
  `rto_max_s`) until a retransmission crosses while the link is up; then ssthresh = beta * cwnd and slow start
  restarts from one segment (RFC 5681 loss window). The kernel's timer wheel rounds the longer timeouts up
  (by up to 1/8), which the model leaves out: measured cuts cost a few percent more.
- RTO = SRTT + RTTVAR with Linux's estimator (`_sample_rtt`; RFC 6298's gains, RTTVAR >= `rto_min_s`), one RTT
  sample per round; before any sample the SYN timeout applies.
- Slow start after idle (RFC 7661 / Linux tcp_cwnd_restart): when data is sent after more than an RTO of
  silence, ssthresh = max(ssthresh, 3/4 cwnd) and cwnd halves for every RTO of idleness, down to
  min(initial_window, cwnd).

What it leaves out: the receive window (Linux's autotuning keeps ahead of slow start), delayed-ACK timing,
HyStart, CUBIC's window curve in congestion avoidance (Reno's +1 per round), ACK loss, partial rounds lost to a
cut, the kernel's timer granularity.
The WAN lab measures real kernel TCP against it (tests/lab/test_tcp_model.py, docs/wan-lab.md).
"""

from __future__ import annotations

import math

from heterorl.config import TcpTransfer
from heterorl.network.conditions import PathConditions
from heterorl.network.transfer import PathTransfer, Transfer, register_transfer

HEADER_BYTES = 52  # IPv4 20 + TCP 20 + timestamps option 12: bytes on the wire per segment beside its payload
PTO_FLOOR_S = 0.01  # RFC 8985's floor of the probe timeout
RACK_WINDOW = 0.25  # RACK waits a quarter of the min RTT for reordering before it marks a segment lost


@register_transfer("tcp")
class TcpPath(PathTransfer):
    """One direction of a TCP connection: its window, RTT estimate and timers carry over between messages."""

    def __init__(self, cfg: TcpTransfer, cond: PathConditions, queue_packets: int) -> None:
        super().__init__(cond)
        self.cfg = cfg
        self.queue_packets = queue_packets
        self.established = False
        self.retransmissions = 0
        self._reset()

    def _reset(self) -> None:
        """A new connection's sender state."""
        self.cwnd = float(self.cfg.initial_window)
        self.ssthresh = math.inf
        self.srtt: float | None = None
        self.mdev = 0.0  # Linux's mdev_us: 4 x the smoothed mean deviation
        self.rttvar = 0.0  # Linux's rttvar_us: what RTO adds to SRTT, never below rto_min
        self.last_sent = -math.inf

    @property
    def rto(self) -> float:
        """SRTT + RTTVAR (Linux: RTTVAR >= rto_min), capped; the SYN timeout before any RTT sample."""
        if self.srtt is None:
            return self.cfg.syn_rto_s
        return min(self.srtt + self.rttvar, self.cfg.rto_max_s)

    def _sample_rtt(self, rtt: float) -> None:
        """Linux's tcp_rtt_estimator with one sample per round: SRTT += (m - SRTT) / 8; mdev (4x the mean
        deviation) += |m - SRTT| - mdev / 4; RTTVAR moves a quarter of the way to max(mdev, rto_min) per round
        (it rises at once). The first sample: SRTT = m, mdev = 2m, RTTVAR = max(2m, rto_min) (RTO = 3 RTT)."""
        floor = self.cfg.rto_min_s
        if self.srtt is None:
            self.srtt, self.mdev = rtt, 2.0 * rtt
            self.rttvar = max(self.mdev, floor)
            return
        err = rtt - self.srtt
        self.srtt += err / 8.0
        self.mdev += abs(err) - self.mdev / 4.0
        target = max(self.mdev, floor)
        self.rttvar = target if target > self.rttvar else self.rttvar - (self.rttvar - target) / 4.0

    def _lost(self, t: float) -> bool:
        p = self.cond.loss(t)
        return p > 0.0 and bool(self.cond.packet_rng.random() < p)

    def _handshake(self, t: float) -> tuple[float, int]:
        """SYN at t until a SYN and its SYN-ACK both cross: (when data may leave, SYNs sent again)."""
        timeout, tries = self.cfg.syn_rto_s, 0
        while True:
            rtt = self.cond.delay(t) + self.cond.ack_delay(t)
            cut = self.cond.outages.first_cut(t, t + rtt) if self.cond.outages else None
            if cut is None and not self._lost(t) and not self._lost(t):
                self._sample_rtt(rtt)
                return t + rtt, tries
            tries += 1
            t += timeout
            timeout = min(2.0 * timeout, self.cfg.rto_max_s)

    def _restart_after_idle(self, t: float) -> None:
        """Linux's tcp_cwnd_restart: halve cwnd per RTO of idleness, not below min(initial window, cwnd)."""
        rto, idle = self.rto, t - self.last_sent
        if not self.cfg.slow_start_after_idle or idle <= rto:
            return
        self.ssthresh = max(self.ssthresh, 0.75 * self.cwnd)
        restart, cwnd = min(float(self.cfg.initial_window), self.cwnd), self.cwnd
        idle -= rto
        while idle > 0.0 and cwnd > restart:
            cwnd = float(int(cwnd) // 2)
            idle -= rto
        self.cwnd = max(cwnd, restart)

    def _pto(self, w: int) -> float:
        """Linux's tail loss probe timeout: 2 SRTT, plus rto_min when one segment is out (a delayed ACK may be
        all that is missing) else a 10 ms floor, never later than the RTO (RFC 8985)."""
        srtt = self.srtt if self.srtt is not None else self.cfg.syn_rto_s
        return min(2.0 * srtt + (self.cfg.rto_min_s if w == 1 else PTO_FLOOR_S), self.rto)

    def _timeout(self, t: float, w: int) -> tuple[float, int]:
        """The round of w segments sent at t is lost to a cut: a tail loss probe after PTO, then the
        retransmission timer from the probe, doubling, until a retransmission and its acknowledgement cross while
        the link is up. (when it leaves, retransmissions sent)."""
        t += self._pto(w)
        rtt = self.cond.delay(t) + self.cond.ack_delay(t)
        if self.cond.outages.first_cut(t, t + rtt) is None and not self._lost(t):
            return t, 0  # the probe got through: the round is sent again from here, window unchanged
        timeout, tries = self.rto, 1
        while True:
            t += timeout
            tries += 1
            rtt = self.cond.delay(t) + self.cond.ack_delay(t)
            if self.cond.outages.first_cut(t, t + rtt) is None and not self._lost(t):
                break
            timeout = min(2.0 * timeout, self.cfg.rto_max_s)
        self.ssthresh = max(self.cfg.beta * self.cwnd, 2.0)
        self.cwnd = 1.0
        return t, tries - 1

    def _send(self, start: float, nbytes: int, fresh: bool, handshake: bool) -> Transfer:
        t, retx = start, 0
        if fresh or not self.established:
            self._reset()
            self.established = True
            if handshake:
                t, retx = self._handshake(t)
        else:
            self._restart_after_idle(t)
        first = t
        remaining, w = max(1, math.ceil(nbytes / self.cfg.mss)), 0
        wire_bits = (self.cfg.mss + HEADER_BYTES) * 8.0
        while True:
            rate = self.cond.rate_bps(t)
            seg_time = 0.0 if rate is None else wire_bits / rate
            d_fwd = self.cond.delay(t)
            rtt = d_fwd + self.cond.ack_delay(t)
            prev_w, w = w, min(max(1, int(self.cwnd)), remaining)
            burst = w * seg_time
            if self.cond.outages and self.cond.outages.first_cut(t, t + burst + rtt) is not None:
                t, tries = self._timeout(t + burst, w)
                retx += tries + w
                continue
            bdp = math.inf if seg_time == 0.0 else rtt / seg_time + 1.0
            lost = self._losses(t, w, bdp)
            round_time = max(rtt + seg_time, burst)
            if not lost:
                remaining -= w
                self._sample_rtt(round_time)
                # the most segments in flight: the previous round's, plus half of this one sent while its
                # acknowledgements arrived (slow start sends two for each)
                self._grow(w, prev_w + w // 2 if prev_w else w)
                if remaining == 0:
                    break
                t += round_time
                continue
            retx += len(lost)
            remaining -= w - len(lost)
            tail = lost[-1] == w - 1 and remaining == len(lost)
            wait = burst + self._pto(w) if tail else round_time + RACK_WINDOW * rtt
            self.ssthresh = self.cwnd = max(self.cfg.beta * self.cwnd, 2.0)
            t += wait
        sent = t + burst
        self.last_sent = sent
        self.retransmissions += retx
        return Transfer(first, sent, sent + d_fwd, retx)

    def _losses(self, t: float, w: int, bdp: float) -> list[int]:
        """Positions (0 .. w-1) of the round's lost segments: random loss, and what overflows the queue."""
        p = self.cond.loss(t)
        lost = set()
        if p > 0.0:
            lost.update(int(i) for i in (self.cond.packet_rng.random(w) < p).nonzero()[0])
        overflow = w - self.queue_packets - (int(bdp) if bdp != math.inf else w)
        if overflow > 0:
            lost.update(range(w - overflow, w))
        return sorted(lost)

    def _grow(self, w: int, in_flight: int) -> None:
        """The acknowledgements of a clean round of w segments open the window when it limited the sender
        (Linux's tcp_is_cwnd_limited: in slow start cwnd < 2 x the most segments in flight, `in_flight`; after
        it, a full window). Slow start adds one segment per segment acknowledged (a full round doubles cwnd), up
        to ssthresh; congestion avoidance adds one segment per round."""
        if self.cwnd < self.ssthresh:
            if 2 * in_flight > self.cwnd:
                self.cwnd = min(self.cwnd + w, self.ssthresh)
        elif w >= int(self.cwnd):
            self.cwnd += 1.0
