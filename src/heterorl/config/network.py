"""Links between learner and samplers: delay models, rates, faults, outages, transfer models and traces.

One `LinkConfig` describes a sampler's link for both the simulator (`heterorl.network`) and the WAN lab
(`heterorl.lab`), which shapes real packets with the same numbers. Delays are one way: `weights_delay` learner ->
sampler, `rollout_delay` sampler -> learner. In the simulator a delay is drawn per message; in the WAN lab per
packet (docs/wan-lab.md).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Literal

from pydantic import Field, model_validator

from heterorl.config.base import MAX_MBPS, MAX_SECONDS, Strict


class FixedDelay(Strict):
    kind: Literal["fixed"] = "fixed"
    seconds: float = Field(0.0, ge=0.0, le=MAX_SECONDS, description="Constant delay (s).")


class UniformDelay(Strict):
    kind: Literal["uniform"] = "uniform"
    low: float = Field(..., ge=0.0, le=MAX_SECONDS, description="Smallest delay (s).")
    high: float = Field(..., ge=0.0, le=MAX_SECONDS, description="Largest delay (s).")

    @model_validator(mode="after")
    def _order(self) -> UniformDelay:
        if self.low > self.high:
            raise ValueError(f"low {self.low} > high {self.high}")
        return self


class ExponentialDelay(Strict):
    kind: Literal["exponential"] = "exponential"
    mean: float = Field(..., gt=0.0, le=MAX_SECONDS, description="Mean of the exponential part (s).")
    offset: float = Field(0.0, ge=0.0, le=MAX_SECONDS, description="Added constant (s).")


class _BandDelay(Strict):
    """A distribution fitted so that [lower, upper] holds `conf` of its mass; samples are shifted and clipped."""

    lower: float = Field(
        60.0, gt=0.0, le=MAX_SECONDS, description="Lower end of the confidence band and clip floor (s)."
    )
    upper: float = Field(
        1920.0, gt=0.0, le=MAX_SECONDS, description="Upper end of the confidence band and clip ceiling (s)."
    )
    conf: float = Field(0.995, gt=0.0, lt=1.0, description="Probability mass inside [lower, upper].")
    offset: float = Field(0.0, ge=0.0, le=MAX_SECONDS, description="Subtracted from each sample before clipping (s).")

    @model_validator(mode="after")
    def _order(self) -> _BandDelay:
        if self.lower >= self.upper:
            raise ValueError(f"lower {self.lower} must be < upper {self.upper}")
        return self


class LogNormalDelay(_BandDelay):
    kind: Literal["lognormal"] = "lognormal"


class WeibullDelay(_BandDelay):
    kind: Literal["weibull"] = "weibull"


class EmpiricalDelay(Strict):
    """A measured distribution: raw samples or a few quantiles, drawn by inverse CDF with linear interpolation."""

    kind: Literal["empirical"] = "empirical"
    samples: list[Annotated[float, Field(ge=0.0, le=MAX_SECONDS)]] | None = Field(
        None, min_length=1, max_length=1_000_000, description="Measured delays (s), any order."
    )
    quantiles: dict[Annotated[float, Field(ge=0.0, le=1.0)], Annotated[float, Field(ge=0.0, le=MAX_SECONDS)]] | None = (
        Field(
            None,
            min_length=1,
            max_length=10_000,
            description="Probability -> delay (s), e.g. {0.5: 0.08, 0.99: 0.4}; mass beyond the outermost given "
            "probabilities sits at their delays.",
        )
    )

    @model_validator(mode="after")
    def _one_source(self) -> EmpiricalDelay:
        if (self.samples is None) == (self.quantiles is None):
            raise ValueError("give exactly one of `samples` or `quantiles`")
        if self.quantiles is not None:
            points = sorted(self.quantiles.items())
            for (p0, d0), (p1, d1) in pairwise(points):
                if d1 < d0:
                    raise ValueError(f"quantiles must not decrease: p{p0} = {d0} > p{p1} = {d1}")
        return self


DelayConfig = Annotated[
    FixedDelay | UniformDelay | ExponentialDelay | LogNormalDelay | WeibullDelay | EmpiricalDelay,
    Field(discriminator="kind"),
]


class FaultConfig(Strict):
    """Fault injection on one path of a link: per message (the simulator and `live.emulate_links`) and per packet
    (the WAN lab's router and the `tcp` transfer model)."""

    drop: float = Field(0.0, ge=0.0, le=1.0, description="Message lost.")
    duplicate: float = Field(0.0, ge=0.0, le=1.0, description="Message delivered twice.")
    reorder: float = Field(0.0, ge=0.0, le=1.0, description="Message held back by `reorder_seconds`.")
    reorder_seconds: float = Field(30.0, ge=0.0, le=MAX_SECONDS, description="Extra delay of a reordered message.")
    corrupt: float = Field(0.0, ge=0.0, le=1.0, description="One byte of the payload flipped.")
    packet_loss: float = Field(
        0.0, ge=0.0, le=0.5, description="Packet lost (WAN lab; `tcp` transfer model: retransmissions)."
    )
    packet_reorder: float = Field(
        0.0, ge=0.0, le=1.0, description="Packet held back by `packet_reorder_seconds` so later ones overtake it (lab)."
    )
    packet_reorder_seconds: float = Field(0.01, ge=0.0, le=10.0, description="Extra delay of a reordered packet (s).")


class Outage(Strict):
    """The link is down (both directions: everything sent or arriving is lost) from `start` to `end`."""

    start: float = Field(
        ..., ge=0.0, le=MAX_SECONDS, description="Seconds from the run's start (lab: from the lab's start)."
    )
    end: float = Field(..., gt=0.0, le=MAX_SECONDS, description="Seconds from the run's start when the link is back.")

    @model_validator(mode="after")
    def _order(self) -> Outage:
        if self.start >= self.end:
            raise ValueError(f"outage start {self.start} must be < end {self.end}")
        return self


class SimpleTransfer(Strict):
    """transfer time = delay + bytes * 8 / rate: the message model (no handshake, no congestion window)."""

    model: Literal["simple"] = "simple"


class TcpTransfer(Strict):
    """A TCP-like transfer: handshake, slow start from an initial window, slow start after idle, congestion
    avoidance, loss recovery and retransmission back-off (`heterorl.network.tcp`, Linux's defaults)."""

    model: Literal["tcp"] = "tcp"
    initial_window: int = Field(10, ge=1, le=1000, description="Initial congestion window (segments, RFC 6928).")
    mss: int = Field(1448, ge=256, le=65_483, description="Payload bytes per segment (1500 MTU with timestamps).")
    rto_min_s: float = Field(0.2, gt=0.0, le=10.0, description="Smallest retransmission timeout (Linux: 200 ms).")
    rto_max_s: float = Field(120.0, gt=0.0, le=3600.0, description="Cap of the backed-off timeout (Linux: 120 s).")
    syn_rto_s: float = Field(1.0, gt=0.0, le=60.0, description="Timeout of an unanswered SYN (RFC 6298: 1 s).")
    beta: float = Field(0.7, gt=0.0, lt=1.0, description="Window kept after a loss (CUBIC 0.7, Reno 0.5).")
    slow_start_after_idle: bool = Field(
        True, description="Idle longer than an RTO shrinks the window back towards the initial one (RFC 7661)."
    )

    @model_validator(mode="after")
    def _rto_order(self) -> TcpTransfer:
        if self.rto_min_s > self.rto_max_s:
            raise ValueError(f"rto_min_s {self.rto_min_s} > rto_max_s {self.rto_max_s}")
        return self


TransferConfig = Annotated[SimpleTransfer | TcpTransfer, Field(discriminator="model")]


class LinkConfig(Strict):
    """A sampler's link to the learner, read by the simulator and by the WAN lab alike."""

    weights_delay: DelayConfig = Field(default_factory=FixedDelay, description="Learner -> sampler delay model.")
    rollout_delay: DelayConfig = Field(default_factory=FixedDelay, description="Sampler -> learner delay model.")
    bandwidth_mbps: float | None = Field(
        None, gt=0.0, le=MAX_MBPS, description="Megabits per second; None = unlimited."
    )
    weights_bandwidth_mbps: float | None = Field(
        None, gt=0.0, le=MAX_MBPS, description="Learner -> sampler rate (Mbit/s); None = `bandwidth_mbps`."
    )
    rollout_bandwidth_mbps: float | None = Field(
        None, gt=0.0, le=MAX_MBPS, description="Sampler -> learner rate (Mbit/s); None = `bandwidth_mbps`."
    )
    queue_packets: int = Field(
        1000, ge=2, le=1_000_000, description="Bottleneck buffer of each direction (packets; lab and `tcp` model)."
    )
    weights_faults: FaultConfig = Field(default_factory=FaultConfig, description="Faults on the weights path.")
    rollout_faults: FaultConfig = Field(default_factory=FaultConfig, description="Faults on the rollout path.")
    outages: list[Outage] = Field(
        default_factory=list, max_length=10_000, description="Cuts, in time order: [{start, end}] (s from the start)."
    )
    transfer: TransferConfig = Field(
        default_factory=SimpleTransfer, description="How a message's bytes cross the link: simple | tcp."
    )
    trace: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="A trace file (.jsonl or .csv) replayed over time: delays, rates, loss and cuts it gives "
        "replace the fields above (docs/wan-lab.md).",
    )

    @model_validator(mode="after")
    def _outages_in_order(self) -> LinkConfig:
        for a, b in pairwise(self.outages):
            if b.start < a.end:
                raise ValueError(f"outages must be in time order and not overlap: {a.start}-{a.end}, {b.start}-{b.end}")
        return self

    def bandwidth_of(self, path: Literal["weights", "rollout"]) -> float | None:
        """The rate of one direction (Mbit/s): its own field, else `bandwidth_mbps`; None = unlimited."""
        own = self.weights_bandwidth_mbps if path == "weights" else self.rollout_bandwidth_mbps
        return self.bandwidth_mbps if own is None else own
