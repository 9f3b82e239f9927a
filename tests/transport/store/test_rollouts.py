"""Uploads through a real store (a directory and moto's S3 server) into the learner's real intake: the same verdicts
and reasons as over HTTP come back in replies a sampler reads, a full queue answers `busy`, hostile entries of the
file system are skipped and counted, and a learner crash between journaling and answering loses nothing and
queues nothing twice."""

from __future__ import annotations

import asyncio
import io
import os
import random
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from heterorl.eventlog import EventLog
from heterorl.live.learner_node import open_learner
from heterorl.loop.intake import body_digest
from heterorl.loop.protocol import Upload
from heterorl.rollout_codec import encode_group
from heterorl.transport.backoff import Backoff
from heterorl.transport.store.intake import LEFTOVER_S, StoreIntake, reply_key, upload_key
from heterorl.transport.store.objects import MemoryStore, ObjectNotRegular, open_store
from heterorl.transport.store.sampler import StoreSamplerSide
from heterorl.transport.wire import decode_reply, encode_upload
from transport.test_service import REWARD, make_live, sample_groups, varied_reward  # noqa: F401 (a fixture)

ROLLOUTS = ["transport.rollouts=store", "transport.store.poll_seconds=0.05"]


def opened(live):
    objects = open_store(live.cfg.transport.store)
    objects.check("up/", None)  # creates the directory of a file:// store
    return objects


def intake_of(live, objects, workers: int = 1) -> StoreIntake:
    cfg = live.cfg
    return StoreIntake(objects, live.loop, cfg.live.max_body_bytes, cfg.cluster.groups_per_upload, workers=workers)


def put_upload(objects, live, bodies: list[bytes], seq: int, session: str = "b00t") -> str:
    body = encode_upload(
        Upload(
            "sampler-0",
            session,
            seq,
            0,
            groups=tuple(bodies),
            digests=tuple(map(body_digest, bodies)),
            fingerprint=live.loop.fingerprint,
        )
    )
    key = upload_key("sampler-0", session, seq, body)
    objects.put(key, body)
    return key


def outcomes(objects, seq: int, session: str = "b00t") -> list[str] | str:
    reply = decode_reply(objects.get(reply_key("sampler-0", session, seq), 1 << 20))
    return reply.refused or [v.outcome for v in reply.verdicts]


@pytest.mark.usefixtures("varied_reward")
def test_every_verdict_of_the_http_intake_comes_back_through_the_store(
    tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]
) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, *store_overrides, "learner.steps=2")
    objects = opened(live)
    groups = [encode_group(g) for g in sample_groups(live, tiny_model_dir, 4)]
    intake = intake_of(live, objects)
    cfg = live.cfg
    backoff = Backoff(0.01, 0.05, random.Random(0))
    side_args = (objects, cfg.transport.store, cfg.live, "sampler-0", "b00t", backoff, EventLog(io.StringIO()))
    objects.put("up/sampler-0/b00t/not-an-upload.up", b"junk")

    def upload_of(seq: int, bodies, digests) -> Upload:
        fp = live.loop.fingerprint
        return Upload("sampler-0", "b00t", seq, 0, groups=tuple(bodies), digests=tuple(digests), fingerprint=fp)

    async def scenario() -> list:
        side = StoreSamplerSide(*side_args, lambda p: p, lambda: (None, 0))
        replies: list = []
        ups = [
            upload_of(0, groups[:3], map(body_digest, groups[:3])),
            upload_of(1, [groups[3]], [body_digest(groups[0])]),  # corrupted
            upload_of(2, [b"x" * 5000], [body_digest(b"x" * 5000)]),  # > 4096
            upload_of(3, [groups[0]], [body_digest(groups[0])]),  # again
        ]
        for up in ups:
            side.exchange(up, replies.append)
        while len(replies) < len(ups):
            await asyncio.to_thread(intake.poll)
            await asyncio.sleep(0.05)
        await side.settle(10)  # the replies' deletes, in the background
        side.close()
        return sorted(replies, key=lambda r: r.seq)

    replies = asyncio.run(scenario())
    assert [r.refused or [v.outcome for v in r.verdicts] for r in replies] == [
        ["accepted"] * 3,
        ["corrupt"],
        "too_large",
        ["duplicate"],
    ]
    counters = live.loop.intake.counters
    assert (counters.accepted, counters.duplicates) == (3, 1)
    assert dict(counters.rejected) == {"corrupt": 1, "too_large": 1, "malformed": 1}
    assert len(live.loop.intake.buffer) == 3
    assert objects.list("up/") == []  # every upload answered and gone (the junk key too)
    assert objects.list("down/") == []  # every reply read and deleted by the sampler


