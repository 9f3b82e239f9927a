"""A measured network replayed: one trace file drives the WAN lab's router and the simulator's link, and both give
the trace's delays (`-m wanlab`, root)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heterorl.config import LinkConfig
from heterorl.lab import WanLab
from heterorl.lab.ping import run_plan, start_probe_server
from heterorl.network import Link, read_trace

pytestmark = pytest.mark.wanlab
ROLLOUT_DELAY = 0.005
PROBABILITIES = [0.1, 0.5, 0.9]


def write_trace(path: Path, seconds: float = 60.0, step: float = 0.25) -> None:
    """Weights delays that change every `step` seconds (log-normal, median 40 ms), a fixed rollout delay."""
    rng = np.random.default_rng(0)
    times = np.arange(0.0, seconds, step)
    delays = np.clip(rng.lognormal(np.log(0.04), 0.5, size=len(times)), 0.005, 0.3)
    rows = [{"t": 0.0, "rollout_delay_s": ROLLOUT_DELAY, "weights_mbps": 50, "rollout_mbps": 50}]
    rows += [{"t": float(t), "weights_delay_s": float(d)} for t, d in zip(times, delays, strict=True)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_lab_and_the_simulator_replay_a_trace_s_delays(tmp_path: Path) -> None:
    path = tmp_path / "link.jsonl"
    write_trace(path)
    cfg = LinkConfig(trace=str(path))
    with WanLab([cfg]) as lab:
        start_probe_server(lab)
        out = run_plan(lab, 0, [{"op": "connect"}, {"op": "ping", "count": 150, "interval": 0.037}])
        t0 = lab.t0
    ping = out["steps"][1]
    # a ping's answer enters the router one rollout delay after the ping left: it gets the weights delay of then
    sent = np.asarray(ping["starts"]) - t0 + ROLLOUT_DELAY
    lab_delays = np.asarray(ping["rtts"]) - ROLLOUT_DELAY
    simulated = Link(cfg, seed=0).conditions["weights"]
    sim_delays = np.array([simulated.delay(t) for t in sent])
    trace = read_trace(path)
    assert sim_delays == pytest.approx([trace.delay("weights", t) for t in sent])
    lab_q, sim_q = np.quantile(lab_delays, PROBABILITIES), np.quantile(sim_delays, PROBABILITIES)
    window = trace.series["weights_delay_s"].time_weighted_quantiles(PROBABILITIES, until=float(sent[-1]))
    print(f"\nweights delay quantiles {PROBABILITIES} (ms): lab {np.round(lab_q * 1e3, 1)}, ", end="")
    print(f"simulator {np.round(sim_q * 1e3, 1)}, trace over the window {np.round(window * 1e3, 1)}")
    errors = np.abs(lab_delays - sim_delays)
    print(
        f"per ping |lab - simulator|: median {np.median(errors) * 1e3:.2f} ms, p90 {np.quantile(errors, 0.9) * 1e3:.2f}"
    )
    assert lab_q == pytest.approx(sim_q, rel=0.05, abs=0.002)
    assert np.median(errors) < 0.002
    # the pings sample the trace's own distribution (150 probes of ~70 values)
    assert sim_q == pytest.approx(window, rel=0.25)
