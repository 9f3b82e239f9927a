"""The simulated cluster: staleness follows the network, control rules hold, runs are deterministic."""

import math
from pathlib import Path

import pytest
import torch

from conftest import tiny_config
from heterorl.learner import Learner
from heterorl.metrics import read_metrics
from heterorl.policy import Policy, SamplingParams
from heterorl.rollout import RolloutGroup
from heterorl.run import execute, sampler_seed
from heterorl.sampler import Sampler
from heterorl.simulated.cluster import SimulatedCluster
from heterorl.tasks import make_task
from heterorl.weights import state_hash


def build(model_dir: Path, *overrides: str) -> tuple[SimulatedCluster, list[dict]]:
    cfg = tiny_config(model_dir, *overrides)
    task = make_task(cfg.task)
    params = SamplingParams.from_config(cfg.sampler)
    samplers = [
        Sampler.from_policy(
            f"s{i}", Policy.load(model_dir), task, params, cfg.sampler.group_size, sampler_seed(cfg.seed, i)
        )
        for i in range(len(cfg.cluster.samplers))
    ]
    records: list[dict] = []
    cluster = SimulatedCluster(cfg, Learner(Policy.load(model_dir), cfg), samplers, records.append)
    return cluster, records


def nodes(*specs: str) -> list[str]:
    """Overrides that define len(specs) sampler nodes, each spec a flow-style YAML mapping."""
    return [f"cluster.samplers=[{', '.join(specs)}]"]


@pytest.mark.parametrize(("delay", "cost"), [(25.0, 10.0), (7.0, 3.0), (0.5, 2.0)])
def test_fixed_delay_gives_the_staleness_the_arithmetic_predicts(tiny_model_dir: Path, delay: float, cost: float):
    """Fast sampler, eta=0: the batch of step k is generated when step k-1 ends, with the newest weights that
    have crossed the link, so staleness = min(k - 1, ceil(delay / cost)) at step k."""
    link = f"{{weights_delay: {{kind: fixed, seconds: {delay}}}}}"
    cluster, records = build(
        tiny_model_dir,
        *nodes(f"{{tokens_per_second: 1.0e9, link: {link}}}"),
        "cluster.mode=async",
        "cluster.eta=0",
        f"cluster.learner_step_seconds={cost}",
        "learner.steps=8",
    )
    cluster.run()
    lag = math.ceil(delay / cost)
    assert [r["stale/max"] for r in records] == [min(k - 1, lag) for k in range(1, 9)]
    assert [r["stale/mean"] for r in records] == [min(k - 1, lag) for k in range(1, 9)]
    assert records[-1]["time/virtual"] == pytest.approx(delay + 8 * cost, abs=1e-3)


def test_sync_mode_pays_every_delay_and_is_never_stale(tiny_model_dir: Path) -> None:
    link = "{weights_delay: {kind: fixed, seconds: 5}, rollout_delay: {kind: fixed, seconds: 2}}"
    cluster, records = build(
        tiny_model_dir,
        *nodes(f"{{tokens_per_second: 1.0e9, link: {link}}}", f"{{tokens_per_second: 1.0e9, link: {link}}}"),
        "cluster.learner_step_seconds=3",
        "learner.steps=4",
    )
    cluster.run()
    assert all(r["stale/max"] == 0 for r in records)
    assert [r["time/virtual"] for r in records] == pytest.approx([10 * k for k in range(1, 5)], abs=1e-3)
    assert all(r[f"sampler/s{i}/version"] == r["step"] - 1 for r in records for i in range(2))


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


def test_window_drops_exactly_the_groups_older_than_max_staleness(tiny_model_dir: Path) -> None:
    cluster, _ = build(tiny_model_dir, "cluster.mode=async", "cluster.max_staleness=3")
    cluster.learner.version = 10
    for i, v in enumerate([5, 6, 7, 8, 9, 10, 6, 7]):
        cluster.buffer.add(_group(v, i))
    assert cluster.buffer.drop_stale(cluster.learner.version) == 3  # 5, 6, 6 (staleness 4+) go; 7 (3) stays
    assert [g.min_version for g in cluster.buffer.groups] == [7, 8, 9, 10, 7]
    assert cluster.buffer.dropped == 3
    batch, stats = cluster.buffer.take(4, cluster.learner.version)
    assert [g.min_version for g in batch] == [7, 8, 9, 10]  # oldest first
    assert stats == {"stale/mean": 1.5, "stale/max": 3.0, "stale/dropped_step": 0.0, "stale/dropped_total": 3.0}
    assert cluster.buffer.take(2, cluster.learner.version) is None


