"""The simulated cluster: staleness follows the network, control rules hold, faults are survived and counted, runs
are deterministic."""

import time
from pathlib import Path

import pytest
import torch

from conftest import capture_records, tiny_config
from heterorl.loop.publisher import BackgroundPublisher
from heterorl.loop.staleness import RolloutBuffer
from heterorl.metrics import read_metrics
from heterorl.rollout import RolloutGroup
from heterorl.simulated.cluster import SimulatedCluster
from heterorl.simulated.run import build_simulated, execute
from heterorl.weights import state_hash
from heterorl.weights.store import Published


def build(run_dir: Path, model_dir: Path, *overrides: str) -> tuple[SimulatedCluster, list[dict]]:
    """A simulated cluster over the tiny model; the list fills with its train records as it runs."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cluster = build_simulated(tiny_config(model_dir, *overrides), run_dir, str(model_dir))
    return cluster, capture_records(cluster)


def nodes(*specs: str) -> list[str]:
    """Overrides that define len(specs) sampler nodes, each spec a flow-style YAML mapping."""
    return [f"cluster.samplers=[{', '.join(specs)}]"]


def pulled_versions(delay: float, cost: float, poll: float, until: float) -> list[tuple[float, int]]:
    """When a sampler that pulls weights (`transport.simulated.link`) holds which version, computed by hand: the
    learner publishes v0 at 0 and version j >= 1 at delay + (j + 1) * cost (below). A request (up-path delay 0) is
    answered at once when the learner has a newer version than the sampler holds (the newest: versions in between
    are skipped), else when the next version is published if that is within `poll` seconds (a long-poll), else
    with "nothing newer" after `poll` seconds. Every answer takes `delay` to come back; the next request goes then."""

    def published(j: int) -> float:
        return 0.0 if j == 0 else delay + (j + 1) * cost

    held, t, out = 0, delay, [(delay, 0)]
    while t < until:
        newest = max(j for j in range(int(until / cost) + 2) if published(j) <= t)
        if newest > held:
            held, t = newest, t + delay
        elif published(held + 1) <= t + poll:
            held, t = held + 1, published(held + 1) + delay
        else:
            t = t + poll + delay
        out.append((t, held))
    return out


@pytest.mark.parametrize(("delay", "cost"), [(25.0, 10.0), (7.0, 3.0), (0.5, 2.0)])
def test_fixed_delay_gives_the_staleness_the_pull_arithmetic_predicts(
    tmp_path: Path, tiny_model_dir: Path, delay, cost
):
    """One sampler producing a batch exactly every `cost` seconds (one-token completions), a learner consuming one
    every `cost` seconds, weights `delay` away: batch k starts generating at delay + (k - 1) * cost with the version
    it holds then (`pulled_versions`), is trained at learner version k - 1 and committed at delay + (k + 1) * cost.
    The pull conversation, not a push, decides what a sampler holds."""
    link = f"{{weights_delay: {{kind: fixed, seconds: {delay}}}}}"
    G, B = 4, 16
    speed = B * G / cost  # one chunk (B groups of G one-token completions) per `cost` seconds
    cluster, records = build(
        tmp_path,
        tiny_model_dir,
        *nodes(f"{{tokens_per_second: {speed}, link: {link}}}"),
        "cluster.mode=async",
        "cluster.max_queued_steps=null",  # no admission, and a window of uploads that never holds generation back:
        "cluster.uploads_in_flight=64",  # only the weights path sets staleness here
        f"cluster.learner_step_seconds={cost}",
        "sampler.max_new_tokens=1",
        f"learner.groups_per_step={B}",
        "learner.steps=8",
    )
    cluster.run()
    held = pulled_versions(delay, cost, cluster.cfg.live.poll_seconds, delay + 9 * cost)

    def version_at(t: float) -> int:
        return max(v for at, v in held if at <= t)

    expected = [(k - 1) - version_at(delay + (k - 1) * cost) for k in range(1, 9)]
    assert [r["stale/max"] for r in records] == expected
    assert records[-1]["time/clock"] == pytest.approx(delay + 9 * cost, abs=1e-3)


def test_sync_mode_pays_every_delay_and_is_never_stale(tmp_path: Path, tiny_model_dir: Path) -> None:
    link = "{weights_delay: {kind: fixed, seconds: 5}, rollout_delay: {kind: fixed, seconds: 2}}"
    cluster, records = build(
        tmp_path,
        tiny_model_dir,
        *nodes(f"{{tokens_per_second: 1.0e9, link: {link}}}", f"{{tokens_per_second: 1.0e9, link: {link}}}"),
        "cluster.learner_step_seconds=3",
        "learner.steps=4",
    )
    cluster.run()
    assert all(r["stale/max"] == 0 for r in records)
    # a round: the step (3 s), its version down (5 s), the batch up (2 s); the first pull also went up (2 s)
    assert [r["time/clock"] for r in records] == pytest.approx([2 + 10 * k for k in range(1, 5)], abs=1e-3)
    assert all(r[f"sampler/sampler-{i}/version"] == r["step"] - 1 for r in records for i in range(2))


def test_the_learner_commit_and_evaluations_hold_the_next_step_back(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Steps of 1 s, a commit of 0.5 s after each and 2 s more after an evaluation (every 2 steps): with groups
    always waiting, step k's record (at the end of its training) comes at 1, 2.5, 6 (2.5 + 0.5 + 2 + 1), 7.5;
    the commit is not training, so the learner is busy 4 of 7.5 s."""
    link = "{weights_delay: {kind: fixed, seconds: 0}, rollout_delay: {kind: fixed, seconds: 0}}"
    cluster, records = build(
        tmp_path,
        tiny_model_dir,
        *nodes(f"{{tokens_per_second: 1.0e9, link: {link}}}"),
        "cluster.mode=async",
        "cluster.learner_step_seconds=1",
        "cluster.learner_commit_seconds=0.5",
        "cluster.learner_eval_seconds=2",
        "eval.every=2",
        "learner.steps=4",
    )
    cluster.run()
    assert [r["time/clock"] for r in records] == pytest.approx([1.0, 2.5, 6.0, 7.5], abs=1e-6)
    assert records[-1]["perf/learner_idle"] == pytest.approx(1 - 4 / 7.5, abs=1e-6)


