"""The demo config live in the WAN lab (`-m wanlab`, root): a learner and three sampler processes in their own
network namespaces, each link shaped packet by packet (configs/wanlab.yaml: 50 ms / 300 ms / 1 s one way,
100 / 20 / 5 Mbit/s), run to the last step while the `near` link is cut for 30 s in the middle (`WanLab.cut` once
the learner reaches step 60 of 200; the near sampler delivers most groups, so the run cannot end during the cut);
every group a sampler saw acknowledged is trained, still queued in the learner's saved state, or counted as dropped
for staleness."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
import yaml

from heterorl.config import load_config
from heterorl.durable.state import latest_state, read_records
from heterorl.lab import WanLab
from heterorl.live import launcher
from heterorl.live.launcher import run_live
from heterorl.rollout_codec import GroupLimits, decode_group

pytestmark = pytest.mark.wanlab
REPO = Path(__file__).resolve().parents[2]
CUT_AT_STEP, CUT_S = 60, 30.0


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


class CutMidway(WanLab):
    """The run's lab: cuts link 0 (`near`) for CUT_S once metrics.jsonl reaches step CUT_AT_STEP."""

    metrics: ClassVar[Path]
    cut_at: ClassVar[list[float]] = []

    def __enter__(self) -> CutMidway:
        super().__enter__()
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def _watch(self) -> None:
        while self._router is not None:
            lines = self.metrics.read_text().splitlines() if self.metrics.exists() else []
            if len(lines) >= CUT_AT_STEP:
                self.cut(0, CUT_S)
                CutMidway.cut_at.append(time.time())
                return
            time.sleep(0.2)


def test_the_demo_runs_live_in_the_lab_to_the_end_through_a_30_s_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = yaml.safe_load((REPO / "configs" / "wanlab.yaml").read_text())
    data["live"] = {"wan_lab": True}
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(tmp_path / "lab.yaml")
    run = tmp_path / "run"
    CutMidway.metrics = run / "metrics.jsonl"
    monkeypatch.setattr(launcher, "WanLab", CutMidway)

    summary = run_live(cfg, run, show_progress=False)

    assert summary["steps"] == cfg.learner.steps
    live = run / "live"
    acked: set[str] = set()
    for i in range(3):
        lines = events(live / f"sampler-{i}.log")
        acked |= {e["group_id"] for e in lines if e["event"] == "pushed" and e["outcome"] in ("accepted", "duplicate")}
        assert (lines[-1]["event"], lines[-1]["stopped"]) == ("finished", None), lines[-1]
    near_events = events(live / "sampler-0.log")
    down = [e["t"] for e in near_events if e["event"] == "link_down"]
    up = [e["t"] for e in near_events if e["event"] == "link_up"]
    assert CutMidway.cut_at, "the run ended before the cut"
    assert down, "the near sampler never reported its link down during the cut"
    assert down[0] >= CutMidway.cut_at[0] - 0.5
    assert up, "the near sampler never reported its link up again"
    learner = events(live / "learner.log")
    after_cut = [e for e in learner if e["event"] == "trained" and e["t"] > up[-1]]
    assert any(g.startswith("near:") for e in after_cut for g in e["groups"]), "no near group trained after the cut"
    trained = {g for e in learner if e["event"] == "trained" for g in e["groups"]}
    state = latest_state(live / "state")
    assert state is not None
    count = json.loads((state / "state.json").read_text())["queue_count"]
    limits = GroupLimits(vocab_size=1 << 30, current_version=1 << 30)
    queued = {decode_group(b, limits).group_id for b in read_records(state / "queue.records", count)}
    missing = acked - trained - queued
    assert len(missing) <= summary["groups_dropped"], sorted(missing)[:5]
    assert summary["accuracy_final"] > summary["accuracy_initial"]
