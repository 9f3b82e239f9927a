"""Which transports a live process uses, from `transport:` in the config: the learner's HTTP service, an object
store, or a mix (docs/deployment.md).

The learner always serves HTTP (status; and the conversation when something travels over HTTP). With weights and
rollouts through the store it needs no inbound connection from samplers: admission travels in the store's replies
like everything else, and a store-only sampler learns that the run is over from the store's `finished` marker.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from heterorl.config import RunConfig
from heterorl.eventlog import EventLog
from heterorl.live.preflight import LiveSetupError
from heterorl.loop.session import SamplerSession
from heterorl.loop.worker import SamplerWorker
from heterorl.run.build import sampler_seed
from heterorl.transport.backoff import Backoff
from heterorl.transport.base import SamplerSide, Split
from heterorl.transport.emulation import EmulatedSide
from heterorl.transport.http.client import LearnerClient
from heterorl.transport.http.sampler import HttpSamplerSide
from heterorl.transport.store.learner import StoreLearnerSide
from heterorl.transport.store.manifest import MANIFEST_KEY, SAMPLERS, UPLOADS
from heterorl.transport.store.objects import StoreSetupError, open_store
from heterorl.transport.store.sampler import StoreSamplerSide
from heterorl.weights import merge_patches
from heterorl.weights.signing import authority_from, signing_key_from

if TYPE_CHECKING:
    from heterorl.live.learner_node import LiveLearner

_KEY_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


def sampler_needs_http(cfg: RunConfig) -> str | None:
    """Why a sampler of `cfg` needs the learner's URL, or None if it talks only to the store."""
    t = cfg.transport
    if t.weights == "http":
        return "transport.weights is http"
    if t.rollouts == "http":
        return "transport.rollouts is http"
    return None


def check_transport_config(cfg: RunConfig) -> None:
    """Store settings a live process cannot run without (one line each)."""
    t = cfg.transport
    if not t.uses_store:
        return
    if t.store.url is None:
        raise LiveSetupError(
            "transport.store.url is required when transport.weights or transport.rollouts is 'store' "
            "(file:///shared/dir or s3://bucket/prefix)"
        )
    for i, name in enumerate(cfg.cluster.sampler_names()):
        if not _KEY_NAME.match(name):
            raise LiveSetupError(
                f"cluster.samplers.{i}.name {name!r}: with a store, names may hold only A-Z a-z 0-9 . _ -"
            )


def open_learner_store(live: LiveLearner, resume: bool) -> StoreLearnerSide | None:
    """The learner's store side (None without a store); checks the store first, failing with one line."""
    cfg = live.cfg
    if not cfg.transport.uses_store:
        return None
    check_transport_config(cfg)
    objects = open_store(cfg.transport.store)
    try:
        objects.check(MANIFEST_KEY.rsplit("/", 1)[0] + "/", f"probe-{live.loop.learner.version}")
        return StoreLearnerSide(
            cfg,
            live.loop,
            objects,
            resume=resume,
            is_finished=lambda: live.finished,
            events=live.events,
            on_finished=lambda: live.told_finished.update(live.loop.peers.connected(cfg.live.connected_seconds)),
            on_failed=live.request_stop,
        )
    except StoreSetupError as err:
        raise LiveSetupError(str(err)) from None


@asynccontextmanager
async def open_sampler_side(
    cfg: RunConfig,
    worker: SamplerWorker,
    url: str | None,
    token: str | None,
    session_id: str,
    events: EventLog,
    session: SamplerSession,
) -> AsyncIterator[tuple[SamplerSide, dict[str, Any] | None]]:
    """The sampler's transport as configured, and the learner's status when it is reachable over HTTP (None
    otherwise); closed on exit."""
    t, name, seed = cfg.transport, worker.name, sampler_seed(cfg.seed, worker.index)
    reports = lambda: (session.idle, worker.failed)  # noqa: E731
    client = None
    if url is not None and token is not None:
        client = LearnerClient(url, token, cfg.live, name, session_id, random.Random(seed), events)
    store_side = None
    if t.uses_store:
        objects = open_store(t.store)
        try:
            objects.check(f"{UPLOADS}{name}/" if t.rollouts == "store" else SAMPLERS, f"{SAMPLERS}{name}.probe")
        except StoreSetupError as err:
            raise LiveSetupError(str(err)) from None
        backoff = Backoff(cfg.live.backoff_initial_s, cfg.live.backoff_max_s, random.Random(seed + 2))
        level = cfg.weights.zstd_level
        merge = lambda patches: merge_patches(patches, level=level)  # noqa: E731
        authority = authority_from(cfg.trust.learner_public_key)  # a manifest the learner did not sign is never read
        key = signing_key_from(cfg.trust.sampler_private_key, "trust.sampler_private_key")  # signs its uploads
        weights_objects = open_store(t.store) if t.weights == "store" else None  # its own connections
        store_side = StoreSamplerSide(
            objects,
            t.store,
            cfg.live,
            name,
            session_id,
            backoff,
            events,
            merge,
            reports,
            authority,
            key,
            weights_objects,
        )
    status = None
    try:
        http_side = None
        if client is not None:
            await client.__aenter__()
            status = await client.status()
            http_side = HttpSamplerSide(client, reports)
        uploads = http_side if t.rollouts == "http" else store_side
        weights = http_side if t.weights == "http" else store_side
        assert uploads is not None, "sampler_needs_http checked the URL"
        assert weights is not None, "sampler_needs_http checked the URL"
        side: SamplerSide = uploads if uploads is weights else Split(uploads=uploads, weights=weights)
        if cfg.live.emulate_links:
            side = EmulatedSide(side, cfg.cluster.samplers[worker.index].link, cfg.seed, worker.index, cfg.live)
        yield side, status
    finally:
        for requests in (getattr(s, "requests", None) for s in (http_side, store_side)):
            if requests is not None:
                await requests.close()  # nothing left pending when the loop closes
        if store_side is not None:
            store_side.close()
        if client is not None:
            await client.__aexit__(None, None, None)
