"""The sync benchmark runs end to end at a small size and reports consistent figures."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from heterorl.bench.pulse import compare_checkpoints, main, reference_layout_nbytes, synthetic_shapes, synthetic_step


def test_synthetic_shapes_hit_the_requested_size():
    for n in (10**6, 10**8, 10**9):
        total = sum(math.prod(shape) for shape in synthetic_shapes(n).values())
        assert 0.8 * n < total < 1.25 * n


def test_change_rate_mode_moves_one_ulp():
    base, new = synthetic_step(200_000, 0.02, 1e-6, seed=1)
    for name in base:
        delta = new[name].view(torch.int16).int() - base[name].view(torch.int16).int()
        assert set(delta.unique().tolist()) <= {-1, 0, 1}
    result = main(["--params", "200000", "--change-rate", "0.02"])
    assert result["change_rate"] == pytest.approx(0.02, rel=0.1)


def test_sync_bench_small(capsys, tmp_path):
    result = main(["--params", "300000", "--lr", "1e-6", "--seed", "3", "--json", str(tmp_path / "r.json")])
    assert "B/changed element" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text()) == result
    assert 0.005 < result["change_rate"] < 0.2
    assert result["patch_bytes"] < result["reference_bytes"] < result["zstd_full_bytes"] < result["full_bytes"]
    assert result["bytes_per_changed"] == pytest.approx(result["patch_bytes"] / result["changed"])
    assert result["encode_GBps"] > 0
    assert result["decode_GBps"] > 0


def test_compare_checkpoints_from_files(tmp_path):
    base, new = synthetic_step(100_000, None, 1e-6, seed=4)
    save_file({k: v.float() for k, v in base.items()}, tmp_path / "a.safetensors")
    save_file({k: v.float() for k, v in new.items()}, tmp_path / "b.safetensors")
    result = compare_checkpoints(tmp_path / "a.safetensors", tmp_path / "b.safetensors", verbose=False)
    assert result["reference_bytes"] == reference_layout_nbytes(base, new)
    assert result["changed"] == sum(int((base[k].view(torch.int16) != new[k].view(torch.int16)).sum()) for k in base)


def test_both_codecs_and_bounds_on_a_noise_step():
    result = main(["--step", "noise", "--params", "400000", "--lr", "1e-5", "--repeats", "1"])
    ctx, bounds = result["ctx"], result["bounds"]
    assert result["step"] == "noise"
    assert ctx["patch_bytes"] < 0.85 * result["patch_bytes"]
    assert result["ctx_over_pulse"] == pytest.approx(ctx["patch_bytes"] / result["patch_bytes"])
    assert bounds["exponent_per_changed"] < 0.85 * bounds["independent_per_changed"]
    assert bounds["independent_per_changed"] < result["bytes_per_changed"]  # v1 is near, not below, its bound
    assert ctx["decode_GBps"] > 0
    assert result["copy_GBps"] > 0
    assert len(result["load_average"]) == 6


def test_cli_prints_both_codecs():
    from typer.testing import CliRunner

    from heterorl.cli import app

    out = CliRunner().invoke(app, ["sync", "bench", "--params", "200000", "--step", "noise", "--lr", "1e-5"])
    assert out.exit_code == 0, out.output
    assert "pulse-ctx (v2)" in out.output
    assert "exponent-conditioned" in out.output
    bad = CliRunner().invoke(app, ["sync", "bench", "--step", "nope"])
    assert bad.exit_code != 0


def test_the_memory_read_line_gives_each_thread_count():
    """codec_speed.py's first line: the memory read speed the codec's passes are bound by, per thread count."""
    from heterorl.bench.codec import memory_line, read_speed

    assert 0.5 < read_speed(1, nbytes=28_000_000, repeats=1) < 1000  # GB/s: any machine this runs on
    line = memory_line([1, 2])
    assert line.startswith("memory read (xxh3 over 280 MB, wall): 1 thread ")
    assert " GB/s, 2 threads x" in line
