"""Every user mistake the red team tried ends in one clear line on stderr and a non-zero exit, never a traceback:
a config that is not UTF-8, a YAML alias that contains itself, a model.path that is not there, a --connect
that is not a URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from heterorl.cli import app

CASES = {
    "not UTF-8": (b'seed: 1\ntask:\n  name: "\xff\xfe"\n', ["run"], "not UTF-8 text"),
    "a recursive alias": (b"a: &x [*x]\n", ["run"], "YAML alias"),
    "a recursive anchor in a section": (b"task: &t\n  name: addition\n  more: *t\n", ["run"], "YAML alias"),
    "model.path that is not there": (b"model:\n  path: /nonexistent/model\n", ["run"], "model.path"),
    "model.path on a learner": (b"model:\n  path: /nonexistent/model\n", ["learner"], "model.path"),
    "--connect that is not a URL": (b"seed: 0\n", ["sampler", "--connect", "not-a-url"], "--connect"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_mistake_is_one_clear_line(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    content, command, expected = CASES[name]
    config = tmp_path / "config.yaml"
    config.write_bytes(content)
    monkeypatch.setenv("HETERORL_TOKEN", "t" * 24)
    monkeypatch.chdir(tmp_path)
    args = [command[0], str(config), *command[1:]]
    if command[0] in ("run", "learner"):
        args += ["--run-dir", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (1, 2), result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert expected in lines[0]
    assert "Traceback" not in result.output
