"""The store on the simulated clock: the learner's egress per version does not grow with the number of samplers
(HTTP fan-out's does, exactly N-fold in sync mode), a slow learner uplink delays fan-out N times per version and
the store once, and a run through the store is as deterministic as any simulated run."""

from pathlib import Path

from conftest import capture_records, tiny_config
from heterorl.simulated.run import build_simulated


def run(tmp: Path, model_dir: Path, n: int, weights: str, *extra: str) -> tuple[dict, list[dict]]:
    nodes = ", ".join("{tokens_per_second: 1.0e6}" for _ in range(n))
    cfg = tiny_config(
        model_dir,
        f"cluster.samplers=[{nodes}]",
        "weights.codec=pulse",
        "learner.steps=4",
        f"transport.weights={weights}",
        "transport.store.poll_seconds=0.5",
        *extra,
    )
    run_dir = tmp / f"{weights}-{n}-{len(list(tmp.iterdir()))}"
    run_dir.mkdir()
    cluster = build_simulated(cfg, run_dir, str(model_dir))
    records = capture_records(cluster)
    cluster.run()
    cluster.loop.publisher.close()
    return cluster.loop.summary(), records


def test_store_egress_is_independent_of_the_number_of_samplers(tmp_path: Path, tiny_model_dir: Path) -> None:
    http1, _ = run(tmp_path, tiny_model_dir, 1, "http")
    http3, _ = run(tmp_path, tiny_model_dir, 3, "http")
    store1, _ = run(tmp_path, tiny_model_dir, 1, "store")
    store3, _ = run(tmp_path, tiny_model_dir, 3, "store")
    assert http3["weight_bytes_sent"] == 3 * http1["weight_bytes_sent"]
    assert store3["weight_bytes_sent"] == store1["weight_bytes_sent"] > 0


def test_a_slow_uplink_costs_fan_out_per_sampler_and_the_store_once(tmp_path: Path, tiny_model_dir: Path) -> None:
    slow = ("cluster.learner_uplink_mbps=0.05", "cluster.learner_step_seconds=0")
    http, _ = run(tmp_path, tiny_model_dir, 3, "http", *slow)
    store, _ = run(tmp_path, tiny_model_dir, 3, "store", *slow)
    assert store["clock_seconds"] < http["clock_seconds"]


def test_a_run_through_the_store_is_deterministic(tmp_path: Path, tiny_model_dir: Path) -> None:
    mix = ("cluster.mode=async", "transport.rollouts=store")
    _, first = run(tmp_path, tiny_model_dir, 2, "store", *mix)
    _, second = run(tmp_path, tiny_model_dir, 2, "store", *mix)
    wall = ("time/wall", "time/wall_publish")
    assert [{k: v for k, v in r.items() if k not in wall} for r in first] == [
        {k: v for k, v in r.items() if k not in wall} for r in second
    ]
