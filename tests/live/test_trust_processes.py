"""Identities and signed weights across real processes: a learner with per-sampler credentials and a signing key,
two samplers with their own tokens and the learner's public key. Every version a sampler applies is one the learner
signed; revoking one sampler mid-run stops it with one line, and the other finishes the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import tiny_config
from heterorl.config import config_to_yaml
from heterorl.eventlog import read_events
from heterorl.transport.identity import add_sampler, revoke_sampler
from heterorl.weights.signing import write_keypair
from live.test_processes import Processes, processes, status, wait_until  # noqa: F401 (a fixture)

pytestmark = pytest.mark.processes  # `make test-processes`


def test_samplers_with_their_own_tokens_apply_only_signed_weights_and_a_revoked_one_stops(
    tmp_path: Path,
    tiny_model_dir: Path,
    processes: Processes,  # noqa: F811 (the fixture)
) -> None:
    private, public = write_keypair(tmp_path / "keys")
    credentials = tmp_path / "credentials.yaml"
    tokens = {name: add_sampler(credentials, name) for name in ("a", "b")}
    cfg = tiny_config(
        tiny_model_dir,
        "task.reward=heterorl_live_proc_reward:length",
        "cluster.mode=async",
        "cluster.samplers=[{name: a}, {name: b}]",
        "learner.steps=120",  # on a quiet machine b alone made 6 steps in 0.2 s, before a had started
        "weights.codec=pulse",
        "live.poll_seconds=1",
        "live.backoff_initial_s=0.05",
        "live.backoff_max_s=0.5",
        "live.linger_s=5",
        f"trust.learner_private_key={private}",
        f"trust.learner_public_key={public}",
        f"trust.credentials={credentials}",
    )
    config, run = tmp_path / "config.yaml", tmp_path / "run"
    config.write_text(config_to_yaml(cfg))
    address = run / "live" / "learner.json"
    procs = processes
    learner = procs.start("learner", "learner", str(config), "--listen", "127.0.0.1:0", "--run-dir", str(run))
    for i, name in reversed(list(enumerate(("a", "b")))):  # b first: it must hold weights before its revocation
        procs.env = {**procs.env, "HETERORL_TOKEN": str(tokens[name])}  # each sampler its own token
        procs.start(name, "sampler", str(config), "--connect-file", str(address), "--index", str(i))
    wait_until(address.is_file, procs, 120, "the learner to listen")
    url = json.loads(address.read_text())["url"]

    # two steps, and both hold weights (on a loaded machine a could make both steps before b's first update; on a
    # quiet one b could make them all before a started)
    def two_steps_and_both_updated() -> bool:
        held = all(read_events(procs.log(name), "weights") for name in ("a", "b"))
        return held and status(url).get("steps", 0) >= 2

    wait_until(two_steps_and_both_updated, procs, 180, "two steps and both samplers' first weights")

    revoke_sampler(credentials, "b")  # no restart, no signal
    b = procs.procs["b"]
    assert b.wait(timeout=120) != 0
    assert "revoked" in procs.log("b").read_text()
    assert learner.wait(timeout=240) == 0, procs.log("learner").read_text()[-3000:]
    assert procs.procs["a"].wait(timeout=60) == 0

    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 120
    assert summary["net"]["rejected"].get("revoked", 0) >= 1
    published = {(e["version"], e["hash"]) for e in read_events(procs.log("learner")) if e["event"] == "published"}
    for name in ("a", "b"):
        weights = read_events(procs.log(name), "weights")
        assert weights, name
        assert all(e["ok"] for e in weights), name  # every update was signed by the learner's key
        assert {(e["version"], e["hash"]) for e in weights} <= published, name
