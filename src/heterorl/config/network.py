"""Links between learner and samplers: delay models, bandwidth, fault injection."""

from __future__ import annotations

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


DelayConfig = Annotated[
    FixedDelay | UniformDelay | ExponentialDelay | LogNormalDelay | WeibullDelay, Field(discriminator="kind")
]


class FaultConfig(Strict):
    """Fault injection on one path of a link (probabilities per message)."""

    drop: float = Field(0.0, ge=0.0, le=1.0, description="Message lost.")
    duplicate: float = Field(0.0, ge=0.0, le=1.0, description="Message delivered twice.")
    reorder: float = Field(0.0, ge=0.0, le=1.0, description="Message held back by `reorder_seconds`.")
    reorder_seconds: float = Field(30.0, ge=0.0, le=MAX_SECONDS, description="Extra delay of a reordered message.")
    corrupt: float = Field(0.0, ge=0.0, le=1.0, description="One byte of the payload flipped.")


class LinkConfig(Strict):
    """A sampler's link to the learner: transfer time = delay + bytes / bandwidth."""

    weights_delay: DelayConfig = Field(default_factory=FixedDelay, description="Learner -> sampler delay model.")
    rollout_delay: DelayConfig = Field(default_factory=FixedDelay, description="Sampler -> learner delay model.")
    bandwidth_mbps: float | None = Field(
        None, gt=0.0, le=MAX_MBPS, description="Megabits per second; None = unlimited."
    )
    weights_faults: FaultConfig = Field(default_factory=FaultConfig, description="Faults on the weights path.")
    retry_seconds: float = Field(
        30.0,
        gt=0.0,
        le=MAX_SECONDS,
        description="After a weight update is lost, the next one is asked for this long later (s).",
    )
    rollout_faults: FaultConfig = Field(default_factory=FaultConfig, description="Faults on the rollout path.")
