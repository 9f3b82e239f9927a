"""A calibration as a simulator config (the live run's config with the measured figures put in) and as a table.

What changes in the config, per sampler: `tokens_per_second`, `start_delay_s`, its link's `weights_delay` and
`rollout_delay` (measured one-way delays: `fixed` from one value, `empirical` samples up to 20 values, 21 quantiles
beyond), each direction's rate where it was measurable and bandwidth-bound (else None), and `transfer: tcp` (the
delays are half round trips of small messages; the simulator plays TCP's handshakes and rounds on them); a trace
is dropped (its effect was measured). For the learner: `learner_step_seconds`, `learner_seconds_per_token`, (rollouts
over links) `learner_seconds_per_group`, `learner_commit_seconds` and `learner_eval_seconds`. The WAN
lab and link emulation are switched off: the config is for the simulator. Everything else stays as it ran.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from heterorl.calibrate.fit import Estimate, quantile_points
from heterorl.calibrate.measure import Calibration, LinkDirection
from heterorl.config import RunConfig

SAMPLES_UP_TO = 20  # more measured delays than this are written as quantiles


def delay_config(delays: list[float]) -> dict[str, Any]:
    """A delay kind for measured one-way delays (seconds)."""
    if len(delays) == 1:
        return {"kind": "fixed", "seconds": round(delays[0], 6)}
    if len(delays) <= SAMPLES_UP_TO:
        return {"kind": "empirical", "samples": [round(d, 6) for d in sorted(delays)]}
    return {"kind": "empirical", "quantiles": {p: round(q, 6) for p, q in quantile_points(delays).items()}}


def _rate(direction: LinkDirection | None) -> float | None:
    return None if direction is None or direction.rate_mbps is None else round(direction.rate_mbps.value, 4)


def calibrated_config(config: dict[str, Any], cal: Calibration) -> dict[str, Any]:
    """`config` (as the live run wrote it) with the measured figures; validated as a RunConfig."""
    out = copy.deepcopy(config)
    cluster = out.setdefault("cluster", {})
    if cal.learner is not None:
        cluster["learner_step_seconds"] = _sig(cal.learner.intercept.value)
        cluster["learner_seconds_per_token"] = _sig(cal.learner.slope.value)
    over_links = out.get("transport", {}).get("rollouts", "http") != "store"  # the simulator's store charges none
    if cal.intake is not None and over_links:
        cluster["learner_seconds_per_group"] = _sig(cal.intake.value)
    if cal.commit is not None:
        cluster["learner_commit_seconds"] = _sig(cal.commit.value)
    if cal.evaluation is not None:
        cluster["learner_eval_seconds"] = _sig(cal.evaluation.value)
    nodes = cluster.setdefault("samplers", [{}])
    for node, sc in zip(nodes, cal.samplers, strict=True):
        speed = sc.speed.value if sc.speed is not None else sc.assumed_speed
        if speed is not None:
            node["tokens_per_second"] = _sig(speed)
        if sc.start_delay_s is not None:
            node["start_delay_s"] = round(sc.start_delay_s, 3)
        if sc.weights is None and sc.rollout is None:
            continue
        link = node.setdefault("link", {})
        link.pop("trace", None)
        link["transfer"] = {"model": "tcp"}
        link["bandwidth_mbps"] = None
        if sc.weights is not None:
            link["weights_delay"] = delay_config(sc.weights.delays)
            link["weights_bandwidth_mbps"] = _rate(sc.weights)
        if sc.rollout is not None:
            link["rollout_delay"] = delay_config(sc.rollout.delays)
            link["rollout_bandwidth_mbps"] = _rate(sc.rollout)
    live = out.setdefault("live", {})
    live["wan_lab"] = False
    live["emulate_links"] = False
    RunConfig.model_validate(out)  # a calibration must never write a config the simulator refuses
    return out


def _sig(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant digits (a calibrated figure is not known better than that)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def fmt(e: Estimate | None, unit: str = "", digits: int = 3) -> str:
    """`value [low, high] (n)`; `value (n)` without an interval; `-` for nothing."""
    if e is None:
        return "-"
    v = f"{_sig(e.value, digits):g}{unit}"
    if math.isfinite(e.low):
        v += f" [{_sig(e.low, digits):g}, {_sig(e.high, digits):g}]"
    return f"{v} (n={e.n})"


def delay_text(direction: LinkDirection) -> str:
    """`p50 ..., p90 ... (n)` of a direction's one-way delays."""
    q = quantile_points(direction.delays, 11)
    return f"one-way delay p50 {q[0.5]:.3g} s, p90 {q[0.9]:.3g} s (n={len(direction.delays)})"


def rate_text(direction: LinkDirection) -> str:
    if direction.rate_mbps is None:
        return "no rate (not measurable, or the transfers were window-bound): TCP's rounds in the simulator"
    return f"rate {fmt(direction.rate_mbps, ' Mbit/s')} (time per byte: transfer and handling)"


def report_lines(cal: Calibration) -> list[str]:
    """What was measured, with counts and 95% intervals, one block per sampler."""
    lines = []
    if cal.learner is not None:
        fit = cal.learner
        lines.append(
            f"learner: {fmt(fit.intercept, ' s')} per step + {fmt(fit.slope, ' s')} per token "
            f"(residual sd {fit.intercept.spread:.3g} s)"
        )
    if cal.intake is not None:
        lines.append(f"learner intake: {fmt(cal.intake, ' s')} per uploaded group")
    if cal.commit is not None:
        lines.append(f"learner commit: {fmt(cal.commit, ' s')} after each step before the next")
    if cal.evaluation is not None:
        lines.append(f"evaluation: {fmt(cal.evaluation, ' s')} more on a step that evaluates")
    for sc in cal.samplers:
        lines.append(f"sampler {sc.name}")
        lines.append(f"  speed        {fmt(sc.speed, ' tokens/s')}")
        if sc.start_delay_s is not None:
            first = "" if sc.first_update_s is None else f"; its first weights {sc.first_update_s:.3g} s later"
            lines.append(f"  start-up     {sc.start_delay_s:.3g} s after the learner's clock began{first}")
        if sc.weights is not None:
            lines.append(f"  weights path {delay_text(sc.weights)}; {rate_text(sc.weights)}")
        if sc.rollout is not None:
            lines.append(f"  rollout path upload round trip {fmt(sc.rtt, ' s')}; {delay_text(sc.rollout)}")
            lines.append(f"               {rate_text(sc.rollout)}")
    return lines
