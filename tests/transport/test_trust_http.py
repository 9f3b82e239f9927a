"""Identities and signed weights on the HTTP transport, through the learner's real service and a sampler's real
client: each sampler's own token binds its requests to its name, a revoked one is refused from the next request
on (and the sampler stops), and the weights it serves are signed so that a sampler with the learner's public key
applies them and a sampler holding another key, or an unsigned update, changes nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import random
from pathlib import Path

import pytest
import torch
from aiohttp.test_utils import TestClient, TestServer

from heterorl.config.fingerprint import fingerprint
from heterorl.eventlog import EventLog
from heterorl.loop.intake import body_digest
from heterorl.loop.protocol import Upload
from heterorl.loop.worker import SamplerWorker
from heterorl.policy import Policy, SamplingParams
from heterorl.rollout_codec import encode_group
from heterorl.sampler import Sampler
from heterorl.tasks import make_task
from heterorl.transport.http.auth import Gate
from heterorl.transport.http.client import AuthError, LearnerClient
from heterorl.transport.http.service import build_app
from heterorl.transport.identity import CredentialRegistry, add_sampler, revoke_sampler
from heterorl.transport.wire import decode_reply, encode_upload
from heterorl.weights.envelope import decode_update
from heterorl.weights.signing import write_keypair
from transport.test_service import AUTH, REWARD, TOKEN, make_live, sample_groups, varied_reward  # noqa: F401

pytestmark = pytest.mark.usefixtures("varied_reward")


def ready(live):
    """The learner, once its first version is published (the publisher runs in the background)."""
    live.loop.publisher.result()
    return live


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def upload(cfg, bodies: list[bytes], seq: int = 0) -> bytes:
    """One upload of sampler-0's session "test", with the config's fingerprint."""
    digests = tuple(body_digest(b) for b in bodies)
    return encode_upload(
        Upload("sampler-0", "test", seq, 0, groups=tuple(bodies), digests=digests, fingerprint=fingerprint(cfg))
    )


def test_each_sampler_acts_only_as_itself_and_a_revoked_one_is_refused_at_once(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    live = ready(make_live(tmp_path / "run", tiny_model_dir, REWARD, "live.max_body_bytes=100000"))
    credentials = tmp_path / "credentials.yaml"
    mine, theirs = add_sampler(credentials, "sampler-0"), add_sampler(credentials, "sampler-1")
    assert mine is not None
    assert theirs is not None
    gate = Gate(credentials=CredentialRegistry(credentials))
    good = [encode_group(g) for g in sample_groups(live, tiny_model_dir, 2)]

    async def scenario() -> None:
        async with TestClient(TestServer(build_app(live, gate))) as client:
            r = await client.post("/v1/exchange", data=upload(live.cfg, good[:1]), headers=bearer(mine))
            assert (r.status, [v.outcome for v in decode_reply(await r.read()).verdicts]) == (200, ["accepted"])
            # another sampler's token cannot upload as sampler-0, nor pull as it; the run's shared token is no key
            details = []
            for headers in (bearer(theirs), AUTH):
                r = await client.post("/v1/exchange", data=upload(live.cfg, good[1:], seq=1), headers=headers)
                reply = decode_reply(await r.read())
                assert (r.status, reply.refused) == (401, "unauthorized")
                details.append(reply.detail)
            assert details == ["the credential of 'sampler-1' cannot act as 'sampler-0'", ""]
            r = await client.get("/v1/weights", params={"sampler": "sampler-0"}, headers=bearer(theirs))
            assert r.status == 401
            r = await client.get("/v1/weights", params={"sampler": "sampler-0"}, headers=bearer(mine))
            assert r.status == 200
            revoke_sampler(credentials, "sampler-0")  # no restart, no signal: the next request sees it
            r = await client.post("/v1/exchange", data=upload(live.cfg, good[1:], seq=1), headers=bearer(mine))
            assert (r.status, decode_reply(await r.read()).refused) == (403, "revoked")
            r = await client.get("/v1/weights", params={"sampler": "sampler-0"}, headers=bearer(mine))
            assert r.status == 403
            # what the sampler's own client makes of it: the exchange reply says revoked (its session stops,
            # tests/loop/test_session.py), a weight pull raises, naming the reason
            url = str(client.make_url("")).rstrip("/")
            events = EventLog(io.StringIO())
            async with LearnerClient(url, mine, live.cfg.live, "sampler-0", "s", random.Random(0), events) as lc:
                with pytest.raises(AuthError, match="'revoked'"):
                    await lc.pull((None, None), 0.0, None, 0)
            # the other sampler goes on: its token still pulls (it is not in this run's cluster, so it cannot upload)
            r = await client.get("/v1/weights", params={"sampler": "sampler-1"}, headers=bearer(theirs))
            assert r.status == 200

    try:
        asyncio.run(scenario())
        rejected = live.loop.intake.counters_json()["rejected"]
        assert (rejected["unauthorized"], rejected["revoked"]) == (3, 3)
        assert live.loop.intake.counters.accepted == 1
    finally:
        live.loop.intake.journal.close()


def worker_for(cfg, model_dir: Path) -> SamplerWorker:
    params = SamplingParams.from_config(cfg.sampler)
    policy = Policy.load(model_dir)
    return SamplerWorker(cfg, 0, Sampler.from_policy("sampler-0", policy, make_task(cfg.task), params, 4, seed=1))


def test_weights_served_over_http_are_signed_and_only_the_learners_key_lets_a_worker_apply_them(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    private, public = write_keypair(tmp_path / "keys")
    _, other_public = write_keypair(tmp_path / "other")
    live = ready(make_live(tmp_path / "run", tiny_model_dir, REWARD, f"trust.learner_private_key={private}"))
    honest = worker_for(
        live.cfg.model_copy(
            update={
                "trust": live.cfg.trust.model_copy(
                    update={"learner_private_key": None, "learner_public_key": str(public)}
                )
            }
        ),
        tiny_model_dir,
    )
    fooled = worker_for(
        live.cfg.model_copy(
            update={
                "trust": live.cfg.trust.model_copy(
                    update={"learner_private_key": None, "learner_public_key": str(other_public)}
                )
            }
        ),
        tiny_model_dir,
    )

    async def pull() -> bytes:
        async with TestClient(TestServer(build_app(live, TOKEN))) as client:
            r = await client.get("/v1/weights", params={"sampler": "sampler-0"}, headers=AUTH)
            assert r.status == 200
            return await r.read()

    try:
        update = decode_update(asyncio.run(pull()))
        assert update.signatures is not None
        assert update.signatures.epoch == 0 == live.loop.resumes
        assert len(update.signatures.blobs) == len(update.blobs)
        assert not fooled.receive(update)  # signed, but not by the key it holds
        assert fooled.receiver.refusals == {"bad_signature": 1}
        assert fooled.receiver.weights is None
        unsigned = dataclasses.replace(update, signatures=None)
        assert not honest.receive(unsigned)
        assert honest.receiver.refusals == {"unsigned": 1}
        assert honest.receiver.weights is None
        assert honest.receive(update)
        assert honest.receiver.version == 0
        published = live.loop.published_weights
        assert all(torch.equal(honest.receiver.weights[n], t) for n, t in published.items())
    finally:
        live.loop.intake.journal.close()


def test_a_learner_without_a_key_serves_unsigned_weights_a_keyless_worker_applies(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    live = ready(make_live(tmp_path / "run", tiny_model_dir, REWARD))

    async def pull() -> bytes:
        async with TestClient(TestServer(build_app(live, TOKEN))) as client:
            r = await client.get("/v1/weights", headers=AUTH)
            return await r.read()

    try:
        update = decode_update(asyncio.run(pull()))
        assert update.signatures is None
        worker = worker_for(live.cfg, tiny_model_dir)
        assert worker.receive(update)
        assert worker.receiver.version == 0
    finally:
        live.loop.intake.journal.close()
