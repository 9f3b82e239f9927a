"""How often to look at a store again: at once after finding something; then every `first_s` for a busy spell of
`busy_s` (summed spacing), since an answer is due (the learner's listing while uploads keep coming, a sampler's
reply to the upload it just wrote); then after waits that double from `first_s` to `most_s` while there is still
nothing. A conversation through a store then costs at most `first_s` per hop while it is busy, and a quiet store is
looked at every `most_s`. Clock-free: the live store sides sleep the waits, the simulator schedules them.

The spacing is from one look's start to the next one's: a look that took `took_s` (a request up a long link and
its answer back) has already waited that long, so the next goes `spacing - took_s` later, or at once. Over a 100 ms
round trip a reply that was not there yet is looked for again when the "not there" comes back, not 50 ms after it
(the WAN lab's near sampler missed its reply on the first look 0.45 times an upload, each miss 50 ms more).

    spacing_k = first_s                                while the spacings sum to less than busy_s
              = min(first_s * 2^j, most_s)             j = 0, 1, ... after that
    wait_k    = max(spacing_k - took_k, 0)
"""

from __future__ import annotations

from heterorl.config import StoreConfig


class Cadence:
    def __init__(self, first_s: float, most_s: float, busy_s: float = 0.0) -> None:
        self.first_s, self.most_s, self.busy_s = min(first_s, most_s), most_s, max(busy_s, 0.0)
        self.spacing = self.first_s
        self.quiet = 0.0  # the time since something was last found, as the looks' spacings sum it

    @classmethod
    def of(cls, cfg: StoreConfig, answer_due: bool) -> Cadence:
        """A store side's cadence, the same on both clocks: where an answer is due (the learner's listing of
        uploads, a sampler's reply) with the busy spell of `busy_poll_seconds`; where nothing is due (a sampler's
        look at the manifest: a version comes when the learner publishes one) without."""
        return cls(cfg.first_poll_seconds, cfg.poll_seconds, cfg.busy_poll_seconds if answer_due else 0.0)

    def found(self) -> float:
        """Something was there: look again at once (0 s), and start the next quiet spell from `first_s`."""
        self.spacing, self.quiet = self.first_s, 0.0
        return 0.0

    def nothing(self, took_s: float = 0.0) -> float:
        """Nothing was there: the wait before the next look, given that the look took `took_s` seconds."""
        if self.quiet < self.busy_s:
            spacing = self.first_s
        else:
            spacing, self.spacing = self.spacing, min(2.0 * self.spacing, self.most_s)
        took_s = max(took_s, 0.0)
        self.quiet += max(spacing, took_s)
        return max(spacing - took_s, 0.0)
