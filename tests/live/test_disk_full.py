"""A full disk neither kills the learner nor loses an acknowledged group: uploads get 507 `disk_full` (counted)
and leave no trace in the journal, failed checkpoints and metrics lines are retried, and once space returns the
learner acknowledges, trains and checkpoints again; a resume then holds every acknowledged group."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import threading
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

import heterorl.durable.state as state_module
from heterorl.durable.journal import Journal, parse_records, read_segment, segment_indices
from heterorl.eventlog import EventLog
from heterorl.metrics import read_metrics
from heterorl.rollout_codec import encode_group
from heterorl.transport.http.service import build_app
from heterorl.transport.wire import decode_reply
from live.test_state import resume_live
from transport.test_service import AUTH, REWARD, TOKEN, make_live, sample_groups, upload, varied_reward  # noqa: F401

pytestmark = pytest.mark.usefixtures("varied_reward")


class Disk:
    """Whether the (simulated) disk is full; files wrapped by `FullableFile` fail while it is."""

    full = False


class FullableFile:
    """An unbuffered file that, while the disk is full, writes part of what it is given and then raises ENOSPC
    (what a real write into the last free blocks does)."""

    def __init__(self, inner, disk: Disk) -> None:
        self.inner, self.disk = inner, disk

    def write(self, data) -> int:
        if self.disk.full:
            self.inner.write(bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.inner.write(data)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def journal_is_whole(run: Path) -> bool:
    """Every segment is whole records, nothing after them (a torn tail would hide later records from replay)."""
    journal = run / "live" / "journal"
    for i in segment_indices(journal):
        data = (journal / f"{i:08d}.journal").read_bytes()
        if parse_records(data)[1] != len(data):
            return False
    return True


def journal_records(run: Path) -> list[bytes]:
    journal = run / "live" / "journal"
    return [r for i in segment_indices(journal) for r in read_segment(journal / f"{i:08d}.journal")]


def test_a_full_disk_is_answered_507_and_the_learner_carries_on(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = io.StringIO()
    live = make_live(
        tmp_path / "run", tiny_model_dir, REWARD, "learner.steps=3", "live.checkpoint_every=1", events=EventLog(log)
    )
    disk = Disk()
    journal = live.loop.intake.journal
    journal._file = FullableFile(journal._file, disk)
    journal._open = lambda index: FullableFile(Journal._open(journal, index), disk)  # segments after a rotation
    live.loop.recorder.metrics._file = FullableFile(live.loop.recorder.metrics._file, disk)
    write_state = state_module._write_state

    def write_state_unless_full(*args, **kwargs) -> None:
        if disk.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        write_state(*args, **kwargs)

    monkeypatch.setattr(state_module, "_write_state", write_state_unless_full)
    groups = sample_groups(live, tiny_model_dir, 14)
    bodies = [encode_group(g) for g in groups]
    trainer = threading.Thread(target=live.train, daemon=True)

    seq = iter(range(100))

    async def post(client: TestClient, body: bytes) -> tuple[int, str]:
        r = await client.post(
            "/v1/exchange", data=upload([body], seq=next(seq), fingerprint=live.loop.fingerprint), headers=AUTH
        )
        return r.status, decode_reply(await r.read()).verdicts[0].outcome

    async def scenario() -> list[tuple[int, str]]:
        async with TestClient(TestServer(build_app(live, TOKEN))) as client:
            answers = [await post(client, b) for b in bodies[:4]]  # acknowledged
            trainer.start()
            deadline = time.monotonic() + 60
            while live.loop.learner.version < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            disk.full = True  # from here on every write fails, half-way through
            answers += [await post(client, b) for b in bodies[4:8]]
            assert not set(bodies[4:8]) & set(journal_records(live.run_dir))
            assert journal_is_whole(live.run_dir)  # not even the half a record each write managed
            disk.full = False  # space is back: the same groups (a sampler retries 507) and more are taken
            answers += [await post(client, b) for b in bodies[4:12]]
            deadline = time.monotonic() + 60
            while not live.finished and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return answers

    # the disk fills while step 2 waits for its groups; step 2 then trains, and its checkpoint is tried again
    answers = asyncio.run(scenario())
    trainer.join(timeout=60)
    assert answers[:4] == [(200, "accepted")] * 4
    assert answers[4:8] == [(507, "disk_full")] * 4
    assert answers[8:] == [(200, "accepted")] * 8
    assert live.finished
    assert live.loop.intake.counters.rejected == {"disk_full": 4}
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [e["version"] for e in events if e["event"] == "checkpoint"][-1] == 3
    train = [r for r in read_metrics(live.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]  # whole lines only, none lost
    assert {g.group_id for g in groups[:12]} == set(live.loop.intake.consumed)


def test_a_checkpoint_the_disk_refuses_is_retried_and_loses_nothing(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = io.StringIO()
    live = make_live(
        tmp_path / "run", tiny_model_dir, REWARD, "learner.steps=2", "live.checkpoint_every=1", events=EventLog(log)
    )
    live.checkpoint()  # version 0, as a learner process writes it before it listens
    groups = sample_groups(live, tiny_model_dir, 8)
    for g in groups:
        assert live.loop.offer(encode_group(g)).outcome == "accepted"
    write_state = state_module._write_state
    failures = iter([True, True])  # the checkpoints after steps 1 and 2 find the disk full; then space is back

    def sometimes_full(learner, tmp: Path, *args, **kwargs) -> None:
        if next(failures, False):
            tmp.mkdir()
            (tmp / "model.safetensors").write_bytes(b"half a model")  # what a save cut short leaves behind
            raise OSError(errno.ENOSPC, "No space left on device")
        write_state(learner, tmp, *args, **kwargs)

    monkeypatch.setattr(state_module, "_write_state", sometimes_full)
    live.train()  # two steps, then the final state and the summary
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [e["version"] for e in events if e["event"] == "checkpoint_failed"] == [1]  # periodic: next step
    assert [e["version"] for e in events if e["event"] == "write_failed"] == [2]  # final: waited and tried again
    assert [e["version"] for e in events if e["event"] == "checkpoint"] == [0, 2]
    assert live.summary is not None
    assert not list(live.state_root.glob(".tmp-*"))  # nothing half-written left behind
    resumed = resume_live(live)
    assert resumed.loop.learner.version == 2
    assert {g.group_id for g in groups} == set(resumed.loop.intake.consumed)
