"""Progress without a terminal: plain lines at a time-based cadence and at the end, mirrored to a log file."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from heterorl.console import ProgressLines, format_duration, progress_bar

LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] (?P<body>.*)$")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def bodies(text: str) -> list[str]:
    """The lines without their timestamps (each line must carry one)."""
    out = []
    for line in text.splitlines():
        m = LINE.match(line)
        assert m, f"not a progress line: {line!r}"
        out.append(m["body"])
    return out


def test_plain_lines_on_a_stream_that_is_not_a_terminal() -> None:
    stream, clock = io.StringIO(), FakeClock()
    with progress_bar("RL", total=10, stream=stream, clock=clock, interval_s=15.0) as bar:
        for _ in range(10):
            clock.now += 4.0  # a step every 4 s: a line every 4th step (16 s >= 15 s)
            bar.advance(1, reward=0.25, stale=1.0)
        bar.advance(0, acc=0.5)
    assert bodies(stream.getvalue()) == [
        "RL 0/10 (0%) elapsed 0:00:00",
        "RL 4/10 (40%) elapsed 0:00:16 left ~0:00:24  reward=0.25  stale=1",
        "RL 8/10 (80%) elapsed 0:00:32 left ~0:00:08  reward=0.25  stale=1",
        "RL 10/10 (100%) elapsed 0:00:40 done  reward=0.25  stale=1  acc=0.5",
    ]


def test_the_end_line_comes_even_when_the_work_stops_early() -> None:
    stream, clock = io.StringIO(), FakeClock()

    def stop_after_two() -> None:
        with progress_bar("RL", total=5, stream=stream, clock=clock) as bar:
            clock.now += 2.0
            bar.advance(2)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        stop_after_two()
    assert bodies(stream.getvalue())[-1] == "RL 2/5 (40%) elapsed 0:00:02 stopped"


def test_log_file_mirrors_the_lines_even_when_quiet(tmp_path: Path) -> None:
    stream, clock, log = io.StringIO(), FakeClock(), tmp_path / "run" / "run.log"
    with progress_bar("RL", total=2, enabled=False, log_path=log, stream=stream, clock=clock, interval_s=1.0) as bar:
        clock.now += 1.0
        bar.advance(1, loss=0.125)
        clock.now += 1.0
        bar.advance(1, loss=0.0625)
    assert stream.getvalue() == ""  # disabled: nothing on the console
    assert bodies(log.read_text()) == [
        "RL 0/2 (0%) elapsed 0:00:00",
        "RL 1/2 (50%) elapsed 0:00:01 left ~0:00:01  loss=0.125",
        "RL 2/2 (100%) elapsed 0:00:02  loss=0.0625",
        "RL 2/2 (100%) elapsed 0:00:02 done  loss=0.0625",
    ]


def test_log_file_and_stream_get_the_same_lines(tmp_path: Path) -> None:
    stream, clock, log = io.StringIO(), FakeClock(), tmp_path / "run.log"
    with progress_bar("pretrain", total=3, log_path=log, stream=stream, clock=clock, interval_s=1.0) as bar:
        for _ in range(3):
            clock.now += 1.0
            bar.advance(1)
    assert bodies(stream.getvalue()) == bodies(log.read_text())
    assert len(bodies(log.read_text())) == 5  # start, 3 advances a second apart, end


def test_log_appends_to_an_existing_file(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("earlier\n")
    with progress_bar("RL", total=1, enabled=False, log_path=log, clock=FakeClock()) as bar:
        bar.advance(1)
    assert log.read_text().startswith("earlier\n")


def test_no_line_between_intervals() -> None:
    stream, clock = io.StringIO(), FakeClock()
    lines = ProgressLines("RL", 100, [stream], interval_s=30.0, clock=clock)
    for _ in range(29):
        clock.now += 1.0
        lines.update(1, {})
    assert stream.getvalue() == ""
    clock.now += 1.0
    lines.update(1, {})
    assert bodies(stream.getvalue()) == ["RL 1/100 (1%) elapsed 0:00:30 left ~0:49:30"]


def test_format_duration() -> None:
    assert format_duration(0) == "0:00:00"
    assert format_duration(65.4) == "0:01:05"
    assert format_duration(3 * 3600 + 7) == "3:00:07"


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_rich_bar_not_plain_lines(tmp_path: Path) -> None:
    stream, log = TTY(), tmp_path / "run.log"
    with progress_bar("RL", total=3, stream=stream, log_path=log, clock=FakeClock()) as bar:
        bar.advance(3, reward=0.5)
    text = stream.getvalue()
    assert "RL" in text
    assert "3/3" in text
    assert "reward=0.5" in text
    assert not any(LINE.match(line) for line in text.splitlines())  # the bar, redrawn, not timestamped lines
    assert bodies(log.read_text())[-1] == "RL 3/3 (100%) elapsed 0:00:00 done  reward=0.5"
