"""Calibration of a real live run (tiny model, two sampler processes, loopback HTTP) whose links are emulated with
known delays (`live.emulate_links`): `heterorl calibrate` recovers the round trips, measures speeds that agree with the
samplers' own counters, and its config makes a simulated run that `heterorl report` puts beside the live one."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from conftest import tiny_config
from heterorl.calibrate import calibrate
from heterorl.config import load_config
from heterorl.eventlog import read_events
from heterorl.live.launcher import run_live
from heterorl.report import make_report
from heterorl.simulated.run import execute

pytestmark = pytest.mark.processes  # `make test-processes`

DELAYS = {"a": (0.2, 0.3), "b": (0.05, 0.1)}  # sampler -> (weights, rollout) one-way delay, seconds
TOLERANCE_S = 0.1  # what the learner's handling, loopback HTTP and a loaded 2-core machine may add


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    nodes = ", ".join(
        f"{{name: {n}, link: {{weights_delay: {{kind: fixed, seconds: {w}}}, "
        f"rollout_delay: {{kind: fixed, seconds: {r}}}}}}}"
        for n, (w, r) in DELAYS.items()
    )
    cfg = tiny_config(
        tiny_model_dir,
        "cluster.mode=async",
        f"cluster.samplers=[{nodes}]",
        "learner.steps=24",  # sampler a (slower links) needs time to generate at all: at 12 it once made none
        "live.emulate_links=true",
        "weights.codec=pulse",
        "live.poll_seconds=1",
        "live.fsync=false",
    )
    run = tmp_path_factory.mktemp("calibrate") / "live"
    run_live(cfg, run, show_progress=False)
    return run


def test_calibration_recovers_the_emulated_delays_and_the_samplers_speeds(live_run: Path, tmp_path: Path) -> None:
    cal, path = calibrate(live_run, tmp_path / "sim.yaml")
    for sc in cal.samplers:
        weights_s, rollout_s = DELAYS[sc.name]
        assert sc.rollout is not None, sc.name
        assert sc.weights is not None, sc.name
        # each direction gets half of an upload's round trip less the learner's handling (how it splits cannot be
        # told from two hosts' clocks): the two add up to the emulated round trip, plus what loopback HTTP and a
        # loaded 2-core machine add
        assert sc.weights.delays == sc.rollout.delays, sc.name
        round_trip = 2.0 * statistics.median(sc.rollout.delays)
        assert weights_s + rollout_s - 0.05 <= round_trip <= weights_s + rollout_s + TOLERANCE_S, sc.name
        assert sc.start_delay_s is not None
        assert 0.0 <= sc.start_delay_s < 60.0
        # the speed from the `generated` events agrees with the sampler's own tokens and idle share: its busy time
        # holds the generation seconds and more (applying weights, encoding, scheduling on a loaded machine), so
        # tokens / busy is a lower bound, and not a far one. Compared with the speed's 95% interval: a sampler that
        # sends a few groups has 3-4 chunks of a few milliseconds each, and one run in ten measured 0.87x
        (finished,) = read_events(live_run / "live" / f"sampler-{cal.samplers.index(sc)}.log", "finished")
        (started,) = read_events(live_run / "live" / f"sampler-{cal.samplers.index(sc)}.log", "started")
        busy = (1.0 - finished["idle"]) * (finished["t"] - started["t"])
        assert sc.speed is not None
        assert sc.speed.high >= 0.9 * finished["tokens"] / busy, sc.name
        assert sc.speed.low <= 3.0 * finished["tokens"] / busy, sc.name
    # the learner's cost line reproduces the seconds its steps took (tiny steps: the intercept may fit to 0)
    assert cal.learner is not None
    steps = read_events(live_run / "live" / "learner.log", "trained")
    predicted = sum(cal.learner.intercept.value + cal.learner.slope.value * e["tokens"] for e in steps)
    assert predicted == pytest.approx(sum(e["seconds"] for e in steps), rel=0.25)
    calibrated = load_config(path, [])
    a = calibrated.cluster.samplers[0]
    assert a.link.rollout_delay.kind == "empirical"
    assert a.tokens_per_second == pytest.approx(cal.samplers[0].speed.value, rel=1e-3)  # type: ignore[union-attr]

    sim = tmp_path / "sim"
    execute(calibrated, sim, show_progress=False)
    result = make_report([sim, live_run], tmp_path / "report")
    simulated, live = result.clocks
    assert (simulated.simulated, live.simulated) == (True, False)
    # the calibrated simulation is in the live run's range (a loose bound: 12 steps on a loaded machine)
    assert simulated.throughput == pytest.approx(live.throughput, rel=0.5)
    assert abs(simulated.staleness_mean - live.staleness_mean) < 2.0
    assert set(simulated.sampler_share) == set(live.sampler_share) == {"a", "b"}
