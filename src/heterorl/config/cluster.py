"""Who runs where: sampler nodes, staleness control, weight transport, and the live cluster's service."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import Field, model_validator

from heterorl.config.base import MAX_MBPS, MAX_SECONDS, MAX_STEPS, Strict
from heterorl.config.modelled import ModelledConfig
from heterorl.config.network import LinkConfig

MAX_SAMPLERS = 10_000


class SamplerNodeConfig(Strict):
    """One sampler machine of the cluster."""

    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._-]{1,128}$",
        description="Identifier (A-Z a-z 0-9 . _ -); defaults to sampler-<index>.",
    )
    tokens_per_second: float = Field(2000.0, gt=0.0, le=1e9, description="Generation speed (virtual time).")
    start_delay_s: float = Field(
        0.0,
        ge=0.0,
        le=86_400.0,
        description="Seconds after the learner's start before this sampler starts (its imports and model build "
        "live; the simulator starts it this late).",
    )
    link: LinkConfig = Field(default_factory=LinkConfig, description="Its link to the learner.")
    replicas: int = Field(
        1,
        ge=1,
        le=MAX_SAMPLERS,
        description="This many samplers like this one (a plan with hundreds of samplers in a few entries): the "
        "entry becomes `replicas` entries named <name>-0, <name>-1, ... (unnamed: sampler-<index> as usual), each "
        "with its own seeded link streams. The resolved config lists them one by one.",
    )


def expand_replicas(samplers: list[SamplerNodeConfig]) -> list[SamplerNodeConfig]:
    """Each entry with `replicas` = n > 1 as n entries of one replica, named `<name>-<k>` (k from 0)."""
    out: list[SamplerNodeConfig] = []
    for node in samplers:
        if node.replicas == 1:
            out.append(node)
            continue
        for k in range(node.replicas):
            name = None if node.name is None else f"{node.name}-{k}"
            out.append(node.model_copy(update={"name": name, "replicas": 1}, deep=True))
    return out


class ClusterConfig(Strict):
    """Who runs where, at which speed, and how staleness is controlled."""

    mode: Literal["sync", "async"] = Field("sync", description="sync: samplers always hold the newest weights.")
    samplers: list[SamplerNodeConfig] = Field(
        default_factory=lambda: [SamplerNodeConfig()],
        min_length=1,
        max_length=MAX_SAMPLERS,
        description="Sampler nodes (an entry with `replicas` stands for that many).",
    )
    learner_step_seconds: float = Field(
        1.0, ge=0.0, le=MAX_SECONDS, description="Virtual cost of one learner step (s)."
    )
    learner_seconds_per_token: float = Field(
        0.0, ge=0.0, le=3600.0, description="Extra virtual cost per trained token (s)."
    )
    learner_seconds_per_group: float = Field(
        0.0,
        ge=0.0,
        le=60.0,
        description="Virtual seconds the learner spends on an upload per group in it (decoding, screening, journaling, "
        "waiting for its intake): the simulator answers an upload that much later; `heterorl calibrate` measures it.",
    )
    learner_commit_seconds: float = Field(
        0.0,
        ge=0.0,
        le=MAX_SECONDS,
        description="Seconds the learner spends after each step before the next can start (waiting for the previous "
        "version's publish, recording the step): not training, so counted idle; `heterorl calibrate` measures it.",
    )
    learner_eval_seconds: float = Field(
        0.0,
        ge=0.0,
        le=MAX_SECONDS,
        description="Seconds each held-out evaluation (`eval.every`) adds to its step's commit: the learner does not "
        "train meanwhile; `heterorl calibrate` measures it.",
    )
    learner_uplink_mbps: float | None = Field(
        None,
        gt=0.0,
        le=MAX_MBPS,
        description="Learner's upload bandwidth shared by all it sends (simulator); None = unlimited.",
    )
    max_staleness: int | None = Field(
        None, ge=0, le=MAX_STEPS, description="HeteroRL window: drop groups older than this."
    )
    eta: int | None = Field(
        None, ge=0, le=MAX_STEPS, description="AReaL admission bound on versions ahead; 0 = synchronous."
    )
    max_queued_steps: int | None = Field(
        4,
        ge=1,
        le=1_000_000,
        description="Backpressure (async): a sampler starts no new generation while the groups queued at the learner "
        "or being generated would exceed this many learner steps' worth; None = unbounded.",
    )
    share_weights: bool = Field(
        True,
        description="Simulator: samplers on fault-free links take the learner's published wire-dtype tensors by "
        "reference (the same bits; sizes and hashes still come from the real encode, settled in the background) "
        "instead of decoding the update's bytes; links with faults always carry bytes. False: every update is decoded.",
    )
    lease_seconds: float = Field(
        300.0,
        gt=0.0,
        le=86_400.0,
        description="A sampler session not heard from for this long loses the admission slots it holds (their budget "
        "comes back): a sampler that died, or groups lost on the way. Any request renews it (weight pulls included).",
    )
    max_slots_per_sampler: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Admission slots one sampler may hold at once (granted, group not arrived); None: its even share "
        "of the capacity plus one chunk at any time, and up to all of the capacity but one batch out of room no other "
        "sampler is asking for, so no sampler can take the whole budget and none idles the learner.",
    )
    grant_retry_seconds: float = Field(
        1.0, gt=0.0, le=600.0, description="A sampler granted fewer slots than it asked for asks again after this long."
    )
    uploads_in_flight: int = Field(
        4,
        ge=1,
        le=64,
        description="Uploads a sampler keeps in flight at once (each answered with per-group verdicts): throughput is "
        "then bound by generation or bandwidth, not by one round trip per upload. A long round trip widens it for "
        "full uploads (enough for what the sampler generates in one round trip, plus one; at most 64).",
    )
    groups_per_upload: int = Field(8, ge=1, le=1024, description="Most groups a sampler sends in one upload.")
    max_refusals_in_a_row: int = Field(
        64,
        ge=1,
        le=1_000_000,
        description="A sampler whose uploads or groups are refused this many times in a row for the same reason stops "
        "with one line (a config that does not match the learner's, a revoked credential).",
    )
    consume: Literal["oldest", "freshest"] = Field(
        "oldest",
        description="Which eligible groups a learner step takes first: the oldest (arrival order) or the freshest "
        "(newest weight version first; older ones wait, and the window drops them if they age out).",
    )
    modelled: ModelledConfig | None = Field(
        None,
        description="Simulator only: weight updates cost the simulated links the sizes of this larger model while "
        "the config's small model computes (a large-cluster plan; docs/planning.md). Set the compute costs above "
        "to that model's figures. Live clusters refuse it.",
    )

    def sampler_name(self, index: int) -> str:
        """Sampler `index`'s name: its own, or `sampler-<index>` when it has none."""
        return self.samplers[index].name or f"sampler-{index}"

    def sampler_names(self) -> list[str]:
        """Each sampler's name, in order."""
        return [self.sampler_name(i) for i in range(len(self.samplers))]

    @model_validator(mode="after")
    def _expand_replicas(self) -> ClusterConfig:
        if any(node.replicas > 1 for node in self.samplers):
            expanded = expand_replicas(self.samplers)
            if len(expanded) > MAX_SAMPLERS:
                raise ValueError(f"samplers: {len(expanded)} with their replicas, more than {MAX_SAMPLERS}")
            self.__dict__["samplers"] = expanded  # not re-validated: each entry already is
        counts = Counter(self.sampler_names())
        repeated = sorted(name for name, n in counts.items() if n > 1)
        if repeated:  # a sampler's name is its identity at the learner: its figures, admission, credentials
            raise ValueError(f"samplers: names {repeated[:5]} are used more than once")
        return self