def _group(version: int, gid: int) -> RolloutGroup:
    return RolloutGroup(
        group_id=str(gid),
        sampler_id="s",
        prompt="1+1=",
        answer="2",
        prompt_ids_P=torch.tensor([4, 13, 4, 15]),
        completion_ids_GL=torch.tensor([[5, 1], [5, 1]]),
        completion_mask_GL=torch.tensor([[1, 1], [1, 0]]),
        behavior_logp_GL=torch.tensor([[-0.1, -0.2], [-0.3, 0.0]]),
        version_GL=torch.tensor([[version, version + 1], [version, version]]),
        rewards_G=torch.tensor([1.0, 0.0]),
    )


def test_window_drops_exactly_the_groups_older_than_max_staleness() -> None:
    buffer = RolloutBuffer(max_staleness=3)
    for i, v in enumerate([5, 6, 7, 8, 9, 10, 6, 7]):
        buffer.add(_group(v, i))
    assert buffer.drop_stale(10) == 3  # 5, 6, 6 (staleness 4+) go; 7 (3) stays
    assert [g.min_version for g in buffer.groups] == [7, 8, 9, 10, 7]
    assert buffer.dropped == 3
    batch, stats = buffer.take(4, 10)
    assert [g.min_version for g in batch] == [7, 8, 9, 10]  # oldest first
    assert stats == {"stale/mean": 1.5, "stale/max": 3.0, "stale/dropped_step": 0.0, "stale/dropped_total": 3.0}
    assert buffer.take(2, 10) is None


def test_staleness_counts_the_oldest_token_of_a_group() -> None:
    g = _group(4, 0)  # tokens from versions 4 and 5 (an interrupted rollout)
    assert g.min_version == 4
    assert g.staleness(9) == 5


