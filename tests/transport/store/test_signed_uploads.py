"""Identities on the store transport: with `trust.credentials`, the learner answers an upload only when the sampler
whose prefix it sits under signed it with its registered Ed25519 key; an unsigned upload, one signed with another
key or written under another sampler's prefix is refused `unauthorized`, a revoked sampler's `revoked` (its session
stops), and nothing of a refused upload reaches the intake."""

from __future__ import annotations

import asyncio
import io
import random
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from heterorl.config.fingerprint import fingerprint
from heterorl.eventlog import EventLog
from heterorl.loop.intake import body_digest
from heterorl.loop.protocol import Upload
from heterorl.rollout_codec import encode_group
from heterorl.transport.backoff import Backoff
from heterorl.transport.identity import CredentialRegistry, add_sampler, revoke_sampler, sign_upload
from heterorl.transport.store.intake import StoreIntake, upload_key
from heterorl.transport.store.sampler import StoreSamplerSide
from heterorl.transport.wire import encode_upload
from transport.store.test_rollouts import ROLLOUTS, opened, outcomes
from transport.test_service import REWARD, make_live, sample_groups, varied_reward  # noqa: F401 (a fixture)


@pytest.mark.usefixtures("varied_reward")
def test_store_uploads_must_be_signed_by_their_samplers_key(
    tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]
) -> None:
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, *store_overrides, "learner.steps=2")
    objects = opened(live)
    credentials = tmp_path / "credentials.yaml"
    mine, theirs = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    add_sampler(credentials, "sampler-0", key=mine)
    add_sampler(credentials, "sampler-1", key=theirs)
    cfg = live.cfg
    intake = StoreIntake(
        objects, live.loop, cfg.live.max_body_bytes, cfg.cluster.groups_per_upload, CredentialRegistry(credentials)
    )
    groups = [encode_group(g) for g in sample_groups(live, tiny_model_dir, 4)]

    def upload_of(seq: int, body: bytes) -> Upload:
        digests = (body_digest(body),)
        return Upload("sampler-0", "b00t", seq, 0, groups=(body,), digests=digests, fingerprint=fingerprint(cfg))

    def upload(seq: int, body: bytes) -> bytes:
        return encode_upload(upload_of(seq, body))

    def put(seq: int, data: bytes) -> None:
        objects.put(upload_key("sampler-0", "b00t", seq, data), data)

    try:
        put(0, upload(0, groups[0]))  # unsigned
        put(1, sign_upload(theirs, "sampler-0", "b00t", 1, upload(1, groups[1])))  # another sampler's key
        put(2, sign_upload(mine, "sampler-0", "b00t", 3, upload(2, groups[2])))  # signed for another seq
        intake.poll()
        assert [outcomes(objects, seq) for seq in range(3)] == ["unauthorized"] * 3
        assert live.loop.intake.counters.accepted == 0
        # the sampler's own side signs with its key: accepted; then revoked, it is refused from the next upload on
        backoff = Backoff(0.01, 0.05, random.Random(0))
        args = (objects, cfg.transport.store, cfg.live, "sampler-0", "b00t", backoff, EventLog(io.StringIO()))

        async def exchange(seq: int, body: bytes) -> list:
            side = StoreSamplerSide(*args, lambda p: p, lambda: (None, 0), signing_key=mine)
            replies: list = []
            side.exchange(upload_of(seq, body), replies.append)
            while not replies:
                await asyncio.to_thread(intake.poll)
                await asyncio.sleep(0.05)
            side.close()
            return replies

        (reply,) = asyncio.run(exchange(3, groups[3]))
        assert [v.outcome for v in reply.verdicts] == ["accepted"]
        revoke_sampler(credentials, "sampler-0")
        (reply,) = asyncio.run(exchange(4, groups[0]))
        assert reply.refused == "revoked"
        rejected = live.loop.intake.counters_json()["rejected"]
        assert (rejected["unauthorized"], rejected["revoked"]) == (3, 1)
        assert live.loop.intake.counters.accepted == 1
    finally:
        live.loop.intake.journal.close()
