"""Per-sampler records and quarantine, counted in groups and steps (no clock): charged refusals within a window,
a pooled calibration test, release after some steps, and a state that survives a restart."""

from __future__ import annotations

import math

from heterorl.config import ReputationConfig
from heterorl.loop.reputation import CHARGED, Reputation


def test_charged_refusals_in_the_window_quarantine_and_neutral_ones_do_not() -> None:
    rep = Reputation(ReputationConfig(window=5, max_charges=2), ["a", "b"])
    for outcome in ("busy", "duplicate", "corrupt", "timeout", "disk_full", "filtered", "finished"):
        rep.record("a", outcome)  # a link, a full queue, the learner's disk: no evidence against the sampler
    assert not rep.quarantined("a")
    rep.record("a", "reward_mismatch")
    for _ in range(5):
        rep.record("a", "accepted")  # the charge leaves the 5-group window
    rep.record("a", "logprob_mismatch")
    assert not rep.quarantined("a")
    rep.record("a", "accepted")
    rep.record("a", "replayed")  # 2 charges among the last 3 judged groups
    assert rep.quarantined("a")
    assert not rep.quarantined("b")
    rec = rep.records["a"]
    assert (rec.accepted, rec.refused["corrupt"], rec.refused["replayed"]) == (6, 1, 1)
    assert rec.quarantined_at == 0


def test_poisoned_groups_are_charged_and_counted() -> None:
    rep = Reputation(ReputationConfig(window=10, max_charges=3), ["a"])
    for _ in range(3):
        rep.record("a", "accepted")
        rep.poisoned("a")  # accepted at the intake, dropped from its step
    assert rep.quarantined("a")
    assert rep.records["a"].poisoned == 3
    assert "poisoned" in CHARGED


def test_the_pooled_calibration_test_catches_a_small_persistent_shift() -> None:
    """Groups of 24 tokens whose u average 0.56 instead of 0.5: each group's z is 1.0 (passes), the pooled z after
    n groups is sqrt(n) * 1.018 and crosses 6 at 35 groups (hand-computed: (0.06 * 24) / sqrt(24 / 12) = 1.018)."""
    rep = Reputation(ReputationConfig(z_tolerance=6.0), ["a", "honest"])
    per_group_z = (0.56 * 24 - 12) / math.sqrt(24 / 12)
    assert math.isclose(per_group_z, 1.0182337649086284)
    caught_at = None
    for n in range(1, 60):
        rep.verified("a", True, 0.56 * 24, 24)
        rep.verified("honest", True, 0.5 * 24 + (0.5 if n % 2 else -0.5), 24)
        if caught_at is None and rep.quarantined("a"):
            caught_at = n
    assert caught_at == 35  # sqrt(35) * 1.018 = 6.02
    assert not rep.quarantined("honest")
    assert abs(rep.records["honest"].pooled_z) < 0.5


def test_release_after_steps_and_lift() -> None:
    rep = Reputation(ReputationConfig(window=4, max_charges=1, release_after_steps=3), ["a"])
    rep.on_step(10)
    rep.record("a", "reward_mismatch")
    assert rep.quarantined("a")
    assert rep.on_step(12) == []
    assert rep.on_step(13) == ["a"]
    assert not rep.quarantined("a")
    rep.record("a", "accepted")
    assert not rep.quarantined("a")  # the charge that caused it was forgotten


def test_records_survive_a_restart() -> None:
    cfg = ReputationConfig(window=4, max_charges=2)
    rep = Reputation(cfg, ["a", "b"])
    rep.record("a", "accepted")
    rep.record("a", "unknown_prompt")
    rep.verified("b", True, 10.0, 20)
    again = Reputation(cfg, ["a", "b"])
    again.restore(rep.to_json())
    assert again.to_json() == rep.to_json()
    again.record("a", "reward_mismatch")
    assert again.quarantined("a")  # the window's charge came through the restart
