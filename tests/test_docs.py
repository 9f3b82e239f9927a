"""The how-to works as written from a fresh clone: every file its commands write into the repository passes the
linters `make test` runs over the whole tree, and every folder they fill (models, runs) is ignored by git."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

HOWTO = REPO / "docs" / "howto-math.md"
HEREDOC = re.compile(r"^cat > (?P<name>\S+) <<'EOF'\n(?P<body>.*?)^EOF$", re.MULTILINE | re.DOTALL)
WRITTEN = re.compile(r"(?:heterorl\.tiny_model|--run-dir|--out|--local-dir)\s+(?P<path>(?:models|runs|data)/[^\s`]+)")


def howto_files() -> dict[str, str]:
    return {m["name"]: m["body"] for m in HEREDOC.finditer(HOWTO.read_text())}


def test_the_howto_writes_files_and_folders() -> None:
    """The patterns below find what they check (a snippet renamed or reworded would otherwise go unchecked)."""
    assert "my_rewards.py" in howto_files()
    assert {"models/tiny-qwen3", "runs/math-cpu"} <= {m["path"] for m in WRITTEN.finditer(HOWTO.read_text())}


@pytest.mark.parametrize("name", sorted(howto_files()))
def test_a_file_the_howto_writes_passes_make_lint(name: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_text(howto_files()[name])
    config = ["--config", str(REPO / "pyproject.toml")]
    for command in (["check", *config, str(path)], ["format", "--check", *config, str(path)]):
        done = subprocess.run([sys.executable, "-m", "ruff", *command], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout")
def test_the_folders_the_howto_fills_are_ignored_by_git() -> None:
    paths = sorted({m["path"].rstrip("/\\") for m in WRITTEN.finditer(HOWTO.read_text())})
    for path in paths:
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False)
        assert done.returncode == 0, f"{path} (written by docs/howto-math.md) is not in .gitignore"
