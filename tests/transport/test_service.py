"""The learner's HTTP service in process: every refusal, of a whole upload or of one group in it, gets its status
code and is counted (status and metrics), the weights route serves updates a receiver verifies, and the learner
keeps training afterwards."""

from __future__ import annotations

import asyncio
import copy
import io
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from conftest import tiny_config
from heterorl.eventlog import EventLog
from heterorl.live.learner_node import LiveLearner, open_learner
from heterorl.loop.intake import REASONS, body_digest
from heterorl.loop.protocol import Reply, Upload
from heterorl.metrics import read_metrics
from heterorl.policy import Policy, SamplingParams
from heterorl.rollout import RolloutGroup
from heterorl.rollout_codec import encode_group
from heterorl.run.run_dir import prepare_run_dir
from heterorl.sampler import Sampler
from heterorl.tasks import make_task
from heterorl.transport.http.service import build_app
from heterorl.transport.wire import decode_reply, encode_upload
from heterorl.weights import WeightReceiver
from heterorl.weights.envelope import EnvelopeError, decode_update, encode_update

TOKEN = "test-token-" + "x" * 24
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REWARD_MODULE = "heterorl_live_test_reward"
REWARD = f"task.reward={REWARD_MODULE}:length"


@pytest.fixture
def varied_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A reward that differs within a group (completion length), so a random tiny model gets gradients."""
    source = "def length(prompt, completion, answer, **info):\n    return float(len(completion))\n"
    (tmp_path / f"{REWARD_MODULE}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, REWARD_MODULE, raising=False)
    return REWARD


def make_live(run_dir: Path, model_dir: Path, *overrides: str, events: EventLog | None = None) -> LiveLearner:
    cfg = tiny_config(model_dir, "live.fsync=false", "live.max_body_bytes=4096", *overrides)
    run_dir = prepare_run_dir(cfg, run_dir)
    live = open_learner(cfg, run_dir, str(model_dir), events=events or EventLog(io.StringIO()))
    live.loop.start()
    return live


def sample_groups(live: LiveLearner, model_dir: Path, n: int, seed: int = 1) -> list[RolloutGroup]:
    cfg = live.cfg
    params = SamplingParams.from_config(cfg.sampler)
    sampler = Sampler.from_policy(
        "sampler-0", Policy.load(model_dir), make_task(cfg.task), params, cfg.sampler.group_size, seed
    )
    sampler.load_weights(live.loop.learner.version, live.loop.learner.export_weights())
    return sampler.generate_groups(n)


def tampered(group: RolloutGroup, change: Callable[[RolloutGroup], None]) -> bytes:
    bad = copy.deepcopy(group)
    bad.group_id += "-tampered"
    change(bad)
    return encode_group(bad)


@pytest.fixture
def live(tmp_path: Path, tiny_model_dir: Path, varied_reward: str) -> Iterator[LiveLearner]:
    live = make_live(tmp_path / "run", tiny_model_dir, varied_reward, "learner.steps=2")
    yield live
    live.request_stop()
    live.loop.intake.journal.close()


def upload(
    bodies: list[bytes],
    digests: list[str] | None = None,
    sampler: str = "sampler-0",
    seq: int = 0,
    fingerprint: dict[str, str] | None = None,
) -> bytes:
    """One upload of `bodies` (with their digests, unless given) from a session of `sampler` whose config has
    `fingerprint` (the learner's, for a sampler that agrees with it; `LearnerLoop.fingerprint`)."""
    digests = digests if digests is not None else [body_digest(b) for b in bodies]
    up = Upload(sampler, "test", seq, 0, groups=tuple(bodies), digests=tuple(digests), fingerprint=fingerprint or {})
    return encode_upload(up)


async def answer(response) -> tuple[int, Reply]:
    return response.status, decode_reply(await response.read())


def _set(name: str, index: tuple[int, ...], value: float) -> Callable[[RolloutGroup], None]:
    def change(g: RolloutGroup) -> None:
        getattr(g, name)[index] = value

    return change


def test_every_refusal_has_its_status_is_counted_and_training_goes_on(live: LiveLearner, tiny_model_dir: Path):
    groups = sample_groups(live, tiny_model_dir, 6)
    good = [encode_group(g) for g in groups]
    vocab = live.loop.learner.policy.model.config.vocab_size
    fp = live.loop.fingerprint
    one = upload([good[0]], fingerprint=fp)
    # whole uploads refused: (expected reason, status, headers, body)
    whole: list[tuple[str, int, dict[str, str], bytes]] = [
        ("unauthorized", 401, {}, one),
        ("unauthorized", 401, {"Authorization": "Bearer wrong-token-wrong-token"}, one),
        ("unauthorized", 401, {"Authorization": TOKEN}, one),  # no Bearer scheme
        ("too_large", 413, AUTH, b"x" * 9000),
        ("malformed", 400, AUTH, b"not an upload"),
        ("malformed", 400, AUTH, one[:-3]),
        ("unknown_sampler", 403, AUTH, upload([good[0]], sampler="intruder", fingerprint=fp)),
    ]

    def drop_row(g: RolloutGroup) -> None:
        for name in ("completion_ids_GL", "completion_mask_GL", "behavior_logp_GL", "version_GL", "rewards_G"):
            setattr(g, name, getattr(g, name)[1:])

    other = copy.deepcopy(groups[0])
    other.sampler_id, other.group_id = "sampler-1", "sampler-1:1"
    # one bad group in an upload: (expected outcome, status, its bytes, its digest or None)
    bad: list[tuple[str, int, bytes, str | None]] = [
        ("corrupt", 400, good[0], body_digest(good[1])),
        ("out_of_vocab", 422, tampered(groups[0], _set("completion_ids_GL", (0, 0), vocab)), None),
        ("bad_logprobs", 422, tampered(groups[0], _set("behavior_logp_GL", (1, 0), float("nan"))), None),
        ("bad_logprobs", 422, tampered(groups[0], _set("behavior_logp_GL", (1, 0), float("inf"))), None),
        ("future_version", 422, tampered(groups[0], _set("version_GL", (0, 0), 7)), None),
        ("bad_rewards", 422, tampered(groups[0], _set("rewards_G", (0,), float("nan"))), None),
        ("group_size", 422, tampered(groups[0], drop_row), None),
        ("invalid", 422, encode_group(other), None),  # a group of another sampler
    ]
    trainer = threading.Thread(target=live.train, daemon=True)

    async def scenario() -> dict:
        async with TestClient(TestServer(build_app(live, TOKEN))) as client:
            for reason, status, headers, body in whole:
                got = await answer(await client.post("/v1/exchange", data=body, headers=headers))
                assert (got[0], got[1].refused) == (status, reason), reason
            for seq, (outcome, status, body, digest) in enumerate(bad):
                sent = upload([body], None if digest is None else [digest], seq=seq, fingerprint=fp)
                code, reply = await answer(await client.post("/v1/exchange", data=sent, headers=AUTH))
                assert (code, reply.verdicts[0].outcome) == (status, outcome), outcome

            async def chunks():  # no Content-Length: the server's own size limit must catch it
                for _ in range(5):
                    yield b"y" * 2000

            r = await client.post("/v1/exchange", data=chunks(), headers=AUTH)
            assert r.status == 413
            r = await client.get("/v1/weights")
            assert r.status == 401
            r = await client.get("/v1/weights", params={"version": "abc"}, headers=AUTH)
            assert r.status == 400

            trainer.start()
            code, reply = await answer(
                await client.post("/v1/exchange", data=upload(good, seq=100, fingerprint=fp), headers=AUTH)
            )
            assert code == 200
            assert [v.outcome for v in reply.verdicts] == ["accepted"] * 6
            code, reply = await answer(
                await client.post("/v1/exchange", data=upload(good[:1], seq=100, fingerprint=fp), headers=AUTH)
            )
            assert (code, reply.verdicts[0].outcome) == (200, "duplicate")  # a retried upload
            deadline = time.monotonic() + 30
            while live.loop.learner.version < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            r = await client.get("/v1/status")  # public: no token
            return await r.json()

    status = asyncio.run(scenario())
    expected = {"unauthorized": 4, "too_large": 2, "malformed": 3, "corrupt": 1, "out_of_vocab": 1, "invalid": 1}
    expected |= {"bad_logprobs": 2, "future_version": 1, "bad_rewards": 1, "group_size": 1, "unknown_sampler": 1}
    assert status["rejected"] == expected
    assert set(expected) <= set(REASONS)
    assert status["steps"] >= 1
    assert status["accepted"] == 6
    assert status["duplicates"] == 1
    live.request_stop()
    trainer.join(timeout=60)
    assert not trainer.is_alive()
    train = [r for r in read_metrics(live.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert train[0]["step"] == 1
    for reason, count in expected.items():
        assert train[0][f"net/rejected_{reason}"] == count, reason
    assert train[0]["net/rejected_too_long"] == 0


def test_weights_route_serves_updates_a_receiver_verifies(tmp_path: Path, tiny_model_dir: Path, varied_reward: str):
    live = make_live(tmp_path / "run", tiny_model_dir, varied_reward, "weights.codec=pulse")
    groups = sample_groups(live, tiny_model_dir, live.cfg.learner.groups_per_step)
    receiver = WeightReceiver()

    def train_and_publish() -> None:
        time.sleep(0.2)
        live.loop.learner.train_step(groups)
        live.loop.publish()

    async def scenario() -> None:
        async with TestClient(TestServer(build_app(live, TOKEN))) as client:
            r = await client.get("/v1/weights", headers=AUTH)
            assert r.status == 200
            first = decode_update(await r.read())
            assert first.kind == "snapshot"
            assert receiver.apply(first)
            assert (receiver.version, receiver.state_hash) == (0, live.loop.store.latest_hash)
            held = {"version": "0", "hash": receiver.state_hash, "wait": "0", "sampler": "sampler-0", "idle": "0.5"}
            r = await client.get("/v1/weights", params=held, headers=AUTH)
            assert r.status == 204
            # a long-poll is answered as soon as the next version is published
            worker = threading.Thread(target=train_and_publish)
            worker.start()
            began = time.monotonic()
            r = await client.get("/v1/weights", params={**held, "wait": "30"}, headers=AUTH)
            assert r.status == 200
            assert time.monotonic() - began < 20
            worker.join()
            update = decode_update(await r.read())
            assert (update.kind, update.base_version, update.version) == ("patch", 0, 1)
            assert update.state_hash != first.state_hash  # training changed the weights
            # a corrupted patch is refused and leaves the weights as they were; the next update is a snapshot
            broken = bytearray(update.patch or b"")
            broken[len(broken) // 2] ^= 0xFF
            damaged = type(update)(**{**vars(update), "patch": bytes(broken)})
            with pytest.raises(EnvelopeError, match="checksum"):  # refused on the wire already
                decode_update(encode_update(damaged))
            before = {k: v.clone() for k, v in (receiver.weights or {}).items()}
            assert not receiver.apply(damaged)
            assert all(torch.equal(before[k], v) for k, v in (receiver.weights or {}).items())
            assert receiver.held() == (None, None)
            r = await client.get("/v1/weights", headers=AUTH)
            again = decode_update(await r.read())
            assert again.kind == "snapshot"
            assert receiver.apply(again)
            assert (receiver.version, receiver.state_hash) == (1, live.loop.store.latest_hash)

    asyncio.run(scenario())
    assert live.loop.peers.snapshot()["sampler-0"].idle == 0.5


def test_envelope_rejects_damaged_framing() -> None:
    from heterorl.weights import WeightStore

    store = WeightStore.from_config(tiny_config(Path("unused"), "weights.codec=pulse").weights)
    weights = {"w": torch.arange(64, dtype=torch.float32).to(torch.bfloat16)}
    held = store.publish(2, weights).state_hash
    store.publish(3, {"w": weights["w"] + 1})
    update = store.update_for(2, held)
    body = encode_update(update)
    assert decode_update(body).patch == update.patch
    for bad in (body[:-1], body + b"x", b"XXXXXXXX" + body[8:], body[:13] + b"!" + body[14:]):
        with pytest.raises(EnvelopeError):
            decode_update(bad)


def test_envelope_header_must_agree_with_its_blobs() -> None:
    """A header that promises another version, hash or base than the blobs carry is refused before any apply."""
    from heterorl.framing import frame
    from heterorl.weights import WeightStore
    from heterorl.weights.envelope import MAGIC

    store = WeightStore.from_config(tiny_config(Path("unused"), "weights.codec=pulse").weights)
    weights = {"w": torch.arange(64, dtype=torch.float32).to(torch.bfloat16)}
    hashes = [store.publish(v, {"w": weights["w"] + v}).state_hash for v in range(3)]
    patch, snap = store.update_for(1, hashes[1]), store.update_for(None, None)
    assert (patch.kind, snap.kind) == ("patch", "snapshot")
    for update in (patch, snap):
        head = {
            "version": update.version,
            "state_hash": update.state_hash,
            "base_version": update.base_version,
            "kind": update.kind,
            "snapshot_nbytes": len(update.snapshot or b""),
            "patch_nbytes": len(update.patch or b""),
        }
        blobs = (update.snapshot or b"") + (update.patch or b"")
        assert decode_update(frame(MAGIC, head, blobs)).version == 2
        for lie in ({"version": 3}, {"state_hash": "ab" * 16}, {"base_version": 0}):
            if update.kind == "snapshot" and "base_version" in lie:
                continue  # a snapshot update starts nowhere
            with pytest.raises(EnvelopeError):
                decode_update(frame(MAGIC, {**head, **lie}, blobs))
