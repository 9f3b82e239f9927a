"""`heterorl calibrate` on event lines whose speeds, costs and delays are known exactly: every figure comes back,
the config it writes carries them and loads, and a run it cannot read is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from heterorl.calibrate import CalibrationError, calibrate
from heterorl.cli import app
from heterorl.config import RunConfig, config_to_yaml, load_config

STEP_S, PER_TOKEN_S = 0.5, 0.001  # the learner: busy = STEP_S + PER_TOKEN_S * tokens
SPEED = 100.0  # sampler a: tokens per second
WEIGHTS_DELAY, WEIGHTS_MBPS = 0.2, 2.0  # from the version's commit (the encode takes ENCODE_S of it)
ROLLOUT_DELAY, ROLLOUT_MBPS = 0.3, 1.0
ENCODE_S, APPLY_S = 0.1, 0.01
HANDLED_S_PER_GROUP = 0.05  # the learner's seconds on an upload, per group: in the round trip, not the link
COMMIT_S, EVAL_S = 0.02, 0.3  # after a step's training: its commit, and what an evaluation adds to it
CLOCK_ZERO, START_DELAY = 998.0, 5.0
UPLOADS = [(0, 0), (1, 2000), (4, 8000), (8, 16_000)]  # (groups, bytes)
# an upload's round trip less the learner's handling: rollout delay + bytes at the rollout rate + the reply's way
# back (the weights delay without the encode); calibration halves it for each direction
HALF_RTTS = [(ROLLOUT_DELAY + b * 8 / (ROLLOUT_MBPS * 1e6) + WEIGHTS_DELAY - ENCODE_S) / 2 for _, b in UPLOADS]


def _lines(path: Path, events: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events) + "a warning that is not an event line\n")


def known_run(root: Path) -> Path:
    """A live run directory whose event lines follow the constants above exactly."""
    run = root / "run"
    (run / "live").mkdir(parents=True)
    cfg = load_config(
        None, ["cluster.mode=async", "cluster.samplers=[{name: a, link: {bandwidth_mbps: 50}}, {name: b}]"]
    )
    (run / "config.yaml").write_text(config_to_yaml(cfg))
    learner: list[dict[str, Any]] = [{"event": "listening", "t": CLOCK_ZERO + 2.0, "elapsed": 2.0, "version": 0}]
    published = {v: 1010.0 + 10 * v for v in range(7)}
    for v, t in published.items():
        learner.append({"event": "published", "t": t, "version": v, "seconds": ENCODE_S})
    for v, tokens in enumerate([1000, 100, 200, 300, 400, 500], start=1):  # the first step is warm-up (left out)
        seconds = 9.0 if v == 1 else STEP_S + PER_TOKEN_S * tokens
        evaluated = v % 2 == 0
        commit = 5.0 if v == 1 else COMMIT_S + EVAL_S * evaluated  # the warm-up step's is left out too
        step = {"event": "trained", "t": published[v], "version": v, "seconds": seconds, "tokens": tokens}
        learner.append(step | {"commit_seconds": commit, "evaluated": evaluated})
    _lines(run / "live" / "learner.log", learner)

    ctx = {"sampler": "a", "boot": "b1"}
    a: list[dict[str, Any]] = [{"event": "started", "t": CLOCK_ZERO + START_DELAY, "finished": False, **ctx}]
    a.append({"event": "weights", "t": 1004.0, "ok": True, "version": 0, "bytes": 90_000, "apply_s": APPLY_S, **ctx})
    for v, nbytes in zip(range(1, 5), [100_000, 200_000, 400_000, 800_000], strict=True):  # bandwidth-bound
        arrival = published[v] - ENCODE_S + WEIGHTS_DELAY + nbytes * 8 / (WEIGHTS_MBPS * 1e6)
        a.append(
            {"event": "weights", "t": arrival + APPLY_S, "ok": True, "version": v, "bytes": nbytes, "apply_s": APPLY_S}
            | ctx
        )
    for tokens, busy in [(10, 1.0), (100, 1.0), (200, 2.0), (300, 3.0)]:  # the first chunk is warm-up (left out)
        a.append({"event": "generated", "t": 1020.0, "n": 2, "seconds": busy, "tokens": tokens, "busy": busy, **ctx})
    back = WEIGHTS_DELAY - ENCODE_S  # a reply's way back: the weights direction's delay without the encode
    for groups, nbytes in UPLOADS:
        handled = HANDLED_S_PER_GROUP * groups  # grows with the bytes too: a slower link if it were not taken out
        rtt = ROLLOUT_DELAY + nbytes * 8 / (ROLLOUT_MBPS * 1e6) + back + handled
        up = {"event": "replied", "t": 1030.0, "seq": 1, "groups": groups, "bytes": nbytes, "rtt": rtt}
        a.append({**up, "handled": handled, **ctx})
    _lines(run / "live" / "sampler-0.log", a)
    b = [{"event": "started", "t": CLOCK_ZERO + 1.0, "finished": False, "sampler": "b", "boot": "b2"}]
    _lines(run / "live" / "sampler-1.log", b)
    (run / "summary.json").write_text(json.dumps({"tokens_per_clock_second": 50.0, "learner_idle": 0.5}))
    return run


def test_known_speeds_costs_and_delays_come_back_exactly(tmp_path: Path) -> None:
    run = known_run(tmp_path)
    cal, path = calibrate(run)
    assert path == run / "calibrated.yaml"
    assert cal.learner is not None
    assert cal.learner.intercept.value == pytest.approx(STEP_S)
    assert cal.learner.slope.value == pytest.approx(PER_TOKEN_S)
    assert cal.learner.intercept.n == 5  # the warm-up step left out
    a, b = cal.samplers
    assert a.speed is not None
    assert a.speed.value == pytest.approx(SPEED)
    assert a.speed.n == 3
    assert a.start_delay_s == pytest.approx(START_DELAY)
    assert a.first_update_s == pytest.approx(1004.0 - CLOCK_ZERO - START_DELAY)
    assert a.weights is not None
    assert a.weights.rate_mbps is not None
    assert a.weights.rate_mbps.value == pytest.approx(WEIGHTS_MBPS)  # 0.4-3.2 s at 2 Mbit/s: bandwidth-bound
    assert a.weights.delays == pytest.approx(HALF_RTTS)  # both directions: half the round trips
    assert a.rollout is not None
    assert a.rollout.rate_mbps is None  # uploads of 16 kB at most take 0.13 s at 1 Mbit/s: window-bound
    assert any("a: uploads: transfers up to 16 kB were window-bound" in note for note in cal.notes)
    assert a.rollout.delays == pytest.approx(HALF_RTTS)
    assert b.speed is None
    assert b.start_delay_s == pytest.approx(1.0)
    assert any("b: no upload round trips" in note for note in cal.notes)
    assert cal.live == {"tokens_per_clock_second": 50.0, "learner_idle": 0.5}
    assert cal.intake is not None
    assert cal.intake.value == pytest.approx(HANDLED_S_PER_GROUP)
    assert cal.commit is not None
    assert cal.commit.value == pytest.approx(COMMIT_S)
    assert cal.commit.n == 2  # steps 3 and 5 (step 1 is warm-up)
    assert cal.evaluation is not None
    assert cal.evaluation.value == pytest.approx(EVAL_S)
    assert cal.evaluation.n == 3  # steps 2, 4, 6

    written = RunConfig.model_validate(yaml.safe_load(path.read_text()))
    assert written.cluster.learner_step_seconds == pytest.approx(STEP_S)
    assert written.cluster.learner_seconds_per_token == pytest.approx(PER_TOKEN_S)
    assert written.cluster.learner_seconds_per_group == pytest.approx(HANDLED_S_PER_GROUP)
    assert written.cluster.learner_commit_seconds == pytest.approx(COMMIT_S)
    assert written.cluster.learner_eval_seconds == pytest.approx(EVAL_S)
    node_a, node_b = written.cluster.samplers
    assert node_a.tokens_per_second == pytest.approx(SPEED)
    assert node_a.start_delay_s == pytest.approx(START_DELAY)
    assert node_a.link.weights_bandwidth_mbps == pytest.approx(WEIGHTS_MBPS)
    assert node_a.link.rollout_bandwidth_mbps is None
    assert node_a.link.bandwidth_mbps is None  # the configured 50 Mbit/s is replaced by the measured rates
    assert node_a.link.weights_delay.kind == "empirical"
    assert node_a.link.weights_delay.samples == pytest.approx(HALF_RTTS)
    assert node_a.link.transfer.model == "tcp"
    assert node_b.link == RunConfig().cluster.samplers[0].link  # nothing measured on b's link: as it ran
    assert node_b.tokens_per_second == pytest.approx(SPEED)  # not measured: the measured samplers' mean
    assert any("b: the measured samplers' mean speed stands in (100 tokens/s)" in note for note in cal.notes)


def test_a_sampler_that_waited_for_no_update_gets_half_its_round_trips_and_tcp(tmp_path: Path) -> None:
    """Sampler c (a long link): it generated nothing, took its first update (a 500 kB snapshot) 12 s after it
    started and made one round trip of 2 s. Each direction gets half of it (1 s), the link is `tcp` (its first
    snapshot's slow start is the simulator's to play, not a rate: 12 s for 500 kB would read as 0.4 Mbit/s and
    slow every later update), no weights rate, and its speed is the mean of the measured ones (a's)."""
    run = known_run(tmp_path)
    cfg = load_config(None, ["cluster.mode=async", "cluster.samplers=[{name: a}, {name: b}, {name: c}]"])
    (run / "config.yaml").write_text(config_to_yaml(cfg))
    ctx = {"sampler": "c", "boot": "b3"}
    started = CLOCK_ZERO + 4.0
    c = [
        {"event": "started", "t": started, "finished": False, **ctx},
        {"event": "weights", "t": started + 12.0, "ok": True, "version": 0, "bytes": 500_000, "apply_s": 0.0, **ctx},
        {"event": "replied", "t": started + 14.0, "seq": 0, "groups": 0, "bytes": 0, "rtt": 2.0, "handled": 0.0, **ctx},
    ]
    _lines(run / "live" / "sampler-2.log", c)
    cal, path = calibrate(run)
    node_c = RunConfig.model_validate(yaml.safe_load(path.read_text())).cluster.samplers[2]
    assert cal.samplers[2].speed is None
    assert node_c.tokens_per_second == pytest.approx(SPEED)
    assert node_c.link.weights_bandwidth_mbps is None
    assert node_c.link.weights_delay.seconds == pytest.approx(1.0)
    assert node_c.link.rollout_delay.seconds == pytest.approx(1.0)
    assert node_c.link.transfer.model == "tcp"
    assert any("c: no weight update arrived while it waited" in note for note in cal.notes)


def test_the_command_prints_each_figure_with_its_count_and_interval(tmp_path: Path) -> None:
    run = known_run(tmp_path)
    out = tmp_path / "sim.yaml"
    result = CliRunner().invoke(app, ["calibrate", str(run), "--out", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "learner: 0.5 s [0.5, 0.5] (n=5) per step + 0.001 s [0.001, 0.001] (n=5) per token" in result.stdout
    assert "speed        100 tokens/s [100, 100] (n=3)" in result.stdout
    assert "rate 2 Mbit/s [2, 2] (n=4)" in result.stdout
    assert "b: no `generated` event" in result.output
    assert f"config: {out}" in result.stdout
    assert out.is_file()


def test_a_run_without_event_logs_is_refused_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "sim"
    run.mkdir()
    (run / "config.yaml").write_text(config_to_yaml(RunConfig()))
    with pytest.raises(CalibrationError, match="calibrate reads a live run's event logs"):
        calibrate(run)
    result = CliRunner().invoke(app, ["calibrate", str(run)])
    assert result.exit_code == 2
    assert "learner.log is missing" in result.output
    assert "Traceback" not in result.output


def test_an_update_committed_before_the_samplers_next_pull_could_reach_the_learner_is_left_out() -> None:
    """A 0.05 s link each way: v1 committed 1 s after v0 arrived finds the next pull waiting (0.05 s + its bytes
    after the commit); v2 committed 0.01 s after v1 arrived waits for that pull to get there (0.05 s more), which
    must not read as a slower weights direction (nor, the round trip less it, as a faster rollout one)."""
    from heterorl.calibrate.measure import weight_arrivals
    from heterorl.calibrate.records import SamplerLog

    published = {v: {"t": t, "seconds": 0.0} for v, t in [(1, 11.0), (2, 11.06)]}

    def weights(version: int, t: float) -> dict[str, Any]:
        return {"event": "weights", "ok": True, "version": version, "bytes": 1000, "t": t, "apply_s": 0.0}

    log = SamplerLog("a", [weights(0, 10.0), weights(1, 11.05), weights(2, 11.16)])
    v1, v2 = (1000, pytest.approx(0.05), pytest.approx(0.05)), (1000, pytest.approx(0.1), pytest.approx(0.1))
    assert weight_arrivals(log, published) == [v1, v2]  # committed after v1 arrived: taken before
    assert weight_arrivals(log, published, pull_s=0.05) == [v1]
