"""The object store on the simulated clock: the same objects and the same conversation as a live run through a
store (`transport.store`), with time modelled.

The store sits beside the learner (what the learner writes is visible as soon as it leaves its uplink); each
sampler reaches it over its own link:
- Weights: the learner uploads each version's objects once over its uplink (`cluster.learner_uplink_mbps`); a
  sampler looks at the manifest at a `Cadence` (each look a request up its link and the manifest down) and, when
  a newer version is there, downloads the cheapest chain (`StoreWeightSource`, the live code, over a
  `MemoryStore`) over its link: one more request, the chain's objects down (live, their GETs go out at once).
- Uploads: a sampler's upload is a PUT up its link, visible when it arrives; the learner lists uploads at its own
  `Cadence` (`StoreIntake`: `LearnerLoop.exchange`, the reply written); the sampler looks for its reply at a
  `Cadence`, each look a request up and an answer down (the reply, or a short "not there"), and deletes the reply
  and its upload (live, in a batched request; here without charging time).
A message lost on the link is noticed as a live client notices it: no answer within `Liveness.timeout()`, then the
same request again after a seeded backoff. Store calls run in the event loop's thread, so what every sampler finds
is the same on every run of a config.
"""

from __future__ import annotations

import io
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from heterorl.config import ConfigError, RunConfig
from heterorl.eventlog import EventLog
from heterorl.loop.learner_loop import LearnerLoop
from heterorl.loop.protocol import Reply, Upload
from heterorl.network import Link
from heterorl.transport.backoff import Backoff, Liveness
from heterorl.transport.base import FINISHED, Held
from heterorl.transport.simulated.link import HEAD_BYTES, Scheduler, SimLearnerSide
from heterorl.transport.simulated.paths import SimPath
from heterorl.transport.store.cadence import Cadence
from heterorl.transport.store.intake import StoreIntake, reply_key, upload_key
from heterorl.transport.store.manifest import Manifest
from heterorl.transport.store.objects import MemoryStore, ObjectMissing
from heterorl.transport.store.publisher import StorePublisher
from heterorl.transport.store.source import StoreWeightSource
from heterorl.transport.wire import WireError, decode_reply, encode_upload
from heterorl.weights import merge_patches


@dataclass(frozen=True)
class Fetch:
    """A manifest read that named objects to download: the update they make and their bytes (a second request)."""

    envelope: bytes
    nbytes: int


