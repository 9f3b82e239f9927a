"""The end of a run under either clock: the intake closes as the last step commits, before that step's version is
published, so no group made with the last version (which nothing will train) is acknowledged. Live, a group could
arrive between that publish and the end of the run; the simulator, whose run ends with the commit, never took it
(a live run once accepted one group more than its simulated twin)."""

from __future__ import annotations

from pathlib import Path

import pytest

from heterorl.rollout_codec import encode_group
from transport.test_service import REWARD, make_live, sample_groups, varied_reward  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("varied_reward")


@pytest.mark.parametrize("finish", ["last step", "finish requested"])
def test_no_group_is_accepted_once_the_last_version_is_out(tmp_path: Path, tiny_model_dir: Path, finish: str) -> None:
    steps = "learner.steps=1" if finish == "last step" else "learner.steps=3"
    live = make_live(tmp_path / "run", tiny_model_dir, REWARD, steps)
    loop = live.loop
    try:
        groups = sample_groups(live, tiny_model_dir, loop.B + 1)
        assert [loop.offer(encode_group(g)).outcome for g in groups[: loop.B]] == ["accepted"] * loop.B
        late: list[str] = []
        served = loop.before_publish

        def publishing(version: int) -> None:  # a sampler's upload in the moment the version is handed over
            if served is not None:
                served(version)
            if version > 0:
                late.append(loop.offer(encode_group(groups[-1])).outcome)

        loop.before_publish = publishing
        taken = loop.take(0.0)
        assert taken is not None
        result = loop.train(taken)
        if finish == "finish requested":
            loop.request_finish()
        loop.commit(result, 0.0)
        assert loop.done
        assert late == ["finished"]
        assert loop.intake.counters.accepted == loop.B
    finally:
        live.request_stop()
        live.loop.intake.journal.close()
