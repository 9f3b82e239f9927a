"""A large-cluster plan (`cluster.modelled`): the simulated links charge the modelled model's update sizes while the
small model computes; `replicas` declares many samplers; live refuses the section; every output labels the run."""

import json
import re
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from conftest import tiny_config
from heterorl.cli import app
from heterorl.config import ConfigError, config_to_yaml, load_config, validate_config
from heterorl.live.preflight import LiveSetupError, check_live_config
from heterorl.simulated.run import build_simulated
from heterorl.transport.simulated.modelled import ModelledSizes, modelled_note
from heterorl.transport.wire import UPLOAD_MAGIC, decode_upload
from heterorl.weights import WeightStore
from heterorl.weights.codecs import make_codec
from heterorl.weights.envelope import envelope_nbytes

BILLION = "cluster.modelled={parameters: 1000000000, changed_fraction: 0.01, bytes_per_changed: 1.164}"


# ---------------------------------------------------------------- sizes
Published = tuple[WeightStore, dict[int, str]]


def _store(codec: str, versions: int, max_chain: int = 16) -> Published:
    """A store that published versions 0..versions-1 of a small bf16 tensor, a snapshot every 3 versions (0, 3),
    and each version's hash."""
    store = WeightStore(make_codec(codec), snapshot_every=3, max_chain=max_chain, wire_dtype=torch.bfloat16)
    w = torch.linspace(-1, 1, 512)
    return store, {v: store.publish(v, {"w": w + v * 0.01}).state_hash for v in range(versions)}


def _charged(sizes: ModelledSizes, published: Published, held_version: int | None) -> tuple[int, str]:
    """(modelled bytes less the envelope's frame, the real update's kind) for a receiver holding `held_version`."""
    store, hashes = published
    held = (None, None) if held_version is None else (held_version, hashes[held_version])
    update = store.update_for(*held)
    frame = envelope_nbytes(update) - update.nbytes
    assert 0 < frame < 1000
    return sizes.update_nbytes(update, store, held) - frame, update.kind


def test_modelled_sizes_are_the_formula_computed_by_hand() -> None:
    """P = 1e9 bf16 parameters, f = 1%, b = 1.164 B: a snapshot is 2e9 bytes (raw bf16), a patch over k steps
    1e9 * (1 - 0.99^k) * 1.164; the store is at v5 with its newest snapshot at v3."""
    cfg = load_config(None, [BILLION])
    sizes = ModelledSizes.from_config(cfg)
    assert sizes is not None
    assert (sizes.snapshot_nbytes, sizes.full_nbytes) == (2_000_000_000, 2_000_000_000)
    assert sizes.patch_nbytes(1) == 11_640_000
    assert sizes.patch_nbytes(2) == 23_163_600  # 1e9 * 0.0199 * 1.164
    store = _store("pulse", 6)
    assert store[0].snapshot_version == 3
    assert _charged(sizes, store, 4) == (11_640_000, "patch")
    assert _charged(sizes, store, 0) == (round(1e9 * (1 - 0.99**5) * 1.164), "patch")
    assert _charged(sizes, store, None) == (2_000_000_000 + 23_163_600, "snapshot")  # snapshot v3 + patch v3 -> v5


def test_the_modelled_store_serves_a_snapshot_where_it_is_smaller_or_no_patch_can_be_served() -> None:
    """The choice is the store's rule at modelled sizes: the smaller of patch and snapshot when a patch can be
    served at all (held version retained, chain within max_chain; never with the full codec)."""
    dense = load_config(None, ["cluster.modelled={parameters: 1000, snapshot_bytes_per_parameter: 3.0, "
                               "changed_fraction: 0.5, bytes_per_changed: 4.0}"])  # fmt: skip
    sizes = ModelledSizes.from_config(dense)
    assert sizes is not None
    at_snapshot = _store("pulse", 4)  # the newest, v3, is a snapshot: 3000 bytes
    assert _charged(sizes, at_snapshot, 2) == (2000, "patch")  # one step: 1000 * 0.5 * 4 < 3000
    assert _charged(sizes, at_snapshot, 0) == (3000, "patch")  # three steps: 1000 * 0.875 * 4 = 3500 > 3000
    short = _store("pulse", 6, max_chain=2)  # v0 -> v5 is a chain of 5 > 2: snapshot v3 + patch over 2 steps
    assert _charged(sizes, short, 0) == (3000 + 3000, "snapshot")
    assert _charged(sizes, _store("full", 6), 4) == (3000, "snapshot")  # no patches: always the snapshot