def _unequal_samplers(eta: str) -> list[str]:
    link = "{weights_delay: {kind: uniform, low: 1, high: 30}}"
    return [
        *nodes(*[f"{{tokens_per_second: {s}, link: {link}}}" for s in (50, 25, 12.5)]),
        "cluster.mode=async",
        f"cluster.eta={eta}",
        "cluster.learner_step_seconds=1",
        "learner.steps=8",
    ]


@pytest.mark.parametrize("eta", [0, 1, 3])
def test_areal_admission_bounds_the_staleness_of_every_trained_group(tmp_path: Path, tiny_model_dir: Path, eta):
    """No trained group is staler than eta; admission does the work (the window at eta drops few groups), where
    the same cluster without admission trains much staler data."""
    free, free_records = build(tmp_path / "free", tiny_model_dir, *_unequal_samplers("null"))
    free.run()
    assert max(r["stale/max"] for r in free_records) > 3
    cluster, records = build(tmp_path / "eta", tiny_model_dir, *_unequal_samplers(str(eta)))
    cluster.run()
    assert max(r["stale/max"] for r in records) <= eta
    trained = sum(r["perf/groups"] for r in records)
    assert records[-1]["stale/dropped_total"] <= 0.25 * trained


def test_interruptible_rollouts_mix_versions_within_a_completion(tmp_path: Path, tiny_model_dir: Path) -> None:
    link = "{weights_delay: {kind: fixed, seconds: 0.1}}"
    cluster, _records = build(
        tmp_path,
        tiny_model_dir,
        *nodes(f"{{tokens_per_second: 2, link: {link}}}", f"{{tokens_per_second: 40, link: {link}}}"),
        "cluster.mode=async",
        "cluster.learner_step_seconds=0.5",
        "sampler.interruptible=true",
        "sampler.max_new_tokens=3",
        "learner.steps=10",
    )
    mixed = []
    original = cluster.loop.learner.train_step

    def spy(groups):
        mixed.extend(g for g in groups if g.version_GL[g.completion_mask_GL.bool()].unique().numel() > 1)
        return original(groups)

    cluster.loop.learner.train_step = spy
    cluster.run()
    assert mixed, "no rollout was interrupted by a weight update"
    for g in mixed:  # versions never decrease along a completion
        v = g.version_GL
        assert (v[:, 1:] >= v[:, :-1]).all()


def _strip_wall(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith("time/wall")} for r in records]


def test_same_config_and_seed_give_identical_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    link = (
        "{weights_delay: {kind: lognormal, lower: 5, upper: 60, conf: 0.99},"
        " rollout_delay: {kind: exponential, mean: 1}}"
    )
    overrides = [
        *nodes(*[f"{{tokens_per_second: {s}, link: {link}}}" for s in (20, 10, 5)]),
        "cluster.mode=async",
        "cluster.max_staleness=4",
        "cluster.learner_step_seconds=2",
        "objective.name=gepo",
    ]
    runs = []
    for name in ("a", "b"):
        execute(tiny_config(tiny_model_dir, *overrides), tmp_path / name, show_progress=False)
        runs.append(_strip_wall(read_metrics(tmp_path / name / "metrics.jsonl")))
    assert runs[0] == runs[1]
    assert any(r.get("stale/max", 0) > 0 for r in runs[0])  # the delays really made data stale
    other = tiny_config(tiny_model_dir, *overrides, "seed=1")
    execute(other, tmp_path / "c", show_progress=False)
    assert _strip_wall(read_metrics(tmp_path / "c" / "metrics.jsonl")) != runs[0]


