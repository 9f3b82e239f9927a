"""AReaL's staleness control by capacity: how many groups each sampler session may start generating, and the
budget given back for every group that will not arrive. Clock-free: the driver passes its clock's `now`.

A *slot* is one group a session may generate. The learner grants slots against three bounds, counting a slot from
the moment it is granted until its group is trained, dropped by the staleness window, or known never to arrive:

    eta (AReaL):    in_budget + k <= (eta + v + 1) * B     v: the version the session generates with (checked by
                                                            the caller against what was published)
    backpressure:   pending + k <= max_queued_steps * B    pending = in_budget - trained (queued or in flight)
    fairness:       outstanding(name) + k <= share         outstanding: granted to that sampler, not arrived yet
                    or, beyond its share, <= ceiling        with k <= room - what the others ask for (work-conserving)

with in_budget = started - released - dropped and B = groups per learner step. A grant is partial: a session
asking for n slots gets as many as the bounds allow (maybe 0), so a budget with room for fewer groups than a
chunk never deadlocks. The fairness bound keeps one client (or one that asks for slots it never uses) from taking
the whole budget: each sampler may hold its share at any time; beyond it, only room that no other sampler is
asking for (each other sampler's unmet request, up to its own share, is kept for it), and never more than the
ceiling (the capacity less one batch). A sampler that is alone in asking (the others are slow, or far) thus keeps
its round trip's worth of groups in flight instead of idling the learner.

A group that reaches the learner settles one outstanding slot of its session; a refused or filtered one releases
it at once (the sampler generates another). A session reports how many slots it has used (generated on) and gives
back the used slots whose groups will not arrive (`returned`: too stale to send, undeliverable, refused whole). A
session that for `lease_s` neither delivered a group nor was granted a slot loses the slots it still holds
(`voided`): the budget of a sampler that died, of groups lost on the way, or of a client that asks for slots and
never uses them (talking does not renew a lease; delivering does) comes back after at most one lease.

What a void takes is told apart, because the two sides must keep agreeing on what the session holds:

    unused = granted - used - voided_unused      slots it had not generated on (as far as its last upload said):
                                                 the reply's `voided` total, which the session stops counting on
    late   = voided - unused                     slots of groups it generated that had not arrived: each group
                                                 that arrives while some are late is charged (its slot is gone),
                                                 each one the session gives back cancels one

A group that arrives without an outstanding slot (nothing was asked) is charged too, so the budget stays exact.
Had a void's in-flight part been reported as voided, the session would count those slots twice (used and
voided), ask for them again, and the learner would hold the new grant as outstanding for ever: slots that fill
the backpressure bound until the run stalls.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

SessionKey = tuple[str, str]  # (sampler name, session id)
MAX_SESSIONS = 8  # leases kept per sampler name


@dataclass
class Lease:
    """What the learner knows of one sampler session's slots (all running totals)."""

    heard: float  # the driver's clock when the session last delivered a group or was granted a slot
    granted: int = 0
    wanted: int = 0  # the largest `wanted` total it has asked for
    covered: int = 0  # groups that arrived on one of its slots
    returned: int = 0  # slots it gave back that were still outstanding
    returned_told: int = 0  # the largest `returned` total it has reported
    used_told: int = 0  # the largest `used` total it has reported (slots it generated on)
    voided: int = 0  # slots taken back when its lease ran out (released from the budget)
    voided_unused: int = 0  # of those, slots it had not used: what the session is told (`Reply.voided`)
    late: int = 0  # voided slots of generated groups not arrived yet: their arrival is charged

    @property
    def outstanding(self) -> int:
        """Slots granted whose groups have not arrived and were neither given back nor voided."""
        return self.granted - self.covered - self.returned - self.voided


