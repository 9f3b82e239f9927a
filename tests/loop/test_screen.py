"""The trust checks at the learner's intake, through `LearnerLoop.offer` as every transport calls it: forged
rewards and replays are refused and charged to their sampler, a sampler that keeps failing is quarantined (its
groups refused and counted, the others' accepted), re-scored log-probs catch a forger, and one poisoned group per
batch neither skips the honest groups nor stops the run."""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from pathlib import Path

import pytest
import torch

from heterorl.loop.intake import body_digest
from heterorl.loop.protocol import Upload
from heterorl.loop.screen import fingerprint
from heterorl.metrics import read_metrics
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import encode_group
from transport.test_service import REWARD, make_live, sample_groups, varied_reward  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("varied_reward")


def as_sampler(group: RolloutGroup, name: str, tag: str = "") -> RolloutGroup:
    out = copy.deepcopy(group)
    out.sampler_id, out.group_id = name, f"{name}:{group.group_id}{tag}"
    return out


def forged_rewards(group: RolloutGroup, name: str) -> RolloutGroup:
    out = as_sampler(group, name, "-forged")
    out.rewards_G = out.rewards_G + 1.0
    return out


def one_step(loop) -> None:
    """take -> train -> commit, as a driver does."""
    taken = loop.take(0.0)
    assert taken is not None
    loop.commit(loop.train(taken), 0.0)


@pytest.fixture
def live(tmp_path: Path, tiny_model_dir: Path):
    live = make_live(
        tmp_path / "run",
        tiny_model_dir,
        REWARD,
        "learner.steps=4",
        "trust.verify.fraction=0",
        "trust.reputation={window: 8, max_charges: 3}",
    )
    yield live
    live.loop.intake.journal.close()


def test_forged_rewards_are_refused_and_charged_until_the_sampler_is_quarantined(live, tiny_model_dir) -> None:
    loop = live.loop
    groups = sample_groups(live, tiny_model_dir, 6)
    outcomes = [loop.offer(encode_group(forged_rewards(g, "mallory"))).outcome for g in groups[:3]]
    assert outcomes == ["reward_mismatch"] * 3
    assert loop.trust.reputation.quarantined("mallory")
    honest_looking = as_sampler(groups[3], "mallory")
    assert loop.offer(encode_group(honest_looking)).outcome == "quarantined"  # its honest groups too
    assert loop.offer(encode_group(as_sampler(groups[4], "alice"))).outcome == "accepted"
    metrics = loop.intake.metrics()
    assert (metrics["net/rejected_reward_mismatch"], metrics["net/rejected_quarantined"]) == (3.0, 1.0)
    record = loop.trust.to_json()["mallory"]
    assert record["refused"] == {"reward_mismatch": 3, "quarantined": 1}
    assert loop.trust.to_json()["alice"]["accepted"] == 1


def test_a_replay_under_a_new_id_is_refused_and_a_retry_under_its_own_is_a_duplicate(live, tiny_model_dir) -> None:
    loop = live.loop
    varied = [g for g in sample_groups(live, tiny_model_dir, 8) if fingerprint(g) is not None]
    first = as_sampler(varied[0], "bob")
    assert loop.offer(encode_group(first)).outcome == "accepted"
    assert loop.offer(encode_group(first)).outcome == "duplicate"  # a lost answer, the same bytes again
    replay = as_sampler(varied[0], "bob", "-again")
    replay.completion_ids_GL = replay.completion_ids_GL.flip(0)  # rows in another order: the same completions
    replay.completion_mask_GL = replay.completion_mask_GL.flip(0)
    replay.behavior_logp_GL = replay.behavior_logp_GL.flip(0)
    replay.version_GL = replay.version_GL.flip(0)
    replay.rewards_G = replay.rewards_G.flip(0)
    verdict = loop.offer(encode_group(replay))
    assert verdict.outcome == "replayed"
    assert first.group_id in verdict.detail
    same = as_sampler(varied[0], "eve")  # another sampler, the same content: refused, not held against eve
    assert loop.offer(encode_group(same)).outcome == "same_content"
    rescored = as_sampler(varied[0], "bob", "-rescored")
    rescored.behavior_logp_GL = rescored.behavior_logp_GL * 1.001  # other log-probs: another sample
    assert loop.offer(encode_group(rescored)).outcome == "accepted"
    records = loop.trust.to_json()
    assert records["bob"]["refused"] == {"replayed": 1}
    assert records["eve"]["refused"] == {"same_content": 1}
    assert loop.trust.reputation.records["eve"].recent == deque()  # not judged: no charge


