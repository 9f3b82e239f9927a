"""The conversation's rules under the simulated clock: admission with lost uploads, a sampler that dies holding
slots, eta 0 with chunks of several groups, dynamic sampling, a client that hoards slots it never uses, leases
voided while groups are on their way -- each run reaches its last step (the live cluster runs the same session:
tests/live/test_protocol_live.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import capture_records, tiny_config
from heterorl.config import ConfigError
from heterorl.loop.protocol import Upload
from heterorl.simulated.run import build_simulated
from transport.test_service import REWARD, varied_reward  # noqa: F401 (a fixture)

LINK = "{weights_delay: {kind: uniform, low: 0.5, high: 2}, rollout_delay: {kind: fixed, seconds: 0.2}}"


def build(tmp_path: Path, model_dir: Path, *overrides: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cluster = build_simulated(tiny_config(model_dir, *overrides), tmp_path, str(model_dir))
    return cluster, capture_records(cluster)


def two(*extra: str) -> list[str]:
    return [
        f"cluster.samplers=[{{tokens_per_second: 40, link: {LINK}}}, {{tokens_per_second: 20, link: {LINK}}}]",
        "cluster.mode=async",
        "cluster.learner_step_seconds=0.5",
        "learner.steps=8",
        *extra,
    ]


def test_admission_with_lost_uploads_reaches_the_last_step(tmp_path: Path, tiny_model_dir: Path) -> None:
    lossy = f"{{tokens_per_second: 40, link: {LINK[:-1]}, rollout_faults: {{drop: 0.5}}}}}}"
    cluster, records = build(
        tmp_path, tiny_model_dir, *two("cluster.eta=1", f"cluster.samplers.1={lossy}", "live.dead_after_s=2")
    )
    cluster.run()
    assert len(records) == 8
    assert max(r["stale/max"] for r in records) <= 1
    timeouts = cluster.summary()["samplers"]["sampler-1"]["transport"]["timeouts"]
    assert timeouts > 0  # uploads were lost and sent again


def test_a_sampler_that_dies_holding_slots_gives_them_back_after_its_lease(tmp_path: Path, tiny_model_dir: Path):
    """Sampler 1 stops answering for good once it holds slots; with eta 0 the budget of a version is one batch,
    so without its lease running out the learner would wait for its groups forever."""
    cluster, records = build(tmp_path, tiny_model_dir, *two("cluster.eta=0", "cluster.lease_seconds=5"))
    dead = cluster.nodes[1].node
    step = dead.step

    def dies_holding_slots() -> None:
        if dead.session.available > 0:  # killed: it never generates, sends or answers again
            dead._closed = True
            return
        step()

    dead.step = dies_holding_slots  # type: ignore[method-assign]
    cluster.run()
    assert len(records) == 8
    assert dead._closed
    assert cluster.loop.admission.voided_total > 0


@pytest.mark.usefixtures("varied_reward")
def test_eta_zero_with_chunks_of_several_groups_and_dynamic_sampling_does_not_stall(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    cluster, records = build(
        tmp_path,
        tiny_model_dir,
        *two("cluster.eta=0", "learner.dynamic_sampling=true", "learner.groups_per_step=6", "learner.steps=6", REWARD),
    )
    cluster.run()
    assert len(records) == 6
    assert max(r["stale/max"] for r in records) == 0
    assert records[-1]["net/filtered_total"] > 0  # groups were filtered, their slots given back


def test_a_client_hoarding_slots_it_never_uses_cannot_starve_an_honest_sampler(tmp_path: Path, tiny_model_dir: Path):
    """`sampler-1` is a client that asks for every slot it can, every second, and never sends a group; the
    fairness bound leaves the honest sampler a batch's worth, and the hoarder's lease runs out (asking does not
    renew it)."""
    cluster, records = build(tmp_path, tiny_model_dir, *two("cluster.max_queued_steps=2"))
    hoarder = cluster.nodes[1].node
    hoarder.start = lambda: None  # type: ignore[method-assign]
    events, loop = cluster.events, cluster.loop
    seq = iter(range(10**6))

    def hoard() -> None:
        loop.exchange(Upload("sampler-1", "greedy", next(seq), version=0, wanted=10**6, fingerprint=loop.fingerprint))
        if not loop.done:
            events.schedule_in(1.0, hoard)

    events.schedule(0.0, hoard)
    cluster.run()
    assert len(records) == 8
    hoarded = loop.admission.per_sampler_counts()["sampler-1"]
    assert hoarded["granted"] <= loop.admission.max_queued_steps * loop.B - loop.B  # never the last batch's worth


@pytest.mark.timeout(60)  # passes in seconds; the stall it guards against never ends
def test_leases_voided_while_groups_are_on_their_way_do_not_leak_slots(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Learner steps (~10 s) longer than the lease (4 s): leases run out while granted groups are being generated
    or are on the link. The session is told only the unused slots it lost, the learner charges the late groups,
    and neither side's count drifts: before, every void left the in-flight slots outstanding at the learner for
    good, the backpressure bound filled with them, and the run stalled for ever (the adversaries config at step 31)."""
    link = "{weights_delay: {kind: uniform, low: 1, high: 30}, rollout_delay: {kind: uniform, low: 0.5, high: 2}}"
    slow = f"{{tokens_per_second: 2, link: {link}}}"
    cluster, records = build(
        tmp_path,
        tiny_model_dir,
        f"cluster.samplers=[{slow}, {slow}, {slow}, {slow}]",
        "cluster.mode=async",
        "cluster.learner_seconds_per_token=0.12",
        "cluster.lease_seconds=4",
        "learner.steps=30",
        "eval.every=1000",
    )
    cluster.run()
    assert len(records) == 30
    admission = cluster.loop.admission
    assert admission.voided_total > 0
    # what the learner holds outstanding per sampler is at most what its session can still deliver: unused slots
    # it holds or was granted on the way, and groups it generated that were not answered yet
    for i, node in enumerate(n.node for n in cluster.nodes):
        s = node.session
        held = admission.outstanding(f"sampler-{i}")
        assert held <= max(s.wanted, s.granted) - s.used - s.voided + s.unanswered, f"sampler-{i}"


def test_the_learners_intake_cost_delays_replies(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`cluster.learner_seconds_per_group`: the simulated learner answers an upload that long per group in it
    later, so a round trip holds it (as a live reply's `handled` seconds are in the live round trip)."""
    rtts = {}
    for cost in (0.0, 0.5):
        overrides = two(f"cluster.learner_seconds_per_group={cost}")
        cluster, records = build(tmp_path / str(cost), tiny_model_dir, *overrides)
        lines: list[dict] = []
        cluster.nodes[0].node.emit = lambda event, _lines=lines, **fields: _lines.append({"event": event, **fields})
        cluster.run()
        assert len(records) == 8
        replied = [e for e in lines if e["event"] == "replied" and e["groups"]]
        rtts[cost] = min(e["rtt"] - 0.5 * e["groups"] for e in replied), min(e["rtt"] for e in replied)
    # with the cost, every round trip is at least the groups' intake longer than the fastest one without it
    assert rtts[0.5][0] >= rtts[0.0][1] - 1e-9


def test_an_intake_cost_is_refused_for_rollouts_through_the_simulated_store(tmp_path: Path, tiny_model_dir: Path):
    with pytest.raises(ConfigError, match="learner_seconds_per_group"):
        build(tmp_path, tiny_model_dir, *two("cluster.learner_seconds_per_group=0.1", "transport.rollouts=store"))