@pytest.mark.usefixtures("varied_reward")
def test_a_full_queue_answers_busy_for_the_groups_it_cannot_take(
    tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]
) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, *store_overrides, "live.max_queued_groups=2")
    objects = opened(live)
    bodies = [encode_group(g) for g in sample_groups(live, tiny_model_dir, 3)]
    put_upload(objects, live, bodies, 0)
    intake_of(live, objects).poll()
    assert outcomes(objects, 0) == ["accepted", "accepted", "busy"]  # the sampler sends the third again later
    live.loop.intake.take(2, live.loop.learner.version, 0.0)  # the learner trains on the two queued groups
    put_upload(objects, live, bodies[2:], 1)
    intake_of(live, objects).poll()
    assert outcomes(objects, 1) == ["accepted"]
    assert live.loop.intake.counters.accepted == 3


@pytest.mark.usefixtures("varied_reward")
def test_hostile_entries_where_uploads_belong_are_skipped_counted_and_never_stall_the_intake(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    store = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))  # short: a UNIX socket's path is at most 107 bytes
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, f"transport.store.url=file://{store}")
    objects = opened(live)
    bodies = [encode_group(g) for g in sample_groups(live, tiny_model_dir, 2)]
    folder = store / "up" / "sampler-0" / "b00t"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "0000000007-0123456789abcdef0123456789abcdef.up")  # a FIFO named like an upload
    os.symlink("loop", folder / "loop")
    os.symlink(folder / "loop", folder / "0000000008-0123456789abcdef0123456789abcdef.up")  # a symlink loop
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(folder / "0000000009-0123456789abcdef0123456789abcdef.up"))
    put_upload(objects, live, bodies, 0)
    intake = intake_of(live, objects)
    assert intake.poll() == 1  # the real upload is answered; the rest never opened
    assert outcomes(objects, 0) == ["accepted", "accepted"]
    assert intake.poll() == 0  # and they stay refused on every pass, without blocking it
    skipped = live.loop.intake.counters.rejected
    assert skipped["not_regular"] >= 3
    listener.close()
    shutil.rmtree(store)


@pytest.mark.usefixtures("varied_reward")
def test_a_learner_crash_between_journal_and_answer_queues_the_group_once(
    tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]
) -> None:
    run = tmp_path / "run"
    live = make_live(run, tiny_model_dir, REWARD, *ROLLOUTS, *store_overrides)
    live.checkpoint()  # the state the restarted learner resumes from
    objects = opened(live)
    (group,) = sample_groups(live, tiny_model_dir, 1)
    key = put_upload(objects, live, [encode_group(group)], 0)

    def crash(key: str, data: bytes) -> None:
        raise SystemExit("the learner died here")

    put = objects.put
    objects.put = crash  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        intake_of(live, objects).poll()
    objects.put = put  # type: ignore[method-assign]
    assert live.loop.intake.counters.accepted == 1  # journaled (acknowledged) ...
    assert [o.key for o in objects.list("up/")] == [key]  # ... but not answered: still in the store
    live.loop.intake.journal.close()
    live.loop.publisher.close()

    again = open_learner(live.cfg, run, str(tiny_model_dir), resume=True, events=EventLog(io.StringIO()))
    again.loop.start()
    assert [g.group_id for g in again.loop.intake.buffer.groups] == [group.group_id]  # from the journal
    intake = intake_of(again, objects)
    intake.poll()
    assert outcomes(objects, 0) == ["duplicate"]
    assert [g.group_id for g in again.loop.intake.buffer.groups] == [group.group_id]  # once, not twice
    assert [o.key for o in objects.list("up/")] == [key]  # the sampler's to delete once it read the reply ...
    assert intake.poll() == 0  # ... and not answered again meanwhile
    again.loop.intake.journal.close()
    again.loop.publisher.close()


