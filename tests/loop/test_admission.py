"""AReaL's admission by capacity, by hand: partial grants, fairness, leases, budget given back, running totals."""

from __future__ import annotations

from heterorl.loop.admission import MAX_SESSIONS, Admission

A, B2 = ("a", "s1"), ("b", "s1")


def test_a_grant_is_partial_and_bounded_by_eta_backpressure_and_fairness() -> None:
    adm = Admission(eta=1, groups_per_step=4, max_queued_steps=None, per_sampler=(6, 6), lease_s=10.0)
    # eta: in_budget + k <= (eta + v + 1) * B = (1 + 0 + 1) * 4 = 8 at version 0
    assert adm.grant(A, wanted=6, version=0, now=0.0, dropped=0).granted == 6  # fairness caps a's share at 6
    assert adm.grant(B2, wanted=6, version=0, now=0.0, dropped=0).granted == 2  # 8 - 6: a partial grant
    assert (adm.started, adm.in_budget(0)) == (8, 8)
    assert adm.grant(B2, wanted=6, version=1, now=0.0, dropped=0).granted == 6  # version 1 budget 12: 4 more
    # backpressure alone: pending + k <= 2 * 4
    bp = Admission(eta=None, groups_per_step=4, max_queued_steps=2, per_sampler=None, lease_s=10.0)
    assert bp.grant(A, 20, 0, 0.0, 0).granted == 8
    bp.consumed(4)  # a step trained 4 of them
    assert bp.grant(A, 20, 0, 0.0, 0).granted == 12


def test_running_totals_make_retries_and_reordering_harmless() -> None:
    adm = Admission(eta=None, groups_per_step=4, max_queued_steps=4, per_sampler=None, lease_s=10.0)
    assert adm.grant(A, 5, 0, 0.0, 0).granted == 5
    assert adm.grant(A, 5, 0, 0.0, 0).granted == 5  # the same upload again: nothing more
    assert adm.grant(A, 3, 0, 0.0, 0).granted == 5  # an older upload overtaken by a newer one
    adm.reported(A, 5, 2, 0.0)
    adm.reported(A, 5, 2, 0.0)  # repeated: released once
    adm.reported(A, 4, 1, 0.0)  # smaller (older) totals: nothing
    assert (adm.started, adm.released) == (5, 2)


def test_arrivals_settle_slots_and_refusals_release_them() -> None:
    adm = Admission(eta=None, groups_per_step=4, max_queued_steps=1, per_sampler=None, lease_s=10.0)
    adm.grant(A, 4, 0, 0.0, 0)
    adm.arrived(A, kept=True, now=1.0)
    adm.arrived(A, kept=False, now=1.0)  # refused or filtered: its slot comes back at once
    assert (adm.leases[A].outstanding, adm.released, adm.pending(0)) == (2, 1, 3)
    assert adm.grant(A, 5, 0, 1.0, 0).granted == 5  # the freed slot is granted again
    adm.arrived(("c", "s9"), kept=True, now=1.0)  # a group with no slot (nothing asked): charged on arrival
    assert adm.started == 6


def test_a_session_that_delivers_nothing_loses_its_slots_after_its_lease_and_is_charged_if_it_comes_back() -> None:
    adm = Admission(eta=None, groups_per_step=4, max_queued_steps=2, per_sampler=None, lease_s=10.0)
    adm.grant(A, 8, 0, 0.0, 0)
    assert adm.grant(B2, 4, 0, 0.0, 0).granted == 0  # a holds the whole budget
    adm.arrived(A, kept=True, now=5.0)  # delivering renews its lease
    adm.grant(A, 9, 0, 12.0, 0)  # asking for more and getting none does not
    assert adm.expire(14.0) == 0  # renewed at 5: its lease runs to 15
    assert adm.expire(15.5) == 7
    assert (adm.leases[A].voided, adm.pending(0)) == (7, 1)
    assert adm.grant(B2, 4, 0, 15.5, 0).granted == 4  # the budget came back
    adm.arrived(A, kept=True, now=16.0)  # a group generated on a voided slot still arrives: charged
    assert (adm.started, adm.pending(0)) == (13, 6)


