"""The conversation between a sampler and the learner, whatever carries it (HTTP, an object store, the simulated
link): what each side says, as plain values. The bytes are `heterorl.transport.wire`'s.

A sampler process is a *session* (its name from the config and a random boot id). It sends `Upload`s: the groups
it generated since its last upload, how many admission slots it would like, reports (held version, idle share,
weight updates it could not apply), and the fingerprint of the settings it must share with the learner. The
learner answers each with a `Reply`: one verdict per group, its admission figures for the session, the newest
published version, whether the run is finished.

Every count an upload or a reply carries is a running total of the session (`wanted`, `used`, `returned`; `granted`,
`voided`), never a delta. So an upload that is retried after a lost answer, or overtaken by a later one (several
are in flight at once), changes nothing twice: the learner applies what a total adds to what it already knew,
and a sampler keeps the largest total it has been told. Groups are de-duplicated by id, so re-sending the same
bytes is always safe; a retried upload (same session, seq and groups) is answered as it was the first time
(`LearnerLoop.exchange`), so a refused group is never charged twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Upload:
    """Sampler -> learner: one request of the conversation."""

    sampler: str  # its name in `cluster.samplers`
    session: str  # its process's boot id: a restarted sampler is a new session
    seq: int  # this session's upload number, from 0; a retry repeats it (and its bytes)
    version: int  # the weight version its engine generates with (-1: none yet)
    wanted: int = 0  # admission slots the session would like granted, in all (running total)
    used: int = 0  # granted slots it has generated on, in all (running total)
    returned: int = 0  # used slots whose groups will never be delivered, in all (running total)
    idle: float | None = None  # share of its uptime not spent generating, as it measured it
    weights_failed: int = 0  # weight updates it could not apply (corrupt, wrong base), in all
    groups: tuple[bytes, ...] = ()  # encoded rollout groups (`rollout_codec.encode_group`)
    digests: tuple[str, ...] = ()  # xxh3-128 of each group's bytes as generated: corruption on the way shows
    fingerprint: dict[str, str] = field(default_factory=dict, compare=False)  # its config (`config.fingerprint`)

    @property
    def key(self) -> tuple[str, str]:
        return self.sampler, self.session


@dataclass(frozen=True)
class GroupVerdict:
    """The learner's answer for one group: an outcome name (`loop.intake`) and what to tell the sampler."""

    outcome: str
    group_id: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Reply:
    """Learner -> sampler: the answer to one upload."""

    seq: int  # the upload it answers
    verdicts: tuple[GroupVerdict, ...] = ()  # one per group of the upload, in order
    granted: int = 0  # admission slots granted to the session, in all (running total)
    voided: int = 0  # unused slots the learner took back (the session went silent past its lease), in all
    version: int = -1  # the newest version the learner has published
    finished: bool = False  # the run is over: stop
    retry_after: float = 0.0  # nothing more could be granted: ask again after this many seconds
    refused: str = ""  # the whole upload was refused (a reason from `loop.intake`): nothing in it was taken
    detail: str = field(default="", compare=False)
    learner: str = ""  # the learner process's boot id: another one (a restarted learner) forgot the slots it granted
    handled: float = 0.0  # seconds the learner's clock spent on the upload: the part of a round trip not on the link