def test_a_retried_upload_gets_its_answer_again_and_is_judged_once(live, tiny_model_dir) -> None:
    """An upload sent again (its reply was lost or late: the same session, seq and groups) is answered as before
    and changes nothing: its refused group is not charged twice, its slot not settled twice."""
    loop = live.loop
    name = loop.cfg.cluster.sampler_name(0)
    forged, other = (forged_rewards(g, name) for g in sample_groups(live, tiny_model_dir, 2))
    body = encode_group(forged)
    upload = Upload(name, "boot", seq=0, version=0, wanted=4, used=1, groups=(body,), digests=(body_digest(body),))
    upload = dataclasses.replace(upload, fingerprint=loop.fingerprint)
    first = loop.exchange(upload)
    assert [v.outcome for v in first.verdicts] == ["reward_mismatch"]
    assert loop.exchange(upload) == first
    assert loop.trust.to_json()[name]["refused"] == {"reward_mismatch": 1}
    assert loop.intake.metrics()["net/rejected_reward_mismatch"] == 1.0
    changed = encode_group(other)  # the same seq with other groups is not a retry: it is judged
    again = dataclasses.replace(upload, groups=(changed,), digests=(body_digest(changed),))
    assert [v.outcome for v in loop.exchange(again).verdicts] == ["reward_mismatch"]
    assert loop.trust.to_json()[name]["refused"] == {"reward_mismatch": 2}


def test_the_learner_trains_on_its_own_rewards(live, tiny_model_dir) -> None:
    loop = live.loop
    group = as_sampler(sample_groups(live, tiny_model_dir, 1)[0], "carol")
    group.rewards_G = group.rewards_G + 5e-7  # within trust.reward_tolerance (1e-6): agrees
    assert loop.offer(encode_group(group)).outcome == "accepted"
    queued = loop.intake.buffer.groups[-1]
    assert not torch.equal(queued.rewards_G, group.rewards_G)
    assert torch.equal(queued.rewards_G, group.rewards_G.round())  # the learner's recomputation (lengths)


def test_re_scored_log_probs_catch_a_forger(tmp_path: Path, tiny_model_dir: Path) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, "trust.verify.fraction=1", "weights.codec=pulse")
    try:
        groups = sample_groups(live, tiny_model_dir, 4)
        assert live.loop.offer(encode_group(as_sampler(groups[0], "dave"))).outcome == "accepted"
        forged = as_sampler(groups[1], "dave")
        mask = forged.completion_mask_GL.bool()
        forged.behavior_logp_GL = torch.where(mask, forged.behavior_logp_GL - 0.5, 0.0)
        verdict = live.loop.offer(encode_group(forged))
        assert verdict.outcome == "logprob_mismatch"
        record = live.loop.trust.to_json()["dave"]
        assert (record["verified"], record["failed"], record["refused"]) == (1, 1, {"logprob_mismatch": 1})
    finally:
        live.loop.intake.journal.close()


