"""Link traces: both formats, step values, fallbacks to the config, cuts, errors, and replay through a Link."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from heterorl.config import LinkConfig
from heterorl.network import Link, TraceError, parse_trace, read_trace

JSONL = """{"t": 0, "weights_delay_s": 0.05, "rollout_delay_s": 0.04, "weights_mbps": 100}
{"t": 1.5, "weights_delay_s": 0.07}

{"t": 3, "up": false, "rollout_loss": 0.01}
{"t": 4, "up": true, "weights_mbps": 20}
"""
CSV = """t,weights_delay_s,rollout_delay_s,weights_mbps,rollout_loss,up
0,0.05,0.04,100,,
1.5,0.07,,,,
3,,,,0.01,false
4,,,20,,true
"""


@pytest.mark.parametrize(("text", "fmt"), [(JSONL, "jsonl"), (CSV, "csv")])
def test_both_formats_give_the_same_step_functions(text: str, fmt: str) -> None:
    trace = parse_trace(text, fmt)  # type: ignore[arg-type]
    assert [trace.delay("weights", t) for t in (0.0, 1.49, 1.5, 10.0)] == [0.05, 0.05, 0.07, 0.07]
    assert trace.delay("rollout", 2.0) == 0.04
    assert [trace.rate_mbps("weights", t) for t in (0.0, 3.9, 4.0)] == [100.0, 100.0, 20.0]
    assert trace.rate_mbps("rollout", 1.0) is None  # never given: the config's
    assert (trace.loss("rollout", 2.9), trace.loss("rollout", 3.0)) == (None, 0.01)
    assert trace.outages.windows == [(3.0, 4.0)]
    assert trace.end == 4.0


def test_a_column_starts_from_the_config_before_its_first_row() -> None:
    trace = parse_trace('{"t": 0}\n{"t": 2, "rollout_delay_s": 0.3}\n', "jsonl")
    assert (trace.delay("rollout", 1.9), trace.delay("rollout", 2.0)) == (None, 0.3)


def test_a_cut_never_lifted_lasts_forever() -> None:
    assert parse_trace('{"t": 5, "up": 0}\n', "jsonl").outages.windows == [(5.0, float("inf"))]


def test_time_weighted_quantiles() -> None:
    # 0.1 for 1 s, 0.3 for 3 s (until t = 4): a probe at a random time sees 0.3 three times in four
    trace = parse_trace('{"t": 0, "weights_delay_s": 0.1}\n{"t": 1, "weights_delay_s": 0.3}\n', "jsonl")
    series = trace.series["weights_delay_s"]
    assert series.time_weighted_quantiles([0.1, 0.25, 0.3, 0.9], until=4.0) == pytest.approx([0.1, 0.1, 0.3, 0.3])


@pytest.mark.parametrize(
    ("text", "fmt", "message"),
    [
        ('{"t": 1}\n{"t": 0.5}\n', "jsonl", ":2: t = 0.5 goes back in time"),
        ('{"weights_delay_s": 1}\n', "jsonl", ":1: every row needs a time"),
        ('{"t": 0, "delay": 1}\n', "jsonl", "unknown column 'delay'"),
        ('{"t": 0, "weights_mbps": 0}\n', "jsonl", "weights_mbps = 0.0 is outside (0.0"),
        ('{"t": 0, "rollout_loss": 0.7}\n', "jsonl", "rollout_loss = 0.7 is outside"),
        ('{"t": 0, "up": 2}\n', "jsonl", "up must be true/false"),
        ('{"t": 0, "weights_delay_s": "slow"}\n', "jsonl", "must be a number"),
        ('{"t": 0, "weights_delay_s": true}\n', "jsonl", "must be a number"),
        ("[1, 2]\n", "jsonl", "must be a JSON object"),
        ("{oops\n", "jsonl", ":1: not JSON"),
        ("", "jsonl", "no rows"),
        ("t,weights_delay_s\n0,0.1,9\n", "csv", "more cells than the header"),
        ('{"t": -1}\n', "jsonl", "t must be >= 0"),
    ],
)
def test_bad_traces_name_the_line_and_column(text: str, fmt: str, message: str) -> None:
    with pytest.raises(TraceError, match=re.escape(message)):
        parse_trace(text, fmt, "net.jsonl")  # type: ignore[arg-type]


def test_read_trace_checks_the_file(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"must be a \.jsonl or \.csv"):
        read_trace(tmp_path / "trace.txt")
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "missing.csv")
    (tmp_path / "t.csv").write_text(CSV)
    assert read_trace(tmp_path / "t.csv").delay("weights", 2.0) == 0.07


def test_a_link_replays_its_trace_over_the_config(tmp_path: Path) -> None:
    path = tmp_path / "link.jsonl"
    path.write_text(JSONL)
    cfg = LinkConfig(
        weights_delay={"kind": "fixed", "seconds": 9.0},
        rollout_delay={"kind": "fixed", "seconds": 8.0},
        bandwidth_mbps=5.0,
        outages=[{"start": 10, "end": 11}],
        trace=str(path),
    )
    link = Link(cfg, seed=0)
    weights, rollout = link.conditions["weights"], link.conditions["rollout"]
    assert [weights.delay(t) for t in (0.0, 2.0)] == [0.05, 0.07]
    assert rollout.ack_delay(0.5) == 0.05  # the rollout path's acknowledgements travel the weights direction
    assert (weights.rate_bps(0.0), weights.rate_bps(5.0), rollout.rate_bps(0.0)) == (100e6, 20e6, 5e6)
    assert link.outages.windows == [(3.0, 4.0), (10.0, 11.0)]
    # the simple model at t = 2: 0.07 s one way plus 1 MB at 100 Mbit/s
    assert link.transfer("weights", 2.0, 1_000_000).arrival == pytest.approx(2.0 + 0.08 + 0.07)


def test_replayed_delays_have_the_traces_quantiles() -> None:
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.exponential(0.2, size=500))
    delays = rng.lognormal(-3.0, 0.4, size=500)
    text = "".join(f'{{"t": {t}, "weights_delay_s": {d}}}\n' for t, d in zip(times, delays, strict=True))
    trace = parse_trace(text, "jsonl")
    cond = Link(LinkConfig(), seed=0, trace=trace).conditions["weights"]
    probe_times = np.sort(rng.uniform(times[0], times[-1], size=20_000))
    seen = np.array([cond.delay(t) for t in probe_times])
    probs = [0.1, 0.5, 0.9]
    expected = trace.series["weights_delay_s"].time_weighted_quantiles(probs, until=times[-1])
    assert np.quantile(seen, probs) == pytest.approx(expected, rel=0.05)
