"""What calibration measures in a live run's records, and how (each figure with its count and interval):

- a sampler's generation speed: tokens / busy seconds over its `generated` events (completion tokens, the engine's
  time), as the simulator spends it (`tokens / tokens_per_second`);
- the learner's cost: busy seconds of each step (`trained` event) = step_seconds + seconds_per_token * tokens, by
  least squares (neither part negative);
- a link's one-way delays: half of each upload's round trip (`replied`: rtt) less the seconds the learner spent
  on it (`handled`: decoding, screening, journaling the groups; a per-group cost that would otherwise read as a
  slow link), for both directions; the link is written as `tcp`, so the simulator plays handshakes, slow start
  and slow start after idle on top of them;
- a direction's rate: the slope of its transfer times on bytes (weights: the updates the sampler was waiting for,
  its next pull at the learner, from the version's commit -- `published` time less its encode `seconds` -- to its
  arrival -- the `weights` event less its `apply_s`; rollouts: the round trips), kept only where its largest
  transfer was bandwidth-bound (longer than a round trip to serialise at that rate): a window-bound transfer's
  time per byte is TCP's rounds, which the `tcp` model plays;
- start-up: each sampler's first `started` after the learner's clock began (`listening` time minus `elapsed`), and
  how long its first update took from there;
- the learner's intake per group: the `handled` seconds of every upload with groups over their groups (all
  samplers together), as the simulator charges it (`cluster.learner_seconds_per_group`, rollouts over links).
- the learner's commit: the seconds after each step's training before the next could start (`trained`:
  `commit_seconds`: the publish hand-off, recording the step), the mean over steps that did not evaluate; and
  what an evaluation adds (`evaluated` steps' mean less that), as the simulator pauses the learner
  (`cluster.learner_commit_seconds`, `learner_eval_seconds`).

A sampler that was never measured somewhere gets a stand-in, said in a note, rather than the config's nominal
figure (a live config's `tokens_per_second` is a simulator setting no live sampler follows): a speed, the mean of
the measured samplers' speeds. (An earlier version took a rate from a sampler's first update alone, slow start
included; applied to every later update it made a 0.3 s link's patches seconds long in the simulator.)

The first item of each series (a sampler's first chunk, the learner's first step) is left out when there are more
than `WARMUP_KEEP_FROM` items: it carries one-time costs (lazy initialisation) a long run amortises.
A rate is kept only where the sizes varied by at least `MIN_SIZE_SPREAD` of the largest (a 543-545 byte series of
patches cannot tell a transfer rate from jitter: a chance slope over 2 bytes once read as a 74 kbit/s link) and the
fit's slope is significantly positive; else the direction has no rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from heterorl.calibrate.fit import Estimate, LineFit, mean_estimate, nonnegative_cost_fit, ratio_of_sums
from heterorl.calibrate.records import RunRecords, SamplerLog

WARMUP_KEEP_FROM = 3  # series longer than this lose their first item (warm-up)
BITS_PER_MEGABIT = 1e6
MIN_SIZE_SPREAD = 0.25  # (largest - smallest) / largest size a series needs before its rate is fitted


@dataclass
class LinkDirection:
    """One direction of a link: the fit of time on bytes, the rate it implies (None: not measurable), and the
    one-way delays left when the rate's term is taken off (seconds)."""

    fit: LineFit
    rate_mbps: Estimate | None
    delays: list[float]


@dataclass
class SamplerCalibration:
    name: str
    speed: Estimate | None = None  # tokens per second
    start_delay_s: float | None = None
    weights: LinkDirection | None = None
    rollout: LinkDirection | None = None
    rtt: Estimate | None = None  # upload round trips, as measured
    first_update_s: float | None = None  # from `started` to the first verified weights
    first_update_bytes: int | None = None  # that update's size (0: by reference)
    assumed_speed: float | None = None  # the stand-in when `speed` was not measured (the others' mean)


@dataclass
class Calibration:
    learner: LineFit | None
    samplers: list[SamplerCalibration]
    notes: list[str] = field(default_factory=list)
    live: dict[str, Any] = field(default_factory=dict)  # what the live run achieved (its summary's figures)
    intake: Estimate | None = None  # the learner's seconds per uploaded group
    commit: Estimate | None = None  # the learner's seconds between a step's training and the next step
    evaluation: Estimate | None = None  # what a held-out evaluation adds to its step's commit (seconds)


def _drop_warmup(items: list[Any]) -> list[Any]:
    return items[1:] if len(items) > WARMUP_KEEP_FROM else items


def rate_of(fit: LineFit) -> Estimate | None:
    """Mbit/s from a fit's slope (seconds per byte): rate = 8 / slope / 1e6, the interval inverted."""
    if not fit.slope_significant:
        return None
    s = fit.slope
    to_rate = lambda spb: 8.0 / spb / BITS_PER_MEGABIT  # noqa: E731
    return Estimate(to_rate(s.value), s.n, math.nan, to_rate(s.high), to_rate(s.low))