class Admission:
    """The slot budgets of the module docstring. Not thread-safe: the learner loop holds its intake lock."""

    def __init__(
        self,
        eta: int | None,
        groups_per_step: int,
        max_queued_steps: int | None,
        per_sampler: tuple[int, int] | None,
        lease_s: float,
    ) -> None:
        self.eta, self.B, self.max_queued_steps = eta, groups_per_step, max_queued_steps
        self.share, self.ceiling = per_sampler if per_sampler is not None else (None, None)
        self.lease_s = lease_s
        self.started = 0  # slots granted, plus groups charged on arrival
        self.released = 0  # of those, known never to reach training (refused, filtered, returned, voided)
        self.trained = 0
        self.leases: dict[SessionKey, Lease] = {}
        self.voided_total = 0

    @property
    def enabled(self) -> bool:
        """False: every request is granted in full (no eta, no backpressure)."""
        return self.eta is not None or self.max_queued_steps is not None

    def in_budget(self, dropped: int) -> int:
        """Slots that still count against AReaL's budget (trained ones included)."""
        return self.started - self.released - dropped

    def pending(self, dropped: int) -> int:
        """Slots whose groups are being generated, on their way, or queued at the learner."""
        return self.in_budget(dropped) - self.trained

    def outstanding(self, sampler: str) -> int:
        return sum(max(lease.outstanding, 0) for (name, _), lease in self.leases.items() if name == sampler)

    def asked_by_others(self, sampler: str) -> int:
        """Slots the other samplers asked for and were not granted, each up to what its share would still give."""
        unmet: dict[str, int] = defaultdict(int)
        for (name, _), lease in self.leases.items():
            if name != sampler:
                unmet[name] += max(lease.wanted - lease.granted, 0)
        assert self.share is not None
        return sum(min(n, max(self.share - self.outstanding(name), 0)) for name, n in unmet.items())

    # ------------------------------------------------------------------ a session's requests
    def lease(self, key: SessionKey, now: float) -> Lease:
        """The session's lease, opened (from `now`) if new. A sampler keeps at most `MAX_SESSIONS` leases (a
        restarted process is a new session): the one idle longest goes, its slots voided first."""
        lease = self.leases.get(key)
        if lease is None:
            own = sorted((lease.heard, k) for k, lease in self.leases.items() if k[0] == key[0])
            for _, old in own[: max(len(own) - MAX_SESSIONS + 1, 0)]:
                self._void(self.leases.pop(old))
            lease = self.leases[key] = Lease(heard=now)
        return lease

    def grant(self, key: SessionKey, wanted: int, version: int, now: float, dropped: int) -> Lease:
        """Grant the session what it asks beyond what it was granted (`wanted` is its running total), as far as
        the bounds allow; returns its lease (its `granted` total is the answer)."""
        lease = self.lease(key, now)
        lease.wanted = max(lease.wanted, wanted)
        asked = wanted - lease.granted
        if asked <= 0:
            return lease
        room = asked
        if self.eta is not None:
            room = min(room, (self.eta + version + 1) * self.B - self.in_budget(dropped))
        if self.max_queued_steps is not None:
            room = min(room, self.max_queued_steps * self.B - self.pending(dropped))
        k = room
        if self.share is not None and self.ceiling is not None:
            held = self.outstanding(key[0])
            fair = self.share - held
            if k > fair:  # beyond its share: room nobody else is asking for, up to the ceiling
                fair = max(fair, min(self.ceiling - held, room - self.asked_by_others(key[0])))
            k = min(k, fair)
        k = max(k, 0)
        lease.granted += k
        self.started += k
        if k:
            lease.heard = max(lease.heard, now)
        return lease

    def reported(self, key: SessionKey, used: int, returned: int, now: float) -> None:
        """The session's running totals of slots used and given back. What `returned` adds to the last total
        cancels late slots first (voided: released then), and releases the rest up to what it still holds."""
        lease = self.lease(key, now)
        lease.used_told = max(lease.used_told, min(used, lease.granted))
        new = returned - lease.returned_told
        if new <= 0:
            return
        lease.returned_told = returned
        cancelled = min(new, lease.late)
        lease.late -= cancelled
        freed = min(new - cancelled, max(lease.outstanding, 0))
        lease.returned += freed
        self.released += freed

    # ------------------------------------------------------------------ groups
    def arrived(self, key: SessionKey, kept: bool, now: float) -> None:
        """A group of the session reached the learner for the first time: `kept` (accepted: it counts until
        trained or dropped) or not (refused, filtered: its slot is released)."""
        lease = self.lease(key, now)
        lease.heard = max(lease.heard, now)
        if lease.late > 0:  # its slot was voided on the way: charge it now
            lease.late -= 1
            self.started += 1
        elif lease.outstanding > 0:
            lease.covered += 1
        else:  # no slot to settle (never asked for): charge it now
            self.started += 1
        if not kept:
            self.released += 1

    def consumed(self, n: int) -> None:
        """n queued groups were taken for training."""
        self.trained += n

    def release(self, n: int) -> None:
        """n slots will never reach training for a reason no session reported (the driver knows)."""
        self.released += n

    def expire(self, now: float) -> int:
        """Void the slots of every session silent for longer than `lease_s`; returns how many."""
        return sum(self._void(lease) for lease in self.leases.values() if now - lease.heard > self.lease_s)

    def withdraw(self, sampler: str) -> int:
        """Void every slot `sampler`'s sessions hold (it is quarantined: nothing it generates will be taken)."""
        return sum(self._void(lease) for (name, _), lease in self.leases.items() if name == sampler)

    def _void(self, lease: Lease) -> int:
        lease.wanted = lease.granted  # a silent session asks for nothing any more
        n = max(lease.outstanding, 0)
        unused = min(max(lease.granted - lease.used_told - lease.voided_unused, 0), n)
        lease.voided_unused += unused
        lease.late += n - unused
        lease.voided += n
        self.released += n
        self.voided_total += n
        return n

    def per_sampler_counts(self) -> dict[str, dict[str, int]]:
        """Slots granted, outstanding and voided per sampler name (for status and metrics)."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: {"granted": 0, "outstanding": 0, "voided": 0})
        for (name, _), lease in self.leases.items():
            out[name]["granted"] += lease.granted
            out[name]["outstanding"] += max(lease.outstanding, 0)
            out[name]["voided"] += lease.voided
        return dict(out)
