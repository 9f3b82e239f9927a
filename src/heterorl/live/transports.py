"""Which transports a live process uses, from `transport:` in the config: the learner's HTTP service, an object
store, or a mix (docs/deployment.md).

The learner always serves HTTP: status, and admission when `cluster.eta` is set (admission is a conversation a
store cannot carry); with weights and rollouts through the store it needs no inbound connection from samplers,
and samplers need its URL only when something travels over HTTP or `cluster.eta` is set. A store-only sampler
learns that the run is over from the store's `finished` marker.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from heterorl.config import RunConfig
from heterorl.eventlog import EventLog
from heterorl.live.preflight import LiveSetupError
from heterorl.transport.base import SamplerTransport
from heterorl.transport.http.client import Backoff, LearnerClient
from heterorl.transport.http.sink import HttpRolloutSink
from heterorl.transport.store.learner import StoreLearnerSide
from heterorl.transport.store.manifest import MANIFEST_KEY, ROLLOUTS, SAMPLERS
from heterorl.transport.store.objects import StoreSetupError, open_store
from heterorl.transport.store.sink import StoreRolloutSink
from heterorl.transport.store.source import StoreWeightSource
from heterorl.weights import merge_patches

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
    if cfg.cluster.mode == "async" and cfg.cluster.eta is not None:
        return "cluster.eta needs the learner's admission service"
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
    for i, node in enumerate(cfg.cluster.samplers):
        name = node.name or f"sampler-{i}"
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
        )
    except StoreSetupError as err:
        raise LiveSetupError(str(err)) from None


@asynccontextmanager
async def sampler_transport(
    cfg: RunConfig, name: str, url: str | None, token: str | None, seed: int, events: EventLog, boot: str
) -> AsyncIterator[SamplerTransport]:
    """The sampler's weight source, rollout sink and admission gate, as configured (closed on exit)."""
    t = cfg.transport
    client = None
    if url is not None and token is not None:
        client = LearnerClient(url, token, cfg.live, name, random.Random(seed), events)
    objects = None
    if t.uses_store:
        check_transport_config(cfg)
        objects = open_store(t.store)
        probe = f"{SAMPLERS}{name}.probe"
        try:
            objects.check(f"{ROLLOUTS}{name}/" if t.rollouts == "store" else SAMPLERS, probe)
        except StoreSetupError as err:
            raise LiveSetupError(str(err)) from None
    backoff = Backoff(cfg.live.backoff_initial_s, cfg.live.backoff_max_s, random.Random(seed + 2))
    level = cfg.weights.zstd_level
    sink = None
    try:
        if client is not None:
            await client.__aenter__()
        if t.weights == "store":
            assert objects is not None
            merge = lambda patches: merge_patches(patches, level=level)  # noqa: E731
            weights = StoreWeightSource(objects, t.store, cfg.live, name, backoff, events, merge)
        else:
            weights = _need(client, "transport.weights is http")
        if t.rollouts == "store":
            assert objects is not None
            sink = StoreRolloutSink(objects, t.store, cfg.live, name, boot, backoff, events)
            rollouts = sink
        else:
            rollouts = HttpRolloutSink(_need(client, "transport.rollouts is http"))
        admission = client  # backpressure (`cluster.max_queued_steps`) goes through it when the learner is reachable
        if cfg.cluster.mode == "async" and cfg.cluster.eta is not None:
            admission = _need(client, "cluster.eta needs the learner's admission service")
        yield SamplerTransport(weights, rollouts, admission)
    finally:
        if sink is not None:
            await sink.close()
        if client is not None:
            await client.__aexit__(None, None, None)


def _need(client: LearnerClient | None, why: str) -> LearnerClient:
    if client is None:
        raise LiveSetupError(f"the sampler needs the learner's URL (--connect) because {why}")
    return client


def store_counts(transport: SamplerTransport) -> dict[str, dict[str, int]]:
    """The store faults and verdicts a sampler counted ({} without a store)."""
    parts = (("weights", transport.weights), ("rollouts", transport.rollouts))
    return {role: dict(part.counts) for role, part in parts if isinstance(part, StoreWeightSource | StoreRolloutSink)}