def test_what_the_verifier_can_rebuild_does_not_hang_on_the_publishing_thread(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version published as a snapshot alone leaves no patch record, so the versions before it cannot be rebuilt
    once it is in the store: a run that publishes inline and one whose publishing thread is slow must verify the
    same groups."""
    link = "{weights_delay: {kind: exponential, mean: 5}, rollout_delay: {kind: exponential, mean: 1}}"
    overrides = [*nodes(*[f"{{tokens_per_second: {s}, link: {link}}}" for s in (20, 10, 5)]), "cluster.mode=async"]
    overrides += ["cluster.max_staleness=4", "cluster.learner_step_seconds=2", "trust.verify.fraction=1.0"]
    execute(tiny_config(tiny_model_dir, *overrides, "weights.overlap=false"), tmp_path / "a", show_progress=False)
    publish = BackgroundPublisher._publish

    def slow(self: BackgroundPublisher, version: int, weights: dict) -> Published:
        time.sleep(0.5)
        return publish(self, version, weights)

    monkeypatch.setattr(BackgroundPublisher, "_publish", slow)
    execute(tiny_config(tiny_model_dir, *overrides), tmp_path / "b", show_progress=False)
    a, b = (_strip_wall(read_metrics(tmp_path / n / "metrics.jsonl")) for n in "ab")
    last = [r for r in a if r["kind"] == "train"][-1]
    assert last["trust/verified_total"] > 0
    assert last["trust/unverifiable_total"] > 0
    assert a == b


def test_patch_sync_gives_the_same_training_as_full_sync(tiny_model_dir: Path, tmp_path: Path) -> None:
    """PULSE is lossless: swapping the codec changes the bytes on the wire and nothing else. (With a finite
    bandwidth smaller patches also arrive sooner, which legitimately changes what samplers hold; unlimited
    bandwidth isolates the content. The verifier's counts differ: only patch records let it rebuild older
    versions.)"""
    link = "{weights_delay: {kind: uniform, low: 1, high: 20}}"
    overrides = [
        *nodes(*[f"{{tokens_per_second: {s}, link: {link}}}" for s in (20, 10)]),
        "cluster.mode=async",
        "cluster.learner_step_seconds=2",
        "weights.snapshot_every=4",
    ]
    runs = {}
    for codec in ("full", "pulse"):
        cfg = tiny_config(tiny_model_dir, *overrides, f"weights.codec={codec}")
        execute(cfg, tmp_path / codec, show_progress=False)
        runs[codec] = read_metrics(tmp_path / codec / "metrics.jsonl")

    def training(records: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "sync/", "trust/"))} for r in records]

    assert training(runs["full"]) == training(runs["pulse"])
    full_bytes = sum(r["sync/bytes"] for r in runs["full"] if r["kind"] == "train")
    pulse_bytes = sum(r["sync/bytes"] for r in runs["pulse"] if r["kind"] == "train")
    assert pulse_bytes < full_bytes


def _track_syncs(cluster: SimulatedCluster) -> tuple[dict[int, str], list[int]]:
    """Hash the learner's bf16 view of every version, and check every sampler against it after each update."""
    learner_hashes: dict[int, str] = {}
    checked: list[int] = []
    submit = cluster.loop.publisher.submit

    def record(version, weights):
        learner_hashes[version] = state_hash(weights)  # the learner's own bf16 view, hashed independently
        submit(version, weights)

    cluster.loop.publisher.submit = record
    for node in cluster.nodes:
        worker = node.worker

        def verify(update, worker=worker, receive=worker.receive):
            ok = receive(update)
            if ok:
                assert state_hash(worker.receiver.weights) == learner_hashes[worker.receiver.version]
                worker.refresh()
                for name, p in worker.sampler.engine.policy.model.named_parameters():
                    assert torch.equal(p.detach(), worker.receiver.weights[name].float())
                checked.append(worker.receiver.version)
            return ok

        worker.receive = verify
    return learner_hashes, checked


@pytest.mark.parametrize("share", [True, False])
def test_every_sync_leaves_the_sampler_bit_identical_to_the_learner(tmp_path: Path, tiny_model_dir: Path, share):
    link = "{weights_delay: {kind: exponential, mean: 3}, bandwidth_mbps: 1}"
    cluster, _ = build(
        tmp_path,
        tiny_model_dir,
        *nodes(*[f"{{tokens_per_second: {s}, link: {link}}}" for s in (30, 10)]),
        "cluster.mode=async",
        "cluster.learner_step_seconds=1",
        "weights.codec=pulse",
        "weights.snapshot_every=3",
        f"cluster.share_weights={share}",
    )
    _, checked = _track_syncs(cluster)
    cluster.run()
    assert len(set(checked)) > 3
    assert all(n.worker.failed == 0 for n in cluster.nodes)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_weight_link_faults_are_survived_through_snapshots_and_counted(tmp_path: Path, tiny_model_dir: Path, mode):
    """Drops, duplicates, reordering and corruption on both paths: every refused update is followed by a
    snapshot, every sync that lands is bit-identical to the learner, every fault is counted, and training
    reaches the last step (sync mode regenerates what the learner never acknowledged)."""
    faults = "{drop: 0.15, duplicate: 0.15, reorder: 0.1, reorder_seconds: 2, corrupt: 0.25}"
    link = (
        "{weights_delay: {kind: uniform, low: 0.5, high: 3},"
        f" weights_faults: {faults}, rollout_faults: {{drop: 0.1, corrupt: 0.1, duplicate: 0.1}}}}"
    )
    cluster, records = build(
        tmp_path,
        tiny_model_dir,
        *nodes(*[f"{{tokens_per_second: {s}, link: {link}}}" for s in (40, 20)]),
        f"cluster.mode={mode}",
        "cluster.learner_step_seconds=1",
        "weights.codec=pulse",
        "weights.snapshot_every=50",
        "learner.steps=12",
    )
    _, checked = _track_syncs(cluster)
    kinds: list[list[str]] = [[] for _ in cluster.nodes]
    for node, seen in zip(cluster.nodes, kinds, strict=True):
        worker = node.worker

        def note(update, seen=seen, receive=worker.receive, worker=worker):
            failed = worker.failed
            ok = receive(update)
            seen.append("refused" if worker.failed > failed else f"{'ok' if ok else 'ignored'}:{update.kind}")
            return ok

        worker.receive = note
    cluster.run()
    assert len(records) == 12
    assert checked
    summary = cluster.summary()["samplers"]
    weights_faults = sum(sum(s["faults"]["weights"].values()) for s in summary.values())
    rollout_faults = sum(sum(s["faults"]["up"].values()) for s in summary.values())
    assert weights_faults > 0
    assert rollout_faults > 0
    failed = sum(n.worker.failed for n in cluster.nodes)
    assert failed > 0, "with 25% corruption some update must have been refused"
    assert records[-1]["net/weights_failed_total"] <= failed  # reported up to the last step
    rejected = records[-1]["net/rejected_corrupt"] + records[-1]["net/rejected_malformed"]
    corrupted = sum(s["faults"]["up"].get(k, 0) for s in summary.values() for k in ("corrupt", "duplicate"))
    assert 0 < rejected <= corrupted  # only corrupted copies are refused, and never trained
    assert records[-1]["net/duplicates_total"] > 0
    for seen in kinds:  # a refusal makes the sampler ask for a snapshot (patches already on the way may land first)
        if "refused" in seen and any(k.startswith("ok:") for k in seen[seen.index("refused") + 1 :]):
            assert "ok:snapshot" in seen[seen.index("refused") + 1 :], seen


def test_a_learner_that_refuses_every_group_stops_the_simulation_loudly(tmp_path: Path, tiny_model_dir: Path) -> None:
    """In virtual time nothing else would end such a run: it would generate forever. The session's own rule stops
    each sampler after `cluster.max_refusals_in_a_row` refusals, and the simulation says why."""
    from heterorl.loop.intake import Verdict

    cluster, _ = build(tmp_path, tiny_model_dir, "learner.steps=2", "cluster.max_refusals_in_a_row=20")
    cluster.loop.offer = lambda body, digest=None, sender=None: Verdict("invalid", detail="refused for the test")
    pattern = r"stalled.*sampler-0: the learner refused 20 uploads or groups in a row, 20 of them as 'invalid'"
    with pytest.raises(RuntimeError, match=pattern + r" \(last: refused for the test\)"):
        cluster.run()


def _node_weights(cluster: SimulatedCluster) -> list[tuple[int | None, str | None]]:
    held = [n.worker.receiver for n in cluster.nodes]
    return [(r.version, None if r.weights is None else state_hash(r.weights)) for r in held]


@pytest.mark.parametrize(
    "links",
    [
        # finite bandwidths and a finite uplink: arrivals depend on the sizes settled after the publish
        [
            "{tokens_per_second: 30, link: {weights_delay: {kind: exponential, mean: 2}, bandwidth_mbps: 0.05}}",
            "{tokens_per_second: 12, link: {weights_delay: {kind: uniform, low: 0, high: 6}, bandwidth_mbps: 0.2}}",
        ],
        # one faulty link (always bytes) beside an unlimited one (arrival known when sent)
        [
            "{tokens_per_second: 30, link: {weights_delay: {kind: fixed, seconds: 1}}}",
            "{tokens_per_second: 20, link: {weights_delay: {kind: uniform, low: 0.5, high: 3},"
            " weights_faults: {drop: 0.2, corrupt: 0.2}}}",
        ],
    ],
    ids=["bandwidth-uplink", "faulty-beside-clean"],
)
def test_shared_weights_give_the_run_that_decoding_every_update_gives(tmp_path: Path, tiny_model_dir: Path, links):
    """`cluster.share_weights` changes how the bits reach an in-process sampler, not which bits or when: the
    metrics (traffic included), the summary and every sampler's final weights equal those of decoding every
    update's bytes, and only the shared nodes skip decoding."""
    overrides = [
        *nodes(*links),
        "cluster.mode=async",
        "cluster.learner_step_seconds=1",
        "cluster.learner_uplink_mbps=0.3",
        "weights.codec=pulse",
        "weights.snapshot_every=4",
        "learner.steps=8",
    ]
    runs, finals = {}, {}
    for share in (True, False):
        cluster, _ = build(tmp_path / str(share), tiny_model_dir, *overrides, f"cluster.share_weights={share}")
        cluster.run()
        cluster.loop.finish()
        finals[share] = _node_weights(cluster)
        runs[share] = _strip_wall(read_metrics(tmp_path / str(share) / "metrics.jsonl"))
        if share:
            assert [n.side.shares for n in cluster.nodes] == [not n.side.weights.lossy for n in cluster.nodes]
    assert runs[True] == runs[False]
    assert finals[True] == finals[False]
    assert sum(r.get("sync/bytes", 0) for r in runs[True]) > 0


def test_a_receiver_that_adopted_shared_tensors_copies_them_before_applying_bytes() -> None:
    """Copy on write: bytes applied after an adoption never write into the learner's published tensors."""
    from heterorl.simulated.shared_weights import SharedReceiver, SharedUpdate
    from heterorl.weights import WeightStore
    from heterorl.weights.codecs import make_codec

    v0 = {"w": torch.arange(8, dtype=torch.bfloat16)}
    v1 = {"w": v0["w"] + 1}
    store = WeightStore(make_codec("pulse"))
    published = store.publish(0, v0)
    store.publish(1, v1)
    receiver = SharedReceiver()
    settled: list[int] = []
    shared = SharedUpdate(0, v0, settle=lambda: settled.append(0))
    receiver.adopt(shared)
    assert receiver.weights["w"] is v0["w"]
    assert settled == []
    shared.state_hash = published.state_hash
    assert receiver.held() == (0, published.state_hash)
    update = store.update_for(*receiver.held())
    assert update.kind == "patch"
    assert receiver.apply(update)
    assert torch.equal(receiver.weights["w"], v1["w"])
    assert torch.equal(v0["w"], torch.arange(8, dtype=torch.bfloat16))  # untouched
