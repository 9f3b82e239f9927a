"""The simulated link's paths are the live client's connections: the sampler opens them (its requests wait for the
handshake), the learner's answers ride them (its first answer waits for none)."""

from __future__ import annotations

import pytest

from heterorl.config import LinkConfig
from heterorl.network import Link
from heterorl.transport.simulated.paths import SimPath


def tcp_link(one_way: float) -> Link:
    delay = {"kind": "fixed", "seconds": one_way}
    return Link(LinkConfig(weights_delay=delay, rollout_delay=delay, transfer={"model": "tcp"}), seed=0)


def test_a_request_pays_the_handshake_and_its_answer_does_not() -> None:
    link = tcp_link(0.3)
    requests, answers = SimPath(link, "rollout"), SimPath(link, "weights", opens=False)
    asked = requests.arrival(0.0, 500)  # SYN and SYN-ACK (0.6 s), then the request (0.3 s)
    assert asked == pytest.approx(0.9)
    assert answers.arrival(asked, 500) == pytest.approx(1.2)  # one way back: a round trip of 1.2 s, not 1.8
    assert requests.arrival(2.0, 500) == pytest.approx(2.3)  # the connection stays open