class SimStore:
    """The store, the learner's side of it, and one sampler side per sampler (see the module docstring)."""

    def __init__(
        self, cfg: RunConfig, loop: LearnerLoop, events: Scheduler, link: SimLearnerSide, on_upload: Callable[[], None]
    ) -> None:
        self.cfg, self.loop, self.events, self.link, self.on_upload = cfg, loop, events, link, on_upload
        store_cfg = cfg.transport.store
        self.store_cfg = store_cfg
        self.objects = MemoryStore("memory://simulated")
        self.weights = cfg.transport.weights == "store"
        self.rollouts = cfg.transport.rollouts == "store"
        self.visible: Manifest | None = None
        self.finished = False
        self.publisher: StorePublisher | None = None
        if self.weights:
            self.publisher = StorePublisher(
                self.objects,
                loop.store,
                store_cfg,
                resume=False,
                clock=lambda: events.now,
                on_uploaded=loop.traffic.sent,
            )
            loop.publisher.on_published.append(self.publisher.published)
        if self.rollouts and cfg.cluster.learner_seconds_per_group > 0.0:
            raise ConfigError(
                "cluster.learner_seconds_per_group is modelled for rollouts over links, not through a store: "
                "set it to 0 with transport.rollouts: store"
            )
        self.intake = StoreIntake(
            self.objects, loop, cfg.live.max_body_bytes, cfg.cluster.groups_per_upload, clock=lambda: events.now
        )
        self.lister = Cadence.of(store_cfg, answer_due=True)
        self.listing = None
        self.sides: list[SimStoreSide] = []

    def side(self, index: int, name: str) -> Any:
        """Sampler `index`'s transport: the store for what travels through it, the simulated link for the rest."""
        cfg = self.cfg
        link_side = self.link.side(index, name)
        level = cfg.weights.zstd_level
        merge = lambda patches: merge_patches(patches, level=level)  # noqa: E731
        backoff = Backoff(cfg.live.backoff_initial_s, cfg.live.backoff_max_s, random.Random(cfg.seed * 1000 + index))
        source = StoreWeightSource(
            self.objects, self.store_cfg, cfg.live, name, backoff, EventLog(io.StringIO()), merge, f"sim{index}"
        )
        side = SimStoreSide(
            name,
            f"sim{index}",
            link_side.link,
            self,
            self.events,
            Liveness(cfg.live.dead_after_s),
            backoff,
            source,
            link_side,
        )
        self.sides.append(side)
        if self.rollouts and self.listing is None:
            self.listing = self.events.schedule_in(0.0, self._list, label="learner lists uploads")
        return side

    # ------------------------------------------------------------------ learner
    def published(self, version: int) -> None:
        """The learner uploads the versions published since the last call once; visible when the upload is done."""
        if self.publisher is None:
            return
        self.loop.publisher.result()
        uploaded = self.publisher.drain()
        if uploaded:
            nbytes = sum(n for _, n in uploaded)
            at = self.link.uplink.done_at(self.events.now, nbytes)
            manifest = self.publisher.manifest
            self.events.schedule(at, self._visible, manifest, label=f"store v{manifest.latest[0]} visible")

    def _visible(self, manifest: Manifest) -> None:
        self.visible = manifest

    def _list(self) -> None:
        """One pass of the learner's store thread over the uploads."""
        handled = self.intake.poll()
        if handled:
            self.on_upload()
        if not self.finished:
            wait = self.lister.found() if handled else self.lister.nothing()
            self.listing = self.events.schedule_in(
                max(wait, self.store_cfg.first_poll_seconds if handled else 0.0),
                self._list,
                label="learner lists uploads",
            )

    def finish(self) -> None:
        self.finished = True

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"objects": len(self.objects.objects), "intake": dict(self.intake.counts)}
        if self.publisher is not None:
            out["uploaded_bytes"] = self.publisher.uploaded_bytes
        return out


