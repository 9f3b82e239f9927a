"""The sampler session's rules, with no clock, transport or engine: what it asks for, generates and sends, and what
each answer does to it."""

from __future__ import annotations

from pathlib import Path

import torch

from conftest import tiny_config
from heterorl.loop.protocol import GroupVerdict, Reply
from heterorl.loop.session import Generate, Pull, SamplerSession, Send, Wait
from heterorl.rollout import RolloutGroup


def session(*overrides: str, index: int = 0) -> SamplerSession:
    return SamplerSession(tiny_config(Path("unused"), *overrides), index, f"sampler-{index}", "boot")


def groups(n: int, version: int = 0, start: int = 0, name: str = "sampler-0") -> list[RolloutGroup]:
    return [
        RolloutGroup(
            group_id=f"{name}:{start + i}@boot",
            sampler_id=name,
            prompt="1+1=",
            answer="2",
            prompt_ids_P=torch.tensor([4, 13, 4, 15]),
            completion_ids_GL=torch.tensor([[5, 1], [5, 1]]),
            completion_mask_GL=torch.tensor([[1, 1], [1, 0]]),
            behavior_logp_GL=torch.tensor([[-0.1, -0.2], [-0.3, 0.0]]),
            version_GL=torch.full((2, 2), version),
            rewards_G=torch.tensor([1.0, 0.0]),
        )
        for i in range(n)
    ]


def sends(actions: list) -> list:
    return [a.upload for a in actions if isinstance(a, Send)]


def reply(upload, outcomes: list[str] | None = None, **fields) -> Reply:
    outcomes = outcomes if outcomes is not None else ["accepted"] * len(upload.groups)
    return Reply(seq=upload.seq, verdicts=tuple(GroupVerdict(o) for o in outcomes), learner="L", **fields)


ASYNC = ("cluster.mode=async", "cluster.max_queued_steps=4", "cluster.samplers=[{}, {}]")  # B = 4, chunk = 2


def test_admission_asks_ahead_accepts_a_partial_grant_and_generates_no_more_than_granted() -> None:
    s = session(*ASYNC)
    assert s.next_actions() == [Pull()]  # nothing to generate with yet, nothing asked
    s.pulled()
    s.weights_received(0)
    (ask,) = sends(s.next_actions())  # a request for slots, with no groups
    assert (ask.groups, ask.wanted, ask.version) == ((), 4, 0)  # ask_ahead: two chunks until round trips are known
    s.replied(ask.seq, reply(ask, granted=1, retry_after=1.0))  # a partial grant
    actions = s.next_actions()
    assert Generate(1) in actions  # a smaller chunk rather than none
    assert Wait(1.0) in actions  # and it asks again after the learner's retry_after
    assert not any(isinstance(a, Generate) for a in s.next_actions())  # nothing more than granted
    s.generated(groups(1), 1)
    (up,) = sends(s.next_actions())
    assert (len(up.groups), up.wanted) == (1, 5)  # used 1 + ahead 4


def test_uploads_in_flight_are_bounded_and_verdicts_settle_them() -> None:
    s = session("cluster.mode=async", "cluster.max_queued_steps=null", "cluster.uploads_in_flight=2",
                "cluster.groups_per_upload=1", "cluster.samplers=[{}, {}]")  # fmt: skip
    s.pulled()
    s.weights_received(0)
    assert Generate(2) in s.next_actions()
    s.generated(groups(2), 2)
    actions = s.next_actions()
    assert Generate(2) in actions  # generation goes on while the first ones travel
    s.generated(groups(2, start=2), 2)
    up = sends(actions) + sends(s.next_actions())
    assert [len(u.groups) for u in up] == [1, 1]  # two uploads in flight, two groups wait
    assert len(s.outbox) == 2
    s.replied(up[0].seq, reply(up[0]))
    (third,) = sends(s.next_actions())
    s.replied(up[1].seq, reply(up[1], ["invalid"]))
    s.replied(up[1].seq, reply(up[1]))  # a duplicate answer is ignored
    assert s.counts == {"accepted": 1, "invalid": 1}
    assert third.seq == 2


def test_a_long_round_trip_widens_the_window_for_full_uploads_only() -> None:
    """Window 2, 2 groups per upload: observed to generate 10 groups per round trip, the session keeps up to
    ceil(10 / 2) + 1 = 6 uploads in flight, the 3rd to 6th only when they leave full."""
    s = session("cluster.mode=async", "cluster.max_queued_steps=null", "cluster.uploads_in_flight=2",
                "cluster.groups_per_upload=2", "cluster.samplers=[{}, {}]", "learner.groups_per_step=8")  # fmt: skip
    s.pulled()
    s.weights_received(0)
    s.observe(rtt_s=1.0, seconds_per_group=0.1)
    assert s.window == 6
    s.next_actions()
    s.generated(groups(3), 4)  # the engine returned 3 of 4
    assert [len(u.groups) for u in sends(s.next_actions())] == [2, 1]  # the configured window: no need to be full
    s.generated(groups(3, start=3), 4)
    assert [len(u.groups) for u in sends(s.next_actions())] == [2]  # past it: the full upload goes, one waits
    assert len(s.outbox) == 1
    s.generated(groups(5, start=6), 5)
    assert [len(u.groups) for u in sends(s.next_actions())] == [2, 2, 2]  # three more full: six in flight
    assert (len(s.in_flight), len(s.outbox)) == (6, 0)
    s.observe(rtt_s=0.1, seconds_per_group=0.1)  # a short round trip: the configured window again
    assert s.window == 2