# --- weights
class WeightsConfig(Strict):
    """How weights travel from the learner to samplers."""

    codec: Literal["full", "pulse", "pulse-ctx"] = Field(
        "pulse",
        description="full state dicts, PULSE sparse patches, or PULSE patches coded per magnitude class of the "
        "base weights the receiver holds (format 2: ~27% smaller; docs/weight-sync.md).",
    )
    wire_dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="Samplers' weight dtype.")
    snapshot_every: int = Field(10, ge=1, le=MAX_STEPS, description="Publish a full snapshot every K versions.")
    max_chain: int = Field(
        16, ge=1, le=1_000_000, description="Longest patch chain served before a snapshot is preferred."
    )
    retain: int = Field(64, ge=1, le=1_000_000, description="Versions kept in the store.")
    zstd_level: int = Field(1, ge=-7, le=22, description="zstd level of patch payloads.")
    overlap: bool = Field(True, description="Publish in a worker thread while the next learner step runs.")
    codec_threads: int = Field(
        1,
        ge=1,
        le=256,
        description="Threads that encode (learner) and decode (samplers) PULSE patches and snapshots, tensor by "
        "tensor (the compiled kernels release the GIL); 1 keeps the codec on one core beside training.",
    )
    publish_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="Linux: the background publish thread's nice value above the process's, so that training gets "
        "a busy core first (0: same priority).",
    )
    patch_max_ratio: float = Field(
        0.9,
        gt=0.0,
        le=10.0,
        description="Send a version as a snapshot, without coding a patch, when the patch's size estimated from the "
        "diff scan's change counts exceeds this share of the last snapshot's size (dense steps).",
    )