# ---------------------------------------------------------------- on the links
@pytest.mark.parametrize(("share", "faults"), [(True, ""), (False, ""), (True, ", weights_faults: {duplicate: 0.5}")])
def test_a_modelled_snapshot_takes_its_size_over_the_link(tmp_path: Path, tiny_model_dir: Path, share, faults):
    """A 1e9-parameter bf16 snapshot (2e9 bytes) over a 100 Mbit/s simple link with a 2 s delay arrives after
    2e9 * 8 / 1e8 + 2 = 162 s (the request goes up at once: no delay, no rate); every later update is charged the
    patch over the steps it spans: when the sampler adopts shared tensors, when it decodes bytes, and when the
    bytes cross a link with faults (duplicates: the first copy counts)."""
    link = f"{{weights_delay: {{kind: fixed, seconds: 2}}, weights_bandwidth_mbps: 100{faults}}}"
    cfg = tiny_config(
        tiny_model_dir,
        f"cluster.samplers=[{{tokens_per_second: 1000, link: {link}}}]",
        "cluster.mode=async",
        "cluster.learner_step_seconds=1",
        "weights.codec=pulse",
        "learner.steps=4",
        f"cluster.share_weights={share}",
        BILLION,
    )
    (tmp_path / "run").mkdir()
    cluster = build_simulated(cfg, tmp_path / "run", str(tiny_model_dir))
    sizes = ModelledSizes.from_config(cfg)
    assert sizes is not None
    sent: list[tuple[int, int]] = []
    arrived: list[tuple[float, int]] = []
    traffic, worker = cluster.loop.traffic, cluster.nodes[0].worker
    record, receive = traffic.sent, worker.receive

    def spy_sent(version: int, nbytes: int, full: int) -> None:
        assert full == 2_000_000_000
        sent.append((version, nbytes))
        record(version, nbytes, full)

    def spy_receive(update) -> bool:
        arrived.append((cluster.events.now, update.version))
        return receive(update)

    traffic.sent, worker.receive = spy_sent, spy_receive
    cluster.run()
    assert arrived[0][0] == pytest.approx(162.0, abs=1e-4)  # the frame's few hundred bytes: microseconds
    assert sent[0][0] == 0
    assert 0 < sent[0][1] - 2_000_000_000 < 1000
    assert len(sent) >= 3
    for (before, _), (version, nbytes) in pairwise(sent):
        assert 0 < nbytes - sizes.patch_nbytes(version - before) < 1000
    assert traffic.total_bytes == sum(n for _, n in sent)


# ---------------------------------------------------------------- codec time and upload sizes
CODEC = (
    "cluster.modelled={parameters: 1000000000, encode_gb_per_second: 0.5, decode_gb_per_second: 4.0, "
    "upload_bytes_per_group: 100000}"
)


def test_modelled_codec_times_and_upload_sizes_are_the_formula_computed_by_hand() -> None:
    """1e9 bf16 parameters = 2e9 bytes: encoded at 0.5 GB/s in 4 s, decoded at 4 GB/s in 0.5 s; an upload of 100
    bytes carrying groups of 10 and 20 bytes is charged 100 - 30 + 2 x 100,000; without the fields, nothing."""
    sizes = ModelledSizes.from_config(load_config(None, [CODEC]))
    assert sizes is not None
    assert (sizes.encode_seconds, sizes.decode_seconds) == (4.0, 0.5)
    body, groups = bytes(100), (bytes(10), bytes(20))
    assert sizes.upload_nbytes(body, groups) == 200_070
    plain = ModelledSizes.from_config(load_config(None, [BILLION]))
    assert plain is not None
    assert (plain.encode_seconds, plain.decode_seconds, plain.upload_nbytes(body, groups)) == (0.0, 0.0, 100)
    assert "encode 4 s per version, decode 0.5 s per update, uploads 100 kB per group" in str(
        modelled_note(load_config(None, [CODEC]), 1000)
    )


