"""Rollout groups through a real store (a directory and moto's S3 server) into the learner's real intake: the
HTTP intake's validation and reasons, receipts a sampler reads back, backpressure, and exactly-once intake across
a learner crash between journaling a group and deleting its object."""

from __future__ import annotations

import asyncio
import io
import random
from pathlib import Path

import pytest

from heterorl.eventlog import EventLog
from heterorl.live.learner_node import open_learner
from heterorl.loop.intake import body_digest
from heterorl.rollout_codec import encode_group
from heterorl.transport.http.client import Backoff
from heterorl.transport.store.intake import StoreIntake
from heterorl.transport.store.objects import open_store
from heterorl.transport.store.sink import StoreRolloutSink
from transport.test_service import REWARD, make_live, sample_groups, varied_reward  # noqa: F401 (a fixture)

ROLLOUTS = ["transport.rollouts=store", "transport.store.poll_seconds=0.05"]


def opened(live):
    objects = open_store(live.cfg.transport.store)
    objects.check("rollouts/", None)  # creates the directory of a file:// store
    return objects


def sink_for(live, objects, name: str = "s", boot: str = "b00t") -> StoreRolloutSink:
    cfg = live.cfg
    backoff = Backoff(0.01, 0.05, random.Random(0))
    return StoreRolloutSink(objects, cfg.transport.store, cfg.live, name, boot, backoff, EventLog(io.StringIO()))


@pytest.mark.usefixtures("varied_reward")
def test_every_verdict_of_the_http_intake_comes_back_through_the_store(
    tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]
) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, *store_overrides, "learner.steps=2")
    objects = opened(live)
    groups = [encode_group(g) for g in sample_groups(live, tiny_model_dir, 4)]
    intake = StoreIntake(objects, live.loop, live.cfg.live.max_body_bytes)
    sink = sink_for(live, objects)
    objects.put("rollouts/s/b00t/not-a-group.grp", b"junk")

    async def scenario() -> list[str]:
        sent = [await sink.send(body, body_digest(body)) for body in groups[:3]]
        sent.append(await sink.send(groups[3][: len(groups[3]) // 2], body_digest(groups[3])))  # torn upload
        sent.append(await sink.send(b"x" * 5000, body_digest(b"x" * 5000)))  # over live.max_body_bytes (4096)
        sent.append(await sink.send(groups[0], body_digest(groups[0])))  # the same group again
        await asyncio.to_thread(intake.poll)
        verdicts = await asyncio.wait_for(asyncio.gather(*sent), 30)
        await sink.close()
        return verdicts

    verdicts = asyncio.run(scenario())
    assert verdicts == ["accepted", "accepted", "accepted", "corrupt", "too_large", "accepted"]
    counters = live.loop.intake.counters
    assert (counters.accepted, counters.duplicates) == (3, 1)
    assert dict(counters.rejected) == {"corrupt": 1, "too_large": 1, "malformed": 1}
    assert len(live.loop.intake.buffer) == 3
    left = [o.key for o in objects.list("rollouts/")]
    assert left == ["rollouts/s/b00t/not-a-group.grp.rejected"]  # consumed groups and read markers are gone
    assert intake.counts == {"accepted": 3, "duplicate": 1, "corrupt": 1, "too_large": 1, "malformed": 1}


@pytest.mark.usefixtures("varied_reward")
def test_a_full_queue_leaves_groups_in_the_store_until_there_is_room(
    tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]
) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, *store_overrides, "live.max_queued_groups=2")
    objects = opened(live)
    bodies = [encode_group(g) for g in sample_groups(live, tiny_model_dir, 3)]
    for i, body in enumerate(bodies):
        objects.put(f"rollouts/s/b00t/{i:010d}-{body_digest(body)}.grp", body)
    intake = StoreIntake(objects, live.loop, live.cfg.live.max_body_bytes)
    intake.poll()
    assert intake.counts == {"accepted": 2, "busy": 1}
    assert len(objects.list("rollouts/")) == 1  # waits in the store, not lost
    live.loop.intake.take(2, live.loop.learner.version, 0.0)  # the learner trains on the two queued groups
    intake.poll()
    assert live.loop.intake.counters.accepted == 3
    assert objects.list("rollouts/") == []


@pytest.mark.usefixtures("varied_reward")
def test_a_learner_crash_between_journal_and_delete_queues_the_group_once(
    tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]
) -> None:
    run = tmp_path / "run"
    live = make_live(run, tiny_model_dir, REWARD, *ROLLOUTS, *store_overrides)
    live.checkpoint()  # the state the restarted learner resumes from
    objects = opened(live)
    (group,) = sample_groups(live, tiny_model_dir, 1)
    body = encode_group(group)
    key = f"rollouts/s/b00t/{0:010d}-{body_digest(body)}.grp"
    objects.put(key, body)

    def crash(key: str) -> None:
        raise SystemExit("the learner died here")

    intake = StoreIntake(objects, live.loop, live.cfg.live.max_body_bytes)
    objects.delete = crash  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        intake.poll()
    assert live.loop.intake.counters.accepted == 1  # journaled (acknowledged) ...
    del objects.delete
    assert [o.key for o in objects.list("rollouts/")] == [key]  # ... but still in the store
    live.loop.intake.journal.close()
    live.loop.publisher.close()

    again = open_learner(live.cfg, run, str(tiny_model_dir), resume=True, events=EventLog(io.StringIO()))
    again.loop.start()
    assert [g.group_id for g in again.loop.intake.buffer.groups] == [group.group_id]  # from the journal
    intake = StoreIntake(objects, again.loop, live.cfg.live.max_body_bytes)
    intake.poll()
    assert intake.counts == {"duplicate": 1}
    assert [g.group_id for g in again.loop.intake.buffer.groups] == [group.group_id]  # once, not twice
    assert objects.list("rollouts/") == []
    again.loop.intake.journal.close()
    again.loop.publisher.close()