# --- live cluster
class LiveConfig(Strict):
    """The live cluster: the learner's HTTP service, the sampler clients, durability and the local launcher.

    `heterorl learner`, `heterorl sampler` and `heterorl run --live` read this section; the simulator reads the
    client's timing (poll_seconds, dead_after_s, backoff, patience_s) to play the same conversation in virtual
    time. Defaults suit a learner and samplers on one host or a LAN; see docs/deployment.md.
    """

    token_env: str = Field(
        "HETERORL_TOKEN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Environment variable with the token."
    )
    token_file: str | None = Field(
        None, min_length=1, description="File holding the bearer token; read before `token_env` when set."
    )
    max_body_bytes: int = Field(
        16 * 2**20, ge=1024, le=2**31, description="Largest rollout POST body the learner reads; larger -> 413."
    )
    max_queued_groups: int = Field(
        4096, ge=1, le=10_000_000, description="Groups waiting for the learner before POSTs get 503 (backpressure)."
    )
    poll_seconds: float = Field(
        5.0, ge=0.0, le=300.0, description="Longest long-poll of GET /v1/weights when the sampler is current."
    )
    header_timeout_s: float = Field(
        30.0,
        gt=0.0,
        le=3600.0,
        description="Learner: close a connection without a complete request head (or idle) for this long.",
    )
    body_timeout_s: float = Field(
        300.0, gt=0.0, le=86_400.0, description="Learner: longest upload of one rollout body; slower -> 408."
    )
    max_connections: int = Field(
        256, ge=1, le=100_000, description="Learner: open connections beyond this are refused at once (503)."
    )
    max_concurrent_uploads: int = Field(
        32, ge=1, le=10_000, description="Learner: rollout bodies read at once; more -> 503 busy (bounds memory)."
    )
    connected_seconds: float = Field(
        30.0, gt=0.0, le=86_400.0, description="A sampler heard from within this many seconds counts as connected."
    )
    checkpoint_every: int = Field(
        10, ge=1, le=1_000_000, description="Learner steps between durable learner-state checkpoints."
    )
    fsync: bool = Field(True, description="fsync every journaled group before acknowledging it (power-loss safety).")
    emulate_links: bool = Field(
        False,
        description="Samplers delay and perturb their own messages by their node's link (in the application: "
        "delays, bandwidth, message faults; no TCP). For tests and experiments; `wan_lab` shapes real TCP.",
    )
    wan_lab: bool = Field(
        False,
        description="run --live: the learner and each sampler in their own network namespace, each sampler's link "
        "shaped for real on its TCP connections (delays, rates, loss, reordering, cuts; docs/wan-lab.md; root).",
    )
    wan_lab_port: int = Field(
        8470, ge=1, le=65535, description="run --live with wan_lab: the learner's port in the lab."
    )
    dead_after_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="Sampler: a request with no answer for this long (or 3 round trips, if longer) is retried and the "
        "link reported down; it is reported up again at the next answer. The simulator models the same client.",
    )
    request_timeout_s: float = Field(
        120.0, gt=0.0, le=3600.0, description="Sampler: timeout of one request (a long-poll adds poll_seconds)."
    )
    backoff_initial_s: float = Field(0.2, gt=0.0, le=60.0, description="Sampler: first delay before a retry.")
    backoff_max_s: float = Field(
        10.0, gt=0.0, le=3600.0, description="Sampler: cap of the retry delay (doubles per failure, with jitter)."
    )
    patience_s: float = Field(
        600.0, gt=0.0, le=604_800.0, description="Sampler: give up after this long without reaching the learner."
    )
    linger_s: float = Field(
        5.0, ge=0.0, le=600.0, description="Learner: keep answering this long after the last step (samplers see it)."
    )
    startup_timeout_s: float = Field(
        600.0, gt=0.0, le=86_400.0, description="run --live: longest wait for the learner to start listening."
    )

    @model_validator(mode="after")
    def _one_way_to_shape(self) -> LiveConfig:
        if self.emulate_links and self.wan_lab:
            raise ValueError("emulate_links and wan_lab both shape the links: choose one")
        return self

    @model_validator(mode="after")
    def _backoff_order(self) -> LiveConfig:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError(f"backoff_initial_s {self.backoff_initial_s} > backoff_max_s {self.backoff_max_s}")
        return self
