"""The learner as 2 gloo processes equals the single-process learner; the plan that shares a step among ranks; a
simulated run under torchrun is the single-process run; the one-line errors of a wrong launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO
from heterorl.config import ModelConfig, config_to_yaml, load_config
from heterorl.launch.torchrun import failed_rank, free_port, last_line, strip_nproc
from heterorl.learner import Learner
from heterorl.parallel import distributed
from heterorl.parallel.collectives import decode_groups, encode_groups
from heterorl.parallel.sharding import Sharding, plan_micro_batches
from heterorl.policy import Policy, SamplingParams
from heterorl.rollout import pack_groups
from heterorl.sampler import Sampler
from heterorl.tasks import make_task

WORKER = Path(__file__).with_name("dist_worker.py")
TWO_LAYERS = {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64}
PER_STEP, STEPS = 4, 3


def _base(model: Path) -> list[str]:
    return [
        f"model.path={model}",
        "task.name=addition",
        "task.digits=1",
        "sampler.group_size=4",
        "sampler.max_new_tokens=5",
        f"learner.groups_per_step={PER_STEP}",
        "learner.lr=1e-3",
        "learner.micro_batch_tokens=30",  # 2-3 micro-batches per rank and minibatch
    ]


@pytest.fixture(scope="module")
def step_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer model (FSDP2 shards each layer) and STEPS batches of groups from a slightly stale sampler."""
    root = tmp_path_factory.mktemp("dist")
    Policy.from_config(ModelConfig(**TWO_LAYERS), seed=0).save(root / "model")
    cfg = load_config(None, _base(root / "model"))
    sampler = Sampler.from_policy(
        "s", Policy.load(root / "model"), make_task(cfg.task), SamplingParams(max_new_tokens=5), 4, seed=1
    )
    sampler.load_weights(0, dict(Policy.load(root / "model").model.named_parameters()))
    groups = sampler.generate_groups(PER_STEP * STEPS)
    for i, g in enumerate(groups):
        g.rewards_G = torch.tensor([1.0, 0.0, float(i % 2), 0.5])
        g.behavior_logp_GL = g.behavior_logp_GL - 0.05 * g.completion_mask_GL
    (root / "groups.bin").write_bytes(encode_groups(groups))
    return root


def _env(tmp_path: Path) -> dict[str, str]:
    """The ranks' environment; TMPDIR: what torchrun's agent and the launcher leave in the temp folder (their
    logs, kept after a failure) stays in the test's own folder."""
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONPATH": str(REPO / "src"),
        "TMPDIR": str(tmp_path),
    }


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        *args,
    ]


CASES = {
    "fsdp2-grpo": ["parallel.strategy=fsdp2", "objective.name=grpo"],
    "fsdp2-gepo": ["parallel.strategy=fsdp2", "objective.name=gepo"],
    "ddp-grpo": ["parallel.strategy=ddp", "objective.name=grpo"],
    "ddp-gepo": ["parallel.strategy=ddp", "objective.name=gepo"],
    # proximal log-probs, a frozen reference, token_mean, 2 optimizer steps a batch, truncation masks
    "fsdp2-decoupled-ppo-options": [
        "parallel.strategy=fsdp2",
        "objective.name=decoupled_ppo",
        "objective.ref_kl_beta=0.1",
        "objective.aggregation=token_mean",
        "objective.mask_truncated=true",
        "learner.updates_per_batch=2",
    ],
}


