"""AReaL's staleness control by capacity: how many groups each sampler session may start generating, and the
budget given back for every group that will not arrive. Clock-free: the driver passes its clock's `now`.

A *slot* is one group a session may generate. The learner grants slots against three bounds, counting a slot from
the moment it is granted until its group is trained, dropped by the staleness window, or known never to arrive:

    eta (AReaL):    in_budget + k <= (eta + v + 1) * B     v: the version the session generates with (checked by
                                                            the caller against what was published)
    backpressure:   pending + k <= max_queued_steps * B    pending = in_budget - trained (queued or in flight)
    fairness:       outstanding(name) + k <= per_sampler   outstanding: granted to that sampler, not arrived yet

with in_budget = started - released - dropped and B = groups per learner step. A grant is partial: a session
asking for n slots gets as many as the bounds allow (maybe 0), so a budget with room for fewer groups than a
chunk never deadlocks. The fairness bound keeps one client (or one that asks for slots it never uses) from taking
the whole budget.

A group that reaches the learner settles one outstanding slot of its session; a refused or filtered one releases
it at once (the sampler generates another). A session gives back slots it will not use (`returned`), and a
session that for `lease_s` neither delivered a group nor was granted a slot loses the slots it still holds
(`voided`): the budget of a sampler that died, of groups lost on the way, or of a client that asks for slots and
never uses them (talking does not renew a lease; delivering does) comes back after at most one lease. A group that
arrives without an outstanding slot (its lease was voided, or nothing was asked) is charged when it arrives, so the
budget stays exact.
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
    covered: int = 0  # groups that arrived on one of its slots
    returned: int = 0  # slots it gave back that were still outstanding
    returned_told: int = 0  # the largest `returned` total it has reported
    voided: int = 0  # slots taken back when its lease ran out

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
        per_sampler: int | None,
        lease_s: float,
    ) -> None:
        self.eta, self.B, self.max_queued_steps = eta, groups_per_step, max_queued_steps
        self.per_sampler, self.lease_s = per_sampler, lease_s
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
        asked = wanted - lease.granted
        if asked <= 0:
            return lease
        k = asked
        if self.eta is not None:
            k = min(k, (self.eta + version + 1) * self.B - self.in_budget(dropped))
        if self.max_queued_steps is not None:
            k = min(k, self.max_queued_steps * self.B - self.pending(dropped))
        if self.per_sampler is not None:
            k = min(k, self.per_sampler - self.outstanding(key[0]))
        k = max(k, 0)
        lease.granted += k
        self.started += k
        if k:
            lease.heard = max(lease.heard, now)
        return lease

    def give_back(self, key: SessionKey, returned: int, now: float) -> None:
        """The session's running total of slots given back; what it adds to the last total is released (up to
        what it still holds: slots voided meanwhile were released then)."""
        lease = self.lease(key, now)
        new = returned - lease.returned_told
        if new <= 0:
            return
        lease.returned_told = returned
        freed = min(new, max(lease.outstanding, 0))
        lease.returned += freed
        self.released += freed

    # ------------------------------------------------------------------ groups
    def arrived(self, key: SessionKey, kept: bool, now: float) -> None:
        """A group of the session reached the learner for the first time: `kept` (accepted: it counts until
        trained or dropped) or not (refused, filtered: its slot is released)."""
        lease = self.lease(key, now)
        lease.heard = max(lease.heard, now)
        if lease.outstanding > 0:
            lease.covered += 1
        else:  # no slot to settle (voided, or never asked for): charge it now
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

    def _void(self, lease: Lease) -> int:
        n = max(lease.outstanding, 0)
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