@dataclass
class SimStoreSide:
    """One sampler's end of the simulated store (and of its link, for what does not go through the store)."""

    name: str
    session: str
    link: Link
    store: SimStore
    events: Scheduler
    liveness: Liveness
    backoff: Backoff
    source: StoreWeightSource
    direct: Any  # the simulated link's side: weights or uploads that travel over HTTP
    counts: Counter[str] = field(default_factory=Counter)
    up: SimPath = field(init=False)
    down: SimPath = field(init=False)

    def __post_init__(self) -> None:
        self.up = SimPath(self.link, "rollout")
        self.down = SimPath(self.link, "weights", opens=False)  # the store's answers to the sampler's requests

    def faults(self) -> dict[str, dict[str, int]]:
        return {"up": dict(self.up.faults), "down": dict(self.down.faults), **self.direct.faults()}

    # ------------------------------------------------------------------ one request to the store
    def _request(self, nbytes_up: int, at_store: Callable[[], tuple[Any, int]], done: Callable[[Any], None]) -> None:
        """A request of `nbytes_up` up the link; at the store `at_store()` gives (answer, bytes down); the answer
        comes back down. A lost request or answer: the same request again after the timeout and a backoff."""
        sent = self.events.now
        arrivals = self.up.send(sent, bytes(nbytes_up))
        if not arrivals:
            self._retry(nbytes_up, at_store, done)
            return

        def at_the_store() -> None:
            answer, nbytes_down = at_store()
            back = self.down.send(self.events.now, bytes(max(nbytes_down, 1)))
            if not back:
                self._retry(nbytes_up, at_store, done)
                return

            def answered() -> None:
                self.liveness.answered(self.events.now - sent, self.events.now)
                self.backoff.reset()
                done(answer)

            self.events.schedule(back[0].at, answered, label=f"store answers {self.name}")

        self.events.schedule(arrivals[0].at, at_the_store, label=f"{self.name} at the store")

    def _retry(self, nbytes_up: int, at_store: Callable[[], tuple[Any, int]], done: Callable[[Any], None]) -> None:
        self.counts["timeouts"] += 1
        self.liveness.timed_out()
        wait = self.liveness.timeout() + self.backoff.next_delay()
        self.events.schedule_in(wait, self._request, nbytes_up, at_store, done, label=f"{self.name} store retry")

    # ------------------------------------------------------------------ uploads
    def exchange(self, upload: Upload, done: Callable[[Reply | None], None]) -> None:
        if not self.store.rollouts:
            self.direct.exchange(upload, done)
            return
        body = encode_upload(upload)
        key = upload_key(self.name, self.session, upload.seq, body)
        cadence = Cadence.of(self.store.store_cfg, answer_due=True)
        looked_at = [0.0]  # when the look being answered went out (the spacing runs from one look's start)

        def put() -> tuple[None, int]:
            self.store.objects.put(key, body)
            return None, HEAD_BYTES

        def look() -> tuple[bytes | None, int]:
            try:
                raw = self.store.objects.get(reply_key(self.name, self.session, upload.seq), 1 << 20)
            except ObjectMissing:
                return None, HEAD_BYTES
            self.store.objects.delete_many([reply_key(self.name, self.session, upload.seq), key])
            return raw, len(raw) + HEAD_BYTES

        def look_again() -> None:
            looked_at[0] = self.events.now
            self._request(HEAD_BYTES, look, looked)

        def looked(raw: bytes | None) -> None:
            if raw is None:
                wait = cadence.nothing(took_s=self.events.now - looked_at[0])
                self.events.schedule_in(wait, look_again, label=f"{self.name} looks for reply")
                return
            try:
                done(decode_reply(raw, len(upload.groups)))
            except WireError as err:
                done(Reply(seq=upload.seq, refused="malformed", detail=str(err)[:200]))

        modelled = self.store.link.modelled  # a plan's group size, if it gives one
        nbytes = len(body) if modelled is None else modelled.upload_nbytes(body, upload.groups)
        self.counts["uploads"] += 1
        self._request(nbytes + HEAD_BYTES, put, lambda _: look_again())

    # ------------------------------------------------------------------ weights
    def pull(self, held: Callable[[], Held], wait_s: float, done: Callable[[Any], None]) -> None:
        if not self.store.weights:
            self.direct.pull(held, wait_s, done)
            return
        holds = held()[0] is not None  # (a sampler that holds nothing waits for a first version as long as a live one)
        deadline = self.events.now + (wait_s if holds else max(wait_s, self.store.store_cfg.poll_seconds))
        cadence = Cadence.of(self.store.store_cfg, answer_due=False)
        looked_at = [self.events.now]

        def look() -> tuple[Any, int]:
            if self.store.finished:
                return FINISHED, HEAD_BYTES
            manifest = self.store.visible
            if manifest is None:
                return None, HEAD_BYTES
            before = self.source.downloaded
            envelope = self.source.update_from(manifest, *held())
            fetched = self.source.downloaded - before
            nbytes = len(manifest.to_bytes()) + HEAD_BYTES
            return (envelope, nbytes) if envelope is None or fetched == 0 else (Fetch(envelope, fetched), nbytes)

        def looked(answer: Any) -> None:
            if isinstance(answer, Fetch):  # the manifest named objects to get: their GETs go out together
                self._request(HEAD_BYTES, lambda: (answer.envelope, answer.nbytes + HEAD_BYTES), looked)
                return
            if answer is not None or self.events.now >= deadline:
                done(answer)
                return
            wait = min(cadence.nothing(took_s=self.events.now - looked_at[0]), max(deadline - self.events.now, 0.0))
            self.events.schedule_in(wait, read_again, label=f"{self.name} reads the manifest")

        def read_again() -> None:
            looked_at[0] = self.events.now
            self._request(HEAD_BYTES, look, looked)

        self._request(HEAD_BYTES, look, looked)

    def close(self) -> None:
        pass