@pytest.mark.distributed
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_gloo_ranks_train_the_single_process_parameters(step_data: Path, tmp_path: Path, case: str) -> None:
    overrides = [*_base(step_data / "model"), *CASES[case]]
    argv = _torchrun(2, str(WORKER), str(step_data / "model"), str(step_data / "groups.bin"), str(tmp_path))
    done = subprocess.run([*argv, str(PER_STEP), *overrides], env=_env(tmp_path), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-4000:]

    torch.set_num_threads(1)
    cfg = load_config(None, overrides)
    single = Learner(Policy.load(step_data / "model"), cfg)
    initial = {k: v.detach().clone() for k, v in single.policy.model.named_parameters()}
    groups = decode_groups((step_data / "groups.bin").read_bytes(), 1 << 20)
    stats = [single.train_step(groups[i : i + PER_STEP]) for i in range(0, len(groups), PER_STEP)]

    ranked = load_file(str(tmp_path / "params.safetensors"))
    params = dict(single.policy.model.named_parameters())
    moved = max(float((params[k].detach() - initial[k]).abs().max()) for k in params)
    diff = max(float((params[k].detach() - ranked[k]).abs().max()) for k in params)
    print(f"\n{case}: {STEPS} steps, max |2 ranks - 1 process| = {diff:.3g} (the parameters moved {moved:.3g})")
    assert moved > 1e-3  # the steps did something
    assert diff < 1e-6
    moments = load_file(str(tmp_path / "moments.safetensors"))
    state = single.optimizer.state_dict()["state"]
    assert len(moments) == 2 * len(state)  # exp_avg and exp_avg_sq of every parameter, gathered on rank 0
    for name, value in moments.items():
        index, key = name.split(".", 1)
        expected = state[int(index)][key]  # elementwise error relative to the tensor's scale (moments near 0)
        assert float((expected - value).abs().max()) <= 1e-4 * float(expected.abs().max()), name
    ranked_stats = json.loads((tmp_path / "stats.json").read_text())
    for mine, theirs in zip(stats, ranked_stats, strict=True):
        assert set(mine) == set(theirs)
        for key, value in mine.items():
            assert theirs[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    follower = json.loads((tmp_path / "rank1.json").read_text())
    share = follower["local"] / follower["full"]
    assert share == (pytest.approx(0.5, abs=0.01) if "fsdp2" in case else 1.0)  # FSDP2 shards, DDP replicates


@pytest.mark.distributed
def test_a_simulated_run_under_torchrun_is_the_single_process_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    from conftest import tiny_config
    from heterorl.simulated.run import execute

    cfg = tiny_config(tiny_model_dir, "learner.steps=3", "learner.micro_batch_tokens=40", "eval.every=3")
    config = tmp_path / "config.yaml"
    config.write_text(config_to_yaml(cfg))
    argv = [sys.executable, "-m", "heterorl.cli", "run", str(config), "--run-dir", str(tmp_path / "two"), "-q"]
    done = subprocess.run([*argv, "--nproc", "2"], env=_env(tmp_path), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    torch.set_num_threads(1)
    execute(cfg, tmp_path / "one", show_progress=False)

    def train_records(run: Path) -> list[dict]:
        return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"train"' in x]

    one, two = train_records(tmp_path / "one"), train_records(tmp_path / "two")
    assert [r["reward/mean"] for r in one] == [r["reward/mean"] for r in two]  # the samplers saw the same weights
    assert [r["obj/loss"] for r in two] == pytest.approx([r["obj/loss"] for r in one], rel=1e-4, abs=1e-7)
    a = load_file(str(tmp_path / "one" / "checkpoint" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "checkpoint" / "model.safetensors"))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["steps"] == 3


# ---------------------------------------------------------------- the plan (no processes)
def _batch(step_data: Path):
    policy = Policy.load(step_data / "model")
    groups = decode_groups((step_data / "groups.bin").read_bytes(), 1 << 20)[:PER_STEP]
    return pack_groups(groups, policy.pad_id)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("budget", [None, 30])
def test_every_group_goes_to_one_rank_and_every_rank_runs_as_many_slots(
    step_data: Path, world: int, budget: int | None
) -> None:
    batch = _batch(step_data)
    rows_B = torch.arange(batch.rewards_B.shape[0])
    mask_BL = batch.completion_mask_BL.bool()
    plans = [plan_micro_batches(batch, rows_B, budget, mask_BL, r, world) for r in range(world)]
    assert len({len(p) for p in plans}) == 1  # the same collectives on every rank
    assert all(p[-1].last and not any(m.last for m in p[:-1]) for p in plans)
    live = torch.cat([m.rows_B for p in plans for m in p if m.live])
    assert sorted(live.tolist()) == rows_B.tolist()  # each row trained exactly once
    for p in plans:
        owned = {int(batch.group_index_B[r]) for m in p if m.live for r in m.rows_B}
        others = {int(batch.group_index_B[r]) for q in plans if q is not p for m in q if m.live for r in m.rows_B}
        assert not owned & others  # whole groups: a group's rows never straddle two ranks
    for m in (m for p in plans for m in p if not m.live):
        assert len(m.rows_B) == 1  # a stand-in: one row with loss tokens
        assert bool(mask_BL[m.rows_B].any())
    if world == 1:
        assert [m.rows_B.tolist() for m in plans[0]] == [
            m.rows_B.tolist() for m in Sharding().micro_batches(batch, rows_B, budget, mask_BL)
        ]


def test_micro_batches_without_loss_tokens_are_dropped_on_every_rank(step_data: Path) -> None:
    batch = _batch(step_data)
    rows_B = torch.arange(batch.rewards_B.shape[0])
    mask_BL = torch.zeros_like(batch.completion_mask_BL, dtype=torch.bool)
    assert all(plan_micro_batches(batch, rows_B, 30, mask_BL, r, 2) == [] for r in range(2))


# ---------------------------------------------------------------- one-line errors
def test_launch_mistakes_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(None, ["parallel.strategy=none"])
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(distributed.DistributedSetupError, match="LOCAL_RANK, MASTER_ADDR, MASTER_PORT unset"):
        distributed.start(cfg)
    for var, value in (("LOCAL_RANK", "1"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "1")):
        monkeypatch.setenv(var, value)
    with pytest.raises(distributed.DistributedSetupError, match="strategy is none but this is rank 1 of 2"):
        distributed.start(cfg)
    with pytest.raises(distributed.DistributedSetupError, match=r"nccl needs CUDA but model\.device resolves to cpu"):
        distributed.start(load_config(None, ["parallel.backend=nccl", "model.device=cpu"]))
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert distributed.start(cfg) is None  # not under torchrun: one process


def test_nproc_is_not_passed_on_to_the_ranks() -> None:
    args = ["run", "c.yaml", "--nproc", "2", "--run-dir", "r", "--nproc=3", "-q"]
    assert strip_nproc(args) == ["run", "c.yaml", "--run-dir", "r", "-q"]


def test_the_rank_named_is_the_one_that_failed_not_the_one_the_agent_stopped(tmp_path: Path) -> None:
    """torchrun's agent SIGTERMs the ranks still running once one fails: rank 0 stopped that way (CI saw
    "rank 0 exited with code -15") must not hide the follower that failed, nor its last line."""
    from types import SimpleNamespace

    stopped, failed = SimpleNamespace(exitcode=-15), SimpleNamespace(exitcode=1)
    assert failed_rank({0: stopped, 1: failed}) == (1, failed)
    assert failed_rank({0: failed, 1: stopped}) == (0, failed)
    assert failed_rank({1: stopped, 0: stopped}) == (0, stopped)  # the run itself was terminated
    killed = SimpleNamespace(exitcode=-9)
    assert failed_rank({0: stopped, 2: killed, 1: stopped}) == (2, killed)
    log = tmp_path / "stderr.log"
    assert last_line(log) == "no output"
    log.write_text("Traceback ...\nheterorl: error: the run directory is gone\n\n")
    assert last_line(log) == "heterorl: error: the run directory is gone"
