"""Rollouts in, from a store: the learner lists the samplers' uploads, downloads each group, offers it to the loop's
intake (the same decoding, validation, de-duplication, journal and counted reasons as an HTTP POST), and retires
the object only after the verdict: deleted once the group is journaled (accepted or duplicate), replaced by a
`.rejected` marker holding the reason when refused, left in place when the queue is full (`busy`).

Exactly once, a learner crash included: a group is journaled before its object is deleted, so a learner killed in
between finds the object again after `--resume` and the intake answers `duplicate` (the journal replay knows its
group id), which deletes it. Keys name the digest of the bytes as the sampler generated them: a torn or corrupted
object is refused as `corrupt`; an object over `live.max_body_bytes` as `too_large` (without downloading it); a
key that is not a group's as `malformed`. Samplers are served round robin, so one fast sampler cannot starve the
others while the queue is nearly full.

Also here: `read_heartbeats`, the learner's view of samplers that pull weights from the store (their
`samplers/<name>.json`), fed to `loop.peers` exactly as HTTP pulls are.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter
from typing import Any

from heterorl.loop.intake import ACKED, Verdict
from heterorl.loop.learner_loop import LearnerLoop
from heterorl.transport.store.manifest import ROLLOUTS, SAMPLERS
from heterorl.transport.store.objects import ObjectInfo, ObjectMissing, ObjectStore
from heterorl.transport.store.sink import REJECTED

_GROUP_KEY = re.compile(r"^rollouts/([A-Za-z0-9._-]{1,128})/([A-Za-z0-9_-]{1,64})/([0-9]{1,12})-([0-9a-f]{32})\.grp$")
MAX_HEARTBEAT_BYTES = 4096


class StoreIntake:
    """One pass over the store's rollouts per `poll` call (run by the learner's store thread)."""

    def __init__(self, objects: ObjectStore, loop: LearnerLoop, max_body_bytes: int) -> None:
        self.objects, self.loop, self.max_body = objects, loop, max_body_bytes
        self.counts: Counter[str] = Counter()  # outcomes of store objects (the loop's counters have the reasons)
        self.downloaded = 0

    def poll(self) -> int:
        """Offer every group in the store (round robin across samplers) until the queue is full; returns the
        number of objects handled. StoreUnavailable propagates (the caller backs off)."""
        listing = [o for o in self.objects.list(ROLLOUTS) if o.key.endswith(".grp")]
        handled = 0
        for info in _round_robin(listing):
            verdict = self._one(info)
            if verdict is None:
                continue
            handled += 1
            self.counts[verdict.outcome] += 1
            if verdict.outcome in ("busy", "finished"):
                break
        return handled

    def _one(self, info: ObjectInfo) -> Verdict | None:
        match = _GROUP_KEY.match(info.key)
        if match is None:
            return self._retire(info.key, self.loop.intake.reject("malformed", f"not a group key: {info.key[:100]}"))
        sampler, digest = match.group(1), match.group(4)
        self.loop.peers.heard(sampler)
        if info.size > self.max_body:
            return self._retire(info.key, self.loop.intake.reject("too_large", f"{info.size} bytes > {self.max_body}"))
        try:
            body = self.objects.get(info.key, self.max_body)
        except ObjectMissing:
            return None  # gone meanwhile (another learner life deleted it)
        self.downloaded += len(body)
        if len(body) > self.max_body:
            return self._retire(info.key, self.loop.intake.reject("too_large", f"over {self.max_body} bytes"))
        return self._retire(info.key, self.loop.offer(body, digest))

    def _retire(self, key: str, verdict: Verdict) -> Verdict:
        """Delete a group the learner has (journaled) or refused (marker first); keep it while busy/finished."""
        if verdict.outcome in ACKED:
            self.objects.delete(key)
        elif verdict.outcome not in ("busy", "finished"):
            marker = {"outcome": verdict.outcome, "detail": verdict.detail[:300]}
            self.objects.put(key + REJECTED, json.dumps(marker).encode())
            self.objects.delete(key)
        return verdict


def _round_robin(listing: list[ObjectInfo]) -> list[ObjectInfo]:
    by_sampler: dict[str, list[ObjectInfo]] = {}
    for info in listing:
        by_sampler.setdefault(info.key.split("/", 2)[1], []).append(info)
    columns = [by_sampler[name] for name in sorted(by_sampler)]
    return [i for row in itertools.zip_longest(*columns) for i in row if i is not None]


def read_heartbeats(objects: ObjectStore, loop: LearnerLoop, seen: dict[str, Any]) -> None:
    """Feed `loop.peers` from the samplers' heartbeats; `seen` remembers each one's last `time` (a sampler counts
    as heard from only when its heartbeat changed). Malformed heartbeats are skipped."""
    for info in objects.list(SAMPLERS):
        if not info.key.endswith(".json") or info.size > MAX_HEARTBEAT_BYTES:
            continue
        try:
            beat = json.loads(objects.get(info.key, MAX_HEARTBEAT_BYTES))
        except (ObjectMissing, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(beat, dict) or seen.get(info.key) == beat.get("time"):
            continue
        seen[info.key] = beat.get("time")
        name = info.key.removeprefix(SAMPLERS).removesuffix(".json")
        version, idle, failed = beat.get("version"), beat.get("idle"), beat.get("failed")
        loop.peers.heard(
            name,
            version if _is_int(version) else None,
            float(idle) if isinstance(idle, float | int) and math.isfinite(idle) and 0 <= idle <= 1 else None,
            failed if _is_int(failed) else None,
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53
