"""Durability from the first acknowledged group: a learner killed (SIGKILL) before its first periodic checkpoint
resumes without losing or double-training an acknowledged group; a learner killed before it ever listened starts
afresh, with or without --resume; stale temporaries of a killed save are removed; one learner per directory."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from conftest import tiny_config
from heterorl.config import config_to_yaml
from heterorl.durable.journal import Journal, read_segment, segment_indices
from heterorl.eventlog import EventLog, read_events
from heterorl.failpoints import ENV as FAILPOINT_ENV
from heterorl.live.learner_node import _check_run_dir, open_learner, run_dir_lock
from heterorl.live.preflight import LiveSetupError
from heterorl.rollout_codec import GroupLimits, decode_group, encode_group
from live.test_processes import Processes, acked, processes, state_group_ids, status, wait_until  # noqa: F401
from transport.test_service import REWARD, make_live, sample_groups, varied_reward  # noqa: F401

ANY = GroupLimits(vocab_size=2**31 - 1, current_version=2**31 - 1)


def journal_payloads(run: Path) -> list[bytes]:
    journal = run / "live" / "journal"
    return [m for i in segment_indices(journal) for m in read_segment(journal / f"{i:08d}.journal")]


def trained_lineage(*logs: Path) -> dict[int, list[str]]:
    """version -> group ids of the step that made it, the last life's record winning (redone steps replace)."""
    lineage: dict[int, list[str]] = {}
    for log in logs:
        resumed = [e["version"] for e in read_events(log, "resumed")]
        if resumed:  # steps after the resumed version are redone by this life
            lineage = {v: g for v, g in lineage.items() if v <= resumed[0]}
        for e in read_events(log, "trained"):
            lineage[e["version"]] = [g[0] for g in e["groups"]]  # [id, oldest version, sampler]
    return lineage


@pytest.mark.processes
@pytest.mark.parametrize(
    "failpoint",
    [None, "journal.appended:6"],
    ids=["killed from outside after two steps", "killed between a journal append and its acknowledgement"],
)
def test_a_learner_killed_before_its_first_periodic_checkpoint_resumes(
    tmp_path: Path, tiny_model_dir: Path, request: pytest.FixtureRequest, failpoint: str | None
) -> None:
    cfg = tiny_config(
        tiny_model_dir,
        "task.reward=heterorl_live_proc_reward:length",
        "cluster.samplers=[{name: a, link: {rollout_delay: {kind: fixed, seconds: 0.05}}}]",
        "learner.steps=6",
        "live.emulate_links=true",
        "live.checkpoint_every=100",  # no periodic state before the kill
        "live.poll_seconds=1",
        "live.backoff_initial_s=0.05",
        "live.backoff_max_s=0.5",
    )
    config, run = tmp_path / "config.yaml", tmp_path / "run"
    config.write_text(config_to_yaml(cfg))
    address = run / "live" / "learner.json"
    procs: Processes = request.getfixturevalue("processes")
    env = procs.env
    procs.env = {**env, FAILPOINT_ENV: failpoint} if failpoint else env
    learner = procs.start("learner-1", "learner", str(config), "--listen", "127.0.0.1:0", "--run-dir", str(run))
    procs.env = env
    procs.start("a-1", "sampler", str(config), "--connect-file", str(address), "--index", "0")
    wait_until(address.is_file, procs, 120, "the learner to listen")
    url = json.loads(address.read_text())["url"]
    if failpoint is None:
        wait_until(lambda: status(url).get("steps", 0) >= 2, procs, 120, "two steps")
        learner.kill()
    assert learner.wait(timeout=120) == -9
    acked_before = acked(procs, "a-1")
    assert len(acked_before) >= 4  # acknowledged (an upload of several groups is answered once all are journaled)
    journaled = {decode_group(m, ANY).group_id for m in journal_payloads(run)}
    assert acked_before <= journaled  # what the learner answered 200 to was in the journal
    if failpoint:
        assert journaled - acked_before  # journaled, then killed before the answer went out

    listen = "127.0.0.1:" + url.rsplit(":", 1)[1]
    resumed = procs.start("learner-2", "learner", str(config), "--listen", listen, "--run-dir", str(run), "--resume")
    assert resumed.wait(timeout=120) == 0, procs.log("learner-2").read_text()[-3000:]
    assert procs.procs["a-1"].wait(timeout=30) == 0
    (event,) = read_events(procs.log("learner-2"), "resumed")
    assert event["version"] == 0  # the state written before the first group was acknowledged

    consumed, queued = state_group_ids(run)
    assert acked(procs, "a-1") <= consumed | queued  # no acknowledged group lost
    lineage = trained_lineage(procs.log("learner-1"), procs.log("learner-2"))
    assert sorted(lineage) == list(range(1, 7))
    trained = [gid for groups in lineage.values() for gid in groups]
    assert len(trained) == len(set(trained))  # none trained twice in the run's history
    assert journaled <= set(trained) | queued


def test_a_learner_killed_before_it_listened_starts_afresh(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = tiny_config(tiny_model_dir)
    run = tmp_path / "run"
    Journal(run / "live" / "journal").close()  # what open_learner left: an empty segment
    (run / "metrics.jsonl").write_text('{"kind": "eval", "step": 0}\n')  # and its initial evaluation
    (run / "live" / "state" / ".tmp-s00000000-v00000000-123").mkdir(parents=True)
    assert _check_run_dir(cfg, run, resume=True) is False  # nothing was acknowledged: nothing to resume
    assert not (run / "live" / "journal").exists()
    assert not (run / "metrics.jsonl").exists()
    live = open_learner(cfg, run, str(tiny_model_dir), events=EventLog(io.StringIO()))
    assert not list((run / "live" / "state").iterdir())  # the killed save's temporary directory is gone
    live.loop.intake.journal.close()
    live.loop.publisher.close()
    Journal(run / "live" / "journal").append(b"an acknowledged group")
    with pytest.raises(LiveSetupError, match="1 acknowledged groups but"):
        _check_run_dir(cfg, run, resume=True)


def test_one_learner_per_run_directory(tmp_path: Path) -> None:
    with (
        run_dir_lock(tmp_path),
        pytest.raises(LiveSetupError, match="in use by a running learner"),
        run_dir_lock(tmp_path),
    ):
        pass
    with run_dir_lock(tmp_path):  # released with its holder
        pass


@pytest.mark.usefixtures("varied_reward")
def test_no_group_is_acknowledged_after_the_final_state(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A POST that arrives while the learner writes its final state is told the run is finished (410), not
    acknowledged into a journal segment that no state or training step will ever read."""
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, "learner.steps=1")
    groups = sample_groups(live, tiny_model_dir, 5)
    for g in groups[:4]:
        assert live.loop.offer(encode_group(g)).outcome == "accepted"
    checkpoint, late = live.checkpoint, []

    def checkpoint_while_a_post_arrives() -> Path:
        late.append(live.loop.offer(encode_group(groups[4])))
        return checkpoint()

    live.checkpoint = checkpoint_while_a_post_arrives  # type: ignore[method-assign]
    live.train()
    assert [v.outcome for v in late] == ["finished"]  # (HTTP says it with a 410)
    assert groups[4].group_id not in live.loop.intake.payloads