def _codec_run(tmp_path: Path, model_dir: Path, *overrides: str):
    """A 6-step run with the 1e9 plan's codec times (encode 4 s, decode 0.5 s) and 1 s learner steps, with the
    virtual times at which versions were published and samplers applied them, and the uploads' charged sizes."""
    link = "{weights_delay: {kind: fixed, seconds: 2}, weights_bandwidth_mbps: 1000}"
    cfg = tiny_config(
        model_dir,
        f"cluster.samplers=[{{tokens_per_second: 1000, link: {link}}}, {{tokens_per_second: 500, link: {link}}}]",
        "cluster.mode=async",
        "cluster.learner_step_seconds=1",
        "weights.codec=pulse",
        CODEC,
        *overrides,
    )
    (tmp_path / "run").mkdir()
    cluster = build_simulated(cfg, tmp_path / "run", str(model_dir))
    published: dict[int, float] = {}
    applied: list[tuple[float, int]] = []
    uploads: list[tuple[int, int, int, int]] = []  # charged, body and groups' bytes, groups: each upload sent
    link_published = cluster.link.published

    def spy_published(version: int) -> None:
        published[version] = cluster.events.now
        link_published(version)

    cluster.link.published = spy_published
    for sim in cluster.nodes:
        receive, send = sim.worker.receive, sim.side.up.send

        def spy_receive(update, receive=receive) -> bool:
            applied.append((cluster.events.now, update.version))
            return receive(update)

        def spy_send(now, payload, nbytes=None, send=send):
            if payload.startswith(UPLOAD_MAGIC):
                upload = decode_upload(payload)
                uploads.append((nbytes, len(payload), sum(len(g) for g in upload.groups), len(upload.groups)))
            return send(now, payload, nbytes)

        sim.worker.receive, sim.side.up.send = spy_receive, spy_send
    cluster.run()
    return cluster, published, applied, uploads


@pytest.mark.parametrize("overlap", [True, False])
def test_a_version_is_served_after_its_encode_and_applied_after_its_decode(
    tmp_path: Path, tiny_model_dir: Path, overlap: bool
) -> None:
    """Each version leaves the learner 4 s (its encode) after it was published and is applied 2 s (the delay) +
    its transfer + 0.5 s (the decode) later; a step's commit waits for the previous version's encode (versions at
    least 4 s apart although a step costs 1 s), and without overlap the next step waits for it too (5 s apart)."""
    cluster, published, applied, uploads = _codec_run(tmp_path, tiny_model_dir, f"weights.overlap={overlap}")
    assert cluster.loop.done
    versions = sorted(published)
    assert versions[0] == 0
    assert len(versions) >= 6
    gaps = [published[b] - published[a] for a, b in pairwise(versions[1:])]
    assert min(gaps) >= (4.0 if overlap else 5.0) - 1e-9, gaps
    assert applied
    for at, version in applied:
        assert at >= published[version] + 4.0 + 2.0 + 0.5 - 1e-9, (at, version, published[version])
    first = min(at for at, v in applied if v == 0)  # v0's snapshot: 2e9 bytes at 1 Gbit/s = 16 s
    assert first == pytest.approx(4.0 + 16.0 + 2.0 + 0.5, abs=1e-3)
    assert uploads
    for charged, body, groups, n in uploads:  # each group at 100,000 bytes, the frame and header as sent
        assert charged == body - groups + n * 100_000