def test_sync_mode_generates_its_share_again_for_every_group_the_learner_did_not_keep() -> None:
    s = session("cluster.samplers=[{}, {}, {}]", "learner.groups_per_step=5")  # shares 2, 2, 1
    s.pulled()
    s.weights_received(0)
    assert Generate(2) in s.next_actions()
    s.generated(groups(2), 2)
    (up,) = sends(s.next_actions())
    assert not any(isinstance(a, Generate) for a in s.next_actions())  # its share is out
    s.replied(up.seq, reply(up, ["accepted", "corrupt"]))
    assert Generate(1) in s.next_actions()  # the refused one again
    s.generated(groups(1, start=2), 1)
    (again,) = sends(s.next_actions())
    s.send_failed(again.seq)  # undeliverable: generated again too
    assert Generate(1) in s.next_actions()
    s.weights_received(1)
    s.generated(groups(1, start=3), 1)
    assert Generate(2) in s.next_actions()  # a new version: a new share


def test_busy_groups_wait_and_go_again_first() -> None:
    s = session(*ASYNC)
    s.pulled()
    s.weights_received(0)
    (ask,) = sends(s.next_actions())
    s.replied(ask.seq, reply(ask, granted=4))
    s.next_actions()
    s.generated(groups(2), 2)
    (up,) = sends(s.next_actions())
    s.replied(up.seq, reply(up, ["busy", "accepted"], granted=4, retry_after=0.5))
    actions = s.next_actions()
    assert Wait(0.5) in actions
    assert not sends(actions)  # the queue is full: wait
    s.timer()
    (retry,) = sends(s.next_actions())
    assert retry.groups == (up.groups[0],)  # the same bytes


def test_groups_too_stale_for_the_window_are_not_sent_and_their_slots_go_back() -> None:
    s = session(*ASYNC, "cluster.max_staleness=2")
    s.pulled()
    s.weights_received(0)
    (ask,) = sends(s.next_actions())
    s.replied(ask.seq, reply(ask, granted=4, version=3))  # the learner is at version 3 already
    s.next_actions()
    s.generated(groups(2, version=0), 2)  # staleness 3 > 2
    ups = sends(s.next_actions())
    assert all(not u.groups for u in ups)
    assert (s.counts["stale"], s.returned) == (2, 2)
    # a returned slot was used: giving it back frees the learner's budget, it is not counted against the session
    # a second time (two chunks of 2 used the 4 slots: none left, not -2)
    assert (s.granted, s.used, s.available) == (4, 4, 0)
    assert all(u.used == 4 for u in ups)


def test_refused_again_and_again_the_session_stops_and_says_why() -> None:
    s = session("cluster.max_refusals_in_a_row=3")
    s.pulled()
    s.weights_received(0)
    s.next_actions()
    s.generated(groups(4), 4)
    (up,) = sends(s.next_actions())
    s.replied(up.seq, reply(up, refused="future_version", detail="version 7 is not published yet"))
    assert s.stopped is None  # 4 groups, one refusal of the whole upload
    for _ in range(2):
        s.next_actions()
        s.generated(groups(4), 4)
        (up,) = sends(s.next_actions())
        s.replied(up.seq, reply(up, refused="future_version", detail="version 7 is not published yet"))
    assert s.done
    assert "refused 3 uploads or groups in a row, 3 of them as 'future_version'" in (s.stopped or "")
    assert s.next_actions() == []


def test_a_restarted_learner_resets_what_the_session_was_granted() -> None:
    s = session(*ASYNC)
    s.pulled()
    s.weights_received(0)
    (ask,) = sends(s.next_actions())
    s.replied(ask.seq, reply(ask, granted=4))
    s.next_actions()
    s.generated(groups(2), 2)
    (up,) = sends(s.next_actions())
    restarted = Reply(seq=up.seq, verdicts=(GroupVerdict("accepted"),) * 2, learner="L2", granted=0)
    s.replied(up.seq, restarted)
    assert (s.granted, s.used, s.returned, s.available) == (0, 0, 0, 0)


def test_a_revoked_or_quarantined_sampler_stops_at_once_saying_why() -> None:
    for reason in ("revoked", "quarantined"):
        s = session("cluster.max_refusals_in_a_row=3")
        s.pulled()
        s.weights_received(0)
        s.next_actions()
        s.generated(groups(4), 4)
        (up,) = sends(s.next_actions())
        s.replied(up.seq, reply(up, refused=reason, detail="sampler 'sampler-0'"))
        assert s.stopped == f"the learner refused it as {reason!r}: sampler 'sampler-0'"
        assert s.counts[reason] == 4