@pytest.mark.usefixtures("varied_reward")
def test_answered_uploads_are_skipped_forgotten_once_gone_and_deleted_when_left_behind(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The sampler deletes its upload once it read the reply; until then the learner's listings skip it. An upload
    still there `LEFTOVER_S` after its reply (its sampler died) is deleted by the learner."""
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, "learner.steps=2")
    objects, now = MemoryStore(), [0.0]
    intake = StoreIntake(objects, live.loop, live.cfg.live.max_body_bytes, 8, clock=lambda: now[0])
    first, second = (encode_group(g) for g in sample_groups(live, tiny_model_dir, 2))
    gone, left = put_upload(objects, live, [first], 0), put_upload(objects, live, [second], 1)
    assert intake.poll() == 2
    assert intake.poll() == 0
    assert sorted(intake.answered) == [gone, left]
    objects.delete(gone)  # its sampler read the reply
    now[0] = LEFTOVER_S
    assert intake.poll() == 0
    assert list(intake.answered) == [left]
    assert [o.key for o in objects.list("up/")] == [left]
    now[0] = LEFTOVER_S + 0.5
    assert intake.poll() == 0
    assert intake.answered == {}
    assert objects.list("up/") == []  # left behind: deleted
    assert live.loop.intake.counters.accepted == 2  # each answered once


class FolderAtDelete(MemoryStore):
    """A store where every object turns out a folder when deleted (swapped after it was listed and answered)."""

    def delete(self, key: str) -> None:
        raise ObjectNotRegular(key, "folder", "a folder where the object was")


@pytest.mark.usefixtures("varied_reward")
def test_a_left_behind_upload_that_became_a_folder_is_counted_not_fatal(tmp_path: Path, tiny_model_dir: Path) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, "learner.steps=2")
    objects, now = FolderAtDelete(), [0.0]
    intake = StoreIntake(objects, live.loop, live.cfg.live.max_body_bytes, 8, clock=lambda: now[0])
    (group,) = sample_groups(live, tiny_model_dir, 1)
    put_upload(objects, live, [encode_group(group)], 0)
    assert intake.poll() == 1
    now[0] = LEFTOVER_S + 1
    assert intake.poll() == 0  # the pass goes on
    assert intake.counts["not_regular"] == 1
    assert intake.answered == {}


class SlowReads:
    """The store behind it, each GET taking `seconds` (a store across a link): counts how many run at once."""

    def __init__(self, objects, seconds: float) -> None:
        self.objects, self.seconds = objects, seconds
        self.running = self.most = 0
        self.lock = threading.Lock()

    def get(self, key: str, max_bytes: int) -> bytes:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(self.seconds)
            return self.objects.get(key, max_bytes)
        finally:
            with self.lock:
                self.running -= 1

    def __getattr__(self, name: str):
        return getattr(self.objects, name)


@pytest.mark.usefixtures("varied_reward")
def test_workers_serve_sessions_at_once_each_in_order_with_the_serial_verdicts(
    tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]
) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, *store_overrides, "learner.steps=2")
    objects = opened(live)
    groups = [encode_group(g) for g in sample_groups(live, tiny_model_dir, 6)]
    slow = SlowReads(objects, 0.2)
    intake = intake_of(live, slow, workers=3)
    sessions = ("s0", "s1", "s2")
    for i, session in enumerate(sessions):
        put_upload(objects, live, [groups[2 * i]], 0, session)
        put_upload(objects, live, [groups[2 * i + 1], groups[2 * i]], 1, session)  # the second group again
    started = time.monotonic()
    assert intake.poll() == 6
    took = time.monotonic() - started
    intake.close()
    assert slow.most == 3  # the three sessions at once
    assert took < 6 * 0.2  # less than one GET after another
    for session in sessions:  # each session in order: its repeated group is the duplicate in its second upload
        assert (outcomes(objects, 0, session), outcomes(objects, 1, session)) == (
            ["accepted"],
            ["accepted", "duplicate"],
        )
    assert dict(intake.counts) == {"answered": 6}
    assert len(objects.list("up/")) == 6
    assert intake.poll() == 0


class SlowStore(MemoryStore):
    """A store 40 ms away (every call sleeps first) that logs what it was asked, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def _slow(self, op: str, key: str) -> None:
        time.sleep(0.04)
        with self._lock:
            self.calls.append((op, key))

    def get(self, key: str, max_bytes: int) -> bytes:
        self._slow("get", key)
        return super().get(key, max_bytes)

    def put(self, key: str, data: bytes) -> None:
        super().put(key, data)
        self._slow("put", key)

    def delete(self, key: str) -> None:
        self._slow("delete", key)
        super().delete(key)


@pytest.mark.usefixtures("varied_reward")
def test_io_threads_take_the_store_off_the_judging_path_and_change_no_answer(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """Eight uploads of one session, through a store 40 ms away: judged inline, each costs a read and a reply one
    after another (~0.7 s in all); with I/O threads the reads and the replies overlap the judging. The
    answers, the order the groups are queued in, and "the learner deletes no upload" are the same both ways."""
    groups = sample_groups(make_live(tmp_path / "g", tiny_model_dir, REWARD), tiny_model_dir, 8)
    bodies = [encode_group(g) for g in groups]
    runs = {}
    for io_threads in (0, 8):
        live = make_live(tmp_path / f"run{io_threads}", tiny_model_dir, REWARD, *ROLLOUTS, "learner.steps=2")
        objects = SlowStore()
        keys = [put_upload(objects, live, [body], seq) for seq, body in enumerate(bodies)]
        objects.calls.clear()
        intake = StoreIntake(objects, live.loop, live.cfg.live.max_body_bytes, 8, io_threads=io_threads)
        began = time.monotonic()
        assert intake.poll() == 8
        seconds = time.monotonic() - began
        intake.close()
        replies = [outcomes(objects, seq) for seq in range(8)]
        queued = [g.group_id for g in live.loop.intake.buffer.groups]
        assert [op for op, _ in objects.calls if op == "delete"] == []  # the samplers delete their uploads
        assert sorted(intake.answered) == keys
        runs[io_threads] = (seconds, replies, queued)
    (inline_s, inline_replies, inline_order), (threaded_s, replies, order) = runs[0], runs[8]
    assert replies == inline_replies == [["accepted"]] * 8
    assert order == inline_order == [g.group_id for g in groups]  # judged in the session's order
    assert inline_s > 2 * 8 * 0.04  # read and reply of every upload, one after another
    assert threaded_s < inline_s / 2, (threaded_s, inline_s)
