"""Identities on the store transport: with `trust.credentials`, the learner answers an upload only when the sampler
whose prefix it sits under signed it with its registered Ed25519 key; an unsigned upload, one signed with another
key or written under another sampler's prefix is refused `unauthorized`, a revoked sampler's `revoked` (its session
stops), and nothing of a refused upload reaches the intake. The other way, a sampler holding the learner's public
key believes only replies the learner signed for that upload."""

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
from heterorl.loop.protocol import Reply, Upload
from heterorl.rollout_codec import encode_group
from heterorl.transport.backoff import Backoff
from heterorl.transport.identity import CredentialRegistry, add_sampler, revoke_sampler, sign_reply, sign_upload
from heterorl.transport.store.intake import StoreIntake, reply_key, upload_key
from heterorl.transport.store.objects import ObjectMissing
from heterorl.transport.store.sampler import MAX_FORGED_REPLIES, StoreSamplerSide
from heterorl.transport.wire import encode_reply, encode_upload
from heterorl.weights.signing import Authority
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


@pytest.mark.usefixtures("varied_reward")
def test_a_reply_the_learner_did_not_sign_is_not_believed(
    tmp_path: Path, tiny_model_dir: Path, store_overrides: list[str]
) -> None:
    """With the learner's key, whoever can write the store cannot answer an upload in the learner's place: an
    unsigned reply, one signed with another key and the learner's own reply to another upload are each deleted and
    counted, the upload goes again, and the learner's signed verdict arrives; a forger who keeps answering gets the
    upload given up, never believed."""
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, *ROLLOUTS, *store_overrides, "learner.steps=2")
    objects, cfg = opened(live), live.cfg
    learner_key, other_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    intake = StoreIntake(
        objects, live.loop, cfg.live.max_body_bytes, cfg.cluster.groups_per_upload, signing_key=learner_key
    )
    groups = [encode_group(g) for g in sample_groups(live, tiny_model_dir, 6)]
    backoff = Backoff(0.01, 0.05, random.Random(0))
    args = (objects, cfg.transport.store, cfg.live, "sampler-0", "b00t", backoff, EventLog(io.StringIO()))

    def upload_of(seq: int) -> Upload:
        body = groups[seq]
        digests = (body_digest(body),)
        return Upload("sampler-0", "b00t", seq, 0, groups=(body,), digests=digests, fingerprint=fingerprint(cfg))

    def present(key: str) -> bool:
        try:
            objects.get(key, 1 << 20)
        except ObjectMissing:
            return False
        return True

    refusal = encode_reply(Reply(seq=0, refused="revoked", detail="forged"))
    forgeries = {
        "unsigned": lambda seq: refusal,
        "another key": lambda seq: sign_reply(other_key, "sampler-0", "b00t", seq, refusal),
        "another upload's": lambda seq: sign_reply(learner_key, "sampler-0", "b00t", seq + 1, refusal),
    }

    async def exchange(seq: int, forge, *, learner_answers: bool) -> tuple[Reply, int]:
        side = StoreSamplerSide(*args, lambda p: p, lambda: (None, 0), authority=Authority(learner_key.public_key()))
        key = reply_key("sampler-0", "b00t", seq)
        objects.put(key, forge(seq))  # there before the sampler looks
        replies: list = []
        side.exchange(upload_of(seq), replies.append)
        while not replies:
            if side.uploads["forged_reply"] >= 1 and learner_answers:
                await asyncio.to_thread(intake.poll)
            elif not learner_answers and not present(key):
                objects.put(key, forge(seq))  # the forger answers every time
            await asyncio.sleep(0.02)
        side.close()
        return replies[0], side.uploads["forged_reply"]

    try:
        for seq, forge in enumerate(forgeries.values()):
            reply, forged = asyncio.run(exchange(seq, forge, learner_answers=True))
            assert [v.outcome for v in reply.verdicts] == ["accepted"], reply
            assert forged == 1
        assert live.loop.intake.counters.accepted == 3
        # the learner answered, then its reply was overwritten: the upload goes again, its retry cache answers
        objects.put(upload_key("sampler-0", "b00t", 4, encode_upload(upload_of(4))), encode_upload(upload_of(4)))
        intake.poll()
        reply, forged = asyncio.run(exchange(4, forgeries["unsigned"], learner_answers=True))
        assert ([v.outcome for v in reply.verdicts], forged) == (["accepted"], 1)
        assert live.loop.intake.counters.accepted == 4
        reply, forged = asyncio.run(exchange(3, forgeries["unsigned"], learner_answers=False))
        assert (reply.refused, forged) == ("malformed", MAX_FORGED_REPLIES + 1)
        assert live.loop.intake.counters.accepted == 4  # the learner never answered it: nothing was believed

        # a sampler that was not given the learner's key still reads its signed replies
        async def keyless() -> Reply:
            side = StoreSamplerSide(*args, lambda p: p, lambda: (None, 0))
            replies: list = []
            side.exchange(upload_of(5), replies.append)  # (3's reply key may still hold a forgery: a new upload)
            while not replies:
                await asyncio.to_thread(intake.poll)
                await asyncio.sleep(0.02)
            side.close()
            return replies[0]

        assert [v.outcome for v in asyncio.run(keyless()).verdicts] == ["accepted"]
    finally:
        live.loop.intake.journal.close()