def learner_cost(records: RunRecords) -> LineFit | None:
    steps = [e for e in records.learner_events("trained") if "seconds" in e and "tokens" in e]
    steps = _drop_warmup(steps)
    if not steps:
        return None
    return nonnegative_cost_fit([float(e["tokens"]) for e in steps], [float(e["seconds"]) for e in steps])


def commit_cost(records: RunRecords) -> tuple[Estimate | None, Estimate | None]:
    """(seconds of a step's commit without an evaluation, what an evaluation adds) from the `trained` events'
    `commit_seconds` (the warm-up step left out); an evaluation's cost is the difference of two means, its
    interval the two standard errors combined."""
    steps = _drop_warmup([e for e in records.learner_events("trained") if "commit_seconds" in e])
    plain = [float(e["commit_seconds"]) for e in steps if not e.get("evaluated")]
    evals = [float(e["commit_seconds"]) for e in steps if e.get("evaluated")]
    commit = mean_estimate(plain) if plain else None
    if not evals:
        return commit, None
    with_eval = mean_estimate(evals)
    base = commit.value if commit is not None else 0.0
    value = max(with_eval.value - base, 0.0)
    if commit is None or not (math.isfinite(with_eval.low) and math.isfinite(commit.low)):
        return commit, Estimate(value, len(evals))
    half = math.hypot(with_eval.high - with_eval.value, commit.high - commit.value)
    return commit, Estimate(value, len(evals), with_eval.spread, value - half, value + half)


def intake_cost(records: RunRecords) -> Estimate | None:
    """Seconds of the learner's intake per uploaded group, from the replies' `handled` (uploads with groups)."""
    replies = [e for log in records.samplers.values() for e in log.of("replied") if e.get("groups") and "handled" in e]
    if not replies:
        return None
    return ratio_of_sums([float(e["handled"]) for e in replies], [float(e["groups"]) for e in replies])


def sampler_speed(log: SamplerLog) -> Estimate | None:
    chunks: list[dict[str, Any]] = []
    for boot in _boots(log):
        chunks += _drop_warmup([e for e in boot if e.get("event") == "generated" and e.get("busy", 0) > 0])
    if not chunks:
        return None
    return ratio_of_sums([float(e["tokens"]) for e in chunks], [float(e["busy"]) for e in chunks])


def _boots(log: SamplerLog) -> list[list[dict[str, Any]]]:
    """The sampler's events split by process life (`boot`)."""
    lives: dict[Any, list[dict[str, Any]]] = {}
    for e in log.events:
        lives.setdefault(e.get("boot"), []).append(e)
    return list(lives.values())


def _published(records: RunRecords) -> dict[int, dict[str, Any]]:
    return {int(e["version"]): e for e in records.learner_events("published")}


def weight_arrivals(
    log: SamplerLog, published: dict[int, dict[str, Any]], pull_s: float = 0.0
) -> list[tuple[int, float, float]]:
    """(bytes, seconds from the version's commit, seconds from its publication) of every verified update the sampler
    was waiting for: the version was committed at least `pull_s` (the way to the learner) after the sampler's
    previous update arrived, so its next pull was there (committed sooner, the update's time from the commit also
    holds the rest of that pull's way, which read as a slower weights direction and a faster rollout one)."""
    out = []
    for boot in _boots(log):
        previous: float | None = None
        for e in boot:
            if e.get("event") != "weights" or not e.get("ok"):
                continue
            arrived = float(e["t"]) - float(e.get("apply_s", 0.0))
            pub = published.get(int(e["version"]))
            if pub is not None and previous is not None and e.get("bytes", 0) > 0:
                committed = float(pub["t"]) - float(pub.get("seconds", 0.0))
                if committed >= previous + pull_s:
                    out.append((int(e["bytes"]), arrived - committed, arrived - float(pub["t"])))
            previous = arrived
    return out


def sizes_vary(sizes: list[float]) -> bool:
    """The sizes spread enough for a per-byte cost to be told from jitter (`MIN_SIZE_SPREAD`)."""
    largest = max(sizes, default=0.0)
    return largest > 0.0 and (largest - min(sizes)) / largest >= MIN_SIZE_SPREAD


def link_direction(x: list[float], y: list[float]) -> LinkDirection:
    fit = nonnegative_cost_fit(x, y)
    rate = rate_of(fit) if sizes_vary(x) else None
    per_byte = fit.slope.value if rate is not None else 0.0
    return LinkDirection(fit, rate, [max(0.0, yi - per_byte * xi) for xi, yi in zip(x, y, strict=True)])


def bandwidth_rate(
    direction: LinkDirection, sizes: list[float], rtt: float, what: str, notes: list[str]
) -> LinkDirection:
    """`direction` with its rate kept only where its largest transfer was bandwidth-bound: at that rate it takes
    longer than a round trip to serialise. Shorter transfers are window-bound (their time per byte is TCP's rounds,
    which the simulator's `tcp` model plays itself; four patches of 58-129 kB on a 100 Mbit/s lab link once fitted
    16 Mbit/s, which throttled the calibrated run to 0.86x of the live one)."""
    rate = direction.rate_mbps
    if rate is None or not sizes:
        return direction
    if max(sizes) * 8.0 / (rate.value * BITS_PER_MEGABIT) > rtt:
        return direction
    notes.append(
        f"{what}: transfers up to {max(sizes) / 1e3:.4g} kB were window-bound (a round trip is {rtt:.3g} s): "
        f"no rate (their fitted {rate.value:.3g} Mbit/s is TCP's rounds, which the simulator plays)"
    )
    return LinkDirection(direction.fit, None, direction.delays)