def test_staleness_counts_the_oldest_token_of_a_group() -> None:
    g = _group(4, 0)  # tokens from versions 4 and 5 (an interrupted rollout)
    assert g.min_version == 4
    assert g.staleness(9) == 5


@pytest.mark.parametrize("eta", [0, 1, 3])
def test_areal_admission_never_runs_more_than_eta_versions_ahead(tiny_model_dir: Path, eta: int) -> None:
    link = "{weights_delay: {kind: uniform, low: 1, high: 30}}"
    cluster, _records = build(
        tiny_model_dir,
        *nodes(*[f"{{tokens_per_second: {s}, link: {link}}}" for s in (50, 25, 12.5)]),
        "cluster.mode=async",
        f"cluster.eta={eta}",
        "cluster.learner_step_seconds=1",
        "learner.steps=6",
    )
    cluster.run()
    B = cluster.B
    assert cluster.admissions
    assert all(in_budget <= (eta + v + 1) * B for in_budget, v in cluster.admissions)
    if eta == 0:  # synchronous in generation: never more than one batch beyond the learner's version
        assert max(in_budget - v * B for in_budget, v in cluster.admissions) <= B


def test_interruptible_rollouts_mix_versions_within_a_completion(tiny_model_dir: Path) -> None:
    link = "{weights_delay: {kind: fixed, seconds: 0.1}}"
    cluster, _records = build(
        tiny_model_dir,
        *nodes(f"{{tokens_per_second: 2, link: {link}}}", f"{{tokens_per_second: 40, link: {link}}}"),
        "cluster.mode=async",
        "cluster.learner_step_seconds=0.5",
        "sampler.interruptible=true",
        "sampler.max_new_tokens=3",
        "learner.steps=10",
    )
    mixed = []
    original = cluster.learner.train_step

    def spy(groups):
        mixed.extend(g for g in groups if g.version_GL[g.completion_mask_GL.bool()].unique().numel() > 1)
        return original(groups)

    cluster.learner.train_step = spy
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


def test_patch_sync_gives_the_same_training_as_full_sync(tiny_model_dir: Path, tmp_path: Path) -> None:
    """PULSE is lossless: swapping the codec changes the bytes on the wire and nothing else. (With a finite
    bandwidth smaller patches also arrive sooner, which legitimately changes what samplers hold; unlimited
    bandwidth isolates the content.)"""
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
        return [{k: v for k, v in r.items() if not k.startswith(("time/", "sync/"))} for r in records]

    assert training(runs["full"]) == training(runs["pulse"])
    full_bytes = sum(r["sync/bytes"] for r in runs["full"] if r["kind"] == "train")
    pulse_bytes = sum(r["sync/bytes"] for r in runs["pulse"] if r["kind"] == "train")
    assert pulse_bytes < full_bytes


def test_every_sync_leaves_the_sampler_bit_identical_to_the_learner(tiny_model_dir: Path) -> None:
    link = "{weights_delay: {kind: exponential, mean: 3}}"
    cluster, _ = build(
        tiny_model_dir,
        *nodes(*[f"{{tokens_per_second: {s}, link: {link}}}" for s in (30, 10)]),
        "cluster.mode=async",
        "cluster.learner_step_seconds=1",
        "weights.codec=pulse",
        "weights.snapshot_every=3",
    )
    learner_hashes: dict[int, str] = {}
    submit = cluster.publisher.submit

    def record(version, weights):
        learner_hashes[version] = state_hash(weights)  # the learner's own bf16 view, hashed independently
        submit(version, weights)

    cluster.publisher.submit = record
    checked = []
    original = cluster._apply_inbox

    def verify(node):
        original(node)
        if node.receiver.version is not None:
            assert state_hash(node.receiver.weights) == learner_hashes[node.receiver.version]
            for name, p in node.sampler.engine.policy.model.named_parameters():
                assert torch.equal(p.detach(), node.receiver.weights[name].float())
            checked.append(node.receiver.version)

    cluster._apply_inbox = verify
    cluster.run()
    assert len(set(checked)) > 3
    assert all(n.failed_updates == 0 for n in cluster.nodes)