def test_without_codec_figures_a_plan_times_nothing_but_the_transfers(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The same run with the sizes alone: versions a step apart, uploads at their real size."""
    _, published, applied, uploads = _codec_run(tmp_path, tiny_model_dir, "cluster.modelled={parameters: 1000000000}")
    versions = sorted(published)
    gaps = [published[b] - published[a] for a, b in pairwise(versions[1:])]
    assert min(gaps) < 4.0
    assert all(charged == body for charged, body, _, _ in uploads)
    first = min(at for at, v in applied if v == 0)
    assert first == pytest.approx(16.0 + 2.0, abs=1e-3)


# ---------------------------------------------------------------- config
def test_replicas_expand_into_named_samplers_with_their_own_streams() -> None:
    cfg = validate_config(
        {
            "cluster": {
                "samplers": [
                    {"name": "dc", "replicas": 3, "tokens_per_second": 7.0, "link": {"bandwidth_mbps": 10}},
                    {"replicas": 2},
                ]
            }
        }
    )
    nodes = cfg.cluster.samplers
    assert [n.name for n in nodes] == ["dc-0", "dc-1", "dc-2", None, None]
    assert [n.replicas for n in nodes] == [1] * 5
    assert [n.tokens_per_second for n in nodes[:3]] == [7.0] * 3
    assert nodes[0].link == nodes[2].link
    assert nodes[0].link is not nodes[2].link
    assert load_config(None, [f"cluster.samplers={json.dumps([n.model_dump() for n in nodes])}"]) == cfg
    assert validate_config(json.loads(json.dumps(cfg.model_dump(mode="json")))).cluster.samplers == nodes
    assert "replicas: 1" in config_to_yaml(cfg)  # the resolved config lists them one by one


@pytest.mark.parametrize(
    ("samplers", "message"),
    [
        ([{"name": "a", "replicas": 2}, {"name": "a-1"}], r"names \['a-1'\] are used more than once"),
        ([{"replicas": 2}, {"name": "sampler-1"}], r"names \['sampler-1'\] are used more than once"),
        ([{"replicas": 6000}, {"replicas": 6000}], "12000 with their replicas, more than 10000"),
        ([{"replicas": 0}], "replicas: Input should be greater than or equal to 1"),
    ],
)
def test_replicas_and_names_are_checked(samplers: list[dict], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config({"cluster": {"samplers": samplers}})


def test_modelled_sizes_need_the_links_not_the_store() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.modelled sizes the weight updates on the simulated links"):
        load_config(None, [BILLION, "transport.weights=store"])
    assert load_config(None, [BILLION, "transport.rollouts=store"]).transport.rollouts == "store"


# ---------------------------------------------------------------- refusals and labels
def test_live_refuses_a_plan_with_one_line(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = tiny_config(tiny_model_dir, BILLION)
    with pytest.raises(LiveSetupError, match=r"^cluster.modelled \(1B parameters\) is a simulator plan") as err:
        check_live_config(cfg)
    assert "\n" not in str(err.value)
    sets = ["--set", f"model.path={tiny_model_dir}", "--set", BILLION]
    for args in (
        ["run", "--live", "--run-dir", str(tmp_path / "live"), *sets],
        ["learner", "--run-dir", str(tmp_path / "learner"), "--listen", "127.0.0.1:0", *sets],
        ["sampler", "--connect", "http://127.0.0.1:9", *sets],
    ):
        result = CliRunner().invoke(app, args)
        assert result.exit_code != 0, args
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("heterorl: error: cluster.modelled (1B parameters) is a simulator plan"), args


def test_a_plan_is_labelled_in_the_summary_the_terminal_the_log_and_the_report(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    sets = [
        f"model.path={tiny_model_dir}",
        "task.digits=1",
        "task.eval_size=8",
        "sampler.group_size=4",
        "sampler.max_new_tokens=3",
        "learner.steps=2",
        "learner.groups_per_step=4",
        "eval.every=2",
        "cluster.samplers=[{replicas: 3, tokens_per_second: 50}]",
        "cluster.modelled={name: a 1B test model, parameters: 1000000000}",
    ]
    args = ["run", "--run-dir", str(run_dir), "--quiet"]
    for s in sets:
        args += ["--set", s]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads((run_dir / "summary.json").read_text())
    note = summary["modelled"]["note"]
    assert note.startswith("modelled, not computed: weight updates sized for a 1B test model (1B parameters: ")
    assert "snapshot 2 GB, one step's patch 11.6 MB" in note
    assert re.search(r"used the small model \([\d.]+K parameters\)$", note)
    assert summary["modelled"]["parameters"] == 1_000_000_000
    assert len(summary["per_sampler"]) == 3
    table = " ".join(re.sub(r"[│┃┌┐└┘├┤┬┴┼─]", " ", result.stdout).split())  # the first row, wrapped in its cell
    assert table.startswith("heterorl run modelled modelled, not computed: weight updates sized for a 1B test model")
    assert f"heterorl: {note}\n" in (run_dir / "run.log").read_text()
    report = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "report")])
    assert report.exit_code == 0, report.output
    assert f"{run_dir}: {note}" in report.stdout
    assert note in (tmp_path / "report" / "report.md").read_text()