def test_one_poisoned_group_per_batch_neither_skips_the_batch_nor_stops_the_run(tmp_path, tiny_model_dir) -> None:
    """The issue's attack: one accepted group per batch with one token at log-prob -70, 10 batches in a row (the
    run used to stop after `learner.max_skipped_steps` = 10). Now the honest groups train every step, each poison
    is charged to its sampler, and after `max_charges` the sampler is quarantined: its later groups are refused."""
    live = make_live(
        tmp_path / "run",
        tiny_model_dir,
        REWARD,
        "learner.steps=10",
        "trust.verify.fraction=0",
        "trust.reputation={window: 64, max_charges: 3}",
    )
    try:
        groups = sample_groups(live, tiny_model_dir, 64)
        varied = [g for g in groups if g.rewards_G.min() < g.rewards_G.max()][:10]  # a negative advantage to poison
        others = [g for g in groups if g.group_id not in {v.group_id for v in varied}]
        outcomes = []
        for step in range(10):
            bad = as_sampler(varied[step], "mallory")
            bad.behavior_logp_GL[int(torch.argmin(bad.rewards_G)), 0] = -70.0
            outcomes.append(live.loop.offer(encode_group(bad)).outcome)
            honest = others[4 * step : 4 * step + 4]
            for g in honest[: 3 if outcomes[-1] == "accepted" else 4]:  # a batch of 4 either way
                assert live.loop.offer(encode_group(as_sampler(g, "honest"))).outcome == "accepted"
            one_step(live.loop)
        assert outcomes == ["accepted"] * 3 + ["quarantined"] * 7
        train = [r for r in read_metrics(live.run_dir / "metrics.jsonl") if r["kind"] == "train"]
        assert len(train) == 10
        assert [r["opt/skipped_updates"] for r in train] == [0.0] * 10
        assert [r["learner/poisoned_groups"] for r in train] == [1.0] * 3 + [0.0] * 7
        assert train[-1]["trust/mallory/quarantined"] == 1.0
        assert train[-1]["trust/honest/charged"] == 0.0
        record = live.loop.trust.to_json()["mallory"]
        assert (record["poisoned"], record["refused"]) == (3, {"poisoned": 3, "quarantined": 7})
    finally:
        live.loop.intake.journal.close()


def test_a_quarantined_sampler_is_refused_whole_through_exchange_and_its_slots_voided(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Every transport calls `LearnerLoop.exchange`: the forged groups of an upload are charged to the sampler that
    uploaded them; once quarantined, its next upload is refused whole (`quarantined`, with one line saying why and
    until when), the slots it holds are voided, and its session stops (tests/loop/test_session.py)."""
    from heterorl.config.fingerprint import fingerprint as config_fingerprint
    from heterorl.loop.intake import body_digest
    from heterorl.loop.protocol import Upload

    live = make_live(
        tmp_path / "run",
        tiny_model_dir,
        REWARD,
        "cluster.mode=async",
        "cluster.eta=2",
        "trust.verify.fraction=0",
        "trust.reputation={window: 8, max_charges: 2}",
    )
    try:
        loop = live.loop
        groups = sample_groups(live, tiny_model_dir, 4)
        forged = [encode_group(forged_rewards(g, "sampler-0")) for g in groups[:2]]
        fp = config_fingerprint(live.cfg)

        def upload(seq: int, bodies: list[bytes], wanted: int) -> Upload:
            digests = tuple(body_digest(b) for b in bodies)
            return Upload("sampler-0", "s", seq, 0, wanted, groups=tuple(bodies), digests=digests, fingerprint=fp)

        first = loop.exchange(upload(0, [], 6))
        assert first.refused == ""
        assert first.granted == 6
        reply = loop.exchange(upload(1, forged, 6))
        assert [v.outcome for v in reply.verdicts] == ["reward_mismatch"] * 2
        assert loop.trust.quarantined("sampler-0")
        assert loop.admission.outstanding("sampler-0") == 4  # two slots settled by the refused groups
        honest = encode_group(as_sampler(groups[2], "sampler-0", "-honest"))
        refused = loop.exchange(upload(2, [honest], 6))
        assert refused.refused == "quarantined"
        assert refused.verdicts == ()
        assert "quarantined since version 0" in refused.detail
        assert "until the learner restarts" in refused.detail
        assert loop.admission.outstanding("sampler-0") == 0  # its grants withdrawn
        assert loop.intake.metrics()["net/rejected_quarantined"] == 1.0
    finally:
        live.loop.intake.journal.close()