def test_one_sampler_cannot_hold_more_than_its_bound_whatever_its_sessions() -> None:
    adm = Admission(eta=None, groups_per_step=4, max_queued_steps=4, per_sampler=(5, 5), lease_s=10.0)
    for i in range(3):
        adm.grant(("a", f"s{i}"), 5, 0, 0.0, 0)
    assert adm.outstanding("a") == 5
    assert adm.grant(B2, 16, 0, 0.0, 0).granted == 5
    for i in range(MAX_SESSIONS + 3):  # a client making up sessions: the oldest ones go, their slots voided
        adm.lease(("a", f"x{i}"), float(i))
    assert sum(1 for name, _ in adm.leases if name == "a") == MAX_SESSIONS
    assert adm.outstanding("a") == 0


def test_a_void_tells_unused_slots_from_late_ones_so_the_session_and_the_learner_keep_agreeing() -> None:
    adm = Admission(eta=None, groups_per_step=4, max_queued_steps=2, per_sampler=None, lease_s=10.0)
    adm.grant(A, 6, 0, 0.0, 0)
    adm.reported(A, used=4, returned=0, now=1.0)  # it generated on 4 of its 6 slots
    adm.arrived(A, kept=True, now=1.0)  # one of them arrived
    assert adm.expire(11.5) == 5  # silent past its lease: 2 unused and 3 generated-not-arrived slots voided
    lease = adm.leases[A]
    assert (lease.voided, lease.voided_unused, lease.late, adm.pending(0)) == (5, 2, 3, 1)
    # the session is told 2 (`Reply.voided`): it holds 6 - 4 - 2 = 0 and asks for used + voided + 2 = 8
    assert adm.grant(A, 8, 0, 12.0, 0).granted == 8
    adm.arrived(A, kept=True, now=12.5)  # a late group: charged, the 2 new slots stay outstanding
    adm.reported(A, used=4, returned=1, now=12.5)  # one late group will never come: cancelled, not released
    assert (lease.late, lease.outstanding, adm.started, adm.released) == (1, 2, 9, 5)
    adm.arrived(A, kept=True, now=13.0)  # the last late group
    adm.reported(A, used=6, returned=1, now=13.0)  # the session used the 2 new slots
    adm.arrived(A, kept=True, now=13.5)
    adm.arrived(A, kept=True, now=13.5)
    # every group it generated is queued, nothing is held by either side: nothing leaked into the budget
    assert (lease.late, lease.outstanding, adm.pending(0)) == (0, 0, 5)


def test_beyond_its_share_a_sampler_gets_only_room_nobody_else_asks_for() -> None:
    # capacity 4 x 4 = 16, share 6, ceiling 12 (all but one batch)
    adm = Admission(eta=None, groups_per_step=4, max_queued_steps=4, per_sampler=(6, 12), lease_s=10.0)
    assert adm.grant(A, 20, 0, 0.0, 0).granted == 12  # alone in asking: up to the ceiling, not only its share
    assert adm.grant(B2, 3, 0, 0.0, 0).granted == 3  # 15 of 16 granted
    adm.consumed(4)  # a step: room for 5
    adm.reported(A, used=12, returned=0, now=1.0)
    for _ in range(12):
        adm.arrived(A, kept=True, now=1.0)  # a's groups are queued: it holds no slot, and still asks for 8
    # b asks for 6 more: its share gives it 3; the 2 beyond are kept for a's unmet request (up to a's share)
    assert adm.grant(B2, 9, 0, 1.0, 0).granted == 6
    assert adm.grant(A, 20, 0, 1.0, 0).granted == 14  # the room left
    adm.consumed(8)  # two steps: room for 8
    # a asks for 6 more: 4 within its share, 2 beyond it, since b holds its whole share and can be given no more
    assert adm.grant(A, 20, 0, 2.0, 0).granted == 20
    assert adm.grant(B2, 9, 0, 2.0, 0).granted == 8  # the 2 slots of room left, beyond b's share: nobody else asks
