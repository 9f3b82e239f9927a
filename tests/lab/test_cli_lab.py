"""`heterorl lab` mistakes: one line with the prefix every command uses (without root: exit 1, nothing made)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from heterorl.cli import app
from heterorl.cli_errors import ERROR_PREFIX
from heterorl.lab.netns import lab_namespaces

REPO_CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "wanlab.yaml")


@pytest.mark.parametrize("args", [["lab", "ping", REPO_CONFIG], ["lab", "clean"]])
def test_lab_commands_refuse_without_root(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    before = lab_namespaces()
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines == [
        f"{ERROR_PREFIX}the WAN lab needs root: it makes network namespaces and TUN devices (run it as root)"
    ]
    assert lab_namespaces() == before


def test_lab_ping_checks_the_config_first() -> None:
    result = CliRunner().invoke(app, ["lab", "ping", REPO_CONFIG, "--set", "cluster.samplers.0.link.queue_packets=1"])
    assert result.exit_code == 2
    assert "queue_packets" in result.output


def test_lab_ping_refuses_links_too_slow_to_measure() -> None:
    demo = str(Path(__file__).resolve().parents[2] / "configs" / "demo.yaml")  # log-normal 60-1800 s delays
    result = CliRunner().invoke(app, ["lab", "ping", demo])
    assert result.exit_code == 2  # a config mistake
    assert result.output.startswith(f"{ERROR_PREFIX}cluster.samplers.0.link has a median round trip of")
    assert len(result.output.strip().splitlines()) == 1
