"""How often to look at a store again: at once after finding something, then after waits that double from
`first_s` to `most_s` while there is nothing. A conversation through a store then costs a poll interval only while
it is idle, never one per hop. Clock-free: the live store sides sleep the waits, the simulator schedules them."""

from __future__ import annotations


class Cadence:
    def __init__(self, first_s: float, most_s: float) -> None:
        self.first_s, self.most_s = min(first_s, most_s), most_s
        self.wait = self.first_s

    def found(self) -> float:
        """Something was there: look again at once (0 s), and start the next quiet spell from `first_s`."""
        self.wait = self.first_s
        return 0.0

    def nothing(self) -> float:
        """Nothing was there: the wait before the next look."""
        wait, self.wait = self.wait, min(2.0 * self.wait, self.most_s)
        return wait
