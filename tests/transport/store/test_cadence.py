"""Cadence: the waits between two looks at a store, by hand."""

from __future__ import annotations

import pytest

from heterorl.config import StoreConfig
from heterorl.transport.store.cadence import Cadence


def test_waits_double_from_the_first_to_the_most_when_nothing_is_due():
    cadence = Cadence(0.05, 2.0)
    assert [cadence.nothing() for _ in range(8)] == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert cadence.found() == 0.0
    assert cadence.nothing() == pytest.approx(0.05)


def test_a_busy_spell_looks_every_first_wait_then_doubles():
    cadence = Cadence(0.05, 2.0, busy_s=0.2)  # 0.2 s of summed waits at 0.05 s: four looks, then the doubling
    waits = [cadence.nothing() for _ in range(10)]
    assert waits == pytest.approx([0.05, 0.05, 0.05, 0.05, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6])
    assert cadence.found() == 0.0  # something found: a new busy spell
    assert [cadence.nothing() for _ in range(5)] == pytest.approx([0.05, 0.05, 0.05, 0.05, 0.05])
    assert cadence.nothing() == pytest.approx(0.1)


def test_the_first_wait_never_exceeds_the_most():
    cadence = Cadence(5.0, 1.0, busy_s=3.0)
    assert [cadence.nothing() for _ in range(4)] == pytest.approx([1.0, 1.0, 1.0, 1.0])


def test_only_a_side_that_awaits_an_answer_gets_the_busy_spell():
    cfg = StoreConfig(first_poll_seconds=0.05, poll_seconds=2.0, busy_poll_seconds=0.1)
    due, manifest = Cadence.of(cfg, answer_due=True), Cadence.of(cfg, answer_due=False)
    assert [due.nothing() for _ in range(4)] == pytest.approx([0.05, 0.05, 0.05, 0.1])
    assert [manifest.nothing() for _ in range(4)] == pytest.approx([0.05, 0.1, 0.2, 0.4])


def test_the_spacing_runs_from_one_looks_start_to_the_next():
    cadence = Cadence(0.05, 2.0, busy_s=0.3)
    # looks over a 100 ms round trip: each has waited longer than the spacing, so the next goes at once, and the
    # busy spell is spent in real time (0.1 s a look): after three looks the spacing doubles
    assert [cadence.nothing(took_s=0.1) for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.0])
    assert cadence.quiet == pytest.approx(0.4)
    assert cadence.nothing(took_s=0.02) == pytest.approx(0.08)  # spacing 0.1 (doubled), 0.02 of it taken
    assert cadence.nothing(took_s=0.02) == pytest.approx(0.18)
    assert cadence.found() == 0.0
    assert cadence.nothing(took_s=0.01) == pytest.approx(0.04)  # a new busy spell at first_s, less the look