def link_calibration(cal: SamplerCalibration, log: SamplerLog, published: dict[int, dict[str, Any]]) -> list[str]:
    """Fill the link figures of one sampler; returns notes on what could not be measured.

    Each direction's one-way delay is half an upload's round trip less the learner's handling of it (an upload
    is a few segments on a warm connection: one round; how a round trip splits between the directions cannot be
    told from two hosts' clocks). The calibrated link is `tcp`, so handshakes, slow start and slow start after
    idle are played by the simulator, not folded into the delays. A direction's rate is the slope of its transfer
    times on bytes (weights: updates it waited for, from the version's commit; rollouts: the round trips), kept
    where it is measurable and its transfers were bandwidth-bound (`bandwidth_rate`)."""
    notes = []
    uploads = [e for e in log.of("replied") if "rtt" in e]
    if not uploads:
        notes.append(f"{cal.name}: no upload round trips (`replied` events): its link is not measured")
        return notes
    rtts = [max(float(e["rtt"]) - float(e.get("handled", 0.0)), 0.0) for e in uploads]
    rtt = _median(rtts)
    one_way = [r / 2.0 for r in rtts]
    cal.rtt = mean_estimate([float(e["rtt"]) for e in uploads])
    sizes = [float(e["bytes"]) for e in uploads]
    rollout = link_direction(sizes, rtts)
    cal.rollout = bandwidth_rate(
        LinkDirection(rollout.fit, rollout.rate_mbps, one_way), sizes, rtt, f"{cal.name}: uploads", notes
    )
    arrivals = weight_arrivals(log, published, rtt / 2.0)
    if arrivals:
        w_sizes = [float(b) for b, _, _ in arrivals]
        weights = link_direction(w_sizes, [d for _, d, _ in arrivals])
        cal.weights = bandwidth_rate(
            LinkDirection(weights.fit, weights.rate_mbps, one_way), w_sizes, rtt, f"{cal.name}: weights", notes
        )
    else:
        notes.append(f"{cal.name}: no weight update arrived while it waited: its weights rate is not measured")
        cal.weights = LinkDirection(rollout.fit, None, one_way)
    return notes


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2.0


def start_delays(records: RunRecords) -> dict[str, tuple[float, float | None, int | None]]:
    """name -> (seconds after the learner's clock began when it started, seconds to its first verified update, that
    update's bytes)."""
    listening = [e for e in records.learner_events("listening") if "elapsed" in e]
    if not listening:
        return {}
    zero = float(listening[0]["t"]) - float(listening[0]["elapsed"])
    out = {}
    for name, log in records.samplers.items():
        started = [e for e in log.of("started") if not e.get("finished")]
        if not started:
            continue
        first = float(started[0]["t"])
        weights = [e for e in log.of("weights") if e.get("ok") and float(e["t"]) >= first]
        first_update = (float(weights[0]["t"]) - first, int(weights[0].get("bytes", 0))) if weights else (None, None)
        out[name] = (max(0.0, first - zero), *first_update)
    return out


def calibrate_run(records: RunRecords) -> Calibration:
    """Every figure calibration measures in `records` (see the module docstring)."""
    notes: list[str] = []
    learner = learner_cost(records)
    if learner is None:
        notes.append("no `trained` event with seconds and tokens: the learner's cost is not measured")
    elif not learner.identifiable:
        notes.append("the steps' token counts did not vary: the learner's cost is all per step")
    published = _published(records)
    starts = start_delays(records)
    if not starts:
        notes.append("no `listening` event with `elapsed`: start-up delays are not measured")
    samplers = []
    for name, log in records.samplers.items():
        cal = SamplerCalibration(name, speed=sampler_speed(log))
        if cal.speed is None:
            notes.append(f"{name}: no `generated` event with tokens and busy seconds: its speed is not measured")
        if name in starts:
            cal.start_delay_s, cal.first_update_s, cal.first_update_bytes = starts[name]
        notes += link_calibration(cal, log, published)
        samplers.append(cal)
    measured = [c.speed.value for c in samplers if c.speed is not None]
    for cal in samplers:
        if cal.speed is None and measured:
            cal.assumed_speed = sum(measured) / len(measured)
            notes.append(f"{cal.name}: the measured samplers' mean speed stands in ({cal.assumed_speed:.4g} tokens/s)")
    summary = records.summary or {}
    live = {k: summary[k] for k in ("tokens_per_clock_second", "staleness_mean", "learner_idle") if k in summary}
    commit, evaluation = commit_cost(records)
    return Calibration(learner, samplers, notes, live, intake_cost(records), commit, evaluation)
